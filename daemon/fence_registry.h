// FenceRegistry: the client instances and processes that may still touch
// rows, for the fence protocol (proto/kvtier/v1/tier.proto, "fence").
//
// An instance is one engine: a 16-byte id its processes present in Hello
// (or, for a client without the protocol, just its one session). The id
// alone proves nothing (the vLLM connector derives it from engine_id, which
// users set): an instance is bound to the kernel's credentials of its
// processes. Once a session's credentials are bound (SO_PEERCRED; see
// daemon/peer_credentials.h) its instance is the id together with the
// peer's uid and pid namespace (BindPeer), so a process of another user,
// or of the same user in another pid namespace (another container),
// presenting the same id is another instance, never the first's. A session
// whose credentials are never bound (only where --require_peer_credentials
// is off) is an instance of the id alone, which no bound session shares.
// Instance keys name their id: they go to logs and the state folder, never
// to clients.
//
// A process is known once its session's credentials are bound and watched
// by pid and start time (daemon/process_watch.h). An instance is gone when
// it has no open session and every process of it has exited; rows fenced
// for it are then freed.
//
// Policy for a peer whose pid the daemon cannot see (another pid namespace:
// SO_PEERCRED gives pid 0, or credentials never bound): its instance counts
// as alive while it has an open session and for `unseen_pid_hold` after its
// last one closed; a report from any of its sessions resolves it earlier.
// unseen_pid_processes() counts such sessions for the metrics.
//
// Across daemon restarts: every process (and unseen instance) that attached
// to a namespace is recorded, once, in a small file in the state folder
// (one CRC-checked line each). Recover reads it: the recorded processes
// still alive are the restart fence's waiting set, resolved one by one when
// the process reports (ReportComplete from a session of the same pid and
// start time) or exits. Unseen instances wait until one of their sessions
// reports, or `unseen_pid_hold` after the recovery. Only the processes (and
// unseen instances) of the waiting set may take rows out of the restart
// fence (RestartHolder): nobody else held rows before the restart.
//
// Thread-safety: thread-safe. Its mutex is a leaf: it is taken under
// TierCore::mu_ and Namespace::mu, and the registry calls nothing outside.
#ifndef KVTIER_DAEMON_FENCE_REGISTRY_H_
#define KVTIER_DAEMON_FENCE_REGISTRY_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/process_watch.h"

namespace kvtier::daemon {

// 16 bytes from Hello.instance_id, then, once the session's credentials
// are bound, the peer's uid (4 bytes) and pid namespace (8 bytes: the inode
// of /proc/<pid>/ns/pid, 0 when the daemon cannot see or read it); or "s:"
// and 8 bytes of session id for a session without an id.
using InstanceKey = std::string;

inline constexpr size_t kInstanceIdBytes = 16;

// Who held rows: a process (pid 0: not visible) and the client connection
// in it (Hello.connection_id), which reports for itself.
struct HolderKey {
  ProcessKey process;
  uint64_t connection = 0;
  bool operator==(const HolderKey& o) const {
    return process == o.process && connection == o.connection;
  }
  template <typename H>
  friend H AbslHashValue(H h, const HolderKey& k) {
    return H::combine(std::move(h), k.process, k.connection);
  }
};

struct FenceOptions {
  // See the file comment: how long an instance whose processes the daemon
  // cannot watch stays alive after its last session closed.
  absl::Duration unseen_pid_hold = absl::Minutes(5);
};

class FenceRegistry {
 public:
  // `path`: the file recording processes across restarts (empty: none).
  FenceRegistry(std::string path, FenceOptions options);
  ~FenceRegistry();
  FenceRegistry(const FenceRegistry&) = delete;
  FenceRegistry& operator=(const FenceRegistry&) = delete;

  // Reads the file an earlier run wrote: its processes that still live
  // (and its unseen instances) become the restart fence's waiting set, and
  // the file is rewritten with just them. Returns the waiting count. A
  // missing file is an empty set; unreadable lines are skipped and logged
  // (a torn last line is what a crash leaves). REQUIRES: called once,
  // before any session.
  absl::StatusOr<size_t> Recover();

