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
// Across daemon restarts: every holder (a process's connection, or an
// unseen instance's) is recorded, once per namespace it attached to, in a
// small file in the state folder (one CRC-checked line each; the file's
// functions: fence_registry_file.cc). Recover reads it: the recorded
// holders still alive are the restart fences' waiting set, per namespace:
// namespace N's restart fence waits only for the holders recorded in N,
// each resolved for N when it reports from a session attached to N
// (ReportComplete from a session of the same pid, start time and
// connection) or when its process exits. A line of an older daemon names
// no namespace: its holder waits in every namespace, resolved everywhere by
// one complete report that left out no namespace it held. Unseen instances
// wait until one of their sessions reports, or `unseen_pid_hold` after the
// recovery. Only the holders waiting for N may take rows out of N's restart
// fence (RestartHolder): nobody else held rows there before the restart.
//
// The file does not grow with client-chosen ids: one uid may have at most
// `max_holders_per_uid` lines recorded (NoteHolder refuses more, naming
// --max_fence_holders_per_uid), a line is forgotten once its process exited
// (or its unseen instance is gone), and the file is rewritten with the live
// lines once the dead ones outnumber them (and kCompactAfter).
//
// Thread-safety: thread-safe. Its mutex mu_ is a leaf: it is taken under
// TierCore::mu_ and Namespace::mu, and the registry calls nothing outside
// under it. The file is written under io_mu_ (taken before mu_, never under
// it), so a slow write holds neither mu_ nor, as long as its callers do
// not, TierCore::mu_: NoteHolder and BindPeer write (and read /proc) and
// are called with no lock held; every other call is memory only (Poll and
// InstanceGone poll pidfds, and read /proc only where pidfd_open is
// unavailable).
#ifndef KVTIER_DAEMON_FENCE_REGISTRY_H_
#define KVTIER_DAEMON_FENCE_REGISTRY_H_

#include <sys/types.h>

#include <cstdint>
#include <functional>
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
  // Most lines (holder and namespace) one uid may have recorded at once
  // (--max_fence_holders_per_uid; at least 1). Sessions whose credentials
  // are not bound share one count.
  uint32_t max_holders_per_uid = 16384;
};

// A uid the registry counts sessions without bound credentials under.
inline constexpr uid_t kUnboundUid = static_cast<uid_t>(-1);

class FenceRegistry {
 public:
  // `path`: the file recording processes across restarts (empty: none).
  // `hook`: called at "fence:record" before each write of the file, with
  // only io_mu_ held (tests stall it there); may be empty.
  FenceRegistry(std::string path, FenceOptions options,
                std::function<void(const char*)> hook = {});
  // Lines rewritten away only once at least this many are dead.
  static constexpr size_t kCompactAfter = 64;
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
  // comment) and watches the process. Only the first call counts. Reads
  // /proc and may write the file: call it with no lock held.
  void BindPeer(uint64_t session, pid_t pid, uid_t uid);
  // The session is about to hold rows in namespace `ns` (it attaches):
  // records its holder there in the file the first time, and returns once
  // the line is written (by this call or a concurrent one), so that it is
  // in the file before any row of `ns` reaches the holder.
  // RESOURCE_EXHAUSTED, recording nothing, when the session's uid has
  // max_holders_per_uid lines already. Unknown sessions: OK, nothing done.
  // Writes the file: call it with no lock held.
  absl::Status NoteHolder(uint64_t session, const std::string& ns);
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
  // The session's connection reported everything it holds in `namespaces`
  // (those the session attached to): it leaves their restart fences'
  // waiting sets. A holder recorded by an older daemon (every namespace)
  // leaves all of them, unless `unresolved` (its report named a namespace
  // the session could not act on).
  void ReportComplete(uint64_t session,
                      const std::vector<std::string>& namespaces,
                      bool unresolved);
  // True when the session's process (or, not visible, its instance) is one
  // namespace `ns`'s restart fence still waits for: it held rows there
  // before the restart, so its report may keep rows of that fence.
  bool RestartHolder(uint64_t session, const std::string& ns) const;

