// Replaying a namespace journal's records (daemon/journal.h): ReplayModel,
// the index as the records say it is, and RowOwners, who holds each row.
// ReadJournal (journal_read.cc) feeds it the records NextRecord frames
// (journal_format.h) and exports the result. Internal to the journal's
// reader, not its interface.
//
// Thread-safety: not thread-safe; one replay (one thread) owns a model.
#ifndef KVTIER_DAEMON_JOURNAL_REPLAY_H_
#define KVTIER_DAEMON_JOURNAL_REPLAY_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/hash/hash.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "daemon/journal.h"
#include "daemon/journal_format.h"
#include "daemon/journal_reservations.h"
#include "daemon/prefix_index.h"

namespace kvtier::daemon::journal_internal {

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

// Hashes and compares a HashKey by its first `hash_bytes` bytes.
struct KeyHash {
  uint32_t hash_bytes;
  size_t operator()(const HashKey& k) const {
    return absl::Hash<absl::string_view>{}(absl::string_view(
        reinterpret_cast<const char*>(k.bytes.data()), hash_bytes));
  }
};
struct KeyEq {
  bool operator()(const HashKey& a, const HashKey& b) const {
    return a.bytes == b.bytes;  // Bytes beyond hash_bytes are zero.
  }
};

// The index as the records say it is, without allocation or eviction:
// nodes, their rows, and who holds each row. Records whose effects disagree
// with it (which a consistent journal never has) are applied as far as
// they make sense and never leave a row held twice.
class ReplayModel {
 public:
  ReplayModel(const JournalHeader& h, uint32_t hash_bytes, uint32_t ranks,
              uint64_t file_bytes);

  // Applies the record of `type` whose payload `c` holds (its CRC
  // verified). Validates the whole payload before changing any node or row:
  // DATA_LOSS (naming the field) for a malformed one.
  absl::Status Apply(uint8_t type, Cursor& c);

  // Makes room for about `nodes` nodes (an estimate; any number works).
  void Reserve(size_t nodes);

  // Fills `out`'s nodes (live ones, parents before children), outstanding
  // reservations and inconsistent count; leaves its other fields.
  void Export(JournalContents* out) const;

 private:
  struct Node {
    HashKey key;
    uint32_t parent = kNoNode;
    uint32_t first_child = kNoNode;
    uint32_t next_sibling = kNoNode;
    uint32_t prev_sibling = kNoNode;
    uint64_t seq = 0;
    bool live = false;
  };

  bool PageRowOk(uint32_t row) const { return row < page_rows_; }
  bool SnapshotRowOk(uint32_t row) const {
    return hybrid_ && row < snapshot_rows_;
  }
  uint32_t PageOwner(uint32_t rank, uint32_t row) const {
    return page_owner_.Get(rank, row);
  }
  uint32_t SnapshotOwner(uint32_t rank, uint32_t row) const {
    return snapshot_owner_.Get(rank, row);
  }
  uint32_t& PageRow(uint32_t id, uint32_t rank) {
    return page_row_[uint64_t{id} * ranks_ + rank];
  }
  uint32_t& SnapshotRow(uint32_t id, uint32_t rank) {
    return snapshot_row_[uint64_t{id} * ranks_ + rank];
  }
  bool Live(uint32_t id) const {
    return id != kNoNode && id < nodes_.size() && nodes_[id].live;
  }
  uint32_t Find(const HashKey& key) const {
    auto it = by_key_.find(key);
    return it == by_key_.end() ? kNoNode : it->second;
  }

  uint32_t NewNode(const HashKey& key, uint32_t parent);

  // Frees every rank's snapshot row of `id` (as the index's snapshot
  // eviction does).
  void RemoveSnapshot(uint32_t id);

  // Takes rank `rank`'s page row (and snapshot row) from `id`: that row was
  // handed out again, so this copy of the node is stale for the rank. Other
  // ranks' rows stay (their bytes are intact until reserved themselves); a
  // node left with no page row goes, with its subtree, which no rank can
  // reach any more.
  void ClearPageRow(uint32_t id, uint32_t rank);

  void ClearSnapshotRow(uint32_t id, uint32_t rank);

  // Forgets `root` and everything below it, freeing their rows.
  void RemoveSubtree(uint32_t root);

  absl::Status ApplyNodes(Cursor& c);

  absl::Status ReadRows(Cursor& c, bool snapshot, std::vector<uint32_t>* rows);

  // Reads a kReserve or kRelease payload (`what` names it in errors).
  absl::Status ReadReserve(Cursor& c, const char* what, uint32_t* rank,
                           std::vector<uint32_t>* pages,
                           std::vector<uint32_t>* snaps);
  absl::Status ApplyReserve(Cursor& c);
  absl::Status ApplyRelease(Cursor& c);
  // Takes `rank`'s `pages` and `snaps` rows from whichever nodes hold them.
  void TakeRows(uint32_t rank, absl::Span<const uint32_t> pages,
                absl::Span<const uint32_t> snaps);

  absl::Status ApplyCommit(Cursor& c);

  absl::Status ApplyDrop(Cursor& c);

  const uint32_t hash_bytes_;
  const uint32_t ranks_;
  const bool hybrid_;
  const uint64_t page_rows_;
  const uint64_t snapshot_rows_;

  std::vector<Node> nodes_;
  std::vector<uint32_t> page_row_;      // [id * ranks + rank]
  std::vector<uint32_t> snapshot_row_;  // Same.
  std::vector<uint32_t> free_ids_;
  absl::flat_hash_map<HashKey, uint32_t, KeyHash, KeyEq> by_key_;
  RowOwners page_owner_;
  RowOwners snapshot_owner_;
  ReservationTracker reserved_;
  std::vector<uint32_t> checkpoint_ids_;  // Checkpoint ordinal -> id.
  // Still within what a checkpoint writes, and its last reservation's rank.
  bool in_checkpoint_ = true;
  int64_t checkpoint_rank_ = -1;
  uint64_t seq_ = 0;
  uint64_t inconsistent_ = 0;
};

}  // namespace kvtier::daemon::journal_internal

#endif  // KVTIER_DAEMON_JOURNAL_REPLAY_H_
