// Unit tests of DeviceTiers (tier_device.h): which pools serve which
// namespaces, the checks Reserve makes, and that slots are reserved all or
// nothing, committed, aborted, looked up and released in the pool named.
// CPU only: a DeviceSnapshotTier is bookkeeping, no device memory.
#include "daemon/tier_device.h"

#include <set>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvtier::daemon {
namespace {

using ::testing::HasSubstr;

DevicePoolExport Pool(uint64_t rows, uint64_t row_bytes) {
  DevicePoolExport e;
  e.rows = rows;
  e.row_bytes = row_bytes;
  e.row_stride = row_bytes;
  return e;
}

HashKey Hash(uint8_t b) {
  HashKey h;
  h.bytes.fill(0);
  h.bytes[0] = b;
  return h;
}

TEST(DeviceTiers, ServesEveryNamespaceWithoutPatterns) {
  DeviceTiers d({Pool(4, 64), Pool(4, 64)}, {});
  EXPECT_EQ(d.size(), 2u);
  EXPECT_TRUE(d.Serves(0, "a"));
  EXPECT_TRUE(d.Serves(1, "b"));
  EXPECT_FALSE(d.Serves(2, "a"));  // No such pool.
}

TEST(DeviceTiers, ServesOnlyMatchingNamespaces) {
  DeviceTiers d({Pool(4, 64)}, {"exact", "team_*"});
  EXPECT_TRUE(d.Serves(0, "exact"));
  EXPECT_TRUE(d.Serves(0, "team_a"));
  EXPECT_FALSE(d.Serves(0, "exactly"));
  EXPECT_FALSE(d.Serves(0, "other"));
}

TEST(DeviceTiers, KeysSeparateNamespacesRanksAndHashes) {
  const std::string k = DeviceTiers::Key(1, 0, Hash(7), 16);
  EXPECT_EQ(k.size(), sizeof(uint64_t) + sizeof(uint32_t) + 16);
  std::set<std::string> keys = {k, DeviceTiers::Key(2, 0, Hash(7), 16),
                                DeviceTiers::Key(1, 1, Hash(7), 16),
                                DeviceTiers::Key(1, 0, Hash(8), 16)};
  EXPECT_EQ(keys.size(), 4u);
  EXPECT_EQ(DeviceTiers::Key(1, 0, Hash(7), 16), k);
}

TEST(DeviceTiers, CheckReserveNamesTheField) {
  DeviceTiers d({Pool(4, 64)}, {"served"});
  // No slots asked: nothing is checked, whatever the pool.
  EXPECT_TRUE(d.CheckReserve(9, 0, "other", 0).ok());
  absl::Status s = d.CheckReserve(1, 1, "served", 64);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("device_pool: 1"));
  s = d.CheckReserve(0, 1, "other", 64);
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(s.message(), HasSubstr("does not serve namespace 'other'"));
  s = d.CheckReserve(0, 1, "served", 0);  // The namespace has no snapshots.
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("device_snapshots"));
  s = d.CheckReserve(0, 1, "served", 65);  // Too big for a slot.
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("do not fit"));
  s = d.CheckReserve(0, 5, "served", 64);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("exceeds the device pool's 4 slots"));
  EXPECT_TRUE(d.CheckReserve(0, 4, "served", 64).ok());
}

TEST(DeviceTiers, ReserveIsAllOrNothing) {
  DeviceTiers d({Pool(2, 64)}, {});
  auto none = d.Reserve(0, 0);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
  auto too_many = d.Reserve(0, 3);
  EXPECT_EQ(too_many.status().code(), absl::StatusCode::kResourceExhausted);
  // The two it got before the refusal went back.
  auto both = d.Reserve(0, 2);
  ASSERT_TRUE(both.ok());
  EXPECT_EQ(both->size(), 2u);
  EXPECT_FALSE(d.Reserve(0, 1).ok());
  d.Abort(0, *both);
  EXPECT_TRUE(d.Reserve(0, 2).ok());
}

TEST(DeviceTiers, CommitPlacesSomeAndReturnsTheRest) {
  DeviceTiers d({Pool(2, 64)}, {});
  auto rows = d.Reserve(0, 2);
  ASSERT_TRUE(rows.ok());
  const std::string key = DeviceTiers::Key(1, 0, Hash(1), 32);
  d.Commit(0, {{(*rows)[1], key}}, *rows, {false, true});
  auto hit = d.Lookup(0, key, /*pin=*/false);
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(hit->row, (*rows)[1]);
  EXPECT_EQ(hit->lease_id, 0u);
  EXPECT_FALSE(d.Lookup(0, DeviceTiers::Key(1, 0, Hash(2), 32), false));
  // The unplaced slot is free again; the committed one can be evicted for
  // a new reservation while unpinned.
  auto again = d.Reserve(0, 1);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ((*again)[0], (*rows)[0]);
}

TEST(DeviceTiers, PinsKeepASlotUntilReleased) {
  DeviceTiers d({Pool(1, 64)}, {});
  auto rows = d.Reserve(0, 1);
  ASSERT_TRUE(rows.ok());
  const std::string key = DeviceTiers::Key(1, 0, Hash(1), 32);
  d.Commit(0, {{(*rows)[0], key}}, *rows, {true});
  auto hit = d.Lookup(0, key, /*pin=*/true);
  ASSERT_TRUE(hit.has_value());
  ASSERT_NE(hit->lease_id, 0u);
  // Pinned: the only slot cannot be evicted for a new reservation.
  EXPECT_EQ(d.Reserve(0, 1).status().code(),
            absl::StatusCode::kResourceExhausted);
  d.Release(0, hit->lease_id);
  EXPECT_TRUE(d.Reserve(0, 1).ok());
}

TEST(DeviceTiers, NoSlotsTouchNoPool) {
  DeviceTiers d({}, {});
  // A request that names a pool but no slots never indexes the pools.
  d.Abort(3, {});
  d.Release(3, 0);
  d.Commit(3, {}, {}, {});
  auto none = d.Reserve(3, 0);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
}

}  // namespace
}  // namespace kvtier::daemon
