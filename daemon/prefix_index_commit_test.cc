// Tests of PrefixIndex commits and what reads or removes them: deduplication,
// validation that leaves the index unchanged, the ForEachNode walk (rebuilt
// into a copy as a journal checkpoint does), DropSubtree and ListPrefixes.
//
// Thread-safety: single-threaded tests.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "daemon/prefix_index.h"
#include "daemon/prefix_index_test_util.h"
#include "gtest/gtest.h"

namespace kvtier::daemon::index_testing {
namespace {

TEST(PrefixIndexTest, DedupOnCommit) {
  auto index = Make(Config(32, 8));
  const auto a = Chain(1, 10);
  Put(*index, 0, nullptr, std::vector<HashKey>(a.begin(), a.begin() + 6), {5});
  const auto first = RowsOf(*index, a);
  ASSERT_EQ(first.size(), 6u);
  const uint64_t free_before = index->GetUsage().free_page_rows[0];

  // The same pages again, then four more; the snapshot again too.
  auto rows = index->AllocatePageRows(0, 10);
  auto snap = index->AllocateSnapshotRows(0, 1);
  ASSERT_TRUE(rows.ok() && snap.ok());
  auto c = index->Commit(0, nullptr, a, *rows, {{(*snap)[0], a[5]}});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->committed_pages, 4u);
  EXPECT_EQ(c->deduplicated_pages, 6u);
  EXPECT_EQ(c->committed_snapshots, 0u);
  EXPECT_EQ(c->deduplicated_snapshots, 1u);
  EXPECT_EQ(c->freed_page_rows,
            std::vector<uint32_t>(rows->begin(), rows->begin() + 6));
  EXPECT_EQ(c->freed_snapshot_rows, *snap);
  PrefixIndex::Usage u = index->GetUsage();
  EXPECT_EQ(u.free_page_rows[0], free_before - 4);
  EXPECT_EQ(u.allocated_page_rows[0], 0u);
  EXPECT_EQ(u.allocated_snapshot_rows[0], 0u);
  EXPECT_EQ(u.nodes, 10u);
  const auto after = RowsOf(*index, a);
  EXPECT_EQ(std::vector<uint32_t>(after.begin(), after.begin() + 6), first);
  EXPECT_TRUE(index->CheckInvariants().ok());
}

TEST(PrefixIndexTest, CommitRejectsBadInputUnchanged) {
  auto index = Make(Config(32, 4, 2));
  const auto a = Chain(1, 4);
  const auto b = Chain(2, 4);
  Put(*index, 0, nullptr, a);  // Rank 0 rows 0..3 (the lowest go first).
  const uint32_t committed_row = 0;
  auto rows0 = index->AllocatePageRows(0, 2);
  auto rows1 = index->AllocatePageRows(1, 2);
  auto snap0 = index->AllocateSnapshotRows(0, 2);
  ASSERT_TRUE(rows0.ok() && rows1.ok() && snap0.ok());
  const std::vector<uint32_t> good = *rows0;
  ASSERT_EQ(*rows0, (std::vector<uint32_t>{4, 5}));
  const std::string before = Describe(index->GetUsage());

  auto expect_rejected = [&](absl::StatusOr<CommitResult> r,
                             absl::StatusCode code, const std::string& field) {
    EXPECT_EQ(r.status().code(), code) << r.status();
    EXPECT_NE(r.status().message().find(field), std::string::npos)
        << r.status();
    EXPECT_EQ(Describe(index->GetUsage()), before);
    EXPECT_TRUE(index->CheckInvariants().ok()) << index->CheckInvariants();
  };
  const HashKey missing = Key(7, 7);
  // Missing parent.
  expect_rejected(index->Commit(0, &missing, {b[0], b[1]}, good, {}),
                  absl::StatusCode::kFailedPrecondition, "parent");
  // Parent without this rank's row.
  expect_rejected(index->Commit(1, &a[3], {b[0], b[1]}, *rows1, {}),
                  absl::StatusCode::kFailedPrecondition, "rank 1");
  // Wrong parent: a[1] exists under a[0], not under b's root.
  expect_rejected(index->Commit(0, nullptr, {a[1], b[1]}, good, {}),
                  absl::StatusCode::kFailedPrecondition, "hashes[0]");
  expect_rejected(index->Commit(0, &a[3], {a[1], b[1]}, good, {}),
                  absl::StatusCode::kFailedPrecondition, "hashes[0]");
  // An existing hash below a new one.
  expect_rejected(index->Commit(0, nullptr, {b[0], a[0]}, good, {}),
                  absl::StatusCode::kFailedPrecondition, "hashes[1]");
  // Row count.
  expect_rejected(index->Commit(0, nullptr, {b[0], b[1], b[2]}, good, {}),
                  absl::StatusCode::kInvalidArgument, "rows");
  // Out of range.
  expect_rejected(index->Commit(0, nullptr, {b[0], b[1]}, {good[0], 32}, {}),
                  absl::StatusCode::kInvalidArgument, "rows[1]");
  // Free (not allocated) and committed rows.
  const uint32_t free_row = 31;
  expect_rejected(
      index->Commit(0, nullptr, {b[0], b[1]}, {good[0], free_row}, {}),
      absl::StatusCode::kInvalidArgument, "rows[1]");
  expect_rejected(
      index->Commit(0, nullptr, {b[0], b[1]}, {committed_row, good[1]}, {}),
      absl::StatusCode::kInvalidArgument, "rows[0]");
  // Duplicate in the list.
  expect_rejected(
      index->Commit(0, nullptr, {b[0], b[1]}, {good[0], good[0]}, {}),
      absl::StatusCode::kInvalidArgument, "rows[1]");
  // Duplicate hash.
  expect_rejected(index->Commit(0, nullptr, {b[0], b[0]}, good, {}),
                  absl::StatusCode::kInvalidArgument, "hashes[1]");
  // Wrong rank: rows 8 and 9 are allocated on rank 1, free on rank 0.
  {
    auto extra1 = index->AllocatePageRows(1, 8);
    ASSERT_TRUE(extra1.ok());
    ASSERT_EQ((*extra1)[6], 8u);
    const std::string before_extra = Describe(index->GetUsage());
    auto r = index->Commit(0, nullptr, {b[0], b[1]},
                           {(*extra1)[6], (*extra1)[7]}, {});
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument)
        << r.status();
    EXPECT_EQ(Describe(index->GetUsage()), before_extra);
    ASSERT_TRUE(index->FreePageRows(1, *extra1).ok());
    EXPECT_EQ(Describe(index->GetUsage()), before);
  }
  // Bad rank.
  expect_rejected(index->Commit(2, nullptr, {b[0], b[1]}, good, {}),
                  absl::StatusCode::kInvalidArgument, "rank");
  // Snapshots: unknown hash, hash without this rank's page, bad rows.
  expect_rejected(
      index->Commit(0, nullptr, {b[0], b[1]}, good, {{(*snap0)[0], missing}}),
      absl::StatusCode::kFailedPrecondition, "snapshots[0].hash");
  auto snap1 = index->AllocateSnapshotRows(1, 1);
  ASSERT_TRUE(snap1.ok());
  {
    const std::string before_snap = Describe(index->GetUsage());
    auto r = index->Commit(1, nullptr, {}, {}, {{(*snap1)[0], a[0]}});
    EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(Describe(index->GetUsage()), before_snap);
    ASSERT_TRUE(index->FreeSnapshotRows(1, *snap1).ok());
  }
  expect_rejected(index->Commit(0, nullptr, {b[0], b[1]}, good, {{3, b[1]}}),
                  absl::StatusCode::kInvalidArgument, "snapshots[0].row");
  expect_rejected(index->Commit(0, nullptr, {b[0], b[1]}, good, {{9, b[1]}}),
                  absl::StatusCode::kInvalidArgument, "snapshots[0].row");
  expect_rejected(index->Commit(0, nullptr, {b[0], b[1]}, good,
                                {{(*snap0)[0], b[1]}, {(*snap0)[0], b[0]}}),
                  absl::StatusCode::kInvalidArgument, "snapshots[1].row");
  expect_rejected(index->Commit(0, nullptr, {b[0], b[1]}, good,
                                {{(*snap0)[0], b[1]}, {(*snap0)[1], b[1]}}),
                  absl::StatusCode::kInvalidArgument, "snapshots[1].hash");

