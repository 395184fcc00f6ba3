// TierCore: the daemon's transport-free core.
//
// It owns every namespace (its shared-memory banks and its PrefixIndex), the
// sessions of engine processes, and the reservations and leases those
// sessions hold. The gRPC service (tier_service.h) is a thin adapter over it;
// unit tests call it directly. Requests and responses are the kvtier.v1
// protobuf messages: plain data here, no transport.
//
// Every request is validated completely before anything changes: a bad id,
// count, length or hash size returns INVALID_ARGUMENT / NOT_FOUND /
// FAILED_PRECONDITION naming the field, and the state is unchanged.
//
// With a state_dir, each namespace's index changes (reservations handed out,
// commits, dropped subtrees) are appended to its journal (daemon/journal.h)
// inside the namespace's critical section, before the request is answered;
// Recover rebuilds everything from the journals when the daemon starts.
//
// The fence (proto/kvtier/v1/tier.proto, "fence"; daemon/tier_fence*.cc):
// what a session held when it ended while its process lives on, what a
// reservation dropped with queued writes held, and after a restart every
// row from before it, are kept as fence holds that no Reserve can take
// until the holder confirms or its processes are gone (FenceRegistry).
//
// Slow work stays outside TierCore::mu_, which every request takes: a
// namespace's banks are created and populated, and its journal's first
// checkpoint written, with mu_ released while the name is reserved
// (tier_create.cc); Drop removes journal and segments likewise. So Stats
// (the systemd watchdog's probe) and the other namespaces' requests go on
// while a large namespace is created.
//
// The implementation, one job a file: tier_core.cc (construction),
// tier_session.cc (sessions), tier_create.cc (namespace creation),
// tier_attach.cc (Attach, Drop), tier_lookup.cc (Lookup, Release),
// tier_reserve.cc (Reserve, Abort), tier_commit.cc (Commit, AdoptMirror),
// tier_introspect.cc (Stats, listings, Verify), tier_access.cc (rights),
// tier_fence.cc (the Fence RPC), tier_fence_holds.cc (holds, sweeps),
// tier_recovery.cc (Recover); TierNamespace (tier_namespace.h) is one
// namespace, DeviceTiers (tier_device.h) the device pools, tier_request.h
// the checks requests share, and TierOptions (tier_options.h) the options.
// What the indexes do reaches the KV events (KvEventObserver), the cluster
// tier (ClusterBridge, which also runs the prefetch jobs) and any other
// observer through one seam, TierObserver (tier_observer.h).
//
// Thread-safety: thread-safe. Lock order: TierCore::mu_, then one
// Namespace::mu (never two namespaces at once), then the FenceRegistry's
// (a leaf); a namespace's journal is used under its Namespace::mu (or by
// whoever creates or drops it before it is published or after it is
// forgotten, with no lock).
#ifndef KVTIER_DAEMON_TIER_CORE_H_
#define KVTIER_DAEMON_TIER_CORE_H_

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/cluster_bridge.h"
#include "daemon/fence_registry.h"
#include "daemon/journal.h"
#include "daemon/kv_event_observer.h"
#include "daemon/peer_credentials.h"
#include "daemon/prefix_index.h"
#include "daemon/tier_device.h"
#include "daemon/tier_namespace.h"
#include "daemon/tier_observer.h"
#include "daemon/tier_options.h"
#include "daemon/tier_reports.h"
#include "kvtier/v1/tier.pb.h"

namespace kvtier::daemon {

// Who makes an introspection or drop request (daemon/tier_access.cc).
struct Caller {
  // Came in on the operator socket (kvtierd's <socket>.admin, which only
  // --admin_group and the daemon's uid can reach), or from inside the
  // daemon: every right.
  bool operator_socket = true;
  // Otherwise: the session whose bound peer credentials decide (0: none,
  // which may act only on namespaces no --namespace_acl entry governs).
  uint64_t session_id = 0;

