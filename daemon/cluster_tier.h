// ClusterTier: the daemon's link to the cluster tier, a Redis Cluster that
// the daemons of several nodes share (issue 17; docs/cluster.md).
//
// The host tier stays the daemon's: ClusterTier holds no index and no rows.
// ClusterBridge (daemon/cluster_bridge.h) hands it the pages its host tier
// evicts (or, with write_through, every page it commits) as values made by
// daemon/cluster_value.h, asks it how far a chain continues in Redis, and
// fetches values for a Prefetch, which a PrefetchJob then checks, copies into
// rows and commits. What crosses the network is bounded and never blocks a
// request beyond its deadline:
//
//  - Spill: values wait in a queue of at most spill_queue_bytes, written
//    by one thread in pipelined batches. A value that does not fit is
//    dropped and counted, never waited for: eviction must not stall on the
//    network. A write that fails is counted and forgotten (the page is
//    only a miss elsewhere).
//  - Probe: pipelined EXISTS of the chain's keys past the local match, in
//    growing chunks, stopped at the first missing page or the lookup
//    deadline (a Redis node down or slow: fewer pages, never a stall).
//  - Fetch: pipelined GETs of a slice, bounded by fetch_deadline.
//  - Jobs: a small pool of threads runs prefetch jobs (Submit); the queue
//    of waiting jobs is bounded.
//
// Thread-safety: thread-safe. The counters are atomics; the spill queue and
// the job queue are guarded by mu_.
#ifndef KVTIER_DAEMON_CLUSTER_TIER_H_
#define KVTIER_DAEMON_CLUSTER_TIER_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "daemon/cluster_value.h"
#include "daemon/kv_event_types.h"
#include "daemon/redis_cluster.h"
#include "daemon/resp_reader.h"

namespace kvtier::daemon {

struct ClusterTierOptions {
  RedisClusterOptions redis;
  // Committed pages are written at once (else only what eviction spills).
  bool write_through = false;
  // Bytes of values waiting to be written; past it, spills are dropped.
  uint64_t spill_queue_bytes = 1ull << 30;
  // Values (and at most spill_batch_bytes) per pipelined write.
  uint32_t spill_batch = 32;
  uint64_t spill_batch_bytes = 64ull << 20;
  // Expiry of written values (zero: none; Redis's maxmemory policy evicts).
  absl::Duration ttl = absl::ZeroDuration();
  absl::Duration lookup_deadline = absl::Milliseconds(20);
  absl::Duration fetch_deadline = absl::Seconds(10);
  absl::Duration write_deadline = absl::Seconds(10);
  // A prefetch moves at most this many pages (and bytes) per slice.
  uint32_t prefetch_slice_pages = 32;
  uint64_t prefetch_slice_bytes = 64ull << 20;
  // Slices of one prefetch whose GETs are out at once (1..8): while one
  // slice is checked, copied and committed, the others' values arrive, on
  // connections of their own. Each holds an arena of up to a slice's bytes
  // (4 x 64 MiB per running prefetch). On a 16-core host 4 moved 5.1 GB/s
  // where 2 moved 3.7 (issue 17): a slice's GETs wait for the master that
  // got the most of its keys, and the other masters idle unless more
  // slices are out.
  uint32_t prefetch_in_flight = 4;
  uint32_t prefetch_threads = 2;
  // Threads that check a slice's values and copy them into their rows
  // (0: one per core, 2 to 8; at most 64).
  uint32_t check_threads = 0;
  uint32_t max_queued_jobs = 64;
  // Where the tier announces the pages it wrote (BlockStored, medium
  // "STORAGE"), or nullptr. Outlives the tier.
  KvEventSink* kv_events = nullptr;
};

// What the tier did, for Stats, `kvtierctl status` and /metrics. Each
// counter only grows.
struct ClusterCounters {
  uint64_t probes = 0;           // Continuation probes (remote lookups).
  uint64_t probe_hit_pages = 0;  // Pages they found.
  uint64_t probe_misses = 0;     // Probes that found none.
  uint64_t probe_errors = 0;     // Probes cut short by an error/deadline.
  double probe_seconds = 0;      // Summed over probes.
  uint64_t spilled_pages = 0;    // Values written.
  uint64_t spilled_bytes = 0;
  uint64_t spills_dropped = 0;  // Not queued: the queue was full.
  uint64_t spills_failed = 0;   // Queued, but the write failed.
  uint64_t fetched_values = 0;  // Values fetched (GET answered a value).
  uint64_t fetched_bytes = 0;
  uint64_t fetch_misses = 0;      // GETs that found nothing.
  uint64_t fetch_errors = 0;      // GETs that failed (node down, deadline).
  uint64_t rejected_values = 0;   // Failed their MAC or layout check.
  uint64_t fetches = 0;           // Pipelined GET rounds (slices).
  double fetch_seconds = 0;       // Summed over fetches.
  uint64_t prefetches = 0;        // Prefetch jobs started.
  uint64_t prefetched_pages = 0;  // Pages they committed.
  uint64_t prefetches_cut = 0;    // Ended before their last page.
  // Where prefetch jobs spent their time, summed over jobs and slices:
  // waiting for a slice's values, checking them and copying them into
  // their rows, allocating rows and committing them (under the namespace's
  // lock, journal included).
  double prefetch_wait_seconds = 0;
  double prefetch_check_seconds = 0;
  double prefetch_commit_seconds = 0;
  uint64_t jobs_refused = 0;       // Prefetches refused: queue full.
  uint64_t spill_queue_bytes = 0;  // Now (a gauge).
};

class ClusterTier {
 public:
  // Validates the options (INVALID_ARGUMENT naming the field) and starts
  // the spill thread and the job threads. No Redis node needs to be up.
  static absl::StatusOr<std::unique_ptr<ClusterTier>> Create(
      ClusterTierOptions options, ClusterKey key);
  // Stops the threads: waiting jobs are run to completion first (each
  // bounded by its deadlines); values still queued are dropped (counted).
  ~ClusterTier();
  ClusterTier(const ClusterTier&) = delete;
  ClusterTier& operator=(const ClusterTier&) = delete;

