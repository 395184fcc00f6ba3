// TierNamespace (TierCore::Namespace): one namespace's banks, index and
// journal, and the reservations, leases and fence holds its sessions have,
// with the operations on it alone (daemon/tier_namespace.cc). Internal to
// TierCore (daemon/tier_core.h): tier_core.h includes it only so that
// TierCore's declarations can name a namespace's lock in their annotations.
//
// Thread-safety: a namespace's fields are immutable after construction, or
// guarded by its mu (or lease_mu), as annotated; the lookup counters are
// atomic. Lock order: TierCore::mu_, then one namespace's mu, then its
// lease_mu, then its touch_mu.
#ifndef KVTIER_DAEMON_TIER_NAMESPACE_H_
#define KVTIER_DAEMON_TIER_NAMESPACE_H_

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/checkpointer.h"
#include "daemon/fence_registry.h"
#include "daemon/journal.h"
#include "daemon/namespace_layout.h"
#include "daemon/prefix_index.h"
#include "kvtier/v1/tier.pb.h"
#include "shm/segment.h"

namespace kvtier::daemon {

struct TierCommit;    // daemon/tier_observer.h
class TierObservers;  // daemon/tier_observer.h

struct TierNamespace {
  struct Reservation {
    uint64_t session = 0;
    uint32_t rank = 0;
    std::vector<uint32_t> page_rows;
    std::vector<uint32_t> snapshot_rows;
    // Slots of device pool `device_pool` (daemon/device_pool.h).
    uint32_t device_pool = 0;
    std::vector<uint32_t> device_rows;
  };
  struct Lease {
    uint64_t session = 0;
    uint32_t node = 0;
    uint32_t pages = 0;  // Usable pages it pins (rows of the path).
    // A pin in device pool `device_pool`'s tier (0: none).
    uint32_t device_pool = 0;
    uint64_t device_lease = 0;
  };

  // Rows that someone may still write or read: handed to nobody until the
  // holder confirms (Fence.release, a report) or its instance is gone
  // (proto/kvtier/v1/tier.proto, "fence").
  struct FenceHold {
    enum class Kind : uint8_t {
      kSessionEnded,  // Its session ended without a quiescent Goodbye.
      kAbandoned,     // Aborted with fenced: queued writes may remain.
      kReported,      // Reported after a restart or reconnection.
    };
    Kind kind = Kind::kSessionEnded;
    InstanceKey instance;
    HolderKey origin;  // The connection (and process) whose session held them.
    uint32_t rank = 0;
    // A reservation's rows, still allocated-uncommitted in the index.
    std::vector<uint32_t> page_rows;
    std::vector<uint32_t> snapshot_rows;
    uint32_t device_pool = 0;
    std::vector<uint32_t> device_rows;
    // A lease's pin (kNoNode: none) and the pages it keeps.
    uint32_t pin_node = kNoNode;
    uint32_t pin_pages = 0;
    uint64_t device_lease = 0;
    // Rows of the restart fence that a report after a restart named: they
    // stay the restart fence's (RestartFence::page_rows), which keeps them,
    // even after it lifted, until no hold names them any more. So a row
    // that two processes from before the restart both report (the fence
    // cannot tell whose it was) is freed only once both released it.
    std::vector<uint32_t> restart_page_rows;
    std::vector<uint32_t> restart_snapshot_rows;
    absl::Time since;
  };
  // After a restart, until every process that held rows before it has
  // reported or exited (FenceRegistry's waiting set): the rows that were
  // reserved then stay claimed, and every restored leaf and snapshot node
  // stays pinned, so nothing from before the restart is handed out.
  // Once they all have, it lifts: its pins go, and of its rows only those
  // a hold still names (FenceHold::restart_page_rows) stay, each until no
  // hold names it; then it is gone.
  struct RestartFence {
    std::vector<std::vector<uint32_t>> page_rows;  // Per rank, claimed.
    std::vector<std::vector<uint32_t>> snapshot_rows;
    std::vector<uint32_t> pinned_nodes;
    uint64_t pinned_pages = 0;  // Restored nodes it protects.
    absl::Time since;
    bool lifted = false;
  };

