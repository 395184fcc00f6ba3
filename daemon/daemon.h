// Daemon: kvtierd as one object over its DaemonOptions
// (daemon/daemon_options.h). Start makes what the core needs (device
// pools, the KV event publisher, the cluster tier), the TierCore itself
// (recovered from its journals, its fence sweeper running), /metrics, and
// the sockets: the engine socket (FastLookupServer), the gRPC socket
// behind its gate (TierService, health, reflection) and the operator
// socket; then tells systemd it is ready. Serve blocks until Drain (from
// another thread, e.g. the one that waits for SIGTERM) has stopped the
// servers; destroying the Daemon then stops the rest and removes the
// socket files. The segments stay for the next daemon.
//
// Thread-safety: Start, then Serve on one thread and Drain on another,
// once each.
#ifndef KVTIER_DAEMON_DAEMON_H_
#define KVTIER_DAEMON_DAEMON_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "daemon/daemon_options.h"

namespace grpc {
class Server;
}  // namespace grpc

namespace kvtier::daemon {

class ClusterTier;
class DevicePool;
class FastLookupServer;
class GrpcGate;
class KvEventPublisher;
class MetricsExporter;
class SystemdNotifier;
class TierCore;
class TierService;

class Daemon {
 public:
  // Starts everything, in dependency order, and returns once every socket
  // serves (what started is stopped when a step fails). Errors name the flag
  // or the step; IsConfigurationError tells those of a setting that only
  // showed once tried (an untrusted --shm_dir, a GPU, an endpoint, the
  // cluster key), for which kvtierd exits 2, like for a bad flag.
  static absl::StatusOr<std::unique_ptr<Daemon>> Start(
      const DaemonOptions& options);
  ~Daemon();
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  // Serves until Drain has shut the gRPC servers down.
  void Serve();
  // Drain: health says NOT_SERVING at once, then in-flight calls get a
  // shutdown deadline of 2 s and open sessions end, which tells every
  // engine to reconnect. Callable from any thread, once.
  void Drain();

  static bool IsConfigurationError(const absl::Status& status);

 private:
  explicit Daemon(const DaemonOptions& options);
  // The steps of Start.
  absl::Status StartAttachments();  // Device pools, KV events, cluster tier.
  absl::Status StartCore();         // TierCore, recovery, sweeper, demo.
  absl::Status StartMetrics();
  absl::Status StartSockets();  // Engine, gRPC and operator sockets.
  absl::Status StartOperatorSocket();
  void NotifyReady();

  DaemonOptions options_;
  // Declared in the order they start: each outlives what starts after it.
  std::unique_ptr<DevicePool> device_pool_;
  std::unique_ptr<KvEventPublisher> kv_events_;
  std::unique_ptr<ClusterTier> cluster_;
  std::unique_ptr<TierCore> core_;
  std::unique_ptr<MetricsExporter> metrics_;
  std::string metrics_status_ = "no metrics";
  std::unique_ptr<SystemdNotifier> notifier_;
  std::unique_ptr<FastLookupServer> fast_;
  std::unique_ptr<TierService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<GrpcGate> gate_;
  std::unique_ptr<TierService> admin_service_;
  std::unique_ptr<grpc::Server> admin_server_;
  bool served_ = false;  // Serve returned: the sockets go with the daemon.
};

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_DAEMON_H_
