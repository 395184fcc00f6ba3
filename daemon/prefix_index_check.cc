// PrefixIndex (daemon/prefix_index.h): CheckInvariants, the whole-index
// consistency check the tests run after every operation: per node (its
// record, tree links and depths, rows and their states with prefix-closed
// coverage, set membership), then the counters, the node pool's free list
// and both row pools. Each family of invariants is a step below, returning
// INTERNAL naming the first violation it finds.
//
// Thread-safety: as the header says; CheckInvariants is const and only
// reads.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "daemon/prefix_index.h"
#include "daemon/row_pool.h"

namespace kvtier::daemon {
namespace {

// The INTERNAL status naming a violation.
template <typename... Parts>
absl::Status Violation(const Parts&... parts) {
  return absl::InternalError(absl::StrCat(parts...));
}

}  // namespace

// The nodes' own count of what the counters and sets record, for
// CheckCounters.
struct PrefixIndex::NodeTally {
  // Counts a live node that passed the per-node checks.
  void Add(const Node& n) {
    ++live;
    if (n.first_child == kNoNode) ++childless;
    if (n.snapshot_ranks != 0) ++with_snapshot;
    if (n.pins != 0) ++pinned;
    in_leaf += InLeafSet(n) ? 1 : 0;
    in_snap += InSnapshotSet(n) ? 1 : 0;
  }

