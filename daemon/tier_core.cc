// TierCore: the daemon's transport-free core: sessions and the requests on
// namespaces (namespace creation, Attach and Drop: tier_attach.cc).
//
// Thread-safety: thread-safe (lock order in tier_core.h).
#include "daemon/tier_core.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "common/error_reason.h"
#include "daemon/tier_namespace.h"
#include "spdlog/spdlog.h"

namespace kvtier::daemon {

namespace {

// Splits packed `bytes` into keys of `hash_bytes` each.
absl::Status ParseHashes(absl::string_view bytes, uint32_t hash_bytes,
                         uint32_t max_count, absl::string_view field,
                         std::vector<HashKey>* out) {
  if (bytes.size() % hash_bytes != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": ", bytes.size(),
        " bytes is not a multiple of the namespace's hash size ", hash_bytes));
  }
  const size_t n = bytes.size() / hash_bytes;
  if (n > max_count) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": ", n, " hashes exceed the limit of ", max_count));
  }
  out->resize(n);
  for (size_t i = 0; i < n; ++i) {
    HashKey& k = (*out)[i];
    k.bytes.fill(0);
    std::memcpy(k.bytes.data(), bytes.data() + i * hash_bytes, hash_bytes);
  }
  return absl::OkStatus();
}

}  // namespace

TierCore::TierCore(TierOptions options)
    : options_(std::move(options)),
      started_(absl::Now()),
      fence_(std::make_unique<FenceRegistry>(
          options_.state_dir.empty() ? ""
                                     : options_.state_dir + "/fence.instances",
          options_.fence)) {
  for (const DevicePoolExport& e : options_.device_pools) {
    device_tiers_.push_back(std::make_unique<DeviceSnapshotTier>(
        static_cast<uint32_t>(std::min<uint64_t>(e.rows, UINT32_MAX))));
  }
}

std::string TierCore::DeviceKey(uint64_t namespace_id, uint32_t rank,
                                const HashKey& hash, uint32_t hash_bytes) {
  std::string key(sizeof(namespace_id) + sizeof(rank) + hash_bytes, '\0');
  std::memcpy(key.data(), &namespace_id, sizeof(namespace_id));
  std::memcpy(key.data() + sizeof(namespace_id), &rank, sizeof(rank));
  std::memcpy(key.data() + sizeof(namespace_id) + sizeof(rank),
              hash.bytes.data(), hash_bytes);
  return key;
}

void TierCore::AbortDeviceRows(uint32_t pool,
                               const std::vector<uint32_t>& rows) {
  for (uint32_t row : rows) (void)device_tiers_[pool]->Abort(row);
}

TierCore::~TierCore() {
  {
    absl::MutexLock lock(&sweeper_mu_);
    sweeper_stop_ = true;
  }
  if (sweeper_.joinable()) sweeper_.join();
  if (state_lock_fd_ >= 0) ::close(state_lock_fd_);
}

absl::StatusOr<uint64_t> TierCore::OpenSession(const v1::Hello& hello,
                                               const PeerInfo& peer) {
  if (hello.client_name().size() > 256) {
    return absl::InvalidArgumentError("hello.client_name: at most 256 bytes");
  }
  if (!hello.instance_id().empty() &&
      hello.instance_id().size() != kInstanceIdBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("hello.instance_id: must be empty or ", kInstanceIdBytes,
                     " bytes, got ", hello.instance_id().size()));
  }
  absl::BitGen gen;
  absl::MutexLock lock(&mu_);
  uint64_t id = 0;
  do {
    id = absl::Uniform<uint64_t>(gen);
  } while (id == 0 || sessions_.contains(id));
  Session& s = sessions_[id];
  s.id = id;
  s.client_name = hello.client_name();
  s.peer = peer;
  s.opened = absl::Now();
  s.fence_version = hello.fence_version();
  fence_->OpenSession(id, hello.instance_id(), hello.fence_version(),
                      hello.connection_id());
  SPDLOG_INFO("session {} opened: client '{}' pid {}", SessionTag(id),
              s.client_name, peer.pid);
  return id;
}

