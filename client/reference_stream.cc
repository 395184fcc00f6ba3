// ReferenceStream: an in-order host work queue with a hold.
#include "client/reference_stream.h"

#include <deque>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"

namespace kvtier::client {
namespace {

// Live streams, so FromHandle can tell one from a CUDA stream pointer.
absl::Mutex& RegistryMutex() {
  static absl::Mutex mu(absl::kConstInit);
  return mu;
}
absl::flat_hash_set<const void*>& Registry() {
  static auto* set = new absl::flat_hash_set<const void*>();
  return *set;
}

}  // namespace

struct ReferenceStream::State {
  mutable absl::Mutex mu;
  std::deque<std::function<void()>> queue ABSL_GUARDED_BY(mu);
  size_t running ABSL_GUARDED_BY(mu) = 0;  // 0 or 1.
  uint64_t appended ABSL_GUARDED_BY(mu) = 0;
  uint64_t finished ABSL_GUARDED_BY(mu) = 0;
  bool held ABSL_GUARDED_BY(mu) = false;
  bool stop ABSL_GUARDED_BY(mu) = false;
  std::thread thread;

  void Run() {
    for (;;) {
      std::function<void()> work;
      {
        absl::MutexLock lock(&mu);
        mu.Await(absl::Condition(
            +[](State* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu) {
              return (!s->held && !s->queue.empty()) ||
                     (s->stop && s->queue.empty());
            },
            this));
        if (queue.empty()) return;
        work = std::move(queue.front());
        queue.pop_front();
        running = 1;
      }
      work();
      absl::MutexLock lock(&mu);
      running = 0;
      ++finished;
    }
  }
};

ReferenceStream::ReferenceStream() : state_(std::make_shared<State>()) {
  state_->thread = std::thread([s = state_] { s->Run(); });
  absl::MutexLock lock(&RegistryMutex());
  Registry().insert(this);
}

ReferenceStream::~ReferenceStream() {
  {
    absl::MutexLock lock(&RegistryMutex());
    Registry().erase(this);
  }
  {
    absl::MutexLock lock(&state_->mu);
    state_->held = false;
    state_->stop = true;
  }
  state_->thread.join();
}

ReferenceStream* ReferenceStream::FromHandle(void* stream) {
  if (stream == nullptr) return nullptr;
  absl::MutexLock lock(&RegistryMutex());
  return Registry().contains(stream) ? static_cast<ReferenceStream*>(stream)
                                     : nullptr;
}

size_t ReferenceStream::live_count() {
  absl::MutexLock lock(&RegistryMutex());
  return Registry().size();
}

void ReferenceStream::Enqueue(std::function<void()> work) {
  absl::MutexLock lock(&state_->mu);
  state_->queue.push_back(std::move(work));
  ++state_->appended;
}

void ReferenceStream::Hold() {
  absl::MutexLock lock(&state_->mu);
  state_->held = true;
}

void ReferenceStream::Resume() {
  absl::MutexLock lock(&state_->mu);
  state_->held = false;
}

void ReferenceStream::Synchronize() {
  State& s = *state_;
  absl::MutexLock lock(&s.mu);
  struct Wait {
    State* s;
    uint64_t target;
  } wait{&s, s.appended};
  s.mu.Await(absl::Condition(
      +[](Wait* w) ABSL_NO_THREAD_SAFETY_ANALYSIS {
        return w->s->finished >= w->target;
      },
      &wait));
}

size_t ReferenceStream::pending() const {
  absl::MutexLock lock(&state_->mu);
  return static_cast<size_t>(state_->appended - state_->finished);
}

}  // namespace kvtier::client