  // This caller, with the request's `session` standing in when the caller
  // names none.
  Caller WithSession(uint64_t session) const {
    return {operator_socket, session_id != 0 ? session_id : session};
  }
};

// A session id is the capability of every RPC of its session: logs name a
// session by this tag (its low 16 bits), never by the whole id.
inline std::string SessionTag(uint64_t session_id) {
  return absl::StrFormat("s-%04x", session_id & 0xffff);
}

class TierCore {
 public:
  explicit TierCore(TierOptions options);
  ~TierCore();
  TierCore(const TierCore&) = delete;
  TierCore& operator=(const TierCore&) = delete;

  // The plain data it reports beside the RPCs' responses (tier_reports.h).
  using LookupOutcome = TierLookupOutcome;  // Lookup's, without protobuf.
  using FenceCounters = TierFenceCounters;
  using RecoveryReport = TierRecoveryReport;
  using Unrecoverable = TierUnrecoverable;
  using NamespaceCounters = TierNamespaceCounters;

  // Opens a session for an engine process and returns its id (non-zero,
  // unguessable). Its pins and reservations live until CloseSession.
  absl::StatusOr<uint64_t> OpenSession(const v1::Hello& hello,
                                       const PeerInfo& peer);
  // Releases every lease and aborts every reservation of the session, then
  // forgets it. Unknown ids are ignored (a session may close twice: stream
  // end and server shutdown). Unless the session said Goodbye{quiescent}
  // (SessionGoodbye) or its process has exited, its reservations and leases
  // become fence holds of its instance instead of being freed.
  void CloseSession(uint64_t session_id);
  // The session's Goodbye: with `quiescent`, nothing it holds has queued
  // work, so CloseSession frees at once. Unknown sessions are ignored.
  void SessionGoodbye(uint64_t session_id, bool quiescent);
  // The Fence RPC: reports after a reconnection, releases of holds. Both
  // act only in namespaces the session attached to (which the ACL let it):
  // elsewhere an item gets hold 0 and a hold id is unknown. Rows of a
  // restart fence go under a hold only for a process that held rows before
  // the restart, and stay the fence's until no hold names them. NOT_FOUND
  // for an unknown session; INVALID_ARGUMENT naming the field for a
  // malformed item, PERMISSION_DENIED when a released hold belongs to
  // another instance (another user presenting the same id is one): then
  // nothing changes.
  absl::Status Fence(const v1::FenceRequest& request,
                     v1::FenceResponse* response);
  // Frees the holds of instances that are gone and lifts restart fences
  // whose waiting processes all resolved. Returns the holds freed.
  // kvtierd runs it from the sweeper (StartFenceSweeper); tests call it.
  size_t SweepFences() ABSL_LOCKS_EXCLUDED(mu_);
  // Runs SweepFences every `period` on a thread until destruction.
  void StartFenceSweeper(absl::Duration period);

  // Creates the namespace (its banks populated) or opens it; attaches the
  // session to it at `tp_rank`. A layout that contradicts the existing
  // namespace of that name is FAILED_PRECONDITION naming the first field that
  // differs. The banks are created without TierCore::mu_ held: other
  // requests go on meanwhile. An Attach (or CreateNamespace, or Drop) of a
  // name being created waits for that creation, then opens the namespace or
  // returns the creation's error. A session that closes while its Attach
  // creates the namespace gets NOT_FOUND (session_id); the namespace is
  // created anyway, with no session attached.
  absl::Status Attach(const v1::AttachRequest& request,
                      v1::AttachResponse* response);
  absl::Status Lookup(const v1::LookupRequest& request,
                      v1::LookupResponse* response);

