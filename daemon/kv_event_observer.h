// KvEventObserver: the host tier's KV events (daemon/kv_event_types.h), as
// a TierObserver (daemon/tier_observer.h): what a commit made complete
// (BlockStored), what eviction and Drop removed (BlockRemoved), a dropped
// namespace (AllBlocksCleared), each under the namespace's name as the
// topic and in the order of the index changes (observers are told under
// the namespace's lock). A page is announced once every stored rank holds
// it and withdrawn only if it was announced. Medium "CPU": the host tier
// (the cluster tier announces its own, daemon/cluster_tier.h).
//
// Thread-safety: thread-safe (the sink is).
#ifndef KVTIER_DAEMON_KV_EVENT_OBSERVER_H_
#define KVTIER_DAEMON_KV_EVENT_OBSERVER_H_

#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/types/span.h"
#include "daemon/kv_event_types.h"
#include "daemon/tier_observer.h"

namespace kvtier::daemon {

class KvEventObserver : public TierObserver {
 public:
  // `sink` outlives the observer.
  explicit KvEventObserver(KvEventSink* sink) : sink_(sink) {}

  // BlockStored for the pages the commit completed, one per run of
  // consecutive pages, with their tokens when the commit carried
  // tokens_per_page per key.
  void OnCommitted(const TierNamespace& ns, const TierCommit& commit) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns.mu);
  void OnRemoved(const TierNamespace& ns,
                 absl::Span<const HashKey> keys) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns.mu);
  void OnCleared(const std::string& name) override;

 private:
  KvEventSink* const sink_;
};

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_KV_EVENT_OBSERVER_H_
