// TierCore's Attach, which joins a session to a namespace (creating it
// through tier_create.cc), and Drop, which removes a prefix subtree or a
// whole namespace: it leaves the maps under mu_, and its journal and
// segments are unlinked with mu_ released while its name is pending.
//
// Thread-safety: thread-safe (part of TierCore; lock order in tier_core.h).
#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/error_reason.h"
#include "daemon/tier_core.h"
#include "daemon/tier_request.h"
#include "shm/numa.h"
#include "spdlog/spdlog.h"

namespace kvtier::daemon {

namespace {

// OK when a session whose credentials are `peer` may attach where `req`
// says, under ACL entry `acl` (nullptr: none governs the name).
absl::Status CheckAttachRight(const v1::AttachRequest& req,
                              const PeerInfo& peer,
                              const NamespaceAclEntry* acl,
                              bool require_peer_credentials) {
  if ((require_peer_credentials || acl != nullptr) && !peer.verified) {
    return absl::FailedPreconditionError(absl::StrCat(
        "session_id: session ", req.session_id(),
        " has no verified peer credentials; libkvtier binds them when it "
        "opens the session on the engine socket (<socket>.lookup), a gRPC "
        "client with a Hello there after its Session opens"));
  }
  if (acl != nullptr && !acl->Allows(peer)) {
    return absl::PermissionDeniedError(
        absl::StrCat("namespace: uid ", peer.uid, " (gid ", peer.gid,
                     ") may not attach to namespace '", req.namespace_(),
                     "' (--namespace_acl entry '", acl->pattern, "')"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status TierCore::Attach(const v1::AttachRequest& req,
                              v1::AttachResponse* resp) {
  if (absl::Status s = CheckApiVersion(req.api_version()); !s.ok()) return s;
  absl::StatusOr<int> numa_node = AttachNumaNode(req.pci_bus_id());
  if (!numa_node.ok()) return numa_node.status();
  absl::ReleasableMutexLock lock(&mu_);
  auto session = sessions_.find(req.session_id());
  if (session == sessions_.end()) {
    return SessionUnknownError(req.session_id());
  }
  const uint32_t tp_size =
      req.layout().tp_size() == 0 ? 1 : req.layout().tp_size();
  if (req.tp_rank() >= tp_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tp_rank: ", req.tp_rank(), " is not below layout.tp_size ", tp_size));
  }
  // Isolation (peer_credentials.h): the session's kernel-verified
  // credentials decide, before anything is created. A copy: mu_ is released
  // while the namespace is created.
  const PeerInfo peer = session->second.peer;
  const NamespaceAclEntry* acl = options_.namespace_acl.Find(req.namespace_());
  if (absl::Status s =
          CheckAttachRight(req, peer, acl, options_.require_peer_credentials);
      !s.ok()) {
    return s;
  }
  bool created = false;
  auto ns = CreateOrOpenLocked(req.namespace_(), req.layout(), req.capacity(),
                               req.tenant_salt(), &created, &peer,
                               /*recovering=*/false, *numa_node);
  if (!ns.ok()) return ns.status();
  Namespace& n = **ns;
  // The session's holder is recorded in the fence's file before any row of
  // the namespace can reach it (fence_registry.h), with mu_ released: the
  // write must not stall other sessions' requests. `keep` keeps the
  // namespace alive meanwhile.
  const std::shared_ptr<Namespace> keep = *ns;
  // Meanwhile the session counts among the namespace's sessions, so that a
  // Drop without force (one that waited for this creation, say) refuses as
  // it would a moment later; it gets no row before it is in
  // Session::attached below. Taken out again if the Attach fails.
  bool counted = false;
  {
    absl::MutexLock ns_lock(&n.mu);
    counted =
        n.sessions.try_emplace(req.session_id(), n.StorageRank(req.tp_rank()))
            .second;
  }
  auto uncount = [&] {
    if (!counted) return;
    absl::MutexLock ns_lock(&n.mu);
    n.sessions.erase(req.session_id());
  };
  lock.Release();
  if (absl::Status s = fence_->NoteHolder(req.session_id(), n.name); !s.ok()) {
    uncount();
    return s;
  }
  absl::ReleasableMutexLock relock(&mu_);
  // mu_ was released: the session may have closed meanwhile (the namespace
  // stays, with no session attached), or the namespace been dropped.
  if (auto it = by_id_.find(n.id); it == by_id_.end() || it->second != keep) {
    return absl::AbortedError(
        absl::StrCat("namespace: '", n.name,
                     "' was dropped while this session attached to it"));
  }
  session = sessions_.find(req.session_id());
  if (session == sessions_.end()) {
    uncount();
    SPDLOG_INFO(
        "session {} closed while namespace '{}' was being created; "
        "the namespace stays, not attached",
        SessionTag(req.session_id()), n.name);
    return SessionUnknownError(
        req.session_id(), absl::StrCat(" (it closed while namespace '", n.name,
                                       "' was being created)"));
  }
  if (auto it = session->second.attached.find(n.id);
      it != session->second.attached.end() && it->second != req.tp_rank()) {
    uncount();
    return absl::FailedPreconditionError(
        absl::StrCat("tp_rank: this session is attached to namespace '", n.name,
                     "' as rank ", it->second, " already"));
  }
  session->second.attached[n.id] = req.tp_rank();
  bool place = false;
  {
    absl::MutexLock ns_lock(&n.mu);
    n.sessions[req.session_id()] = n.StorageRank(req.tp_rank());
    place = !n.numa_placed[n.StorageRank(req.tp_rank())];
    n.numa_placed[n.StorageRank(req.tp_rank())] = true;
  }
  n.DescribeAttach(req.tp_rank(), req.tenant_salt(), resp);
  resp->set_created(created);
  // Engines can tell a namespace of their own from one every session may
  // attach (the vLLM connector warns at start about the latter).
  if (acl != nullptr) resp->set_acl_entry(acl->pattern);
  devices_.DescribePools(n.name, resp);
  SPDLOG_INFO("session {} attached to '{}' rank {}{}",
              SessionTag(req.session_id()), n.name, req.tp_rank(),
              created ? " (created)" : "");
  if (place && *numa_node >= 0) {
    // The rank's first Attach: its banks go to its GPU's node. Moving pages
    // can take a while, so without TierCore's lock (the namespace stays
    // alive through `keep`; its segments are immutable).
    const uint32_t rank = keep->StorageRank(req.tp_rank());
    relock.Release();
    PlaceRankBanks(*keep, rank, *numa_node);
  }
  return absl::OkStatus();
}

absl::StatusOr<int> TierCore::AttachNumaNode(const std::string& pci_bus_id) {
  if (options_.bank_numa_node != kBankNumaAuto) {
    return std::max(options_.bank_numa_node, -1);
  }
  if (pci_bus_id.empty()) return -1;
  absl::StatusOr<int> node =
      shm::PciDeviceNumaNode(options_.segments.sysfs_root, pci_bus_id);
  if (absl::IsInvalidArgument(node.status())) return node.status();
  if (!node.ok()) {
    // A container may hide the PCI tree: place nothing, say why once.
    SPDLOG_WARN("pci_bus_id {}: {}; banks left to first-touch placement",
                pci_bus_id, node.status().ToString());
    return -1;
  }
  return *node;
}

void TierCore::PlaceRankBanks(const Namespace& ns, uint32_t rank, int node) {
  for (const auto& seg : ns.segments[rank]) {
    absl::StatusOr<int> now = seg->NumaNode();
    if (now.ok() && *now == node) continue;
    const absl::Time start = absl::Now();
    if (absl::Status s = seg->MoveToNode(node); !s.ok()) {
      SPDLOG_WARN("namespace '{}': bank '{}' rank {}: {}", ns.name,
                  seg->header().bank, rank, s.ToString());
      continue;
    }
    SPDLOG_INFO("namespace '{}': bank '{}' rank {} moved to NUMA node {} in {}",
                ns.name, seg->header().bank, rank, node,
                absl::FormatDuration(absl::Now() - start));
  }
}

absl::Status TierCore::Drop(const v1::DropRequest& req, v1::DropResponse* resp,
                            const Caller& caller) {
  if (absl::Status s = CheckApiVersion(req.api_version()); !s.ok()) return s;
  if (absl::Status s = ValidateNamespaceName(req.namespace_()); !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckNamespaceRight(caller.WithSession(req.session_id()),
                                           req.namespace_(), "drop");
      !s.ok()) {
    return s;
  }
  std::shared_ptr<Namespace> ns;
  std::unique_ptr<NamespaceJournal> journal;
  std::shared_ptr<PendingName> pending;
  {
    absl::ReleasableMutexLock lock(&mu_);
    // A namespace being created is dropped once it is (or is not).
    for (absl::Status ignored; WaitPendingLocked(req.namespace_(), &ignored);) {
    }
    auto it = by_name_.find(req.namespace_());
    if (it == by_name_.end()) {
      if (req.hash().empty() && unrecoverable_.contains(req.namespace_())) {
        // What recovery kept is the only copy of the namespace's pages and
        // journal: an operator's to delete, or an explicit force's.
        if (!caller.operator_socket && !req.force()) {
          return absl::FailedPreconditionError(absl::StrCat(
              "namespace '", req.namespace_(),
              "' could not be recovered: its journal and segments are kept "
              "for an operator (kvtierctl drop --force on <socket>.admin); "
              "pass force to delete them anyway"));
        }
        return DropUnrecoverableLocked(req.namespace_());
      }
      return absl::NotFoundError(
          absl::StrCat("namespace: no namespace '", req.namespace_(), "'"));
    }
    ns = it->second;
    if (!req.hash().empty()) {
      HashKey key;
      if (absl::Status s =
              ParseOneHash(req.hash(), ns->hash_bytes, "hash", &key);
          !s.ok()) {
        return s;
      }
      lock.Release();
      return DropPrefix(*ns, key, resp);
    }
    {
      absl::MutexLock ns_lock(&ns->mu);
      if (!ns->sessions.empty() && !req.force()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "namespace '", req.namespace_(), "' has ", ns->sessions.size(),
            " attached sessions; pass force to drop it anyway"));
      }
      PrefixIndex::Usage u = ns->index->GetUsage();
      resp->set_dropped_pages(u.nodes);
      resp->set_dropped_snapshots(u.snapshots);
      absl::MutexLock leases(&ns->lease_mu);
      // The segments are unlinked: whatever an engine still writes lands in
      // files nobody maps again. Device-pool slots are shared by every
      // namespace: those it may still copy into or out of stay fenced.
      OrphanDeviceSlotsLocked(*ns);
      TierNamespace::Forgotten forgot = ns->ForgetAll();
      live_holds_.fetch_sub(forgot.holds);
      if (forgot.restart_fence) restart_fences_.fetch_sub(1);
      observers_.Cleared(ns->name);
      // Removed below, without locks; requests still holding ns see no
      // journal from now on.
      journal = std::move(forgot.journal);
      for (const auto& [sid, rank] : ns->sessions) {
        auto s = sessions_.find(sid);
        if (s != sessions_.end()) s->second.attached.erase(ns->id);
      }
      ns->sessions.clear();
    }
    by_name_.erase(ns->name);
    by_id_.erase(ns->id);
    if (ns->charged) RefundLocked(ns->creator_uid, ns->bank_bytes);
    // Until the files are gone, a new namespace of this name waits.
    pending = StartPendingLocked(ns->name, /*creating=*/false);
  }
  Hook("drop:unlinking");
  ns->RemoveFiles(std::move(journal));
  {
    absl::MutexLock lock(&mu_);
    EndPendingLocked(ns->name, *pending);
  }
  SPDLOG_INFO("namespace '{}' dropped ({} pages)", ns->name,
              resp->dropped_pages());
  return absl::OkStatus();
}

void TierCore::OrphanDeviceSlotsLocked(Namespace& ns) {
  auto keep = [&](uint64_t session, InstanceKey instance, uint32_t pool,
                  const std::vector<uint32_t>& rows, uint64_t lease) {
    mu_.AssertHeld();  // As the function requires (the analysis's view).
    if (rows.empty() && lease == 0) return;
    orphaned_device_.push_back(
        {std::move(instance), session, pool, rows, lease});
  };
  // A live session's: its engine may have copies queued on them as on any
  // reservation or lease. Its instance now; should the registry have closed
  // the session already (a CloseSession racing this Drop), that
  // CloseSession settles them (SettleOrphanedDevice) once this is done.
  auto owner = [&](uint64_t session) {
    InstanceKey instance;
    HolderKey holder;
    (void)fence_->SessionOwner(session, &instance, &holder);
    return instance;
  };
  for (const auto& [id, r] : ns.reservations) {
    keep(r.session, owner(r.session), r.device_pool, r.device_rows, 0);
  }
  for (const auto& [id, l] : ns.leases) {
    keep(l.session, owner(l.session), l.device_pool, {}, l.device_lease);
  }
  for (const auto& [id, h] : ns.holds) {
    keep(0, h.instance, h.device_pool, h.device_rows, h.device_lease);
  }
}

void TierCore::SettleOrphanedDevice(uint64_t session_id,
                                    const FenceRegistry::Closed& closed) {
  absl::MutexLock lock(&mu_);
  for (auto it = orphaned_device_.begin(); it != orphaned_device_.end();) {
    if (it->session != session_id) {
      ++it;
      continue;
    }
    if (!closed.free_now) {  // Its instance's now (SweepFences).
      it->instance = closed.instance;
      it->session = 0;
      ++it;
      continue;
    }
    devices_.Abort(it->pool, it->rows);
    devices_.Release(it->pool, it->lease);
    it = orphaned_device_.erase(it);
  }
}

absl::Status TierCore::DropPrefix(Namespace& ns, const HashKey& key,
                                  v1::DropResponse* resp) {
  absl::MutexLock ns_lock(&ns.mu);
  ns.ApplyPendingTouches();
  auto dropped = ns.index->DropSubtree(key);
  if (!dropped.ok()) return dropped.status();
  ns.TellRemoved();
  if (ns.journal != nullptr) {
    if (absl::Status s = ns.Journal(ns.journal->AppendDrop(key)); !s.ok()) {
      return s;
    }
  }
  resp->set_dropped_pages(dropped->pages);
  resp->set_dropped_snapshots(dropped->snapshots);
  ns.dropped_pages += dropped->pages;
  ns.dropped_snapshots += dropped->snapshots;
  return absl::OkStatus();
}

}  // namespace kvtier::daemon
