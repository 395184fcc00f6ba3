// Tests of the namespace journal: record round trips through
// ReadJournal and RestoreIndex, torn tails versus corrupt records, absurd
// counts, compaction, outstanding reservations, a failed append, a journal
// an old version wrote (testdata/), and a randomized check that replay keeps
// every committed page and serves no row whose bytes belong to another page.
#include "daemon/journal.h"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/crc32c.h"
#include "daemon/namespace_layout.h"
#include "daemon/test_keys.h"
#include "daemon/tier_core.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvtier::daemon {
namespace {

using ::testing::HasSubstr;

using testing::Chain;
using testing::Key;

struct Shape {
  uint64_t page_rows = 64;
  uint64_t snapshot_rows = 0;
  uint32_t tp_size = 1;
};

JournalHeader HeaderFor(const Shape& shape) {
  JournalHeader h;
  h.name = "ns-test";
  v1::Layout l;
  l.set_model("journal-test");
  l.set_tokens_per_page(16);
  l.set_num_layers(2);
  auto* kv = l.add_page_banks();
  kv->set_name("kv");
  kv->set_row_bytes(256);
  l.set_tp_size(shape.tp_size);
  l.set_snapshot_row_bytes(shape.snapshot_rows > 0 ? 512 : 0);
  h.layout = NormalizeLayout(l);
  h.page_rows = shape.page_rows;
  h.snapshot_rows = shape.snapshot_rows;
  h.max_replay_tokens = 0;
  for (uint32_t r = 0; r < shape.tp_size; ++r) {
    h.segments.push_back(
        {"kv", r, absl::StrCat("/dev/shm/x.kv.r", r), 1000 + r});
  }
  return h;
}

std::unique_ptr<PrefixIndex> MakeIndex(const Shape& shape) {
  IndexConfig c;
  c.hash_bytes = 32;
  c.tokens_per_page = 16;
  c.tp_size = shape.tp_size;
  c.page_rows = shape.page_rows;
  c.snapshot_rows = shape.snapshot_rows;
  auto index = PrefixIndex::Create(c);
  EXPECT_TRUE(index.ok()) << index.status();
  return *std::move(index);
}

// A live index with its journal, driven as TierCore drives them, plus what
// each row's bytes are: the key of the page last committed into it, or
// "overwritten" once a reservation handed it out.
class Journaled {
 public:
  Journaled(const std::string& path, const Shape& shape,
            JournalOptions options = {})
      : shape_(shape), index_(MakeIndex(shape)) {
    auto j = NamespaceJournal::Create(path, HeaderFor(shape), *index_, options);
    EXPECT_TRUE(j.ok()) << j.status();
    journal_ = *std::move(j);
  }

  struct Rows {
    std::vector<uint32_t> pages, snapshots;
  };
  absl::StatusOr<Rows> Reserve(uint32_t rank, uint32_t pages,
                               uint32_t snapshots = 0) {
    Rows rows;
    if (pages > 0) {
      auto p = index_->AllocatePageRows(rank, pages);
      if (!p.ok()) return p.status();
      rows.pages = *p;
    }
    if (snapshots > 0) {
      auto s = index_->AllocateSnapshotRows(rank, snapshots);
      if (!s.ok()) {
        EXPECT_TRUE(index_->FreePageRows(rank, rows.pages).ok());
        return s.status();
      }
      rows.snapshots = *s;
    }
    if (absl::Status s =
            journal_->AppendReserve(rank, rows.pages, rows.snapshots);
        !s.ok()) {
      return s;
    }
    for (uint32_t row : rows.pages) page_bytes_[{rank, row}] = kOverwritten;
    for (uint32_t row : rows.snapshots) snap_bytes_[{rank, row}] = kOverwritten;
    return rows;
  }

  absl::Status Commit(uint32_t rank, const HashKey* parent,
                      const std::vector<HashKey>& hashes, const Rows& rows,
                      const std::vector<size_t>& snapshot_at = {}) {
    std::vector<PrefixIndex::SnapshotPlacement> placements;
    for (size_t j = 0; j < snapshot_at.size(); ++j) {
      placements.push_back({rows.snapshots[j], hashes[snapshot_at[j]]});
    }
    for (size_t i = 0; i < hashes.size(); ++i) {
      page_bytes_[{rank, rows.pages[i]}] = Name(hashes[i]);
    }
    for (const auto& p : placements) snap_bytes_[{rank, p.row}] = Name(p.hash);
    auto r = index_->Commit(rank, parent, hashes, rows.pages, placements);
    if (!r.ok()) return r.status();
    return journal_->AppendCommit(rank, parent, hashes, rows.pages, placements,
                                  r->freed_page_rows, r->freed_snapshot_rows);
  }

  absl::Status Drop(const HashKey& hash) {
    auto r = index_->DropSubtree(hash);
    if (!r.ok()) return r.status();
    return journal_->AppendDrop(hash);
  }

  // Replays the journal into a fresh index.
  std::unique_ptr<PrefixIndex> Replay(JournalContents* contents = nullptr) {
    auto read = ReadJournal(journal_->path());
    EXPECT_TRUE(read.ok()) << read.status();
    if (!read.ok()) return nullptr;
    auto copy = MakeIndex(shape_);
    auto restored = RestoreIndex(*read, copy.get());
    EXPECT_TRUE(restored.ok()) << restored.status();
    EXPECT_TRUE(copy->CheckInvariants().ok()) << copy->CheckInvariants();
    EXPECT_EQ(read->inconsistent, 0u);
    EXPECT_EQ(read->stopped, "");
    EXPECT_FALSE(read->corrupt);
    if (contents != nullptr) *contents = *std::move(read);
    return copy;
  }

  // Every node of `live` is in `restored` with the same rows; every row
  // `restored` serves holds its node's bytes.
  void ExpectRestored(const PrefixIndex& live, const PrefixIndex& restored) {
    absl::flat_hash_map<std::string, std::vector<uint32_t>> got;
    restored.ForEachNode([&](const PrefixIndex::NodeView& v) {
      std::vector<uint32_t> rows(v.page_rows.begin(), v.page_rows.end());
      rows.insert(rows.end(), v.snapshot_rows.begin(), v.snapshot_rows.end());
      got[Name(*v.key)] = rows;
      for (uint32_t r = 0; r < v.page_rows.size(); ++r) {
        if (v.page_rows[r] != kNoRow) {
          EXPECT_EQ(page_bytes_[std::make_pair(r, v.page_rows[r])],
                    Name(*v.key))
              << "restored page row " << v.page_rows[r] << " of rank " << r
              << " holds other bytes";
        }
        if (!v.snapshot_rows.empty() && v.snapshot_rows[r] != kNoRow) {
          EXPECT_EQ(snap_bytes_[std::make_pair(r, v.snapshot_rows[r])],
                    Name(*v.key))
              << "restored snapshot row " << v.snapshot_rows[r]
              << " holds other bytes";
        }
      }
    });
    // Where the live node has a row, the restored one has the same. The
    // restored node may hold more: rows evicted without a later reservation
    // (a failed allocation's evictions, the other ranks' snapshot rows of a
    // snapshot eviction) come back, their bytes intact.
    live.ForEachNode([&](const PrefixIndex::NodeView& v) {
      std::vector<uint32_t> rows(v.page_rows.begin(), v.page_rows.end());
      rows.insert(rows.end(), v.snapshot_rows.begin(), v.snapshot_rows.end());
      auto it = got.find(Name(*v.key));
      ASSERT_NE(it, got.end()) << "a committed node was not restored";
      ASSERT_EQ(it->second.size(), rows.size());
      for (size_t i = 0; i < rows.size(); ++i) {
        if (rows[i] != kNoRow) {
          EXPECT_EQ(it->second[i], rows[i]) << i;
        }
      }
    });
    PrefixIndex::Usage u = restored.GetUsage();
    for (uint64_t a : u.allocated_page_rows) EXPECT_EQ(a, 0u);
    for (uint64_t a : u.allocated_snapshot_rows) EXPECT_EQ(a, 0u);
  }

