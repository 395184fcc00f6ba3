// The namespace journal: what lets a restarted kvtierd find every prefix
// whose commit it acknowledged, and nothing it cannot vouch for.
//
// The banks live in named shared memory and outlive the daemon process; the
// index does not. So each namespace has an append-only journal file in the
// daemon's state folder ("ns.<name>.journal"): a header (the namespace's
// layout, bank sizes and every segment's path with the creation time stamped
// in its header, the segment's content nonce), then records, each framed as
//
//   u32 length of (type + payload) | u32 CRC-32C of (type + payload) |
//   u8 type | payload
//
// Records: a checkpoint of nodes (hash, parent, every rank's page and
// snapshot row), a reservation (the rows handed to an engine, or taken by
// the daemon itself to write), a commit (its outcome: each hash with the
// row that became visible, or "deduplicated"), a dropped subtree, and a
// release (rows of a reservation that went back to the free list with
// nothing writing them any more: the prefetch's rows past a refused
// value). The daemon appends with write(2) inside the namespace's critical
// section, before it answers: a commit is acknowledged only once its record
// is in the file, and a reservation's rows reach the engine only once the
// reservation is. The page cache keeps a written record through a crash of the
// daemon process; fsync per record (JournalOptions:: fsync) is for machine
// crashes, which banks in /dev/shm do not survive anyway.
//
// Evictions are not journaled: an evicted row's bytes stay what they were
// until something writes the row, and every writer — an engine, the
// prefetch (prefetch_job.cc), mirror adoption (tier_commit.cc) — writes
// only rows whose reservation record precedes the write (the record is in
// the file before the rows are handed out or copied into). Replay therefore
// applies records in order and, at each reservation, takes those rows (of
// that rank) from whatever node held them; a node evicted but never
// overwritten comes back with intact bytes, and a node left without any row
// goes with its subtree. Aborted reservations need no record either: their
// rows were never visible, and they stay outstanding (fenced at restart:
// an engine may still be writing them). A release record ends a
// reservation's hold on rows nothing writes any more, so a restart neither
// fences them nor gives them back to an older owner (the reservation record
// took them from it). A commit record carries its outcome, so a hash
// committed again after an unjournaled eviction lands on its new rows.
//
// A checkpoint is the header, the nodes, then one reservation record per
// stored rank holding the rows allocated and not yet committed (skipped when
// none; split in several records of that rank when very large), so that the
// reservations outstanding at a compaction stay known (see
// JournalContents::outstanding_page_rows). Replaying those records on rows
// that no node holds changes no node, so readers that predate them replay a
// checkpoint as before. Recovery writes a fresh checkpoint (temporary file,
// rename), which is also how the journal is compacted when it grows past a
// multiple of the live state.
//
// How a replay ends, when not at the end of the file:
//  - A torn tail, what a write(2) cut by a crash leaves (a prefix of the
//    last record): that record cannot be whole, since fewer bytes than its
//    frame are left or its length runs past the end of the file; or every
//    byte from its start to the end is zero (a tail the file system
//    extended but never wrote). What precedes it is a consistent state: it
//    is replayed, and JournalContents::stopped says where it ended.
//  - Corruption: a record wholly inside the file whose CRC does not match,
//    the last one included and whatever follows it (zeros too): a cut
//    record is short of its length, so a record that is all there was
//    damaged after it was written (a flipped bit, or a length field that
//    now frames other bytes); a length of 0 or over the limit; or a record
//    whose CRC matches but whose fields are bad (a count that cannot fit in
//    its payload, a row out of range, an unknown type), wherever it is: no
//    crash writes any of these. JournalContents::corrupt is set and the
//    records before it are still returned, but a corrupt journal cannot be
//    vouched for: a record lost in the middle may have handed out rows that
//    replay would serve, so the namespace must not be served from it
//    (TierCore::Recover does not).
// What stays ambiguous: a length field damaged so that its record runs past
// the end of the file (possible only within kMaxRecordBytes, 256 MiB, of
// the end) reads as a torn tail, since with no second copy of the length
// framing cannot tell it from a cut record. It is treated as one: the
// records after it are lost as a torn tail's would be, stopped names its
// offset, and recovery counts the journal as torn and warns. Conversely, a
// last record that a file system kept only in part, zeros standing for the
// rest of it, reads as corrupt unless the file ends before its length: only
// a machine crash leaves one, after which banks in /dev/shm are gone anyway
// (--corrupt_journal=empty then loses nothing).
// A header (first record) that cannot be read, torn or corrupt, is an error
// (DATA_LOSS naming the field). No count read from the file sizes an
// allocation before it is checked against the bytes that must hold it.
//
// The bytes of each record: journal_format.h. The writer: journal_writer.cc;
// the reader: journal_read.cc, replaying through journal_replay.h and
// journal_reservations.h.
//
// Thread-safety: a NamespaceJournal is not thread-safe; its owner (TierCore's
// namespace) holds it ABSL_GUARDED_BY the namespace's mutex, which also
// orders the records as the index's changes. The free functions are
// thread-safe.
#ifndef KVTIER_DAEMON_JOURNAL_H_
#define KVTIER_DAEMON_JOURNAL_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "daemon/prefix_index.h"
#include "kvtier/v1/tier.pb.h"

