// TierCore::Namespace: one namespace's banks, index, journal, and the
// reservations, leases and fence holds its sessions have; and the
// PendingName and NamespacePlan of its creation (tier_attach.cc). Private to
// the TierCore implementation files (tier_core.cc, tier_attach.cc,
// tier_fence.cc, tier_recovery.cc).
//
// Thread-safety: a Namespace's fields are immutable after construction or
// guarded by its mu, as annotated; a PendingName's by TierCore::mu_.
#ifndef KVTIER_DAEMON_TIER_NAMESPACE_H_
#define KVTIER_DAEMON_TIER_NAMESPACE_H_

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/fence_registry.h"
#include "daemon/journal.h"
#include "daemon/namespace_layout.h"
#include "daemon/prefix_index.h"
#include "daemon/tier_core.h"
#include "shm/segment.h"

namespace kvtier::daemon {

// A session id is the capability of every RPC of its session: logs name a
// session by this tag (its low 16 bits), never by the whole id.
inline std::string SessionTag(uint64_t session_id) {
  return absl::StrFormat("s-%04x", session_id & 0xffff);
}

// OK for api_version 0 (unset) or kApiVersion; FAILED_PRECONDITION naming
// both otherwise. Every request checks it first.
inline absl::Status CheckApiVersion(uint32_t v) {
  if (v != 0 && v != kApiVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        "api_version: daemon speaks ", kApiVersion, ", request has ", v));
  }
  return absl::OkStatus();
}

// One hash of exactly `hash_bytes`, else INVALID_ARGUMENT naming `field`.
inline absl::Status ParseOneHash(const std::string& bytes, uint32_t hash_bytes,
                                 absl::string_view field, HashKey* out) {
  if (bytes.size() != hash_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": must be ", hash_bytes, " bytes, got ", bytes.size()));
  }
  out->bytes.fill(0);
  std::memcpy(out->bytes.data(), bytes.data(), hash_bytes);
  return absl::OkStatus();
}

// A name whose namespace is being created, or whose dropped namespace's
// journal and segments are being removed, with TierCore::mu_ released
// (tier_attach.cc). It is in TierCore::pending_ meanwhile; a request for the
// name waits (mu_.Await) until `done`. A creation counts against
// --max_namespaces and holds its --uid_budget_bytes charge from the start.
// Every field is guarded by TierCore::mu_.
struct TierCore::PendingName {
  enum class Kind : uint8_t { kCreating, kDropping };
  Kind kind = Kind::kCreating;
  bool done = false;
  // kCreating, once done: OK (published) or why it failed, which the
  // requests that waited for it return too.
  absl::Status status;
};

// What CreateOrOpenLocked decided, under mu_, about a namespace to create:
// BuildNamespace makes it without locks.
struct TierCore::NamespacePlan {
  std::string name;
  v1::Layout layout;  // Normalized.
  uint32_t stored_ranks = 1;
  uint64_t page_rows = 0;
  uint64_t snapshot_rows = 0;
  uint32_t max_replay_tokens = 0;
  uint64_t bank_bytes = 0;
  bool charged = false;  // bank_bytes charged to creator_uid.
  uid_t creator_uid = static_cast<uid_t>(-1);
  shm::SegmentOptions segment_options;
  // Reopening from a journal (Recover): no journal is written, and segments
  // are never unlinked on failure.
  bool recovering = false;
};

