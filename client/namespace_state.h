// NamespaceState: what a Namespace, and every Lease and Reservation made
// from it, share: the namespace's ids for the current session, its layout
// and hasher, its mapped banks, and the RPCs that release, abort and commit
// (which the handles call now, or from the worker once a stream's copies
// are done).
//
// Validity across sessions: the state is valid for the session of
// Connection::epoch == epoch. After a reconnection the session thread
// re-attaches it (Reattach) and moves epoch forward; a namespace whose
// re-attach failed keeps an older epoch and stays unusable, with the reason
// in stale_reason. A lease or reservation remembers the epoch it was made
// in: once that session has ended it is void (releasing or aborting it only
// frees its fence hold).
//
// Thread-safety: thread-safe. id and epoch are atomics written only by the
// thread that attaches (Client::Attach, then the session thread); everything
// else is immutable once the state is published, except stale_reason
// (guarded by mu) and the banks' registration (client/bank_mapping.h).
#ifndef KVTIER_CLIENT_NAMESPACE_STATE_H_
#define KVTIER_CLIENT_NAMESPACE_STATE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "client/bank_mapping.h"
#include "client/block_hash.h"
#include "client/client.h"
#include "client/connection.h"
#include "kvtier/v1/tier.pb.h"

namespace kvtier::client {

struct NamespaceState {
  ~NamespaceState();

  // Fills the request's session and namespace ids and returns the epoch
  // they belong to; false (nothing usable) while the daemon is unreachable
  // or this namespace is not attached to the current session.
  template <typename Req>
  bool Fill(Req* req, uint64_t* used_epoch) const {
    const uint64_t e = conn->epoch.load();
    if (!conn->alive.load() || epoch.load() != e) return false;
    req->set_api_version(1);
    req->set_session_id(conn->session_id.load());
    req->set_namespace_id(id.load());
    if (!conn->alive.load() || conn->epoch.load() != e) return false;
    *used_epoch = e;
    return true;
  }
  // True while the session of `e` is the current, open one.
  bool Current(uint64_t e) const {
    return conn->alive.load() && conn->epoch.load() == e;
  }
  // Reserve's and Commit's error while unusable: UNAVAILABLE (reason
  // kDaemonUnreachable), naming why a re-attach failed if one did.
  absl::Status Unusable(absl::string_view what);

  // Attaches to session `session_id` as the first Attach did and refreshes
  // the banks (MappedBanks::Refresh); sets id. Called by the session thread.
  absl::Status Reattach(uint64_t session_id);

  // Release and Abort of a lease or reservation of an ended session do
  // nothing: the daemon that held them is gone, and so are they.
  absl::Status ReleaseLease(uint64_t lease_epoch, uint64_t lease_id);
  // `fenced`: writes may still be queued; the daemon keeps the rows fenced
  // until this process exits.
  absl::Status AbortReservation(uint64_t reservation_epoch,
                                uint64_t reservation_id, bool fenced = false);
  // UNAVAILABLE (reason kDaemonUnreachable) during an outage or for a
  // reservation of an ended session.
  absl::StatusOr<CommitResult> CommitReservation(
      uint64_t reservation_epoch, uint64_t reservation_id,
      std::string_view parent, std::string_view hashes,
      const std::vector<SnapshotPlacement>& snaps,
      const std::vector<SnapshotPlacement>& device_snaps = {},
      absl::Span<const uint32_t> token_ids = {});

  // Releases the pin `lease_id` of session `epoch` if that is the current
  // session, else the fence hold tracked under `track`, once the lease's
  // work is done.
  void LeaseDone(uint64_t epoch, uint64_t lease_id, uint64_t track);
  // The same for a reservation whose writes are done: abort, or free its
  // hold.
  void ReservationDone(uint64_t epoch, uint64_t id, uint64_t track);
  // A reservation whose writes may still be queued, given up: the daemon
  // keeps its rows fenced until this process exits (an earlier session's
  // hold simply stays).
  void ReservationAbandoned(uint64_t epoch, uint64_t id, uint64_t track);
  // Hands a new lease or reservation to the tracker; returns its token.
  uint64_t Track(uint64_t epoch, std::vector<uint32_t> page_rows,
                 std::vector<uint32_t> snapshot_rows, std::string lease_hash);

  // Runs task(OkStatus()) on the worker once `stream`'s queued work has
  // finished; at once (on the worker) when the process has no device. A null
  // stream is CUDA's default stream, as everywhere in CUDA (torch uses it
  // unless told otherwise), so it is waited for like any other. When the
  // callback cannot be queued behind the stream, runs task(error) instead:
  // the task must then not make rows visible or unpin them.
  void After(void* stream, std::function<void(absl::Status)> task);

  std::shared_ptr<Connection> conn;
  // Valid for the session of Connection::epoch == epoch.
  std::atomic<uint64_t> id{0};
  std::atomic<uint64_t> epoch{0};

  // Immutable once published.
  v1::AttachRequest attach_request;  // Replayed at re-attach (session unset).
  std::string name;
  Layout layout;
  uint32_t tp_rank = 0;
  bool created = false;
  std::optional<BlockHasher> hasher;
  std::unique_ptr<MappedBanks> banks;
  double map_seconds = 0;
  double register_seconds = 0;
  // The daemon's device pools as the first Attach reported them, valid for
  // the session of device_epoch only.
  std::vector<DevicePoolInfo> device_pools;
  uint64_t device_epoch = 0;
  // The --namespace_acl entry governing the namespace, as the first Attach
  // reported it ("": none).
  std::string acl_entry;

  absl::Mutex mu;
  // Why the last re-attach failed (empty: it did not).
  std::string stale_reason ABSL_GUARDED_BY(mu);
};

// The banks of an AttachResponse, in its order.
std::vector<BankSegmentInfo> BankSegments(const v1::AttachResponse& resp);

}  // namespace kvtier::client

#endif  // KVTIER_CLIENT_NAMESPACE_STATE_H_
