// Peer credentials and namespace access control.
#include "daemon/peer_credentials.h"

#include <grp.h>
#include <pwd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "daemon/namespace_layout.h"

// Linux >= 4.13; older C libraries lack the name.
#ifndef SO_PEERGROUPS
#define SO_PEERGROUPS 59
#endif

namespace kvtier::daemon {
namespace {

// Supplementary groups of `pid` from /proc/<pid>/status ("Groups: 1 2 3"):
// the fallback for kernels without SO_PEERGROUPS (racy: see the header).
std::vector<gid_t> ReadProcGroups(pid_t pid) {
  std::vector<gid_t> groups;
  if (pid <= 0) return groups;
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (!absl::StartsWith(line, "Groups:")) continue;
    std::istringstream fields(line.substr(7));
    std::string g;
    while (fields >> g) {
      uint32_t v = 0;
      if (absl::SimpleAtoi(g, &v)) groups.push_back(static_cast<gid_t>(v));
    }
    break;
  }
  std::sort(groups.begin(), groups.end());
  return groups;
}

}  // namespace

bool PeerInfo::InGroup(gid_t g) const {
  return gid == g || std::find(groups.begin(), groups.end(), g) != groups.end();
}

absl::StatusOr<PeerInfo> ReadPeerCredentials(int fd) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 ||
      len != sizeof(cred)) {
    return absl::InternalError(
        absl::StrCat("SO_PEERCRED: ", std::strerror(errno)));
  }
  PeerInfo peer;
  peer.pid = cred.pid;
  peer.uid = cred.uid;
  peer.gid = cred.gid;
  auto groups = ReadPeerGroups(fd);
  if (groups.ok()) {
    peer.groups = *std::move(groups);
  } else if (absl::IsUnimplemented(groups.status())) {
    peer.groups = ReadProcGroups(cred.pid);
  } else {
    return groups.status();
  }
  peer.verified = true;
  return peer;
}

absl::StatusOr<std::vector<gid_t>> ReadPeerGroups(int fd) {
  // Sixteen groups fit most users. When they do not, ERANGE sets `len` to
  // the bytes needed; the peer's credentials are fixed since connect(2), so
  // the second call fits.
  std::vector<gid_t> groups(16);
  for (int attempt = 0; attempt < 2; ++attempt) {
    socklen_t len = static_cast<socklen_t>(groups.size() * sizeof(gid_t));
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups.data(), &len) == 0) {
      groups.resize(len / sizeof(gid_t));
      std::sort(groups.begin(), groups.end());
      return groups;
    }
    if (errno == ENOPROTOOPT) {
      return absl::UnimplementedError("SO_PEERGROUPS: not supported");
    }
    if (errno != ERANGE) break;
    groups.resize(len / sizeof(gid_t));
  }
  return absl::InternalError(
      absl::StrCat("SO_PEERGROUPS: ", std::strerror(errno)));
}

absl::StatusOr<gid_t> ResolveGroup(const std::string& name,
                                   absl::string_view flag) {
  uint32_t id = 0;
  if (absl::SimpleAtoi(name, &id)) return static_cast<gid_t>(id);
  group grp{};
  group* result = nullptr;
  std::vector<char> buf(16384);
  const int rc =
      ::getgrnam_r(name.c_str(), &grp, buf.data(), buf.size(), &result);
  if (rc != 0 || result == nullptr) {
    return absl::NotFoundError(absl::StrCat(flag, ": no group '", name, "'"));
  }
  return grp.gr_gid;
}

absl::StatusOr<uid_t> ResolveUser(const std::string& name,
                                  absl::string_view flag) {
  uint32_t id = 0;
  if (absl::SimpleAtoi(name, &id)) return static_cast<uid_t>(id);
  passwd pw{};
  passwd* result = nullptr;
  std::vector<char> buf(16384);
  const int rc =
      ::getpwnam_r(name.c_str(), &pw, buf.data(), buf.size(), &result);
  if (rc != 0 || result == nullptr) {
    return absl::NotFoundError(absl::StrCat(flag, ": no user '", name, "'"));
  }
  return pw.pw_uid;
}

bool NamespaceAclEntry::Matches(absl::string_view name) const {
  if (!pattern.empty() && pattern.back() == '*') {
    return absl::StartsWith(
        name, absl::string_view(pattern).substr(0, pattern.size() - 1));
  }
  return name == pattern;
}

bool NamespaceAclEntry::Allows(const PeerInfo& peer) const {
  if (!peer.verified) return false;
  if (std::find(uids.begin(), uids.end(), peer.uid) != uids.end()) return true;
  for (gid_t g : gids) {
    if (peer.InGroup(g)) return true;
  }
  return false;
}

std::optional<gid_t> NamespaceAclEntry::segment_group() const {
  if (gids.empty()) return std::nullopt;
  return gids.front();
}

absl::StatusOr<NamespaceAcl> NamespaceAcl::Parse(absl::string_view spec) {
  NamespaceAcl acl;
  for (absl::string_view entry :
       absl::StrSplit(spec, ';', absl::SkipWhitespace())) {
    entry = absl::StripAsciiWhitespace(entry);
    const std::string field = absl::StrCat("--namespace_acl '", entry, "'");
    const size_t eq = entry.find('=');
    if (eq == absl::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": expected PATTERN=PRINCIPAL[+PRINCIPAL...]"));
    }
    NamespaceAclEntry e;
    e.pattern = std::string(entry.substr(0, eq));
    // A pattern is a namespace name, or a prefix of one followed by '*'.
    std::string stem = e.pattern;
    if (!stem.empty() && stem.back() == '*') stem.pop_back();
    if (!stem.empty() || e.pattern != "*") {
      if (absl::Status s = ValidateNamespaceName(stem); !s.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat(field, ": pattern: ", s.message()));
      }
    }
    for (absl::string_view p : absl::StrSplit(entry.substr(eq + 1), '+')) {
      const size_t colon = p.find(':');
      const absl::string_view kind =
          colon == absl::string_view::npos ? p : p.substr(0, colon);
      const std::string value = colon == absl::string_view::npos
                                    ? ""
                                    : std::string(p.substr(colon + 1));
      if (value.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat(field, ": principal '", p,
                         "' is not uid:N, gid:N, user:NAME or group:NAME"));
      }
      if (kind == "uid" || kind == "user") {
        uint32_t n = 0;
        if (kind == "uid" && !absl::SimpleAtoi(value, &n)) {
          return absl::InvalidArgumentError(
              absl::StrCat(field, ": uid '", value, "' is not a number"));
        }
        auto uid = ResolveUser(value, field);
        if (!uid.ok()) return uid.status();
        e.uids.push_back(*uid);
      } else if (kind == "gid" || kind == "group") {
        uint32_t n = 0;
        if (kind == "gid" && !absl::SimpleAtoi(value, &n)) {
          return absl::InvalidArgumentError(
              absl::StrCat(field, ": gid '", value, "' is not a number"));
        }
        auto gid = ResolveGroup(value, field);
        if (!gid.ok()) return gid.status();
        e.gids.push_back(*gid);
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat(field, ": principal '", p,
                         "' is not uid:N, gid:N, user:NAME or group:NAME"));
      }
    }
    acl.entries_.push_back(std::move(e));
  }
  return acl;
}

const NamespaceAclEntry* NamespaceAcl::Find(absl::string_view name) const {
  for (const auto& e : entries_) {
    if (e.Matches(name)) return &e;
  }
  return nullptr;
}

}  // namespace kvtier::daemon
