// The handles of libkvtier's C++ layer that hold rows (kvtier/kvtier.hpp,
// which includes this file): Lease (a lookup's answer, pinned rows to read),
// Reservation (rows to write, then commit or abort) and PendingCommit (a
// commit queued behind a stream). Each is a move-only RAII owner of one kvt_*
// handle; Namespace (kvtier/kvtier.hpp) makes them. The device-pool parts
// (Lease::has_device_snapshot, Reservation::device_snapshot_rows, device
// placements at Commit) are the C ABI's device-snapshot calls; a namespace
// whose daemon has no device pools (kvtierd without --device_pool_bytes)
// never has any. Likewise Lease::remote_pages and prefetching_pages come
// from the cluster tier's remote lookup (kvt_lookup_remote) alone.
//
// Thread-safety: as the C ABI: a Lease, Reservation or PendingCommit is used
// by one thread at a time (different handles from different threads are
// fine). CommitResult and SnapshotPlacement are plain values.
#ifndef KVTIER_KVTIER_LEASE_HPP_
#define KVTIER_KVTIER_LEASE_HPP_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kvtier/kvtier.h"
#include "kvtier/kvtier_status.hpp"

namespace kvtier {

class DevicePool;
class Namespace;

struct CommitResult {
  uint32_t committed_pages = 0;
  uint32_t deduplicated_pages = 0;
  uint32_t committed_snapshots = 0;
  uint32_t deduplicated_snapshots = 0;
};

// Where a reserved snapshot row (or device pool slot) goes: the state after
// page `hash`.
struct SnapshotPlacement {
  // Into Reservation::snapshot_rows() (device_snapshot_rows() for a device
  // placement).
  uint32_t index = 0;
  std::string hash;  // hash_bytes long.
};

namespace internal {

inline void ReleaseLease(kvt_lease* l) { (void)kvt_lease_release(l, nullptr); }
inline CommitResult ToCommitResult(const kvt_commit_result& r) {
  return {r.committed_pages, r.deduplicated_pages, r.committed_snapshots,
          r.deduplicated_snapshots};
}
inline std::vector<kvt_snapshot_placement> ToC(
    const std::vector<SnapshotPlacement>& snaps) {
  std::vector<kvt_snapshot_placement> out;
  out.reserve(snaps.size());
  for (const auto& s : snaps) out.push_back({s.index, Bytes(s.hash)});
  return out;
}

}  // namespace internal

// The answer of a Lookup. When pinned, the rows stay valid until Release (or
// the destructor, which releases now).
class Lease {
 public:
  uint32_t matched_pages() const { return kvt_lease_matched_pages(h_.get()); }
  uint32_t usable_pages() const { return kvt_lease_usable_pages(h_.get()); }
  // usable_pages() rows, in chain order.
  Span<uint32_t> rows() const {
    return {kvt_lease_rows(h_.get()), usable_pages()};
  }
  bool has_snapshot() const { return kvt_lease_has_snapshot(h_.get()) != 0; }
  uint32_t snapshot_row() const { return kvt_lease_snapshot_row(h_.get()); }
  // From Namespace::LookupWithDevice: the lease's snapshot is also in the
  // device pool the lookup named, in slot device_snapshot_row() (pinned with
  // the lease): restore it device-to-device (DevicePool::Restore).
  bool has_device_snapshot() const {
    return kvt_lease_has_device_snapshot(h_.get()) != 0;
  }
  uint32_t device_snapshot_row() const {
    return kvt_lease_device_snapshot_row(h_.get());
  }
  // From Namespace::LookupRemote (0 for any other lookup): the pages past
  // matched_pages() that the daemon's cluster tier holds for every rank,
  // and those a running prefetch is bringing into the host tier (each
  // consecutive from matched_pages(); neither pinned nor in rows()).
  uint32_t remote_pages() const { return kvt_lease_remote_pages(h_.get()); }
  uint32_t prefetching_pages() const {
    return kvt_lease_prefetching_pages(h_.get());
  }

  // Releases the pin: now (stream null; REQUIRES the copies from the rows
  // to have finished), or once the work queued on `stream` so far has
  // finished, without blocking. The lease is empty afterwards.
  Status Release(void* stream = nullptr) {
    if (h_.get() == nullptr) return Status();
    return Status::FromC(kvt_lease_release(h_.release(), stream));
  }

 private:
  friend class DevicePool;
  friend class Namespace;
  explicit Lease(kvt_lease* h) : h_(h) {}
  internal::Handle<kvt_lease, internal::ReleaseLease> h_;
};

// The result of CommitAfter, to wait on.
class PendingCommit {
 public:
  // Waits (timeout_ms 0: until the commit ran). DEADLINE_EXCEEDED when
  // still pending: wait again. Otherwise the commit's outcome, and the
  // handle is spent.
  Result<CommitResult> Wait(uint32_t timeout_ms = 0) {
    if (h_.get() == nullptr) {
      return Status(StatusCode::kFailedPrecondition,
                    "pending commit: already waited for");
    }
    kvt_commit_result r{};
    const kvt_status s = kvt_pending_wait(h_.get(), timeout_ms, &r);
    if (s == KVT_DEADLINE_EXCEEDED) return Status::FromC(s);
    (void)h_.release();  // kvt_pending_wait freed it.
    if (s != KVT_OK) return Status::FromC(s);
    return internal::ToCommitResult(r);
  }