namespace kvtier::daemon {

// One segment as the journal knows it.
struct JournalSegment {
  std::string bank;  // BankSpec name, or "snapshot".
  uint32_t rank = 0;
  std::string path;
  // The segment header's created_unix_ns when the journal was written: a
  // segment recreated since (same path, other content) has another.
  uint64_t created_unix_ns = 0;
};

// What a journal's first record holds: enough to reopen the namespace.
struct JournalHeader {
  std::string name;
  v1::Layout layout;  // Normalized.
  uint64_t page_rows = 0;
  uint64_t snapshot_rows = 0;
  uint32_t max_replay_tokens = 0;
  std::vector<JournalSegment> segments;
};

struct JournalOptions {
  // fdatasync after every record and checkpoint (and fsync the folder after
  // a rename): survives a machine crash, at a disk flush per commit.
  bool fsync = false;
  // Compact when the records appended since the last checkpoint exceed
  // max(min_compact_bytes, compact_factor x the checkpoint's bytes).
  uint64_t min_compact_bytes = 64ull << 20;
  double compact_factor = 4.0;
};

// Returns "<state_dir>/ns.<name>.journal". REQUIRES: `name` is a valid
// namespace name (ValidateNamespaceName), so it is a safe file name.
std::string JournalPath(const std::string& state_dir, const std::string& name);

// Returns the namespace names that have a journal in `state_dir`, sorted,
// after removing temporary files a checkpoint killed part-way left there.
// NOT_FOUND when the folder does not exist.
absl::StatusOr<std::vector<std::string>> ListJournals(
    const std::string& state_dir);

class NamespaceJournal {
 public:
  // Writes a journal holding `header` and a checkpoint of `index` (its nodes
  // and its outstanding reservations) under a temporary name and renames it to
  // `path`, replacing any journal there, then keeps it open for appending.
  // INTERNAL (naming the path and errno) when the file cannot be written; the
  // old journal, if any, is then intact.
  static absl::StatusOr<std::unique_ptr<NamespaceJournal>> Create(
      const std::string& path, const JournalHeader& header,
      const PrefixIndex& index, const JournalOptions& options);

  NamespaceJournal(const NamespaceJournal&) = delete;
  NamespaceJournal& operator=(const NamespaceJournal&) = delete;
  ~NamespaceJournal();  // Closes the file; never removes it.

  // Records that `page_rows` and `snapshot_rows` of `rank` were handed out
  // for writing. On failure (INTERNAL) nothing of the record stays in the
  // file and the journal is broken() until the next Checkpoint.
  absl::Status AppendReserve(uint32_t rank,
                             absl::Span<const uint32_t> page_rows,
                             absl::Span<const uint32_t> snapshot_rows);
  // Records that `page_rows` and `snapshot_rows` of `rank`, handed out by an
  // earlier reservation record, went back to the free list and nothing
  // writes them any more. Same failure contract as AppendReserve (a failed
  // release leaves the rows outstanding: fenced after a restart, never
  // served).
  absl::Status AppendRelease(uint32_t rank,
                             absl::Span<const uint32_t> page_rows,
                             absl::Span<const uint32_t> snapshot_rows);
  // Records a commit's outcome for `rank`: hashes[i] holds rows[i], except
  // where rows[i] is in `freed_page_rows` (deduplicated: the hash already had
  // a row); likewise for the snapshot placements. `parent`: nullptr when
  // hashes[0] is a first page. Same failure contract as AppendReserve.
  absl::Status AppendCommit(
      uint32_t rank, const HashKey* parent, absl::Span<const HashKey> hashes,
      absl::Span<const uint32_t> rows,
      absl::Span<const PrefixIndex::SnapshotPlacement> snapshots,
      absl::Span<const uint32_t> freed_page_rows,
      absl::Span<const uint32_t> freed_snapshot_rows);
  // Records that the subtree under `hash` was dropped.
  absl::Status AppendDrop(const HashKey& hash);

