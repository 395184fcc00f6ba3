// NodePool: storage for the prefix index's nodes (daemon/prefix_index.h).
// Nodes live in fixed chunks of 2^14, addressed by uint32 ids (chunk << 14 |
// slot) that stay valid until Clear, so the index's tree links, hash set and
// LRU sets hold 4-byte ids rather than pointers. Beside each chunk sit the
// nodes' per-rank page rows and (hybrid namespaces only) snapshot rows. A
// released id goes on a free list, chained through Node::next_sibling, and
// is handed out again before a fresh one. The pool knows nothing of the tree
// itself: linking, recency and row ownership are PrefixIndex's.
//
// Invariant the index keeps for it: a node is live exactly when page_ranks
// != 0, and a free node's rows are all kNoRow.
//
// Thread-safety: not thread-safe, and no lock of its own. It is a member of
// PrefixIndex and shares its contract: const members only read and may run
// concurrently with each other; the others need exclusive access.
#ifndef KVTIER_DAEMON_NODE_POOL_H_
#define KVTIER_DAEMON_NODE_POOL_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "daemon/prefix_index_types.h"

namespace kvtier::daemon {

class NodePool {
 public:
  // One page of a cached prefix. 80 bytes: most of the index's ~100 bytes of
  // RAM per page.
  struct Node {
    HashKey key;
    uint64_t tick;          // Last use (logical clock); LRU set keys use it.
    int64_t unix_ms;        // Wall clock of the same use.
    uint32_t parent;        // kNoNode for a first page.
    uint32_t first_child;   // Children form a doubly linked list.
    uint32_t next_sibling;  // On the free list: the next free node.
    uint32_t prev_sibling;
    uint32_t depth;  // Page index in the prefix.
    uint32_t pins;
    uint8_t page_ranks;      // Stored ranks holding a page row; 0 = free.
    uint8_t snapshot_ranks;  // Stored ranks holding a snapshot row.
  };

  // An empty pool for nodes of `ranks` stored ranks; `hybrid` gives every
  // node snapshot rows too.
  NodePool(uint32_t ranks, bool hybrid) : ranks_(ranks), hybrid_(hybrid) {}

  NodePool(const NodePool&) = delete;
  NodePool& operator=(const NodePool&) = delete;

  // Node and row access. REQUIRES: id < end(); SnapshotRow(s) also hybrid,
  // and rank below the pool's ranks.
  Node& node(uint32_t id) {
    return chunks_[id >> kChunkBits].nodes[id & kChunkMask];
  }
  const Node& node(uint32_t id) const {
    return chunks_[id >> kChunkBits].nodes[id & kChunkMask];
  }
  uint32_t& PageRow(uint32_t id, uint32_t rank) {
    return chunks_[id >> kChunkBits]
        .page_rows[(id & kChunkMask) * ranks_ + rank];
  }
  uint32_t PageRow(uint32_t id, uint32_t rank) const {
    return chunks_[id >> kChunkBits]
        .page_rows[(id & kChunkMask) * ranks_ + rank];
  }
  uint32_t& SnapshotRow(uint32_t id, uint32_t rank) {
    return chunks_[id >> kChunkBits]
        .snapshot_rows[(id & kChunkMask) * ranks_ + rank];
  }
  uint32_t SnapshotRow(uint32_t id, uint32_t rank) const {
    return chunks_[id >> kChunkBits]
        .snapshot_rows[(id & kChunkMask) * ranks_ + rank];
  }
  // The node's rows of every stored rank (ranks entries); SnapshotRows is
  // null unless hybrid.
  const uint32_t* PageRows(uint32_t id) const {
    return chunks_[id >> kChunkBits].page_rows.get() +
           (id & kChunkMask) * ranks_;
  }
  const uint32_t* SnapshotRows(uint32_t id) const {
    const Chunk& chunk = chunks_[id >> kChunkBits];
    return chunk.snapshot_rows == nullptr
               ? nullptr
               : chunk.snapshot_rows.get() + (id & kChunkMask) * ranks_;
  }

  // Whether `id` names a node in use: handed out and not released.
  bool IsLive(uint32_t id) const {
    return id < end_ && node(id).page_ranks != 0;
  }
  // Ids below it have been handed out: each is live or on the free list.
  uint32_t end() const { return end_; }

  // An id for a new node: the most recently released, else the next fresh
  // one (a new chunk every 2^14). Its rows are all kNoRow; its Node fields
  // are the caller's to set (page_ranks != 0 makes it live).
  uint32_t Allocate();
  // Puts `id` on the free list: page_ranks and pins 0, links cleared.
  // REQUIRES: a live id whose rows are all kNoRow (the caller released
  // them) and that no live node links to.
  void Release(uint32_t id);
  // Releases every node and returns every chunk.
  void Clear();

  // Checks the free list: each entry free and below end(), no loop, and
  // free + `live` == end(). INTERNAL naming the first violation.
  absl::Status CheckFreeList(uint64_t live) const;

  // Heap bytes held: chunks and their row arrays.
  size_t MemoryBytes() const;

 private:
  static constexpr uint32_t kChunkBits = 14;
  static constexpr uint32_t kChunkNodes = 1u << kChunkBits;
  static constexpr uint32_t kChunkMask = kChunkNodes - 1;

  // A fixed block of the pool; ids are chunk << kChunkBits | slot.
  struct Chunk {
    std::unique_ptr<Node[]> nodes;
    std::unique_ptr<uint32_t[]> page_rows;      // [slot * ranks + rank]
    std::unique_ptr<uint32_t[]> snapshot_rows;  // Same; null unless hybrid.
  };

  // Immutable after construction.
  const uint32_t ranks_;
  const bool hybrid_;

  std::vector<Chunk> chunks_;
  uint32_t end_ = 0;         // Ids below it are live or on the free list.
  uint32_t free_ = kNoNode;  // Head of the free list.
};

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_NODE_POOL_H_
