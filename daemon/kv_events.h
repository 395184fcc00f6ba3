// KV events for cache-aware routers: what the daemon's tiers store and drop,
// published in vLLM's KV-events wire format (vllm/distributed/kv_events.py),
// so a router that follows vLLM engines (NVIDIA Dynamo, llm-d) follows
// kvtierd the same way.
//
// Wire format, as vLLM's ZmqEventPublisher sends it: a ZMQ PUB multipart
// message [topic, seq, payload] per batch, seq a u64 big-endian counter from
// 0, payload the msgpack of a KVEventBatch [ts, events, data_parallel_rank]
// (an array; the rank is omitted when there is none) whose events are
// msgspec-tagged maps {"type": "BlockStored", ...}. The replay endpoint is a
// ROUTER: a request [identity, "", start_seq (8 bytes big-endian)] is
// answered with [identity, "", seq, payload] for every buffered batch from
// start_seq on, then [identity, "", -1 (8 bytes), ""].
//
// kvtierd publishes one topic per namespace (its name), so a subscriber
// follows one model by subscribing to that prefix.
//
// The publisher never blocks its caller: batches go through a bounded queue
// to the publishing thread; a full queue drops the batch and counts it.
//
// Thread-safety: EncodeKvEventBatch is stateless. KvEventPublisher is
// thread-safe; its sockets are used by its own thread only.
#ifndef KVTIER_DAEMON_KV_EVENTS_H_
#define KVTIER_DAEMON_KV_EVENTS_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <variant>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "daemon/kv_event_types.h"

namespace kvtier::daemon {

// The msgpack payload vLLM's msgspec encoder makes of
// KVEventBatch(ts=ts, events=events, data_parallel_rank=dp_rank).
std::string EncodeKvEventBatch(double ts, absl::Span<const KvEvent> events,
                               std::optional<int> dp_rank = std::nullopt);

struct KvEventOptions {
  // ZMQ endpoints to bind: the PUB socket ("tcp://*:5557", "ipc:///run/x")
  // and, optionally, the replay ROUTER.
  std::string endpoint;
  std::string replay_endpoint;
  size_t buffer_steps = 10000;  // batches kept for replay
  size_t max_queued = 10000;    // batches waiting for the thread
  int send_high_water_mark = 100000;
};

class KvEventPublisher : public KvEventSink {
 public:
  // Binds the sockets (INVALID_ARGUMENT naming a bad endpoint, UNAVAILABLE
  // when the bind fails) and starts the publishing thread.
  static absl::StatusOr<std::unique_ptr<KvEventPublisher>> Start(
      const KvEventOptions& options);
  // Publishes what is queued, then stops the thread and closes the sockets.
  ~KvEventPublisher() override;

  KvEventPublisher(const KvEventPublisher&) = delete;
  KvEventPublisher& operator=(const KvEventPublisher&) = delete;

  // Queues one batch of `events` under `topic`, stamped now. Never blocks:
  // with max_queued batches waiting it drops this one and counts it.
  void Publish(std::string topic, std::vector<KvEvent> events) override
      ABSL_LOCKS_EXCLUDED(mu_);

  // The endpoints as bound (a "tcp://*:0" request shows its port).
  const std::string& endpoint() const { return endpoint_; }
  const std::string& replay_endpoint() const { return replay_endpoint_; }
  uint64_t published() const override { return published_.load(); }
  uint64_t dropped() const override { return dropped_.load(); }

 private:
  struct Impl;  // the ZMQ context and sockets (kv_events.cc)
  struct Queued {
    std::string topic;
    double ts = 0;
    std::vector<KvEvent> events;
  };

  explicit KvEventPublisher(const KvEventOptions& options);
  void Run() ABSL_LOCKS_EXCLUDED(mu_);
  bool HasWork() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stop_ || !queue_.empty();
  }

  const KvEventOptions options_;
  std::unique_ptr<Impl> impl_;  // used by the thread only, once started
  std::string endpoint_, replay_endpoint_;
  std::atomic<uint64_t> published_{0}, dropped_{0};

  absl::Mutex mu_;
  std::deque<Queued> queue_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_KV_EVENTS_H_