  // Rewrites the journal as the header and a checkpoint of `index`: its
  // nodes, then per stored rank its allocated-uncommitted rows
  // (AllocatedPageRows / AllocatedSnapshotRows) as reservation records (atomic
  // rename; on failure the current file stays and the error is returned).
  // Abandons a pending checkpoint (below). Clears broken().
  absl::Status Checkpoint(const PrefixIndex& index);

  // The same checkpoint in three steps, so that its file I/O runs without
  // the lock that guards this journal and the index (TierNamespace::mu; a
  // large checkpoint's write and sync would stall every request of the
  // namespace, and whatever waits for its lock): StartCheckpoint (lock
  // held) encodes the header and a checkpoint of `index` in memory and,
  // from then on, keeps a copy of every record appended; WriteCheckpoint
  // (no lock: it touches only the Pending) writes those bytes to a
  // temporary file of their own and syncs it; FinishCheckpoint (lock held)
  // appends the records kept since the start and renames the file over the
  // journal. Until the rename the journal is the old file with every record,
  // so a crash at any point leaves a whole journal. At most one is pending:
  // StartCheckpoint returns nullptr while one is, or while broken(). A
  // failed append or a Checkpoint abandons it: FinishCheckpoint then
  // discards it (FAILED_PRECONDITION). A journal destroyed meanwhile (its
  // namespace dropped) must not be finished on: the caller checks it still
  // has it. The Pending holds a copy of the checkpoint (memory about 50
  // bytes per node).
  struct PendingCheckpoint;
  std::unique_ptr<PendingCheckpoint> StartCheckpoint(const PrefixIndex& index);
  static absl::Status WriteCheckpoint(PendingCheckpoint& pending);
  // With `retired_fd`, the replaced file's descriptor is handed back there
  // (-1: none) for the caller to close once it released its lock (closing
  // an unlinked file frees its blocks), instead of being closed here.
  absl::Status FinishCheckpoint(std::unique_ptr<PendingCheckpoint> pending,
                                int* retired_fd = nullptr);
  // Drops `pending` (its write failed): the journal stays the old file, and
  // another checkpoint may start.
  void DiscardCheckpoint(std::unique_ptr<PendingCheckpoint> pending);
  // True while a checkpoint started and is neither finished nor abandoned.
  bool checkpointing() const { return pending_ != nullptr; }
  // True when the records appended since the last checkpoint are past the
  // compaction threshold, or the journal is broken.
  bool NeedsCheckpoint() const;
  // True after a failed append: further appends fail until a Checkpoint
  // succeeds (a failed append may leave the file's end unreadable).
  bool broken() const { return broken_; }

  // Removes the journal file (the namespace was dropped) and closes it.
  absl::Status Remove();

  const std::string& path() const { return path_; }
  // Bytes in the file now, and of its last checkpoint.
  uint64_t bytes() const { return bytes_; }
  uint64_t checkpoint_bytes() const { return checkpoint_bytes_; }

 private:
  NamespaceJournal(std::string path, JournalHeader header,
                   const JournalOptions& options);
  // Frames `payload_` as a record of `type` and appends it.
  absl::Status Append(uint8_t type);
  // Marks the pending checkpoint abandoned and forgets it.
  void AbandonCheckpoint();
  // StartCheckpoint without its preconditions (Checkpoint's first step).
  std::unique_ptr<PendingCheckpoint> EncodeCheckpoint(const PrefixIndex& index);

  // Immutable after construction.
  const std::string path_;
  const JournalHeader header_;
  const JournalOptions options_;
  const uint32_t hash_bytes_;
  const uint32_t ranks_;
  const bool hybrid_;

