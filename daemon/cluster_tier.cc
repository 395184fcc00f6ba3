// ClusterTier: see cluster_tier.h.
//
// Thread-safety: thread-safe; the queues under mu_, the counters atomic.
#include "daemon/cluster_tier.h"

#include <algorithm>
#include <string_view>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace kvtier::daemon {
namespace {

uint64_t Micros(absl::Duration d) {
  return static_cast<uint64_t>(
      std::max<int64_t>(0, absl::ToInt64Microseconds(d)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<ClusterTier>> ClusterTier::Create(
    ClusterTierOptions options, ClusterKey key) {
  if (options.prefetch_slice_pages == 0) {
    return absl::InvalidArgumentError(
        "--cluster_prefetch_slice_pages: must be at least 1");
  }
  if (options.prefetch_threads == 0 || options.prefetch_threads > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("--cluster_prefetch_threads: ", options.prefetch_threads,
                     " is not in 1..64"));
  }
  if (options.prefetch_in_flight == 0 || options.prefetch_in_flight > 8) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--cluster_prefetch_in_flight: ", options.prefetch_in_flight,
        " is not in 1..8"));
  }
  if (options.check_threads > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("--cluster_check_threads: ", options.check_threads,
                     " is not in 0..64"));
  }
  if (options.spill_batch == 0) {
    return absl::InvalidArgumentError(
        "cluster spill_batch: must be at least 1");
  }
  if (options.lookup_deadline <= absl::ZeroDuration() ||
      options.fetch_deadline <= absl::ZeroDuration() ||
      options.write_deadline <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "--cluster_lookup_deadline_ms, --cluster_fetch_deadline_ms: must be "
        "positive");
  }
  auto redis = RedisCluster::Create(options.redis);
  if (!redis.ok()) return redis.status();
  return std::unique_ptr<ClusterTier>(
      new ClusterTier(std::move(options), std::move(key), *std::move(redis)));
}

ClusterTier::ClusterTier(ClusterTierOptions options, ClusterKey key,
                         std::unique_ptr<RedisCluster> redis)
    : options_(std::move(options)),
      key_(std::move(key)),
      redis_(std::move(redis)) {
  spill_thread_ = std::thread([this] { SpillLoop(); });
  for (uint32_t i = 0; i < options_.prefetch_threads; ++i) {
    job_threads_.emplace_back([this] { JobLoop(); });
  }
}

ClusterTier::~ClusterTier() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  for (std::thread& t : job_threads_) t.join();
  spill_thread_.join();
  absl::MutexLock lock(&mu_);
  spills_dropped_.fetch_add(spills_.size());
  spills_.clear();
  spill_bytes_ = 0;
}

bool ClusterTier::ClaimSpill(uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  if (stop_ || spill_bytes_ + bytes > options_.spill_queue_bytes) {
    spills_dropped_.fetch_add(1);
    return false;
  }
  spill_bytes_ += bytes;
  return true;
}

void ClusterTier::SpillPage(
    PageEvent event, std::vector<std::pair<std::string, std::string>> values) {
  if (values.empty()) return;
  std::shared_ptr<PageEvent> page =
      options_.kv_events == nullptr
          ? nullptr
          : std::make_shared<PageEvent>(std::move(event));
  absl::MutexLock lock(&mu_);
  for (size_t i = 0; i < values.size(); ++i) {
    spills_.push_back({std::move(values[i].first), std::move(values[i].second),
                       i == 0, i == 0 ? page : nullptr});
  }
}

