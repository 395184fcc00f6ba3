// Tests of PrefixIndex lookups: longest match, branches, the verification
// walk and its fallback, 16-byte hashes, tensor-parallel and replicated
// namespaces, and (printed, never asserted) lookup time.
//
// Thread-safety: single-threaded tests.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "daemon/prefix_index.h"
#include "daemon/prefix_index_test_util.h"
#include "gtest/gtest.h"

namespace kvtier::daemon::index_testing {
namespace {

TEST(PrefixIndexTest, LongestMatchFullPartialNone) {
  auto index = Make(Config(64));
  const auto a = Chain(1, 10);
  Put(*index, 0, nullptr, a);
  const std::vector<uint32_t> rows = RowsOf(*index, a);
  ASSERT_EQ(rows.size(), 10u);

  LookupResult full = index->Lookup(a, 0);
  EXPECT_EQ(full.matched_pages, 10u);
  EXPECT_EQ(full.usable_pages, 10u);
  EXPECT_FALSE(full.has_snapshot);
  EXPECT_NE(full.pin_node, kNoNode);

  // A longer query matches the cached part.
  LookupResult longer = index->Lookup(Concat(a, Chain(1, 5, 10)), 0);
  EXPECT_EQ(longer.matched_pages, 10u);
  EXPECT_EQ(longer.rows, rows);

  // A shorter query matches all of itself.
  LookupResult partial =
      index->Lookup(std::vector<HashKey>(a.begin(), a.begin() + 4), 0);
  EXPECT_EQ(partial.matched_pages, 4u);
  EXPECT_EQ(partial.rows,
            std::vector<uint32_t>(rows.begin(), rows.begin() + 4));

  // Unknown first page: nothing.
  LookupResult none = index->Lookup(Chain(2, 10), 0);
  EXPECT_EQ(none.matched_pages, 0u);
  EXPECT_EQ(none.usable_pages, 0u);
  EXPECT_TRUE(none.rows.empty());
  EXPECT_EQ(none.pin_node, kNoNode);
  EXPECT_EQ(index->Lookup({}, 0).matched_pages, 0u);

  // A committed continuation (with parent) extends the match.
  Put(*index, 0, &a.back(), Chain(1, 3, 10));
  EXPECT_EQ(index->Lookup(Chain(1, 20), 0).matched_pages, 13u);
  EXPECT_TRUE(index->CheckInvariants().ok());
}

TEST(PrefixIndexTest, DivergentBranches) {
  auto index = Make(Config(64));
  const auto trunk = Chain(1, 5);
  const auto left = Concat(trunk, Chain(2, 5, 5));
  const auto right = Concat(trunk, Chain(3, 3, 5));
  Put(*index, 0, nullptr, left);
  CommitResult r = Put(*index, 0, nullptr, right);
  EXPECT_EQ(r.deduplicated_pages, 5u);  // The shared trunk.
  EXPECT_EQ(r.committed_pages, 3u);

  const auto lrows = RowsOf(*index, left);
  const auto rrows = RowsOf(*index, right);
  ASSERT_EQ(lrows.size(), 10u);
  ASSERT_EQ(rrows.size(), 8u);
  for (size_t i = 0; i < 5; ++i) EXPECT_EQ(lrows[i], rrows[i]);
  EXPECT_NE(lrows[5], rrows[5]);

  // A third branch, never committed, matches the trunk only.
  EXPECT_EQ(index->Lookup(Concat(trunk, Chain(4, 4, 5)), 0).matched_pages, 5u);
  PrefixIndex::Usage u = index->GetUsage();
  EXPECT_EQ(u.nodes, 13u);
  EXPECT_EQ(u.leaves, 2u);
  EXPECT_TRUE(index->CheckInvariants().ok());
}

TEST(PrefixIndexTest, VerificationFallsBackOnInconsistentChain) {
  auto index = Make(Config(64));
  const auto a = Chain(1, 10);
  const auto b = Chain(2, 10);
  Put(*index, 0, nullptr, a);
  Put(*index, 0, nullptr, b);
  const auto arows = RowsOf(*index, a);

  // Middle key unknown: the binary search finds a[9] at depth 9, the walk up
  // disagrees at page 4, the linear scan stops there.
  auto q = a;
  q[4] = Key(99, 4);
  LookupResult r = index->Lookup(q, 0);
  EXPECT_EQ(r.matched_pages, 4u);
  EXPECT_EQ(r.rows, std::vector<uint32_t>(arows.begin(), arows.begin() + 4));

  // Middle key present at the same depth in another chain.
  q = a;
  q[4] = b[4];
  r = index->Lookup(q, 0);
  EXPECT_EQ(r.matched_pages, 4u);
  EXPECT_EQ(r.rows, std::vector<uint32_t>(arows.begin(), arows.begin() + 4));

  // A key of the wrong depth.
  q = a;
  q[6] = a[2];
  r = index->Lookup(q, 0);
  EXPECT_EQ(r.matched_pages, 6u);
  EXPECT_EQ(r.rows, std::vector<uint32_t>(arows.begin(), arows.begin() + 6));

  // First key swapped: nothing is served.
  q = a;
  q[0] = b[0];
  r = index->Lookup(q, 0);
  EXPECT_EQ(r.matched_pages, 1u);  // b[0] itself is a first page.
  EXPECT_EQ(r.rows.size(), 1u);
  EXPECT_EQ(r.rows[0], RowsOf(*index, b)[0]);
  EXPECT_TRUE(index->CheckInvariants().ok());
}

TEST(PrefixIndexTest, SixteenByteHashesIgnoreTail) {
  IndexConfig c = Config(16);
  c.hash_bytes = 16;
  auto index = Make(c);
  auto a = Chain(1, 4);
  for (auto& k : a) std::memset(k.bytes.data() + 16, 0, 16);
  Put(*index, 0, nullptr, a);
  auto q = a;
  for (auto& k : q) k.bytes[31] = 0x5a;  // Garbage beyond hash_bytes.
  EXPECT_EQ(index->Lookup(q, 0).matched_pages, 4u);
  uint64_t total = 0;
  auto listed = index->ListPrefixes(true, 10, &total);
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0].leaf.bytes, a.back().bytes);
  EXPECT_TRUE(index->CheckInvariants().ok());
}