  PrefixIndex& index() { return *index_; }
  NamespaceJournal& journal() { return *journal_; }

 private:
  static constexpr const char* kOverwritten = "overwritten";
  static std::string Name(const HashKey& k) {
    return std::string(reinterpret_cast<const char*>(k.bytes.data()), 32);
  }
  Shape shape_;
  std::unique_ptr<PrefixIndex> index_;
  std::unique_ptr<NamespaceJournal> journal_;
  absl::flat_hash_map<std::pair<uint32_t, uint32_t>, std::string> page_bytes_,
      snap_bytes_;
};

// The scenario that wrote testdata/journal_v1.journal (see the fixture test
// below): a hybrid namespace of 2 ranks, 16 page rows and 4 snapshot rows.
constexpr Shape kFixtureShape{
    .page_rows = 16, .snapshot_rows = 4, .tp_size = 2};

void WriteFixtureScenario(Journaled& j) {
  const auto a = Chain(1, 4);
  const auto b = Chain(2, 2);
  const auto c = Chain(3, 3);
  const HashKey e0 = Key(5, 0);
  auto r = j.Reserve(0, 4, 1);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(j.Commit(0, nullptr, a, *r, {3}).ok());
  r = j.Reserve(1, 4, 1);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(j.Commit(1, nullptr, a, *r, {1}).ok());
  r = j.Reserve(0, 2);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(j.Commit(0, nullptr, b, *r).ok());
  // The node checkpoint: a[0..3], b[0..1].
  ASSERT_TRUE(j.journal().Checkpoint(j.index()).ok());
  r = j.Reserve(0, 3, 1);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(j.Commit(0, &a[1], c, *r, {2}).ok());
  r = j.Reserve(1, 2);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(j.Commit(1, &a[1], {c[0], c[1]}, *r).ok());
  // a[3] deduplicates on rank 0 (page and snapshot); e0 is new.
  r = j.Reserve(0, 2, 1);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(j.Commit(0, &a[2], {a[3], e0}, *r, {0}).ok());
  ASSERT_TRUE(j.Drop(b[1]).ok());
  // Reserved, never committed.
  r = j.Reserve(1, 2, 1);
  ASSERT_TRUE(r.ok()) << r.status();
}

class JournalTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/dev/shm/kvtier-journal-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    path_ = JournalPath(dir_, "ns-test");
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string dir_;
  std::string path_;
};

TEST_F(JournalTest, CommitsReservesAndDropsRoundTrip) {
  Journaled j(path_, {.page_rows = 64, .snapshot_rows = 8, .tp_size = 2});
  const auto a = Chain(1, 6);
  const auto b = Chain(2, 3);
  auto ra = j.Reserve(0, 6, 2);
  ASSERT_TRUE(ra.ok());
  ASSERT_TRUE(j.Commit(0, nullptr, a, *ra, {2, 5}).ok());
  auto ra1 = j.Reserve(1, 4, 1);
  ASSERT_TRUE(ra1.ok());
  ASSERT_TRUE(j.Commit(1, nullptr, {a.begin(), a.begin() + 4}, *ra1, {3}).ok());
  auto rb = j.Reserve(0, 3);
  ASSERT_TRUE(rb.ok());
  ASSERT_TRUE(j.Commit(0, &a[1], b, *rb).ok());
  // A duplicate commit: its rows are freed, and replay must not claim them.
  auto dup = j.Reserve(0, 2);
  ASSERT_TRUE(dup.ok());
  ASSERT_TRUE(j.Commit(0, nullptr, {a[0], a[1]}, *dup).ok());
  // Reserved, never committed: free after replay.
  auto pending = j.Reserve(0, 5, 1);
  ASSERT_TRUE(pending.ok());
  ASSERT_TRUE(j.Drop(b[1]).ok());

  JournalContents contents;
  auto restored = j.Replay(&contents);
  ASSERT_NE(restored, nullptr);
  EXPECT_EQ(contents.stopped, "");
  EXPECT_EQ(contents.valid_bytes, contents.file_bytes);
  EXPECT_EQ(contents.records, 11u);  // Header, 5 reserves, 4 commits, drop.
  EXPECT_EQ(contents.header.name, "ns-test");
  EXPECT_EQ(contents.header.segments.size(), 2u);
  EXPECT_EQ(contents.header.segments[1].created_unix_ns, 1001u);
  j.ExpectRestored(j.index(), *restored);
  for (uint32_t rank = 0; rank < 2; ++rank) {
    for (const auto& chain :
         {a, std::vector<HashKey>{a[0], a[1], b[0], b[1]}}) {
      auto x = j.index().Lookup(chain, rank);
      auto y = restored->Lookup(chain, rank);
      EXPECT_EQ(x.matched_pages, y.matched_pages);
      EXPECT_EQ(x.usable_pages, y.usable_pages);
      EXPECT_EQ(x.rows, y.rows);
      EXPECT_EQ(x.snapshot_row, y.snapshot_row);
    }
  }
  EXPECT_EQ(restored->Lookup(a, 0).matched_pages, 4u);  // Rank 1 has 4.
  EXPECT_EQ(restored->GetUsage().nodes, 7u);            // a[0..5], b[0].
}

TEST_F(JournalTest, ReservedRowsForgetWhatHeldThem) {
  // Rank 1's allocation evicts a whole node (both ranks' rows) but reuses
  // only rank 1's row: replay forgets that row; rank 0's keeps its bytes and
  // comes back, but the node is incomplete, so no lookup serves it.
  Journaled j(path_, {.page_rows = 4, .tp_size = 2});
  const auto a = Chain(1, 4);
  for (uint32_t rank = 0; rank < 2; ++rank) {
    auto r = j.Reserve(rank, 4);
    ASSERT_TRUE(r.ok());
    ASSERT_TRUE(j.Commit(rank, nullptr, a, *r).ok());
  }
  auto taken = j.Reserve(1, 1);  // Evicts a[3].
  ASSERT_TRUE(taken.ok());
  auto restored = j.Replay();
  ASSERT_NE(restored, nullptr);
  j.ExpectRestored(j.index(), *restored);
  EXPECT_EQ(restored->Lookup(a, 0).matched_pages, 3u);
  EXPECT_EQ(restored->Lookup(a, 1).matched_pages, 3u);
  EXPECT_EQ(restored->GetUsage().committed_page_rows,
            (std::vector<uint64_t>{4, 3}));

  // A commit of the evicted page elsewhere replaces what replay held.
  ASSERT_TRUE(j.Commit(1, &a[2], {a[3]}, *taken).ok());
  auto r0 = j.Reserve(0, 1);
  ASSERT_TRUE(r0.ok());
  ASSERT_TRUE(j.Commit(0, &a[2], {a[3]}, *r0).ok());
  restored = j.Replay();
  ASSERT_NE(restored, nullptr);
  j.ExpectRestored(j.index(), *restored);
  EXPECT_EQ(restored->Lookup(a, 1).matched_pages, 4u);
}