  // The lookups still see exactly a.
  EXPECT_EQ(index->Lookup(a, 0).matched_pages, 0u);  // Rank 1 missing.
  EXPECT_EQ(RowsOf(*index, b).size(), 0u);
  // And the good commit still works.
  auto ok =
      index->Commit(0, nullptr, {b[0], b[1]}, good, {{(*snap0)[0], b[1]}});
  EXPECT_TRUE(ok.ok()) << ok.status();
  EXPECT_TRUE(index->CheckInvariants().ok());
}

TEST(PrefixIndexTest, ForEachNodeVisitsParentsFirstAndRebuildsTheIndex) {
  auto index = Make(Config(64, 8, 2));
  const auto a = Chain(1, 5);
  const auto b = Chain(2, 3);  // Branches off a[1].
  Put(*index, 0, nullptr, a, {2});
  Put(*index, 1, nullptr, std::vector<HashKey>(a.begin(), a.begin() + 3));
  Put(*index, 0, &a[1], b, {0});
  Put(*index, 0, nullptr, Chain(3, 2));

  struct Seen {
    HashKey key;
    uint32_t parent;
    std::vector<uint32_t> page_rows, snapshot_rows;
  };
  absl::flat_hash_map<uint32_t, size_t> position;
  std::vector<Seen> seen;
  index->ForEachNode([&](const PrefixIndex::NodeView& v) {
    if (v.parent != kNoNode) {
      EXPECT_TRUE(position.contains(v.parent)) << "child before parent";
    }
    position[v.id] = seen.size();
    seen.push_back(
        {*v.key, v.parent,
         std::vector<uint32_t>(v.page_rows.begin(), v.page_rows.end()),
         std::vector<uint32_t>(v.snapshot_rows.begin(),
                               v.snapshot_rows.end())});
  });
  ASSERT_EQ(seen.size(), 10u);

  // What a journal checkpoint does: claim every row, commit node by node.
  auto copy = Make(Config(64, 8, 2));
  for (uint32_t rank = 0; rank < 2; ++rank) {
    std::vector<uint32_t> pages, snaps;
    for (const Seen& s : seen) {
      if (s.page_rows[rank] != kNoRow) pages.push_back(s.page_rows[rank]);
      if (s.snapshot_rows[rank] != kNoRow)
        snaps.push_back(s.snapshot_rows[rank]);
    }
    ASSERT_TRUE(copy->ClaimPageRows(rank, pages).ok());
    ASSERT_TRUE(copy->ClaimSnapshotRows(rank, snaps).ok());
    for (const Seen& s : seen) {
      if (s.page_rows[rank] == kNoRow) continue;
      const HashKey* parent =
          s.parent == kNoNode ? nullptr : &seen[position[s.parent]].key;
      std::vector<PrefixIndex::SnapshotPlacement> placements;
      if (s.snapshot_rows[rank] != kNoRow) {
        placements.push_back({s.snapshot_rows[rank], s.key});
      }
      ASSERT_TRUE(
          copy->Commit(rank, parent, {s.key}, {s.page_rows[rank]}, placements)
              .ok());
    }
  }
  ASSERT_TRUE(copy->CheckInvariants().ok()) << copy->CheckInvariants();
  for (const auto& chain : {a, Concat({a[0], a[1]}, b), Chain(3, 2)}) {
    for (uint32_t rank = 0; rank < 2; ++rank) {
      LookupResult x = index->Lookup(chain, rank);
      LookupResult y = copy->Lookup(chain, rank);
      EXPECT_EQ(x.matched_pages, y.matched_pages);
      EXPECT_EQ(x.usable_pages, y.usable_pages);
      EXPECT_EQ(x.rows, y.rows);
      EXPECT_EQ(x.snapshot_row, y.snapshot_row);
    }
  }
  EXPECT_EQ(Describe(index->GetUsage()), Describe(copy->GetUsage()));
}

