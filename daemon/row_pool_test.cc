// Tests of RowPool: allocation order and runs, all-or-nothing Free and
// Claim, the single-row moves, Check against a table of holders, and a
// random walk of every operation against Check.
//
// Thread-safety: single-threaded tests.
#include "daemon/row_pool.h"

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "daemon/prefix_index_types.h"
#include "gtest/gtest.h"

namespace kvtier::daemon {
namespace {

// Holders for a pool with nothing committed.
std::vector<uint32_t> NoHolders(const RowPool& pool) {
  return std::vector<uint32_t>(pool.slots(), kNoNode);
}

// Every count of every rank, for "nothing changed" checks.
std::string Counts(const RowPool& pool, uint32_t ranks) {
  std::string out;
  for (uint32_t r = 0; r < ranks; ++r) {
    out += std::to_string(pool.free_rows(r)) + "/" +
           std::to_string(pool.allocated_rows(r)) + "/" +
           std::to_string(pool.committed_rows(r)) + " ";
    for (uint32_t row = 0; row < pool.rows_per_rank(); ++row) {
      out += std::to_string(pool.state(r, row));
    }
    out += ";";
  }
  return out;
}

TEST(RowPoolTest, TakeHandsOutLowRowsFirstPerRank) {
  RowPool pool;
  pool.Reset(2, 4);
  EXPECT_EQ(pool.rows_per_rank(), 4u);
  EXPECT_EQ(pool.slots(), 8u);
  EXPECT_EQ(pool.Take(0, 3), (std::vector<uint32_t>{0, 1, 2}));
  EXPECT_EQ(pool.free_rows(0), 1u);
  EXPECT_EQ(pool.allocated_rows(0), 3u);
  EXPECT_EQ(pool.state(0, 2), RowPool::kAllocated);
  EXPECT_EQ(pool.state(0, 3), RowPool::kFree);
  EXPECT_EQ(pool.free_rows(1), 4u);  // The other rank is untouched.
  EXPECT_EQ(pool.Take(1, 1), (std::vector<uint32_t>{0}));
  EXPECT_TRUE(pool.Check(NoHolders(pool), "page").ok());
  // Reset forgets everything.
  pool.Reset(2, 4);
  EXPECT_EQ(pool.free_rows(0), 4u);
  EXPECT_EQ(pool.allocated_rows(0), 0u);
  EXPECT_EQ(pool.Take(0, 1), (std::vector<uint32_t>{0}));
}

TEST(RowPoolTest, FreeValidatesAllOrNothing) {
  RowPool pool;
  pool.Reset(1, 8);
  const std::vector<uint32_t> rows = pool.Take(0, 3);  // 0, 1, 2.
  const std::string before = Counts(pool, 1);
  absl::Status range = pool.Free(0, {rows[0], 8}, "page");
  EXPECT_EQ(range.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(range.message().find("rows[1]: page row 8 is out of range"),
            std::string::npos)
      << range;
  absl::Status free_row = pool.Free(0, {rows[0], 5}, "snapshot");
  EXPECT_NE(free_row.message().find(
                "snapshot row 5 of rank 0 is free, not allocated-uncommitted"),
            std::string::npos)
      << free_row;
  absl::Status dup = pool.Free(0, {rows[0], rows[1], rows[0]}, "page");
  EXPECT_NE(dup.message().find("rows[2]: page row 0 is listed twice"),
            std::string::npos)
      << dup;
  EXPECT_EQ(Counts(pool, 1), before);
  ASSERT_TRUE(pool.Free(0, {rows[1], rows[0]}, "page").ok());
  EXPECT_EQ(pool.free_rows(0), 7u);
  EXPECT_EQ(pool.allocated_rows(0), 1u);
  // Freed rows join a run again: rows 0-1 (row 2 is still out) fit a
  // request of 2 exactly, ahead of the longer run 3-7.
  EXPECT_EQ(pool.free_runs(0), 2u);
  EXPECT_EQ(pool.Take(0, 2), (std::vector<uint32_t>{0, 1}));
  EXPECT_TRUE(pool.Check(NoHolders(pool), "page").ok());
}

TEST(RowPoolTest, ClaimValidatesAndSplitsRuns) {
  RowPool pool;
  pool.Reset(1, 6);
  pool.Take(0, 1);  // Row 0.
  const std::string before = Counts(pool, 1);
  absl::Status busy = pool.Claim(0, {3, 0}, "page");
  EXPECT_NE(busy.message().find("rows[1]: page row 0 of rank 0 is "
                                "allocated-uncommitted, not free"),
            std::string::npos)
      << busy;
  absl::Status dup = pool.Claim(0, {4, 4}, "page");
  EXPECT_NE(dup.message().find("rows[1]: page row 4 is listed twice"),
            std::string::npos)
      << dup;
  EXPECT_EQ(pool.Claim(0, {6}, "page").code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Counts(pool, 1), before);
  ASSERT_TRUE(pool.Claim(0, {4, 1}, "page").ok());
  EXPECT_EQ(pool.allocated_rows(0), 3u);
  EXPECT_EQ(pool.free_runs(0), 2u);  // 2-3 and 5.
  // No run holds 3: the longest first, then the rest.
  EXPECT_EQ(pool.Take(0, 3), (std::vector<uint32_t>{2, 3, 5}));
  EXPECT_TRUE(pool.Check(NoHolders(pool), "page").ok());
}

// Frees `rows` (allocated) of rank 0 and expects success.
void FreeRows(RowPool& pool, std::vector<uint32_t> rows) {
  ASSERT_TRUE(pool.Free(0, rows, "page").ok());
}

TEST(RowPoolTest, TakeUsesTheSmallestRunThatFitsElseTheLongest) {
  RowPool pool;
  pool.Reset(1, 16);
  pool.Take(0, 16);
  FreeRows(pool, {0, 1, 2});         // Run of 3 at 0.
  FreeRows(pool, {9, 7, 5, 8, 6});   // Run of 5 at 5, freed out of order.
  FreeRows(pool, {12, 13, 14, 15});  // Run of 4 at 12.
  EXPECT_EQ(pool.free_runs(0), 3u);
  EXPECT_TRUE(pool.Check(NoHolders(pool), "page").ok());
  // 4 fits the run of 4 exactly, not the lower run of 5.
  EXPECT_EQ(pool.Take(0, 4), (std::vector<uint32_t>{12, 13, 14, 15}));
  // 2 fits the run of 3 best; its last row stays free.
  EXPECT_EQ(pool.Take(0, 2), (std::vector<uint32_t>{0, 1}));
  // Nothing holds 6: the run of 5, then the smallest run that holds 1.
  EXPECT_EQ(pool.Take(0, 6), (std::vector<uint32_t>{5, 6, 7, 8, 9, 2}));
  EXPECT_EQ(pool.free_rows(0), 0u);
  EXPECT_EQ(pool.free_runs(0), 0u);
  EXPECT_TRUE(pool.Check(NoHolders(pool), "page").ok());
}

TEST(RowPoolTest, ReturnedRowsJoinTheirNeighbours) {
  RowPool pool;
  pool.Reset(1, 10);
  const std::vector<uint32_t> rows = pool.Take(0, 10);
  for (uint32_t row : rows) pool.CommitRow(0, row);
  // Released one at a time, deepest first, as eviction frees a chain.
  for (uint32_t row : {6u, 5u, 4u, 8u, 2u, 3u, 7u}) {
    pool.ReleaseCommitted(0, row);
  }
  EXPECT_EQ(pool.free_runs(0), 1u);  // 2-8.
  EXPECT_EQ(pool.RowsInState(0, RowPool::kFree),
            (std::vector<uint32_t>{2, 3, 4, 5, 6, 7, 8}));
  EXPECT_EQ(pool.Take(0, 7), (std::vector<uint32_t>{2, 3, 4, 5, 6, 7, 8}));
  pool.ReturnAllocated(0, 5);
  pool.ReturnAllocated(0, 3);
  pool.ReturnAllocated(0, 4);
  EXPECT_EQ(pool.free_runs(0), 1u);  // 3-5.
  EXPECT_EQ(pool.Take(0, 3), (std::vector<uint32_t>{3, 4, 5}));
}

// Every operation at random against a model of the states; Check after
// each, and a Take that a run could hold whole comes back as one run.
TEST(RowPoolTest, RandomWalkKeepsEveryInvariant) {
  constexpr uint32_t kRanks = 2;
  constexpr uint32_t kRows = 97;
  RowPool pool;
  pool.Reset(kRanks, kRows);
  std::vector<uint32_t> holders = NoHolders(pool);
  std::mt19937 rng(7);
  auto below = [&rng](uint32_t n) {
    return std::uniform_int_distribution<uint32_t>(0, n - 1)(rng);
  };
  for (int step = 0; step < 4000; ++step) {
    const uint32_t rank = below(kRanks);
    std::vector<uint32_t> allocated =
        pool.RowsInState(rank, RowPool::kAllocated);
    std::vector<uint32_t> committed =
        pool.RowsInState(rank, RowPool::kCommitted);
    std::vector<uint32_t> free = pool.RowsInState(rank, RowPool::kFree);
    std::shuffle(allocated.begin(), allocated.end(), rng);
    std::shuffle(committed.begin(), committed.end(), rng);
    std::shuffle(free.begin(), free.end(), rng);
    switch (below(6)) {
      case 0: {  // Take.
        if (free.empty()) break;
        const uint32_t n = 1 + below(std::min<uint32_t>(free.size(), 12));
        uint32_t run = 0;  // Is there a run of >= n?
        bool fits = false;
        for (uint32_t row = 0; row < kRows; ++row) {
          run = pool.state(rank, row) == RowPool::kFree ? run + 1 : 0;
          fits = fits || run >= n;
        }
        const std::vector<uint32_t> got = pool.Take(rank, n);
        ASSERT_EQ(got.size(), n);
        for (uint32_t row : got) {
          EXPECT_EQ(pool.state(rank, row), RowPool::kAllocated);
        }
        if (fits) {
          for (uint32_t i = 1; i < n; ++i) EXPECT_EQ(got[i], got[0] + i);
        }
        break;
      }
      case 1: {  // Free some allocated rows.
        const size_t k = allocated.empty() ? 0 : 1 + below(allocated.size());
        ASSERT_TRUE(pool.Free(rank, {allocated.data(), k}, "page").ok());
        break;
      }
      case 2:  // Commit one.
        if (allocated.empty()) break;
        pool.CommitRow(rank, allocated[0]);
        holders[pool.Slot(rank, allocated[0])] = 1;
        break;
      case 3:  // Release one committed, or give one allocated back.
        if (!committed.empty()) {
          pool.ReleaseCommitted(rank, committed[0]);
          holders[pool.Slot(rank, committed[0])] = kNoNode;
        } else if (!allocated.empty()) {
          pool.ReturnAllocated(rank, allocated[0]);
        }
        break;
      case 4: {  // Claim some free rows.
        const size_t k =
            free.empty() ? 0 : 1 + below(std::min<size_t>(free.size(), 5));
        ASSERT_TRUE(pool.Claim(rank, {free.data(), k}, "page").ok());
        break;
      }
      case 5: {  // A refused Claim changes nothing.
        if (allocated.empty() || free.empty()) break;
        const std::string before = Counts(pool, kRanks);
        EXPECT_FALSE(pool.Claim(rank, {free[0], allocated[0]}, "page").ok());
        EXPECT_EQ(Counts(pool, kRanks), before);
        break;
      }
    }
    absl::Status s = pool.Check(holders, "page");
    ASSERT_TRUE(s.ok()) << "step " << step << ": " << s;
  }
}

TEST(RowPoolTest, RowMovesAndCheckAgainstHolders) {
  RowPool pool;
  pool.Reset(2, 3);
  const uint32_t a = pool.Take(1, 1)[0];
  const uint32_t b = pool.Take(1, 1)[0];
  pool.CommitRow(1, a);
  EXPECT_EQ(pool.committed_rows(1), 1u);
  EXPECT_EQ(pool.allocated_rows(1), 1u);
  std::vector<uint32_t> holders = NoHolders(pool);
  // A committed row nobody holds, and a held row that is not committed.
  absl::Status unheld = pool.Check(holders, "page");
  EXPECT_EQ(unheld.code(), absl::StatusCode::kInternal);
  EXPECT_NE(unheld.message().find("committed but held by no node"),
            std::string::npos)
      << unheld;
  holders[pool.Slot(1, a)] = 7;
  EXPECT_TRUE(pool.Check(holders, "page").ok());
  holders[pool.Slot(1, b)] = 8;
  EXPECT_NE(pool.Check(holders, "page")
                .message()
                .find("allocated-uncommitted but held by a node"),
            std::string::npos);
  holders[pool.Slot(1, b)] = kNoNode;

  EXPECT_EQ(pool.RowsInState(1, RowPool::kAllocated),
            (std::vector<uint32_t>{b}));
  EXPECT_EQ(pool.RowsInState(1, RowPool::kCommitted),
            (std::vector<uint32_t>{a}));
  EXPECT_EQ(pool.RowsInState(1, RowPool::kFree), (std::vector<uint32_t>{2}));
  EXPECT_TRUE(pool.RowsInState(2, RowPool::kFree).empty());  // No rank 2.

  pool.ReturnAllocated(1, b);
  pool.ReleaseCommitted(1, a);
  holders[pool.Slot(1, a)] = kNoNode;
  EXPECT_EQ(pool.free_rows(1), 3u);
  EXPECT_EQ(pool.allocated_rows(1), 0u);
  EXPECT_EQ(pool.committed_rows(1), 0u);
  EXPECT_TRUE(pool.Check(holders, "page").ok());
}

TEST(RowPoolTest, EmptyBank) {
  RowPool pool;
  pool.Reset(2, 0);
  EXPECT_EQ(pool.slots(), 0u);
  EXPECT_EQ(pool.free_rows(1), 0u);
  EXPECT_TRUE(pool.RowsInState(0, RowPool::kFree).empty());
  EXPECT_TRUE(pool.Free(0, {}, "snapshot").ok());
  EXPECT_EQ(pool.Claim(0, {0}, "snapshot").code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(pool.Check({}, "snapshot").ok());
}

TEST(RowPoolTest, StateNames) {
  EXPECT_STREQ(RowPool::StateName(RowPool::kFree), "free");
  EXPECT_STREQ(RowPool::StateName(RowPool::kAllocated),
               "allocated-uncommitted");
  EXPECT_STREQ(RowPool::StateName(RowPool::kCommitted), "committed");
  EXPECT_STREQ(RowPool::StateName(7), "corrupt");
}

}  // namespace
}  // namespace kvtier::daemon