  // Lookup over packed `hashes`, with the same checks and effects.
  // `device_pool` >= 0 (REQUIRES: below the number of device pools) also
  // consults that pool's device tier, pinning its slot under the lease.
  absl::Status LookupHashes(uint64_t session_id, uint64_t namespace_id,
                            absl::string_view hashes, bool pin,
                            LookupOutcome* out, int device_pool = -1)
      ABSL_LOCKS_EXCLUDED(mu_);
  // True when `session_id` is an open session.
  bool SessionOpen(uint64_t session_id) ABSL_LOCKS_EXCLUDED(mu_);
  // Binds the kernel's record of the session's peer (SO_PEERCRED of a
  // connection that presented the session id) to the session, and its
  // fence instance to the peer's uid and pid namespace (fence_registry.h).
  // Idempotent for the same uid and gid; PERMISSION_DENIED when the session
  // is bound to other credentials already (a binding is final); NOT_FOUND
  // for an unknown session; INVALID_ARGUMENT when `peer` is not verified.
  absl::Status BindPeerCredentials(uint64_t session_id, const PeerInfo& peer);
  absl::Status Reserve(const v1::ReserveRequest& request,
                       v1::ReserveResponse* response);
  // With mirror_indices set: AdoptMirror.
  absl::Status Commit(const v1::CommitRequest& request,
                      v1::CommitResponse* response);
  // Commit of a mirror: copies the session's mirror rows (reservation_id's
  // page_rows at mirror_indices) host-to-host, bank by bank, into newly
  // allocated rows and commits those under the hashes. The mirror
  // reservation is unchanged. Nothing goes through a GPU.
  absl::Status AdoptMirror(const v1::CommitRequest& request,
                           v1::CommitResponse* response)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Abort(const v1::AbortRequest& request,
                     v1::AbortResponse* response);
  absl::Status Release(const v1::ReleaseRequest& request,
                       v1::ReleaseResponse* response);
  // Starts bringing the continuation of request.hashes past the local
  // match from the cluster tier into the host tier, on a job thread of the
  // ClusterTier, and returns at once (ClusterBridge; the contract is in
  // tier.proto, "prefetch"). Without a cluster tier: the local match, and
  // nothing remote. RESOURCE_EXHAUSTED when too many prefetches wait;
  // UNAVAILABLE while the core shuts down.
  absl::Status Prefetch(const v1::PrefetchRequest& request,
                        v1::PrefetchResponse* response);
  // The cluster tier (TierOptions::cluster), or nullptr.
  ClusterTier* cluster() const { return options_.cluster; }
  // Drops the prefix subtree under `hash`, or, without one, the whole
  // namespace (FAILED_PRECONDITION while sessions are attached, unless
  // force): its journal and segments are unlinked with TierCore::mu_
  // released, and an Attach of the name meanwhile waits until they are
  // gone, then creates a new namespace. A Drop of a name being created waits
  // for the creation first. Only what `caller` may drop (CheckNamespaceRight).
  // The device-pool slots of its reservations, leases and fence holds are
  // handed to nobody until their holder confirms or is gone
  // (OrphanDeviceSlotsLocked). A namespace Recover kept as unrecoverable is
  // deleted only for an operator or with force (else FAILED_PRECONDITION,
  // nothing changed).
  //
  // Drop, Stats, ListNamespaces and ListPrefixes act only on what `caller`
  // may see (CheckNamespaceRight): an engine-socket caller gets
  // PERMISSION_DENIED naming the right it lacks for Drop and ListPrefixes,
  // and sees only its namespaces in Stats and ListNamespaces.
  absl::Status Drop(const v1::DropRequest& request, v1::DropResponse* response,
                    const Caller& caller = {});
  absl::Status Stats(const v1::StatsRequest& request,
                     v1::StatsResponse* response, const Caller& caller = {})
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status ListNamespaces(const v1::ListNamespacesRequest& request,
                              v1::ListNamespacesResponse* response,
                              const Caller& caller = {});
  absl::Status ListPrefixes(const v1::ListPrefixesRequest& request,
                            v1::ListPrefixesResponse* response,
                            const Caller& caller = {});

  // Runs CheckInvariants for the Verify RPC: OK with ok=false and the
  // violation when one is found. Operators only (PERMISSION_DENIED on the
  // engine socket). Bounded so it cannot stall lookups: one Verify at a
  // time (another is RESOURCE_EXHAUSTED), one namespace's lock at a time,
  // and after each namespace it waits as long as that namespace's check
  // held the lock, so lookups get at least half of every namespace's time.
  absl::Status Verify(const v1::VerifyRequest& request,
                      v1::VerifyResponse* response, const Caller& caller = {});

