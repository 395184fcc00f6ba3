// TierCore's reservations: Reserve hands a session rows (pages, snapshots
// and device-pool slots) to write, all or nothing and journaled before the
// engine sees them; Abort gives them back, or, fenced, keeps them from
// everyone while the engine's queued writes may still land
// (tier_fence_holds.cc). A reservation ends in Commit (tier_commit.cc).
//
// Thread-safety: thread-safe (part of TierCore; lock order in tier_core.h).
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/random_id.h"
#include "daemon/tier_core.h"
#include "daemon/tier_request.h"

namespace kvtier::daemon {

absl::Status TierCore::Reserve(const v1::ReserveRequest& req,
                               v1::ReserveResponse* resp) {
  uint32_t rank = 0;
  auto ns_or =
      Resolve(req.api_version(), req.session_id(), req.namespace_id(), &rank);
  if (!ns_or.ok()) return ns_or.status();
  Namespace& ns = **ns_or;
  if (req.pages() == 0 && req.snapshots() == 0 && req.device_snapshots() == 0) {
    return absl::InvalidArgumentError(
        "pages, snapshots, device_snapshots: reserve at least one row");
  }
  if (absl::Status s =
          devices_.CheckReserve(req.device_pool(), req.device_snapshots(),
                                ns.name, ns.layout.snapshot_row_bytes());
      !s.ok()) {
    return s;
  }
  if (req.pages() > ns.page_rows) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pages: ", req.pages(), " exceeds the bank's ", ns.page_rows, " rows"));
  }
  if (req.snapshots() > ns.snapshot_rows) {
    return absl::InvalidArgumentError(absl::StrCat(
        "snapshots: ", req.snapshots(), " exceeds the snapshot bank's ",
        ns.snapshot_rows, " rows"));
  }
  Hook("reserve:resolved");
  absl::MutexLock lock(&ns.mu);
  // A session closed since Resolve must not be left a reservation.
  if (!ns.sessions.contains(req.session_id())) {
    return absl::NotFoundError(
        absl::StrCat("session_id: session ", req.session_id(), " closed"));
  }
  // Per-session caps, before anything is allocated or evicted.
  if (auto u = ns.use.find(req.session_id()); u != ns.use.end()) {
    const Namespace::SessionUse& use = u->second;
    if (options_.max_session_reservations > 0 &&
        use.reservations >= options_.max_session_reservations) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "reserve: this session has ", use.reservations,
          " open reservations in namespace '", ns.name,
          "', the most one session may (--max_session_reservations)"));
    }
    const uint64_t want = uint64_t{req.pages()} + req.snapshots();
    if (options_.max_session_reserved_rows > 0 &&
        static_cast<uint64_t>(use.reserved_rows) + want >
            options_.max_session_reserved_rows) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "reserve: this session has ", use.reserved_rows,
          " rows reserved in namespace '", ns.name, "' and asks for ", want,
          " more; one session may hold ", options_.max_session_reserved_rows,
          " (--max_session_reserved_rows)"));
    }
  } else if (options_.max_session_reserved_rows > 0 &&
             uint64_t{req.pages()} + req.snapshots() >
                 options_.max_session_reserved_rows) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "reserve: ", uint64_t{req.pages()} + req.snapshots(),
        " rows exceed what one session may hold reserved, ",
        options_.max_session_reserved_rows, " (--max_session_reserved_rows)"));
  }
  ns.ApplyPendingTouches();  // Evictions must see every lookup's recency.
  // All or nothing, and refused before anything is evicted.
  auto allocated = ns.index->AllocateRows(rank, req.pages(), req.snapshots());
  if (!allocated.ok()) return ExplainFenceLocked(ns, allocated.status());
  ns.TellRemoved();  // What the allocation evicted.
  std::vector<uint32_t> pages = std::move(allocated->page_rows);
  std::vector<uint32_t> snaps = std::move(allocated->snapshot_rows);
  auto device = devices_.Reserve(req.device_pool(), req.device_snapshots());
  if (!device.ok()) {
    (void)ns.index->FreePageRows(rank, pages);
    (void)ns.index->FreeSnapshotRows(rank, snaps);
    return device.status();
  }
  std::vector<uint32_t> device_rows = *std::move(device);
  // The rows reach the engine only once the journal knows they may be
  // overwritten: replay then forgets whatever they held.
  if (ns.journal != nullptr) {
    if (absl::Status s =
            ns.Journal(ns.journal->AppendReserve(rank, pages, snaps));
        !s.ok()) {
      (void)ns.index->FreePageRows(rank, pages);
      (void)ns.index->FreeSnapshotRows(rank, snaps);
      devices_.Abort(req.device_pool(), device_rows);
      return s;
    }
  }
  // Random, not counted (random_id.h): a count would tell every session
  // how busy the others are.
  uint64_t id = 0;
  do {
    id = RandomId();
  } while (ns.reservations.contains(id));
  resp->set_reservation_id(id);
  resp->mutable_page_rows()->Assign(pages.begin(), pages.end());
  resp->mutable_snapshot_rows()->Assign(snaps.begin(), snaps.end());
  ns.reserved_page_rows += pages.size();
  ns.reserved_snapshot_rows += snaps.size();
  resp->mutable_device_snapshot_rows()->Assign(device_rows.begin(),
                                               device_rows.end());
  ns.Charge(req.session_id(), 1,
            static_cast<int64_t>(pages.size() + snaps.size()));
  ns.reservations[id] =
      Namespace::Reservation{req.session_id(),  rank,
                             std::move(pages),  std::move(snaps),
                             req.device_pool(), std::move(device_rows)};
  return absl::OkStatus();
}

absl::Status TierCore::Abort(const v1::AbortRequest& req,
                             v1::AbortResponse* resp) {
  uint32_t rank = 0;
  auto ns_or =
      Resolve(req.api_version(), req.session_id(), req.namespace_id(), &rank);
  if (!ns_or.ok()) return ns_or.status();
  Namespace& ns = **ns_or;
  absl::MutexLock lock(&ns.mu);
  auto it = ns.reservations.find(req.reservation_id());
  if (it == ns.reservations.end() || it->second.session != req.session_id()) {
    return absl::NotFoundError(
        absl::StrCat("reservation_id: no reservation ", req.reservation_id(),
                     " of this session in namespace '", ns.name, "'"));
  }
  if (req.fenced()) {
    InstanceKey instance;
    HolderKey holder;
    // A session closing meanwhile fences the reservation itself, with its
    // owner: leave it to CloseSession.
    if (!fence_->SessionOwner(req.session_id(), &instance, &holder)) {
      return absl::NotFoundError(
          absl::StrCat("session_id: session ", req.session_id(), " closed"));
    }
    resp->set_fence_hold(HoldReservationLocked(
        ns, req.reservation_id(), Namespace::FenceHold::Kind::kAbandoned,
        instance, holder));
    return absl::OkStatus();
  }
  auto& r = it->second;
  absl::Status s1 = ns.index->FreePageRows(r.rank, r.page_rows);
  absl::Status s2 = ns.index->FreeSnapshotRows(r.rank, r.snapshot_rows);
  devices_.Abort(r.device_pool, r.device_rows);
  ns.reserved_page_rows -= r.page_rows.size();
  ns.reserved_snapshot_rows -= r.snapshot_rows.size();
  ns.Charge(r.session, -1, -Namespace::Rows(r));
  ns.reservations.erase(it);
  if (!s1.ok()) return absl::InternalError(s1.message());
  if (!s2.ok()) return absl::InternalError(s2.message());
  return absl::OkStatus();
}

}  // namespace kvtier::daemon