void TierCore::CloseSession(uint64_t session_id) {
  std::vector<std::shared_ptr<Namespace>> attached;
  {
    absl::MutexLock lock(&mu_);
    auto it = sessions_.find(session_id);
    if (it == sessions_.end()) return;
    for (const auto& [ns_id, rank] : it->second.attached) {
      auto ns = by_id_.find(ns_id);
      if (ns != by_id_.end()) attached.push_back(ns->second);
    }
    sessions_.erase(it);
  }
  // Queued GPU work outlives a session: unless the session said it has none
  // or its process is gone, what it held is fenced, not freed.
  const FenceRegistry::Closed closed = fence_->CloseSession(session_id);
  size_t aborted = 0, released = 0, fenced = 0;
  for (auto& ns : attached) {
    absl::MutexLock lock(&ns->mu);
    if (!closed.free_now) {
      std::vector<uint64_t> res, leases;
      for (const auto& [id, r] : ns->reservations) {
        if (r.session == session_id) res.push_back(id);
      }
      for (const auto& [id, l] : ns->leases) {
        if (l.session == session_id) leases.push_back(id);
      }
      for (uint64_t id : res) {
        HoldReservationLocked(
            *ns, id,
            static_cast<int>(Namespace::FenceHold::Kind::kSessionEnded),
            closed.instance, closed.holder);
      }
      for (uint64_t id : leases) {
        HoldLeaseLocked(*ns, id, closed.instance, closed.holder);
      }
      fenced += res.size() + leases.size();
    }
    for (auto it = ns->reservations.begin(); it != ns->reservations.end();) {
      auto cur = it++;
      if (cur->second.session != session_id) continue;
      auto& r = cur->second;
      (void)ns->index->FreePageRows(r.rank, r.page_rows);
      (void)ns->index->FreeSnapshotRows(r.rank, r.snapshot_rows);
      AbortDeviceRows(r.device_pool, r.device_rows);
      ns->reserved_page_rows -= r.page_rows.size();
      ns->reserved_snapshot_rows -= r.snapshot_rows.size();
      ns->reservations.erase(cur);
      ++aborted;
    }
    for (auto it = ns->leases.begin(); it != ns->leases.end();) {
      auto cur = it++;
      if (cur->second.session != session_id) continue;
      (void)ns->index->Unpin(cur->second.node);
      if (cur->second.device_lease != 0) {
        (void)device_tiers_[cur->second.device_pool]->Release(
            cur->second.device_lease);
      }
      ns->leases.erase(cur);
      ++released;
    }
    ns->use.erase(session_id);
    ns->sessions.erase(session_id);
  }
  SPDLOG_INFO(
      "session {} closed: {} reservations aborted, {} leases "
      "released, {} fenced",
      SessionTag(session_id), aborted, released, fenced);
}

absl::StatusOr<std::shared_ptr<TierCore::Namespace>> TierCore::Resolve(
    uint32_t api_version, uint64_t session_id, uint64_t namespace_id,
    uint32_t* rank) {
  if (absl::Status s = CheckApiVersion(api_version); !s.ok()) return s;
  absl::ReaderMutexLock lock(&mu_);
  auto session = sessions_.find(session_id);
  if (session == sessions_.end()) {
    return SessionUnknownError(session_id);
  }
  auto ns = by_id_.find(namespace_id);
  if (ns == by_id_.end()) {
    return WithErrorReason(absl::NotFoundError(absl::StrCat(
                               "namespace_id: no namespace ", namespace_id)),
                           ErrorReason::kNamespaceUnknown);
  }
  auto att = session->second.attached.find(namespace_id);
  if (att == session->second.attached.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("namespace_id: session is not attached to namespace '",
                     ns->second->name, "'"));
  }
  *rank = ns->second->StorageRank(att->second);
  return ns->second;
}

absl::Status TierCore::Lookup(const v1::LookupRequest& req,
                              v1::LookupResponse* resp) {
  if (absl::Status s = CheckApiVersion(req.api_version()); !s.ok()) return s;
  LookupOutcome out;
  if (req.has_device_pool() && req.device_pool() >= device_tiers_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("device_pool: ", req.device_pool(), " but the daemon has ",
                     device_tiers_.size(), " device pools"));
  }
  const int device_pool =
      req.has_device_pool() ? static_cast<int>(req.device_pool()) : -1;
  if (absl::Status s = LookupHashes(req.session_id(), req.namespace_id(),
                                    req.hashes(), req.pin(), &out, device_pool);
      !s.ok()) {
    return s;
  }
  resp->set_has_device_snapshot(out.has_device_snapshot);
  if (out.has_device_snapshot) {
    resp->set_device_snapshot_row(out.device_snapshot_row);
  }
  resp->set_matched_pages(out.matched_pages);
  resp->set_usable_pages(out.usable_pages);
  resp->mutable_rows()->Assign(out.rows.begin(), out.rows.end());
  resp->set_has_snapshot(out.has_snapshot);
  if (out.has_snapshot) resp->set_snapshot_row(out.snapshot_row);
  resp->set_lease_id(out.lease_id);
  return absl::OkStatus();
}

void TierCore::ApplyPendingTouches(Namespace& ns) {
  std::vector<std::pair<uint32_t, HashKey>> touches;
  {
    absl::MutexLock touch(&ns.touch_mu);
    touches.swap(ns.pending_touches);
  }
  for (const auto& [node, key] : touches) {
    // An id evicted and reused since the lookup is another node now.
    if (ns.index->NodeHasKey(node, key)) ns.index->Touch(node);
  }
}

