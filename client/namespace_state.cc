// NamespaceState (client/namespace_state.h): re-attach, and the RPCs that
// end leases and reservations.
#include "client/namespace_state.h"

#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "client/cuda_host.h"
#include "client/outage.h"
#include "client/reference_stream.h"

namespace kvtier::client {

NamespaceState::~NamespaceState() {
  banks.reset();  // Unregisters from CUDA while conn is still held.
  // The session thread may drop the last reference while re-attaching;
  // ~Connection joins that thread, so the worker (which may end itself from
  // a task) lets the connection go instead.
  if (conn != nullptr &&
      std::this_thread::get_id() == conn->session_thread.get_id()) {
    Worker* worker = conn->worker.get();
    worker->Post([c = std::move(conn)] {});
  }
}

std::vector<BankSegmentInfo> BankSegments(const v1::AttachResponse& resp) {
  std::vector<BankSegmentInfo> banks;
  for (const auto& seg : resp.segments()) {
    banks.push_back({seg.bank(), seg.path(), seg.rows(), seg.row_bytes()});
  }
  return banks;
}

absl::Status NamespaceState::Unusable(absl::string_view what) {
  {
    absl::MutexLock lock(&mu);
    if (conn->alive.load() && !stale_reason.empty()) {
      return WithErrorReason(
          absl::UnavailableError(absl::StrCat(
              what, ": namespace '", name,
              "' could not be re-attached after the daemon restarted (",
              stale_reason, "); attach it again")),
          ErrorReason::kDaemonUnreachable);
    }
  }
  return Unreachable(what);
}

absl::Status NamespaceState::Reattach(uint64_t session_id) {
  v1::AttachRequest req = attach_request;
  req.set_session_id(session_id);
  v1::AttachResponse resp;
  if (absl::Status s = conn->CallAttach(req, &resp); !s.ok()) return s;
  if (absl::Status s = banks->Refresh(BankSegments(resp), conn->daemon_uid);
      !s.ok()) {
    return s;
  }
  id = resp.namespace_id();
  return absl::OkStatus();
}

absl::Status NamespaceState::ReleaseLease(uint64_t lease_epoch,
                                          uint64_t lease_id) {
  v1::ReleaseRequest req;
  uint64_t e = 0;
  if (!Fill(&req, &e) || e != lease_epoch) return absl::OkStatus();
  req.set_lease_id(lease_id);
  v1::ReleaseResponse resp;
  absl::Status s =
      conn->Call(fastpath::Method::kRelease, "Release", req, &resp);
  return !s.ok() && (OutageLike(s) || !Current(e)) ? absl::OkStatus() : s;
}

absl::Status NamespaceState::AbortReservation(uint64_t reservation_epoch,
                                              uint64_t reservation_id,
                                              bool fenced) {
  v1::AbortRequest req;
  uint64_t e = 0;
  if (!Fill(&req, &e) || e != reservation_epoch) return absl::OkStatus();
  req.set_reservation_id(reservation_id);
  req.set_fenced(fenced);
  v1::AbortResponse resp;
  absl::Status s = conn->Call(fastpath::Method::kAbort, "Abort", req, &resp);
  return !s.ok() && (OutageLike(s) || !Current(e)) ? absl::OkStatus() : s;
}

absl::StatusOr<CommitResult> NamespaceState::CommitReservation(
    uint64_t reservation_epoch, uint64_t reservation_id,
    std::string_view parent, std::string_view hashes,
    const std::vector<SnapshotPlacement>& snaps,
    const std::vector<SnapshotPlacement>& device_snaps,
    absl::Span<const uint32_t> token_ids) {
  v1::CommitRequest req;
  uint64_t e = 0;
  if (!Fill(&req, &e)) return Unusable("Commit");
  if (e != reservation_epoch) {
    return WithErrorReason(
        absl::UnavailableError(absl::StrCat(
            "Commit: reservation ", reservation_id,
            " belongs to a daemon session that ended (the daemon restarted): "
            "its rows are void; reserve again")),
        ErrorReason::kDaemonUnreachable);
  }
  req.set_reservation_id(reservation_id);
  req.set_parent_hash(std::string(parent));
  req.set_hashes(std::string(hashes));
  req.mutable_token_ids()->Assign(token_ids.begin(), token_ids.end());
  for (const auto& s : snaps) {
    auto* p = req.add_snapshots();
    p->set_index(s.index);
    p->set_hash(s.hash);
  }
  for (const auto& s : device_snaps) {
    auto* p = req.add_device_snapshots();
    p->set_index(s.index);
    p->set_hash(s.hash);
  }
  v1::CommitResponse resp;
  if (absl::Status s =
          conn->Call(fastpath::Method::kCommit, "Commit", req, &resp);
      !s.ok()) {
    if (OutageLike(s) || !Current(e)) return Unreachable("Commit");
    return s;
  }
  return CommitResult{resp.committed_pages(), resp.deduplicated_pages(),
                      resp.committed_snapshots(),
                      resp.deduplicated_snapshots()};
}

void NamespaceState::LeaseDone(uint64_t epoch, uint64_t lease_id,
                               uint64_t track) {
  const uint64_t hold = conn->tracker.Remove(track);
  if (Current(epoch)) {
    (void)ReleaseLease(epoch, lease_id);
  } else {
    conn->ReleaseHold(hold);
  }
}

void NamespaceState::ReservationDone(uint64_t epoch, uint64_t id,
                                     uint64_t track) {
  const uint64_t hold = conn->tracker.Remove(track);
  if (Current(epoch)) {
    (void)AbortReservation(epoch, id);
  } else {
    conn->ReleaseHold(hold);
  }
}

void NamespaceState::ReservationAbandoned(uint64_t epoch, uint64_t id,
                                          uint64_t track) {
  // Kept in the tracker for good: reported after every reconnection, so no
  // report ever says this process no longer holds the rows.
  conn->tracker.Abandon(track);
  if (Current(epoch)) (void)AbortReservation(epoch, id, /*fenced=*/true);
}

uint64_t NamespaceState::Track(uint64_t epoch, std::vector<uint32_t> page_rows,
                               std::vector<uint32_t> snapshot_rows,
                               std::string lease_hash) {
  FenceTracker::Item item;
  item.epoch = epoch;
  item.ns_name = name;
  item.tp_rank = tp_rank;
  item.page_rows = std::move(page_rows);
  item.snapshot_rows = std::move(snapshot_rows);
  item.lease_hash = std::move(lease_hash);
  return conn->tracker.Add(std::move(item));
}

void NamespaceState::After(void* stream,
                           std::function<void(absl::Status)> task) {
  if (ReferenceStream* rs = ReferenceStream::FromHandle(stream)) {
    rs->Enqueue([c = conn, t = std::move(task)]() mutable {
      c->worker->Post([t = std::move(t)] { t(absl::OkStatus()); });
    });
    return;
  }
  if (!CudaDevicePresent()) {
    conn->worker->Post([t = std::move(task)] { t(absl::OkStatus()); });
    return;
  }
  struct Hop {
    std::shared_ptr<Connection> conn;
    std::function<void(absl::Status)> task;
  };
  auto* hop = new Hop{conn, std::move(task)};
  absl::Status s = LaunchHostCallback(
      stream,
      +[](void* arg) {
        auto* h = static_cast<Hop*>(arg);
        h->conn->worker->Post(
            [t = std::move(h->task)] { t(absl::OkStatus()); });
        delete h;
      },
      hop);
  if (!s.ok()) {
    conn->worker->Post([t = std::move(hop->task), s] { t(s); });
    delete hop;
  }
}

}  // namespace kvtier::client