void ClusterTier::SpillLoop() {
  auto has_work = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stop_ || !spills_.empty();
  };
  for (;;) {
    std::vector<Queued> batch;
    uint64_t claimed = 0;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(&has_work));
      if (stop_) return;  // The destructor counts what is left.
      uint64_t bytes = 0;
      // Whole pages: a page is announced only when all its values were
      // written together.
      while (!spills_.empty() && (batch.empty() || !spills_.front().first ||
                                  (batch.size() < options_.spill_batch &&
                                   bytes + spills_.front().value.size() <=
                                       options_.spill_batch_bytes))) {
        bytes += spills_.front().value.size();
        batch.push_back(std::move(spills_.front()));
        spills_.pop_front();
      }
    }
    std::vector<RedisCluster::KeyValue> items;
    items.reserve(batch.size());
    for (Queued& q : batch) {
      SealClusterValue(key_, &q.value);
      claimed += q.value.size();  // What ClaimSpill claimed: the whole value.
      items.push_back({q.key, q.value});
    }
    const std::vector<absl::Status> written =
        redis_->Set(items, options_.ttl, absl::Now() + options_.write_deadline);
    uint64_t failed = 0;
    for (size_t i = 0; i < written.size(); ++i) {
      if (written[i].ok()) {
        spilled_pages_.fetch_add(1);
        spilled_bytes_.fetch_add(batch[i].value.size());
      } else {
        ++failed;
      }
    }
    if (failed > 0) {
      spills_failed_.fetch_add(failed);
      SPDLOG_DEBUG("cluster tier: {} of {} spills failed", failed,
                   written.size());
    }
    Announce(batch, written);
    absl::MutexLock lock(&mu_);
    spill_bytes_ -= claimed;
  }
}

void ClusterTier::Announce(const std::vector<Queued>& batch,
                           const std::vector<absl::Status>& written) {
  if (options_.kv_events == nullptr) return;
  // Per topic, in order: the pages whose every value was written.
  std::vector<std::pair<std::string, std::vector<KvEvent>>> events;
  for (size_t i = 0; i < batch.size();) {
    const std::shared_ptr<PageEvent>& page = batch[i].page;
    size_t end = i + 1;
    while (end < batch.size() && !batch[end].first) ++end;
    bool ok = batch[i].first && page != nullptr && end - i == page->values;
    for (size_t k = i; ok && k < end; ++k) ok = written[k].ok();
    if (ok) {
      if (events.empty() || events.back().first != page->topic) {
        events.emplace_back(page->topic, std::vector<KvEvent>());
      }
      events.back().second.push_back(page->stored);
    }
    i = end;
  }
  for (auto& [topic, e] : events) {
    options_.kv_events->Publish(topic, std::move(e));
  }
}

uint32_t ClusterTier::Probe(
    uint32_t pages, uint32_t ranks,
    const std::function<std::string(uint32_t, uint32_t)>& key_of) {
  if (pages == 0 || ranks == 0) return 0;
  const absl::Time start = absl::Now();
  const absl::Time deadline = start + options_.lookup_deadline;
  probes_.fetch_add(1);
  uint32_t found = 0;
  bool error = false;
  // Growing chunks: a short continuation costs one small round trip, a
  // long one a few.
  uint32_t chunk = 16;
  std::vector<std::string> keys;
  while (found < pages) {
    const uint32_t n = std::min(chunk, pages - found);
    keys.clear();
    for (uint32_t p = 0; p < n; ++p) {
      for (uint32_t r = 0; r < ranks; ++r) keys.push_back(key_of(found + p, r));
    }
    const std::vector<absl::StatusOr<bool>> present =
        redis_->Exists(keys, deadline);
    uint32_t run = 0;
    bool stop = false;
    for (uint32_t p = 0; p < n && !stop; ++p) {
      for (uint32_t r = 0; r < ranks; ++r) {
        const auto& e = present[p * ranks + r];
        if (!e.ok()) {
          error = true;
          stop = true;
          break;
        }
        if (!*e) {
          stop = true;
          break;
        }
      }
      if (!stop) ++run;
    }
    found += run;
    if (stop || absl::Now() >= deadline) break;
    chunk = std::min<uint32_t>(chunk * 4, 4096);
  }
  if (found > 0) {
    probe_hit_pages_.fetch_add(found);
  } else {
    probe_misses_.fetch_add(1);
  }
  if (error) probe_errors_.fetch_add(1);
  probe_micros_.fetch_add(Micros(absl::Now() - start));
  return found;
}

