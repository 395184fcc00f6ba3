// Test-only: a KvEventSink that records what it is given, for the tests of
// TierCore's and the cluster tier's KV events (daemon/tier_events_test.cc,
// daemon/tier_cluster_test.cc).
//
// Thread-safety: thread-safe (the daemon's threads publish, the test takes).
#ifndef KVTIER_DAEMON_KV_EVENT_TEST_UTIL_H_
#define KVTIER_DAEMON_KV_EVENT_TEST_UTIL_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "daemon/kv_event_types.h"

namespace kvtier::daemon {

class RecordingSink : public KvEventSink {
 public:
  void Publish(std::string topic, std::vector<KvEvent> events) override {
    absl::MutexLock lock(&mu_);
    for (KvEvent& e : events) got_.emplace_back(topic, std::move(e));
  }
  uint64_t published() const override { return 0; }
  uint64_t dropped() const override { return 0; }
  // (topic, event) of everything published since the last Take.
  std::vector<std::pair<std::string, KvEvent>> Take() {
    absl::MutexLock lock(&mu_);
    return std::exchange(got_, {});
  }

 private:
  absl::Mutex mu_;
  std::vector<std::pair<std::string, KvEvent>> got_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_KV_EVENT_TEST_UTIL_H_
