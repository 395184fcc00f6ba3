// TierCore's commits: Commit makes a reservation's written rows visible
// under their hashes (pages, snapshots, device-pool slots), journaled before
// it is acknowledged; AdoptMirror commits copies of a session's mirror
// rows.
//
// Thread-safety: thread-safe (part of TierCore; lock order in tier_core.h).
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/tier_core.h"
#include "daemon/tier_request.h"
#include "spdlog/spdlog.h"

namespace kvtier::daemon {

namespace {

// token_ids is empty or exactly tokens_per_page per hash (CommitRequest).
absl::Status CheckTokenIds(const v1::CommitRequest& req,
                           const TierNamespace& ns, size_t pages) {
  const uint64_t want = uint64_t{ns.layout.tokens_per_page()} * pages;
  if (req.token_ids_size() != 0 &&
      static_cast<uint64_t>(req.token_ids_size()) != want) {
    return absl::InvalidArgumentError(
        absl::StrCat("token_ids: ", req.token_ids_size(), " token ids for ",
                     pages, " pages of ", ns.layout.tokens_per_page(),
                     " tokens (send none, or ", want, ")"));
  }
  return absl::OkStatus();
}

// What a Commit places of its reservation's snapshot rows and device-pool
// slots.
struct Placements {
  std::vector<PrefixIndex::SnapshotPlacement> snapshots;
  std::vector<bool> placed;  // Per snapshot row of the reservation.
  // (slot, device-tier key) per placed device slot.
  std::vector<std::pair<uint32_t, std::string>> device;
  std::vector<bool> device_placed;  // Per device slot of the reservation.
};

// Parses the snapshots and device_snapshots of `req` against reservation
// `r` of `ns` at storage rank `rank`: INVALID_ARGUMENT naming the first bad
// field (an index out of range or placed twice, a hash of the wrong size).
absl::Status ParsePlacements(const v1::CommitRequest& req,
                             const TierNamespace& ns,
                             const TierNamespace::Reservation& r, uint32_t rank,
                             Placements* out) {
  std::vector<bool>& placed = out->placed;
  placed.assign(r.snapshot_rows.size(), false);
  for (int i = 0; i < req.snapshots_size(); ++i) {
    const auto& p = req.snapshots(i);
    const std::string field = absl::StrCat("snapshots[", i, "]");
    if (p.index() >= r.snapshot_rows.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".index: ", p.index(), " is not below the reservation's ",
          r.snapshot_rows.size(), " snapshot rows"));
    }
    if (placed[p.index()]) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".index: snapshot row ", p.index(), " placed twice"));
    }
    placed[p.index()] = true;
    PrefixIndex::SnapshotPlacement sp;
    sp.row = r.snapshot_rows[p.index()];
    if (absl::Status s =
            ParseOneHash(p.hash(), ns.hash_bytes, field + ".hash", &sp.hash);
        !s.ok()) {
      return s;
    }
    out->snapshots.push_back(sp);
  }
  std::vector<bool>& device_placed = out->device_placed;
  device_placed.assign(r.device_rows.size(), false);
  for (int i = 0; i < req.device_snapshots_size(); ++i) {
    const auto& p = req.device_snapshots(i);
    const std::string field = absl::StrCat("device_snapshots[", i, "]");
    if (p.index() >= r.device_rows.size() || device_placed[p.index()]) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".index: ", p.index(),
                       " is not an unplaced one of the "
                       "reservation's ",
                       r.device_rows.size(), " device snapshot rows"));
    }
    device_placed[p.index()] = true;
    HashKey h;
    if (absl::Status s =
            ParseOneHash(p.hash(), ns.hash_bytes, field + ".hash", &h);
        !s.ok()) {
      return s;
    }
    out->device.emplace_back(r.device_rows[p.index()],
                             DeviceTiers::Key(ns.id, rank, h, ns.hash_bytes));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status TierCore::Commit(const v1::CommitRequest& req,
                              v1::CommitResponse* resp) {
  if (req.mirror_indices_size() > 0) return AdoptMirror(req, resp);
  uint32_t rank = 0;
  auto ns_or =
      Resolve(req.api_version(), req.session_id(), req.namespace_id(), &rank);
  if (!ns_or.ok()) return ns_or.status();
  Namespace& ns = **ns_or;
  std::vector<HashKey> keys;
  if (absl::Status s = ParseHashes(req.hashes(), ns.hash_bytes,
                                   kMaxReservePages, "hashes", &keys);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckTokenIds(req, ns, keys.size()); !s.ok()) return s;
  HashKey parent;
  bool has_parent = false;
  if (absl::Status s = ParseOptionalHash(req.parent_hash(), ns.hash_bytes,
                                         "parent_hash", &parent, &has_parent);
      !s.ok()) {
    return s;
  }
  absl::MutexLock lock(&ns.mu);
  auto it = ns.reservations.find(req.reservation_id());
  if (it == ns.reservations.end() || it->second.session != req.session_id()) {
    return absl::NotFoundError(
        absl::StrCat("reservation_id: no reservation ", req.reservation_id(),
                     " of this session in namespace '", ns.name, "'"));
  }
  Namespace::Reservation& r = it->second;
  if (keys.size() != r.page_rows.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("hashes: ", keys.size(), " hashes for a reservation of ",
                     r.page_rows.size(), " page rows"));
  }
  Placements placed;
  if (absl::Status s = ParsePlacements(req, ns, r, rank, &placed); !s.ok()) {
    return s;
  }
  const auto& placements = placed.snapshots;
  const auto& device_placements = placed.device;
  if (keys.empty() && placements.empty() && device_placements.empty()) {
    return absl::InvalidArgumentError(
        "hashes, snapshots: nothing to commit (abort the reservation instead)");
  }
  if (keys.empty() && placements.empty()) {
    // Device slots only: nothing for the host index or the journal (the
    // device tier does not outlive the daemon).
    devices_.Commit(r.device_pool, device_placements, r.device_rows,
                    placed.device_placed);
    (void)ns.index->FreePageRows(rank, r.page_rows);
    (void)ns.index->FreeSnapshotRows(rank, r.snapshot_rows);
    ns.reserved_page_rows -= r.page_rows.size();
    ns.reserved_snapshot_rows -= r.snapshot_rows.size();
    ns.Charge(r.session, -1, -Namespace::Rows(r));
    ns.reservations.erase(it);
    resp->set_committed_device_snapshots(device_placements.size());
    return absl::OkStatus();
  }
  auto result = ns.index->Commit(rank, has_parent ? &parent : nullptr, keys,
                                 r.page_rows, placements);
  if (!result.ok()) return result.status();
  TierCommit commit;
  commit.origin = TierCommit::Origin::kEngine;
  commit.rank = rank;
  commit.parent = has_parent ? &parent : nullptr;
  commit.keys = keys;
  commit.rows = r.page_rows;
  commit.snapshots = placements;
  commit.token_ids =
      absl::MakeConstSpan(req.token_ids().data(), req.token_ids().size());
  commit.result = &*result;
  ns.Committed(commit);
  // Acknowledged only once journaled. When even a checkpoint fails, the
  // pages stay visible (the engine wrote them) but the engine hears
  // UNAVAILABLE: a restart may lose them.
  absl::Status journaled;
  if (ns.journal != nullptr) {
    journaled = ns.Journal(ns.journal->AppendCommit(
        rank, has_parent ? &parent : nullptr, keys, r.page_rows, placements,
        result->freed_page_rows, result->freed_snapshot_rows));
  }
  std::vector<uint32_t> unplaced;
  for (size_t i = 0; i < placed.placed.size(); ++i) {
    if (!placed.placed[i]) unplaced.push_back(r.snapshot_rows[i]);
  }
  if (!unplaced.empty()) {
    if (absl::Status s = ns.index->FreeSnapshotRows(rank, unplaced); !s.ok()) {
      SPDLOG_ERROR("namespace '{}': freeing unplaced snapshot rows: {}",
                   ns.name, s.ToString());
    }
  }
  ns.reserved_page_rows -= r.page_rows.size();
  ns.reserved_snapshot_rows -= r.snapshot_rows.size();
  devices_.Commit(r.device_pool, device_placements, r.device_rows,
                  placed.device_placed);
  ns.Charge(r.session, -1, -Namespace::Rows(r));
  ns.reservations.erase(it);
  resp->set_committed_device_snapshots(device_placements.size());
  if (!journaled.ok()) return journaled;
  resp->set_committed_pages(result->committed_pages);
  resp->set_deduplicated_pages(result->deduplicated_pages);
  resp->set_committed_snapshots(result->committed_snapshots);
  resp->set_deduplicated_snapshots(result->deduplicated_snapshots);
  return absl::OkStatus();
}

