// PrefixIndex (daemon/prefix_index.h): introspection. GetUsage and the
// allocated-row listings (the journal's checkpoint records reservations),
// ListPrefixes (the operator's view of cached prefixes), ForEachNode (the
// checkpoint's walk, parents first) and MemoryBytes.
//
// Thread-safety: as the header says; everything here is const and only
// reads, so it may run alongside other const calls.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <queue>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "daemon/prefix_index.h"
#include "daemon/row_pool.h"

namespace kvtier::daemon {

std::vector<uint32_t> PrefixIndex::AllocatedPageRows(uint32_t rank) const {
  if (rank >= ranks_) return {};
  return pages_.RowsInState(rank, RowPool::kAllocated);
}

std::vector<uint32_t> PrefixIndex::AllocatedSnapshotRows(uint32_t rank) const {
  if (rank >= ranks_) return {};
  return snapshots_.RowsInState(rank, RowPool::kAllocated);
}

PrefixIndex::Usage PrefixIndex::GetUsage() const {
  Usage u;
  u.nodes = nodes_;
  u.leaves = leaves_;
  u.snapshots = snapshot_nodes_;
  {
    absl::MutexLock lock(&pin_mu_);
    u.pinned_nodes = pinned_.size();
    uint64_t pinned_leaves = 0;
    for (uint32_t id : pinned_) {
      if (N(id).first_child == kNoNode) ++pinned_leaves;
      u.pins += N(id).pins;
    }
    u.evictable_leaves = leaf_lru_.size() - pinned_leaves;
  }
  for (uint32_t r = 0; r < ranks_; ++r) {
    u.free_page_rows.push_back(pages_.free_rows(r));
    u.allocated_page_rows.push_back(pages_.allocated_rows(r));
    u.committed_page_rows.push_back(pages_.committed_rows(r));
    u.free_snapshot_rows.push_back(snapshots_.free_rows(r));
    u.allocated_snapshot_rows.push_back(snapshots_.allocated_rows(r));
    u.committed_snapshot_rows.push_back(snapshots_.committed_rows(r));
  }
  u.evicted_pages = evicted_pages_;
  u.evicted_snapshots = evicted_snapshots_;
  u.spacing_violations = spacing_violations_;
  u.evicted_incomplete_pages = evicted_incomplete_;
  return u;
}

std::vector<PrefixIndex::PrefixInfo> PrefixIndex::ListPrefixes(
    bool by_recent, size_t limit, uint64_t* total) const {
  if (total != nullptr) *total = leaves_;
  std::vector<uint32_t> chosen;
  if (by_recent) {
    for (auto a = leaf_lru_.rbegin();
         a != leaf_lru_.rend() && chosen.size() < limit; ++a) {
      chosen.push_back(a->second);
    }
  } else {
    // Longest first (ties: most recent first): a bounded min-heap.
    using Entry = std::tuple<uint32_t, uint64_t, uint32_t>;
    std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap;
    for (const auto& [tick, id] : leaf_lru_) {
      if (limit == 0) break;
      Entry e{N(id).depth, tick, id};
      if (heap.size() < limit) {
        heap.push(e);
      } else if (heap.top() < e) {
        heap.pop();
        heap.push(e);
      }
    }
    while (!heap.empty()) {
      chosen.push_back(std::get<2>(heap.top()));
      heap.pop();
    }
    std::reverse(chosen.begin(), chosen.end());
  }
  // Path aggregates (snapshots, pins), memoized: shared prefixes are walked
  // once.
  absl::flat_hash_map<uint32_t, std::pair<uint32_t, uint32_t>> memo;
  std::vector<uint32_t> path;
  std::vector<PrefixInfo> out;
  out.reserve(chosen.size());
  absl::MutexLock lock(&pin_mu_);  // Pin counts change under it.
  for (uint32_t leaf : chosen) {
    path.clear();
    std::pair<uint32_t, uint32_t> acc{0, 0};
    for (uint32_t a = leaf; a != kNoNode; a = N(a).parent) {
      if (auto it = memo.find(a); it != memo.end()) {
        acc = it->second;
        break;
      }
      path.push_back(a);
    }
    for (size_t i = path.size(); i-- > 0;) {
      const Node& n = N(path[i]);
      acc.first += n.snapshot_ranks != 0 ? 1 : 0;
      acc.second += n.pins;
      memo[path[i]] = acc;
    }
    const Node& n = N(leaf);
    PrefixInfo info;
    info.leaf = n.key;
    info.pages = n.depth + 1;
    info.snapshots = acc.first;
    info.last_use_tick = n.tick;
    info.last_use_unix_ms = n.unix_ms;
    info.pins = acc.second;
    out.push_back(info);
  }
  return out;
}

PrefixIndex::NodeView PrefixIndex::ViewOf(uint32_t id) const {
  const Node& n = N(id);
  NodeView view;
  view.id = id;
  view.parent = n.parent;
  view.depth = n.depth;
  view.key = &n.key;
  if (n.parent != kNoNode) view.parent_key = &N(n.parent).key;
  view.page_rows = absl::MakeConstSpan(node_pool_.PageRows(id), ranks_);
  if (hybrid_) {
    view.snapshot_rows =
        absl::MakeConstSpan(node_pool_.SnapshotRows(id), ranks_);
  }
  view.last_use_tick = n.tick;
  return view;
}

void PrefixIndex::ForEachNode(
    const std::function<void(const NodeView&)>& visit) const {
  // Pre-order from each first page: a parent is always visited before its
  // children, which is what a replay needs.
  std::vector<uint32_t> stack;
  for (uint32_t root = 0; root < node_pool_.end(); ++root) {
    if (!IsLive(root) || N(root).parent != kNoNode) continue;
    stack.push_back(root);
    while (!stack.empty()) {
      const uint32_t id = stack.back();
      stack.pop_back();
      const Node& n = N(id);
      visit(ViewOf(id));
      for (uint32_t c = n.first_child; c != kNoNode; c = N(c).next_sibling) {
        stack.push_back(c);
      }
    }
  }
}

size_t PrefixIndex::MemoryBytes() const {
  size_t pinned_bytes = 0;
  {
    absl::MutexLock lock(&pin_mu_);
    pinned_bytes = pinned_bytes_;
  }
  return sizeof(*this) + container_bytes_ + pinned_bytes +
         node_pool_.MemoryBytes() + pages_.MemoryBytes() +
         snapshots_.MemoryBytes();
}

}  // namespace kvtier::daemon
