// Tests of the namespace journal: CRC-32C, record round trips through
// ReadJournal and RestoreIndex, torn and corrupt tails, compaction, a failed
// append, and a randomized check that replay keeps every committed page and
// serves no row whose bytes belong to another page.
#include "daemon/journal.h"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "daemon/namespace_layout.h"
#include "daemon/tier_core.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvtier::daemon {
namespace {

using ::testing::HasSubstr;

HashKey Key(uint64_t chain, uint64_t page) {
  HashKey k;
  uint64_t x = chain * 0x9e3779b97f4a7c15ull + page * 0xbf58476d1ce4e5b9ull + 1;
  for (int w = 0; w < 4; ++w) {
    x ^= x >> 31;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 29;
    std::memcpy(k.bytes.data() + 8 * w, &x, 8);
  }
  return k;
}

std::vector<HashKey> Chain(uint64_t chain, size_t n, size_t from = 0) {
  std::vector<HashKey> out;
  for (size_t i = from; i < from + n; ++i) out.push_back(Key(chain, i));
  return out;
}

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

TEST(Crc32cTest, KnownValueAndIncremental) {
  const std::string s = "123456789";
  EXPECT_EQ(Crc32c(s.data(), s.size()), 0xe3069283u);
  EXPECT_EQ(Crc32c(s.data() + 4, 5, Crc32c(s.data(), 4)), 0xe3069283u);
  EXPECT_EQ(Crc32c(nullptr, 0), 0u);
  std::string zeros(32, '\0');
  EXPECT_EQ(Crc32c(zeros.data(), zeros.size()), 0x8a9136aau);
}

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
    EXPECT_LT(read->valid_bytes, cut);
    auto copy = MakeIndex({});
    auto restored = RestoreIndex(*read, copy.get());
    ASSERT_TRUE(restored.ok()) << restored.status();
    EXPECT_EQ(copy->Lookup(Chain(1, 12), 0).matched_pages, 8u);
    EXPECT_TRUE(copy->CheckInvariants().ok());
  }
}

