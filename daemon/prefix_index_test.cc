// Tests of PrefixIndex: matching, verification, hybrid snapshots and their
// spacing policy, leaf-first LRU, pins, commit validation, TP, memory.
#include "daemon/prefix_index.h"

#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"

namespace kvtier::daemon {
namespace {

using CommitResult = PrefixIndex::CommitResult;
using LookupResult = PrefixIndex::LookupResult;

uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// A distinct pseudo-random key per (chain, page).
HashKey Key(uint64_t chain, uint64_t page) {
  HashKey k;
  for (uint64_t w = 0; w < 4; ++w) {
    const uint64_t v = Mix(Mix(chain * 0x100000001b3ull + page) + w);
    std::memcpy(k.bytes.data() + 8 * w, &v, 8);
  }
  return k;
}

// Pages [from, from + n) of a chain.
std::vector<HashKey> Chain(uint64_t chain, size_t n, size_t from = 0) {
  std::vector<HashKey> out;
  for (size_t i = from; i < from + n; ++i) out.push_back(Key(chain, i));
  return out;
}

std::vector<HashKey> Concat(std::vector<HashKey> a,
                            const std::vector<HashKey>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

IndexConfig Config(uint64_t page_rows, uint64_t snapshot_rows = 0,
                   uint32_t tp_size = 1, bool replicated = false,
                   uint32_t max_replay_tokens = 0) {
  IndexConfig c;
  c.hash_bytes = 32;
  c.tokens_per_page = 16;
  c.tp_size = tp_size;
  c.replicated = replicated;
  c.page_rows = page_rows;
  c.snapshot_rows = snapshot_rows;
  c.max_replay_tokens = max_replay_tokens;
  return c;
}

std::unique_ptr<PrefixIndex> Make(const IndexConfig& c) {
  auto index = PrefixIndex::Create(c);
  EXPECT_TRUE(index.ok()) << index.status();
  return index.ok() ? *std::move(index) : nullptr;
}

std::string Describe(const PrefixIndex::Usage& u) {
  return absl::StrCat(
      "nodes=", u.nodes, " leaves=", u.leaves,
      " evictable=", u.evictable_leaves, " snapshots=", u.snapshots,
      " pinned=", u.pinned_nodes, " free=[",
      absl::StrJoin(u.free_page_rows, ","), "] alloc=[",
      absl::StrJoin(u.allocated_page_rows, ","), "] committed=[",
      absl::StrJoin(u.committed_page_rows, ","), "] sfree=[",
      absl::StrJoin(u.free_snapshot_rows, ","), "] salloc=[",
      absl::StrJoin(u.allocated_snapshot_rows, ","), "] scommitted=[",
      absl::StrJoin(u.committed_snapshot_rows, ","),
      "] evicted=", u.evicted_pages, "/", u.evicted_snapshots,
      " violations=", u.spacing_violations);
}

// Allocates rows for `hashes` (and snapshots after the pages at `snap_at`)
// and commits them for `rank`.
CommitResult Put(PrefixIndex& index, uint32_t rank, const HashKey* parent,
                 const std::vector<HashKey>& hashes,
                 const std::vector<size_t>& snap_at = {}) {
  std::vector<uint32_t> rows;
  if (!hashes.empty()) {
    auto r = index.AllocatePageRows(rank, hashes.size());
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return {};
    rows = *r;
  }
  std::vector<PrefixIndex::SnapshotPlacement> placements;
  if (!snap_at.empty()) {
    auto s = index.AllocateSnapshotRows(rank, snap_at.size());
    EXPECT_TRUE(s.ok()) << s.status();
    if (!s.ok()) return {};
    for (size_t j = 0; j < snap_at.size(); ++j) {
      placements.push_back({(*s)[j], hashes[snap_at[j]]});
    }
  }
  auto result = index.Commit(rank, parent, hashes, rows, placements);
  EXPECT_TRUE(result.ok()) << result.status();
  EXPECT_TRUE(index.CheckInvariants().ok()) << index.CheckInvariants();
  return result.ok() ? *std::move(result) : CommitResult{};
}

// The rows a full lookup of `hashes` returns.
std::vector<uint32_t> RowsOf(PrefixIndex& index,
                             const std::vector<HashKey>& hashes,
                             uint32_t rank = 0) {
  return index.Lookup(hashes, rank).rows;
}

// Everything observable about the index, changing nothing: usage, invariants,
// both prefix listings, every node, and Find (Lookup without its touch) of
// each of `chains` for each rank below `ranks`.
std::string Dump(const PrefixIndex& index,
                 const std::vector<std::vector<HashKey>>& chains,
                 uint32_t ranks = 1) {
  std::string out = Describe(index.GetUsage());
  absl::StrAppend(&out, "\ninvariants: ", index.CheckInvariants().ToString());
  for (bool by_recent : {true, false}) {
    uint64_t total = 0;
    for (const auto& p : index.ListPrefixes(by_recent, 1000, &total)) {
      absl::StrAppend(&out, "\nprefix ", p.leaf.bytes[0], ",", p.leaf.bytes[1],
                      " pages=", p.pages, " snapshots=", p.snapshots,
                      " tick=", p.last_use_tick, " ms=", p.last_use_unix_ms,
                      " pins=", p.pins);
    }
    absl::StrAppend(&out, "\ntotal ", total);
  }
  index.ForEachNode([&](const PrefixIndex::NodeView& v) {
    absl::StrAppend(
        &out, "\nnode ", v.id, " parent=", v.parent, " depth=", v.depth,
        " rows=[", absl::StrJoin(v.page_rows, ","), "] snaps=[",
        absl::StrJoin(v.snapshot_rows, ","), "] tick=", v.last_use_tick);
  });
  for (const auto& chain : chains) {
    for (uint32_t rank = 0; rank < ranks; ++rank) {
      const LookupResult r = index.Find(chain, rank);
      absl::StrAppend(
          &out, "\nfind matched=", r.matched_pages, " usable=", r.usable_pages,
          " rows=[", absl::StrJoin(r.rows, ","), "] snap=", r.has_snapshot, "/",
          r.snapshot_row, " pin=", r.pin_node, " touch=", r.touch_node);
    }
  }
  return out;
}

// Whether `status` is RESOURCE_EXHAUSTED with `text` in its message.
bool ExhaustedWith(const absl::Status& status, const std::string& text) {
  return status.code() == absl::StatusCode::kResourceExhausted &&
         status.message().find(text) != std::string::npos;
}

// Microseconds per call of `fn`: the best of 7 batches of `iters` calls
// (the machine may be shared; the best batch is the least disturbed).
template <typename Fn>
double BestMicros(int iters, Fn fn) {
  double best = 1e300;
  for (int batch = 0; batch < 7; ++batch) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) fn(i);
    const double us = std::chrono::duration<double, std::micro>(
                          std::chrono::steady_clock::now() - t0)
                          .count() /
                      iters;
    best = std::min(best, us);
  }
  return best;
}

TEST(PrefixIndexTest, CreateValidatesConfig) {
  IndexConfig c = Config(16);
  c.hash_bytes = 20;
  EXPECT_EQ(PrefixIndex::Create(c).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_NE(PrefixIndex::Create(c).status().message().find("hash_bytes"),
            std::string::npos);
  c = Config(0);
  EXPECT_EQ(PrefixIndex::Create(c).status().code(),
            absl::StatusCode::kInvalidArgument);
  c = Config(16);
  c.tokens_per_page = 0;
  EXPECT_EQ(PrefixIndex::Create(c).status().code(),
            absl::StatusCode::kInvalidArgument);
  c = Config(16, 0, 0);
  EXPECT_EQ(PrefixIndex::Create(c).status().code(),
            absl::StatusCode::kInvalidArgument);
  c = Config(uint64_t{kNoRow});
  EXPECT_EQ(PrefixIndex::Create(c).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(PrefixIndex::Create(Config(16, 4, 8)).ok());
}

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
  EXPECT_EQ(*rest, (std::vector<uint32_t>{1, 3, 4, 5, 7}));
  EXPECT_EQ(index->GetUsage().evicted_pages, 0u);
  EXPECT_TRUE(index->CheckInvariants().ok()) << index->CheckInvariants();

  auto plain = Make(Config(8));
  EXPECT_EQ(plain->ClaimSnapshotRows(0, {0}).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(plain->ClaimSnapshotRows(0, {}).ok());
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

TEST(PrefixIndexTest, ClearDropsEverything) {
  auto index = Make(Config(16, 4, 2));
  Put(*index, 0, nullptr, Chain(1, 4), {3});
  Put(*index, 1, nullptr, Chain(1, 4), {3});
  ASSERT_EQ(index->Lookup(Chain(1, 4), 0).usable_pages, 4u);
  index->Pin(index->Lookup(Chain(1, 4), 0).pin_node);
  ASSERT_TRUE(index->AllocatePageRows(1, 2).ok());
  index->Clear();
  PrefixIndex::Usage u = index->GetUsage();
  EXPECT_EQ(u.nodes, 0u);
  EXPECT_EQ(u.pinned_nodes, 0u);
  EXPECT_EQ(u.free_page_rows, (std::vector<uint64_t>{16, 16}));
  EXPECT_EQ(u.allocated_page_rows, (std::vector<uint64_t>{0, 0}));
  EXPECT_EQ(u.free_snapshot_rows, (std::vector<uint64_t>{4, 4}));
  EXPECT_EQ(index->Lookup(Chain(1, 4), 0).matched_pages, 0u);
  EXPECT_TRUE(index->CheckInvariants().ok());
  Put(*index, 0, nullptr, Chain(2, 2));
  EXPECT_TRUE(index->CheckInvariants().ok());
}

// Random operations on a small TP-2 hybrid index, invariants after each, and
// every row Lookup returns is the one last committed for that page and rank;
// each allocation succeeds exactly when an outside count of free plus
// reclaimable rows allows it, and a refused one changes nothing.
TEST(PrefixIndexTest, RandomOperationsKeepInvariants) {
  auto index = Make(Config(48, 12, 2, false, 48));
  std::mt19937_64 rng(42);
  // Path (family, branch): the family's first 3 pages, then the branch's.
  auto path = [](uint64_t family, uint64_t branch, size_t n) {
    std::vector<HashKey> out;
    for (size_t i = 0; i < n; ++i) {
      out.push_back(i < 3 ? Key(family, i)
                          : Key(family * 16 + branch + 100, i));
    }
    return out;
  };
  absl::flat_hash_map<std::string, uint32_t> committed;  // key+rank -> row
  auto id = [](const HashKey& k, uint32_t rank) {
    return std::string(reinterpret_cast<const char*>(k.bytes.data()), 32) +
           static_cast<char>(rank);
  };
  std::vector<uint32_t> pins;
  // The most rows of `rank` an allocation may get, computed from the outside:
  // free plus committed rows of nodes neither pinned nor ancestors of a
  // pinned node (pages), or of unpinned nodes (snapshots).
  struct Capacity {
    uint64_t pages = 0, snapshots = 0;
  };
  auto capacity = [&](uint32_t rank) {
    struct Seen {
      uint32_t parent;
      bool page, snapshot;
    };
    absl::flat_hash_map<uint32_t, Seen> nodes;
    index->ForEachNode([&](const PrefixIndex::NodeView& v) {
      nodes[v.id] = {v.parent, v.page_rows[rank] != kNoRow,
                     v.snapshot_rows[rank] != kNoRow};
    });
    absl::flat_hash_map<uint32_t, bool> is_protected;
    for (uint32_t pin : pins) {
      for (uint32_t n = pin; n != kNoNode; n = nodes.at(n).parent) {
        is_protected[n] = true;
      }
    }
    PrefixIndex::Usage u = index->GetUsage();
    Capacity cap{u.free_page_rows[rank], u.free_snapshot_rows[rank]};
    for (const auto& [id, seen] : nodes) {
      if (seen.page && !is_protected.contains(id)) ++cap.pages;
      const bool pinned = std::find(pins.begin(), pins.end(), id) != pins.end();
      if (seen.snapshot && !pinned) ++cap.snapshots;
    }
    return cap;
  };
  // Checks an allocation's outcome against the capacity before it.
  auto check = [&](const absl::Status& status, const Capacity& cap,
                   uint64_t pages, uint64_t snapshots,
                   const std::string& before) {
    if (pages <= cap.pages && snapshots <= cap.snapshots) {
      EXPECT_TRUE(status.ok()) << status;
    } else {
      EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
      EXPECT_EQ(Describe(index->GetUsage()), before);
    }
  };
  int commits = 0, lookups_hit = 0, refused = 0;
  for (int step = 0; step < 4000; ++step) {
    const uint32_t rank = rng() % 2;
    const auto p = path(rng() % 3, rng() % 4, 2 + rng() % 10);
    const int op = rng() % 10;
    if (op < 4) {
      const size_t from = rng() % p.size();
      const size_t n = 1 + rng() % (p.size() - from);
      std::vector<HashKey> hashes(p.begin() + from, p.begin() + from + n);
      Capacity cap = capacity(rank);
      std::string before_alloc = Describe(index->GetUsage());
      auto rows = index->AllocatePageRows(rank, n);
      check(rows.status(), cap, n, 0, before_alloc);
      if (!rows.ok()) {
        ++refused;
        continue;
      }
      std::vector<PrefixIndex::SnapshotPlacement> snaps;
      std::vector<uint32_t> snap_rows;
      if (rng() % 2) {
        cap = capacity(rank);
        before_alloc = Describe(index->GetUsage());
        auto s = index->AllocateSnapshotRows(rank, 1);
        check(s.status(), cap, 0, 1, before_alloc);
        if (s.ok()) {
          snap_rows = *s;
          snaps.push_back({(*s)[0], hashes[rng() % n]});
        }
      }
      const std::string before = Describe(index->GetUsage());
      auto c = index->Commit(rank, from == 0 ? nullptr : &p[from - 1], hashes,
                             *rows, snaps);
      if (c.ok()) {
        ++commits;
        for (size_t i = 0; i < n; ++i) {
          if (std::find(c->freed_page_rows.begin(), c->freed_page_rows.end(),
                        (*rows)[i]) == c->freed_page_rows.end()) {
            committed[id(hashes[i], rank)] = (*rows)[i];
          }
        }
      } else {
        ASSERT_EQ(c.status().code(), absl::StatusCode::kFailedPrecondition)
            << c.status();
        ASSERT_EQ(Describe(index->GetUsage()), before);
        ASSERT_TRUE(index->FreePageRows(rank, *rows).ok());
        ASSERT_TRUE(index->FreeSnapshotRows(rank, snap_rows).ok());
      }
    } else if (op < 7) {
      LookupResult r = index->Lookup(p, rank);
      ASSERT_LE(r.usable_pages, r.matched_pages);
      ASSERT_EQ(r.rows.size(), r.usable_pages);
      for (size_t i = 0; i < r.rows.size(); ++i) {
        auto it = committed.find(id(p[i], rank));
        ASSERT_TRUE(it != committed.end());
        ASSERT_EQ(it->second, r.rows[i]) << "page " << i;
      }
      if (r.usable_pages > 0) ++lookups_hit;
      if (r.pin_node != kNoNode && rng() % 3 == 0) {
        index->Pin(r.pin_node);
        pins.push_back(r.pin_node);
      }
    } else if (op < 8 && pins.size() > 8) {  // Some pins stay held.
      const size_t k = rng() % pins.size();
      ASSERT_TRUE(index->Unpin(pins[k]).ok());
      pins.erase(pins.begin() + k);
    } else if (op < 9) {
      auto d = index->DropSubtree(p[rng() % p.size()]);
      ASSERT_TRUE(d.ok() || d.status().code() == absl::StatusCode::kNotFound ||
                  d.status().code() == absl::StatusCode::kFailedPrecondition)
          << d.status();
    } else {
      // Up to the whole bank: refused whenever pins protect too much.
      const uint32_t pages = 1 + rng() % 48;
      const uint32_t snapshots = rng() % 13;
      const Capacity cap = capacity(rank);
      const std::string before_alloc = Describe(index->GetUsage());
      auto rows = index->AllocateRows(rank, pages, snapshots);
      check(rows.status(), cap, pages, snapshots, before_alloc);
      if (rows.ok()) {
        ASSERT_TRUE(index->FreePageRows(rank, rows->page_rows).ok());
        ASSERT_TRUE(index->FreeSnapshotRows(rank, rows->snapshot_rows).ok());
      } else {
        ++refused;
      }
    }
    absl::Status s = index->CheckInvariants();
    ASSERT_TRUE(s.ok()) << "step " << step << ": " << s;
  }
  EXPECT_GT(commits, 100);
  EXPECT_GT(lookups_hit, 50);
  EXPECT_GT(refused, 10);
  for (uint32_t p : pins) ASSERT_TRUE(index->Unpin(p).ok());
  EXPECT_TRUE(index->CheckInvariants().ok());
}

TEST(PrefixIndexTest, MemoryPerPageAtOneMillionPages) {
  constexpr size_t kChains = 1000, kPages = 1000;
  auto index = Make(Config(kChains * kPages));
  std::vector<HashKey> chain(kPages);
  const auto start = std::chrono::steady_clock::now();
  for (size_t c = 0; c < kChains; ++c) {
    for (size_t i = 0; i < kPages; ++i) chain[i] = Key(c, i);
    auto rows = index->AllocatePageRows(0, kPages);
    ASSERT_TRUE(rows.ok()) << rows.status();
    auto r = index->Commit(0, nullptr, chain, *rows, {});
    ASSERT_TRUE(r.ok()) << r.status();
  }
  const double commit_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  PrefixIndex::Usage u = index->GetUsage();
  ASSERT_EQ(u.nodes, kChains * kPages);
  ASSERT_EQ(u.free_page_rows[0], 0u);
  const double per_page =
      static_cast<double>(index->MemoryBytes()) / (kChains * kPages);
  std::printf("[ memory ] %.1f bytes/page at %zu pages; commit %.0f pages/s\n",
              per_page, kChains * kPages, kChains * kPages / commit_s);
  EXPECT_LE(per_page, 128.0);
  ASSERT_TRUE(index->CheckInvariants().ok());

  // Lookup of a whole 1000-page chain, for orientation.
  std::vector<std::vector<HashKey>> queries;
  for (size_t c = 0; c < 16; ++c) queries.push_back(Chain(c * 61, kPages));
  uint64_t matched = 0;
  const double us = BestMicros(300, [&](int i) {
    matched += index->Lookup(queries[i % queries.size()], 0).matched_pages;
  });
  std::printf("[ lookup ] %zu hashes in a 1M-page index: %.2f us\n", kPages,
              us);
  EXPECT_EQ(matched, uint64_t{7 * 300} * kPages);
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
}  // namespace kvtier::daemon
