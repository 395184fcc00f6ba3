// DaemonOptions: everything kvtierd's flags say, read and validated in one
// place (daemon/daemon_flags.cc, which also declares every flag of kvtierd:
// the daemon's parameter table). Daemon (daemon/daemon.h) runs on them;
// nothing else reads a flag.
//
// Thread-safety: DaemonOptionsFromFlags reads the flags (thread-safe after
// parsing) and changes nothing; the options are plain data.
#ifndef KVTIER_DAEMON_DAEMON_OPTIONS_H_
#define KVTIER_DAEMON_DAEMON_OPTIONS_H_

#include <sys/types.h>

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "daemon/cluster_tier.h"
#include "daemon/device_pool.h"
#include "daemon/kv_events.h"
#include "daemon/server_limits.h"
#include "daemon/tier_options.h"

namespace kvtier::daemon {

struct DaemonOptions {
  // The core's options, but for what Daemon makes and hands it (device
  // pools, the KV event sink, the cluster tier).
  TierOptions tier;
  // The sockets' limits (daemon/server_limits.h).
  ServerLimits limits;
  std::string log_level = "info";
  // The gRPC socket (its engine socket is <socket>.lookup) and its group
  // (-1: the daemon's own); the operator socket (empty: none) and its
  // group (-1: mode 0600).
  std::string socket;
  gid_t group = static_cast<gid_t>(-1);
  std::string admin_socket;
  gid_t admin_group = static_cast<gid_t>(-1);
  // host:port of /metrics; empty: none.
  std::string metrics_address;
  // A namespace to create at start (make run); empty: none.
  std::string demo_namespace;
  absl::Duration fence_sweep = absl::Milliseconds(50);
  // Daemon-owned GPU memory for snapshots (bytes_per_gpu 0: none, and the
  // daemon never loads CUDA).
  DevicePoolOptions device_pool;
  // KV events (endpoint empty: none).
  KvEventOptions kv_events;
  // The cluster tier (none without --cluster_redis), and the file of the
  // key its daemons share (read when the tier is made).
  std::optional<ClusterTierOptions> cluster;
  std::string cluster_key_file;
};

// The options the flags set. INVALID_ARGUMENT naming the flag for a value
// kvtierd cannot run with (a malformed choice, a zero cap or deadline, an
// ACL entry without a group, a flag that needs another); NOT_FOUND for an
// unknown group; a password file's errors (ReadSecretFile). Defaults that
// depend on the machine are filled in: the socket
// (common/default_socket.h), --shm_dir (/dev/shm/kvtier-<euid>), the state
// folder beside the banks, the operator socket beside the socket.
// REQUIRES: flags parsed.
absl::StatusOr<DaemonOptions> DaemonOptionsFromFlags();

// The sockets' limits alone (--grpc_*, --fast_lookup_*,
// --max_sessions_per_uid); INVALID_ARGUMENT naming the flag for a value no
// server could run with (a zero deadline or cap). REQUIRES: flags parsed.
absl::StatusOr<ServerLimits> ServerLimitsFromFlags();

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_DAEMON_OPTIONS_H_