absl::Status TierCore::AdoptMirror(const v1::CommitRequest& req,
                                   v1::CommitResponse* resp) {
  uint32_t rank = 0;
  auto ns_or =
      Resolve(req.api_version(), req.session_id(), req.namespace_id(), &rank);
  if (!ns_or.ok()) return ns_or.status();
  Namespace& ns = **ns_or;
  std::vector<HashKey> keys;
  if (absl::Status s = ParseHashes(req.hashes(), ns.hash_bytes,
                                   kMaxReservePages, "hashes", &keys);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckTokenIds(req, ns, keys.size()); !s.ok()) return s;
  if (keys.empty()) {
    return absl::InvalidArgumentError("hashes: nothing to adopt");
  }
  if (req.snapshots_size() > 0 || req.device_snapshots_size() > 0) {
    return absl::InvalidArgumentError(
        "snapshots, device_snapshots: not supported with mirror_indices");
  }
  if (static_cast<size_t>(req.mirror_indices_size()) != keys.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("mirror_indices: ", req.mirror_indices_size(),
                     " indices for ", keys.size(), " hashes"));
  }
  HashKey parent;
  bool has_parent = false;
  if (absl::Status s = ParseOptionalHash(req.parent_hash(), ns.hash_bytes,
                                         "parent_hash", &parent, &has_parent);
      !s.ok()) {
    return s;
  }
  absl::MutexLock lock(&ns.mu);
  auto it = ns.reservations.find(req.reservation_id());
  if (it == ns.reservations.end() || it->second.session != req.session_id()) {
    return absl::NotFoundError(absl::StrCat(
        "reservation_id: no mirror reservation ", req.reservation_id(),
        " of this session in namespace '", ns.name, "'"));
  }
  // Mirror rows are reserved, never committed: the allocation below cannot
  // evict them.
  const std::vector<uint32_t> mirror_rows = it->second.page_rows;
  std::vector<uint32_t> sources;
  sources.reserve(keys.size());
  for (int i = 0; i < req.mirror_indices_size(); ++i) {
    const uint32_t k = req.mirror_indices(i);
    if (k >= mirror_rows.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "mirror_indices[", i, "]: ", k, " is not below the mirror's ",
          mirror_rows.size(), " rows"));
    }
    sources.push_back(mirror_rows[k]);
  }
  ns.ApplyPendingTouches();  // Evictions must see every lookup's recency.
  auto rows_or = ns.index->AllocatePageRows(rank, keys.size());
  if (!rows_or.ok()) return rows_or.status();
  std::vector<uint32_t> rows = *std::move(rows_or);
  if (ns.journal != nullptr) {
    if (absl::Status s = ns.Journal(ns.journal->AppendReserve(rank, rows, {}));
        !s.ok()) {
      (void)ns.index->FreePageRows(rank, rows);
      ns.TellRemoved();
      return s;
    }
  }
  // Host to host, every page bank (the snapshot segment, last when hybrid,
  // is not a page bank).
  const size_t page_banks = ns.layout.page_banks_size();
  for (size_t b = 0; b < page_banks; ++b) {
    const shm::Segment& seg = *ns.segments[rank][b];
    const uint64_t row_bytes = ns.layout.page_banks(b).row_bytes();
    for (size_t i = 0; i < rows.size(); ++i) {
      std::memcpy(seg.row(rows[i]), seg.row(sources[i]), row_bytes);
    }
  }
  auto result =
      ns.index->Commit(rank, has_parent ? &parent : nullptr, keys, rows, {});
  if (!result.ok()) {
    (void)ns.index->FreePageRows(rank, rows);
    ns.TellRemoved();  // The allocation may have evicted.
    return result.status();
  }
  ns.TellRemoved();
  TierCommit commit;
  commit.origin = TierCommit::Origin::kMirror;
  commit.rank = rank;
  commit.parent = has_parent ? &parent : nullptr;
  commit.keys = keys;
  commit.rows = rows;
  commit.token_ids =
      absl::MakeConstSpan(req.token_ids().data(), req.token_ids().size());
  commit.result = &*result;
  ns.Committed(commit);
  absl::Status journaled;
  if (ns.journal != nullptr) {
    journaled = ns.Journal(ns.journal->AppendCommit(
        rank, has_parent ? &parent : nullptr, keys, rows, {},
        result->freed_page_rows, result->freed_snapshot_rows));
  }
  if (!journaled.ok()) return journaled;
  resp->set_committed_pages(result->committed_pages);
  resp->set_deduplicated_pages(result->deduplicated_pages);
  return absl::OkStatus();
}

}  // namespace kvtier::daemon