 private:
  friend class Reservation;
  explicit PendingCommit(kvt_pending_commit* h) : h_(h) {}
  internal::Handle<kvt_pending_commit, kvt_pending_free> h_;
};

// Rows reserved for writing; invisible until Commit. The destructor drops a
// reservation neither committed nor aborted (kvt_reservation_free: aborted,
// or fenced until the process exits where copies may be queued).
class Reservation {
 public:
  uint64_t id() const { return kvt_reservation_id(h_.get()); }
  Span<uint32_t> page_rows() const {
    return {kvt_reservation_page_rows(h_.get()),
            kvt_reservation_num_page_rows(h_.get())};
  }
  Span<uint32_t> snapshot_rows() const {
    return {kvt_reservation_snapshot_rows(h_.get()),
            kvt_reservation_num_snapshot_rows(h_.get())};
  }
  // The slots of the device pool named at Namespace::ReserveWithDevice
  // (empty for any other reservation).
  Span<uint32_t> device_snapshot_rows() const {
    return {kvt_reservation_device_snapshot_rows(h_.get()),
            kvt_reservation_num_device_snapshot_rows(h_.get())};
  }

  // The pages' token ids (tokens_per_page per page), sent with the commit
  // for the daemon's KV events only (kvt_reservation_set_token_ids).
  Status SetTokenIds(const std::vector<uint32_t>& token_ids) {
    return Status::FromC(kvt_reservation_set_token_ids(
        h_.get(), token_ids.data(), token_ids.size()));
  }

  // Makes the rows visible under `hashes` (one per page row, hash_bytes
  // each, packed) below `parent` (empty: first pages). REQUIRES: the rows
  // are fully written. `device_snaps` place device pool slots the way
  // `snaps` place snapshot rows (index into device_snapshot_rows(); the C
  // ABI's kvt_commit_with_device); a device slot is served only where the
  // host index holds the same snapshot. On success the reservation is
  // spent; on failure it stays open (retry, or Abort).
  Result<CommitResult> Commit(
      std::string_view parent, std::string_view hashes,
      const std::vector<SnapshotPlacement>& snaps = {},
      const std::vector<SnapshotPlacement>& device_snaps = {}) {
    size_t num_hashes = 0;
    if (Status s = internal::CountHashes(hashes, hash_bytes_, &num_hashes);
        !s.ok()) {
      return s;
    }
    const auto c = internal::ToC(snaps);
    kvt_commit_result r{};
    kvt_status s;
    if (device_snaps.empty()) {
      s = kvt_commit(h_.get(), internal::Bytes(parent), parent.size(),
                     internal::Bytes(hashes), num_hashes, c.data(), c.size(),
                     &r);
    } else {
      const auto d = internal::ToC(device_snaps);
      s = kvt_commit_with_device(h_.get(), internal::Bytes(parent),
                                 parent.size(), internal::Bytes(hashes),
                                 num_hashes, c.data(), c.size(), d.data(),
                                 d.size(), &r);
    }
    if (s != KVT_OK) return Status::FromC(s);
    (void)h_.release();  // kvt_commit (_with_device) freed it.
    return internal::ToCommitResult(r);
  }
  // Commits once the work queued on `stream` so far has finished, without
  // blocking; the reservation is spent once this returns OK. (No device
  // placements: the C ABI has no deferred kvt_commit_with_device.)
  Result<PendingCommit> CommitAfter(
      void* stream, std::string_view parent, std::string_view hashes,
      const std::vector<SnapshotPlacement>& snaps = {}) {
    size_t num_hashes = 0;
    if (Status s = internal::CountHashes(hashes, hash_bytes_, &num_hashes);
        !s.ok()) {
      return s;
    }
    const auto c = internal::ToC(snaps);
    kvt_pending_commit* p = nullptr;
    const kvt_status s = kvt_commit_after(
        h_.get(), stream, internal::Bytes(parent), parent.size(),
        internal::Bytes(hashes), num_hashes, c.data(), c.size(), &p);
    if (s != KVT_OK) return Status::FromC(s);
    (void)h_.release();  // kvt_commit_after freed it.
    return PendingCommit(p);
  }
  // Returns the rows: now (stream null; REQUIRES no queued work writes
  // them), or once the work queued on `stream` so far has finished. The
  // reservation is spent either way.
  Status Abort(void* stream = nullptr) {
    if (h_.get() == nullptr) return Status();
    return Status::FromC(kvt_abort_after(h_.release(), stream));
  }

 private:
  friend class Namespace;
  Reservation(kvt_reservation* h, uint32_t hash_bytes)
      : h_(h), hash_bytes_(hash_bytes) {}
  internal::Handle<kvt_reservation, kvt_reservation_free> h_;
  uint32_t hash_bytes_ = 0;
};

}  // namespace kvtier

#endif  // KVTIER_KVTIER_LEASE_HPP_
