// TierService: the gRPC adapter over TierCore (callback API).
//
// Unary handlers run TierCore's method inline on the gRPC callback thread and
// finish at once: no thread hand-off on the lookup path. The Session stream
// opens a TierCore session on Hello and closes it when the stream ends for
// any reason (client exit, client killed, connection lost, server shutdown),
// so a dead engine's pins and reservations are released at once.
//
// Thread-safety: thread-safe; gRPC calls it from many threads.
#ifndef KVTIER_DAEMON_TIER_SERVICE_H_
#define KVTIER_DAEMON_TIER_SERVICE_H_

#include <string>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "daemon/tier_core.h"
#include "kvtier/v1/tier.grpc.pb.h"

namespace kvtier::daemon {

// What the service needs of an open Session stream at shutdown.
class SessionDrainer {
 public:
  virtual ~SessionDrainer() = default;
  // Sends the Draining event (once; after Opened if that is still being
  // written). Thread-safe.
  virtual void SendDraining() = 0;
};

class TierService final : public v1::TierService::CallbackService {
 public:
  // REQUIRES: `core` outlives this service. `fast_lookup_socket` is
  // announced to each session (empty: no fast path). `operator_socket`:
  // this service answers the operator socket (<socket>.admin), whose
  // callers have every right (tier_core.h, Caller); the engine socket's
  // Drop, Stats, ListNamespaces, ListPrefixes and Verify act only within
  // the caller's rights.
  explicit TierService(TierCore* core, std::string fast_lookup_socket = "",
                       bool operator_socket = false)
      : core_(core),
        fast_lookup_socket_(std::move(fast_lookup_socket)),
        operator_socket_(operator_socket) {}

  grpc::ServerBidiReactor<v1::SessionRequest, v1::SessionEvent>* Session(
      grpc::CallbackServerContext* context) override;
  grpc::ServerUnaryReactor* Attach(grpc::CallbackServerContext* context,
                                   const v1::AttachRequest* request,
                                   v1::AttachResponse* response) override;
  grpc::ServerUnaryReactor* Lookup(grpc::CallbackServerContext* context,
                                   const v1::LookupRequest* request,
                                   v1::LookupResponse* response) override;
  grpc::ServerUnaryReactor* Reserve(grpc::CallbackServerContext* context,
                                    const v1::ReserveRequest* request,
                                    v1::ReserveResponse* response) override;
  grpc::ServerUnaryReactor* Commit(grpc::CallbackServerContext* context,
                                   const v1::CommitRequest* request,
                                   v1::CommitResponse* response) override;
  grpc::ServerUnaryReactor* Abort(grpc::CallbackServerContext* context,
                                  const v1::AbortRequest* request,
                                  v1::AbortResponse* response) override;
  grpc::ServerUnaryReactor* Release(grpc::CallbackServerContext* context,
                                    const v1::ReleaseRequest* request,
                                    v1::ReleaseResponse* response) override;
  grpc::ServerUnaryReactor* Prefetch(grpc::CallbackServerContext* context,
                                     const v1::PrefetchRequest* request,
                                     v1::PrefetchResponse* response) override;
  grpc::ServerUnaryReactor* Fence(grpc::CallbackServerContext* context,
                                  const v1::FenceRequest* request,
                                  v1::FenceResponse* response) override;
  grpc::ServerUnaryReactor* Drop(grpc::CallbackServerContext* context,
                                 const v1::DropRequest* request,
                                 v1::DropResponse* response) override;
  grpc::ServerUnaryReactor* Stats(grpc::CallbackServerContext* context,
                                  const v1::StatsRequest* request,
                                  v1::StatsResponse* response) override;
  grpc::ServerUnaryReactor* ListNamespaces(
      grpc::CallbackServerContext* context,
      const v1::ListNamespacesRequest* request,
      v1::ListNamespacesResponse* response) override;
  grpc::ServerUnaryReactor* ListPrefixes(
      grpc::CallbackServerContext* context,
      const v1::ListPrefixesRequest* request,
      v1::ListPrefixesResponse* response) override;
  grpc::ServerUnaryReactor* Verify(grpc::CallbackServerContext* context,
                                   const v1::VerifyRequest* request,
                                   v1::VerifyResponse* response) override;

  // Tells every open Session stream the daemon is stopping (the Draining
  // event), so engines finish what they do and reconnect to the next
  // daemon. Call before grpc::Server::Shutdown.
  void DrainSessions();

  // Open Session streams register here while they live.
  void Register(SessionDrainer* session);
  void Unregister(SessionDrainer* session);

 private:
  TierCore* const core_;
  const std::string fast_lookup_socket_;
  const bool operator_socket_;
  absl::Mutex sessions_mu_;
  absl::flat_hash_set<SessionDrainer*> sessions_ ABSL_GUARDED_BY(sessions_mu_);
};

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_TIER_SERVICE_H_
