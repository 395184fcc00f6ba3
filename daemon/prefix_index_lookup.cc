// PrefixIndex (daemon/prefix_index.h): Lookup, split into Find (a binary
// search over the chain's hashes, verified by one walk up the matched path)
// and Touch (the recency update).
//
// Thread-safety: as the header says. Find and NodeHasKey only read, so
// several may run at once under the owner's shared lock; Lookup and Touch
// change recency and need exclusive access.
#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "absl/base/optimization.h"
#include "absl/types/span.h"
#include "daemon/prefix_index.h"

namespace kvtier::daemon {

PrefixIndex::LookupResult PrefixIndex::Lookup(absl::Span<const HashKey> hashes,
                                              uint32_t rank) {
  LookupResult result = Find(hashes, rank);
  if (result.touch_node != kNoNode) Touch(result.touch_node);
  return result;
}

void PrefixIndex::Touch(uint32_t node) {
  if (!IsLive(node)) return;
  Tick();
  SetRecency(node, tick_, now_ms_);
}

bool PrefixIndex::NodeHasKey(uint32_t node, const HashKey& key) const {
  return IsLive(node) && KeyEquals(N(node).key, key);
}

PrefixIndex::LookupResult PrefixIndex::Find(absl::Span<const HashKey> hashes,
                                            uint32_t rank) const {
  LookupResult result;
  if (rank >= tp_size_ || hashes.empty()) return result;
  const uint32_t r = ranks_ == 1 ? 0 : rank;
  const size_t n = std::min<size_t>(hashes.size(), kNoNode - 1);

  // Node of page k-1 when pages [0, k) are all present and complete, under
  // prefix-closure (verified below).
  auto probe = [&](size_t k) -> uint32_t {
    const uint32_t id = FindNode(hashes[k - 1]);
    if (id == kNoNode) return kNoNode;
    const Node& node = N(id);
    return Complete(node) && node.depth == k - 1 ? id : kNoNode;
  };
  size_t matched = 0;
  uint32_t deepest = kNoNode;
  if (uint32_t id = probe(n); id != kNoNode) {
    matched = n;
    deepest = id;
  } else {
    size_t lo = 0, hi = n - 1;
    while (lo < hi) {
      const size_t mid = lo + (hi - lo + 1) / 2;
      if (uint32_t id = probe(mid); id != kNoNode) {
        lo = mid;
        deepest = id;
      } else {
        hi = mid - 1;
      }
    }
    matched = lo;
  }

  // One walk up: collects rows, finds the deepest complete snapshot and checks
  // that node i's key is hashes[i].
  result.rows.resize(matched);
  uint32_t snapshot_node = kNoNode;
  bool verified = true;
  uint32_t id = deepest;
  // i < matched <= hashes.size(): index the data, sparing the hot loop the
  // span's bounds check (and the register it needs).
  const HashKey* const keys = hashes.data();
  for (size_t i = matched; i-- > 0;) {
    if (id == kNoNode || !KeyEquals(N(id).key, keys[i])) {
      verified = false;
      break;
    }
    const Node& node = N(id);
    result.rows[i] = PageRow(id, r);
    if (hybrid_ && snapshot_node == kNoNode && SnapshotComplete(node)) {
      snapshot_node = id;
    }
    // Chains committed at once sit at consecutive ids. Guessing id - 1 and
    // correcting on a branch (kept a branch by the empty asm) breaks the
    // load-to-load dependency through `parent`: the next node's loads start
    // before this one's parent field arrives.
    uint32_t next = id - 1;
    if (ABSL_PREDICT_FALSE(node.parent != next)) {
      asm volatile("");
      next = node.parent;
    }
    id = next;
  }
  if (verified && id != kNoNode) verified = false;
  if (!verified) {
    // The chain disagrees with the tree: scan it page by page.
    result.rows.clear();
    snapshot_node = kNoNode;
    matched = 0;
    deepest = kNoNode;
    for (size_t i = 0; i < n; ++i) {
      const uint32_t c = FindNode(hashes[i]);
      if (c == kNoNode) break;
      const Node& node = N(c);
      if (node.parent != deepest || !Complete(node)) break;
      result.rows.push_back(PageRow(c, r));
      if (hybrid_ && SnapshotComplete(node)) snapshot_node = c;
      deepest = c;
      matched = i + 1;
    }
  }

  result.matched_pages = static_cast<uint32_t>(matched);
  if (hybrid_) {
    if (snapshot_node != kNoNode) {
      result.usable_pages = N(snapshot_node).depth + 1;
      result.has_snapshot = true;
      result.snapshot_row = SnapshotRow(snapshot_node, r);
      result.pin_node = snapshot_node;
    }
    result.rows.resize(result.usable_pages);
  } else {
    result.usable_pages = result.matched_pages;
    result.pin_node = deepest;
  }
  result.touch_node = result.pin_node != kNoNode ? result.pin_node : deepest;
  return result;
}

}  // namespace kvtier::daemon