TEST(PrefixIndexTest, DropSubtree) {
  auto index = Make(Config(32, 8));
  const auto trunk = Chain(1, 3);
  const auto left = Concat(trunk, Chain(2, 3, 3));
  const auto right = Concat(trunk, Chain(3, 2, 3));
  Put(*index, 0, nullptr, left, {4});
  Put(*index, 0, nullptr, right, {1});
  ASSERT_EQ(index->GetUsage().nodes, 8u);

  EXPECT_EQ(index->DropSubtree(Key(9, 9)).status().code(),
            absl::StatusCode::kNotFound);
  // Pinned inside: refused, unchanged.
  const uint32_t pin = index->Lookup(left, 0).pin_node;
  index->Pin(pin);
  const std::string before = Describe(index->GetUsage());
  EXPECT_EQ(index->DropSubtree(left[3]).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Describe(index->GetUsage()), before);
  ASSERT_TRUE(index->Unpin(pin).ok());

  auto d = index->DropSubtree(left[3]);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->pages, 3u);
  EXPECT_EQ(d->snapshots, 1u);
  PrefixIndex::Usage u = index->GetUsage();
  EXPECT_EQ(u.nodes, 5u);
  EXPECT_EQ(u.leaves, 1u);
  EXPECT_EQ(u.snapshots, 1u);
  EXPECT_EQ(u.free_page_rows[0], 32u - 5u);
  EXPECT_EQ(u.evicted_pages, 0u);  // A drop is not an eviction.
  EXPECT_EQ(index->Lookup(left, 0).matched_pages, 3u);
  EXPECT_EQ(index->Lookup(right, 0).matched_pages, 5u);
  EXPECT_TRUE(index->CheckInvariants().ok());

  // Dropping the root takes the rest; the trunk's last page re-became a leaf
  // on the way.
  d = index->DropSubtree(trunk[0]);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->pages, 5u);
  u = index->GetUsage();
  EXPECT_EQ(u.nodes, 0u);
  EXPECT_EQ(u.leaves, 0u);
  EXPECT_EQ(u.free_page_rows[0], 32u);
  EXPECT_EQ(u.free_snapshot_rows[0], 8u);
  EXPECT_TRUE(index->CheckInvariants().ok());
}