absl::Status TierCore::LookupHashes(uint64_t session_id, uint64_t namespace_id,
                                    absl::string_view hashes, bool pin,
                                    LookupOutcome* out, int device_pool) {
  uint32_t rank = 0;
  auto ns_or = Resolve(0, session_id, namespace_id, &rank);
  if (!ns_or.ok()) return ns_or.status();
  Namespace& ns = **ns_or;
  if (device_pool >= 0 && !PoolServes(device_pool, ns.name)) {
    return absl::PermissionDeniedError(absl::StrCat(
        "device_pool: pool ", device_pool, " does not serve namespace '",
        ns.name, "' (kvtierd --device_pool_namespaces)"));
  }
  // 32-byte hashes are HashKeys already: look them up in place (no 48 KiB
  // copy per 1,536-page lookup); shorter ones are padded into a copy.
  std::vector<HashKey> padded;
  absl::Span<const HashKey> keys;
  static_assert(sizeof(HashKey) == 32 && alignof(HashKey) == 1);
  if (ns.hash_bytes == sizeof(HashKey) &&
      hashes.size() % sizeof(HashKey) == 0 &&
      hashes.size() / sizeof(HashKey) <= kMaxLookupPages) {
    keys = absl::MakeConstSpan(reinterpret_cast<const HashKey*>(hashes.data()),
                               hashes.size() / sizeof(HashKey));
  } else {
    if (absl::Status s = ParseHashes(hashes, ns.hash_bytes, kMaxLookupPages,
                                     "hashes", &padded);
        !s.ok()) {
      return s;
    }
    keys = padded;
  }
  // The search runs under the shared lock, so concurrent lookups do not
  // queue behind each other; only the recency update, the counters and the
  // pin take the exclusive lock. A Reserve (the only evictor besides Drop)
  // between the two bumps evict_epoch, and then the search is redone.
  // An unpinned lookup takes only the shared lock: its recency update is
  // queued (see Namespace::pending_touches).
  PrefixIndex::LookupResult r;
  uint64_t epoch = 0;
  auto count = [&] {
    ns.lookups.fetch_add(1, std::memory_order_relaxed);
    ns.hit_pages.fetch_add(r.usable_pages, std::memory_order_relaxed);
    ns.miss_pages.fetch_add(keys.size() - r.usable_pages,
                            std::memory_order_relaxed);
    if (r.has_snapshot) {
      ns.snapshot_hits.fetch_add(1, std::memory_order_relaxed);
    }
  };
  bool flush = false;
  {
    absl::ReaderMutexLock shared(&ns.mu);
    r = ns.index->Find(keys, rank);
    epoch = ns.evict_epoch;
    if (!pin) {
      if (r.touch_node != kNoNode) {
        const size_t depth =
            (r.pin_node != kNoNode ? r.usable_pages : r.matched_pages) - 1;
        absl::MutexLock touch(&ns.touch_mu);
        ns.pending_touches.emplace_back(r.touch_node, keys[depth]);
        flush = ns.pending_touches.size() >= kMaxPendingTouches;
      }
      count();
    }
  }
  // The device tier serves the host's usable snapshot from HBM when it
  // holds the same one: the pages up to it are the host's (pinned by the
  // host lease), so the answer never outgrows what the host index vouches
  // for.
  auto device_hit =
      [&](bool pin_device) -> std::optional<DeviceSnapshotTier::Hit> {
    if (device_pool < 0 || !r.has_snapshot || r.usable_pages == 0) {
      return std::nullopt;
    }
    const std::string key =
        DeviceKey(ns.id, rank, keys[r.usable_pages - 1], ns.hash_bytes);
    return device_tiers_[device_pool]->Lookup(absl::MakeConstSpan(&key, 1), 1,
                                              pin_device);
  };
  if (!pin) {
    if (flush) {
      absl::MutexLock lock(&ns.mu);
      ApplyPendingTouches(ns);
    }
    out->matched_pages = r.matched_pages;
    out->usable_pages = r.usable_pages;
    out->has_snapshot = r.has_snapshot;
    out->snapshot_row = r.has_snapshot ? r.snapshot_row : 0;
    out->lease_id = 0;
    if (auto d = device_hit(false)) {
      out->has_device_snapshot = true;
      out->device_snapshot_row = d->row;
    }
    out->rows = std::move(r.rows);
    return absl::OkStatus();
  }
  Hook("lookup:resolved");
  absl::MutexLock lock(&ns.mu);
  // A session closed since Resolve must not be left a pin.
  if (!ns.sessions.contains(session_id)) {
    return absl::NotFoundError(
        absl::StrCat("session_id: session ", session_id, " closed"));
  }
  ApplyPendingTouches(ns);
  if (ns.evict_epoch != epoch) r = ns.index->Find(keys, rank);
  ns.index->Touch(r.touch_node);
  count();
  out->matched_pages = r.matched_pages;
  out->usable_pages = r.usable_pages;
  out->has_snapshot = r.has_snapshot;
  out->snapshot_row = r.has_snapshot ? r.snapshot_row : 0;
  out->lease_id = 0;
  if (pin && r.usable_pages > 0 && r.pin_node != kNoNode) {
    if (options_.max_session_leases > 0) {
      auto u = ns.use.find(session_id);
      if (u != ns.use.end() &&
          u->second.leases >= options_.max_session_leases) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "pin: this session holds ", u->second.leases,
            " leases in namespace '", ns.name,
            "', the most one session may (--max_session_leases); release "
            "some"));
      }
    }
    const uint64_t lease = next_id_.fetch_add(1);
    ns.index->Pin(r.pin_node);
    Namespace::Lease l{session_id, r.pin_node, r.usable_pages};
    if (auto d = device_hit(true)) {
      out->has_device_snapshot = true;
      out->device_snapshot_row = d->row;
      l.device_pool = static_cast<uint32_t>(device_pool);
      l.device_lease = d->lease_id;
    }
    ns.leases[lease] = l;
    ns.Charge(session_id, 0, 1, 0);
    out->lease_id = lease;
  }
  out->rows = std::move(r.rows);
  return absl::OkStatus();
}

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
  if (req.device_snapshots() > 0) {
    if (req.device_pool() >= device_tiers_.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "device_pool: ", req.device_pool(), " but the daemon has ",
          device_tiers_.size(), " device pools (kvtierd --device_pool_bytes)"));
    }
    if (!PoolServes(req.device_pool(), ns.name)) {
      return absl::PermissionDeniedError(
          absl::StrCat("device_pool: pool ", req.device_pool(),
                       " does not serve namespace '", ns.name,
                       "' (kvtierd --device_pool_namespaces)"));
    }
    const DevicePoolExport& e = options_.device_pools[req.device_pool()];
    if (ns.layout.snapshot_row_bytes() == 0 ||
        ns.layout.snapshot_row_bytes() > e.row_bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("device_snapshots: the namespace's snapshots (",
                       ns.layout.snapshot_row_bytes(),
                       " bytes) do not fit the device "
                       "pool's slots (",
                       e.row_bytes, " bytes)"));
    }
    if (req.device_snapshots() > e.rows) {
      return absl::InvalidArgumentError(
          absl::StrCat("device_snapshots: ", req.device_snapshots(),
                       " exceeds the device pool's ", e.rows, " slots"));
    }
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
  ApplyPendingTouches(ns);  // Evictions must see every lookup's recency.
  ++ns.evict_epoch;         // Allocation may evict.
  // All or nothing, and refused before anything is evicted.
  auto allocated = ns.index->AllocateRows(rank, req.pages(), req.snapshots());
  if (!allocated.ok()) return ExplainFenceLocked(ns, allocated.status());
  std::vector<uint32_t> pages = std::move(allocated->page_rows);
  std::vector<uint32_t> snaps = std::move(allocated->snapshot_rows);
  std::vector<uint32_t> device_rows;
  for (uint32_t i = 0; i < req.device_snapshots(); ++i) {
    auto d = device_tiers_[req.device_pool()]->Reserve();
    if (!d.ok()) {
      AbortDeviceRows(req.device_pool(), device_rows);
      (void)ns.index->FreePageRows(rank, pages);
      (void)ns.index->FreeSnapshotRows(rank, snaps);
      return d.status();
    }
    device_rows.push_back(*d);
  }
  // The rows reach the engine only once the journal knows they may be
  // overwritten: replay then forgets whatever they held.
  if (ns.journal != nullptr) {
    if (absl::Status s =
            JournalLocked(ns, ns.journal->AppendReserve(rank, pages, snaps));
        !s.ok()) {
      (void)ns.index->FreePageRows(rank, pages);
      (void)ns.index->FreeSnapshotRows(rank, snaps);
      AbortDeviceRows(req.device_pool(), device_rows);
      return s;
    }
  }
  const uint64_t id = next_id_.fetch_add(1);
  resp->set_reservation_id(id);
  resp->mutable_page_rows()->Assign(pages.begin(), pages.end());
  resp->mutable_snapshot_rows()->Assign(snaps.begin(), snaps.end());
  ns.reserved_page_rows += pages.size();
  ns.reserved_snapshot_rows += snaps.size();
  resp->mutable_device_snapshot_rows()->Assign(device_rows.begin(),
                                               device_rows.end());
  ns.Charge(req.session_id(), 1, 0,
            static_cast<int64_t>(pages.size() + snaps.size()));
  ns.reservations[id] =
      Namespace::Reservation{req.session_id(),  rank,
                             std::move(pages),  std::move(snaps),
                             req.device_pool(), std::move(device_rows)};
  return absl::OkStatus();
}

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
  HashKey parent;
  const bool has_parent = !req.parent_hash().empty();
  if (has_parent) {
    if (absl::Status s = ParseOneHash(req.parent_hash(), ns.hash_bytes,
                                      "parent_hash", &parent);
        !s.ok()) {
      return s;
    }
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
  std::vector<PrefixIndex::SnapshotPlacement> placements;
  std::vector<bool> placed(r.snapshot_rows.size(), false);
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
    placements.push_back(sp);
  }
  std::vector<std::pair<uint32_t, std::string>> device_placements;
  std::vector<bool> device_placed(r.device_rows.size(), false);
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
    device_placements.emplace_back(r.device_rows[p.index()],
                                   DeviceKey(ns.id, rank, h, ns.hash_bytes));
  }
  if (keys.empty() && placements.empty() && device_placements.empty()) {
    return absl::InvalidArgumentError(
        "hashes, snapshots: nothing to commit (abort the reservation instead)");
  }
  if (keys.empty() && placements.empty()) {
    // Device slots only: nothing for the host index or the journal (the
    // device tier does not outlive the daemon).
    for (const auto& [row, key] : device_placements) {
      (void)device_tiers_[r.device_pool]->Commit(row, key);
    }
    for (size_t i = 0; i < device_placed.size(); ++i) {
      if (!device_placed[i]) {
        (void)device_tiers_[r.device_pool]->Abort(r.device_rows[i]);
      }
    }
    (void)ns.index->FreePageRows(rank, r.page_rows);
    (void)ns.index->FreeSnapshotRows(rank, r.snapshot_rows);
    ns.reserved_page_rows -= r.page_rows.size();
    ns.reserved_snapshot_rows -= r.snapshot_rows.size();
    ns.Charge(r.session, -1, 0, -Namespace::Rows(r));
    ns.reservations.erase(it);
    resp->set_committed_device_snapshots(device_placements.size());
    return absl::OkStatus();
  }
  auto result = ns.index->Commit(rank, has_parent ? &parent : nullptr, keys,
                                 r.page_rows, placements);
  if (!result.ok()) return result.status();
  // Acknowledged only once journaled. When even a checkpoint fails, the
  // pages stay visible (the engine wrote them) but the engine hears
  // UNAVAILABLE: a restart may lose them.
  absl::Status journaled;
  if (ns.journal != nullptr) {
    journaled =
        JournalLocked(ns, ns.journal->AppendCommit(
                              rank, has_parent ? &parent : nullptr, keys,
                              r.page_rows, placements, result->freed_page_rows,
                              result->freed_snapshot_rows));
  }
  std::vector<uint32_t> unplaced;
  for (size_t i = 0; i < placed.size(); ++i) {
    if (!placed[i]) unplaced.push_back(r.snapshot_rows[i]);
  }
  if (!unplaced.empty()) {
    if (absl::Status s = ns.index->FreeSnapshotRows(rank, unplaced); !s.ok()) {
      SPDLOG_ERROR("namespace '{}': freeing unplaced snapshot rows: {}",
                   ns.name, s.ToString());
    }
  }
  ns.reserved_page_rows -= r.page_rows.size();
  ns.reserved_snapshot_rows -= r.snapshot_rows.size();
  ns.committed_pages += result->committed_pages;
  ns.committed_snapshots += result->committed_snapshots;
  for (const auto& [row, key] : device_placements) {
    (void)device_tiers_[r.device_pool]->Commit(row, key);
  }
  for (size_t i = 0; i < device_placed.size(); ++i) {
    if (!device_placed[i]) {
      (void)device_tiers_[r.device_pool]->Abort(r.device_rows[i]);
    }
  }
  ns.Charge(r.session, -1, 0, -Namespace::Rows(r));
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
  const bool has_parent = !req.parent_hash().empty();
  if (has_parent) {
    if (absl::Status s = ParseOneHash(req.parent_hash(), ns.hash_bytes,
                                      "parent_hash", &parent);
        !s.ok()) {
      return s;
    }
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
  ApplyPendingTouches(ns);  // Evictions must see every lookup's recency.
  ++ns.evict_epoch;         // Allocation may evict.
  auto rows_or = ns.index->AllocatePageRows(rank, keys.size());
  if (!rows_or.ok()) return rows_or.status();
  std::vector<uint32_t> rows = *std::move(rows_or);
  if (ns.journal != nullptr) {
    if (absl::Status s =
            JournalLocked(ns, ns.journal->AppendReserve(rank, rows, {}));
        !s.ok()) {
      (void)ns.index->FreePageRows(rank, rows);
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
    return result.status();
  }
  absl::Status journaled;
  if (ns.journal != nullptr) {
    journaled = JournalLocked(
        ns, ns.journal->AppendCommit(rank, has_parent ? &parent : nullptr, keys,
                                     rows, {}, result->freed_page_rows,
                                     result->freed_snapshot_rows));
  }
  ns.committed_pages += result->committed_pages;
  if (!journaled.ok()) return journaled;
  resp->set_committed_pages(result->committed_pages);
  resp->set_deduplicated_pages(result->deduplicated_pages);
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
        ns, req.reservation_id(),
        static_cast<int>(Namespace::FenceHold::Kind::kAbandoned), instance,
        holder));
    return absl::OkStatus();
  }
  auto& r = it->second;
  absl::Status s1 = ns.index->FreePageRows(r.rank, r.page_rows);
  absl::Status s2 = ns.index->FreeSnapshotRows(r.rank, r.snapshot_rows);
  AbortDeviceRows(r.device_pool, r.device_rows);
  ns.reserved_page_rows -= r.page_rows.size();
  ns.reserved_snapshot_rows -= r.snapshot_rows.size();
  ns.Charge(r.session, -1, 0, -Namespace::Rows(r));
  ns.reservations.erase(it);
  if (!s1.ok()) return absl::InternalError(s1.message());
  if (!s2.ok()) return absl::InternalError(s2.message());
  return absl::OkStatus();
}

