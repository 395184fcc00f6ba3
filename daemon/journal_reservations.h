// ReservationTracker: which rows of each rank a replayed journal's
// reservation records handed out that no commit record has consumed since,
// the rows an engine may still have been writing when the daemon stopped
// (JournalContents::outstanding_page_rows; recovery fences them). Internal
// to the journal's reader (journal_replay.h), not its interface.
//
// Thread-safety: not thread-safe; one replay (one thread) owns each.
#ifndef KVTIER_DAEMON_JOURNAL_RESERVATIONS_H_
#define KVTIER_DAEMON_JOURNAL_RESERVATIONS_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/types/span.h"

namespace kvtier::daemon::journal_internal {

// The rows of each rank that kReserve records handed out and no kCommit
// record has consumed since (JournalContents::outstanding_page_rows).
//
// A commit record names the row each hash became visible in, but writes
// kNoRow for a deduplicated one (its row went back to the free list), so
// which reserved rows a commit consumed is inferred: a commit consumes its
// whole reservation (TierCore commits all of a reservation's page rows,
// rows[i] for hashes[i], and frees its unplaced snapshot rows), which is the
// reservation record now holding any row the commit names, when its page
// rows agree position by position. A commit naming no row (everything
// deduplicated) consumes the one reservation of its rank with as many page
// rows, when there is exactly one and no checkpoint record of the rank still
// holds rows (one of those may hide the commit's reservation). A record a
// checkpoint wrote merges every reservation of its rank: a commit matching
// it in size consumes its page rows (they are then exactly the commit's
// reservation's) but only the snapshot rows it names. Whatever cannot be
// matched stays outstanding: the inference errs only towards fencing a row
// that no engine writes any more, never the other way.
class ReservationTracker {
 public:
  explicit ReservationTracker(uint32_t ranks);

  // A kReserve record of `rank` (rows already validated). `merged`: the
  // record may be a checkpoint's, holding several reservations.
  void Reserve(uint32_t rank, absl::Span<const uint32_t> pages,
               absl::Span<const uint32_t> snapshots, bool merged);
  // A kCommit record of `rank`: page_rows[i] is hash i's row, or kNoRow
  // where it deduplicated; snapshot_rows likewise for the placements.
  void Commit(uint32_t rank, absl::Span<const uint32_t> page_rows,
              absl::Span<const uint32_t> snapshot_rows);
  // A kRelease record of `rank` (rows already validated): those rows went
  // back to the free list and nothing writes them any more, so they are
  // outstanding no longer, whichever reservation held them.
  void Released(uint32_t rank, absl::Span<const uint32_t> pages,
                absl::Span<const uint32_t> snapshots);

  bool HoldsPage(uint32_t rank, uint32_t row) const {
    return page_holder_[rank].contains(row);
  }
  bool HoldsSnapshot(uint32_t rank, uint32_t row) const {
    return snapshot_holder_[rank].contains(row);
  }

  // Per rank, the outstanding rows, sorted ascending.
  void Export(std::vector<std::vector<uint32_t>>* pages,
              std::vector<std::vector<uint32_t>>* snapshots) const;

 private:
  struct Reservation {
    uint32_t rank = 0;
    bool merged = false;
    bool open = true;   // Neither consumed nor partly handed out again.
    uint64_t held = 0;  // Its rows still outstanding.
    std::vector<uint32_t> pages, snapshots;
  };
  struct Rank {
    // Open, unmerged reservations by page-row count.
    absl::flat_hash_map<size_t, absl::flat_hash_set<uint32_t>> open_by_size;
    uint64_t merged_holding = 0;  // Merged reservations holding rows.
  };

  // Releases `row` (a page row, or a snapshot row when `snapshot`) of
  // `rank` when reservation `id` (kNoNode: any) holds it.
  void Release(uint32_t rank, uint32_t row, bool snapshot, uint32_t id);
  void Close(uint32_t id);
  // Releases all of `id`'s rows (its snapshot rows only where
  // `all_snapshots`, else the ones listed) and closes it.
  void Consume(uint32_t id, bool all_snapshots,
               absl::Span<const uint32_t> snapshot_rows);

  std::vector<Reservation> reservations_;  // By id, in record order.
  std::vector<Rank> ranks_;
  // Per rank: outstanding row -> the reservation holding it.
  std::vector<absl::flat_hash_map<uint32_t, uint32_t>> page_holder_;
  std::vector<absl::flat_hash_map<uint32_t, uint32_t>> snapshot_holder_;
};

}  // namespace kvtier::daemon::journal_internal

#endif  // KVTIER_DAEMON_JOURNAL_RESERVATIONS_H_