  // A session opened. `instance_id`: Hello.instance_id (empty or 16 bytes,
  // checked by the caller).
  void OpenSession(uint64_t session, const std::string& instance_id,
                   uint32_t fence_version, uint64_t connection_id = 0);
  // The session's credentials were bound (pid 0: not visible): binds its
  // instance to `uid` and the pid namespace of process `pid` (see the file
  // comment) and watches the process. Only the first call counts.
  void BindPeer(uint64_t session, pid_t pid, uid_t uid);
  // The session is about to hold rows (it attached): records its process,
  // or its unseen instance, in the file the first time.
  void NoteHolder(uint64_t session);
  // The session said Goodbye{quiescent}.
  void MarkQuiescent(uint64_t session);

  struct Closed {
    InstanceKey instance;
    // Quiescent, or its instance is gone (no other session, every process
    // exited): what the session held may be handed out at once.
    bool free_now = false;
    HolderKey holder;  // pid 0 when not visible.
  };
  // Forgets the session. Unknown sessions: free_now and an empty instance.
  Closed CloseSession(uint64_t session);

  // The instance and holder of an open session (false when unknown).
  bool SessionOwner(uint64_t session, InstanceKey* instance,
                    HolderKey* holder) const;
  // Whether the session speaks the fence protocol (Hello.fence_version).
  uint32_t FenceVersion(uint64_t session) const;
  // The session's connection reported everything it holds: it leaves the
  // restart fence's waiting set.
  void ReportComplete(uint64_t session);
  // True when the session's process (or, not visible, its instance) is one
  // the restart fence still waits for: it held rows before the restart, so
  // its report may keep rows of the restart fence.
  bool RestartHolder(uint64_t session) const;

  // True when nothing of `instance` can touch rows any more (see the file
  // comment). Unknown instances are gone.
  bool InstanceGone(const InstanceKey& instance) const;
  // Re-checks every watched process; forgets gone instances and resolves
  // exited processes of the restart fence. Returns true when anything
  // changed (an instance went, a waiting process resolved).
  bool Poll();
  // Processes (and unseen instances) the restart fence still waits for,
  // and their description for clients ("pid 123", "a process in a pid
  // namespace the daemon cannot see": never an instance id).
  size_t restart_waiting() const;
  std::vector<std::string> RestartWaitingNames(size_t limit) const;

  size_t instances() const;
  size_t unseen_pid_processes() const;
  // Printable instance key (hex), for logs only.
  static std::string Describe(const InstanceKey& instance);

 private:
  struct Process {
    InstanceKey instance;
    std::unique_ptr<ProcessWatch> watch;  // Null once exited.
  };
  struct Instance {
    uint32_t sessions = 0;
    absl::flat_hash_set<ProcessKey> processes;
    bool unseen = false;  // A session of it had no visible pid.
    absl::Time last_close = absl::InfinitePast();
  };
  struct SessionEntry {
    InstanceKey instance;
    std::string client_id;  // Hello.instance_id (empty: none).
    bool bound = false;     // BindPeer came.
    uint32_t fence_version = 0;
    HolderKey holder;  // pid 0 until bound (or not visible).
    bool quiescent = false;
    bool attached = false;  // May hold rows (NoteHolder).
  };

  bool InstanceGoneLocked(const InstanceKey& key, absl::Time now) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Appends one line to the file (best effort: a failure is logged; the
  // fence then cannot survive a restart for that holder).
  void RecordLocked(const InstanceKey& instance, const HolderKey& holder)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string path_;
  const FenceOptions options_;

  mutable absl::Mutex mu_;
  int fd_ ABSL_GUARDED_BY(mu_) = -1;  // The file, for appending.
  absl::flat_hash_map<uint64_t, SessionEntry> sessions_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<ProcessKey, Process> processes_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<InstanceKey, Instance> instances_ ABSL_GUARDED_BY(mu_);
  // Holders recorded in the file already.
  absl::flat_hash_set<std::pair<InstanceKey, HolderKey>> recorded_
      ABSL_GUARDED_BY(mu_);
  // The restart fence's waiting set: holders with a visible process...
  absl::flat_hash_set<HolderKey> waiting_ ABSL_GUARDED_BY(mu_);
  // ...and unseen ones, by instance and connection, with a give-up time.
  absl::flat_hash_map<std::pair<InstanceKey, uint64_t>, absl::Time>
      waiting_unseen_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_FENCE_REGISTRY_H_