absl::Status TierCore::Release(const v1::ReleaseRequest& req,
                               v1::ReleaseResponse*) {
  uint32_t rank = 0;
  auto ns_or =
      Resolve(req.api_version(), req.session_id(), req.namespace_id(), &rank);
  if (!ns_or.ok()) return ns_or.status();
  Namespace& ns = **ns_or;
  absl::MutexLock lock(&ns.mu);
  auto it = ns.leases.find(req.lease_id());
  if (it == ns.leases.end() || it->second.session != req.session_id()) {
    return absl::NotFoundError(
        absl::StrCat("lease_id: no lease ", req.lease_id(),
                     " of this session in namespace '", ns.name, "'"));
  }
  absl::Status s = ns.index->Unpin(it->second.node);
  if (it->second.device_lease != 0) {
    (void)device_tiers_[it->second.device_pool]->Release(
        it->second.device_lease);
  }
  ns.Charge(it->second.session, 0, -1, 0);
  ns.leases.erase(it);
  if (!s.ok()) return absl::InternalError(s.message());
  return absl::OkStatus();
}

void TierCore::FillNamespaceInfo(Namespace& ns, v1::NamespaceInfo* info) {
  absl::MutexLock lock(&ns.mu);
  PrefixIndex::Usage u = ns.index->GetUsage();
  info->set_namespace_id(ns.id);
  info->set_name(ns.name);
  *info->mutable_layout() = ns.layout;
  info->set_pages(u.nodes);
  info->set_snapshots(u.snapshots);
  info->set_prefixes(u.leaves);
  info->set_sessions(ns.sessions.size());
  info->set_lookups(ns.lookups.load());
  info->set_hit_pages(ns.hit_pages.load());
  info->set_miss_pages(ns.miss_pages.load());
  info->set_committed_pages(ns.committed_pages);
  info->set_evicted_pages(u.evicted_pages);
  info->set_evicted_snapshots(u.evicted_snapshots);
  info->set_max_replay_tokens(ns.max_replay_tokens);
  info->set_leases(ns.leases.size());
  info->set_reservations(ns.reservations.size());
  {
    uint64_t pages = 0, snaps = 0;
    for (const auto& [id, h] : ns.holds) {
      pages += h.page_rows.size();
      snaps += h.snapshot_rows.size();
    }
    if (ns.restart_fence) {
      for (const auto& r : ns.restart_fence->page_rows) pages += r.size();
      for (const auto& r : ns.restart_fence->snapshot_rows) snaps += r.size();
      info->set_restart_fence_processes(
          static_cast<uint32_t>(fence_->restart_waiting()));
    }
    info->set_fenced_page_rows(pages);
    info->set_fenced_snapshot_rows(snaps);
    info->set_fence_holds(static_cast<uint32_t>(ns.holds.size()));
  }
  absl::flat_hash_map<uint32_t, uint64_t> reserved_pages, reserved_snaps;
  for (const auto& [id, r] : ns.reservations) {
    reserved_pages[r.rank] += r.page_rows.size();
    reserved_snaps[r.rank] += r.snapshot_rows.size();
  }
  absl::flat_hash_map<uint32_t, uint64_t> fenced_pages, fenced_snaps;
  for (const auto& [id, h] : ns.holds) {
    fenced_pages[h.rank] += h.page_rows.size();
    fenced_snaps[h.rank] += h.snapshot_rows.size();
  }
  if (ns.restart_fence) {
    for (uint32_t r = 0; r < ns.stored_ranks; ++r) {
      fenced_pages[r] += ns.restart_fence->page_rows[r].size();
      fenced_snaps[r] += ns.restart_fence->snapshot_rows[r].size();
    }
  }
  for (uint32_t rank = 0; rank < ns.stored_ranks; ++rank) {
    for (const auto& seg : ns.segment_info[rank]) {
      v1::BankUsage* b = info->add_banks();
      const bool snap = seg.bank() == "snapshot";
      const uint64_t free_rows =
          snap ? u.free_snapshot_rows[rank] : u.free_page_rows[rank];
      const uint64_t reserved =
          snap ? reserved_snaps[rank] : reserved_pages[rank];
      b->set_bank(seg.bank());
      b->set_rank(rank);
      b->set_rows(seg.rows());
      b->set_free_rows(free_rows);
      const uint64_t fenced = snap ? fenced_snaps[rank] : fenced_pages[rank];
      b->set_reserved_rows(reserved);
      b->set_fenced_rows(fenced);
      b->set_used_rows(seg.rows() - free_rows - reserved - fenced);
      b->set_row_bytes(seg.row_bytes());
      b->set_path(seg.path());
      b->set_huge_pages(seg.huge_pages());
    }
  }
}

