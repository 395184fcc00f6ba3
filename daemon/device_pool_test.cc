// Unit tests of the device-tier index (CPU only) and of DevicePool's
// argument and driver checks, which need no GPU.
#include "daemon/device_pool.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace kvtier::daemon {
namespace {

std::vector<std::string> Chain(int n) {
  std::vector<std::string> v;
  for (int i = 0; i < n; ++i) v.push_back("h" + std::to_string(i));
  return v;
}

TEST(DeviceSnapshotTier, ReservedRowsAreInvisibleUntilCommit) {
  DeviceSnapshotTier t(4);
  auto chain = Chain(8);
  auto r = t.Reserve();
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(t.Lookup(chain, 8, false).has_value());
  ASSERT_TRUE(t.Commit(*r, chain[3]).ok());
  auto hit = t.Lookup(chain, 8, false);
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(hit->page, 3u);
  EXPECT_EQ(hit->row, *r);
  EXPECT_EQ(hit->lease_id, 0u);
}

TEST(DeviceSnapshotTier, LookupReturnsDeepestWithinLimit) {
  DeviceSnapshotTier t(4);
  auto chain = Chain(8);
  for (int p : {1, 5}) {
    auto r = t.Reserve();
    ASSERT_TRUE(r.ok());
    ASSERT_TRUE(t.Commit(*r, chain[p]).ok());
  }
  EXPECT_EQ(t.Lookup(chain, 8, false)->page, 5u);
  // The host tier matched only 4 pages: the device row at 5 is unusable.
  EXPECT_EQ(t.Lookup(chain, 4, false)->page, 1u);
  EXPECT_FALSE(t.Lookup(chain, 1, false).has_value());
}

TEST(DeviceSnapshotTier, EvictsLeastRecentlyUsedUnpinned) {
  DeviceSnapshotTier t(2);
  auto chain = Chain(4);
  uint32_t rows[2];
  for (int i = 0; i < 2; ++i) {
    auto r = t.Reserve();
    ASSERT_TRUE(r.ok());
    rows[i] = *r;
    ASSERT_TRUE(t.Commit(*r, chain[i]).ok());
  }
  // Touch h0 so h1 is the LRU one.
  ASSERT_TRUE(t.Lookup(absl::MakeConstSpan(&chain[0], 1), 1, false));
  auto r = t.Reserve();
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, rows[1]);
  EXPECT_EQ(t.usage().evictions, 1u);
  EXPECT_FALSE(t.Lookup(absl::MakeConstSpan(&chain[1], 1), 1, false));
  ASSERT_TRUE(t.Lookup(absl::MakeConstSpan(&chain[0], 1), 1, false));
}

TEST(DeviceSnapshotTier, PinnedAndReservedRowsAreNeverEvicted) {
  DeviceSnapshotTier t(2);
  auto chain = Chain(2);
  auto a = t.Reserve();
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(t.Commit(*a, chain[0]).ok());
  auto hit = t.Lookup(chain, 1, /*pin=*/true);
  ASSERT_TRUE(hit.has_value());
  ASSERT_NE(hit->lease_id, 0u);
  auto b = t.Reserve();  // Free slot, stays reserved.
  ASSERT_TRUE(b.ok());
  auto c = t.Reserve();
  EXPECT_EQ(c.status().code(), absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(t.Release(hit->lease_id).ok());
  EXPECT_EQ(t.Release(hit->lease_id).code(), absl::StatusCode::kNotFound);
  auto d = t.Reserve();  // Now the unpinned committed row goes.
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(*d, *a);
}

TEST(DeviceSnapshotTier, BadCommitAndAbortChangeNothing) {
  DeviceSnapshotTier t(2);
  EXPECT_EQ(t.Commit(0, "h").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(t.Commit(7, "h").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(t.Abort(0).code(), absl::StatusCode::kInvalidArgument);
  auto r = t.Reserve();
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(t.Commit(*r, "").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(t.usage().reserved, 1u);
  ASSERT_TRUE(t.Abort(*r).ok());
  auto u = t.usage();
  EXPECT_EQ(u.free, 2u);
  EXPECT_EQ(u.reserved, 0u);
}

TEST(DeviceSnapshotTier, RecommitMovesHashAndFreesOldRowAfterRelease) {
  DeviceSnapshotTier t(3);
  auto chain = Chain(1);
  auto a = t.Reserve();
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(t.Commit(*a, chain[0]).ok());
  auto pinned = t.Lookup(chain, 1, true);
  ASSERT_TRUE(pinned.has_value());
  auto b = t.Reserve();
  ASSERT_TRUE(b.ok());
  ASSERT_TRUE(t.Commit(*b, chain[0]).ok());
  EXPECT_EQ(t.Lookup(chain, 1, false)->row, *b);
  EXPECT_EQ(t.usage().free, 1u);  // Old row kept while pinned.
  ASSERT_TRUE(t.Release(pinned->lease_id).ok());
  EXPECT_EQ(t.usage().free, 2u);
}

TEST(DevicePool, ArgumentsAreCheckedBeforeTheDriverLoads) {
  DevicePoolOptions o;
  o.driver_library = "/nonexistent/libcuda.so.1";
  o.bytes_per_gpu = 1 << 20;
  o.row_bytes = 0;
  auto p = DevicePool::Create(o);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(p.status().message().find("device_pool_row_bytes"),
            std::string::npos);
  o.row_bytes = 2 << 20;
  p = DevicePool::Create(o);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(p.status().message().find("device_pool_bytes"), std::string::npos);
  o.row_bytes = 1000;
  o.gpus = {-1};
  p = DevicePool::Create(o);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(p.status().message().find("device_pool_gpus"), std::string::npos);
}

TEST(DevicePool, MissingDriverIsAClearError) {
  DevicePoolOptions o;
  o.driver_library = "/nonexistent/libcuda.so.1";
  o.bytes_per_gpu = 1 << 20;
  o.row_bytes = 1000;
  auto p = DevicePool::Create(o);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(p.status().message().find("CUDA driver"), std::string::npos);
  EXPECT_EQ(DeviceRowStride(1000), 1024u);
  EXPECT_EQ(DeviceRowStride(256), 256u);
}

}  // namespace
}  // namespace kvtier::daemon