TEST_F(JournalTest, TornTailEndsReplayAtTheLastWholeRecord) {
  Journaled j(path_, {});
  const auto a = Chain(1, 8);
  auto r = j.Reserve(0, 8);
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(j.Commit(0, nullptr, a, *r).ok());
  const uint64_t whole = j.journal().bytes();
  auto r2 = j.Reserve(0, 4);
  ASSERT_TRUE(r2.ok());
  ASSERT_TRUE(j.Commit(0, &a[7], Chain(1, 4, 8), *r2).ok());
  const uint64_t full = j.journal().bytes();

  // Cut inside the last commit record: the first 8 pages remain.
  for (uint64_t cut : {full - 1, full - 40, whole + 20}) {
    std::filesystem::resize_file(path_, cut);
    auto read = ReadJournal(path_);
    ASSERT_TRUE(read.ok()) << read.status();
    EXPECT_THAT(read->stopped, HasSubstr("torn"));
    EXPECT_FALSE(read->corrupt);
    EXPECT_LT(read->valid_bytes, cut);
    auto copy = MakeIndex({});
    auto restored = RestoreIndex(*read, copy.get());
    ASSERT_TRUE(restored.ok()) << restored.status();
    EXPECT_EQ(copy->Lookup(Chain(1, 12), 0).matched_pages, 8u);
    EXPECT_TRUE(copy->CheckInvariants().ok());
  }
}

TEST_F(JournalTest, CorruptMiddleRecordIsCorruptNotTorn) {
  Journaled j(path_, {});
  auto r = j.Reserve(0, 3);
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(j.Commit(0, nullptr, Chain(1, 3), *r).ok());
  const uint64_t before = j.journal().bytes();
  auto r2 = j.Reserve(0, 3);
  ASSERT_TRUE(r2.ok());
  ASSERT_TRUE(j.Commit(0, nullptr, Chain(2, 3), *r2).ok());
  {
    std::fstream f(path_, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(before + 12));  // Inside the reserve.
    f.put('\x5a');
  }
  auto read = ReadJournal(path_);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_TRUE(read->corrupt);
  EXPECT_THAT(read->stopped, HasSubstr("CRC mismatch"));
  EXPECT_THAT(read->stopped, HasSubstr(absl::StrCat("offset ", before)));
  EXPECT_EQ(read->valid_bytes, before);
  EXPECT_EQ(read->records, 3u);  // Header, reserve, commit.
  EXPECT_EQ(read->keys.size(), 3u);
  // What precedes it is still returned (the caller refuses to serve it).
  auto copy = MakeIndex({});
  ASSERT_TRUE(RestoreIndex(*read, copy.get()).ok());
  EXPECT_EQ(copy->Lookup(Chain(1, 3), 0).matched_pages, 3u);
}

TEST_F(JournalTest, UnreadableHeaderIsDataLoss) {
  EXPECT_EQ(ReadJournal(dir_ + "/none").status().code(),
            absl::StatusCode::kNotFound);
  {
    std::ofstream f(path_, std::ios::binary);
    f << "KVTJRNL1";
  }
  auto empty = ReadJournal(path_);
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(empty.status().message()), HasSubstr("header"));
  {
    std::ofstream f(path_, std::ios::binary);
    f << "NOTAJRNL and more bytes";
  }
  auto magic = ReadJournal(path_);
  EXPECT_EQ(magic.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(magic.status().message()), HasSubstr("magic"));
}

TEST_F(JournalTest, CheckpointCompactsAndKeepsTheState) {
  JournalOptions options;
  options.min_compact_bytes = 4096;
  options.compact_factor = 2;
  Journaled j(path_, {.page_rows = 32}, options);
  // Churn: commit and drop the same prefixes over and over.
  for (int round = 0; round < 40 && !j.journal().NeedsCheckpoint(); ++round) {
    auto r = j.Reserve(0, 4);
    ASSERT_TRUE(r.ok());
    ASSERT_TRUE(j.Commit(0, nullptr, Chain(round, 4), *r).ok());
    if (round % 2 == 0) {
      ASSERT_TRUE(j.Drop(Key(round, 0)).ok());
    }
  }
  ASSERT_TRUE(j.journal().NeedsCheckpoint());
  const uint64_t before = j.journal().bytes();
  ASSERT_TRUE(j.journal().Checkpoint(j.index()).ok());
  EXPECT_LT(j.journal().bytes(), before);
  EXPECT_EQ(j.journal().bytes(), j.journal().checkpoint_bytes());
  EXPECT_FALSE(j.journal().NeedsCheckpoint());
  // Appends after the checkpoint replay on top of it.
  auto r = j.Reserve(0, 2);
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(j.Commit(0, nullptr, Chain(99, 2), *r).ok());
  auto restored = j.Replay();
  ASSERT_NE(restored, nullptr);
  j.ExpectRestored(j.index(), *restored);
  EXPECT_EQ(restored->GetUsage().nodes, j.index().GetUsage().nodes);
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/.ns.ns-test.journal.tmp"));
}

TEST_F(JournalTest, ListJournalsNamesThemAndRemovesTemporaries) {
  Journaled j(path_, {});
  { std::ofstream(dir_ + "/.ns.other.journal.tmp") << "half"; }
  { std::ofstream(dir_ + "/unrelated") << "x"; }
  { std::ofstream(dir_ + "/ns.journal") << "x"; }
  auto names = ListJournals(dir_);
  ASSERT_TRUE(names.ok()) << names.status();
  EXPECT_EQ(*names, std::vector<std::string>{"ns-test"});
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/.ns.other.journal.tmp"));
  EXPECT_EQ(ListJournals(dir_ + "/none").status().code(),
            absl::StatusCode::kNotFound);
  ASSERT_TRUE(j.journal().Remove().ok());
  EXPECT_FALSE(std::filesystem::exists(path_));
}

TEST_F(JournalTest, FailedAppendLeavesNoPartialRecordAndBreaksUntilCheckpoint) {
  Journaled j(path_, {.page_rows = 4096});
  auto r = j.Reserve(0, 2);
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(j.Commit(0, nullptr, Chain(1, 2), *r).ok());
  const uint64_t before = j.journal().bytes();
  // A file-size limit just above the journal makes the next big append fail.
  struct rlimit old;
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old), 0);
  signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = old;
  small.rlim_cur = before + 100;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  auto big = j.index().AllocatePageRows(0, 1000);
  ASSERT_TRUE(big.ok());
  absl::Status failed = j.journal().AppendReserve(0, *big, {});
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &old), 0);
  EXPECT_EQ(failed.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(std::string(failed.message()), HasSubstr(path_));
  EXPECT_TRUE(j.journal().broken());
  EXPECT_TRUE(j.journal().NeedsCheckpoint());
  EXPECT_EQ(std::filesystem::file_size(path_), before);
  EXPECT_EQ(j.journal().AppendDrop(Key(1, 0)).code(),
            absl::StatusCode::kInternal);
  ASSERT_TRUE(j.index().FreePageRows(0, *big).ok());
  ASSERT_TRUE(j.journal().Checkpoint(j.index()).ok());
  EXPECT_FALSE(j.journal().broken());
  auto r2 = j.Reserve(0, 1);
  ASSERT_TRUE(r2.ok());
  const HashKey parent = Key(1, 1);
  ASSERT_TRUE(j.Commit(0, &parent, {Key(1, 2)}, *r2).ok());
  auto restored = j.Replay();
  ASSERT_NE(restored, nullptr);
  j.ExpectRestored(j.index(), *restored);
}