  // Immutable after construction.
  uint64_t id = 0;
  std::string name;
  v1::Layout layout;  // Normalized.
  Fingerprint fingerprint{};
  uint32_t hash_bytes = 32;
  uint32_t stored_ranks = 1;  // 1 when replicated, else tp_size.
  uint64_t page_rows = 0;
  uint64_t snapshot_rows = 0;
  uint32_t max_replay_tokens = 0;
  // Bank bytes (all banks and ranks) and the uid charged for them under
  // --uid_budget_bytes (charged false: nobody).
  uint64_t bank_bytes = 0;
  bool charged = false;
  uid_t creator_uid = static_cast<uid_t>(-1);
  // Per stored rank: one segment per page bank (layout order), then the
  // snapshot segment when hybrid. segment_info mirrors it for Attach.
  std::vector<std::vector<std::unique_ptr<shm::Segment>>> segments;
  std::vector<std::vector<v1::Segment>> segment_info;
  // Compacts the journal off the request path (daemon/checkpointer.h), or
  // nullptr: Journal then checkpoints in the request. `self` is what it is
  // handed. Set before the namespace is published.
  Checkpointer* checkpointer = nullptr;
  std::weak_ptr<TierNamespace> self;
  // Whom its commits, evictions and removals are told (the core's; never
  // null once built).
  const TierObservers* observers = nullptr;

  absl::Mutex mu;
  std::unique_ptr<PrefixIndex> index ABSL_GUARDED_BY(mu);
  // Null without --state_dir. Every change of the index is appended before
  // the request that made it is answered.
  std::unique_ptr<NamespaceJournal> journal ABSL_GUARDED_BY(mu);
  // Handed to the checkpointer and not yet taken up by it.
  bool checkpoint_queued ABSL_GUARDED_BY(mu) = false;
  absl::flat_hash_map<uint64_t, Reservation> reservations ABSL_GUARDED_BY(mu);
  // Leases are taken (a pinned lookup) and ended (Release) under mu held
  // shared, beside other lookups, so they have a lock of their own; code
  // holding mu exclusively takes lease_mu too. Lock order: mu, lease_mu.
  absl::Mutex lease_mu ABSL_ACQUIRED_AFTER(mu);
  absl::flat_hash_map<uint64_t, Lease> leases ABSL_GUARDED_BY(lease_mu);
  // Leases per session, for TierOptions::max_session_leases (no entry: 0).
  absl::flat_hash_map<uint64_t, int64_t> session_leases
      ABSL_GUARDED_BY(lease_mu);
  void ChargeLease(uint64_t session, int64_t leases)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(lease_mu) {
    if ((session_leases[session] += leases) <= 0) {
      session_leases.erase(session);
    }
  }
  // Attached sessions -> their (storage) rank.
  absl::flat_hash_map<uint64_t, uint32_t> sessions ABSL_GUARDED_BY(mu);
  absl::flat_hash_map<uint64_t, FenceHold> holds ABSL_GUARDED_BY(mu);
  // What each session holds here, for the per-session caps
  // (TierOptions::max_session_*).
  // (Leases are counted in session_leases.)
  struct SessionUse {
    int64_t reservations = 0;
    int64_t reserved_rows = 0;  // Page and snapshot rows of reservations.
  };
  absl::flat_hash_map<uint64_t, SessionUse> use ABSL_GUARDED_BY(mu);
  void Charge(uint64_t session, int64_t reservations, int64_t rows)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    SessionUse& u = use[session];
    u.reservations += reservations;
    u.reserved_rows += rows;
    if (u.reservations <= 0 && u.reserved_rows <= 0) use.erase(session);
  }
  static int64_t Rows(const Reservation& r) {
    return static_cast<int64_t>(r.page_rows.size() + r.snapshot_rows.size());
  }
  std::optional<RestartFence> restart_fence ABSL_GUARDED_BY(mu);
  // Per stored rank: whether its banks' NUMA placement is settled (an
  // Attach of the rank came, or the files existed before this daemon
  // made them); see TierOptions::bank_numa_node.
  std::vector<bool> numa_placed ABSL_GUARDED_BY(mu);
  uint64_t reserved_page_rows ABSL_GUARDED_BY(mu) = 0;
  uint64_t reserved_snapshot_rows ABSL_GUARDED_BY(mu) = 0;
  // Lookup counters: unpinned lookups run under the shared lock only.
  std::atomic<uint64_t> lookups{0};
  std::atomic<uint64_t> hit_pages{0};
  std::atomic<uint64_t> miss_pages{0};
  std::atomic<uint64_t> snapshot_hits{0};
  // Recency updates of lookups, applied (in order) under the
  // exclusive lock before anything that evicts or orders by recency, so LRU
  // decisions see every lookup without lookups taking the exclusive lock.
  // Lock order: mu, then touch_mu.
  absl::Mutex touch_mu;
  std::vector<std::pair<uint32_t, HashKey>> pending_touches
      ABSL_GUARDED_BY(touch_mu);
  // Keys of complete nodes removed since TellRemoved last told them
  // (PrefixIndex::SetRemovalLog).
  std::vector<HashKey> removed_keys ABSL_GUARDED_BY(mu);
  // The cluster tier's prefetches (daemon/prefetch_job.h). Their rows in
  // flight, per stored rank: allocated-uncommitted, no reservation's (the
  // invariant check counts them); their pins on the chains they extend;
  // and the hashes they are bringing in (packed bytes), which lookups
  // report as prefetching. Lock order: mu, then prefetch_mu.
  std::vector<uint64_t> prefetch_page_rows ABSL_GUARDED_BY(mu);
  std::vector<uint64_t> prefetch_snapshot_rows ABSL_GUARDED_BY(mu);
  uint64_t prefetch_pins ABSL_GUARDED_BY(mu) = 0;
  // Set by a Drop of the whole namespace: a prefetch in flight stops (the
  // index, its rows and pins were cleared).
  bool dropped ABSL_GUARDED_BY(mu) = false;
  absl::Mutex prefetch_mu ABSL_ACQUIRED_AFTER(mu);
  absl::flat_hash_set<std::string> prefetching ABSL_GUARDED_BY(prefetch_mu);
  uint64_t committed_pages ABSL_GUARDED_BY(mu) = 0;
  uint64_t committed_snapshots ABSL_GUARDED_BY(mu) = 0;
  uint64_t dropped_pages ABSL_GUARDED_BY(mu) = 0;
  uint64_t dropped_snapshots ABSL_GUARDED_BY(mu) = 0;