absl::Status TierCore::Stats(const v1::StatsRequest& req,
                             v1::StatsResponse* resp, const Caller& caller) {
  if (absl::Status s = CheckApiVersion(req.api_version()); !s.ok()) return s;
  std::vector<std::shared_ptr<Namespace>> all;
  {
    absl::ReaderMutexLock lock(&mu_);
    resp->set_sessions(sessions_.size());
    for (const auto& [name, ns] : by_name_) all.push_back(ns);
  }
  const Caller who = caller.WithSession(req.session_id());
  if (!who.operator_socket) {
    // An engine sees only the namespaces it may attach to.
    std::erase_if(all, [&](const std::shared_ptr<Namespace>& ns) {
      return !CheckNamespaceRight(who, ns->name, "list").ok();
    });
  }
  std::sort(all.begin(), all.end(),
            [](const auto& a, const auto& b) { return a->name < b->name; });
  resp->set_version(KVTIER_VERSION);
  resp->set_uptime_seconds(absl::ToInt64Seconds(absl::Now() - started_));
  resp->set_instances(static_cast<uint32_t>(fence_->instances()));
  for (const Unrecoverable& u : UnrecoverableNamespaces()) {
    if (!who.operator_socket &&
        !CheckNamespaceRight(who, u.name, "list").ok()) {
      continue;
    }
    v1::UnrecoverableNamespace* out = resp->add_unrecoverable();
    out->set_name(u.name);
    out->set_reason(u.reason);
    out->set_corrupt(u.corrupt);
    out->set_since_unix_ms(absl::ToUnixMillis(u.since));
  }
  resp->set_unseen_pid_processes(
      static_cast<uint32_t>(fence_->unseen_pid_processes()));
  for (auto& ns : all) FillNamespaceInfo(*ns, resp->add_namespaces());
  return absl::OkStatus();
}

