// Tests of RowPool: allocation order, all-or-nothing Free and Claim, the
// single-row moves and Check against a table of holders.
//
// Thread-safety: single-threaded tests.
#include "daemon/row_pool.h"

#include <cstdint>
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
  // Freed rows go back on top, the last listed first.
  EXPECT_EQ(pool.Take(0, 2), (std::vector<uint32_t>{0, 1}));
  EXPECT_TRUE(pool.Check(NoHolders(pool), "page").ok());
}

TEST(RowPoolTest, ClaimValidatesAndKeepsTheFreeOrder) {
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
  EXPECT_EQ(pool.Take(0, 3), (std::vector<uint32_t>{2, 3, 5}));
  EXPECT_TRUE(pool.Check(NoHolders(pool), "page").ok());
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