  bool hybrid() const { return layout.snapshot_row_bytes() > 0; }
  // An id for a new fence hold: non-zero, none of this namespace's, and
  // unguessable (64 bits from the kernel's getrandom(2)): a hold id is what
  // a client presents to release the rows.
  uint64_t NewHoldId() const ABSL_SHARED_LOCKS_REQUIRED(mu);
  uint32_t StorageRank(uint32_t tp_rank) const {
    return layout.replicated() ? 0 : tp_rank;
  }
  // A Drop of the whole namespace: forgets its holds, restart fence,
  // leases, reservations and index, and stops a prefetch in flight (at its
  // next step: `dropped`). Returns how many holds it had, whether a restart
  // fence was up (for the core's counters), and the journal, to remove
  // with no lock held (RemoveFiles).
  struct Forgotten {
    size_t holds = 0;
    bool restart_fence = false;
    std::unique_ptr<NamespaceJournal> journal;
  };
  Forgotten ForgetAll() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu, lease_mu);
  // Removes the `removed` journal first (a daemon killed between the two
  // finds neither, or a journal whose segments are gone: reopened empty),
  // then the segments' files; failures are logged.
  void RemoveFiles(std::unique_ptr<NamespaceJournal> removed) const;
  // While the namespace is built (unpublished): creates, or reopens, the
  // segment of bank `bank` of stored rank `rank` (named after
  // `segment_prefix`, the namespace and the bank) and appends it to
  // segments[rank] and segment_info[rank]; the path of a segment it
  // created is appended to *made. The segment's error, naming the bank and
  // rank.
  absl::Status AddSegment(const std::string& segment_prefix, uint32_t rank,
                          const std::string& bank, uint64_t rows,
                          uint64_t row_bytes,
                          const shm::SegmentOptions& options,
                          std::vector<std::string>* made);
  // Recovery: why the segments are not the ones journal header `h`
  // describes (a bank it does not name, a segment recreated or replaced
  // since); empty when every one is.
  std::string SegmentsDoubt(const JournalHeader& h) const;
  // An Attach's response at `tp_rank`: id, fingerprint, the hash seed for
  // `tenant_salt`, hash size, the rank's segments, rows, replay spacing.
  void DescribeAttach(uint32_t tp_rank, const std::string& tenant_salt,
                      v1::AttachResponse* resp) const;
  // What the journal records about the namespace: shape and segments, each
  // with the creation stamp of its header as its content nonce.
  JournalHeader MakeJournalHeader() const;

  // ---- The Fence RPC's reports (tier_namespace_fence.cc) ----
  // OK when `item` (named `field` in errors) fits this namespace: its
  // tp_rank, rows and lease hash; then *lease_key is its lease hash (when
  // it names one). INVALID_ARGUMENT naming the field otherwise.
  absl::Status CheckFenceItem(const v1::FenceItem& item,
                              const std::string& field,
                              HashKey* lease_key) const;
  // The hold of `instance` left by `process` (none in `kept`) that `item`
  // names (its lease, or its rank's rows in order), now kReported; 0: none.
  uint64_t MatchHold(const InstanceKey& instance, const HolderKey& process,
                     uint32_t rank, const v1::FenceItem& item,
                     const HashKey& lease_key,
                     const absl::flat_hash_set<uint64_t>& kept)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // For a process that held rows before the restart: a new kReported hold
  // of what the (unlifted) restart fence keeps of `item` (its leased node,
  // pinned, or its rows, in its order); 0 when it keeps none of it.
  uint64_t HoldRestartRows(const InstanceKey& instance,
                           const HolderKey& process, uint32_t rank,
                           const v1::FenceItem& item, const HashKey& lease_key)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // The holds of `instance` left by `process` that a complete report did
  // not name (not in `kept`), abandoned reservations aside.
  std::vector<uint64_t> UnreportedHolds(
      const InstanceKey& instance, const HolderKey& process,
      const absl::flat_hash_set<uint64_t>& kept) const
      ABSL_SHARED_LOCKS_REQUIRED(mu);

  // Makes the index show its evictions to the observers (OnEvicting) and
  // log the complete nodes it removes (removed_keys). Once, when built.
  void WatchIndex() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Counts a rank's commit (committed_pages, committed_snapshots: Stats)
  // and tells the observers (OnCommitted).
  void Committed(const TierCommit& commit) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Tells the observers the complete pages the index removed since the
  // last call (OnRemoved), and forgets them. Every request that may have
  // evicted or dropped calls it before it lets go of mu.
  void TellRemoved() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // ---- Lookups (tier_namespace.cc), under mu held shared ----
  // RESOURCE_EXHAUSTED naming --max_session_leases when `session` holds
  // `max_leases` leases here already (0: no cap).
  absl::Status CheckLeaseCap(uint64_t session, uint32_t max_leases) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(lease_mu);
  // Pins `lease.node` and records the lease under a new random id (every
  // id handed out is: random_id.h), charged to its session; returns the id.
  uint64_t AddLease(const Lease& lease) ABSL_SHARED_LOCKS_REQUIRED(mu)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(lease_mu);
  // Queues a lookup's recency update of `node` (whose key is `key`);
  // returns whether the queue is full (the caller applies it, exclusively).
  bool QueueTouch(uint32_t node, const HashKey& key)
      ABSL_SHARED_LOCKS_REQUIRED(mu);
  // Counts a lookup of `asked` pages that found `found`.
  void CountLookup(const PrefixIndex::LookupResult& found, size_t asked);

  // Applies the recency updates that unpinned lookups queued
  // (pending_touches), in order.
  void ApplyPendingTouches() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Queued recency updates after which a lookup applies them itself.
  static constexpr size_t kMaxPendingTouches = 4096;
  // Turns the outcome of a journal append into the request's: OK as is
  // (compacting the journal when due: asks the checkpointer, or writes the
  // checkpoint here without one); on failure a checkpoint of the
  // namespace's current state makes the change durable anyway, else
  // UNAVAILABLE naming the journal. No journal: OK.
  absl::Status Journal(absl::Status appended) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
};

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_TIER_NAMESPACE_H_