// Random reserve / commit / abort / drop traffic with eviction on two ranks
// and snapshots, and compaction. Replayed along the way, the journal restores
// every live node with its rows and only rows holding their node's bytes;
// cut at a random byte, it still restores a consistent index.
TEST_F(JournalTest, RandomTrafficReplaysExactlyAndSafely) {
  // KVTIER_JOURNAL_SEED / KVTIER_JOURNAL_STEPS run it longer by hand.
  const char* env_seed = getenv("KVTIER_JOURNAL_SEED");
  const char* env_steps = getenv("KVTIER_JOURNAL_STEPS");
  std::mt19937_64 rng(env_seed != nullptr ? std::strtoull(env_seed, nullptr, 10)
                                          : 20261130);
  const int steps = env_steps != nullptr ? std::atoi(env_steps) : 4000;
  const Shape shape{.page_rows = 48, .snapshot_rows = 12, .tp_size = 2};
  JournalOptions options;
  options.min_compact_bytes = 16 << 10;
  Journaled j(path_, shape, options);
  std::vector<uint32_t> pins;
  uint64_t replays = 0, cuts = 0, failed_reserves = 0;
  for (int step = 0; step < steps; ++step) {
    const uint32_t rank = rng() % 2;
    const int op = static_cast<int>(rng() % 12);
    if (op < 6) {
      // Extend a prefix of one of 40 chains (or start it).
      const uint64_t chain = rng() % 40;
      const uint32_t n = 1 + rng() % 6;
      const bool snap = rng() % 3 == 0;
      auto rows = j.Reserve(rank, n, snap ? 1 : 0);
      if (!rows.ok()) {
        ++failed_reserves;
      } else {
        // After the reservation's evictions: where this rank's chain ends.
        const uint32_t start = static_cast<uint32_t>(
            j.index().Lookup(Chain(chain, 64), rank).matched_pages);
        const HashKey parent = Key(chain, start == 0 ? 0 : start - 1);
        absl::Status s = j.Commit(
            rank, start == 0 ? nullptr : &parent, Chain(chain, n, start), *rows,
            snap ? std::vector<size_t>{n - 1} : std::vector<size_t>{});
        if (!s.ok()) {
          // The other rank's pages ran further (lookups match complete
          // nodes only): give the rows back as an abort does.
          EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
          ASSERT_TRUE(j.index().FreePageRows(rank, rows->pages).ok());
          ASSERT_TRUE(j.index().FreeSnapshotRows(rank, rows->snapshots).ok());
        }
      }
    } else if (op < 8) {
      // Reserve and abort (an engine killed after Reserve); sometimes more
      // than pins allow, which evicts on the way and then fails, unjournaled.
      const uint32_t n = !pins.empty() && rng() % 4 == 0 ? 48 : 1 + rng() % 8;
      auto rows = j.Reserve(rank, n);
      if (rows.ok()) {
        ASSERT_TRUE(j.index().FreePageRows(rank, rows->pages).ok());
      } else {
        ++failed_reserves;
      }
    } else if (op == 8) {
      (void)j.Drop(Key(rng() % 40, rng() % 4));
    } else if (op == 9) {
      // Pin a prefix (a lease) or release one.
      if (pins.size() >= 3 || (!pins.empty() && rng() % 2 == 0)) {
        ASSERT_TRUE(j.index().Unpin(pins.back()).ok());
        pins.pop_back();
      } else {
        std::vector<uint32_t> ids;
        j.index().ForEachNode(
            [&](const PrefixIndex::NodeView& v) { ids.push_back(v.id); });
        if (!ids.empty()) {
          pins.push_back(ids[rng() % ids.size()]);
          j.index().Pin(pins.back());
        }
      }
    } else if (j.journal().NeedsCheckpoint()) {
      ASSERT_TRUE(j.journal().Checkpoint(j.index()).ok());
    }
    ASSERT_TRUE(j.index().CheckInvariants().ok());
    if (step % 150 == 149) {
      ++replays;
      auto restored = j.Replay();
      ASSERT_NE(restored, nullptr);
      j.ExpectRestored(j.index(), *restored);
      if (HasFailure()) return;
    }
  }
  // Cut copies of the final journal at random bytes.
  const uint64_t size = std::filesystem::file_size(path_);
  const std::string cut_path = dir_ + "/cut";
  for (int i = 0; i < 40; ++i) {
    std::filesystem::copy_file(
        path_, cut_path, std::filesystem::copy_options::overwrite_existing);
    std::filesystem::resize_file(cut_path, rng() % size);
    auto read = ReadJournal(cut_path);
    if (!read.ok()) {
      EXPECT_EQ(read.status().code(), absl::StatusCode::kDataLoss);
      continue;
    }
    ++cuts;
    EXPECT_FALSE(read->corrupt) << read->stopped;  // A cut is a torn tail.
    auto copy = MakeIndex(shape);
    auto restored = RestoreIndex(*read, copy.get());
    ASSERT_TRUE(restored.ok()) << restored.status();
    EXPECT_TRUE(copy->CheckInvariants().ok()) << copy->CheckInvariants();
    for (uint64_t a : copy->GetUsage().allocated_page_rows) EXPECT_EQ(a, 0u);
  }
  std::printf(
      "replayed %llu times (%llu failed reservations), %llu cut "
      "journals restored\n",
      static_cast<unsigned long long>(replays),
      static_cast<unsigned long long>(failed_reserves),
      static_cast<unsigned long long>(cuts));
}

// ------------------------------------------- torn, corrupt and absurd --

// Record types and framing as daemon/journal.h documents them, for crafting
// records by hand.
constexpr uint8_t kHeaderRecord = 1, kNodesRecord = 2, kReserveRecord = 3,
                  kCommitRecord = 4, kDropRecord = 5;

void PutLe32(std::string* out, uint32_t v) {
  out->append(reinterpret_cast<const char*>(&v), 4);
}
void PutLe64(std::string* out, uint64_t v) {
  out->append(reinterpret_cast<const char*>(&v), 8);
}

// A record with a valid frame (length and CRC-32C) around `payload`.
std::string Framed(uint8_t type, const std::string& payload) {
  const std::string body = std::string(1, static_cast<char>(type)) + payload;
  std::string out;
  PutLe32(&out, static_cast<uint32_t>(body.size()));
  PutLe32(&out, Crc32c(body.data(), body.size()));
  return out + body;
}

void AppendBytes(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::app);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A header record's payload for `h`, with counts optionally overridden.
struct HeaderOverrides {
  std::optional<uint32_t> name_length, layout_length, segment_count,
      path_length;
};
std::string HeaderPayload(const JournalHeader& h,
                          const HeaderOverrides& o = {}) {
  std::string out, layout;
  h.layout.SerializeToString(&layout);
  PutLe32(&out, o.name_length.value_or(h.name.size()));
  out += h.name;
  PutLe32(&out, o.layout_length.value_or(layout.size()));
  out += layout;
  PutLe64(&out, h.page_rows);
  PutLe64(&out, h.snapshot_rows);
  PutLe32(&out, h.max_replay_tokens);
  PutLe32(&out, o.segment_count.value_or(h.segments.size()));
  for (const JournalSegment& s : h.segments) {
    PutLe32(&out, s.bank.size());
    out += s.bank;
    PutLe32(&out, s.rank);
    PutLe32(&out, o.path_length.value_or(s.path.size()));
    out += s.path;
    PutLe64(&out, s.created_unix_ns);
  }
  return out;
}

// Writes a journal of just a header record holding `payload`.
void WriteHeaderOnly(const std::string& path, const std::string& payload) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  const std::string bytes = "KVTJRNL1" + Framed(kHeaderRecord, payload);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Overwrites the byte at `offset` of `path` with itself XOR `mask`.
void FlipByte(const std::string& path, uint64_t offset, uint8_t mask = 0x5a) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(offset));
  const int c = f.get();
  f.seekp(static_cast<std::streamoff>(offset));
  f.put(static_cast<char>(c ^ mask));
}