  const ClusterTierOptions& options() const { return options_; }
  const ClusterKey& key() const { return key_; }

  // ---- spills ----
  // Claims `bytes` of the spill queue for a value about to be built (the
  // caller copies rows only then). False, counted as a dropped spill, when
  // the queue has no room: the caller builds nothing.
  bool ClaimSpill(uint64_t bytes);
  // Queues one page's values (key name, value), each built after a
  // successful ClaimSpill(value.size()): the rows between BeginClusterValue
  // and SealClusterValue, which the spill thread does (the MAC is computed
  // off the caller's lock). They are written in one batch; once every one
  // of `event.values` values is written, the page is announced as `event`
  // says (with kv_events; a page some of whose values were dropped is not).
  struct PageEvent {
    std::string topic;    // The namespace.
    BlockStored stored;   // One block, medium STORAGE.
    uint32_t values = 0;  // The page's values: its stored ranks.
  };
  void SpillPage(PageEvent event,
                 std::vector<std::pair<std::string, std::string>> values);

  // ---- reads ----
  // Pages from the first of `pages` whose keys (one per stored rank,
  // key_of(page, rank)) are all in Redis, consecutively; stops at the
  // first page missing a key, an error or the lookup deadline.
  uint32_t Probe(
      uint32_t pages, uint32_t ranks,
      const std::function<std::string(uint32_t page, uint32_t rank)>& key_of);
  // GETs of `keys`, bounded by fetch_deadline: result[i] the value (read
  // straight into `arena`, valid until its next Reset), NOT_FOUND, the
  // error of its node, or OUT_OF_RANGE for a value over `max_value_bytes`
  // (the largest value the caller expects: ClusterValueBytes with a
  // snapshot; at most RespReader::kMaxBulk), which is refused before
  // anything is allocated for it, logged and counted as a rejected value.
  std::vector<absl::StatusOr<absl::string_view>> Fetch(
      absl::Span<const std::string> keys, uint64_t max_value_bytes,
      ValueArena* arena);
  // Counts a fetched value that failed its checks.
  void CountRejected() { rejected_.fetch_add(1); }

  // ---- prefetch jobs ----
  // Runs `job` on a job thread. False (counted) when max_queued_jobs wait.
  bool Submit(std::function<void()> job);
  void CountPrefetch(uint64_t pages, bool cut);
  // Adds one prefetch job's time per stage (ClusterCounters::prefetch_*).
  struct PrefetchStages {
    absl::Duration wait, check, commit;
  };
  void CountPrefetchStages(const PrefetchStages& stages);
  // The threads that check and copy a slice's values (check_threads, or
  // one per core, 2 to 8).
  size_t CheckThreads() const;

  ClusterCounters Counters() const;
  // The Redis Cluster's state as this tier sees it.
  RedisCluster::State RedisState() const { return redis_->GetState(); }

 private:
  ClusterTier(ClusterTierOptions options, ClusterKey key,
              std::unique_ptr<RedisCluster> redis);
  void SpillLoop();
  void JobLoop();

  // Immutable after construction.
  const ClusterTierOptions options_;
  const ClusterKey key_;
  const std::unique_ptr<RedisCluster> redis_;

  struct Queued {
    std::string key;
    std::string value;
    bool first = false;  // A page's first value.
    // On a page's first value: the page's event (null without kv_events).
    std::shared_ptr<PageEvent> page;
  };
  // Publishes BlockStored (STORAGE) for the pages of `batch` whose every
  // value `written` says was written.
  void Announce(const std::vector<Queued>& batch,
                const std::vector<absl::Status>& written);
  mutable absl::Mutex mu_;
  std::deque<Queued> spills_ ABSL_GUARDED_BY(mu_);
  uint64_t spill_bytes_ ABSL_GUARDED_BY(mu_) = 0;  // Claimed, not yet written.
  std::deque<std::function<void()>> jobs_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread spill_thread_;
  std::vector<std::thread> job_threads_;

  std::atomic<uint64_t> probes_{0}, probe_hit_pages_{0}, probe_misses_{0},
      probe_errors_{0}, probe_micros_{0};
  std::atomic<uint64_t> spilled_pages_{0}, spilled_bytes_{0},
      spills_dropped_{0}, spills_failed_{0};
  std::atomic<uint64_t> fetched_values_{0}, fetched_bytes_{0}, fetch_misses_{0},
      fetch_errors_{0}, rejected_{0}, fetch_micros_{0}, fetches_{0};
  std::atomic<uint64_t> prefetches_{0}, prefetched_pages_{0},
      prefetches_cut_{0}, jobs_refused_{0};
  std::atomic<uint64_t> prefetch_wait_micros_{0}, prefetch_check_micros_{0},
      prefetch_commit_micros_{0};
};

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_CLUSTER_TIER_H_
