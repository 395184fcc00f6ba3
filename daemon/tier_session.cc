// TierCore's sessions: an engine process's Hello opens one, and its end
// (CloseSession: the stream ended) frees or fences what it held; the peer
// credentials bound to it decide its rights; Resolve turns a request's
// (session, namespace) into the namespace and the session's rank there.
//
// Thread-safety: thread-safe (part of TierCore; lock order in tier_core.h).
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/error_reason.h"
#include "daemon/random_id.h"
#include "daemon/tier_core.h"
#include "daemon/tier_request.h"
#include "spdlog/spdlog.h"

namespace kvtier::daemon {

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
  absl::MutexLock lock(&mu_);
  uint64_t id = 0;
  do {
    id = RandomId();  // The session's capability (random_id.h).
  } while (sessions_.contains(id));
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

void TierCore::SessionGoodbye(uint64_t session_id, bool quiescent) {
  if (quiescent) fence_->MarkQuiescent(session_id);
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
      {
        absl::MutexLock lease_lock(&ns->lease_mu);
        for (const auto& [id, l] : ns->leases) {
          if (l.session == session_id) leases.push_back(id);
        }
      }
      for (uint64_t id : res) {
        HoldReservationLocked(*ns, id,
                              Namespace::FenceHold::Kind::kSessionEnded,
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
      devices_.Abort(r.device_pool, r.device_rows);
      ns->reserved_page_rows -= r.page_rows.size();
      ns->reserved_snapshot_rows -= r.snapshot_rows.size();
      ns->reservations.erase(cur);
      ++aborted;
    }
    {
      absl::MutexLock lease_lock(&ns->lease_mu);
      for (auto it = ns->leases.begin(); it != ns->leases.end();) {
        auto cur = it++;
        if (cur->second.session != session_id) continue;
        (void)ns->index->Unpin(cur->second.node);
        devices_.Release(cur->second.device_pool, cur->second.device_lease);
        ns->leases.erase(cur);
        ++released;
      }
      ns->session_leases.erase(session_id);
    }
    ns->use.erase(session_id);
    ns->sessions.erase(session_id);
  }
  SettleOrphanedDevice(session_id, closed);
  SPDLOG_INFO(
      "session {} closed: {} reservations aborted, {} leases "
      "released, {} fenced",
      SessionTag(session_id), aborted, released, fenced);
}

absl::Status TierCore::BindPeerCredentials(uint64_t session_id,
                                           const PeerInfo& peer) {
  if (!peer.verified) {
    return absl::InvalidArgumentError(
        "peer: credentials to bind must come from the kernel (SO_PEERCRED)");
  }
  {
    absl::MutexLock lock(&mu_);
    auto it = sessions_.find(session_id);
    if (it == sessions_.end()) {
      return SessionUnknownError(session_id);
    }
    PeerInfo& bound = it->second.peer;
    if (bound.verified) {
      if (bound.uid == peer.uid && bound.gid == peer.gid) {
        return absl::OkStatus();
      }
      return absl::PermissionDeniedError(absl::StrCat(
          "session_id: session ", session_id, " is bound to uid ", bound.uid,
          " already; uid ", peer.uid, " cannot take it over"));
    }
    bound = peer;
  }
  // The session's fence instance is bound to these credentials too, with
  // mu_ released: BindPeer reads /proc and may write the fence's file. A
  // request of the session in between (an Attach) acts under its unbound
  // instance, which the fence keeps too (fence_registry.h).
  fence_->BindPeer(session_id, peer.pid, peer.uid);
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

}  // namespace kvtier::daemon