TEST_F(JournalTest, FlippedCrcOfTheLastRecordIsATornTail) {
  Journaled j(path_, {});
  auto r = j.Reserve(0, 3);
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(j.Commit(0, nullptr, Chain(1, 3), *r).ok());
  const uint64_t before = j.journal().bytes();
  ASSERT_TRUE(j.Drop(Key(1, 2)).ok());
  FlipByte(path_, before + 4);  // The drop's CRC.
  auto read = ReadJournal(path_);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_FALSE(read->corrupt);
  EXPECT_THAT(read->stopped, HasSubstr("torn"));
  EXPECT_THAT(read->stopped, HasSubstr(absl::StrCat("offset ", before)));
  EXPECT_EQ(read->valid_bytes, before);
  EXPECT_EQ(read->keys.size(), 3u);  // The drop is not replayed.

  // Its payload flipped instead: the same.
  FlipByte(path_, before + 4);
  FlipByte(path_, before + 12);
  read = ReadJournal(path_);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_FALSE(read->corrupt);
  EXPECT_EQ(read->valid_bytes, before);
}

TEST_F(JournalTest, TruncatedLastRecordIsATornTail) {
  Journaled j(path_, {});
  auto r = j.Reserve(0, 3);
  ASSERT_TRUE(r.ok());
  const uint64_t before = j.journal().bytes();
  ASSERT_TRUE(j.Commit(0, nullptr, Chain(1, 3), *r).ok());
  // Cut inside the frame and inside the payload.
  for (uint64_t cut : {j.journal().bytes() - 1, before + 8, before + 3}) {
    std::filesystem::resize_file(path_, cut);
    auto read = ReadJournal(path_);
    ASSERT_TRUE(read.ok()) << read.status();
    EXPECT_FALSE(read->corrupt) << cut;
    EXPECT_THAT(read->stopped, HasSubstr("torn"));
    EXPECT_EQ(read->valid_bytes, before);
    EXPECT_EQ(read->keys.size(), 0u);
  }
}

TEST_F(JournalTest, ZeroFilledTailIsATornTail) {
  Journaled j(path_, {});
  auto r = j.Reserve(0, 3);
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(j.Commit(0, nullptr, Chain(1, 3), *r).ok());
  const uint64_t whole = j.journal().bytes();
  // The file system extended the file but never wrote it.
  std::filesystem::resize_file(path_, whole + 300);
  auto read = ReadJournal(path_);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_FALSE(read->corrupt);
  EXPECT_THAT(read->stopped, HasSubstr("zeros"));
  EXPECT_EQ(read->keys.size(), 3u);
  // A last record half written, then zeros: torn too.
  std::filesystem::resize_file(path_, whole);
  ASSERT_TRUE(j.Drop(Key(1, 2)).ok());
  FlipByte(path_, whole + 12);
  std::filesystem::resize_file(path_, j.journal().bytes() + 100);
  read = ReadJournal(path_);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_FALSE(read->corrupt);
  EXPECT_EQ(read->valid_bytes, whole);
  // Zeros followed by anything else are not a tail.
  AppendBytes(path_, "x");
  read = ReadJournal(path_);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_TRUE(read->corrupt);
  EXPECT_EQ(read->valid_bytes, whole);
}

TEST_F(JournalTest, ValidRecordWithBadFieldsIsCorruptEvenAtTheEnd) {
  const HashKey k = Key(1, 0);
  const std::string hash(reinterpret_cast<const char*>(k.bytes.data()), 32);
  std::string bad_rank;
  PutLe32(&bad_rank, 7);  // Rank 7 of 1.
  PutLe32(&bad_rank, 0);
  PutLe32(&bad_rank, 0);
  std::string bad_row;
  PutLe32(&bad_row, 0);
  PutLe32(&bad_row, 1);
  PutLe32(&bad_row, 64);  // Of 64 rows.
  PutLe32(&bad_row, 0);
  const struct {
    std::string record;
    const char* field;
  } cases[] = {
      {Framed(kDropRecord, hash + "x"), "drop"},
      {Framed(9, hash), "unknown record type 9"},
      {Framed(kReserveRecord, bad_rank), "reserve.rank"},
      {Framed(kReserveRecord, bad_row), "reserve.page_rows[0]"},
  };
  for (const auto& c : cases) {
    std::filesystem::remove(path_);
    Journaled j(path_, {});
    auto r = j.Reserve(0, 3);
    ASSERT_TRUE(r.ok());
    ASSERT_TRUE(j.Commit(0, nullptr, Chain(1, 3), *r).ok());
    const uint64_t whole = j.journal().bytes();
    AppendBytes(path_, c.record);
    auto read = ReadJournal(path_);
    ASSERT_TRUE(read.ok()) << read.status();
    EXPECT_TRUE(read->corrupt) << c.field;
    EXPECT_THAT(read->stopped, HasSubstr(c.field));
    EXPECT_THAT(read->stopped, HasSubstr(absl::StrCat("offset ", whole)));
    EXPECT_EQ(read->valid_bytes, whole);
    EXPECT_EQ(read->keys.size(), 3u);
  }
}

TEST_F(JournalTest, AbsurdHeaderCountsAreDataLossNamingTheField) {
  const JournalHeader h = HeaderFor({.tp_size = 2});
  const struct {
    HeaderOverrides o;
    const char* field;
  } cases[] = {
      {{.segment_count = 0xffffffffu}, "header.segments"},
      {{.segment_count = 3}, "header.segments"},  // Only 2 written.
      {{.name_length = 0xfffffff0u}, "header.name"},
      {{.layout_length = 0x7fffffffu}, "header.layout"},
      {{.path_length = 0xffffff00u}, "header.segments[0].path"},
  };
  for (const auto& c : cases) {
    WriteHeaderOnly(path_, HeaderPayload(h, c.o));
    auto read = ReadJournal(path_);
    EXPECT_EQ(read.status().code(), absl::StatusCode::kDataLoss) << c.field;
    EXPECT_THAT(std::string(read.status().message()), HasSubstr(c.field));
  }
  JournalHeader zero = h;
  zero.page_rows = 0;
  WriteHeaderOnly(path_, HeaderPayload(zero));
  auto read = ReadJournal(path_);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(read.status().message()),
              HasSubstr("header.page_rows"));
  // The crafted header itself is fine.
  WriteHeaderOnly(path_, HeaderPayload(h));
  read = ReadJournal(path_);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->header.segments.size(), 2u);
}

TEST_F(JournalTest, HugeBankRowCountsDoNotSizeTheReplay) {
  // 64 ranks of 2^32 - 2 page and snapshot rows: a dense owner table would
  // take terabytes. The records name only a few of the rows.
  JournalHeader h = HeaderFor(
      {.page_rows = 0xfffffffe, .snapshot_rows = 0xfffffffe, .tp_size = 64});
  WriteHeaderOnly(path_, HeaderPayload(h));
  std::string reserve;
  PutLe32(&reserve, 63);
  PutLe32(&reserve, 2);
  PutLe32(&reserve, 0xfffffffd);
  PutLe32(&reserve, 12);
  PutLe32(&reserve, 1);
  PutLe32(&reserve, 0xfffffff0);
  AppendBytes(path_, Framed(kReserveRecord, reserve));
  auto read = ReadJournal(path_);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->stopped, "");
  EXPECT_EQ(read->ranks, 64u);
  EXPECT_EQ(read->outstanding_page_rows[63],
            (std::vector<uint32_t>{12, 0xfffffffd}));
  EXPECT_EQ(read->outstanding_snapshot_rows[63],
            (std::vector<uint32_t>{0xfffffff0}));
}