absl::Status TierCore::ListNamespaces(const v1::ListNamespacesRequest& req,
                                      v1::ListNamespacesResponse* resp,
                                      const Caller& caller) {
  v1::StatsRequest stats_req;
  stats_req.set_session_id(req.session_id());
  v1::StatsResponse stats;
  if (absl::Status s = Stats(stats_req, &stats, caller); !s.ok()) return s;
  if (absl::Status s = CheckApiVersion(req.api_version()); !s.ok()) return s;
  resp->mutable_namespaces()->Swap(stats.mutable_namespaces());
  return absl::OkStatus();
}

absl::Status TierCore::ListPrefixes(const v1::ListPrefixesRequest& req,
                                    v1::ListPrefixesResponse* resp,
                                    const Caller& caller) {
  if (absl::Status s = CheckApiVersion(req.api_version()); !s.ok()) return s;
  if (absl::Status s = ValidateNamespaceName(req.namespace_()); !s.ok()) {
    return s;
  }
  // Which prompts are cached is the namespace's secret: testing a guessed
  // prompt's hash needs the right to list.
  if (absl::Status s = CheckNamespaceRight(caller.WithSession(req.session_id()),
                                           req.namespace_(), "list");
      !s.ok()) {
    return s;
  }
  if (!v1::ListPrefixesRequest::Order_IsValid(req.order())) {
    return absl::InvalidArgumentError(
        absl::StrCat("order: unknown value ", static_cast<int>(req.order())));
  }
  if (req.limit() > 10000) {
    return absl::InvalidArgumentError(
        absl::StrCat("limit: at most 10000, got ", req.limit()));
  }
  std::shared_ptr<Namespace> ns;
  {
    absl::ReaderMutexLock lock(&mu_);
    auto it = by_name_.find(req.namespace_());
    if (it == by_name_.end()) {
      return absl::NotFoundError(
          absl::StrCat("namespace: no namespace '", req.namespace_(), "'"));
    }
    ns = it->second;
  }
  const size_t limit = req.limit() == 0 ? 100 : req.limit();
  absl::MutexLock lock(&ns->mu);
  ApplyPendingTouches(*ns);  // "Recent first" must count every lookup.
  uint64_t total = 0;
  auto prefixes = ns->index->ListPrefixes(
      req.order() == v1::ListPrefixesRequest::ORDER_RECENT, limit, &total);
  resp->set_total_prefixes(total);
  for (const auto& p : prefixes) {
    v1::PrefixInfo* info = resp->add_prefixes();
    info->set_leaf_hash(std::string(
        reinterpret_cast<const char*>(p.leaf.bytes.data()), ns->hash_bytes));
    info->set_pages(p.pages);
    info->set_tokens(uint64_t{p.pages} * ns->layout.tokens_per_page());
    info->set_snapshots(p.snapshots);
    info->set_last_use_unix_ms(p.last_use_unix_ms);
    info->set_pins(p.pins);
  }
  return absl::OkStatus();
}

