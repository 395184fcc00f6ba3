// Tests of the namespace journal's writer and reader together: records
// round trip through ReadJournal and RestoreIndex, torn tails versus
// corrupt records of written journals, compaction, ListJournals, a failed
// append, and a randomized check that replay keeps every committed page and
// serves no row whose bytes belong to another page.
#include "daemon/journal.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/journal.h"
#include "daemon/journal_test_util.h"
#include "daemon/test_keys.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvtier::daemon {
namespace {

using ::testing::HasSubstr;

using testing::Chain;
using testing::Journaled;
using testing::JournalTest;
using testing::Key;
using testing::MakeIndex;
using testing::Shape;

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

}  // namespace
}  // namespace kvtier::daemon