TEST_F(JournalTest, CorruptRecordEndsReplay) {
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
  EXPECT_THAT(read->stopped, HasSubstr("CRC mismatch"));
  EXPECT_EQ(read->valid_bytes, before);
  EXPECT_EQ(read->keys.size(), 3u);
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

// ------------------------------------------------- TierCore's recovery --

std::string Packed(uint64_t chain, size_t n, size_t from = 0) {
  std::string out;
  for (const HashKey& k : Chain(chain, n, from)) {
    out.append(reinterpret_cast<const char*>(k.bytes.data()), 32);
  }
  return out;
}

// A daemon's core over a test folder, "restarted" by destroying it (nothing
// is flushed at destruction: as after SIGKILL, only what write(2) put in the
// journal files counts) and building a new one that recovers.
class TierCoreRecoveryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/dev/shm/kvtier-recovery-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    options_.segments.shm_dir = dir_;
    options_.segments.huge_pages = shm::HugePagePolicy::kOff;
    options_.state_dir = dir_ + "/state";
    Start();
  }
  void TearDown() override {
    core_.reset();
    std::filesystem::remove_all(dir_);
  }

  TierCore::RecoveryReport Start() {
    core_ = std::make_unique<TierCore>(options_);
    auto report = core_->Recover();
    EXPECT_TRUE(report.ok()) << report.status();
    v1::Hello hello;
    hello.set_client_name("engine");
    auto id = core_->OpenSession(hello, PeerInfo{});
    EXPECT_TRUE(id.ok()) << id.status();
    session_ = *id;
    return report.ok() ? *report : TierCore::RecoveryReport{};
  }
  TierCore::RecoveryReport Restart() {
    core_.reset();
    return Start();
  }

  static v1::Layout Layout(bool hybrid) {
    v1::Layout l;
    l.set_model("recovery-test");
    l.set_tokens_per_page(16);
    l.set_num_layers(2);
    auto* kv = l.add_page_banks();
    kv->set_name("kv");
    kv->set_row_bytes(64);
    if (hybrid) l.set_snapshot_row_bytes(128);
    return l;
  }

  uint64_t Attach(const std::string& name, bool hybrid = false,
                  uint64_t page_rows = 64) {
    v1::AttachRequest req;
    req.set_session_id(session_);
    req.set_namespace_(name);
    *req.mutable_layout() = Layout(hybrid);
    req.mutable_capacity()->set_page_rows(page_rows);
    if (hybrid) req.mutable_capacity()->set_snapshot_rows(8);
    v1::AttachResponse resp;
    absl::Status s = core_->Attach(req, &resp);
    EXPECT_TRUE(s.ok()) << s;
    return resp.namespace_id();
  }

  absl::StatusOr<v1::ReserveResponse> Reserve(uint64_t ns, uint32_t pages,
                                              uint32_t snaps = 0) {
    v1::ReserveRequest req;
    req.set_session_id(session_);
    req.set_namespace_id(ns);
    req.set_pages(pages);
    req.set_snapshots(snaps);
    v1::ReserveResponse resp;
    absl::Status s = core_->Reserve(req, &resp);
    if (!s.ok()) return s;
    return resp;
  }

  // Reserves and commits pages [from, from + n) of `chain`, with a snapshot
  // after the last page when `snapshot`.
  void Put(uint64_t ns, uint64_t chain, uint32_t n, uint32_t from = 0,
           bool snapshot = false) {
    auto r = Reserve(ns, n, snapshot ? 1 : 0);
    ASSERT_TRUE(r.ok()) << r.status();
    v1::CommitRequest req;
    req.set_session_id(session_);
    req.set_namespace_id(ns);
    req.set_reservation_id(r->reservation_id());
    if (from > 0) req.set_parent_hash(Packed(chain, 1, from - 1));
    req.set_hashes(Packed(chain, n, from));
    if (snapshot) {
      auto* p = req.add_snapshots();
      p->set_index(0);
      p->set_hash(Packed(chain, 1, from + n - 1));
    }
    v1::CommitResponse resp;
    absl::Status s = core_->Commit(req, &resp);
    ASSERT_TRUE(s.ok()) << s;
  }

  v1::LookupResponse Lookup(uint64_t ns, const std::string& hashes) {
    v1::LookupRequest req;
    req.set_session_id(session_);
    req.set_namespace_id(ns);
    req.set_hashes(hashes);
    v1::LookupResponse resp;
    absl::Status s = core_->Lookup(req, &resp);
    EXPECT_TRUE(s.ok()) << s;
    return resp;
  }

  v1::BankUsage Bank(const std::string& ns, const std::string& bank) {
    v1::StatsResponse stats;
    EXPECT_TRUE(core_->Stats({}, &stats).ok());
    for (const auto& n : stats.namespaces()) {
      if (n.name() != ns) continue;
      for (const auto& b : n.banks()) {
        if (b.bank() == bank) return b;
      }
    }
    ADD_FAILURE() << "no bank " << bank << " in " << ns;
    return {};
  }

  void ExpectVerified() {
    v1::VerifyResponse v;
    ASSERT_TRUE(core_->Verify({}, &v).ok());
    EXPECT_TRUE(v.ok()) << v.violation();
  }

  std::string dir_;
  TierOptions options_;
  std::unique_ptr<TierCore> core_;
  uint64_t session_ = 0;
};