  int fd_ = -1;
  uint64_t bytes_ = 0;
  uint64_t checkpoint_bytes_ = 0;
  bool broken_ = false;
  std::string payload_;  // Reused record buffer.
  std::string record_;
  PendingCheckpoint* pending_ = nullptr;  // Owned by whoever started it.
};

// A checkpoint between StartCheckpoint and FinishCheckpoint. Its owner (a
// background thread) holds it; `tail` and `abandoned` are touched only
// under the journal's lock, the rest only by WriteCheckpoint (no lock) and
// then FinishCheckpoint. The destructor closes and removes the temporary
// file unless it became the journal.
struct NamespaceJournal::PendingCheckpoint {
  PendingCheckpoint() = default;
  PendingCheckpoint(const PendingCheckpoint&) = delete;
  PendingCheckpoint& operator=(const PendingCheckpoint&) = delete;
  ~PendingCheckpoint();

  const NamespaceJournal* journal = nullptr;  // Which journal it is for.
  std::string tmp;                            // The temporary file's path.
  bool fsync = false;                         // JournalOptions::fsync.
  std::string head;  // Magic, header and checkpoint (WriteCheckpoint's).
  uint64_t head_bytes = 0;
  std::string tail;  // Records appended since the start.
  int fd = -1;       // The temporary file, once WriteCheckpoint opened it.
  bool renamed = false;
  bool abandoned = false;
};

// A journal read back and replayed: the header and the live nodes, parents
// before children.
struct JournalContents {
  JournalHeader header;
  uint32_t hash_bytes = 32;
  uint32_t ranks = 1;  // Stored ranks.
  // Node i: keys[i], parents[i] (an index below i, or kNoNode), and rank r's
  // rows at page_rows[i * ranks + r] / snapshot_rows[i * ranks + r] (kNoRow
  // where none; snapshot_rows is empty unless hybrid). seq[i] orders
  // recency: larger is more recent.
  std::vector<HashKey> keys;
  std::vector<uint32_t> parents;
  std::vector<uint32_t> page_rows;
  std::vector<uint32_t> snapshot_rows;
  std::vector<uint64_t> seq;

  // Per stored rank (`ranks` entries each; snapshot ones empty unless
  // hybrid), sorted ascending, unique: the rows reservation records handed
  // out that no commit record has consumed since (a commit consumes the
  // rows it made visible and, as far as the records tell, the rest of its
  // reservation: its deduplicated and unplaced rows). These are the rows an
  // engine may still have been writing when the daemon stopped: recovery
  // fences them. A row reserved again after an (unjournaled) abort simply
  // stays outstanding, and so do rows of a reservation the records cannot
  // match to its commit; a checkpoint (Checkpoint, Create) keeps only the
  // rows its index still has allocated-uncommitted. No node holds one.
  std::vector<std::vector<uint32_t>> outstanding_page_rows;
  std::vector<std::vector<uint32_t>> outstanding_snapshot_rows;

  uint64_t records = 0;      // Records replayed (header included).
  uint64_t valid_bytes = 0;  // File bytes up to the end of the last one.
  uint64_t file_bytes = 0;
  // Set when the replay stopped before the end of the file, at a torn tail
  // or at a corrupt record: which, why, and at which byte offset.
  std::string stopped;
  // The replay stopped at a corrupt record, not a torn tail (see the top of
  // this file): `stopped` says where. The nodes are what the records before
  // it say, but the journal cannot be vouched for: do not serve from it.
  bool corrupt = false;
  // Commit records that disagreed with the replayed state (a parent or a
  // deduplicated page missing) and were applied only up to that point. A
  // journal the daemon wrote has none.
  uint64_t inconsistent = 0;
};

// Reads and replays the journal at `path`. NOT_FOUND when absent; DATA_LOSS
// when even the header cannot be read (no magic, torn or corrupt first
// record, a field out of range or a count that cannot fit in the record,
// invalid layout), naming the field. A torn tail ends the replay with what
// precedes it, described in `stopped`; a corrupt record also sets `corrupt`.
// Memory stays within a small multiple of the file's size, whatever the
// header claims.
absl::StatusOr<JournalContents> ReadJournal(const std::string& path);

// Fills `index` (empty, created with the header's shape) with the replayed
// nodes: claims their rows, then commits them leaf path by leaf path in
// recency order, so the LRU order survives. A node whose parent lacks the
// rank's row is left out, with its subtree, for that rank. Returns the pages
// restored (node-rank pairs). An error (INTERNAL, from the index) leaves
// `index` partly filled: the caller clears it.
absl::StatusOr<uint64_t> RestoreIndex(const JournalContents& contents,
                                      PrefixIndex* index);

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_JOURNAL_H_