  // OK when `caller` may use `right` ("drop", "list") on namespace `name`:
  // operators always; otherwise when no --namespace_acl entry governs it, or
  // the caller's session has bound credentials the entry allows.
  // PERMISSION_DENIED naming the right, the uid and the operator socket;
  // NOT_FOUND for an unknown session.
  absl::Status CheckNamespaceRight(const Caller& caller, absl::string_view name,
                                   absl::string_view right)
      ABSL_LOCKS_EXCLUDED(mu_);
  // True when device pool `pool` serves namespace `name`
  // (device_pool_namespaces).
  bool PoolServes(uint32_t pool, absl::string_view name) const {
    return devices_.Serves(pool, name);
  }

  // Creates a namespace with no session attached (the daemon's --demo
  // namespace). Same validation as Attach; OK when it exists with that
  // layout.
  absl::Status CreateNamespace(const std::string& name,
                               const v1::Layout& layout,
                               const v1::Capacity& capacity);

  // Checks every namespace's invariants: each row of every bank is free,
  // reserved or committed, never two of them; reservations and leases belong
  // to live sessions. Returns INTERNAL naming the first violation. With
  // `pace`, waits after each namespace as long as its check took.
  absl::Status CheckInvariants(bool pace = false) ABSL_LOCKS_EXCLUDED(mu_);

  // Number of live sessions.
  size_t session_count();

  // Test hook: called with a point's name ("reserve:resolved",
  // "lookup:resolved") where a test forces an interleaving, e.g. closing the
  // session while the request is between Resolve and the namespace lock.
  // "attach:populating": a namespace's segments are about to be created,
  // mu_ not held. "drop:unlinking": Drop is about to remove a namespace's
  // journal and segments, mu_ not held. "namespace:wait": a request is about
  // to wait for a name being created or dropped (mu_ held: the hook must
  // not block). "checkpoint:writing": the checkpointer is about to write a
  // journal's checkpoint, no lock held. "prefetch:copied": a prefetch
  // slice's values were copied into its rows, not yet committed (a prefetch
  // job's thread, no lock). "fence:record": a line is about to be written
  // to <state_dir>/fence.instances (only the FenceRegistry's file lock
  // held: fence_registry.h).
  // Set before any request; nullptr: none.
  void SetTestHook(std::function<void(const char* point)> hook) {
    test_hook_ = std::move(hook);
  }

  // The fence's figures for Stats and the metrics.
  FenceCounters GetFenceCounters();
  // The KV event sink (TierOptions::kv_events), or nullptr.
  const KvEventSink* kv_events() const { return options_.kv_events; }

  // Rebuilds the namespaces recorded in options.state_dir: reopens their
  // segments, checks each segment's content nonce against the journal,
  // replays the journal into the index, and writes a fresh checkpoint.
  // Takes an exclusive lock on the folder for the daemon's lifetime
  // (FAILED_PRECONDITION when another daemon holds it). Recovery never
  // destroys what it cannot reopen: a namespace whose banks cannot be
  // reopened (a lowered budget, ENOMEM) or whose journal is unreadable or
  // corrupt (a bad record before the end) keeps its journal and segments
  // and becomes unrecoverable: nothing is served from it and Attach to its
  // name is refused until RetryUnrecoverable reopens it (not for corrupt
  // journals) or an operator drops it; with corrupt_journal_empty a corrupt
  // one is reopened empty instead. One whose segments were recreated is
  // reopened empty. Processes recorded before the restart that still live
  // put up the restart fence (tier_core.h, "fence"). First, with or
  // without a state_dir, removes (and logs) the temporary segment files
  // that creators killed part-way left in the segment folders
  // (shm/segment_cleanup.h). REQUIRES: called once, before any session
  // opens. With no state_dir it does nothing more.
  absl::StatusOr<RecoveryReport> Recover();
  // The namespaces kept but not served, sorted by name.
  std::vector<Unrecoverable> UnrecoverableNamespaces() ABSL_LOCKS_EXCLUDED(mu_);
  // Tries to reopen the unrecoverable namespaces that are not corrupt;
  // returns how many came back. The sweeper calls it every 10 s.
  size_t RetryUnrecoverable() ABSL_LOCKS_EXCLUDED(mu_);