TEST_F(TierCoreRecoveryTest, RestartFindsEveryAcknowledgedCommit) {
  uint64_t plain = Attach("plain");
  uint64_t hybrid = Attach("hybrid", /*hybrid=*/true);
  Put(plain, 1, 10);
  Put(plain, 1, 5, 10);  // A child commit.
  Put(plain, 2, 7);
  Put(hybrid, 3, 6, 0, /*snapshot=*/true);
  Put(hybrid, 3, 4, 6, /*snapshot=*/true);
  // Reserved, never committed: its rows must come back free.
  auto pending = Reserve(plain, 9);
  ASSERT_TRUE(pending.ok());
  auto pending_snap = Reserve(hybrid, 2, 1);
  ASSERT_TRUE(pending_snap.ok());
  const auto before_1 = Lookup(plain, Packed(1, 20));
  const auto before_3 = Lookup(hybrid, Packed(3, 10));

  TierCore::RecoveryReport report = Restart();
  EXPECT_EQ(report.namespaces, 2u);
  EXPECT_EQ(report.namespaces_emptied, 0u);
  EXPECT_EQ(report.pages, 32u);
  EXPECT_EQ(report.journals_torn, 0u);
  plain = Attach("plain");
  hybrid = Attach("hybrid", true);
  const auto after_1 = Lookup(plain, Packed(1, 20));
  EXPECT_EQ(after_1.matched_pages(), 15u);
  EXPECT_EQ(
      std::vector<uint32_t>(after_1.rows().begin(), after_1.rows().end()),
      std::vector<uint32_t>(before_1.rows().begin(), before_1.rows().end()));
  EXPECT_EQ(Lookup(plain, Packed(2, 7)).matched_pages(), 7u);
  const auto after_3 = Lookup(hybrid, Packed(3, 10));
  EXPECT_EQ(after_3.usable_pages(), 10u);
  EXPECT_TRUE(after_3.has_snapshot());
  EXPECT_EQ(after_3.snapshot_row(), before_3.snapshot_row());
  EXPECT_EQ(
      std::vector<uint32_t>(after_3.rows().begin(), after_3.rows().end()),
      std::vector<uint32_t>(before_3.rows().begin(), before_3.rows().end()));
  // Free + reserved + committed = total, with the pending rows free again.
  const v1::BankUsage kv = Bank("plain", "kv");
  EXPECT_EQ(kv.used_rows(), 22u);
  EXPECT_EQ(kv.reserved_rows(), 0u);
  EXPECT_EQ(kv.free_rows(), 64u - 22u);
  EXPECT_EQ(Bank("hybrid", "snapshot").used_rows(), 2u);
  EXPECT_EQ(Bank("hybrid", "snapshot").free_rows(), 6u);
  ExpectVerified();
  // The restarted daemon keeps journaling: a second restart loses nothing.
  Put(plain, 4, 3);
  Restart();
  plain = Attach("plain");
  EXPECT_EQ(Lookup(plain, Packed(1, 20)).matched_pages(), 15u);
  EXPECT_EQ(Lookup(plain, Packed(4, 3)).matched_pages(), 3u);
  ExpectVerified();
}

TEST_F(TierCoreRecoveryTest, SixteenByteHashesAndTensorParallelRanks) {
  v1::Layout layout = Layout(false);
  layout.set_hash_kind(v1::HASH_KIND_XXH3_128);
  layout.set_tp_size(2);
  auto attach = [&](uint32_t rank) {
    v1::AttachRequest req;
    req.set_session_id(session_);
    req.set_namespace_("tp");
    *req.mutable_layout() = layout;
    req.set_tp_rank(rank);
    req.mutable_capacity()->set_page_rows(32);
    v1::AttachResponse resp;
    absl::Status s = core_->Attach(req, &resp);
    EXPECT_TRUE(s.ok()) << s;
    return resp.namespace_id();
  };
  auto put = [&](uint64_t ns, const std::string& hashes) {
    auto r = Reserve(ns, hashes.size() / 16);
    ASSERT_TRUE(r.ok()) << r.status();
    v1::CommitRequest req;
    req.set_session_id(session_);
    req.set_namespace_id(ns);
    req.set_reservation_id(r->reservation_id());
    req.set_hashes(hashes);
    v1::CommitResponse resp;
    ASSERT_TRUE(core_->Commit(req, &resp).ok());
  };
  std::string hashes;
  for (const HashKey& k : Chain(5, 6)) {
    hashes.append(reinterpret_cast<const char*>(k.bytes.data()), 16);
  }
  // Rank 0 commits 6 pages, rank 1 the first 4 (one session per rank).
  const uint64_t ns = attach(0);
  put(ns, hashes);
  v1::Hello hello;
  auto rank1 = core_->OpenSession(hello, PeerInfo{});
  ASSERT_TRUE(rank1.ok());
  std::swap(session_, *rank1);
  put(attach(1), hashes.substr(0, 4 * 16));
  Restart();
  const uint64_t again = attach(0);
  EXPECT_EQ(Lookup(again, hashes).matched_pages(), 4u);  // Complete nodes.
  EXPECT_EQ(Bank("tp", "kv").used_rows(), 6u);  // Rank 0's bank (listed first).
  ExpectVerified();
}