TEST(PrefixIndexTest, TensorParallelMatchesWhereBothRanksCommitted) {
  auto index = Make(Config(16, 0, 2));
  const auto a = Chain(1, 6);
  Put(*index, 0, nullptr, a);
  EXPECT_EQ(index->Lookup(a, 0).matched_pages, 0u);
  EXPECT_EQ(index->Lookup(a, 1).matched_pages, 0u);
  Put(*index, 1, nullptr, std::vector<HashKey>(a.begin(), a.begin() + 4));
  LookupResult r0 = index->Lookup(a, 0);
  LookupResult r1 = index->Lookup(a, 1);
  EXPECT_EQ(r0.matched_pages, 4u);
  EXPECT_EQ(r1.matched_pages, 4u);
  EXPECT_EQ(r0.pin_node, r1.pin_node);
  EXPECT_EQ(index->Lookup(a, 2).matched_pages, 0u);  // No rank 2.
  // Rank 1 cannot skip a page: a[4] has no rank-1 row yet... a[3] does.
  auto rows = index->AllocatePageRows(1, 1);
  ASSERT_TRUE(rows.ok());
  EXPECT_EQ(index->Commit(1, &a[4], {a[5]}, *rows, {}).status().code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(index->Commit(1, &a[3], {a[4]}, *rows, {}).ok());
  EXPECT_EQ(index->Lookup(a, 1).matched_pages, 5u);
  PrefixIndex::Usage u = index->GetUsage();
  EXPECT_EQ(u.committed_page_rows, (std::vector<uint64_t>{6, 5}));
  // Eviction frees both ranks' rows of a node.
  ASSERT_TRUE(index->DropSubtree(a[4]).ok());
  u = index->GetUsage();
  EXPECT_EQ(u.committed_page_rows, (std::vector<uint64_t>{4, 4}));
  EXPECT_TRUE(index->CheckInvariants().ok());
  // Allocation on rank 1 evicts leaves, freeing both ranks.
  ASSERT_TRUE(index->AllocatePageRows(1, 16 - 4 + 1).ok());
  u = index->GetUsage();
  EXPECT_EQ(u.committed_page_rows, (std::vector<uint64_t>{3, 3}));
  EXPECT_EQ(u.evicted_pages, 1u);
  EXPECT_TRUE(index->CheckInvariants().ok());
}

TEST(PrefixIndexTest, ReplicatedStoresOneCopy) {
  auto index = Make(Config(16, 0, 4, true));
  EXPECT_EQ(index->AllocatePageRows(1, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  const auto a = Chain(1, 5);
  Put(*index, 0, nullptr, a);
  const auto rows = RowsOf(*index, a, 0);
  ASSERT_EQ(rows.size(), 5u);
  for (uint32_t rank = 0; rank < 4; ++rank) {
    LookupResult r = index->Lookup(a, rank);
    EXPECT_EQ(r.matched_pages, 5u);
    EXPECT_EQ(r.rows, rows);
  }
  EXPECT_EQ(index->Lookup(a, 4).matched_pages, 0u);
  PrefixIndex::Usage u = index->GetUsage();
  EXPECT_EQ(u.free_page_rows.size(), 1u);
  EXPECT_EQ(u.committed_page_rows[0], 5u);
  EXPECT_TRUE(index->CheckInvariants().ok());
}

TEST(PrefixIndexTest, LookupTiming1536) {
  constexpr size_t kChains = 64, kPages = 1536;
  for (bool hybrid : {false, true}) {
    auto index = Make(Config(kChains * kPages, hybrid ? kChains * 8 : 0));
    std::vector<std::vector<HashKey>> chains;
    for (size_t c = 0; c < kChains; ++c) {
      chains.push_back(Chain(c, kPages));
      std::vector<size_t> snaps;
      if (hybrid) {
        for (size_t i = 191; i < kPages; i += 192) snaps.push_back(i);
      }
      Put(*index, 0, nullptr, chains.back(), snaps);
    }
    constexpr int kIters = 1000;
    uint64_t usable = 0;
    const double full_us = BestMicros(kIters, [&](int i) {
      usable += index->Lookup(chains[i % kChains], 0).usable_pages;
    });
    EXPECT_EQ(usable, uint64_t{7 * kIters} * kPages);
    // A miss halfway: the binary search stops at page 768.
    auto half =
        Concat(Chain(3, kPages / 2), Chain(999, kPages / 2, kPages / 2));
    const double half_us = BestMicros(
        kIters, [&](int) { usable += index->Lookup(half, 0).rows.size(); });
    std::printf(
        "[ lookup ] 1536 hashes (%s): full hit %.2f us, half hit %.2f "
        "us\n",
        hybrid ? "hybrid" : "plain", full_us, half_us);
    EXPECT_TRUE(index->CheckInvariants().ok());
  }
}

}  // namespace
}  // namespace kvtier::daemon::index_testing
