// TierOptions: how a TierCore (daemon/tier_core.h) is configured, which
// kvtierd's flags fill; and the protocol's version and request limits.
//
// Thread-safety: plain data; a TierCore copies its options at construction.
#ifndef KVTIER_DAEMON_TIER_OPTIONS_H_
#define KVTIER_DAEMON_TIER_OPTIONS_H_

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "daemon/device_pool.h"
#include "daemon/fence_registry.h"
#include "daemon/journal.h"
#include "daemon/kv_event_types.h"
#include "daemon/peer_credentials.h"
#include "shm/segment.h"

namespace kvtier::daemon {

class ClusterTier;
class TierObserver;

inline constexpr uint32_t kApiVersion = 1;
inline constexpr uint32_t kMaxLookupPages = 1u << 20;
inline constexpr uint32_t kMaxReservePages = 1u << 20;
// TierOptions::bank_numa_node's modes besides a node number.
inline constexpr int kBankNumaAuto = -2;
inline constexpr int kBankNumaNone = -1;

struct TierOptions {
  // (segments.numa_node is ignored: bank_numa_node decides; sysfs_root is
  // where GPUs' nodes are read.)
  shm::SegmentOptions segments;
  // NUMA placement of banks (shm/numa.h). kBankNumaAuto: a stored rank's
  // banks go to the node of the GPU named by the first Attach of that rank
  // (AttachRequest.pci_bus_id, node from sysfs): bound before population
  // when that Attach creates the namespace, moved there otherwise (pages
  // only the daemon maps yet). One copy shared by GPUs of several nodes
  // (a replicated layout, DP replicas) stays where its first user put it.
  // kBankNumaNone: first touch. A node number: every bank bound to it.
  int bank_numa_node = kBankNumaAuto;
  // Segment files are named "<segment_prefix>.<namespace>.<bank>.r<rank>".
  std::string segment_prefix = "kvtier";
  // Bank bytes of a namespace whose Attach gives no capacity.
  uint64_t default_namespace_bytes = 1ull << 30;
  // Most bank bytes one namespace may hold (all banks, all ranks).
  uint64_t namespace_budget_bytes = 64ull << 30;
  // Share of default_namespace_bytes given to snapshots in hybrid namespaces.
  double default_snapshot_share = 0.25;
  uint32_t default_max_replay_tokens = 8192;
  // Most namespaces at once.
  uint32_t max_namespaces = 256;
  // Isolation (see daemon/peer_credentials.h). Attach refuses sessions whose
  // peer credentials are not bound (BindPeerCredentials) when set.
  bool require_peer_credentials = false;
  // Who may attach to which namespaces; a namespace it governs also gets
  // the entry's first group on its segments.
  NamespaceAcl namespace_acl;
  // Most bank bytes the namespaces created by one uid may hold together
  // (0: no limit). Charged at creation, refunded by Drop.
  uint64_t uid_budget_bytes = 0;
  // Folder of the namespace journals (daemon/journal.h), which Recover reads
  // at start. Empty: no journal; a restarted daemon then reopens segments
  // with an empty index.
  std::string state_dir;
  JournalOptions journal;
  // The daemon's device pools (daemon/device_pool.h); empty unless kvtierd
  // --device_pool_bytes > 0. Their owner (kvtierd's main) outlives the
  // TierCore. Their handles go only to sessions attached to a namespace
  // matching device_pool_namespaces (patterns as in --namespace_acl: a
  // name, or a prefix and '*'; empty: every namespace).
  std::vector<DevicePoolExport> device_pools;
  std::vector<std::string> device_pool_namespaces;
  // Where the KV events go (kvtierd --kv_events_endpoint;
  // daemon/kv_event_types.h), or nullptr for none. Outlives the TierCore.
  KvEventSink* kv_events = nullptr;
  // The cluster tier (kvtierd --cluster_redis; daemon/cluster_tier.h), or
  // nullptr for none. Outlives the TierCore, whose destructor waits for the
  // prefetch jobs it submitted.
  ClusterTier* cluster = nullptr;
  // More observers of every namespace's commits, evictions and removals
  // (daemon/tier_observer.h), told after the KV events and the cluster
  // tier, in this order. Each outlives the TierCore.
  std::vector<TierObserver*> observers;
  // The fence protocol's policy (daemon/fence_registry.h).
  FenceOptions fence;
  // A corrupt journal (JournalContents::corrupt): false keeps its
  // namespace unrecoverable until an operator drops it; true reopens it
  // empty (kvtierd --corrupt_journal=refuse|empty).
  bool corrupt_journal_empty = false;
  // Per session and namespace: most open reservations, pinned leases and
  // rows (page + snapshot) reserved at once; 0: no cap. Past one, Reserve
  // or the pin is RESOURCE_EXHAUSTED naming the cap, before anything is
  // allocated or evicted.
  uint32_t max_session_reservations = 4096;
  uint32_t max_session_leases = 1u << 16;
  // Reserved rows are neither evictable nor anyone else's: the default
  // (two 128k-token prompts of 16-token pages) lets a session store its
  // longest prompts while copies are in flight (a max_model_len prompt of
  // the vLLM tests is 128 rows), yet not hold a whole bank of those tests'
  // llama namespace (256 MiB of 8 KiB rows: 32768) or of a production one
  // of tens of GiB in rows of a few hundred KiB.
  uint64_t max_session_reserved_rows = 16384;
};

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_TIER_OPTIONS_H_