TEST(PrefixIndexTest, ListPrefixes) {
  auto index = Make(Config(64, 8));
  const auto trunk = Chain(1, 2);
  const auto left = Concat(trunk, Chain(2, 5, 2));
  const auto right = Concat(trunk, Chain(3, 1, 2));
  const auto other = Chain(4, 3);
  Put(*index, 0, nullptr, left, {1, 4});
  Put(*index, 0, nullptr, right, {2});
  Put(*index, 0, nullptr, other);
  const uint32_t pin = index->Lookup(right, 0).pin_node;  // Now most recent.
  index->Pin(pin);

  uint64_t total = 0;
  auto recent = index->ListPrefixes(true, 10, &total);
  EXPECT_EQ(total, 3u);
  ASSERT_EQ(recent.size(), 3u);
  EXPECT_EQ(recent[0].leaf.bytes, right.back().bytes);
  EXPECT_EQ(recent[0].pins, 1u);
  EXPECT_EQ(recent[0].pages, 3u);
  EXPECT_EQ(recent[0].snapshots, 2u);  // Page 2 (shared) and page 3.
  EXPECT_EQ(recent[1].leaf.bytes, other.back().bytes);
  EXPECT_EQ(recent[2].leaf.bytes, left.back().bytes);
  EXPECT_EQ(recent[2].snapshots, 2u);
  EXPECT_GE(recent[0].last_use_tick, recent[1].last_use_tick);
  EXPECT_GT(recent[0].last_use_unix_ms, 0);

  auto largest = index->ListPrefixes(false, 2, &total);
  ASSERT_EQ(largest.size(), 2u);
  EXPECT_EQ(largest[0].pages, 7u);
  EXPECT_EQ(largest[1].pages, 3u);
  EXPECT_EQ(index->ListPrefixes(true, 0, nullptr).size(), 0u);
  ASSERT_TRUE(index->Unpin(pin).ok());
}

}  // namespace
}  // namespace kvtier::daemon::index_testing
