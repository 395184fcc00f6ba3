// Tests of PrefixIndex row allocation and eviction: leaf-first LRU and
// inherited recency, pins, all-or-nothing refusals that change nothing and
// name their counts, and freeing and claiming rows.
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

TEST(PrefixIndexTest, LeafFirstLru) {
  auto index = Make(Config(4));
  const auto a = Chain(1, 3);  // One commit: one tick for all three.
  const auto b = Chain(2, 1);
  const auto c = Chain(3, 1);
  Put(*index, 0, nullptr, a);  // t1
  Put(*index, 0, nullptr, b);  // t2
  // Full: the next row evicts a's leaf (the oldest leaf), never a's root.
  auto held = index->AllocatePageRows(0, 1);
  ASSERT_TRUE(held.ok());
  EXPECT_EQ(index->Lookup(a, 0).matched_pages, 2u);  // Touches a[1]: t3.
  Put(*index, 0, nullptr, c);  // t4; evicts b, now the oldest leaf.
  uint64_t total = 0;
  auto listed = index->ListPrefixes(true, 10, &total);
  ASSERT_EQ(listed.size(), 2u);
  EXPECT_EQ(listed[0].leaf.bytes, c[0].bytes);
  EXPECT_EQ(listed[1].leaf.bytes, a[1].bytes);
  // a[1] (t3), then a[0] (inheriting t3 from a[1], older than c) go before c.
  ASSERT_TRUE(index->AllocatePageRows(0, 2).ok());
  EXPECT_EQ(index->Lookup(a, 0).matched_pages, 0u);
  EXPECT_EQ(index->Lookup(b, 0).matched_pages, 0u);
  EXPECT_EQ(index->Lookup(c, 0).matched_pages, 1u);
  EXPECT_EQ(index->GetUsage().evicted_pages, 4u);
  EXPECT_TRUE(index->CheckInvariants().ok());
}

TEST(PrefixIndexTest, ParentReentersLeafSetWithChildsRecency) {
  // a0's own tick (t1) is older than x0's (t3); only the recency inherited
  // from its evicted child a1 (t4) keeps it past x0.
  auto index = Make(Config(3));
  const auto a = Chain(1, 2);
  const auto x = Chain(2, 1);
  Put(*index, 0, nullptr, {a[0]});        // a0: t1.
  Put(*index, 0, nullptr, x);             // x0: t2.
  LookupResult lx = index->Lookup(x, 0);  // x0: t3.
  index->Pin(lx.pin_node);
  Put(*index, 0, &a[0], {a[1]});  // a1: t4.
  // Only a1 is evictable (x0 is pinned); a0 re-enters the leaf set at t4.
  ASSERT_TRUE(index->AllocatePageRows(0, 1).ok());
  ASSERT_TRUE(index->Unpin(lx.pin_node).ok());  // x0 re-enters at t3.
  auto listed = index->ListPrefixes(true, 10, nullptr);
  ASSERT_EQ(listed.size(), 2u);
  EXPECT_EQ(listed[0].leaf.bytes, a[0].bytes);
  EXPECT_EQ(listed[1].leaf.bytes, x[0].bytes);
  EXPECT_EQ(listed[0].last_use_tick, 4u);
  EXPECT_EQ(listed[1].last_use_tick, 3u);
  ASSERT_TRUE(index->AllocatePageRows(0, 1).ok());  // x0 goes, not a0.
  listed = index->ListPrefixes(true, 10, nullptr);
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0].leaf.bytes, a[0].bytes);
  EXPECT_EQ(index->Lookup(x, 0).matched_pages, 0u);
  EXPECT_EQ(index->Lookup(a, 0).matched_pages, 1u);
  EXPECT_TRUE(index->CheckInvariants().ok());
}

