// Tests of JournalContents::outstanding_page_rows: which reserved rows a
// replay reports as possibly still being written (journal_reservations.h),
// across checkpoints, aborts, re-reservations and fully deduplicated commits,
// and under random traffic.
#include <algorithm>
#include <random>
#include <set>
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

using testing::Chain;
using testing::Journaled;
using testing::JournalTest;
using testing::Key;
using testing::MakeIndex;
using testing::MustRead;
using testing::Shape;
using testing::Sorted;

// ---------------------------------------------- outstanding reservations --

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

}  // namespace
}  // namespace kvtier::daemon
