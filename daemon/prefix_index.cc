// PrefixIndex (daemon/prefix_index.h): construction, the tree's links and
// recency (node creation and removal, which keep the hash set, the LRU sets
// and the counters in step with the nodes), pins, DropSubtree and Clear.
// The rest is split by job: prefix_index_alloc.cc, prefix_index_evict.cc,
// prefix_index_lookup.cc, prefix_index_commit.cc, prefix_index_introspect.cc
// and prefix_index_check.cc.
//
// Thread-safety: as the header says; every function here but Create,
// Normalize, ValidateRank, Pin and Unpin changes the index and needs
// exclusive access; Pin and Unpin need the owner's lock shared, and take
// pin_mu_.
#include "daemon/prefix_index.h"

#include <cstring>
#include <memory>
#include <vector>

#include "absl/hash/hash.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace kvtier::daemon {

// ------------------------------------------------------- construction --

absl::StatusOr<std::unique_ptr<PrefixIndex>> PrefixIndex::Create(
    const IndexConfig& config) {
  if (config.hash_bytes != 16 && config.hash_bytes != 32) {
    return absl::InvalidArgumentError(
        absl::StrCat("hash_bytes: must be 16 or 32, got ", config.hash_bytes));
  }
  if (config.tokens_per_page == 0) {
    return absl::InvalidArgumentError("tokens_per_page: must be positive");
  }
  if (config.tp_size == 0 || config.tp_size > 255) {
    return absl::InvalidArgumentError(
        absl::StrCat("tp_size: must be 1..255, got ", config.tp_size));
  }
  if (config.page_rows == 0 || config.page_rows >= kNoRow) {
    return absl::InvalidArgumentError(absl::StrCat(
        "page_rows: must be 1..", kNoRow - 1, ", got ", config.page_rows));
  }
  if (config.snapshot_rows >= kNoRow) {
    return absl::InvalidArgumentError(absl::StrCat(
        "snapshot_rows: at most ", kNoRow - 1, ", got ", config.snapshot_rows));
  }
  return std::unique_ptr<PrefixIndex>(new PrefixIndex(config));
}

PrefixIndex::PrefixIndex(const IndexConfig& config)
    : hash_bytes_(config.hash_bytes),
      tokens_per_page_(config.tokens_per_page),
      tp_size_(config.tp_size),
      ranks_(config.replicated ? 1 : config.tp_size),
      hybrid_(config.snapshot_rows > 0),
      max_replay_tokens_(config.snapshot_rows > 0 ? config.max_replay_tokens
                                                  : 0),
      node_pool_(ranks_, hybrid_),
      by_key_(0, NodeHash{this}, NodeEq{this},
              CountingAllocator<uint32_t>(&container_bytes_)),
      leaf_lru_(LruSet::key_compare(),
                LruSet::allocator_type(&container_bytes_)),
      snapshot_lru_(LruSet::key_compare(),
                    LruSet::allocator_type(&container_bytes_)),
      pinned_(0, absl::Hash<uint32_t>(), std::equal_to<>(),
              CountingAllocator<uint32_t>(&pinned_bytes_)) {
  pages_.Reset(ranks_, config.page_rows);
  snapshots_.Reset(ranks_, config.snapshot_rows);
  incomplete_grace_ms_ = config.incomplete_grace_ms;
}

PrefixIndex::~PrefixIndex() = default;

// ------------------------------------------------------------- helpers --

HashKey PrefixIndex::Normalize(const HashKey& key) const {
  HashKey out;
  std::memcpy(out.bytes.data(), key.bytes.data(), hash_bytes_);
  return out;
}

void PrefixIndex::Tick() {
  ++tick_;
  now_ms_ = absl::ToUnixMillis(absl::Now());
}

absl::Status PrefixIndex::ValidateRank(uint32_t rank) const {
  if (rank >= ranks_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank: ", rank, " is not below the ", ranks_, " stored rank(s)",
        ranks_ == 1 && tp_size_ > 1 ? " (replicated: only rank 0 stores rows)"
                                    : ""));
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------- tree links --

uint32_t PrefixIndex::NewNode(const HashKey& key, uint32_t parent,
                              uint32_t rank, uint32_t row) {
  const uint32_t id = node_pool_.Allocate();
  Node& n = N(id);
  n.key = Normalize(key);
  n.tick = tick_;
  n.unix_ms = now_ms_;
  n.parent = parent;
  n.first_child = kNoNode;
  n.next_sibling = kNoNode;
  n.prev_sibling = kNoNode;
  n.depth = parent == kNoNode ? 0 : N(parent).depth + 1;
  n.pins = 0;
  n.page_ranks = 1;
  n.snapshot_ranks = 0;
  PageRow(id, rank) = row;
  if (parent != kNoNode) {
    Node& p = N(parent);
    if (p.first_child == kNoNode) {
      --leaves_;
      if (InLeafSet(p)) leaf_lru_.erase({p.tick, parent});
    } else {
      N(p.first_child).prev_sibling = id;
    }
    n.next_sibling = p.first_child;
    p.first_child = id;
  }
  by_key_.insert(id);
  leaf_lru_.insert({n.tick, id});
  ++nodes_;
  ++leaves_;
  return id;
}

