// Connection: one Client's link to kvtierd over its engine socket
// (common/fast_lookup.h; no gRPC): the current session, held by a session
// connection, the session thread that reopens it when the daemon goes away,
// the call connections (client/engine_link.h), the worker thread for
// deferred calls, and what this process holds (the fence tracker).
//
// The session thread reads the session connection until it ends (the daemon
// stopped, died or restarted), then with backoff opens a new session,
// rebinds the call connections, re-attaches every live namespace (remapping
// recreated banks in place: client/bank_mapping.h) and reports what the
// process still holds (the fence), until it succeeds or the client closes.
//
// Session changes are published in this order: alive=false when the stream
// ends; then session_id, each namespace's id and epoch; then epoch; then
// alive=true. A request reads alive and epoch, then the ids, then alive and
// epoch again (NamespaceState::Fill), so it never mixes two sessions' ids.
//
// Thread-safety: thread-safe. Fields are grouped as immutable after
// Client::Connect, atomics, and guarded by a named mutex. Destroying the
// Connection (when the Client and its namespaces, leases and reservations
// are gone) runs the queued deferred work, says Goodbye, waits briefly for
// the daemon to close the session and joins the session thread.
#ifndef KVTIER_CLIENT_CONNECTION_H_
#define KVTIER_CLIENT_CONNECTION_H_

#include <sys/types.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/engine_link.h"
#include "client/fence_tracker.h"
#include "client/worker.h"
#include "common/fast_lookup.h"
#include "kvtier/v1/tier.pb.h"
#include "shm/trusted_path.h"

namespace kvtier::client {

struct NamespaceState;

// The least deadline an Attach gets (see Connection::AttachDeadline).
inline constexpr absl::Duration kAttachTimeout = absl::Minutes(2);

struct Connection {
  struct Session {
    int fd = -1;  // The session connection; the session ends with it.
    uint64_t id = 0;
  };

  ~Connection();

  // Opens a session (a session connection: Open, OpenReply) before
  // `deadline`, waiting for the daemon's socket while it is not there when
  // `wait_for_daemon`. UNAVAILABLE when the daemon does not answer, its
  // error when it refuses; CANCELLED once the connection is stopping.
  absl::StatusOr<Session> OpenSession(absl::Time deadline,
                                      bool wait_for_daemon);
  // The session thread: reads the session connection until it ends, then
  // reopens a session, rebinds the call connections and re-attaches the
  // namespaces, with backoff, until it succeeds or the connection stops.
  void KeepSession(Session session);
  // Re-attaches every live namespace to session `session_id` and marks it
  // valid for `next_epoch`; a namespace that fails stays stale.
  void ReattachAll(uint64_t session_id, uint64_t next_epoch);
  // Forgets session connection `fd` (of a session that failed to start) and
  // closes it: ~Connection must not say Goodbye on a number the kernel may
  // have handed to someone else.
  void AbandonSession(int fd);
  // Reports what the tracker holds from sessions before `next_epoch` to the
  // new session (Fence, report_complete) and keeps the holds it answers.
  void ReportHeld(uint64_t session_id, uint64_t next_epoch);
  // Frees a fence hold of the current session (best effort: a hold whose
  // release is lost is freed by the next report or the process's exit).
  void ReleaseHold(uint64_t hold);
  // Runs and forgets the session-end callbacks of sessions up to `ended`,
  // under watch_mu, so that UnwatchSessionEnd returning means the callback
  // is not running and never will (callbacks are short: set a flag).
  void SessionEnded(uint64_t ended);

  // Runs call `method` (v1.<what>Request -> v1.<what>Response) for the
  // session `request` names, within the per-call timeout:
  // client/engine_link.h.
  template <typename Request>
  absl::Status Call(fastpath::Method method, absl::string_view what,
                    const Request& request,
                    google::protobuf::MessageLite* response) {
    return link.Call(request.session_id(), method, what, request, response,
                     timeout);
  }
  // Attach may create a namespace, which populates its banks (seconds per
  // GiB on 4 KiB pages): it gets at least kAttachTimeout, whatever the
  // per-call timeout, so a short deadline for lookups never fails it.
  absl::Status CallAttach(const v1::AttachRequest& request,
                          v1::AttachResponse* response) {
    return link.Call(request.session_id(), fastpath::Method::kAttach, "Attach",
                     request, response, std::max(timeout, kAttachTimeout));
  }

  // Immutable after Client::Connect.
  std::string socket;         // kvtierd's main (gRPC) socket.
  std::string engine_socket;  // <socket>.lookup: what this client speaks.
  // The socket's owner (shm::CheckDaemonSocket): every segment mapped must
  // be this uid's, so a file planted under a bank's name is never mapped.
  uid_t daemon_uid = shm::kAnyOwner;
  absl::Duration timeout;
  std::string client_name;
  std::string instance_id;     // 16 bytes (fence protocol).
  uint64_t connection_id = 0;  // Random, non-zero, for the whole Client.
  // Lookups as binary frames (else as Lookup calls, as LookupWithDevice).
  bool fast_lookup = true;
  bool reconnect = true;
  std::thread session_thread;

  std::atomic<uint64_t> session_id{0};
  // Sessions opened so far: 1 after Connect, +1 per reconnection.
  std::atomic<uint64_t> epoch{0};
  std::atomic<bool> alive{false};

  // Thread-safe members.
  std::unique_ptr<Worker> worker = std::make_unique<Worker>();
  // What this process holds, to report after a reconnection.
  FenceTracker tracker;
  // The call connections of the current session.
  EngineLink link;

  // Callbacks for the end of a session (WatchSessionEnd): token ->
  // (epoch, callback).
  absl::Mutex watch_mu;
  uint64_t next_watch ABSL_GUARDED_BY(watch_mu) = 1;
  absl::flat_hash_map<uint64_t, std::pair<uint64_t, std::function<void()>>>
      watches ABSL_GUARDED_BY(watch_mu);

  absl::Mutex mu;
  bool stopping ABSL_GUARDED_BY(mu) = false;
  // The open session's connection, for ~Connection's Goodbye and shutdown
  // (never closed but by the session thread, under mu); -1 when none.
  int session_fd ABSL_GUARDED_BY(mu) = -1;
  // The namespaces to re-attach after a reconnection.
  std::vector<std::weak_ptr<NamespaceState>> namespaces ABSL_GUARDED_BY(mu);
};

}  // namespace kvtier::client

#endif  // KVTIER_CLIENT_CONNECTION_H_
