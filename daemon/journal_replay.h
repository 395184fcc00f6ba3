// Internal pieces of the namespace journal's reader (daemon/journal.h),
// shared by journal.cc and journal_replay.cc: bounds-checked payload reads,
// the replay's row-owner tables and the tracking of outstanding
// reservations. Not part of the journal's interface.
#ifndef KVTIER_DAEMON_JOURNAL_REPLAY_H_
#define KVTIER_DAEMON_JOURNAL_REPLAY_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "daemon/prefix_index.h"

namespace kvtier::daemon::journal_internal {

// Bounds-checked reads from one record's payload. Any read past the end
// marks the cursor failed and yields zeros (or an empty view).
class Cursor {
 public:
  Cursor(const uint8_t* p, size_t n) : p_(p), n_(n) {}
  bool ok() const { return ok_; }
  bool done() const { return n_ == 0; }
  size_t left() const { return n_; }
  uint8_t U8() {
    uint8_t v = 0;
    Read(&v, 1);
    return v;
  }
  uint32_t U32() {
    uint32_t v = 0;
    Read(&v, 4);
    return v;
  }
  uint64_t U64() {
    uint64_t v = 0;
    Read(&v, 8);
    return v;
  }
  HashKey Hash(uint32_t hash_bytes) {
    HashKey k;
    Read(k.bytes.data(), hash_bytes);
    return k;
  }
  // The next `n` bytes, valid while the record's memory is.
  absl::string_view Bytes(size_t n) {
    if (!ok_ || n > n_) {
      ok_ = false;
      return {};
    }
    absl::string_view s(reinterpret_cast<const char*>(p_), n);
    p_ += n;
    n_ -= n;
    return s;
  }

 private:
  void Read(void* dst, size_t n) {
    if (!ok_ || n > n_) {
      ok_ = false;
      return;
    }
    std::memcpy(dst, p_, n);
    p_ += n;
    n_ -= n;
  }
  const uint8_t* p_;
  size_t n_;
  bool ok_ = true;
};

// Record framing: u32 length of (type + payload), u32 CRC-32C of them.
inline constexpr size_t kFrameBytes = 8;
// Larger records are corrupt: a commit of kMaxReservePages 32-byte hashes
// with rows is about 36 MiB.
inline constexpr uint32_t kMaxRecordBytes = 256u << 20;

enum class NextStatus { kRecord, kEnd, kTorn, kCorrupt };

// Reads the record framed at `*pos` of the file's `size` bytes at `data`.
// kRecord: its type and payload (CRC verified), `*pos` moved past it.
// kEnd: `*pos` is the end of the file. kTorn / kCorrupt (the rule at the top
// of daemon/journal.h): `*why` says why and at which offset; `*pos` stays.
NextStatus NextRecord(const uint8_t* data, size_t size, size_t* pos,
                      uint8_t* type, Cursor* payload, std::string* why);

// Reads a count (u32) of items of at least `item_bytes` bytes each, and
// checks that that many can fit in what is left of the record: DATA_LOSS
// naming `field` otherwise. Call it before sizing anything by the count.
absl::Status ReadCount(Cursor& c, size_t item_bytes, absl::string_view field,
                       uint32_t* count);

// Who holds each row of every rank (a node id, kNoNode for none). The
// header's row counts are bounded by no record, so the table is dense only
// while the file could name that many rows, and a hash map otherwise: its
// memory stays within a small multiple of the file's bytes either way.
class RowOwners {
 public:
  RowOwners(uint32_t ranks, uint64_t rows_per_rank, uint64_t file_bytes);
  uint32_t Get(uint32_t rank, uint32_t row) const {
    const uint64_t i = uint64_t{rank} * rows_ + row;
    if (!sparse_) return dense_[i];
    auto it = map_.find(i);
    return it == map_.end() ? kNoNode : it->second;
  }
  void Set(uint32_t rank, uint32_t row, uint32_t owner);

 private:
  const uint64_t rows_;
  const bool sparse_;
  std::vector<uint32_t> dense_;                  // [rank * rows + row]
  absl::flat_hash_map<uint64_t, uint32_t> map_;  // Same keys; kNoNode absent.
};

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

#endif  // KVTIER_DAEMON_JOURNAL_REPLAY_H_