  // Counters beside Stats that the metrics exporter reads at scrape time:
  // one entry per namespace, sorted by name; each counter only grows while
  // its namespace lives.
  std::vector<NamespaceCounters> Counters();

 private:
  using Namespace = TierNamespace;
  struct Session {
    uint64_t id = 0;
    uint32_t fence_version = 0;
    std::string client_name;
    PeerInfo peer;
    absl::Time opened;
    // namespace id -> rank the session attached at.
    absl::flat_hash_map<uint64_t, uint32_t> attached;
  };

  // Calls the test hook (SetTestHook), if any, at `point`.
  void Hook(const char* point) {
    if (test_hook_) test_hook_(point);
  }

  // ---- sessions (tier_session.cc) ----
  // Resolves (session, namespace) of a request to the namespace and the
  // session's storage rank there.
  absl::StatusOr<std::shared_ptr<Namespace>> Resolve(uint32_t api_version,
                                                     uint64_t session_id,
                                                     uint64_t namespace_id,
                                                     uint32_t* rank)
      ABSL_LOCKS_EXCLUDED(mu_);

  // ---- rights (tier_access.cc) ----
  // The credentials that decide an engine-socket caller's rights: its
  // session's bound peer (none for a caller without a session). NOT_FOUND
  // for an unknown session.
  absl::StatusOr<PeerInfo> CallerPeerLocked(const Caller& caller)
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // CheckNamespaceRight of an engine-socket `caller` whose credentials are
  // `peer` (CallerPeerLocked's).
  absl::Status CheckRight(const Caller& caller, const PeerInfo& peer,
                          absl::string_view name,
                          absl::string_view right) const;

