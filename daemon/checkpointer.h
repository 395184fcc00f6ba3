// Checkpointer: compacts namespace journals on a thread of its own, so that
// a checkpoint's file I/O never runs under a namespace's lock.
//
// A journal that grew past its compaction threshold used to be rewritten
// inside the request that crossed it, under the namespace's mutex: every
// request of the namespace waited for the write and its sync, and so did
// whatever waited for that mutex while holding another lock (an Attach
// holds TierCore::mu_, the watchdog's Stats every namespace in turn). Now
// TierNamespace::Journal asks this class (Request) and returns; the thread
// takes the namespace's lock only to encode the checkpoint in memory
// (NamespaceJournal::StartCheckpoint) and to append what came meanwhile
// and rename (FinishCheckpoint); the write and sync run with no lock
// (WriteCheckpoint). A failed append still checkpoints synchronously in the
// request (the change must be durable before it is answered).
//
// Thread-safety: thread-safe. Request takes only this class's own mutex (a
// leaf: callers hold a namespace's mu). The thread takes a namespace's mu
// with no other lock held.
#ifndef KVTIER_DAEMON_CHECKPOINTER_H_
#define KVTIER_DAEMON_CHECKPOINTER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace kvtier::daemon {

struct TierNamespace;

class Checkpointer {
 public:
  // `hook`: called with "checkpoint:writing" just before a checkpoint's
  // unlocked write (TierCore's test hook), or empty.
  explicit Checkpointer(std::function<void(const char*)> hook = {});
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;
  // Stops the thread after the checkpoint in progress, if any; namespaces
  // still queued are left as they are (their journals stay whole).
  ~Checkpointer();

  // Queues `ns` for a checkpoint of its journal. The thread checks, under
  // the namespace's lock, that one is still due (the journal still there,
  // past its threshold, none in progress), so a spurious request costs a
  // lock and nothing more.
  void Request(std::weak_ptr<TierNamespace> ns) ABSL_LOCKS_EXCLUDED(mu_);

  // Calls the hook (the constructor's), if any, at `point`: also where a
  // checkpoint is written in a request ("checkpoint:writing").
  void Hook(const char* point) const {
    if (hook_) hook_(point);
  }

  // Checkpoints finished and discarded (abandoned, failed) so far.
  uint64_t written() const;
  uint64_t discarded() const;

 private:
  void Run();
  void CheckpointOne(TierNamespace& ns);

  const std::function<void(const char*)> hook_;
  mutable absl::Mutex mu_;
  std::deque<std::weak_ptr<TierNamespace>> queue_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t written_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t discarded_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_CHECKPOINTER_H_
