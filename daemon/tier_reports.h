// The plain data TierCore (daemon/tier_core.h) reports beside its RPCs'
// responses: a lookup's outcome without protobuf (the fast lookup path's),
// what recovery did and kept, and the fence's and namespaces' counters that
// Stats and the metrics exporter read. TierCore names each without the
// Tier prefix (TierCore::LookupOutcome, ...).
//
// Thread-safety: plain data.
#ifndef KVTIER_DAEMON_TIER_REPORTS_H_
#define KVTIER_DAEMON_TIER_REPORTS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/time/time.h"

namespace kvtier::daemon {

// Lookup's answer without protobuf: the fast lookup path uses it.
struct TierLookupOutcome {
  uint32_t matched_pages = 0;
  uint32_t usable_pages = 0;
  std::vector<uint32_t> rows;
  bool has_snapshot = false;
  uint32_t snapshot_row = 0;
  uint64_t lease_id = 0;
  // The snapshot at usable_pages-1 is also in the requested device pool.
  bool has_device_snapshot = false;
  uint32_t device_snapshot_row = 0;
};

// The fence's figures for Stats and the metrics.
struct TierFenceCounters {
  uint64_t holds = 0;
  uint64_t fenced_page_rows = 0;  // Held allocated (not reusable).
  uint64_t fenced_snapshot_rows = 0;
  uint64_t pinned_pages = 0;  // Committed pages kept from eviction.
  uint32_t restart_waiting = 0;
  uint32_t instances = 0;
  uint32_t unseen_pid_sessions = 0;
  uint64_t released_confirmed = 0;  // Holds freed: holder confirmed.
  uint64_t released_gone = 0;       // Holds freed: holder gone.
  uint64_t restart_fences_lifted = 0;
  uint64_t report_mismatches = 0;  // Reported items nothing matched.
};

// What TierCore::Recover did.
struct TierRecoveryReport {
  uint32_t namespaces = 0;  // Reopened from their journals.
  // Of them, reopened empty: a segment was missing or recreated since its
  // journal was written, so their pages cannot be vouched for.
  uint32_t namespaces_emptied = 0;
  uint32_t journals_unreadable = 0;  // No usable header (kept).
  uint32_t journals_torn = 0;        // Replayed up to a torn record.
  uint32_t journals_corrupt = 0;     // A bad record before the end.
  // Kept, journal and segments, and not served: see Unrecoverable.
  uint32_t namespaces_unrecoverable = 0;
  uint64_t pages = 0;          // Page rows restored (all ranks).
  uint64_t journal_bytes = 0;  // Read.
  // Temporary segment files of killed creators removed (segment_cleanup.h).
  uint32_t temp_segments_removed = 0;
  absl::Duration elapsed;
};

// A namespace kept but not served (TierCore::Recover).
struct TierUnrecoverable {
  std::string name;
  std::string reason;
  bool corrupt = false;  // Only an operator's Drop ends it.
  absl::Time since;
};

// Counters beside Stats that the metrics exporter reads at scrape time.
struct TierNamespaceCounters {
  std::string name;
  uint64_t committed_snapshots = 0;  // Snapshot rows made visible.
  uint64_t snapshot_hits = 0;        // Lookups answered with a snapshot.
  uint64_t dropped_pages = 0;        // Removed by Drop of a prefix subtree.
  uint64_t dropped_snapshots = 0;    // Of them, pages holding a snapshot.
  uint64_t spacing_violations = 0;   // PrefixIndex::Usage's.
  uint64_t evicted_incomplete_pages = 0;  // PrefixIndex::Usage's.
};

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_TIER_REPORTS_H_