TEST_F(TierCoreRecoveryTest, EvictionsAndDropsSurviveRestart) {
  uint64_t ns = Attach("churn", false, 16);
  Put(ns, 1, 8);
  Put(ns, 2, 8);
  // Evicts chain 1's tail (least recent) for chain 3.
  Put(ns, 3, 4);
  v1::DropRequest drop;
  drop.set_namespace_("churn");
  drop.set_hash(Packed(2, 1, 5));
  v1::DropResponse dropped;
  ASSERT_TRUE(core_->Drop(drop, &dropped).ok());
  const uint32_t m1 = Lookup(ns, Packed(1, 8)).matched_pages();
  const uint32_t m2 = Lookup(ns, Packed(2, 8)).matched_pages();
  EXPECT_EQ(m1, 4u);
  EXPECT_EQ(m2, 5u);
  Restart();
  ns = Attach("churn", false, 16);
  EXPECT_EQ(Lookup(ns, Packed(1, 8)).matched_pages(), m1);
  EXPECT_EQ(Lookup(ns, Packed(2, 8)).matched_pages(), m2);
  EXPECT_EQ(Lookup(ns, Packed(3, 4)).matched_pages(), 4u);
  ExpectVerified();
}

TEST_F(TierCoreRecoveryTest, RecreatedSegmentEmptiesItsNamespaceOnly) {
  uint64_t a = Attach("kept");
  uint64_t b = Attach("lost");
  Put(a, 1, 5);
  Put(b, 1, 5);
  core_.reset();
  // While the daemon is down, one bank of "lost" disappears.
  ASSERT_TRUE(std::filesystem::remove(dir_ + "/kvtier.lost.kv.r0"));
  TierCore::RecoveryReport report = Start();
  EXPECT_EQ(report.namespaces, 2u);
  EXPECT_EQ(report.namespaces_emptied, 1u);
  a = Attach("kept");
  b = Attach("lost");
  EXPECT_EQ(Lookup(a, Packed(1, 5)).matched_pages(), 5u);
  EXPECT_EQ(Lookup(b, Packed(1, 5)).matched_pages(), 0u);
  EXPECT_EQ(Bank("lost", "kv").free_rows(), 64u);
  ExpectVerified();
  // The emptied namespace journals anew: its next commits survive.
  Put(b, 2, 3);
  Restart();
  b = Attach("lost");
  EXPECT_EQ(Lookup(b, Packed(2, 3)).matched_pages(), 3u);
  EXPECT_EQ(Lookup(b, Packed(1, 5)).matched_pages(), 0u);
}

TEST_F(TierCoreRecoveryTest, SegmentReplacedUnderTheSameNameIsNotVouchedFor) {
  uint64_t ns = Attach("swapped");
  Put(ns, 1, 5);
  core_.reset();
  // Another creator made a new segment of the same shape under the name.
  const std::string path = dir_ + "/kvtier.swapped.kv.r0";
  auto old = shm::Segment::Open(path);
  ASSERT_TRUE(old.ok()) << old.status();
  shm::SegmentSpec spec;
  spec.file_name = "kvtier.swapped.kv.r0";
  spec.namespace_name = "swapped";
  spec.bank = "kv";
  spec.rows = old->rows();
  spec.row_bytes = old->row_bytes();
  std::memcpy(spec.layout_fingerprint.data(), old->header().layout_fingerprint,
              32);
  ASSERT_TRUE(std::filesystem::remove(path));
  shm::SegmentOptions so;
  so.shm_dir = dir_;
  so.huge_pages = shm::HugePagePolicy::kOff;
  auto fresh = shm::Segment::Create(spec, so);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  ASSERT_NE(fresh->header().created_unix_ns, old->header().created_unix_ns);
  TierCore::RecoveryReport report = Start();
  EXPECT_EQ(report.namespaces_emptied, 1u);
  ns = Attach("swapped");
  EXPECT_EQ(Lookup(ns, Packed(1, 5)).matched_pages(), 0u);
}

