// Tests of PrefixIndex's hybrid snapshots: the usable match, every rank's
// snapshot under tensor parallelism, the spacing policy's eviction order,
// pinned snapshots, and namespaces without snapshots.
//
// Thread-safety: single-threaded tests.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "daemon/prefix_index.h"
#include "daemon/prefix_index_test_util.h"
#include "gtest/gtest.h"

namespace kvtier::daemon::index_testing {
namespace {

TEST(PrefixIndexTest, HybridUsableIsDeepestCompleteSnapshot) {
  auto index = Make(Config(64, 16));
  const auto a = Chain(1, 10);
  // Snapshots after pages 3 and 7 (indices 2 and 6), as two prefill chunks.
  Put(*index, 0, nullptr, std::vector<HashKey>(a.begin(), a.begin() + 7),
      {2, 6});
  Put(*index, 0, &a[6], std::vector<HashKey>(a.begin() + 7, a.end()));

  LookupResult r = index->Lookup(a, 0);
  EXPECT_EQ(r.matched_pages, 10u);
  EXPECT_EQ(r.usable_pages, 7u);
  EXPECT_EQ(r.rows.size(), 7u);
  EXPECT_TRUE(r.has_snapshot);
  EXPECT_NE(r.snapshot_row, kNoRow);
  const uint32_t deep_snapshot = r.snapshot_row;

  r = index->Lookup(std::vector<HashKey>(a.begin(), a.begin() + 5), 0);
  EXPECT_EQ(r.matched_pages, 5u);
  EXPECT_EQ(r.usable_pages, 3u);
  EXPECT_EQ(r.rows.size(), 3u);
  EXPECT_NE(r.snapshot_row, deep_snapshot);

  r = index->Lookup(std::vector<HashKey>(a.begin(), a.begin() + 2), 0);
  EXPECT_EQ(r.matched_pages, 2u);
  EXPECT_EQ(r.usable_pages, 0u);
  EXPECT_TRUE(r.rows.empty());
  EXPECT_FALSE(r.has_snapshot);
  EXPECT_EQ(r.snapshot_row, kNoRow);
  EXPECT_EQ(r.pin_node, kNoNode);

  // A snapshot beyond the matched run is not usable.
  auto q = a;
  q[5] = Key(9, 5);
  r = index->Lookup(q, 0);
  EXPECT_EQ(r.matched_pages, 5u);
  EXPECT_EQ(r.usable_pages, 3u);

  // A snapshot committed later on an existing node (page 9).
  auto s = index->AllocateSnapshotRows(0, 1);
  ASSERT_TRUE(s.ok());
  auto c = index->Commit(0, nullptr, {}, {}, {{(*s)[0], a[9]}});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->committed_snapshots, 1u);
  EXPECT_EQ(index->Lookup(a, 0).usable_pages, 10u);
  EXPECT_EQ(index->GetUsage().snapshots, 3u);
  EXPECT_TRUE(index->CheckInvariants().ok());
}

TEST(PrefixIndexTest, HybridTensorParallelNeedsEveryRanksSnapshot) {
  auto index = Make(Config(64, 16, 2));
  const auto a = Chain(1, 6);
  Put(*index, 0, nullptr, a, {3});
  Put(*index, 1, nullptr, a);  // Rank 1: pages but no snapshot yet.
  LookupResult r = index->Lookup(a, 1);
  EXPECT_EQ(r.matched_pages, 6u);
  EXPECT_EQ(r.usable_pages, 0u);
  auto s = index->AllocateSnapshotRows(1, 1);
  ASSERT_TRUE(s.ok());
  ASSERT_TRUE(index->Commit(1, nullptr, {}, {}, {{(*s)[0], a[3]}}).ok());
  r = index->Lookup(a, 1);
  EXPECT_EQ(r.usable_pages, 4u);
  EXPECT_EQ(r.snapshot_row, (*s)[0]);
  EXPECT_TRUE(index->CheckInvariants().ok());
}

TEST(PrefixIndexTest, SnapshotSpacingEvictsRedundantFirst) {
  // 16 tokens per page, replay bound 64 tokens. One page per commit so that
  // recency grows with depth: LRU order is s@64, s@80, s@96, s@160.
  auto index = Make(Config(64, 4, 1, false, 64));
  const auto a = Chain(1, 12);
  for (size_t i = 0; i < a.size(); ++i) {
    const bool snap = i == 3 || i == 4 || i == 5 || i == 9;
    Put(*index, 0, i == 0 ? nullptr : &a[i - 1], {a[i]},
        snap ? std::vector<size_t>{0} : std::vector<size_t>{});
  }
  ASSERT_EQ(index->GetUsage().free_snapshot_rows[0], 0u);
  auto usable_at = [&](size_t pages) {
    return index->Lookup(std::vector<HashKey>(a.begin(), a.begin() + pages), 0)
        .usable_pages;
  };
  // s@64 (pa 0, next 80) is needed; s@80 (pa 64, next 96) is redundant.
  auto rows = index->AllocateSnapshotRows(0, 1);
  ASSERT_TRUE(rows.ok()) << rows.status();
  PrefixIndex::Usage u = index->GetUsage();
  EXPECT_EQ(u.evicted_snapshots, 1u);
  EXPECT_EQ(u.spacing_violations, 0u);
  EXPECT_EQ(u.nodes, 12u);      // Snapshot eviction keeps the pages.
  EXPECT_EQ(usable_at(5), 4u);  // s@80 gone: page 5 resumes from s@64.
  EXPECT_EQ(usable_at(4), 4u);
  EXPECT_EQ(usable_at(6), 6u);
  EXPECT_EQ(usable_at(12), 10u);
  ASSERT_TRUE(index->CheckInvariants().ok());

  // Now none is redundant: the LRU one goes anyway, counted as a violation.
  // Lookups above touched s@64 (usable 4), s@96 and s@160; s@64 was touched
  // first, so it is the least recent.
  rows = index->AllocateSnapshotRows(0, 1);
  ASSERT_TRUE(rows.ok()) << rows.status();
  u = index->GetUsage();
  EXPECT_EQ(u.evicted_snapshots, 2u);
  EXPECT_EQ(u.spacing_violations, 1u);
  EXPECT_EQ(usable_at(4), 0u);
  EXPECT_EQ(usable_at(6), 6u);
  ASSERT_TRUE(index->CheckInvariants().ok());
}

TEST(PrefixIndexTest, SnapshotEvictionWithoutSpacingIsPlainLru) {
  auto index = Make(Config(64, 2));  // max_replay_tokens 0.
  const auto a = Chain(1, 4);
  Put(*index, 0, nullptr, {a[0], a[1]}, {1});
  Put(*index, 0, &a[1], {a[2], a[3]}, {1});
  ASSERT_TRUE(index->AllocateSnapshotRows(0, 1).ok());
  PrefixIndex::Usage u = index->GetUsage();
  EXPECT_EQ(u.evicted_snapshots, 1u);
  EXPECT_EQ(u.spacing_violations, 0u);
  EXPECT_EQ(index->Lookup(a, 0).usable_pages, 4u);  // The older one went.
  EXPECT_EQ(index->Lookup({a[0], a[1]}, 0).usable_pages, 0u);
  EXPECT_TRUE(index->CheckInvariants().ok());
}

TEST(PrefixIndexTest, PinnedSnapshotsAreNotEvicted) {
  auto index = Make(Config(64, 1));
  const auto a = Chain(1, 2);
  Put(*index, 0, nullptr, a, {1});
  LookupResult r = index->Lookup(a, 0);
  ASSERT_TRUE(r.has_snapshot);
  index->Pin(r.pin_node);
  const std::string before = Describe(index->GetUsage());
  auto s = index->AllocateSnapshotRows(0, 1);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(s.status().message().find("need 1"), std::string::npos)
      << s.status();
  EXPECT_EQ(Describe(index->GetUsage()), before);
  ASSERT_TRUE(index->Unpin(r.pin_node).ok());
  EXPECT_TRUE(index->AllocateSnapshotRows(0, 1).ok());
  EXPECT_EQ(index->Lookup(a, 0).usable_pages, 0u);
  EXPECT_EQ(index->Lookup(a, 0).matched_pages, 2u);
  EXPECT_TRUE(index->CheckInvariants().ok());
}

TEST(PrefixIndexTest, NonHybridHasNoSnapshots) {
  auto index = Make(Config(8));
  EXPECT_EQ(index->AllocateSnapshotRows(0, 1).status().code(),
            absl::StatusCode::kFailedPrecondition);
  const auto a = Chain(1, 1);
  auto rows = index->AllocatePageRows(0, 1);
  ASSERT_TRUE(rows.ok());
  EXPECT_EQ(index->Commit(0, nullptr, a, *rows, {{0, a[0]}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(index->CheckInvariants().ok());
}

}  // namespace
}  // namespace kvtier::daemon::index_testing
