// TierObserver: the one seam through which what the namespaces' indexes do
// (commits, evictions, removals, a namespace dropped) reaches whatever
// reacts to it: the KV events (daemon/kv_event_observer.h), the cluster
// tier's spills and write-through (daemon/cluster_bridge.h), and tests. A
// new policy that watches commits and evictions is one more observer,
// handed to TierCore in TierOptions::observers; nothing in the request
// paths changes for it.
//
// Every call is made under the namespace's lock (TierNamespace::mu, held
// exclusively), in the order the index changed: an observer must be quick,
// must not block, and must not call into the TierCore or the namespace's
// index; it may take locks of its own that nothing else holds while
// calling into the core (leaves of the lock order in tier_core.h).
//
// Thread-safety: observers are called from any request's thread (for one
// namespace, one at a time); implementations are thread-safe.
#ifndef KVTIER_DAEMON_TIER_OBSERVER_H_
#define KVTIER_DAEMON_TIER_OBSERVER_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/types/span.h"
#include "daemon/prefix_index.h"
#include "daemon/tier_namespace.h"

namespace kvtier::daemon {

// One rank's commit into a namespace's index, as TierObserver::OnCommitted
// sees it.
struct TierCommit {
  enum class Origin : uint8_t {
    kEngine,    // An engine's Commit of rows it wrote.
    kMirror,    // AdoptMirror: rows copied host to host from a mirror.
    kPrefetch,  // A prefetch from the cluster tier.
  };
  Origin origin = Origin::kEngine;
  uint32_t rank = 0;                // Storage rank.
  const HashKey* parent = nullptr;  // nullptr: keys[0] is a first page.
  absl::Span<const HashKey> keys;
  absl::Span<const uint32_t> rows;  // keys[i]'s row (before deduplication).
  absl::Span<const PrefixIndex::SnapshotPlacement> snapshots;
  // tokens_per_page tokens per key when the engine sent them, else empty.
  absl::Span<const uint32_t> token_ids;
  const PrefixIndex::CommitResult* result = nullptr;  // Never null.
};

class TierObserver {
 public:
  virtual ~TierObserver() = default;

  // A rank's commit; result->completed names the pages it made complete
  // (every stored rank holds them). The namespace's committed_* counters
  // (Stats) already count it.
  virtual void OnCommitted(const TierNamespace& ns, const TierCommit& commit)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns.mu) {
    (void)ns, (void)commit;
  }
  // Eviction is about to free the rows of `eviction.node` (still holding
  // the committed bytes until this returns).
  virtual void OnEvicting(const TierNamespace& ns,
                          const PrefixIndex::Eviction& eviction)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns.mu) {
    (void)ns, (void)eviction;
  }
  // Complete pages removed (evicted or dropped) since the last call, told
  // at the end of the request that removed them.
  virtual void OnRemoved(const TierNamespace& ns,
                         absl::Span<const HashKey> keys)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns.mu) {
    (void)ns, (void)keys;
  }
  // The whole namespace `name` was dropped: it holds nothing any more.
  virtual void OnCleared(const std::string& name) { (void)name; }
};

// The observers of a TierCore, in the order they were given; fixed at
// construction. Each call is passed to every observer in turn.
class TierObservers {
 public:
  explicit TierObservers(std::vector<TierObserver*> observers)
      : observers_(std::move(observers)) {}

  void Committed(const TierNamespace& ns, const TierCommit& commit) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns.mu) {
    for (TierObserver* o : observers_) o->OnCommitted(ns, commit);
  }
  void Evicting(const TierNamespace& ns,
                const PrefixIndex::Eviction& eviction) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns.mu) {
    for (TierObserver* o : observers_) o->OnEvicting(ns, eviction);
  }
  void Removed(const TierNamespace& ns, absl::Span<const HashKey> keys) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns.mu) {
    for (TierObserver* o : observers_) o->OnRemoved(ns, keys);
  }
  void Cleared(const std::string& name) const {
    for (TierObserver* o : observers_) o->OnCleared(name);
  }

 private:
  const std::vector<TierObserver*> observers_;
};

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_TIER_OBSERVER_H_
