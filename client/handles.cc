// Lease and Reservation (client/client.h): the RAII handles of a pin and of
// rows reserved for writing, and the session-end watch mirrors use.
//
// Thread-safety: a handle is used by one thread at a time; what it shares
// (NamespaceState, the tracker) is thread-safe. The *After calls hand their
// RPC to the worker thread.
#include <utility>

#include "absl/status/status.h"
#include "client/client.h"
#include "client/cuda_host.h"
#include "client/namespace_state.h"
#include "client/reference_stream.h"

namespace kvtier::client {

uint64_t WatchSessionEnd(const Reservation& r, std::function<void()> on_end) {
  if (r.ns_ == nullptr) {
    on_end();
    return 0;
  }
  Connection& c = *r.ns_->conn;
  {
    absl::MutexLock lock(&c.watch_mu);
    if (r.ns_->Current(r.epoch_)) {
      const uint64_t token = c.next_watch++;
      c.watches[token] = {r.epoch_, std::move(on_end)};
      return token;
    }
  }
  on_end();  // Ended already.
  return 0;
}

void UnwatchSessionEnd(const Reservation& r, uint64_t token) {
  if (r.ns_ == nullptr || token == 0) return;
  Connection& c = *r.ns_->conn;
  absl::MutexLock lock(&c.watch_mu);
  c.watches.erase(token);
}

Lease::Lease(Lease&& o) noexcept { *this = std::move(o); }

Lease& Lease::operator=(Lease&& o) noexcept {
  if (this != &o) {
    if (lease_id_ != 0) (void)Release();
    ns_ = std::move(o.ns_);
    lease_id_ = std::exchange(o.lease_id_, 0);
    track_ = std::exchange(o.track_, 0);
    epoch_ = o.epoch_;
    matched_pages_ = o.matched_pages_;
    usable_pages_ = o.usable_pages_;
    rows_ = std::move(o.rows_);
    has_snapshot_ = o.has_snapshot_;
    snapshot_row_ = o.snapshot_row_;
    has_device_snapshot_ = o.has_device_snapshot_;
    device_snapshot_row_ = o.device_snapshot_row_;
    remote_pages_ = o.remote_pages_;
    prefetching_pages_ = o.prefetching_pages_;
  }
  return *this;
}

Lease::~Lease() {
  if (lease_id_ != 0) (void)Release();
}

absl::Status Lease::Release() {
  if (lease_id_ == 0) return absl::OkStatus();
  const uint64_t id = std::exchange(lease_id_, 0);
  const uint64_t hold = ns_->conn->tracker.Remove(std::exchange(track_, 0));
  if (!ns_->Current(epoch_)) {
    ns_->conn->ReleaseHold(hold);  // An earlier session's fence hold.
    return absl::OkStatus();
  }
  return ns_->ReleaseLease(epoch_, id);
}

void Lease::Track(std::string_view hashes) {
  if (lease_id_ == 0 || usable_pages_ == 0) return;
  const size_t hb = ns_->hasher->hash_bytes();
  std::string last;
  if (hashes.size() >= usable_pages_ * hb) {
    last = std::string(hashes.substr((usable_pages_ - 1) * hb, hb));
  }
  std::vector<uint32_t> snaps;
  if (has_snapshot_) snaps.push_back(snapshot_row_);
  track_ = ns_->Track(epoch_, rows_, std::move(snaps), std::move(last));
}

void Lease::ReleaseAfter(void* stream) {
  if (lease_id_ == 0) return;
  const uint64_t id = std::exchange(lease_id_, 0);
  const uint64_t track = std::exchange(track_, 0);
  auto ns = ns_;
  // If the callback cannot be queued, the pin is kept (and fenced when the
  // session ends): unpinning rows a copy may still read would be worse.
  ns->After(stream, [ns, id, track, epoch = epoch_](absl::Status queued) {
    if (queued.ok()) ns->LeaseDone(epoch, id, track);
  });
}

Reservation::Reservation(Reservation&& o) noexcept { *this = std::move(o); }

Reservation& Reservation::operator=(Reservation&& o) noexcept {
  if (this != &o) {
    Drop();
    ns_ = std::move(o.ns_);
    id_ = std::exchange(o.id_, 0);
    track_ = std::exchange(o.track_, 0);
    epoch_ = o.epoch_;
    page_rows_ = std::move(o.page_rows_);
    snapshot_rows_ = std::move(o.snapshot_rows_);
    device_snapshot_rows_ = std::move(o.device_snapshot_rows_);
  }
  return *this;
}

Reservation::~Reservation() { Drop(); }

void Reservation::Drop() {
  if (id_ == 0) return;
  // Dropped without Commit or Abort: where copies into the rows may still be
  // queued (a GPU, a ReferenceStream), they stay fenced until the process
  // exits rather than go to another engine under the copies.
  if (CudaDevicePresent() || ReferenceStream::live_count() > 0) {
    ns_->ReservationAbandoned(epoch_, std::exchange(id_, 0),
                              std::exchange(track_, 0));
    return;
  }
  (void)Abort();
}

absl::StatusOr<CommitResult> Reservation::Commit(
    std::string_view parent_hash, std::string_view hashes,
    const std::vector<SnapshotPlacement>& snapshots,
    const std::vector<SnapshotPlacement>& device_snapshots) {
  if (id_ == 0) {
    return absl::FailedPreconditionError(
        "reservation: already committed or aborted");
  }
  auto result = ns_->CommitReservation(epoch_, id_, parent_hash, hashes,
                                       snapshots, device_snapshots, token_ids_);
  if (result.ok()) {
    id_ = 0;
    (void)ns_->conn->tracker.Remove(std::exchange(track_, 0));
  }
  return result;
}

std::future<absl::StatusOr<CommitResult>> Reservation::CommitAfter(
    void* stream, std::string parent_hash, std::string hashes,
    std::vector<SnapshotPlacement> snapshots) {
  auto promise = std::make_shared<std::promise<absl::StatusOr<CommitResult>>>();
  auto future = promise->get_future();
  if (id_ == 0) {
    promise->set_value(absl::FailedPreconditionError(
        "reservation: already committed or aborted"));
    return future;
  }
  const uint64_t id = std::exchange(id_, 0);
  const uint64_t track = std::exchange(track_, 0);
  auto ns = ns_;
  ns->After(stream, [ns, id, track, epoch = epoch_, promise,
                     parent = std::move(parent_hash), h = std::move(hashes),
                     s = std::move(snapshots),
                     tokens = std::move(token_ids_)](absl::Status queued) {
    if (!queued.ok()) {
      // The copies may still run: fence the rows rather than free them.
      ns->ReservationAbandoned(epoch, id, track);
      promise->set_value(queued);
      return;
    }
    auto result = ns->CommitReservation(epoch, id, parent, h, s, {}, tokens);
    if (result.ok()) {
      (void)ns->conn->tracker.Remove(track);
    } else {
      ns->ReservationDone(epoch, id, track);  // The copies are done.
    }
    promise->set_value(std::move(result));
  });
  return future;
}

uint32_t Reservation::hash_bytes() const {
  return ns_ == nullptr ? 0 : ns_->hasher->hash_bytes();
}

absl::Status Reservation::Abort() {
  if (id_ == 0) return absl::OkStatus();
  const uint64_t id = std::exchange(id_, 0);
  const uint64_t hold = ns_->conn->tracker.Remove(std::exchange(track_, 0));
  if (!ns_->Current(epoch_)) {
    ns_->conn->ReleaseHold(hold);  // An earlier session's fence hold.
    return absl::OkStatus();
  }
  return ns_->AbortReservation(epoch_, id);
}

void Reservation::AbortAfter(void* stream) {
  if (id_ == 0) return;
  const uint64_t id = std::exchange(id_, 0);
  const uint64_t track = std::exchange(track_, 0);
  auto ns = ns_;
  ns->After(stream, [ns, id, track, epoch = epoch_](absl::Status queued) {
    if (queued.ok()) {
      ns->ReservationDone(epoch, id, track);
    } else {
      ns->ReservationAbandoned(epoch, id, track);
    }
  });
}

}  // namespace kvtier::client
