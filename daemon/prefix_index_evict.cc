// PrefixIndex (daemon/prefix_index.h): eviction. Leaf-first LRU for page
// rows (a node never goes before its children, which keeps coverage
// prefix-closed), and for snapshot rows the spacing policy: redundant
// snapshots first, then plain LRU, counted as a spacing violation. Both
// pass over pinned nodes, which stay in the LRU sets. Only
// AllocateRows (prefix_index_alloc.cc) evicts, once it has decided that
// enough can be had.
//
// Thread-safety: as the header says. EvictLeavesFor, EvictSnapshotsFor,
// EvictLeaf and EvictSnapshot change the index (exclusive access);
// SnapshotRedundant only reads.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "daemon/prefix_index.h"

namespace kvtier::daemon {
namespace {

// EvictSnapshotsFor looks this far into the LRU for redundant snapshots.
constexpr size_t kRedundancyScan = 64;
// EvictIncompleteFor looks this far into the leaf LRU.
constexpr size_t kIncompleteScan = 256;
// A redundancy check giving up after this many descendants says "needed".
constexpr size_t kRedundancyVisits = 4096;

}  // namespace

void PrefixIndex::EvictIncompleteFor(uint32_t rank, uint32_t n) {
  if (ranks_ == 1) return;  // Every node is complete.
  const int64_t before = absl::ToUnixMillis(absl::Now()) - incomplete_grace_ms_;
  size_t scanned = 0;
  auto it = leaf_lru_.begin();
  while (pages_.free_rows(rank) < n && it != leaf_lru_.end() &&
         scanned++ < kIncompleteScan) {
    const auto key = *it;
    const Node& node = N(key.second);
    if (node.pins != 0 || Complete(node) ||
        PageRow(key.second, rank) == kNoRow || node.unix_ms > before) {
      ++it;
      continue;
    }
    EvictLeaf(key.second);
    // Its parent, left childless, re-enters no older than it: resume at its
    // recency so the parent (incomplete too, if the child was) is seen.
    it = leaf_lru_.lower_bound({key.first, 0});
  }
}

bool PrefixIndex::EvictLeavesFor(uint32_t rank, uint32_t n) {
  EvictIncompleteFor(rank, n);
  // Pinned leaves stay in the LRU and are passed over. A parent left
  // childless re-enters with a recency no older than its evicted child's, so
  // the walk resumes at that recency and the parent is not missed.
  auto it = leaf_lru_.begin();
  while (pages_.free_rows(rank) < n && it != leaf_lru_.end()) {
    const auto [tick, id] = *it;
    if (N(id).pins != 0) {  // Exclusive access: no Pin runs now.
      ++it;
      continue;
    }
    EvictLeaf(id);
    it = leaf_lru_.lower_bound({tick, 0});
  }
  return pages_.free_rows(rank) >= n;
}

bool PrefixIndex::EvictSnapshotsFor(uint32_t rank, uint32_t n) {
  // Only snapshots holding a row of `rank` help; the others are skipped.
  if (snapshots_.free_rows(rank) < n && max_replay_tokens_ > 0) {
    size_t scanned = 0;
    auto it = snapshot_lru_.begin();
    while (snapshots_.free_rows(rank) < n && it != snapshot_lru_.end() &&
           scanned < kRedundancyScan) {
      const auto key = *it;
      ++scanned;
      if (SnapshotRow(key.second, rank) == kNoRow || N(key.second).pins != 0) {
        ++it;
        continue;
      }
      if (SnapshotRedundant(key.second)) {
        EvictSnapshot(key.second);
        it = snapshot_lru_.upper_bound(key);
      } else {
        ++it;
      }
    }
  }
  auto it = snapshot_lru_.begin();
  while (snapshots_.free_rows(rank) < n && it != snapshot_lru_.end()) {
    const auto key = *it;
    if (SnapshotRow(key.second, rank) == kNoRow || N(key.second).pins != 0) {
      ++it;
      continue;
    }
    if (max_replay_tokens_ > 0 && !SnapshotRedundant(key.second)) {
      ++spacing_violations_;
    }
    EvictSnapshot(key.second);
    it = snapshot_lru_.upper_bound(key);
  }
  return snapshots_.free_rows(rank) >= n;
}

void PrefixIndex::EvictLeaf(uint32_t id) {
  ++evicted_pages_;
  if (!Complete(N(id))) ++evicted_incomplete_;
  if (N(id).snapshot_ranks != 0) ++evicted_snapshots_;
  if (eviction_observer_) {
    eviction_observer_(
        {ViewOf(id), Complete(N(id)), true, N(id).snapshot_ranks != 0});
  }
  RemoveLeaf(id);
}

void PrefixIndex::EvictSnapshot(uint32_t id) {
  ++evicted_snapshots_;
  if (eviction_observer_) {
    eviction_observer_({ViewOf(id), Complete(N(id)), false, true});
  }
  RemoveSnapshot(id);
}

bool PrefixIndex::SnapshotRedundant(uint32_t id) const {
  const uint64_t limit = max_replay_tokens_;
  const Node& n = N(id);
  const uint64_t pn = Position(n);
  // Nearest ancestor snapshot; stop once even it would leave too long a
  // replay up to n (a snapshot further up is further away).
  uint64_t pa = 0;
  for (uint32_t a = n.parent; a != kNoNode; a = N(a).parent) {
    const Node& an = N(a);
    if (SnapshotComplete(an)) {
      pa = Position(an);
      break;
    }
    if (pn - Position(an) >= limit) return false;
  }
  if (pn - pa > limit) return false;
  // Every downward path must reach a snapshot or its end within the limit.
  std::vector<uint32_t> stack;
  for (uint32_t c = n.first_child; c != kNoNode; c = N(c).next_sibling) {
    stack.push_back(c);
  }
  size_t visits = 0;
  while (!stack.empty()) {
    const uint32_t c = stack.back();
    stack.pop_back();
    if (++visits > kRedundancyVisits) return false;
    const Node& cn = N(c);
    if (Position(cn) - pa > limit) return false;
    if (SnapshotComplete(cn)) continue;
    for (uint32_t g = cn.first_child; g != kNoNode; g = N(g).next_sibling) {
      stack.push_back(g);
    }
  }
  return true;
}

}  // namespace kvtier::daemon
