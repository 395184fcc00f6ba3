// ProcessWatch: knowing, without races on pid reuse, whether a particular
// process still exists.
//
// A pid alone names whichever process has it now; after the process exits
// the kernel may hand the pid to another. A process is therefore named by
// its pid and its start time (clock ticks after boot, field 22 of
// /proc/<pid>/stat), which together never repeat within a boot, and watched
// through a pidfd (pidfd_open(2)), which refers to that one process for as
// long as it is open. Where pidfd_open is unavailable (ENOSYS, or refused by
// a seccomp filter) the watch re-reads the start time on every check, which
// is as exact (a reused pid has a later start time) but costs a /proc read.
//
// Thread-safety: ProcessWatch is immutable after Open; Exited() may be
// called from any thread.
#ifndef KVTIER_DAEMON_PROCESS_WATCH_H_
#define KVTIER_DAEMON_PROCESS_WATCH_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"

namespace kvtier::daemon {

// A process of this boot: pid and start time. pid 0 names nobody (a peer
// whose pid the daemon cannot see, e.g. in another pid namespace).
struct ProcessKey {
  pid_t pid = 0;
  uint64_t start_ticks = 0;

  bool operator==(const ProcessKey& o) const {
    return pid == o.pid && start_ticks == o.start_ticks;
  }
  template <typename H>
  friend H AbslHashValue(H h, const ProcessKey& k) {
    return H::combine(std::move(h), k.pid, k.start_ticks);
  }
};

// The start time of process `pid` (ticks after boot). NOT_FOUND when no
// process has that pid; INTERNAL when /proc/<pid>/stat cannot be parsed.
absl::StatusOr<uint64_t> ReadProcessStartTicks(pid_t pid);

class ProcessWatch {
 public:
  // Watches the process `pid`. With start_ticks == 0 that is the process
  // that has the pid now (its start time is read); otherwise only the
  // process with that start time: NOT_FOUND when it has exited (or the pid
  // names another process now). INVALID_ARGUMENT for pid <= 0.
  static absl::StatusOr<std::unique_ptr<ProcessWatch>> Open(
      pid_t pid, uint64_t start_ticks = 0);
  ~ProcessWatch();
  ProcessWatch(const ProcessWatch&) = delete;
  ProcessWatch& operator=(const ProcessWatch&) = delete;

  const ProcessKey& key() const { return key_; }
  // True once the process has exited (a zombie counts as exited: it runs
  // no code and its GPU context is gone). Never false again after true.
  bool Exited() const;
  // The pidfd (readable once the process exits), or -1 without one.
  int fd() const { return pidfd_; }

 private:
  ProcessWatch(ProcessKey key, int pidfd) : key_(key), pidfd_(pidfd) {}
  const ProcessKey key_;
  const int pidfd_;
};

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_PROCESS_WATCH_H_