TEST_F(TierCoreRecoveryTest, TornJournalTailKeepsWhatPrecedesIt) {
  uint64_t ns = Attach("torn");
  Put(ns, 1, 6);
  const std::string path = JournalPath(options_.state_dir, "torn");
  const uint64_t whole = std::filesystem::file_size(path);
  Put(ns, 2, 6);
  core_.reset();
  // A record cut short by the crash (write(2) interrupted by power loss).
  std::filesystem::resize_file(path, std::filesystem::file_size(path) - 7);
  TierCore::RecoveryReport report = Start();
  EXPECT_EQ(report.journals_torn, 1u);
  ns = Attach("torn");
  EXPECT_EQ(Lookup(ns, Packed(1, 6)).matched_pages(), 6u);
  EXPECT_EQ(Lookup(ns, Packed(2, 6)).matched_pages(), 0u);
  ExpectVerified();
  // The rewritten journal has no torn tail left.
  auto read = ReadJournal(path);
  ASSERT_TRUE(read.ok());
  EXPECT_EQ(read->stopped, "");
  EXPECT_GT(whole, 0u);
}

TEST_F(TierCoreRecoveryTest, DroppedNamespaceLeavesNoJournal) {
  Attach("gone");
  const std::string path = JournalPath(options_.state_dir, "gone");
  EXPECT_TRUE(std::filesystem::exists(path));
  v1::DropRequest drop;
  drop.set_namespace_("gone");
  drop.set_force(true);
  v1::DropResponse resp;
  ASSERT_TRUE(core_->Drop(drop, &resp).ok());
  EXPECT_FALSE(std::filesystem::exists(path));
  TierCore::RecoveryReport report = Restart();
  EXPECT_EQ(report.namespaces, 0u);
}

TEST_F(TierCoreRecoveryTest, SecondDaemonOnTheSameStateDirIsRefused) {
  TierCore other(options_);
  auto report = other.Recover();
  EXPECT_EQ(report.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(report.status().message()), HasSubstr("locked"));
}

TEST_F(TierCoreRecoveryTest, UnreadableJournalIsRemovedNotFatal) {
  Attach("fine");
  core_.reset();
  { std::ofstream(JournalPath(options_.state_dir, "junk")) << "garbage"; }
  TierCore::RecoveryReport report = Start();
  EXPECT_EQ(report.journals_unreadable, 1u);
  EXPECT_EQ(report.namespaces, 1u);
  EXPECT_FALSE(
      std::filesystem::exists(JournalPath(options_.state_dir, "junk")));
}

// Recovery time for many pages: commits of 4096 pages until N pages, a
// restart replaying the commit records, then one from the checkpoint that
// recovery wrote. Prints the figures (no timing is asserted).
TEST_F(TierCoreRecoveryTest, RecoveryTimeForManyPages) {
  const char* env = getenv("KVTIER_RECOVERY_PAGES");
  const uint32_t pages = env != nullptr ? std::atoi(env) : 262144;
  constexpr uint32_t kPerCommit = 4096;
  uint64_t ns = Attach("big", false, pages);
  const absl::Time t0 = absl::Now();
  for (uint32_t chain = 0; chain < pages / kPerCommit; ++chain) {
    Put(ns, chain, kPerCommit);
    if (HasFatalFailure()) return;
  }
  const double commit_s = absl::ToDoubleSeconds(absl::Now() - t0);
  const uint64_t log_bytes =
      std::filesystem::file_size(JournalPath(options_.state_dir, "big"));
  TierCore::RecoveryReport from_log = Restart();
  EXPECT_EQ(from_log.pages, pages);
  TierCore::RecoveryReport from_checkpoint = Restart();
  EXPECT_EQ(from_checkpoint.pages, pages);
  ns = Attach("big", false, pages);
  EXPECT_EQ(Lookup(ns, Packed(7, kPerCommit)).matched_pages(), kPerCommit);
  std::printf(
      "%u pages: committed in %.3f s (%.0f pages/s, journal %.1f MiB); "
      "recovered from the log in %.3f s, from a checkpoint (%.1f MiB) in "
      "%.3f s\n",
      pages, commit_s, pages / commit_s, log_bytes / 1048576.0,
      absl::ToDoubleSeconds(from_log.elapsed),
      from_checkpoint.journal_bytes / 1048576.0,
      absl::ToDoubleSeconds(from_checkpoint.elapsed));
}

}  // namespace
}  // namespace kvtier::daemon
