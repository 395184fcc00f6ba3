// RowPool: one bank's rows (a namespace's page bank or its snapshot bank)
// across the namespace's stored ranks, for the prefix index
// (daemon/prefix_index.h). Each row of each rank is in exactly one state:
// free (in one of the rank's free runs), allocated-uncommitted (handed to a
// caller, who writes it and then commits or frees it) or committed (held by
// one index node; which node is the index's business). The pool keeps the
// states, the free runs and the per-rank counts consistent with each other;
// it never evicts or decides anything.
//
// Placement: a rank's free rows are kept as maximal runs of consecutive
// rows (coalesced as rows come back), and Take hands a request the fewest
// runs it can: the smallest run that holds it whole, else the longest runs
// first. The engine copies a reservation's pages to its host rows in order,
// and the copy engine moves a page whose host row follows the previous one
// much faster than one at a random row (issue 16: 92-94 % of the link
// against 85 % for 256 KiB pages beside a decode step; docs/benchmarks.md),
// so a reservation should not be scattered when the bank has runs to give.
// A LIFO free stack, the earlier policy, scattered them as the bank churned
// (python/bench/row_runs.py).
//
// Thread-safety: not thread-safe, and no lock of its own. It is a member of
// PrefixIndex and shares its contract: const members only read and may run
// concurrently with each other; the others need exclusive access.
#ifndef KVTIER_DAEMON_ROW_POOL_H_
#define KVTIER_DAEMON_ROW_POOL_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "absl/container/btree_map.h"
#include "absl/container/btree_set.h"
#include "absl/status/status.h"
#include "absl/types/span.h"
#include "daemon/counting_allocator.h"
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
  RowPool(const RowPool&) = delete;
  RowPool& operator=(const RowPool&) = delete;

  // Makes the pool `ranks` ranks of `rows_per_rank` rows each (0 for a bank
  // the namespace does not have), every row free: one run per rank, which
  // Take hands out from row 0 up.
  void Reset(uint32_t ranks, uint64_t rows_per_rank);

  uint64_t rows_per_rank() const { return rows_per_rank_; }
  // Per-rank counts. REQUIRES: rank is below Reset's `ranks`.
  uint64_t free_rows(uint32_t rank) const { return free_[rank].rows; }
  // How many runs the free rows of `rank` make. REQUIRES: as free_rows.
  size_t free_runs(uint32_t rank) const { return free_[rank].by_start.size(); }
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

  // Moves `n` free rows of `rank` to allocated-uncommitted and returns them:
  // the first rows of the smallest free run of at least `n` rows, lowest
  // such run first; else whole runs, longest (then lowest) first, and the
  // rest as above. Each run's rows ascend. O(runs used * log(free runs)).
  // REQUIRES: free_rows(rank) >= n.
  std::vector<uint32_t> Take(uint32_t rank, uint32_t n);

  // Returns allocated-uncommitted `rows` of `rank` to the free runs.
  // Validates first (INVALID_ARGUMENT naming rows[i] and the `bank`: out of
  // range, not allocated-uncommitted, listed twice); on error nothing
  // changes. REQUIRES: rank is below Reset's `ranks`.
  absl::Status Free(uint32_t rank, absl::Span<const uint32_t> rows,
                    const char* bank);
  // Moves the free `rows` of `rank` to allocated-uncommitted (the journal's
  // replay of a reservation). Validates as Free (out of range, not free,
  // listed twice). O(rows.size() * log(free runs)).
  absl::Status Claim(uint32_t rank, absl::Span<const uint32_t> rows,
                     const char* bank);

  // Single-row moves, unchecked. REQUIRES: the row is in the source state.
  // allocated -> committed.
  void CommitRow(uint32_t rank, uint32_t row) {
    state_[Slot(rank, row)] = kCommitted;
    --allocated_[rank];
    ++committed_[rank];
  }
  // allocated -> free. O(log(free runs)).
  void ReturnAllocated(uint32_t rank, uint32_t row) {
    AddFree(rank, row);
    --allocated_[rank];
  }
  // committed -> free. O(log(free runs)).
  void ReleaseCommitted(uint32_t rank, uint32_t row) {
    AddFree(rank, row);
    --committed_[rank];
  }

  // The rows of `rank` in state `wanted`, ascending; empty for a rank out of
  // range or an empty bank. O(rows per rank).
  std::vector<uint32_t> RowsInState(uint32_t rank, State wanted) const;

  // Checks the pool against `holder` (indexed by Slot: the node holding a
  // committed row, kNoNode for any other): the free runs are in range,
  // maximal (neither overlapping nor touching), indexed by length alike and
  // hold exactly the free rows; every state is valid; a row is committed
  // exactly when it has a holder; the counts match. INTERNAL naming the `bank`,
  // rank and row of the first violation. REQUIRES: holder.size() == slots().
  absl::Status Check(absl::Span<const uint32_t> holder, const char* bank) const;

  // Heap bytes held: the state table, the free runs and the counts.
  size_t MemoryBytes() const;

 private:
  using Run = std::pair<uint32_t, uint32_t>;  // (length, first row)
  using RunsByStart =
      absl::btree_map<uint32_t, uint32_t, std::less<uint32_t>,
                      CountingAllocator<std::pair<const uint32_t, uint32_t>>>;
  using RunsByLength =
      absl::btree_set<Run, std::less<Run>, CountingAllocator<Run>>;
  // One rank's free rows, as maximal runs, indexed twice.
  struct FreeRuns {
    explicit FreeRuns(size_t* bytes)
        : by_start(RunsByStart::allocator_type(bytes)),
          by_length(RunsByLength::allocator_type(bytes)) {}
    RunsByStart by_start;    // first row -> length
    RunsByLength by_length;  // (length, first row)
    uint64_t rows = 0;       // Sum of the lengths.
  };

  void InsertRun(FreeRuns& f, uint32_t start, uint32_t length);
  void EraseRun(FreeRuns& f, RunsByStart::iterator it);
  // Marks `row` free and adds it to the runs, joining its neighbours'.
  // REQUIRES: row is not free.
  void AddFree(uint32_t rank, uint32_t row);
  // Takes the free `row` out of its run. Leaves its state alone.
  void RemoveFree(uint32_t rank, uint32_t row);

  uint64_t rows_per_rank_ = 0;
  std::vector<uint8_t> state_;  // [Slot(rank, row)]
  // Bytes the runs' trees hold; on the heap so that it outlives any move of
  // free_ (the allocators point at it).
  std::unique_ptr<size_t> tree_bytes_ = std::make_unique<size_t>(0);
  std::vector<FreeRuns> free_;                   // Per rank.
  std::vector<uint64_t> allocated_, committed_;  // Per rank.
};

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_ROW_POOL_H_