  // True when nothing of `instance` can touch rows any more (see the file
  // comment). Unknown instances are gone.
  bool InstanceGone(const InstanceKey& instance) const;
  // Re-checks every watched process; forgets gone instances, resolves
  // exited processes of the restart fence and forgets their lines (then
  // rewrites the file if the dead lines outnumber the live ones and
  // kCompactAfter). Returns true when anything changed (an instance went, a
  // waiting process resolved). Call it with no lock held.
  bool Poll();
  // Holders (connections of processes, and unseen instances') that restart
  // fences still wait for: all of them, or those namespace `ns`'s waits
  // for; and their description for clients ("pid 123", "a process in a pid
  // namespace the daemon cannot see": never an instance id).
  size_t restart_waiting() const;
  size_t RestartWaiting(const std::string& ns) const;
  std::vector<std::string> RestartWaitingNames(const std::string& ns,
                                               size_t limit) const;
  // Lines recorded (live) and written to the file (live and dead).
  size_t recorded() const;
  size_t file_lines() const;

  // One line of the file: a holder of an instance in a namespace (empty:
  // every namespace, a line of an older daemon).
  struct Record {
    InstanceKey instance;
    HolderKey holder;
    std::string ns;
    bool operator==(const Record& o) const {
      return instance == o.instance && holder == o.holder && ns == o.ns;
    }
    template <typename H>
    friend H AbslHashValue(H h, const Record& r) {
      return H::combine(std::move(h), r.instance, r.holder, r.ns);
    }
  };
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
    uid_t uid = kUnboundUid;
    uint32_t fence_version = 0;
    HolderKey holder;  // pid 0 until bound (or not visible).
    bool quiescent = false;
    bool attached = false;  // May hold rows (NoteHolder).
    // Namespaces it attached to (NoteHolder), for the lines BindPeer adds.
    absl::flat_hash_set<std::string> namespaces;
  };
  struct RecordState {
    uid_t uid = kUnboundUid;
    bool written = false;  // Its line is in the file (or failed to be).
  };
  // Whom a restart fence waits for: namespaces, or every one.
  struct Waiting {
    bool every = false;
    absl::flat_hash_set<std::string> namespaces;
    bool Covers(const std::string& ns) const {
      return every || namespaces.contains(ns);
    }
  };
  struct WaitingUnseen {
    absl::Time give_up;
    Waiting in;
  };

  bool InstanceGoneLocked(const InstanceKey& key, absl::Time now) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Claims `r` for `uid` (RESOURCE_EXHAUSTED over the cap; `cap` false:
  // no cap). Sets *write when the caller must write its line (WriteRecord);
  // else waits, releasing mu_, until another caller wrote it.
  absl::Status ClaimRecordLocked(const Record& r, uid_t uid, bool cap,
                                 bool* write)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Forgets `r` (its line stays in the file, dead, until a rewrite).
  void DropRecordLocked(const Record& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Appends r's line to the file (best effort: a failure is logged; the
  // fence then cannot survive a restart for that holder) and marks it
  // written. fence_registry_file.cc.
  void WriteRecord(const Record& r) ABSL_LOCKS_EXCLUDED(mu_, io_mu_);
  // Rewrites the file with the live lines when the dead ones outnumber
  // them and kCompactAfter. fence_registry_file.cc.
  void MaybeCompact() ABSL_LOCKS_EXCLUDED(mu_, io_mu_);
  void CompactLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(io_mu_)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Writes `lines` to path_ through a temporary file and reopens fd_.
  absl::Status RewriteLocked(const std::string& lines)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(io_mu_);

  const std::string path_;
  const FenceOptions options_;
  const std::function<void(const char*)> hook_;

  // The file. Lock order: io_mu_, then mu_.
  absl::Mutex io_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  int fd_ ABSL_GUARDED_BY(io_mu_) = -1;  // The file, for appending.

  mutable absl::Mutex mu_;
  absl::CondVar written_ ABSL_GUARDED_BY(mu_);  // A record was written.
  absl::flat_hash_map<uint64_t, SessionEntry> sessions_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<ProcessKey, Process> processes_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<InstanceKey, Instance> instances_ ABSL_GUARDED_BY(mu_);
  // Lines recorded (being written, or in the file), and how many per uid.
  absl::flat_hash_map<Record, RecordState> recorded_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uid_t, size_t> recorded_per_uid_ ABSL_GUARDED_BY(mu_);
  size_t file_lines_ ABSL_GUARDED_BY(mu_) = 0;  // Live and dead.
  // The restart fences' waiting set: holders with a visible process...
  absl::flat_hash_map<HolderKey, Waiting> waiting_ ABSL_GUARDED_BY(mu_);
  // ...and unseen ones, by instance and connection, with a give-up time.
  absl::flat_hash_map<std::pair<InstanceKey, uint64_t>, WaitingUnseen>
      waiting_unseen_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_FENCE_REGISTRY_H_