void PrefixIndex::SetRecency(uint32_t id, uint64_t tick, int64_t unix_ms) {
  Node& n = N(id);
  if (n.tick != tick) {
    if (InLeafSet(n)) {
      leaf_lru_.erase({n.tick, id});
      leaf_lru_.insert({tick, id});
    }
    if (InSnapshotSet(n)) {
      snapshot_lru_.erase({n.tick, id});
      snapshot_lru_.insert({tick, id});
    }
    n.tick = tick;
  }
  n.unix_ms = unix_ms;
}

void PrefixIndex::RemoveSnapshot(uint32_t id) {
  Node& n = N(id);
  if (n.snapshot_ranks == 0) return;
  if (InSnapshotSet(n)) snapshot_lru_.erase({n.tick, id});
  for (uint32_t r = 0; r < ranks_; ++r) {
    uint32_t& row = SnapshotRow(id, r);
    if (row != kNoRow) {
      snapshots_.ReleaseCommitted(r, row);
      row = kNoRow;
    }
  }
  n.snapshot_ranks = 0;
  --snapshot_nodes_;
}

void PrefixIndex::RemoveLeaf(uint32_t id) {
  Node& n = N(id);
  if (removal_log_ != nullptr && Complete(n)) removal_log_->push_back(n.key);
  if (InLeafSet(n)) leaf_lru_.erase({n.tick, id});
  RemoveSnapshot(id);
  for (uint32_t r = 0; r < ranks_; ++r) {
    uint32_t& row = PageRow(id, r);
    if (row != kNoRow) {
      pages_.ReleaseCommitted(r, row);
      row = kNoRow;
    }
  }
  by_key_.erase(id);  // Hashes through the key: before the node is reused.
  const uint32_t parent = n.parent;
  if (parent != kNoNode) {
    Node& p = N(parent);
    const bool last_child = p.first_child == id && n.next_sibling == kNoNode;
    // An ancestor is as recent as its most recent descendant (Lookup touches
    // only the deepest node): it inherits the leaf's recency.
    if (last_child && n.tick > p.tick) SetRecency(parent, n.tick, n.unix_ms);
    if (n.prev_sibling != kNoNode) {
      N(n.prev_sibling).next_sibling = n.next_sibling;
    } else {
      p.first_child = n.next_sibling;
    }
    if (n.next_sibling != kNoNode) {
      N(n.next_sibling).prev_sibling = n.prev_sibling;
    }
    if (last_child) {
      ++leaves_;
      if (InLeafSet(p)) leaf_lru_.insert({p.tick, parent});
    }
  }
  --nodes_;
  --leaves_;
  node_pool_.Release(id);
}

// ---------------------------------------------------------------- pins --

void PrefixIndex::Pin(uint32_t node) {
  if (!IsLive(node)) return;
  absl::MutexLock lock(&pin_mu_);
  if (N(node).pins++ == 0) pinned_.insert(node);
}

absl::Status PrefixIndex::Unpin(uint32_t node) {
  absl::MutexLock lock(&pin_mu_);
  if (!IsLive(node) || N(node).pins == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("node: ", node, " is not a pinned node"));
  }
  if (--N(node).pins == 0) pinned_.erase(node);
  return absl::OkStatus();
}

// ------------------------------------------------------------- removal --

absl::StatusOr<PrefixIndex::DropResult> PrefixIndex::DropSubtree(
    const HashKey& hash) {
  const uint32_t root = FindNode(hash);
  if (root == kNoNode) {
    return absl::NotFoundError("hash: not in the index");
  }
  // Pre-order: a node's descendants follow it.
  std::vector<uint32_t> order = {root};
  uint64_t pinned = 0;
  for (size_t i = 0; i < order.size(); ++i) {
    const Node& n = N(order[i]);
    if (n.pins != 0) ++pinned;
    for (uint32_t c = n.first_child; c != kNoNode; c = N(c).next_sibling) {
      order.push_back(c);
    }
  }
  if (pinned != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("hash: ", pinned, " of the subtree's ", order.size(),
                     " nodes are pinned (leases in flight)"));
  }
  DropResult result;
  for (size_t i = order.size(); i-- > 0;) {
    ++result.pages;
    if (N(order[i]).snapshot_ranks != 0) ++result.snapshots;
    RemoveLeaf(order[i]);
  }
  return result;
}

void PrefixIndex::Clear() {
  node_pool_.Clear();
  by_key_ = NodeSet(0, NodeHash{this}, NodeEq{this},
                    CountingAllocator<uint32_t>(&container_bytes_));
  leaf_lru_.clear();
  snapshot_lru_.clear();
  {
    absl::MutexLock lock(&pin_mu_);
    pinned_ = IdSet(0, absl::Hash<uint32_t>(), std::equal_to<>(),
                    CountingAllocator<uint32_t>(&pinned_bytes_));
  }
  pages_.Reset(ranks_, pages_.rows_per_rank());
  snapshots_.Reset(ranks_, snapshots_.rows_per_rank());
  nodes_ = leaves_ = snapshot_nodes_ = 0;
}

}  // namespace kvtier::daemon
