// RowPool: one bank's rows (a namespace's page bank or its snapshot bank)
// across the namespace's stored ranks, for the prefix index
// (daemon/prefix_index.h). Each row of each rank is in exactly one state:
// free (on the rank's free stack), allocated-uncommitted (handed to a caller,
// who writes it and then commits or frees it) or committed (held by one
// index node; which node is the index's business). The pool keeps the
// states, the free stacks and the per-rank counts consistent with each
// other; it never evicts or decides anything.
//
// Thread-safety: not thread-safe, and no lock of its own. It is a member of
// PrefixIndex and shares its contract: const members only read and may run
// concurrently with each other; the others need exclusive access.
#ifndef KVTIER_DAEMON_ROW_POOL_H_
#define KVTIER_DAEMON_ROW_POOL_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "daemon/prefix_index_types.h"

namespace kvtier::daemon {

class RowPool {
 public:
  enum State : uint8_t { kFree = 0, kAllocated = 1, kCommitted = 2 };

  // "free", "allocated-uncommitted", "committed", or "corrupt" for anything
  // else; for messages.
  static const char* StateName(uint8_t state);

  // No ranks and no rows until Reset.
  RowPool() = default;

  // Makes the pool `ranks` ranks of `rows_per_rank` rows each (0 for a bank
  // the namespace does not have), every row free, row 0 on top of each free
  // stack so that Take hands out the low rows first.
  void Reset(uint32_t ranks, uint64_t rows_per_rank);

  uint64_t rows_per_rank() const { return rows_per_rank_; }
  // Per-rank counts. REQUIRES: rank is below Reset's `ranks`.
  uint64_t free_rows(uint32_t rank) const { return free_[rank].size(); }
  uint64_t allocated_rows(uint32_t rank) const { return allocated_[rank]; }
  uint64_t committed_rows(uint32_t rank) const { return committed_[rank]; }

  // A dense index of (rank, row), below slots(): for tables kept beside the
  // pool (CheckInvariants' row holders). REQUIRES: row < rows_per_rank().
  size_t Slot(uint32_t rank, uint32_t row) const {
    return rank * rows_per_rank_ + row;
  }
  size_t slots() const { return state_.size(); }
  // The state of `row` of `rank`. REQUIRES: row < rows_per_rank().
  uint8_t state(uint32_t rank, uint32_t row) const {
    return state_[Slot(rank, row)];
  }

  // Pops `n` free rows of `rank` into allocated-uncommitted and returns them
  // in the order popped. REQUIRES: free_rows(rank) >= n.
  std::vector<uint32_t> Take(uint32_t rank, uint32_t n);

  // Returns allocated-uncommitted `rows` of `rank` to the free stack.
  // Validates first (INVALID_ARGUMENT naming rows[i] and the `bank`: out of
  // range, not allocated-uncommitted, listed twice); on error nothing
  // changes. REQUIRES: rank is below Reset's `ranks`.
  absl::Status Free(uint32_t rank, absl::Span<const uint32_t> rows,
                    const char* bank);
  // Moves the free `rows` of `rank` to allocated-uncommitted, keeping the
  // free stack's order of the rest. Validates as Free (out of range, not
  // free, listed twice). O(rows.size() + free rows of the rank).
  absl::Status Claim(uint32_t rank, absl::Span<const uint32_t> rows,
                     const char* bank);

  // Single-row moves, unchecked. REQUIRES: the row is in the source state.
  // allocated -> committed.
  void CommitRow(uint32_t rank, uint32_t row) {
    state_[Slot(rank, row)] = kCommitted;
    --allocated_[rank];
    ++committed_[rank];
  }
  // allocated -> free.
  void ReturnAllocated(uint32_t rank, uint32_t row) {
    state_[Slot(rank, row)] = kFree;
    free_[rank].push_back(row);
    --allocated_[rank];
  }
  // committed -> free.
  void ReleaseCommitted(uint32_t rank, uint32_t row) {
    state_[Slot(rank, row)] = kFree;
    free_[rank].push_back(row);
    --committed_[rank];
  }

  // The rows of `rank` in state `wanted`, ascending; empty for a rank out of
  // range or an empty bank. O(rows per rank).
  std::vector<uint32_t> RowsInState(uint32_t rank, State wanted) const;

  // Checks the pool against `holder` (indexed by Slot: the node holding a
  // committed row, kNoNode for any other): free stacks hold exactly the free
  // rows, once each; every state is valid; a row is committed exactly when
  // it has a holder; the counts match. INTERNAL naming the `bank`, rank and
  // row of the first violation. REQUIRES: holder.size() == slots().
  absl::Status Check(absl::Span<const uint32_t> holder, const char* bank) const;

  // Heap bytes held: the state table, the free stacks and the counts.
  size_t MemoryBytes() const;

 private:
  uint64_t rows_per_rank_ = 0;
  std::vector<uint8_t> state_;                   // [Slot(rank, row)]
  std::vector<std::vector<uint32_t>> free_;      // Per rank: a stack.
  std::vector<uint64_t> allocated_, committed_;  // Per rank.
};

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_ROW_POOL_H_