  // ---- namespace creation (tier_create.cc) ----
  struct PendingName;    // tier_create.cc
  struct NamespacePlan;  // tier_create.cc
  // Returns the namespace `name`, creating it when it does not exist.
  // `creator`: the attaching session's peer, charged for a namespace this
  // creates under --uid_budget_bytes when verified (nullptr: nobody).
  // `recovering`: Recover reopens it from its journal (no unrecoverable
  // check, no journal written). Returns with mu_ held and the namespace
  // published, but RELEASES mu_ meanwhile (while it waits for a pending
  // name, and while it creates segments and journal): the caller must look
  // up again anything it found under mu_ before the call.
  absl::StatusOr<std::shared_ptr<Namespace>> CreateOrOpenLocked(
      const std::string& name, const v1::Layout& layout,
      const v1::Capacity& capacity, const std::string& tenant_salt,
      bool* created, const PeerInfo* creator = nullptr, bool recovering = false,
      int numa_node = -1) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sizes and checks a namespace to create; nothing changes on error.
  absl::Status PlanNamespaceLocked(const std::string& name,
                                   const v1::Layout& layout,
                                   const v1::Capacity& capacity,
                                   const PeerInfo* creator, NamespacePlan* plan)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Makes the namespace of `plan`: index, segments (populated) and, unless
  // recovering, journal. Unpublished. On failure unlinks the segments it
  // created (not recovering) and returns why.
  absl::StatusOr<std::shared_ptr<Namespace>> BuildNamespace(
      const NamespacePlan& plan) ABSL_LOCKS_EXCLUDED(mu_);
  // While `name` is pending, waits for it (releasing mu_ meanwhile). Returns
  // false when it was not pending; else true, with the creation's error in
  // *failed when a creation it waited for failed.
  bool WaitPendingLocked(const std::string& name, absl::Status* failed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Makes `name` pending (being created, or, without `creating`, its
  // dropped namespace's files being removed) until EndPendingLocked.
  // REQUIRES: `name` is neither pending nor in by_name_.
  std::shared_ptr<PendingName> StartPendingLocked(const std::string& name,
                                                  bool creating)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends `pending`, the pending state of `name`, with `status` (a
  // creation's outcome, which the requests that waited for it return), and
  // wakes those requests.
  void EndPendingLocked(const std::string& name, PendingName& pending,
                        absl::Status status = absl::OkStatus())
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Gives back `bytes` of uid `uid`'s --uid_budget_bytes charge.
  void RefundLocked(uid_t uid, uint64_t bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // ---- NUMA placement (tier_attach.cc) ----
  // The node an Attach naming `pci_bus_id` puts banks on under
  // options_.bank_numa_node: -1 for none (also when sysfs does not know the
  // device); INVALID_ARGUMENT for a malformed id.
  absl::StatusOr<int> AttachNumaNode(const std::string& pci_bus_id);
  // Moves stored rank `rank`'s banks to `node` (those not there already);
  // failures are logged, never the Attach's.
  void PlaceRankBanks(const Namespace& ns, uint32_t rank, int node)
      ABSL_LOCKS_EXCLUDED(mu_);

  // ---- Drop (tier_attach.cc) ----
  // A forced Drop of ns: keeps the device slots of its reservations, leases
  // and fence holds in orphaned_device_, each with its holder's instance.
  void OrphanDeviceSlotsLocked(Namespace& ns)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_, ns.mu, ns.lease_mu);
  // Session `session_id` ended (`closed`: the fence registry's verdict):
  // the orphaned slots it held are freed when closed.free_now, else they
  // wait for closed.instance to be gone. CloseSession calls it last, after
  // every namespace it was attached to, so that a Drop racing the close
  // has orphaned what it will.
  void SettleOrphanedDevice(uint64_t session_id,
                            const FenceRegistry::Closed& closed)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Drop of the prefix subtree under `key`, under ns.mu only.
  absl::Status DropPrefix(Namespace& ns, const HashKey& key,
                          v1::DropResponse* response)
      ABSL_LOCKS_EXCLUDED(mu_, ns.mu);

  // Every published namespace, in no order (a snapshot: each may be
  // dropped after; tier_core.cc).
  std::vector<std::shared_ptr<Namespace>> Namespaces() ABSL_LOCKS_EXCLUDED(mu_);

  // ---- introspection (tier_introspect.cc) ----
  void FillNamespaceInfo(Namespace& ns, v1::NamespaceInfo* info)
      ABSL_LOCKS_EXCLUDED(ns.mu);

  // ---- recovery (tier_recovery.cc) ----
  // Reopens namespace `name` from its journal. DATA_LOSS: the journal is
  // unreadable or corrupt; other errors: the banks cannot be reopened.
  absl::Status RecoverNamespace(const std::string& name, RecoveryReport* report)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Drop of an unrecoverable namespace: unlinks its segments and journal,
  // releasing mu_ meanwhile (the name pending).
  absl::Status DropUnrecoverableLocked(const std::string& name)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Recover's first step: removes the temporary segment files of killed
  // creators (shm/segment_cleanup.h) and logs them; returns how many.
  uint32_t RemoveOrphanedTempSegments();

  // ---- the Fence RPC (tier_fence.cc) ----
  // What a Fence request may act on: the namespaces the session attached
  // to that it may fence, and each report item's namespace there (null:
  // none) and lease hash; unresolved when an item names a namespace it
  // cannot act on that still exists.
  struct FenceScope {
    struct Item {
      std::shared_ptr<Namespace> ns;
      HashKey lease_key;
    };
    std::vector<Item> items;
    std::vector<std::shared_ptr<Namespace>> mine;
    bool unresolved = false;
  };
  // Fills *scope for `request`, checking every report item (NOT_FOUND for
  // an unknown session, INVALID_ARGUMENT naming the field).
  absl::Status ResolveFence(const v1::FenceRequest& request, FenceScope* scope)
      ABSL_LOCKS_EXCLUDED(mu_);

  // ---- the fence's holds (tier_fence_holds.cc) ----
  // Moves reservation `id` of ns into a new hold of `kind`; returns its id
  // (0: no such reservation).
  uint64_t HoldReservationLocked(Namespace& ns, uint64_t id,
                                 Namespace::FenceHold::Kind kind,
                                 const InstanceKey& instance,
                                 const HolderKey& origin)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns.mu);
  uint64_t HoldLeaseLocked(Namespace& ns, uint64_t id,
                           const InstanceKey& instance, const HolderKey& origin)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns.mu);
  // Frees what hold `id` keeps and forgets it.
  void ReleaseHoldLocked(Namespace& ns, uint64_t id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns.mu);
  // After a restart: claims `outstanding` rows and pins every restored leaf
  // and snapshot node (Namespace::RestartFence). `emptied`: the namespace
  // was reopened empty; the journaled nodes' rows are claimed too.
  void InstallRestartFenceLocked(Namespace& ns, const JournalContents& contents,
                                 bool emptied = false)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns.mu);
  void LiftRestartFenceLocked(Namespace& ns)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns.mu);
  // RESOURCE_EXHAUSTED of an allocation, with what the fence keeps.
  absl::Status ExplainFenceLocked(Namespace& ns, absl::Status refused)
      ABSL_SHARED_LOCKS_REQUIRED(ns.mu);

