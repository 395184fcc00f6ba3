// kvtierd's cluster-tier flags (--cluster_*): what they mean is in
// docs/cluster.md; ClusterTierFromFlags turns them into a ClusterTier
// (daemon/cluster_tier.h).
//
// Thread-safety: call from main, after flags are parsed.
#ifndef KVTIER_DAEMON_KVTIERD_CLUSTER_H_
#define KVTIER_DAEMON_KVTIERD_CLUSTER_H_

#include <memory>

#include "absl/status/statusor.h"
#include "daemon/cluster_tier.h"

namespace kvtier::daemon {

// The cluster tier the flags ask for: nullptr without --cluster_redis;
// INVALID_ARGUMENT naming the flag for a bad value (--cluster_key_file is
// required with --cluster_redis); the key and password files' errors
// (cluster_value.h, ReadSecretFile).
// `kv_events` (nullptr: none) hears what the tier writes (medium STORAGE).
absl::StatusOr<std::unique_ptr<ClusterTier>> ClusterTierFromFlags(
    KvEventSink* kv_events);

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_KVTIERD_CLUSTER_H_