struct TierCore::Namespace {
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
    absl::Time since;
  };
  // After a restart, until every process that held rows before it has
  // reported or exited (FenceRegistry's waiting set): the rows that were
  // reserved then stay claimed, and every restored leaf and snapshot node
  // stays pinned, so nothing from before the restart is handed out.
  struct RestartFence {
    std::vector<std::vector<uint32_t>> page_rows;  // Per rank, claimed.
    std::vector<std::vector<uint32_t>> snapshot_rows;
    std::vector<uint32_t> pinned_nodes;
    uint64_t pinned_pages = 0;  // Restored nodes it protects.
    absl::Time since;
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

  absl::Mutex mu;
  std::unique_ptr<PrefixIndex> index ABSL_GUARDED_BY(mu);
  // Null without --state_dir. Every change of the index is appended before
  // the request that made it is answered.
  std::unique_ptr<NamespaceJournal> journal ABSL_GUARDED_BY(mu);
  absl::flat_hash_map<uint64_t, Reservation> reservations ABSL_GUARDED_BY(mu);
  absl::flat_hash_map<uint64_t, Lease> leases ABSL_GUARDED_BY(mu);
  // Attached sessions -> their (storage) rank.
  absl::flat_hash_map<uint64_t, uint32_t> sessions ABSL_GUARDED_BY(mu);
  absl::flat_hash_map<uint64_t, FenceHold> holds ABSL_GUARDED_BY(mu);
  // What each session holds here, for the per-session caps
  // (TierOptions::max_session_*).
  struct SessionUse {
    int64_t reservations = 0;
    int64_t leases = 0;
    int64_t reserved_rows = 0;  // Page and snapshot rows of reservations.
  };
  absl::flat_hash_map<uint64_t, SessionUse> use ABSL_GUARDED_BY(mu);
  void Charge(uint64_t session, int64_t reservations, int64_t leases,
              int64_t rows) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    SessionUse& u = use[session];
    u.reservations += reservations;
    u.leases += leases;
    u.reserved_rows += rows;
    if (u.reservations <= 0 && u.leases <= 0 && u.reserved_rows <= 0) {
      use.erase(session);
    }
  }
  static int64_t Rows(const Reservation& r) {
    return static_cast<int64_t>(r.page_rows.size() + r.snapshot_rows.size());
  }
  std::optional<RestartFence> restart_fence ABSL_GUARDED_BY(mu);
  uint64_t reserved_page_rows ABSL_GUARDED_BY(mu) = 0;
  uint64_t reserved_snapshot_rows ABSL_GUARDED_BY(mu) = 0;
  // Lookup counters: unpinned lookups run under the shared lock only.
  std::atomic<uint64_t> lookups{0};
  std::atomic<uint64_t> hit_pages{0};
  std::atomic<uint64_t> miss_pages{0};
  std::atomic<uint64_t> snapshot_hits{0};
  // Bumped by every operation that may evict or remove nodes (Reserve,
  // Drop), so a lookup can tell whether its shared-lock search is stale.
  uint64_t evict_epoch ABSL_GUARDED_BY(mu) = 0;
  // Recency updates of unpinned lookups, applied (in order) under the
  // exclusive lock before anything that evicts or orders by recency, so LRU
  // decisions see every lookup without lookups taking the exclusive lock.
  // Lock order: mu, then touch_mu.
  absl::Mutex touch_mu;
  std::vector<std::pair<uint32_t, HashKey>> pending_touches
      ABSL_GUARDED_BY(touch_mu);
  uint64_t committed_pages ABSL_GUARDED_BY(mu) = 0;
  uint64_t committed_snapshots ABSL_GUARDED_BY(mu) = 0;
  uint64_t dropped_pages ABSL_GUARDED_BY(mu) = 0;
  uint64_t dropped_snapshots ABSL_GUARDED_BY(mu) = 0;

  bool hybrid() const { return layout.snapshot_row_bytes() > 0; }
  uint32_t StorageRank(uint32_t tp_rank) const {
    return layout.replicated() ? 0 : tp_rank;
  }
  // What the journal records about the namespace: shape and segments, each
  // with the creation stamp of its header as its content nonce.
  JournalHeader MakeJournalHeader() const {
    JournalHeader h;
    h.name = name;
    h.layout = layout;
    h.page_rows = page_rows;
    h.snapshot_rows = snapshot_rows;
    h.max_replay_tokens = max_replay_tokens;
    for (uint32_t r = 0; r < segments.size(); ++r) {
      for (size_t i = 0; i < segments[r].size(); ++i) {
        h.segments.push_back({segment_info[r][i].bank(), r,
                              segments[r][i]->path(),
                              segments[r][i]->header().created_unix_ns});
      }
    }
    return h;
  }
};

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_TIER_NAMESPACE_H_
