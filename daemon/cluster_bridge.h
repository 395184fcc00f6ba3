// ClusterBridge: the host tier's side of the cluster tier
// (daemon/cluster_tier.h). As a TierObserver (daemon/tier_observer.h) it
// spills what the host tier evicts, or, with write-through, writes every
// engine commit; it answers how far a chain continues in Redis (a remote
// Lookup, the Prefetch RPC) and runs the prefetch jobs that bring that
// continuation into the host tier (daemon/prefetch_job.h), which it
// counts so that the core's shutdown waits for them.
//
// Nothing wrong is served: a prefetched page is committed only after its
// value passed its MAC, layout, key and rank checks (DecodeClusterValue),
// into rows allocated for it and invisible until the commit, which is
// journaled like any other; a value that fails is a miss and ends the
// prefetch there.
//
// Thread-safety: thread-safe. Observer calls come under a namespace's mu;
// the rest takes a namespace's prefetch_mu (after its mu) and jobs_mu_ (a
// leaf).
#ifndef KVTIER_DAEMON_CLUSTER_BRIDGE_H_
#define KVTIER_DAEMON_CLUSTER_BRIDGE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "daemon/cluster_tier.h"
#include "daemon/tier_namespace.h"
#include "daemon/tier_observer.h"
#include "kvtier/v1/tier.pb.h"

namespace kvtier::daemon {

class ClusterBridge : public TierObserver {
 public:
  // `cluster` outlives the bridge; `hook` is the core's test hook.
  ClusterBridge(ClusterTier* cluster, std::function<void(const char*)> hook);
  // Shutdown, if not done.
  ~ClusterBridge() override;
  ClusterBridge(const ClusterBridge&) = delete;
  ClusterBridge& operator=(const ClusterBridge&) = delete;

  ClusterTier* cluster() const { return cluster_; }

  // Stops the prefetch jobs (each at its next step; they run on the
  // cluster tier's threads, which outlive the core) and waits until none
  // runs. Prefetch refuses from then on.
  void Shutdown() ABSL_LOCKS_EXCLUDED(jobs_mu_);

  // Without write-through: spills a complete page that eviction removes.
  void OnEvicting(const TierNamespace& ns,
                  const PrefixIndex::Eviction& eviction) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns.mu);
  // With write-through: queues the pages an engine's commit (or a mirror
  // adoption) placed and their snapshots; the pages it completed are
  // announced once written.
  void OnCommitted(const TierNamespace& ns, const TierCommit& commit) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns.mu);

  // A remote Lookup's continuation past the local match `from`: the pages
  // a prefetch is bringing in, else those the cluster tier holds for every
  // stored rank.
  void Continuation(TierNamespace& ns, absl::Span<const HashKey> keys,
                    uint32_t from, v1::LookupResponse* resp);
  // The Prefetch RPC past the local match `local` (set in resp already):
  // claims the continuation and starts a job for it, or says what is
  // prefetching. RESOURCE_EXHAUSTED when too many prefetches wait;
  // UNAVAILABLE once shut down.
  absl::Status Prefetch(const std::shared_ptr<TierNamespace>& ns,
                        std::vector<HashKey> keys, uint32_t local,
                        v1::PrefetchResponse* resp)
      ABSL_LOCKS_EXCLUDED(jobs_mu_);
  // Stats' view of the cluster tier.
  void FillStatus(v1::ClusterTierStatus* out) const;

 private:
  // One rank's rows of a page to spill (snapshot_row kNoRow: none).
  struct SpilledRank {
    uint32_t rank = 0;
    uint32_t page_row = kNoRow;
    uint32_t snapshot_row = kNoRow;
  };
  // Queues the values of page `key` (child of `parent`, nullptr for a
  // first page) of `ranks`, copying the rows now; it is announced
  // (BlockStored, medium STORAGE, with `token_ids` when given) once
  // `announce_values` values of it are written (0: never).
  void SpillPage(const TierNamespace& ns, const HashKey& key,
                 const HashKey* parent, absl::Span<const SpilledRank> ranks,
                 absl::Span<const uint32_t> token_ids, uint32_t announce_values)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns.mu);
  // Pages of keys from `from` on that a prefetch is bringing in / that the
  // cluster tier holds for every stored rank (consecutive).
  static uint32_t PrefetchingPages(TierNamespace& ns,
                                   absl::Span<const HashKey> keys,
                                   uint32_t from);
  uint32_t RemotePages(const TierNamespace& ns, absl::Span<const HashKey> keys,
                       uint32_t from);
  bool Closing() ABSL_LOCKS_EXCLUDED(jobs_mu_);

  ClusterTier* const cluster_;
  const std::function<void(const char*)> hook_;
  // Prefetch jobs submitted and not yet finished.
  absl::Mutex jobs_mu_;
  int64_t jobs_ ABSL_GUARDED_BY(jobs_mu_) = 0;
  bool closing_ ABSL_GUARDED_BY(jobs_mu_) = false;
};

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_CLUSTER_BRIDGE_H_
