// Helpers shared by PrefixIndex's test files (daemon/prefix_index_test_util.h).
//
// Thread-safety: single-threaded test code.
#include "daemon/prefix_index_test_util.h"

#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "daemon/prefix_index.h"
#include "gtest/gtest.h"

namespace kvtier::daemon::index_testing {

uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

HashKey Key(uint64_t chain, uint64_t page) {
  HashKey k;
  for (uint64_t w = 0; w < 4; ++w) {
    const uint64_t v = Mix(Mix(chain * 0x100000001b3ull + page) + w);
    std::memcpy(k.bytes.data() + 8 * w, &v, 8);
  }
  return k;
}

std::vector<HashKey> Chain(uint64_t chain, size_t n, size_t from) {
  std::vector<HashKey> out;
  for (size_t i = from; i < from + n; ++i) out.push_back(Key(chain, i));
  return out;
}

std::vector<HashKey> Concat(std::vector<HashKey> a,
                            const std::vector<HashKey>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

IndexConfig Config(uint64_t page_rows, uint64_t snapshot_rows, uint32_t tp_size,
                   bool replicated, uint32_t max_replay_tokens) {
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
      " violations=", u.spacing_violations,
      " incomplete=", u.evicted_incomplete_pages);
}

CommitResult Put(PrefixIndex& index, uint32_t rank, const HashKey* parent,
                 const std::vector<HashKey>& hashes,
                 const std::vector<size_t>& snap_at) {
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

std::vector<uint32_t> RowsOf(PrefixIndex& index,
                             const std::vector<HashKey>& hashes,
                             uint32_t rank) {
  return index.Lookup(hashes, rank).rows;
}

std::string Dump(const PrefixIndex& index,
                 const std::vector<std::vector<HashKey>>& chains,
                 uint32_t ranks) {
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

bool ExhaustedWith(const absl::Status& status, const std::string& text) {
  return status.code() == absl::StatusCode::kResourceExhausted &&
         status.message().find(text) != std::string::npos;
}

}  // namespace kvtier::daemon::index_testing