std::vector<absl::StatusOr<absl::string_view>> ClusterTier::Fetch(
    absl::Span<const std::string> keys, uint64_t max_value_bytes,
    ValueArena* arena) {
  const absl::Time start = absl::Now();
  std::vector<absl::StatusOr<absl::string_view>> values =
      redis_->Get(keys, start + options_.fetch_deadline, arena,
                  /*owned=*/nullptr, max_value_bytes);
  for (size_t i = 0; i < values.size(); ++i) {
    const absl::StatusOr<absl::string_view>& v = values[i];
    if (v.ok()) {
      fetched_values_.fetch_add(1);
      fetched_bytes_.fetch_add(v->size());
    } else if (absl::IsNotFound(v.status())) {
      fetch_misses_.fetch_add(1);
    } else if (absl::IsOutOfRange(v.status())) {
      // Larger than any value of its key's layout (the key names the
      // layout): not one this tier wrote. It fails the layout check
      // before it is read, so it counts as a rejected value.
      rejected_.fetch_add(1);
      SPDLOG_WARN("cluster tier: value of key {} refused: {}", keys[i],
                  std::string(v.status().message()));
    } else {
      fetch_errors_.fetch_add(1);
    }
  }
  fetches_.fetch_add(1);
  fetch_micros_.fetch_add(Micros(absl::Now() - start));
  return values;
}

bool ClusterTier::Submit(std::function<void()> job) {
  absl::MutexLock lock(&mu_);
  if (stop_ || jobs_.size() >= options_.max_queued_jobs) {
    jobs_refused_.fetch_add(1);
    return false;
  }
  jobs_.push_back(std::move(job));
  return true;
}

void ClusterTier::JobLoop() {
  auto has_work = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stop_ || !jobs_.empty();
  };
  for (;;) {
    std::function<void()> job;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(&has_work));
      if (jobs_.empty()) return;  // Stopping, nothing left.
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    job();
  }
}

void ClusterTier::CountPrefetch(uint64_t pages, bool cut) {
  prefetches_.fetch_add(1);
  prefetched_pages_.fetch_add(pages);
  if (cut) prefetches_cut_.fetch_add(1);
}

void ClusterTier::CountPrefetchStages(const PrefetchStages& stages) {
  prefetch_wait_micros_.fetch_add(Micros(stages.wait));
  prefetch_check_micros_.fetch_add(Micros(stages.check));
  prefetch_commit_micros_.fetch_add(Micros(stages.commit));
}

size_t ClusterTier::CheckThreads() const {
  if (options_.check_threads > 0) return options_.check_threads;
  static const size_t n =
      std::clamp<size_t>(std::thread::hardware_concurrency(), 2, 8);
  return n;
}

ClusterCounters ClusterTier::Counters() const {
  ClusterCounters c;
  c.probes = probes_.load();
  c.probe_hit_pages = probe_hit_pages_.load();
  c.probe_misses = probe_misses_.load();
  c.probe_errors = probe_errors_.load();
  c.probe_seconds = static_cast<double>(probe_micros_.load()) / 1e6;
  c.spilled_pages = spilled_pages_.load();
  c.spilled_bytes = spilled_bytes_.load();
  c.spills_dropped = spills_dropped_.load();
  c.spills_failed = spills_failed_.load();
  c.fetched_values = fetched_values_.load();
  c.fetched_bytes = fetched_bytes_.load();
  c.fetch_misses = fetch_misses_.load();
  c.fetch_errors = fetch_errors_.load();
  c.rejected_values = rejected_.load();
  c.fetches = fetches_.load();
  c.fetch_seconds = static_cast<double>(fetch_micros_.load()) / 1e6;
  c.prefetches = prefetches_.load();
  c.prefetched_pages = prefetched_pages_.load();
  c.prefetches_cut = prefetches_cut_.load();
  c.prefetch_wait_seconds =
      static_cast<double>(prefetch_wait_micros_.load()) / 1e6;
  c.prefetch_check_seconds =
      static_cast<double>(prefetch_check_micros_.load()) / 1e6;
  c.prefetch_commit_seconds =
      static_cast<double>(prefetch_commit_micros_.load()) / 1e6;
  c.jobs_refused = jobs_refused_.load();
  {
    absl::MutexLock lock(&mu_);
    c.spill_queue_bytes = spill_bytes_;
  }
  return c;
}

}  // namespace kvtier::daemon
