// Tests of NodePool: fresh ids across chunk boundaries, LIFO reuse through
// the free list and its check, row arrays, and Clear.
//
// Thread-safety: single-threaded tests.
#include "daemon/node_pool.h"

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "daemon/prefix_index_types.h"
#include "gtest/gtest.h"

namespace kvtier::daemon {
namespace {

// Allocates an id and makes it live, as PrefixIndex::NewNode does.
uint32_t AllocateLive(NodePool& pool) {
  const uint32_t id = pool.Allocate();
  pool.node(id).page_ranks = 1;
  return id;
}

TEST(NodePoolTest, FreshIdsAreSequentialAcrossChunks) {
  constexpr uint32_t kIds = (1u << 14) + 3;  // Into the second chunk.
  NodePool pool(/*ranks=*/2, /*hybrid=*/true);
  EXPECT_EQ(pool.end(), 0u);
  EXPECT_FALSE(pool.IsLive(0));
  for (uint32_t i = 0; i < kIds; ++i) {
    const uint32_t id = AllocateLive(pool);
    ASSERT_EQ(id, i);
    for (uint32_t r = 0; r < 2; ++r) {
      ASSERT_EQ(pool.PageRow(id, r), kNoRow);
      ASSERT_EQ(pool.SnapshotRow(id, r), kNoRow);
    }
  }
  EXPECT_EQ(pool.end(), kIds);
  EXPECT_TRUE(pool.IsLive(kIds - 1));
  EXPECT_FALSE(pool.IsLive(kIds));
  // Rows are per node and per rank, the arrays rank-major within a node.
  pool.PageRow(kIds - 1, 1) = 42;
  pool.SnapshotRow(kIds - 1, 0) = 7;
  EXPECT_EQ(pool.PageRows(kIds - 1)[1], 42u);
  EXPECT_EQ(pool.PageRows(kIds - 1)[0], kNoRow);
  EXPECT_EQ(pool.SnapshotRows(kIds - 1)[0], 7u);
  EXPECT_EQ(pool.PageRow(kIds - 2, 1), kNoRow);
  EXPECT_TRUE(pool.CheckFreeList(kIds).ok());
  EXPECT_GE(pool.MemoryBytes(),
            2 * (1u << 14) * (sizeof(NodePool::Node) + 2 * 2 * 4));
}

TEST(NodePoolTest, ReleasedIdsComeBackLastFirst) {
  NodePool pool(/*ranks=*/1, /*hybrid=*/false);
  const uint32_t a = AllocateLive(pool);
  const uint32_t b = AllocateLive(pool);
  const uint32_t c = AllocateLive(pool);
  pool.node(b).pins = 3;
  pool.node(b).parent = a;
  pool.Release(a);
  pool.Release(b);
  EXPECT_FALSE(pool.IsLive(a));
  EXPECT_FALSE(pool.IsLive(b));
  EXPECT_TRUE(pool.IsLive(c));
  EXPECT_EQ(pool.node(b).pins, 0u);
  EXPECT_EQ(pool.node(b).parent, kNoNode);
  EXPECT_TRUE(pool.CheckFreeList(/*live=*/1).ok());
  absl::Status wrong = pool.CheckFreeList(/*live=*/2);
  EXPECT_EQ(wrong.code(), absl::StatusCode::kInternal);
  EXPECT_NE(wrong.message().find("2 free + 2 live != 3 used ids"),
            std::string::npos)
      << wrong;
  EXPECT_EQ(AllocateLive(pool), b);
  EXPECT_EQ(AllocateLive(pool), a);
  EXPECT_EQ(AllocateLive(pool), 3u);  // The free list is empty: a fresh id.
  EXPECT_EQ(pool.end(), 4u);
  EXPECT_TRUE(pool.CheckFreeList(4).ok());
}

TEST(NodePoolTest, FreeListEntryThatIsLiveIsReported) {
  NodePool pool(/*ranks=*/1, /*hybrid=*/false);
  const uint32_t a = AllocateLive(pool);
  AllocateLive(pool);
  pool.Release(a);
  pool.node(a).page_ranks = 1;  // Live again without Allocate: corrupt.
  absl::Status s = pool.CheckFreeList(2);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_NE(s.message().find("node 0 is live or out of range"),
            std::string::npos)
      << s;
}

TEST(NodePoolTest, NotHybridHasNoSnapshotRows) {
  NodePool pool(/*ranks=*/4, /*hybrid=*/false);
  const uint32_t id = AllocateLive(pool);
  EXPECT_EQ(pool.SnapshotRows(id), nullptr);
  EXPECT_EQ(pool.PageRows(id)[3], kNoRow);
}

TEST(NodePoolTest, ClearReturnsEveryChunk) {
  NodePool pool(/*ranks=*/1, /*hybrid=*/true);
  for (int i = 0; i < 5; ++i) AllocateLive(pool);
  pool.Release(2);
  EXPECT_GT(pool.MemoryBytes(), 0u);
  pool.Clear();
  EXPECT_EQ(pool.end(), 0u);
  EXPECT_EQ(pool.MemoryBytes(), 0u);
  EXPECT_TRUE(pool.CheckFreeList(0).ok());
  EXPECT_EQ(AllocateLive(pool), 0u);  // Fresh again, not the released 2.
  EXPECT_EQ(pool.PageRow(0, 0), kNoRow);
}

}  // namespace
}  // namespace kvtier::daemon