TEST_F(JournalTest, CountsThatCannotFitTheirRecordAreCorruptNotAllocated) {
  const HashKey k = Key(1, 0);
  const std::string hash(reinterpret_cast<const char*>(k.bytes.data()), 32);
  std::string nodes;  // A checkpoint record claiming 2^32 - 1 nodes.
  PutLe32(&nodes, 0xffffffffu);
  PutLe32(&nodes, kNoNode);
  nodes += hash;
  PutLe64(&nodes, 1);
  PutLe32(&nodes, 0);
  std::string few_nodes = nodes;  // 2 claimed, 1 written.
  few_nodes.replace(0, 4, std::string("\x02\0\0\0", 4));
  std::string commit;  // 2^32 - 1 pages.
  PutLe32(&commit, 0);
  commit += '\0';
  PutLe32(&commit, 0xffffffffu);
  commit += hash;
  PutLe32(&commit, 5);
  std::string snapshots = commit;  // 1 page, then 2^32 - 1 snapshots.
  snapshots.replace(5, 4, std::string("\x01\0\0\0", 4));
  PutLe32(&snapshots, 0xffffffffu);
  std::string reserve;  // 2^32 - 1 rows.
  PutLe32(&reserve, 0);
  PutLe32(&reserve, 0xffffffffu);
  PutLe32(&reserve, 1);
  const struct {
    std::string record;
    const char* field;
  } cases[] = {
      {Framed(kNodesRecord, nodes), "nodes.count"},
      {Framed(kNodesRecord, few_nodes), "nodes.count"},
      {Framed(kCommitRecord, commit), "commit.pages"},
      {Framed(kCommitRecord, snapshots), "commit.snapshots"},
      {Framed(kReserveRecord, reserve), "reserve.page_rows"},
  };
  for (const auto& c : cases) {
    for (bool followed : {false, true}) {
      std::filesystem::remove(path_);
      Journaled j(path_, {});
      auto r = j.Reserve(0, 2);
      ASSERT_TRUE(r.ok());
      ASSERT_TRUE(j.Commit(0, nullptr, Chain(1, 2), *r).ok());
      const uint64_t whole = j.journal().bytes();
      AppendBytes(path_, c.record);
      if (followed) AppendBytes(path_, Framed(kDropRecord, hash));
      auto read = ReadJournal(path_);
      ASSERT_TRUE(read.ok()) << read.status();
      EXPECT_TRUE(read->corrupt) << c.field;
      EXPECT_THAT(read->stopped, HasSubstr(c.field));
      EXPECT_EQ(read->valid_bytes, whole);
      EXPECT_EQ(read->keys.size(), 2u);
    }
  }
}

// ---------------------------------------------- outstanding reservations --

JournalContents MustRead(const std::string& path) {
  auto read = ReadJournal(path);
  EXPECT_TRUE(read.ok()) << read.status();
  if (!read.ok()) return {};
  EXPECT_EQ(read->stopped, "");
  return *std::move(read);
}

std::vector<uint32_t> Sorted(std::vector<uint32_t> rows) {
  std::sort(rows.begin(), rows.end());
  return rows;
}

TEST_F(JournalTest, OutstandingReservationsSurviveCheckpointsUntilConsumed) {
  Journaled j(path_, {.page_rows = 32, .snapshot_rows = 8, .tp_size = 2});
  const auto a = Chain(1, 4);
  auto committed = j.Reserve(0, 4);
  ASSERT_TRUE(committed.ok());
  ASSERT_TRUE(j.Commit(0, nullptr, a, *committed).ok());
  auto p0 = j.Reserve(0, 3, 1);
  auto p1 = j.Reserve(1, 2);
  ASSERT_TRUE(p0.ok() && p1.ok());
  // Appended records: the reservations are outstanding.
  JournalContents c = MustRead(path_);
  EXPECT_EQ(c.outstanding_page_rows[0], Sorted(p0->pages));
  EXPECT_EQ(c.outstanding_snapshot_rows[0], Sorted(p0->snapshots));
  EXPECT_EQ(c.outstanding_page_rows[1], Sorted(p1->pages));
  EXPECT_EQ(c.outstanding_snapshot_rows[1], std::vector<uint32_t>{});

  // A checkpoint writes them after the nodes; replay keeps the nodes whole.
  ASSERT_TRUE(j.journal().Checkpoint(j.index()).ok());
  auto restored = j.Replay(&c);
  ASSERT_NE(restored, nullptr);
  j.ExpectRestored(j.index(), *restored);
  EXPECT_EQ(c.records, 4u);  // Header, nodes, a reserve per rank.
  EXPECT_EQ(c.outstanding_page_rows[0], Sorted(p0->pages));
  EXPECT_EQ(c.outstanding_snapshot_rows[0], Sorted(p0->snapshots));
  EXPECT_EQ(c.outstanding_page_rows[1], Sorted(p1->pages));

  // Committing consumes a reservation, a deduplicated page included.
  ASSERT_TRUE(j.Commit(0, &a[3], Chain(2, 3), *p0, {2}).ok());
  ASSERT_TRUE(j.Commit(1, nullptr, {a[0], a[1]}, *p1).ok());
  auto later = j.Reserve(1, 2);
  ASSERT_TRUE(later.ok());
  ASSERT_TRUE(j.Commit(1, &a[0], {a[1], a[2]}, *later).ok());  // a[1] dedups.
  auto p2 = j.Reserve(0, 2, 1);
  ASSERT_TRUE(p2.ok());
  c = MustRead(path_);
  EXPECT_EQ(c.outstanding_page_rows[0], Sorted(p2->pages));
  EXPECT_EQ(c.outstanding_snapshot_rows[0], Sorted(p2->snapshots));
  EXPECT_EQ(c.outstanding_page_rows[1], std::vector<uint32_t>{});

  // Compaction keeps the ones still allocated; an aborted one (unjournaled)
  // stays outstanding until then.
  ASSERT_TRUE(j.journal().Checkpoint(j.index()).ok());
  auto aborted = j.Reserve(1, 3);
  ASSERT_TRUE(aborted.ok());
  ASSERT_TRUE(j.index().FreePageRows(1, aborted->pages).ok());
  c = MustRead(path_);
  EXPECT_EQ(c.outstanding_page_rows[0], Sorted(p2->pages));
  EXPECT_EQ(c.outstanding_snapshot_rows[0], Sorted(p2->snapshots));
  EXPECT_EQ(c.outstanding_page_rows[1], Sorted(aborted->pages));
  ASSERT_TRUE(j.journal().Checkpoint(j.index()).ok());
  restored = j.Replay(&c);
  ASSERT_NE(restored, nullptr);
  j.ExpectRestored(j.index(), *restored);
  EXPECT_EQ(c.outstanding_page_rows[0], Sorted(p2->pages));
  EXPECT_EQ(c.outstanding_snapshot_rows[0], Sorted(p2->snapshots));
  EXPECT_EQ(c.outstanding_page_rows[1], std::vector<uint32_t>{});
  EXPECT_EQ(c.outstanding_snapshot_rows[1], std::vector<uint32_t>{});
  EXPECT_EQ(c.outstanding_page_rows[0], j.index().AllocatedPageRows(0));
}

