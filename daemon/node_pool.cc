// NodePool (daemon/node_pool.h): chunk growth, the free list and its check.
//
// Thread-safety: as the header says.
#include "daemon/node_pool.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace kvtier::daemon {

// Most of the ~100 bytes per page.
static_assert(sizeof(NodePool::Node) == 80);

uint32_t NodePool::Allocate() {
  if (free_ != kNoNode) {
    const uint32_t id = free_;
    free_ = node(id).next_sibling;
    return id;
  }
  if ((end_ >> kChunkBits) == chunks_.size()) {
    Chunk chunk;
    chunk.nodes = std::make_unique<Node[]>(kChunkNodes);
    chunk.page_rows = std::make_unique<uint32_t[]>(kChunkNodes * ranks_);
    std::fill_n(chunk.page_rows.get(), kChunkNodes * ranks_, kNoRow);
    if (hybrid_) {
      chunk.snapshot_rows = std::make_unique<uint32_t[]>(kChunkNodes * ranks_);
      std::fill_n(chunk.snapshot_rows.get(), kChunkNodes * ranks_, kNoRow);
    }
    chunks_.push_back(std::move(chunk));
  }
  return end_++;
}

void NodePool::Release(uint32_t id) {
  Node& n = node(id);
  n.page_ranks = 0;
  n.pins = 0;
  n.parent = kNoNode;
  n.first_child = kNoNode;
  n.prev_sibling = kNoNode;
  n.next_sibling = free_;
  free_ = id;
}

void NodePool::Clear() {
  chunks_.clear();
  chunks_.shrink_to_fit();
  end_ = 0;
  free_ = kNoNode;
}

absl::Status NodePool::CheckFreeList(uint64_t live) const {
  uint64_t free_count = 0;
  for (uint32_t id = free_; id != kNoNode; id = node(id).next_sibling) {
    if (id >= end_ || node(id).page_ranks != 0) {
      return absl::InternalError(absl::StrCat("free node list: node ", id,
                                              " is live or out of range"));
    }
    if (++free_count > end_) {
      return absl::InternalError("free node list loops");
    }
  }
  if (free_count + live != end_) {
    return absl::InternalError(absl::StrCat("node pool: ", free_count,
                                            " free + ", live, " live != ", end_,
                                            " used ids"));
  }
  return absl::OkStatus();
}

size_t NodePool::MemoryBytes() const {
  return chunks_.capacity() * sizeof(Chunk) +
         chunks_.size() * kChunkNodes *
             (sizeof(Node) + ranks_ * sizeof(uint32_t) * (hybrid_ ? 2 : 1));
}

}  // namespace kvtier::daemon