  uint64_t live = 0, childless = 0, with_snapshot = 0, in_leaf = 0, in_snap = 0,
           pinned = 0;
};

absl::Status PrefixIndex::CheckInvariants() const {
  absl::MutexLock lock(&pin_mu_);  // Pin counts and the pinned set.
  // The node holding each row slot, as the nodes say.
  std::vector<uint32_t> page_ref(pages_.slots(), kNoNode);
  std::vector<uint32_t> snap_ref(snapshots_.slots(), kNoNode);
  NodeTally tally;
  for (uint32_t id = 0; id < node_pool_.end(); ++id) {
    const Node& n = N(id);
    if (n.page_ranks == 0) continue;
    if (absl::Status s = CheckNodeRecord(id); !s.ok()) return s;
    if (absl::Status s = CheckNodeLinks(id); !s.ok()) return s;
    if (absl::Status s = CheckNodeRows(id, absl::MakeSpan(page_ref),
                                       absl::MakeSpan(snap_ref));
        !s.ok()) {
      return s;
    }
    if (absl::Status s = CheckNodeSets(id); !s.ok()) return s;
    tally.Add(n);
  }
  if (absl::Status s = CheckCounters(tally); !s.ok()) return s;
  if (absl::Status s = node_pool_.CheckFreeList(tally.live); !s.ok()) return s;
  if (absl::Status s = pages_.Check(page_ref, "page"); !s.ok()) return s;
  return snapshots_.Check(snap_ref, "snapshot");
}

absl::Status PrefixIndex::CheckNodeRecord(uint32_t id) const {
  const Node& n = N(id);
  if (n.page_ranks > ranks_ || n.snapshot_ranks > ranks_) {
    return Violation("node ", id, ": page_ranks ", n.page_ranks,
                     " / snapshot_ranks ", n.snapshot_ranks, " exceed ",
                     ranks_);
  }
  if (FindNode(n.key) != id) {
    return Violation("node ", id, ": its key does not find it in the hash set");
  }
  for (uint32_t b = hash_bytes_; b < 32; ++b) {
    if (n.key.bytes[b] != 0) {
      return Violation("node ", id, ": key byte ", b,
                       " beyond hash_bytes is set");
    }
  }
  return absl::OkStatus();
}

absl::Status PrefixIndex::CheckNodeLinks(uint32_t id) const {
  const Node& n = N(id);
  if (n.parent == kNoNode) {
    if (n.depth != 0 || n.prev_sibling != kNoNode ||
        n.next_sibling != kNoNode) {
      return Violation("node ", id, ": a first page with depth ", n.depth,
                       " or sibling links");
    }
  } else {
    if (!IsLive(n.parent)) {
      return Violation("node ", id, ": parent ", n.parent, " is not live");
    }
    const Node& p = N(n.parent);
    if (n.depth != p.depth + 1) {
      return Violation("node ", id, ": depth ", n.depth, " under parent depth ",
                       p.depth);
    }
    if (n.prev_sibling == kNoNode && p.first_child != id) {
      return Violation("node ", id,
                       ": no previous sibling but not its parent's "
                       "first child");
    }
  }
  uint32_t prev = kNoNode;
  uint64_t children = 0;
  for (uint32_t c = n.first_child; c != kNoNode; c = N(c).next_sibling) {
    if (!IsLive(c) || N(c).parent != id || N(c).prev_sibling != prev) {
      return Violation("node ", id, ": child ", c, " has inconsistent links");
    }
    if (++children > nodes_) {
      return Violation("node ", id, ": child list loops");
    }
    prev = c;
  }
  return absl::OkStatus();
}

absl::Status PrefixIndex::CheckNodeRows(uint32_t id,
                                        absl::Span<uint32_t> page_ref,
                                        absl::Span<uint32_t> snap_ref) const {
  const Node& n = N(id);
  uint32_t page_count = 0, snap_count = 0;
  for (uint32_t r = 0; r < ranks_; ++r) {
    const uint32_t row = PageRow(id, r);
    if (row != kNoRow) {
      ++page_count;
      if (row >= pages_.rows_per_rank()) {
        return Violation("node ", id, " rank ", r, ": page row ", row,
                         " out of range");
      }
      const size_t k = pages_.Slot(r, row);
      if (pages_.state(r, row) != RowPool::kCommitted) {
        return Violation("node ", id, " rank ", r, ": page row ", row, " is ",
                         RowPool::StateName(pages_.state(r, row)));
      }
      if (page_ref[k] != kNoNode) {
        return Violation("page row ", row, " of rank ", r, ": held by nodes ",
                         page_ref[k], " and ", id);
      }
      page_ref[k] = id;
      if (n.parent != kNoNode && PageRow(n.parent, r) == kNoRow) {
        return Violation("node ", id, " rank ", r,
                         ": has a page row its parent lacks");
      }
    }
    const uint32_t snap = hybrid_ ? SnapshotRow(id, r) : kNoRow;
    if (snap != kNoRow) {
      ++snap_count;
      if (snap >= snapshots_.rows_per_rank()) {
        return Violation("node ", id, " rank ", r, ": snapshot row ", snap,
                         " out of range");
      }
      const size_t k = snapshots_.Slot(r, snap);
      if (snapshots_.state(r, snap) != RowPool::kCommitted) {
        return Violation("node ", id, " rank ", r, ": snapshot row ", snap,
                         " is ", RowPool::StateName(snapshots_.state(r, snap)));
      }
      if (snap_ref[k] != kNoNode) {
        return Violation("snapshot row ", snap, " of rank ", r,
                         ": held by nodes ", snap_ref[k], " and ", id);
      }
      snap_ref[k] = id;
      if (row == kNoRow) {
        return Violation("node ", id, " rank ", r,
                         ": a snapshot without a page row");
      }
    }
  }
  if (page_count != n.page_ranks || snap_count != n.snapshot_ranks) {
    return Violation("node ", id, ": counts ", page_count, "/", snap_count,
                     " rows but records ", n.page_ranks, "/", n.snapshot_ranks);
  }
  return absl::OkStatus();
}

absl::Status PrefixIndex::CheckNodeSets(uint32_t id) const {
  const Node& n = N(id);
  if ((n.pins != 0) != pinned_.contains(id)) {
    return Violation("node ", id, ": pin set disagrees with ", n.pins, " pins");
  }
  if (InLeafSet(n) != leaf_lru_.contains({n.tick, id})) {
    return Violation("node ", id, ": leaf LRU membership is wrong");
  }
  if (InSnapshotSet(n) != snapshot_lru_.contains({n.tick, id})) {
    return Violation("node ", id, ": snapshot LRU membership is wrong");
  }
  return absl::OkStatus();
}

absl::Status PrefixIndex::CheckCounters(const NodeTally& tally) const {
  if (tally.live != nodes_ || by_key_.size() != nodes_) {
    return Violation("node count: ", tally.live, " live, ", nodes_,
                     " recorded, ", by_key_.size(), " in the hash set");
  }
  if (tally.childless != leaves_) {
    return Violation("leaf count: ", tally.childless, " childless, ", leaves_,
                     " recorded");
  }
  if (tally.with_snapshot != snapshot_nodes_) {
    return Violation("snapshot count: ", tally.with_snapshot, " nodes, ",
                     snapshot_nodes_, " recorded");
  }
  if (tally.in_leaf != leaf_lru_.size() ||
      tally.in_snap != snapshot_lru_.size() || tally.pinned != pinned_.size()) {
    return Violation("set sizes: leaf LRU ", leaf_lru_.size(), " vs ",
                     tally.in_leaf, ", snapshot LRU ", snapshot_lru_.size(),
                     " vs ", tally.in_snap, ", pins ", pinned_.size(), " vs ",
                     tally.pinned);
  }
  return absl::OkStatus();
}

}  // namespace kvtier::daemon