TEST_F(JournalTest, CreateWritesTheIndexsOutstandingReservations) {
  const Shape shape{.page_rows = 16, .snapshot_rows = 4, .tp_size = 2};
  auto index = MakeIndex(shape);
  auto pages = index->AllocatePageRows(1, 3);
  auto snaps = index->AllocateSnapshotRows(1, 2);
  ASSERT_TRUE(pages.ok() && snaps.ok());
  auto journal = NamespaceJournal::Create(path_, HeaderFor(shape), *index, {});
  ASSERT_TRUE(journal.ok()) << journal.status();
  JournalContents c = MustRead(path_);
  EXPECT_EQ(c.records, 2u);  // Header, rank 1's reserve (rank 0 has none).
  EXPECT_EQ(c.outstanding_page_rows,
            (std::vector<std::vector<uint32_t>>{{}, Sorted(*pages)}));
  EXPECT_EQ(c.outstanding_snapshot_rows,
            (std::vector<std::vector<uint32_t>>{{}, Sorted(*snaps)}));
  EXPECT_EQ(c.keys.size(), 0u);
}

TEST_F(JournalTest, RowsReservedAgainAfterAnAbortStayOutstanding) {
  Journaled j(path_, {.page_rows = 8});
  auto first = j.Reserve(0, 2);
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(j.index().FreePageRows(0, first->pages).ok());  // An abort.
  auto again = j.Reserve(0, 1);
  ASSERT_TRUE(again.ok());
  std::vector<uint32_t> both = first->pages;
  both.insert(both.end(), again->pages.begin(), again->pages.end());
  std::sort(both.begin(), both.end());
  both.erase(std::unique(both.begin(), both.end()), both.end());
  JournalContents c = MustRead(path_);
  EXPECT_EQ(c.outstanding_page_rows[0], both);
  // Committing the second consumes only its rows.
  ASSERT_TRUE(j.Commit(0, nullptr, {Key(1, 0)}, *again).ok());
  c = MustRead(path_);
  std::vector<uint32_t> rest;
  for (uint32_t row : both) {
    if (row != again->pages[0]) rest.push_back(row);
  }
  EXPECT_EQ(c.outstanding_page_rows[0], rest);
}

TEST_F(JournalTest, FullyDeduplicatedCommitsConsumeAnUnambiguousReservation) {
  Journaled j(path_, {.page_rows = 32, .snapshot_rows = 4, .tp_size = 1});
  const auto a = Chain(1, 3);
  auto r = j.Reserve(0, 3, 1);
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(j.Commit(0, nullptr, a, *r, {2}).ok());
  // Every row deduplicated: the record names none, but this is the only
  // reservation of 3 pages.
  auto dup = j.Reserve(0, 3, 1);
  ASSERT_TRUE(dup.ok());
  ASSERT_TRUE(j.Commit(0, nullptr, a, *dup, {2}).ok());
  JournalContents c = MustRead(path_);
  EXPECT_EQ(c.outstanding_page_rows[0], std::vector<uint32_t>{});
  EXPECT_EQ(c.outstanding_snapshot_rows[0], std::vector<uint32_t>{});
  // Two of that size outstanding: which one committed is unknown, so both
  // stay (fencing a free row is harmless; missing a written one is not).
  auto x = j.Reserve(0, 2);
  auto y = j.Reserve(0, 2);
  ASSERT_TRUE(x.ok() && y.ok());
  ASSERT_TRUE(j.Commit(0, nullptr, {a[0], a[1]}, *x).ok());
  c = MustRead(path_);
  std::vector<uint32_t> xy = x->pages;
  xy.insert(xy.end(), y->pages.begin(), y->pages.end());
  EXPECT_EQ(c.outstanding_page_rows[0], Sorted(xy));
  // A checkpoint's record may merge reservations: no size match against it.
  ASSERT_TRUE(j.journal().Checkpoint(j.index()).ok());
  ASSERT_TRUE(j.Commit(0, nullptr, {a[0], a[1]}, *y).ok());
  c = MustRead(path_);
  EXPECT_EQ(c.outstanding_page_rows[0], Sorted(y->pages));
  ASSERT_TRUE(j.journal().Checkpoint(j.index()).ok());
  c = MustRead(path_);
  EXPECT_EQ(c.outstanding_page_rows[0], std::vector<uint32_t>{});
}

// Reservations kept pending across other traffic, committed (some fully
// deduplicated), aborted and checkpointed in random order. Replayed, every
// row still allocated-uncommitted is outstanding (the safety property:
// recovery fences every row an engine may be writing), no outstanding row
// was consumed-and-checkpointed away or is a restored node's, and the
// nodes come back whole.
TEST_F(JournalTest, RandomPendingReservationsAreAlwaysOutstanding) {
  const char* env_seed = getenv("KVTIER_JOURNAL_SEED");
  std::mt19937_64 rng(env_seed != nullptr ? std::strtoull(env_seed, nullptr, 10)
                                          : 7);
  const Shape shape{.page_rows = 40, .snapshot_rows = 10, .tp_size = 2};
  Journaled j(path_, shape);
  struct Pending {
    uint32_t rank;
    Journaled::Rows rows;
  };
  std::vector<Pending> pending;
  // Rows that may be outstanding: reserved since the last checkpoint, or
  // allocated at it.
  std::vector<std::set<uint32_t>> maybe_pages(2), maybe_snaps(2);
  uint64_t checks = 0;
  for (int step = 0; step < 1500; ++step) {
    const int op = static_cast<int>(rng() % 10);
    if (op < 4 && pending.size() < 5) {
      const uint32_t rank = rng() % 2;
      auto rows = j.Reserve(rank, 1 + rng() % 4, rng() % 3 == 0 ? 1 : 0);
      if (rows.ok()) {
        pending.push_back({rank, *rows});
        maybe_pages[rank].insert(rows->pages.begin(), rows->pages.end());
        maybe_snaps[rank].insert(rows->snapshots.begin(),
                                 rows->snapshots.end());
      }
    } else if (op < 7 && !pending.empty()) {
      const size_t i = rng() % pending.size();
      const Pending p = pending[i];
      pending.erase(pending.begin() + i);
      // Chains 0..5 of length 1..4: commits often deduplicate.
      const uint64_t chain = rng() % 6;
      const auto hashes = Chain(chain, p.rows.pages.size());
      const std::vector<size_t> snap_at =
          p.rows.snapshots.empty() ? std::vector<size_t>{}
                                   : std::vector<size_t>{hashes.size() - 1};
      if (!j.Commit(p.rank, nullptr, hashes, p.rows, snap_at).ok()) {
        ASSERT_TRUE(j.index().FreePageRows(p.rank, p.rows.pages).ok());
        ASSERT_TRUE(j.index().FreeSnapshotRows(p.rank, p.rows.snapshots).ok());
      }
    } else if (op < 8 && !pending.empty()) {
      const size_t i = rng() % pending.size();
      ASSERT_TRUE(
          j.index().FreePageRows(pending[i].rank, pending[i].rows.pages).ok());
      ASSERT_TRUE(
          j.index()
              .FreeSnapshotRows(pending[i].rank, pending[i].rows.snapshots)
              .ok());
      pending.erase(pending.begin() + i);
    } else if (op == 8) {
      ASSERT_TRUE(j.journal().Checkpoint(j.index()).ok());
      for (uint32_t r = 0; r < 2; ++r) {
        const auto pages = j.index().AllocatedPageRows(r);
        const auto snaps = j.index().AllocatedSnapshotRows(r);
        maybe_pages[r] = {pages.begin(), pages.end()};
        maybe_snaps[r] = {snaps.begin(), snaps.end()};
      }
    } else {
      ++checks;
      JournalContents c;
      auto restored = j.Replay(&c);
      ASSERT_NE(restored, nullptr);
      j.ExpectRestored(j.index(), *restored);
      for (uint32_t r = 0; r < 2; ++r) {
        const auto& out_pages = c.outstanding_page_rows[r];
        const auto& out_snaps = c.outstanding_snapshot_rows[r];
        ASSERT_TRUE(std::is_sorted(out_pages.begin(), out_pages.end()));
        for (uint32_t row : j.index().AllocatedPageRows(r)) {
          ASSERT_TRUE(
              std::binary_search(out_pages.begin(), out_pages.end(), row))
              << "step " << step << ": allocated page row " << row
              << " of rank " << r << " is not outstanding";
        }
        for (uint32_t row : j.index().AllocatedSnapshotRows(r)) {
          ASSERT_TRUE(
              std::binary_search(out_snaps.begin(), out_snaps.end(), row))
              << "step " << step << ": allocated snapshot row " << row;
        }
        for (uint32_t row : out_pages) ASSERT_TRUE(maybe_pages[r].count(row));
        for (uint32_t row : out_snaps) ASSERT_TRUE(maybe_snaps[r].count(row));
      }
      for (size_t i = 0; i < c.keys.size(); ++i) {
        for (uint32_t r = 0; r < 2; ++r) {
          const auto& out = c.outstanding_page_rows[r];
          ASSERT_FALSE(std::binary_search(out.begin(), out.end(),
                                          c.page_rows[i * 2 + r]));
        }
      }
    }
    ASSERT_TRUE(j.index().CheckInvariants().ok());
  }
  EXPECT_GT(checks, 50u);
}

