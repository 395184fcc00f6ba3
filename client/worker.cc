// Worker (client/worker.h): a mutex-guarded queue and one thread.
#include "client/worker.h"

#include <deque>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace kvtier::client {

struct Worker::State {
  absl::Mutex mu;
  std::deque<std::function<void()>> tasks ABSL_GUARDED_BY(mu);
  bool stop ABSL_GUARDED_BY(mu) = false;
};

Worker::Worker() : state_(std::make_shared<State>()) {
  thread_ = std::thread([state = state_] { Run(*state); });
}

Worker::~Worker() {
  {
    absl::MutexLock lock(&state_->mu);
    state_->stop = true;
  }
  if (thread_.get_id() == std::this_thread::get_id()) {
    thread_.detach();  // Destroyed by a task: the loop ends by itself.
  } else {
    thread_.join();
  }
}

void Worker::Post(std::function<void()> task) {
  absl::MutexLock lock(&state_->mu);
  state_->tasks.push_back(std::move(task));
}

void Worker::Run(State& s) {
  for (;;) {
    std::function<void()> task;
    {
      absl::MutexLock lock(&s.mu);
      s.mu.Await(absl::Condition(
          +[](State* st) ABSL_EXCLUSIVE_LOCKS_REQUIRED(st->mu) {
            return st->stop || !st->tasks.empty();
          },
          &s));
      if (s.tasks.empty()) return;
      task = std::move(s.tasks.front());
      s.tasks.pop_front();
    }
    task();
  }
}

}  // namespace kvtier::client
