// TierCore's rights: who may drop and list which namespaces (tier_core.h,
// Caller). Verify's (operators only) is in tier_introspect.cc, and which
// device pools serve which namespaces in tier_device.cc. The security
// model these implement is docs/operations.md, "Security model".
//
// Thread-safety: thread-safe (part of TierCore); CheckNamespaceRight takes
// mu_ as a reader, so callers must not hold it. A request over many
// namespaces (Stats) reads its caller's credentials once (CallerPeerLocked)
// and checks each namespace with CheckRight, which takes no lock.
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/error_reason.h"
#include "daemon/tier_core.h"

namespace kvtier::daemon {

absl::Status TierCore::CheckNamespaceRight(const Caller& caller,
                                           absl::string_view name,
                                           absl::string_view right) {
  if (caller.operator_socket) return absl::OkStatus();
  PeerInfo peer;
  if (caller.session_id != 0) {
    absl::ReaderMutexLock lock(&mu_);
    absl::StatusOr<PeerInfo> bound = CallerPeerLocked(caller);
    if (!bound.ok()) return bound.status();
    peer = *bound;
  }
  return CheckRight(caller, peer, name, right);
}

absl::StatusOr<PeerInfo> TierCore::CallerPeerLocked(const Caller& caller) {
  if (caller.session_id == 0) return PeerInfo{};
  auto it = sessions_.find(caller.session_id);
  if (it == sessions_.end()) {
    return SessionUnknownError(caller.session_id);
  }
  return it->second.peer;
}

absl::Status TierCore::CheckRight(const Caller& caller, const PeerInfo& peer,
                                  absl::string_view name,
                                  absl::string_view right) const {
  const NamespaceAclEntry* acl = options_.namespace_acl.Find(name);
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

}  // namespace kvtier::daemon