// --------------------------------------------- journals old versions wrote --

// testdata/journal_v1.journal was written by the journal code of commit
// fa61dda (before torn/corrupt were told apart and before checkpoints held
// reservations) running WriteFixtureScenario above on kFixtureShape, and
// copied as is. It is data: NEVER regenerate it with a newer version (that
// would test nothing); add a new fixture for a new format instead. The
// expected nodes below are what that scenario committed (hashes Key(chain,
// page); rows as the index allocated them then).
struct FixtureNode {
  HashKey key;
  std::optional<HashKey> parent;
  std::vector<uint32_t> page_rows, snapshot_rows;  // By rank.
};

std::vector<FixtureNode> FixtureV1Nodes() {
  constexpr uint32_t x = kNoRow;
  const HashKey a0 = Key(1, 0), a1 = Key(1, 1), a2 = Key(1, 2), a3 = Key(1, 3);
  const HashKey b0 = Key(2, 0), c0 = Key(3, 0), c1 = Key(3, 1), c2 = Key(3, 2);
  const HashKey e0 = Key(5, 0);
  return {
      {a0, std::nullopt, {0, 0}, {x, x}},
      {a1, a0, {1, 1}, {x, 0}},
      {a2, a1, {2, 2}, {x, x}},
      {a3, a2, {3, 3}, {0, x}},            // Rank 0's second a[3] deduplicated.
      {b0, std::nullopt, {4, x}, {x, x}},  // b[1] dropped.
      {c0, a1, {6, 4}, {x, x}},
      {c1, c0, {7, 5}, {x, x}},
      {c2, c1, {8, x}, {1, x}},
      {e0, a3, {10, x}, {x, x}},  // Row 9 went to the deduplicated a[3].
  };
}

// The restored index holds exactly FixtureV1Nodes().
void ExpectFixtureV1Nodes(const PrefixIndex& index) {
  auto name = [](const HashKey& k) {
    return std::string(reinterpret_cast<const char*>(k.bytes.data()), 32);
  };
  absl::flat_hash_map<uint32_t, std::string> key_of;
  absl::flat_hash_map<std::string, FixtureNode> got;
  index.ForEachNode([&](const PrefixIndex::NodeView& v) {
    key_of[v.id] = name(*v.key);
    FixtureNode n;
    n.key = *v.key;
    if (v.parent != kNoNode) {
      const std::string& p = key_of[v.parent];
      std::memcpy(n.parent.emplace().bytes.data(), p.data(), 32);
    }
    n.page_rows.assign(v.page_rows.begin(), v.page_rows.end());
    n.snapshot_rows.assign(v.snapshot_rows.begin(), v.snapshot_rows.end());
    got[name(*v.key)] = n;
  });
  const std::vector<FixtureNode> want = FixtureV1Nodes();
  EXPECT_EQ(got.size(), want.size());
  for (const FixtureNode& w : want) {
    auto it = got.find(name(w.key));
    ASSERT_NE(it, got.end()) << "missing node " << w.page_rows[0];
    const FixtureNode& g = it->second;
    EXPECT_EQ(g.parent.has_value(), w.parent.has_value()) << w.page_rows[0];
    if (g.parent && w.parent) {
      EXPECT_EQ(name(*g.parent), name(*w.parent)) << w.page_rows[0];
    }
    EXPECT_EQ(g.page_rows, w.page_rows) << w.page_rows[0];
    EXPECT_EQ(g.snapshot_rows, w.snapshot_rows) << w.page_rows[0];
  }
}

void ExpectFixtureV1Contents(const JournalContents& c) {
  EXPECT_EQ(c.stopped, "");
  EXPECT_FALSE(c.corrupt);
  EXPECT_EQ(c.inconsistent, 0u);
  EXPECT_EQ(c.header.name, "ns-test");
  EXPECT_EQ(c.header.page_rows, 16u);
  EXPECT_EQ(c.header.snapshot_rows, 4u);
  EXPECT_EQ(c.header.layout.tp_size(), 2u);
  EXPECT_EQ(c.header.layout.snapshot_row_bytes(), 512u);
  ASSERT_EQ(c.header.segments.size(), 2u);
  EXPECT_EQ(c.header.segments[1].path, "/dev/shm/x.kv.r1");
  EXPECT_EQ(c.header.segments[1].created_unix_ns, 1001u);
  EXPECT_EQ(c.ranks, 2u);
  EXPECT_EQ(c.keys.size(), 9u);
  // Rank 1's last reservation was never committed.
  EXPECT_EQ(c.outstanding_page_rows,
            (std::vector<std::vector<uint32_t>>{{}, {6, 7}}));
  EXPECT_EQ(c.outstanding_snapshot_rows,
            (std::vector<std::vector<uint32_t>>{{}, {1}}));
}

TEST(JournalFixtureTest, JournalV1StillReplays) {
  const std::string path =
      std::string(KVTIER_TESTDATA_DIR) + "/journal_v1.journal";
  ASSERT_TRUE(std::filesystem::exists(path)) << path;
  auto read = ReadJournal(path);
  ASSERT_TRUE(read.ok()) << read.status();
  ExpectFixtureV1Contents(*read);
  // Header, checkpoint, 4 reserves, 3 commits, a drop.
  EXPECT_EQ(read->records, 10u);
  EXPECT_EQ(read->file_bytes, 1198u);
  EXPECT_EQ(read->valid_bytes, read->file_bytes);
  auto index = MakeIndex(kFixtureShape);
  auto restored = RestoreIndex(*read, index.get());
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ(*restored, 15u);  // Node-rank pairs.
  EXPECT_TRUE(index->CheckInvariants().ok()) << index->CheckInvariants();
  ExpectFixtureV1Nodes(*index);
}

TEST_F(JournalTest, TheFixtureScenarioReplaysAlikeWithTheCurrentWriter) {
  Journaled j(path_, kFixtureShape);
  WriteFixtureScenario(j);
  JournalContents c;
  auto restored = j.Replay(&c);
  ASSERT_NE(restored, nullptr);
  ExpectFixtureV1Contents(c);
  ExpectFixtureV1Nodes(*restored);
}

}  // namespace
}  // namespace kvtier::daemon
