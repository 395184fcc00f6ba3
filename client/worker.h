// Worker: the one thread per Client that runs deferred work off the
// engine's threads: the RPCs of CommitAfter, ReleaseAfter and AbortAfter,
// handed over by a stream's host callback once the stream's copies are done
// (a CUDA host callback must not call CUDA, and should not block on an RPC).
//
// Tasks run one at a time, in the order posted. A task may drop the last
// reference to the Connection that owns this Worker, so the queue lives in a
// State the thread co-owns: the Worker can be destroyed from inside a task
// without pulling the queue out from under the running loop.
//
// Thread-safety: Post is thread-safe. The destructor runs what is queued,
// then joins the thread; called from a task (on the worker's own thread) it
// detaches instead, and the loop ends once the queue is empty.
#ifndef KVTIER_CLIENT_WORKER_H_
#define KVTIER_CLIENT_WORKER_H_

#include <functional>
#include <memory>
#include <thread>

namespace kvtier::client {

class Worker {
 public:
  Worker();
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // Queues `task` to run on the worker thread.
  void Post(std::function<void()> task);

 private:
  struct State;
  static void Run(State& s);

  std::shared_ptr<State> state_;
  std::thread thread_;
};

}  // namespace kvtier::client

#endif  // KVTIER_CLIENT_WORKER_H_
