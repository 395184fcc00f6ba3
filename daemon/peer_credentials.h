// Peer credentials and namespace access control.
//
// Who is on the other end of a session. gRPC 1.51 does not expose the
// credentials of a unix-socket peer to a handler (CallbackServerContext
// gives only "unix:<path>"), so the daemon learns them on its second socket,
// the fast lookup path (common/fast_lookup.h), whose connections it accepts
// itself:
//
//   1. The engine opens its Session stream over gRPC and receives the session
//      id: a random 64-bit capability known only to that process.
//   2. Right away it connects <socket>.lookup and sends Hello{session_id}.
//      The daemon reads SO_PEERCRED of that connection (pid, uid, gid as the
//      kernel recorded them at connect(2); the client cannot forge them) and
//      binds them to the session (TierCore::BindPeerCredentials). The Hello
//      reply is sent only after the binding, so the client knows it is done.
//   3. Attach refuses a session whose credentials are not bound (unless the
//      daemon runs with --require_peer_credentials=false), and checks them
//      against the namespace's ACL. Every other session RPC acts only on
//      namespaces the session attached to, so the check at Attach covers them
//      (Fence too: its reports and releases act only there, and its client
//      instance is bound to these credentials: daemon/fence_registry.h).
//
// Why this is sound: credentials are bound to whoever first presents the
// session id on the raw socket, and only the process that opened the session
// knows the id (the daemon draws it from the kernel's getrandom(2):
// daemon/random_id.h; 2^64 guesses over a socket are out of reach). A binding
// is final: a second Hello for the same session with other credentials is
// PERMISSION_DENIED, so a stolen id cannot be re-bound to a new identity. A
// process that hands its session id to another process delegates its rights to
// it, as it could by proxying its requests. Both sockets are mode 0660 and,
// with --group, owned by that group, so only the group's members reach the
// daemon at all.
//
// Limits: pid, uid and gid are those at connect(2). Supplementary groups
// come from SO_PEERGROUPS (Linux >= 4.13), which the kernel also records at
// connect(2), so they describe the same process as SO_PEERCRED whatever it
// did since. Only where the kernel does not support SO_PEERGROUPS
// (ENOPROTOOPT) are they read from /proc/<pid>/status, at bind time: racy
// (the peer may have exited and its pid been reused, or changed its groups)
// and blind to a peer in a pid namespace the daemon cannot see, which is
// then judged on its primary gid alone. Operator RPCs that carry no session
// (Stats, ListNamespaces, ListPrefixes, Drop, Verify) are open to every
// process that can reach the socket: restrict the socket's group to trusted
// users.
//
// Thread-safety: the functions are thread-safe; NamespaceAcl is immutable
// after Parse and safe to share.
#ifndef KVTIER_DAEMON_PEER_CREDENTIALS_H_
#define KVTIER_DAEMON_PEER_CREDENTIALS_H_

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvtier::daemon {

// Who is on the other end of a session.
struct PeerInfo {
  pid_t pid = 0;
  uid_t uid = static_cast<uid_t>(-1);
  gid_t gid = static_cast<gid_t>(-1);  // Primary group.
  // Supplementary groups, when known (SO_PEERGROUPS, else /proc).
  std::vector<gid_t> groups;
  // True when pid/uid/gid come from the kernel (SO_PEERCRED) rather than
  // from what the client said.
  bool verified = false;

  // True when the peer's primary or a supplementary group is `g`.
  bool InGroup(gid_t g) const;
};

// Returns the kernel's record of the process connected to unix socket `fd`
// (SO_PEERCRED), with its supplementary groups (SO_PEERGROUPS; from /proc
// when visible on kernels without it), and verified = true. INTERNAL if
// getsockopt fails (not a unix socket).
absl::StatusOr<PeerInfo> ReadPeerCredentials(int fd);

// Returns the supplementary groups of the process connected to unix socket
// `fd` as the kernel recorded them at connect(2) (SO_PEERGROUPS), sorted.
// UNIMPLEMENTED when the kernel lacks SO_PEERGROUPS (ENOPROTOOPT: before
// Linux 4.13), INTERNAL for another failure.
absl::StatusOr<std::vector<gid_t>> ReadPeerGroups(int fd);

// Resolves a group name, or a decimal gid, to a gid. NOT_FOUND naming
// `flag` when there is no such group.
absl::StatusOr<gid_t> ResolveGroup(const std::string& name,
                                   absl::string_view flag);
// Resolves a user name, or a decimal uid, to a uid. NOT_FOUND naming `flag`.
absl::StatusOr<uid_t> ResolveUser(const std::string& name,
                                  absl::string_view flag);

// Who may attach to the namespaces whose names match `pattern`.
struct NamespaceAclEntry {
  // An exact namespace name, or a prefix followed by '*' ("team-a.*").
  std::string pattern;
  std::vector<uid_t> uids;
  std::vector<gid_t> gids;

  // True when `name` matches the pattern.
  bool Matches(absl::string_view name) const;
  // True when `peer` is verified and its uid is listed or it is in a listed
  // group.
  bool Allows(const PeerInfo& peer) const;
  // The group the namespace's segments are created with: the first listed
  // group, so that exactly the ACL's group can map them (the daemon must be
  // root or a member of that group to give them to it); nullopt when the
  // entry lists only uids (segments then keep the daemon's --group, and
  // those users need to be in it to map them).
  std::optional<gid_t> segment_group() const;
};

// The daemon's --namespace_acl: an ordered list of entries; the first entry
// whose pattern matches a namespace governs it. Namespaces no entry matches
// are open to every session (whose credentials are bound, when the daemon
// requires that).
class NamespaceAcl {
 public:
  NamespaceAcl() = default;

  // Parses "PATTERN=PRINCIPAL[+PRINCIPAL...][;PATTERN=...]" where PRINCIPAL
  // is uid:N, gid:N, user:NAME or group:NAME (names are resolved now). For
  // example "llama=group:ml+user:alice;scratch.*=uid:1001". Empty: no ACL.
  // INVALID_ARGUMENT (naming the entry) for bad syntax or patterns,
  // NOT_FOUND for unknown users or groups.
  static absl::StatusOr<NamespaceAcl> Parse(absl::string_view spec);

  // The entry governing namespace `name`, or nullptr when none matches.
  // The pointer is valid while *this is.
  const NamespaceAclEntry* Find(absl::string_view name) const;
  bool empty() const { return entries_.empty(); }
  const std::vector<NamespaceAclEntry>& entries() const { return entries_; }

 private:
  std::vector<NamespaceAclEntry> entries_;
};

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_PEER_CREDENTIALS_H_