absl::Status TierCore::CheckInvariants(bool pace) {
  std::vector<std::shared_ptr<Namespace>> all;
  absl::flat_hash_map<uint64_t, bool> live;
  {
    absl::ReaderMutexLock lock(&mu_);
    for (const auto& [name, ns] : by_name_) all.push_back(ns);
    for (const auto& [id, s] : sessions_) live[id] = true;
  }
  for (auto& ns : all) {
    // Paced (Verify): after each namespace, as long a pause as its check
    // held the lock, so lookups get at least half of the time.
    const absl::Time held_from = absl::Now();
    absl::Cleanup pause = [&] {
      if (pace) absl::SleepFor(absl::Now() - held_from);
    };
    absl::MutexLock lock(&ns->mu);
    if (absl::Status s = ns->index->CheckInvariants(); !s.ok()) {
      return absl::InternalError(
          absl::StrCat("namespace '", ns->name, "': ", s.message()));
    }
    PrefixIndex::Usage u = ns->index->GetUsage();
    for (uint32_t rank = 0; rank < ns->stored_ranks; ++rank) {
      uint64_t reserved_pages = 0, reserved_snaps = 0;
      for (const auto& [id, r] : ns->reservations) {
        if (r.rank != rank) continue;
        reserved_pages += r.page_rows.size();
        reserved_snaps += r.snapshot_rows.size();
      }
      for (const auto& [id, h] : ns->holds) {
        if (h.rank != rank) continue;
        reserved_pages += h.page_rows.size();
        reserved_snaps += h.snapshot_rows.size();
      }
      if (ns->restart_fence) {
        reserved_pages += ns->restart_fence->page_rows[rank].size();
        reserved_snaps += ns->restart_fence->snapshot_rows[rank].size();
      }
      if (u.allocated_page_rows[rank] != reserved_pages) {
        return absl::InternalError(
            absl::StrCat("namespace '", ns->name, "' rank ", rank,
                         ": index holds ", u.allocated_page_rows[rank],
                         " allocated uncommitted page rows, reservations and "
                         "fences hold ",
                         reserved_pages));
      }
      if (u.allocated_snapshot_rows[rank] != reserved_snaps) {
        return absl::InternalError(absl::StrCat(
            "namespace '", ns->name, "' rank ", rank, ": index holds ",
            u.allocated_snapshot_rows[rank],
            " allocated uncommitted snapshot rows, reservations and fences "
            "hold ",
            reserved_snaps));
      }
    }
    for (const auto& [id, r] : ns->reservations) {
      if (!live.contains(r.session)) {
        return absl::InternalError(
            absl::StrCat("namespace '", ns->name, "': reservation ", id,
                         " belongs to closed session ", r.session));
      }
    }
    for (const auto& [id, l] : ns->leases) {
      if (!live.contains(l.session)) {
        return absl::InternalError(
            absl::StrCat("namespace '", ns->name, "': lease ", id,
                         " belongs to closed session ", l.session));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status TierCore::BindPeerCredentials(uint64_t session_id,
                                           const PeerInfo& peer) {
  if (!peer.verified) {
    return absl::InvalidArgumentError(
        "peer: credentials to bind must come from the kernel (SO_PEERCRED)");
  }
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(session_id);
  if (it == sessions_.end()) {
    return SessionUnknownError(session_id);
  }
  PeerInfo& bound = it->second.peer;
  if (bound.verified) {
    if (bound.uid == peer.uid && bound.gid == peer.gid) return absl::OkStatus();
    return absl::PermissionDeniedError(absl::StrCat(
        "session_id: session ", session_id, " is bound to uid ", bound.uid,
        " already; uid ", peer.uid, " cannot take it over"));
  }
  bound = peer;
  fence_->BindProcess(session_id, peer.pid);
  SPDLOG_INFO("session {}: peer pid {} uid {} gid {}", SessionTag(session_id),
              peer.pid, peer.uid, peer.gid);
  return absl::OkStatus();
}

bool TierCore::SessionOpen(uint64_t session_id) {
  absl::ReaderMutexLock lock(&mu_);
  return sessions_.contains(session_id);
}

size_t TierCore::session_count() {
  absl::ReaderMutexLock lock(&mu_);
  return sessions_.size();
}

std::vector<TierCore::NamespaceCounters> TierCore::Counters() {
  std::vector<std::shared_ptr<Namespace>> all;
  {
    absl::ReaderMutexLock lock(&mu_);
    for (const auto& [name, ns] : by_name_) all.push_back(ns);
  }
  std::sort(all.begin(), all.end(),
            [](const auto& a, const auto& b) { return a->name < b->name; });
  std::vector<NamespaceCounters> out;
  out.reserve(all.size());
  for (auto& ns : all) {
    absl::MutexLock lock(&ns->mu);
    NamespaceCounters& c = out.emplace_back();
    c.name = ns->name;
    c.committed_snapshots = ns->committed_snapshots;
    c.snapshot_hits = ns->snapshot_hits.load();
    c.dropped_pages = ns->dropped_pages;
    c.dropped_snapshots = ns->dropped_snapshots;
    c.spacing_violations = ns->index->GetUsage().spacing_violations;
  }
  return out;
}

absl::Status TierCore::JournalLocked(Namespace& ns, absl::Status appended) {
  if (ns.journal == nullptr) return absl::OkStatus();
  if (appended.ok() && !ns.journal->NeedsCheckpoint()) return appended;
  if (!appended.ok()) {
    SPDLOG_WARN("namespace '{}': {}; writing a checkpoint instead", ns.name,
                appended.ToString());
  }
  const absl::Time start = absl::Now();
  const uint64_t before = ns.journal->bytes();
  if (absl::Status s = ns.journal->Checkpoint(*ns.index); !s.ok()) {
    SPDLOG_ERROR("namespace '{}': checkpoint failed: {}", ns.name,
                 s.ToString());
    if (appended.ok()) return absl::OkStatus();  // Compaction can wait.
    return absl::UnavailableError(absl::StrCat(
        "namespace '", ns.name, "': the journal cannot record this change (",
        appended.message(), "; checkpoint: ", s.message(), ")"));
  }
  SPDLOG_INFO("namespace '{}': journal checkpoint {} -> {} bytes in {}",
              ns.name, before, ns.journal->bytes(),
              absl::FormatDuration(absl::Now() - start));
  return absl::OkStatus();
}

}  // namespace kvtier::daemon
