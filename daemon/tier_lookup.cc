// TierCore's read path: Lookup (and LookupHashes, the fast lookup
// socket's), which finds the longest usable cached prefix of a request's
// hashes and, with pin, leases it; and Release, which ends a lease. With a
// device pool named, the snapshot the host answer ends at is also looked
// up in that pool's device tier (tier_device.h). Prefetch, which starts
// bringing a chain's continuation from the cluster tier (ClusterBridge).
//
// Lookups of a namespace, pinned or not, and releases run concurrently under
// its lock held shared; only a full queue of recency updates takes it
// exclusively.
//
// Thread-safety: thread-safe (part of TierCore; lock order in tier_core.h).
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "daemon/random_id.h"
#include "daemon/tier_core.h"
#include "daemon/tier_request.h"

namespace kvtier::daemon {

absl::Status TierCore::Lookup(const v1::LookupRequest& req,
                              v1::LookupResponse* resp) {
  if (absl::Status s = CheckApiVersion(req.api_version()); !s.ok()) return s;
  LookupOutcome out;
  if (req.has_device_pool() && req.device_pool() >= devices_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("device_pool: ", req.device_pool(), " but the daemon has ",
                     devices_.size(), " device pools"));
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
  if (req.remote() && cluster_ != nullptr) {
    // The cluster tier's continuation (ClusterBridge), outside every
    // lock. A session or namespace gone meanwhile: no remote pages.
    uint32_t rank = 0;
    auto ns = Resolve(0, req.session_id(), req.namespace_id(), &rank);
    std::vector<HashKey> keys;
    if (ns.ok() && ParseHashes(req.hashes(), (*ns)->hash_bytes, kMaxLookupPages,
                               "hashes", &keys)
                       .ok()) {
      cluster_->Continuation(**ns, keys, out.matched_pages, resp);
    }
  }
  return absl::OkStatus();
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
  // Lookups run under the shared lock, pinned or not, so they never queue
  // behind each other: the search, the lease (the pin and the lease table
  // have their own small locks, PrefixIndex::Pin and Namespace::lease_mu) and
  // the recency update, which is queued (Namespace::pending_touches). Nothing
  // can evict between the search and the pin: evictors hold mu exclusively.
  PrefixIndex::LookupResult r;
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
        DeviceTiers::Key(ns.id, rank, keys[r.usable_pages - 1], ns.hash_bytes);
    return devices_.Lookup(device_pool, key, pin_device);
  };
  if (pin) Hook("lookup:resolved");
  out->lease_id = 0;
  out->has_device_snapshot = false;
  bool flush = false;
  {
    absl::ReaderMutexLock shared(&ns.mu);
    // A session closed since Resolve must not be left a pin (closing takes
    // mu exclusively, so it is either before this or after the lease).
    if (pin && !ns.sessions.contains(session_id)) {
      return absl::NotFoundError(
          absl::StrCat("session_id: session ", session_id, " closed"));
    }
    r = ns.index->Find(keys, rank);
    if (pin && r.usable_pages > 0 && r.pin_node != kNoNode) {
      absl::MutexLock leases(&ns.lease_mu);
      if (absl::Status s =
              ns.CheckLeaseCap(session_id, options_.max_session_leases);
          !s.ok()) {
        return s;
      }
      Namespace::Lease l{session_id, r.pin_node, r.usable_pages};
      if (auto d = device_hit(true)) {
        out->has_device_snapshot = true;
        out->device_snapshot_row = d->row;
        l.device_pool = static_cast<uint32_t>(device_pool);
        l.device_lease = d->lease_id;
      }
      out->lease_id = ns.AddLease(l);
    }
    if (r.touch_node != kNoNode) {
      const size_t depth =
          (r.pin_node != kNoNode ? r.usable_pages : r.matched_pages) - 1;
      flush = ns.QueueTouch(r.touch_node, keys[depth]);
    }
    ns.CountLookup(r, keys.size());
  }
  if (flush) {
    absl::MutexLock lock(&ns.mu);
    ns.ApplyPendingTouches();
  }
  out->matched_pages = r.matched_pages;
  out->usable_pages = r.usable_pages;
  out->has_snapshot = r.has_snapshot;
  out->snapshot_row = r.has_snapshot ? r.snapshot_row : 0;
  if (!pin) {
    if (auto d = device_hit(false)) {
      out->has_device_snapshot = true;
      out->device_snapshot_row = d->row;
    }
  }
  out->rows = std::move(r.rows);
  return absl::OkStatus();
}

absl::Status TierCore::Release(const v1::ReleaseRequest& req,
                               v1::ReleaseResponse*) {
  uint32_t rank = 0;
  auto ns_or =
      Resolve(req.api_version(), req.session_id(), req.namespace_id(), &rank);
  if (!ns_or.ok()) return ns_or.status();
  Namespace& ns = **ns_or;
  // Beside lookups, under the shared lock (see LookupHashes).
  absl::ReaderMutexLock shared(&ns.mu);
  Namespace::Lease l;
  {
    absl::MutexLock leases(&ns.lease_mu);
    auto it = ns.leases.find(req.lease_id());
    if (it == ns.leases.end() || it->second.session != req.session_id()) {
      return absl::NotFoundError(
          absl::StrCat("lease_id: no lease ", req.lease_id(),
                       " of this session in namespace '", ns.name, "'"));
    }
    l = it->second;
    ns.ChargeLease(l.session, -1);
    ns.leases.erase(it);
  }
  absl::Status s = ns.index->Unpin(l.node);
  devices_.Release(l.device_pool, l.device_lease);
  if (!s.ok()) return absl::InternalError(s.message());
  return absl::OkStatus();
}

absl::Status TierCore::Prefetch(const v1::PrefetchRequest& req,
                                v1::PrefetchResponse* resp) {
  uint32_t rank = 0;
  auto ns_or =
      Resolve(req.api_version(), req.session_id(), req.namespace_id(), &rank);
  if (!ns_or.ok()) return ns_or.status();
  std::shared_ptr<Namespace> ns = *std::move(ns_or);
  std::vector<HashKey> keys;
  if (absl::Status s = ParseHashes(req.hashes(), ns->hash_bytes,
                                   kMaxLookupPages, "hashes", &keys);
      !s.ok()) {
    return s;
  }
  if (keys.empty()) return absl::InvalidArgumentError("hashes: none given");
  uint32_t local = 0;
  {
    absl::ReaderMutexLock lock(&ns->mu);
    local = ns->index->Find(keys, 0).matched_pages;
  }
  resp->set_local_pages(local);
  // Without a cluster tier nothing is remote: a miss, as for any chain no
  // tier holds.
  if (cluster_ == nullptr || local == keys.size()) return absl::OkStatus();
  return cluster_->Prefetch(ns, std::move(keys), local, resp);
}

}  // namespace kvtier::daemon