  const TierOptions options_;
  const absl::Time started_;
  // Whom commits, evictions and removals are told (tier_observer.h): the
  // KV events and the cluster tier when configured, then
  // options_.observers. Built before any namespace, in this order.
  const std::unique_ptr<KvEventObserver> kv_events_;
  const std::unique_ptr<ClusterBridge> cluster_;
  const TierObservers observers_;
  // The device pools' tiers (options_.device_pools order); thread-safe,
  // locked after any Namespace::mu (a leaf).
  DeviceTiers devices_;
  std::atomic<uint64_t> next_id_{1};

  absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, Session> sessions_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::shared_ptr<Namespace>> by_name_
      ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, std::shared_ptr<Namespace>> by_id_
      ABSL_GUARDED_BY(mu_);
  // Bank bytes of the namespaces each uid created (--uid_budget_bytes).
  absl::flat_hash_map<uid_t, uint64_t> uid_bytes_ ABSL_GUARDED_BY(mu_);
  // Names being created or whose dropped namespace is being removed, with
  // mu_ released (PendingName). Never in by_name_ at the same time.
  absl::flat_hash_map<std::string, std::shared_ptr<PendingName>> pending_
      ABSL_GUARDED_BY(mu_);
  // Namespaces kept but not served (see Recover).
  absl::flat_hash_map<std::string, Unrecoverable> unrecoverable_
      ABSL_GUARDED_BY(mu_);
  int state_lock_fd_ = -1;  // Set by Recover, closed by the destructor.

  std::unique_ptr<FenceRegistry> fence_;
  // Device-pool slots that a dropped namespace's fence holds, reservations
  // and leases named: shared by every namespace, and an engine may still
  // copy into or out of them. Freed once their instance is gone
  // (SweepFences), or, for those of a session still open at the drop, once
  // that session ends quiescent (SettleOrphanedDevice).
  struct OrphanedDevice {
    InstanceKey instance;
    // The session that held them, until it ends (0: none, or it ended).
    uint64_t session = 0;
    uint32_t pool = 0;
    std::vector<uint32_t> rows;
    uint64_t lease = 0;
  };
  std::vector<OrphanedDevice> orphaned_device_ ABSL_GUARDED_BY(mu_);
  std::function<void(const char*)> test_hook_;
  // Compacts the journals (with a state_dir; else nullptr).
  std::unique_ptr<Checkpointer> checkpointer_;
  // Holds and restart fences over all namespaces: the sweep skips the
  // namespaces while both are zero.
  std::atomic<uint64_t> live_holds_{0};
  std::atomic<uint32_t> restart_fences_{0};
  std::atomic<uint64_t> released_confirmed_{0};
  std::atomic<uint64_t> released_gone_{0};
  std::atomic<uint64_t> restart_fences_lifted_{0};
  std::atomic<uint64_t> report_mismatches_{0};
  // Held by the one Verify running (TryLock: a second is refused).
  absl::Mutex verify_mu_;
  absl::Mutex sweeper_mu_;
  bool sweeper_stop_ ABSL_GUARDED_BY(sweeper_mu_) = false;
  std::thread sweeper_;
};

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_TIER_CORE_H_
