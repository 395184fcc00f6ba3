// kvtierctl's view of the cluster tier (docs/cluster.md): the part of
// `kvtierctl status` that shows the Redis Cluster the daemon spills to and
// prefetches from, and what it did.
//
// Thread-safety: a stateless function.
#ifndef KVTIER_CLI_CLUSTER_STATUS_H_
#define KVTIER_CLI_CLUSTER_STATUS_H_

#include <string>

#include "kvtier/v1/tier.pb.h"

namespace kvtier::cli {

// "" when the daemon has no cluster tier; else a summary line, the
// counters, and one table row per Redis node (address, role, state,
// slots, last error).
std::string RenderClusterStatus(const v1::ClusterTierStatus& cluster);

}  // namespace kvtier::cli

#endif  // KVTIER_CLI_CLUSTER_STATUS_H_