TEST(PrefixIndexTest, PinsBlockEviction) {
  auto index = Make(Config(4));
  const auto a = Chain(1, 4);
  Put(*index, 0, nullptr, a);
  LookupResult r = index->Lookup({a[0], a[1]}, 0);
  index->Pin(r.pin_node);  // Protects a[0..1].
  // Needs 3: only a[3] and a[2] could go, so nothing does (refused before
  // evicting; the old contract evicted them on the way).
  auto rows = index->AllocatePageRows(0, 3);
  EXPECT_EQ(rows.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(rows.status().message().find(
                "page rows of rank 0: need 3, 0 free, 2 reclaimable by "
                "eviction, 2 pinned"),
            std::string::npos)
      << rows.status();
  EXPECT_NE(rows.status().message().find("0 reserved"), std::string::npos)
      << rows.status();
  PrefixIndex::Usage u = index->GetUsage();
  EXPECT_EQ(u.nodes, 4u);
  EXPECT_EQ(u.evicted_pages, 0u);
  EXPECT_EQ(u.allocated_page_rows[0], 0u);  // Nothing allocated.
  EXPECT_EQ(u.free_page_rows[0], 0u);
  EXPECT_EQ(index->Lookup(a, 0).matched_pages, 4u);
  ASSERT_TRUE(index->CheckInvariants().ok());
  // Two can be had: a[3] and a[2] go.
  rows = index->AllocatePageRows(0, 2);
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_EQ(index->Lookup(a, 0).matched_pages, 2u);
  ASSERT_TRUE(index->FreePageRows(0, *rows).ok());

  // Unpin: now it can.
  EXPECT_TRUE(index->Unpin(r.pin_node).ok());
  EXPECT_EQ(index->Unpin(r.pin_node).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(index->AllocatePageRows(0, 3).ok());  // Evicts a[1] too.
  EXPECT_EQ(index->Lookup(a, 0).matched_pages, 1u);
  EXPECT_TRUE(index->CheckInvariants().ok());
}

TEST(PrefixIndexTest, EverythingPinnedIsResourceExhaustedUnchanged) {
  auto index = Make(Config(6));
  const auto a = Chain(1, 3);
  const auto b = Chain(2, 3);
  Put(*index, 0, nullptr, a);
  Put(*index, 0, nullptr, b);
  const uint32_t pa = index->Lookup(a, 0).pin_node;
  const uint32_t pb = index->Lookup(b, 0).pin_node;
  index->Pin(pa);
  index->Pin(pb);
  index->Pin(pb);  // Pins count.
  const std::string before = Describe(index->GetUsage());
  auto rows = index->AllocatePageRows(0, 1);
  EXPECT_EQ(rows.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(Describe(index->GetUsage()), before);
  EXPECT_EQ(index->GetUsage().pinned_nodes, 2u);
  ASSERT_TRUE(index->CheckInvariants().ok());
  ASSERT_TRUE(index->Unpin(pb).ok());
  EXPECT_FALSE(index->AllocatePageRows(0, 1).ok());  // Still one pin on b.
  ASSERT_TRUE(index->Unpin(pb).ok());
  EXPECT_TRUE(index->AllocatePageRows(0, 1).ok());
  EXPECT_EQ(index->Lookup(b, 0).matched_pages, 2u);
  EXPECT_TRUE(index->CheckInvariants().ok());
}

TEST(PrefixIndexTest, RefusedAllocationChangesNothing) {
  auto index = Make(Config(16, 4));
  const auto a = Chain(1, 6);
  const auto b = Chain(2, 4);
  const auto c = Chain(3, 4);
  Put(*index, 0, nullptr, a, {2, 5});
  Put(*index, 0, nullptr, b, {3});
  Put(*index, 0, nullptr, c, {1});
  // A reservation takes the last two free page rows: never reclaimable.
  auto held = index->AllocateRows(0, 2, 0);
  ASSERT_TRUE(held.ok()) << held.status();
  EXPECT_TRUE(held->snapshot_rows.empty());
  const uint32_t pa = index->Lookup({a[0], a[1], a[2], a[3]}, 0).pin_node;
  const uint32_t pb = index->Lookup(b, 0).pin_node;
  index->Pin(pa);  // a[2] (the snapshot there): protects a[0..2].
  index->Pin(pb);  // b[3]: protects b.
  // Pages: 0 free, 7 pinned (a[0..2], b), 7 reclaimable (a[3..5], c), 2
  // reserved. Snapshots: 0 free, 2 pinned (a[2], b[3]), 2 reclaimable.
  const std::vector<std::vector<HashKey>> chains = {a, b, c, {a[0], a[1]}};
  const std::string before = Dump(*index, chains);
  ASSERT_TRUE(index->CheckInvariants().ok());

  auto p = index->AllocatePageRows(0, 8);
  EXPECT_TRUE(ExhaustedWith(
      p.status(),
      "page rows of rank 0: need 8, 0 free, 7 reclaimable by eviction, 7 "
      "pinned (held by pinned nodes and their ancestors), 2 reserved "
      "(allocated uncommitted)"))
      << p.status();
  EXPECT_NE(p.status().message().find("nothing was evicted"),
            std::string::npos);
  EXPECT_EQ(Dump(*index, chains), before);

  auto s = index->AllocateSnapshotRows(0, 3);
  EXPECT_TRUE(ExhaustedWith(
      s.status(),
      "snapshot rows of rank 0: need 3, 0 free, 2 reclaimable by eviction, 2 "
      "pinned (on pinned nodes), 0 reserved"))
      << s.status();
  EXPECT_EQ(Dump(*index, chains), before);

  auto both = index->AllocateRows(0, 8, 3);
  EXPECT_TRUE(ExhaustedWith(both.status(), "page rows of rank 0: need 8"))
      << both.status();
  EXPECT_TRUE(ExhaustedWith(both.status(), "snapshot rows of rank 0: need 3"))
      << both.status();
  EXPECT_EQ(Dump(*index, chains), before);
  // One short in one bank is enough to refuse both.
  EXPECT_TRUE(ExhaustedWith(index->AllocateRows(0, 8, 2).status(), "page"));
  EXPECT_TRUE(ExhaustedWith(index->AllocateRows(0, 7, 3).status(), "snapshot"));
  EXPECT_EQ(Dump(*index, chains), before);
  // Validation errors change nothing either.
  EXPECT_EQ(index->AllocateRows(0, 17, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(index->AllocateRows(0, 0, 5).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(index->AllocateRows(1, 1, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Dump(*index, chains), before);

  // Exactly free + reclaimable in both banks: granted, evicting all of it.
  auto all = index->AllocateRows(0, 7, 2);
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(all->page_rows.size(), 7u);
  EXPECT_EQ(all->snapshot_rows.size(), 2u);
  PrefixIndex::Usage u = index->GetUsage();
  EXPECT_EQ(u.nodes, 7u);
  EXPECT_EQ(u.evicted_pages, 7u);
  EXPECT_EQ(u.free_page_rows[0], 0u);
  EXPECT_EQ(u.allocated_page_rows[0], 9u);
  EXPECT_EQ(u.allocated_snapshot_rows[0], 2u);
  EXPECT_EQ(index->Lookup(a, 0).usable_pages, 3u);
  EXPECT_EQ(index->Lookup(b, 0).usable_pages, 4u);
  EXPECT_EQ(index->Lookup(c, 0).matched_pages, 0u);
  EXPECT_TRUE(index->CheckInvariants().ok()) << index->CheckInvariants();
  ASSERT_TRUE(index->Unpin(pa).ok());
  ASSERT_TRUE(index->Unpin(pb).ok());
}

TEST(PrefixIndexTest, FullBankOfUnpinnedPrefixesReservesTheWholeBank) {
  for (uint32_t replay : {0u, 64u}) {
    auto index = Make(Config(24, 6, 2, false, replay));
    // Both ranks: three 8-page prefixes, two snapshots each.
    for (uint64_t chain = 1; chain <= 3; ++chain) {
      for (uint32_t rank = 0; rank < 2; ++rank) {
        Put(*index, rank, nullptr, Chain(chain, 8), {3, 7});
      }
    }
    PrefixIndex::Usage u = index->GetUsage();
    ASSERT_EQ(u.free_page_rows, (std::vector<uint64_t>{0, 0}));
    ASSERT_EQ(u.free_snapshot_rows, (std::vector<uint64_t>{0, 0}));
    auto all = index->AllocateRows(1, 24, 6);
    ASSERT_TRUE(all.ok()) << all.status();
    EXPECT_EQ(all->page_rows.size(), 24u);
    EXPECT_EQ(all->snapshot_rows.size(), 6u);
    u = index->GetUsage();
    EXPECT_EQ(u.nodes, 0u);
    EXPECT_EQ(u.free_page_rows, (std::vector<uint64_t>{24, 0}));
    EXPECT_EQ(u.free_snapshot_rows, (std::vector<uint64_t>{6, 0}));
    EXPECT_TRUE(index->CheckInvariants().ok()) << index->CheckInvariants();
  }
}

TEST(PrefixIndexTest, AllocateRowsSnapshotsImpossibleChangesNothing) {
  auto index = Make(Config(16, 4));
  const auto a = Chain(1, 8);
  const auto b = Chain(2, 4);
  Put(*index, 0, nullptr, a, {3, 7});
  Put(*index, 0, nullptr, b, {1, 3});
  const uint32_t pa = index->Lookup(a, 0).pin_node;             // a[7].
  const uint32_t pb = index->Lookup({b[0], b[1]}, 0).pin_node;  // b[1].
  index->Pin(pa);
  index->Pin(pb);
  // Pages: 4 free, 2 reclaimable (b[2..3]). Snapshots: 0 free, 2
  // reclaimable (a[3] alone, b[3] with its leaf), 2 pinned (a[7], b[1]).
  const std::vector<std::vector<HashKey>> chains = {a, b, {a[0], a[1], a[2]}};
  const std::string before = Dump(*index, chains);
  auto r = index->AllocateRows(0, 6, 3);
  EXPECT_TRUE(ExhaustedWith(
      r.status(),
      "snapshot rows of rank 0: need 3, 0 free, 2 reclaimable by eviction, 2 "
      "pinned"))
      << r.status();
  EXPECT_EQ(r.status().message().find("page rows"), std::string::npos)
      << r.status();  // The page bank was fine.
  EXPECT_EQ(Dump(*index, chains), before);

  // Feasible: the leaf eviction for pages frees b[3]'s snapshot, so only
  // a[3]'s goes alone.
  r = index->AllocateRows(0, 6, 2);
  ASSERT_TRUE(r.ok()) << r.status();
  PrefixIndex::Usage u = index->GetUsage();
  EXPECT_EQ(u.nodes, 10u);
  EXPECT_EQ(u.evicted_pages, 2u);
  EXPECT_EQ(u.evicted_snapshots, 2u);
  EXPECT_EQ(u.committed_snapshot_rows[0], 2u);
  EXPECT_EQ(index->Lookup(a, 0).usable_pages, 8u);
  EXPECT_EQ(index->Lookup({a[0], a[1], a[2], a[3]}, 0).usable_pages, 0u);
  EXPECT_EQ(index->Lookup(b, 0).usable_pages, 2u);
  EXPECT_TRUE(index->CheckInvariants().ok()) << index->CheckInvariants();
  ASSERT_TRUE(index->Unpin(pa).ok());
  ASSERT_TRUE(index->Unpin(pb).ok());
}

TEST(PrefixIndexTest, TensorParallelRefusalCountsTheRanksRows) {
  auto index = Make(Config(8, 0, 2));
  const auto a = Chain(1, 6);
  const auto b = Chain(2, 2);
  Put(*index, 0, nullptr, a);  // Rank 0: a[0..5].
  Put(*index, 1, nullptr, {a[0], a[1], a[2]});
  Put(*index, 1, nullptr, b);  // Rank 1 only.
  const uint32_t pin = index->Lookup({a[0], a[1]}, 1).pin_node;
  ASSERT_NE(pin, kNoNode);
  index->Pin(pin);  // Protects a[0..1], both ranks' rows.
  // Rank 0: 2 free, 4 reclaimable (a[2..5]). Rank 1: 3 free, 3 reclaimable
  // (a[2], b[0..1]); a[3..5] hold no rank-1 row.
  const std::vector<std::vector<HashKey>> chains = {a, b, {a[0], a[1], a[2]}};
  const std::string before = Dump(*index, chains, 2);
  auto r0 = index->AllocatePageRows(0, 7);
  EXPECT_TRUE(ExhaustedWith(
      r0.status(),
      "page rows of rank 0: need 7, 2 free, 4 reclaimable by eviction, 2 "
      "pinned"))
      << r0.status();
  auto r1 = index->AllocatePageRows(1, 7);
  EXPECT_TRUE(ExhaustedWith(
      r1.status(),
      "page rows of rank 1: need 7, 3 free, 3 reclaimable by eviction, 2 "
      "pinned"))
      << r1.status();
  EXPECT_EQ(Dump(*index, chains, 2), before);

  // Rank 1's six: every unprotected node goes (a[3..5] first, freeing only
  // rank 0's rows), which frees rank 0's rows too.
  r1 = index->AllocatePageRows(1, 6);
  ASSERT_TRUE(r1.ok()) << r1.status();
  PrefixIndex::Usage u = index->GetUsage();
  EXPECT_EQ(u.nodes, 2u);
  EXPECT_EQ(u.committed_page_rows, (std::vector<uint64_t>{2, 2}));
  EXPECT_EQ(u.free_page_rows, (std::vector<uint64_t>{6, 0}));
  EXPECT_EQ(index->Lookup(a, 1).matched_pages, 2u);
  EXPECT_TRUE(index->CheckInvariants().ok()) << index->CheckInvariants();
  ASSERT_TRUE(index->Unpin(pin).ok());
}

// Pages some rank never committed (no lookup can use them) go before any
// other once past the grace, and are counted; within it they wait their
// LRU turn (the other ranks may be about to commit them).
TEST(PrefixIndexTest, IncompletePagesAreEvictedFirstOncePastTheGrace) {
  for (const int64_t grace : {int64_t{0}, int64_t{3600000}}) {
    IndexConfig c = Config(4, 0, 2);
    c.incomplete_grace_ms = grace;
    auto index = Make(c);
    const auto x = Chain(1, 2);  // Both ranks: complete, and older.
    const auto y = Chain(2, 2);  // Rank 0 only.
    Put(*index, 0, nullptr, x);
    Put(*index, 1, nullptr, x);
    Put(*index, 0, nullptr, y);
    EXPECT_EQ(index->Lookup(y, 0).matched_pages, 0u);
    auto r = index->AllocatePageRows(0, 2);
    ASSERT_TRUE(r.ok()) << r.status();
    const PrefixIndex::Usage u = index->GetUsage();
    EXPECT_EQ(u.evicted_pages, 2u) << grace;
    if (grace == 0) {
      EXPECT_EQ(index->Lookup(x, 1).matched_pages, 2u);
      EXPECT_EQ(u.evicted_incomplete_pages, 2u);
    } else {
      EXPECT_EQ(index->Lookup(x, 1).matched_pages, 0u);  // The LRU's turn.
      EXPECT_EQ(u.evicted_incomplete_pages, 0u);
    }
    EXPECT_TRUE(index->CheckInvariants().ok()) << index->CheckInvariants();
  }
}

TEST(PrefixIndexTest, PinnedDeepNodeProtectsItsAncestors) {
  auto index = Make(Config(14));
  const auto a = Chain(1, 10);
  const auto tail = Chain(3, 2, 3);  // c: a[0..2] then pages 3 and 4.
  const auto c = Concat({a[0], a[1], a[2]}, tail);
  const auto b = Chain(2, 2);
  Put(*index, 0, nullptr, a);
  Put(*index, 0, &a[2], tail);
  Put(*index, 0, nullptr, b);
  ASSERT_EQ(index->GetUsage().free_page_rows[0], 0u);
  const uint32_t p6 =
      index->Lookup(std::vector<HashKey>(a.begin(), a.begin() + 7), 0).pin_node;
  const uint32_t pc = index->Lookup(c, 0).pin_node;
  const uint32_t p4 =
      index->Lookup(std::vector<HashKey>(a.begin(), a.begin() + 5), 0).pin_node;
  index->Pin(p6);
  index->Pin(p6);
  index->Pin(pc);  // Shares a[0..2] with a[6]'s path.
  index->Pin(p4);  // Already protected by a[6]'s pin.
  // Protected: a[0..6] and c's two pages, 9; reclaimable: a[7..9] and b, 5.
  const std::vector<std::vector<HashKey>> chains = {a, b, c};
  const std::string before = Dump(*index, chains);
  auto r = index->AllocatePageRows(0, 6);
  EXPECT_TRUE(ExhaustedWith(
      r.status(),
      "need 6, 0 free, 5 reclaimable by eviction, 9 pinned (held by pinned "
      "nodes and their ancestors), 0 reserved"))
      << r.status();
  EXPECT_EQ(Dump(*index, chains), before);
  r = index->AllocatePageRows(0, 5);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(index->GetUsage().nodes, 9u);
  EXPECT_EQ(index->Lookup(a, 0).matched_pages, 7u);
  EXPECT_EQ(index->Lookup(c, 0).matched_pages, 5u);
  EXPECT_EQ(index->Lookup(b, 0).matched_pages, 0u);
  EXPECT_TRUE(index->CheckInvariants().ok()) << index->CheckInvariants();
  for (uint32_t p : {p6, p6, pc, p4}) ASSERT_TRUE(index->Unpin(p).ok());
}

TEST(PrefixIndexTest, FreeRowsValidatesAllOrNothing) {
  auto index = Make(Config(8));
  auto rows = index->AllocatePageRows(0, 3);
  ASSERT_TRUE(rows.ok());
  const std::string before = Describe(index->GetUsage());
  const auto r = *rows;
  EXPECT_EQ(index->FreePageRows(0, {r[0], 8}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(index->FreePageRows(0, {r[0], 7}).code(),
            absl::StatusCode::kInvalidArgument);  // 7 is free.
  absl::Status dup = index->FreePageRows(0, {r[0], r[1], r[0]});
  EXPECT_EQ(dup.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(dup.message().find("rows[2]"), std::string::npos) << dup;
  EXPECT_EQ(index->FreePageRows(1, {r[0]}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Describe(index->GetUsage()), before);
  ASSERT_TRUE(index->CheckInvariants().ok());
  EXPECT_TRUE(index->FreePageRows(0, {r[0], r[1]}).ok());
  EXPECT_EQ(index->FreePageRows(0, {r[0]}).code(),
            absl::StatusCode::kInvalidArgument);  // Double free.
  // A committed row is not the caller's to free.
  Put(*index, 0, nullptr, Chain(1, 1));
  const auto committed = RowsOf(*index, Chain(1, 1));
  EXPECT_EQ(index->FreePageRows(0, committed).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(index->FreePageRows(0, {r[2]}).ok());
  EXPECT_EQ(index->GetUsage().free_page_rows[0], 7u);
  EXPECT_TRUE(index->CheckInvariants().ok());
}

TEST(PrefixIndexTest, ClaimRowsValidatesAllOrNothing) {
  auto index = Make(Config(8, 4));
  auto taken = index->AllocatePageRows(0, 1);  // Row 0.
  ASSERT_TRUE(taken.ok());
  ASSERT_EQ(*taken, (std::vector<uint32_t>{0}));
  const std::string before = Describe(index->GetUsage());
  absl::Status range = index->ClaimPageRows(0, {5, 8});
  EXPECT_EQ(range.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(range.message().find("rows[1]"), std::string::npos) << range;
  absl::Status busy = index->ClaimPageRows(0, {3, 0});
  EXPECT_EQ(busy.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(busy.message().find("not free"), std::string::npos) << busy;
  absl::Status dup = index->ClaimPageRows(0, {6, 2, 6});
  EXPECT_EQ(dup.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(dup.message().find("rows[2]"), std::string::npos) << dup;
  EXPECT_EQ(index->ClaimPageRows(1, {3}).code(),
            absl::StatusCode::kInvalidArgument);  // No rank 1.
  EXPECT_EQ(index->ClaimSnapshotRows(0, {4}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Describe(index->GetUsage()), before);
  ASSERT_TRUE(index->CheckInvariants().ok()) << index->CheckInvariants();

  // Claimed rows commit like allocated ones, and allocation skips them.
  ASSERT_TRUE(index->ClaimPageRows(0, {6, 2}).ok());
  ASSERT_TRUE(index->ClaimSnapshotRows(0, {3}).ok());
  EXPECT_TRUE(index->CheckInvariants().ok()) << index->CheckInvariants();
  const auto a = Chain(1, 2);
  ASSERT_TRUE(index->Commit(0, nullptr, a, {6, 2}, {{3, a[1]}}).ok());
  LookupResult r = index->Lookup(a, 0);
  EXPECT_EQ(r.rows, (std::vector<uint32_t>{6, 2}));
  EXPECT_EQ(r.snapshot_row, 3u);
  auto rest = index->AllocatePageRows(0, 5);
  ASSERT_TRUE(rest.ok());
  // Free runs 1, 3-5 and 7: the longest first, then the lowest of the rest.
  EXPECT_EQ(*rest, (std::vector<uint32_t>{3, 4, 5, 1, 7}));
  EXPECT_EQ(index->GetUsage().evicted_pages, 0u);
  EXPECT_TRUE(index->CheckInvariants().ok()) << index->CheckInvariants();

  auto plain = Make(Config(8));
  EXPECT_EQ(plain->ClaimSnapshotRows(0, {0}).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(plain->ClaimSnapshotRows(0, {}).ok());
}

TEST(PrefixIndexTest, EvictionObserverSeesCompleteNodesBeforeTheirRowsGo) {
  // Two ranks, hybrid: the observer sees an evicted leaf with both ranks'
  // rows (and its snapshot rows) while they are still committed to it; an
  // incomplete node (one rank only) is shown as incomplete; a dropped
  // subtree is not shown. Every eviction is shown: they add up to Usage's.
  auto index = Make(Config(/*page_rows=*/3, /*snapshot_rows=*/2,
                           /*tp_size=*/2));
  struct Seen {
    HashKey key;
    std::vector<uint32_t> page_rows, snapshot_rows;
  };
  std::vector<Seen> seen;  // Complete pages.
  uint64_t shown_pages = 0, shown_snapshots = 0, shown_incomplete = 0;
  index->SetEvictionObserver([&](const PrefixIndex::Eviction& e) {
    shown_pages += e.page;
    shown_snapshots += e.snapshot;
    shown_incomplete += !e.complete;
    if (!e.complete || !e.page) return;
    const PrefixIndex::NodeView& v = e.node;
    seen.push_back(
        {*v.key, std::vector<uint32_t>(v.page_rows.begin(), v.page_rows.end()),
         std::vector<uint32_t>(v.snapshot_rows.begin(),
                               v.snapshot_rows.end())});
  });
  const auto a = Chain(1, 1);
  const auto b = Chain(2, 1);
  const auto c = Chain(3, 1);
  Put(*index, 0, nullptr, a, {0});
  Put(*index, 1, nullptr, a, {0});
  const std::vector<uint32_t> a0 = RowsOf(*index, a, 0);
  const std::vector<uint32_t> a1 = RowsOf(*index, a, 1);
  Put(*index, 0, nullptr, c);  // Rank 0 only: incomplete.
  Put(*index, 0, nullptr, b);
  Put(*index, 1, nullptr, b);
  // Rank 1 still has a free row; rank 0 has none: a (the LRU leaf) goes.
  ASSERT_TRUE(index->AllocatePageRows(0, 1).ok());
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].key.bytes, a[0].bytes);
  EXPECT_EQ(seen[0].page_rows, (std::vector<uint32_t>{a0[0], a1[0]}));
  ASSERT_EQ(seen[0].snapshot_rows.size(), 2u);
  EXPECT_NE(seen[0].snapshot_rows[0], kNoRow);
  EXPECT_NE(seen[0].snapshot_rows[1], kNoRow);
  // The incomplete c (older than b) goes next: shown as incomplete.
  ASSERT_TRUE(index->AllocatePageRows(0, 1).ok());
  EXPECT_EQ(seen.size(), 1u);
  EXPECT_EQ(shown_incomplete, 1u);
  EXPECT_EQ(index->Lookup(c, 0).matched_pages, 0u);
  // A dropped subtree is not shown either.
  ASSERT_TRUE(index->DropSubtree(b[0]).ok());
  EXPECT_EQ(seen.size(), 1u);
  const PrefixIndex::Usage u = index->GetUsage();
  EXPECT_EQ(shown_pages, u.evicted_pages);
  EXPECT_EQ(shown_snapshots, u.evicted_snapshots);
  EXPECT_EQ(shown_incomplete, u.evicted_incomplete_pages);
  index->SetEvictionObserver({});
  EXPECT_TRUE(index->CheckInvariants().ok());
}

}  // namespace
}  // namespace kvtier::daemon::index_testing
