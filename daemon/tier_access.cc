// TierCore's rights: who may drop, list and verify what (tier_core.h,
// Caller), which device pools serve which namespaces, and the bounded
// Verify. The security model these implement is docs/operations.md,
// "Security model".
//
// Thread-safety: as TierCore; CheckNamespaceRight takes mu_ as a reader,
// so callers must not hold it.
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/error_reason.h"
#include "daemon/tier_core.h"
#include "daemon/tier_namespace.h"

namespace kvtier::daemon {

absl::Status TierCore::CheckNamespaceRight(const Caller& caller,
                                           absl::string_view name,
                                           absl::string_view right) {
  if (caller.operator_socket) return absl::OkStatus();
  const NamespaceAclEntry* acl = options_.namespace_acl.Find(name);
  PeerInfo peer;
  if (caller.session_id != 0) {
    absl::ReaderMutexLock lock(&mu_);
    auto it = sessions_.find(caller.session_id);
    if (it == sessions_.end()) {
      return SessionUnknownError(caller.session_id);
    }
    peer = it->second.peer;
  }
  // A namespace no entry governs is open to every session, as at Attach.
  if (acl == nullptr) return absl::OkStatus();
  if (peer.verified && acl->Allows(peer)) return absl::OkStatus();
  const std::string who =
      caller.session_id == 0
          ? std::string("a caller without a session")
          : (peer.verified
                 ? absl::StrCat("uid ", peer.uid, " (gid ", peer.gid, ")")
                 : std::string("a session without bound credentials"));
  return absl::PermissionDeniedError(absl::StrCat(
      "namespace: ", who, " lacks the right to ", right, " namespace '", name,
      "': only sessions that may attach to it (--namespace_acl entry '",
      acl->pattern,
      "') may; operators (--admin_group) use the operator socket "
      "(<socket>.admin, as kvtierctl does)"));
}

bool TierCore::PoolServes(uint32_t pool, absl::string_view name) const {
  if (pool >= options_.device_pools.size()) return false;
  if (options_.device_pool_namespaces.empty()) return true;
  for (const std::string& pattern : options_.device_pool_namespaces) {
    NamespaceAclEntry entry;
    entry.pattern = pattern;
    if (entry.Matches(name)) return true;
  }
  return false;
}

absl::Status TierCore::Verify(const v1::VerifyRequest& req,
                              v1::VerifyResponse* resp, const Caller& caller) {
  if (absl::Status s = CheckApiVersion(req.api_version()); !s.ok()) return s;
  if (!caller.operator_socket) {
    return absl::PermissionDeniedError(
        "Verify is an operator RPC: it locks every namespace in turn. Use "
        "the operator socket (<socket>.admin, --admin_group), as kvtierctl "
        "verify does");
  }
  // One at a time: a caller cannot multiply the locking by asking often.
  if (!verify_mu_.TryLock()) {
    return absl::ResourceExhaustedError(
        "Verify: another Verify is running; try again when it has finished");
  }
  absl::Status s;
  {
    {
      absl::ReaderMutexLock lock(&mu_);
      resp->set_namespaces_checked(by_name_.size());
    }
    s = CheckInvariants(/*pace=*/true);
  }
  verify_mu_.Unlock();
  resp->set_ok(s.ok());
  if (!s.ok()) resp->set_violation(std::string(s.message()));
  return absl::OkStatus();
}

}  // namespace kvtier::daemon
