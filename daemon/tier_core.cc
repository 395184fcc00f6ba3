// TierCore's construction and destruction, and the list of its namespaces
// that requests over several namespaces take. The requests themselves are
// implemented one job a file (see tier_core.h).
//
// Thread-safety: thread-safe (lock order in tier_core.h).
#include "daemon/tier_core.h"

#include <unistd.h>

#include <memory>
#include <utility>
#include <vector>

namespace kvtier::daemon {

namespace {

std::vector<TierObserver*> AllObservers(KvEventObserver* kv_events,
                                        ClusterBridge* cluster,
                                        const TierOptions& options) {
  std::vector<TierObserver*> all;
  if (kv_events != nullptr) all.push_back(kv_events);
  if (cluster != nullptr) all.push_back(cluster);
  all.insert(all.end(), options.observers.begin(), options.observers.end());
  return all;
}

}  // namespace

TierCore::TierCore(TierOptions options)
    : options_(std::move(options)),
      started_(absl::Now()),
      kv_events_(options_.kv_events == nullptr
                     ? nullptr
                     : std::make_unique<KvEventObserver>(options_.kv_events)),
      cluster_(options_.cluster == nullptr
                   ? nullptr
                   : std::make_unique<ClusterBridge>(
                         options_.cluster,
                         [this](const char* point) { Hook(point); })),
      observers_(AllObservers(kv_events_.get(), cluster_.get(), options_)),
      devices_(options_.device_pools, options_.device_pool_namespaces),
      fence_(std::make_unique<FenceRegistry>(
          options_.state_dir.empty() ? ""
                                     : options_.state_dir + "/fence.instances",
          options_.fence, [this](const char* point) { Hook(point); })) {
  if (!options_.state_dir.empty()) {
    checkpointer_ = std::make_unique<Checkpointer>(
        [this](const char* point) { Hook(point); });
  }
}

TierCore::~TierCore() {
  // Prefetch jobs run on the cluster tier's threads, which outlive this
  // core: stop them and wait until none runs.
  if (cluster_ != nullptr) cluster_->Shutdown();
  {
    absl::MutexLock lock(&sweeper_mu_);
    sweeper_stop_ = true;
  }
  if (sweeper_.joinable()) sweeper_.join();
  // Last: whatever appends to a journal (prefetch jobs, the sweeper) may
  // hand it work, and its thread calls Hook.
  checkpointer_.reset();
  if (state_lock_fd_ >= 0) ::close(state_lock_fd_);
}

std::vector<std::shared_ptr<TierCore::Namespace>> TierCore::Namespaces() {
  std::vector<std::shared_ptr<Namespace>> all;
  absl::ReaderMutexLock lock(&mu_);
  all.reserve(by_name_.size());
  for (const auto& [name, ns] : by_name_) all.push_back(ns);
  return all;
}

}  // namespace kvtier::daemon
