// StagedSocket: bound out of reach, published finished
// (daemon/socket_staging.h).
#include "daemon/socket_staging.h"

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace kvtier::daemon {
namespace {

absl::Status Failed(absl::string_view what, absl::string_view step,
                    const std::string& path, int err) {
  return absl::FailedPreconditionError(
      absl::StrCat(what, ": ", step, " ", path, ": ", strerror(err)));
}

// Removes the private folder `dir` left by a daemon that died before it
// published: only a real folder of this uid holding nothing but a socket
// named `sock`.
absl::Status RemoveLeftFolder(const std::string& dir, const std::string& sock,
                              absl::string_view what) {
  struct stat st;
  if (::lstat(dir.c_str(), &st) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return Failed(what, "inspecting", dir, errno);
  }
  if (!S_ISDIR(st.st_mode) || st.st_uid != ::geteuid()) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": ", dir,
                     " is in the way of the socket's private folder and "
                     "is not a folder of kvtierd's uid (",
                     ::geteuid(), "): remove it"));
  }
  if (::lstat(sock.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) {
    ::unlink(sock.c_str());
  }
  if (::rmdir(dir.c_str()) != 0) return Failed(what, "removing", dir, errno);
  return absl::OkStatus();
}

}  // namespace

StagedSocket::StagedSocket(std::string path, std::string dir, std::string what)
    : path_(std::move(path)),
      dir_(std::move(dir)),
      bind_path_(dir_ + "/s"),
      what_(std::move(what)) {}

StagedSocket::StagedSocket(StagedSocket&& o) noexcept
    : path_(std::move(o.path_)),
      dir_(std::exchange(o.dir_, std::string())),
      bind_path_(std::move(o.bind_path_)),
      what_(std::move(o.what_)) {}

StagedSocket::~StagedSocket() {
  if (dir_.empty()) return;
  ::unlink(bind_path_.c_str());
  ::rmdir(dir_.c_str());
}

absl::StatusOr<StagedSocket> StagedSocket::Create(const std::string& path,
                                                  absl::string_view what) {
  const size_t slash = path.rfind('/');
  const std::string parent =
      slash == std::string::npos ? "." : path.substr(0, slash);
  const std::string name =
      slash == std::string::npos ? path : path.substr(slash + 1);
  if (name.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", path, " names no socket file"));
  }
  StagedSocket staged(path, absl::StrCat(parent, "/.", name, ".new"),
                      std::string(what));
  if (staged.bind_path_.size() >= sizeof(sockaddr_un::sun_path)) {
    staged.dir_.clear();  // Nothing made: nothing to remove.
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": path longer than ", sizeof(sockaddr_un::sun_path) - 8,
        " bytes (kvtierd first binds it as ", staged.bind_path_, ")"));
  }
  const std::string dir = std::exchange(staged.dir_, std::string());
  if (absl::Status s = RemoveLeftFolder(dir, staged.bind_path_, what);
      !s.ok()) {
    return s;
  }
  // The umask can only narrow 0700.
  if (::mkdir(dir.c_str(), 0700) != 0) {
    return Failed(what, "making the private folder", dir, errno);
  }
  staged.dir_ = dir;
  return staged;
}

absl::Status StagedSocket::Publish(gid_t group, mode_t mode) {
  if (group != static_cast<gid_t>(-1) &&
      ::chown(bind_path_.c_str(), static_cast<uid_t>(-1), group) != 0) {
    return Failed(what_, absl::StrCat("giving group ", group, " to"),
                  bind_path_, errno);
  }
  if (::chmod(bind_path_.c_str(), mode) != 0) {
    char octal[16];
    std::snprintf(octal, sizeof(octal), "%04o", static_cast<unsigned>(mode));
    return Failed(what_, absl::StrCat("setting mode ", octal, " of"),
                  bind_path_, errno);
  }
  if (::renameat2(AT_FDCWD, bind_path_.c_str(), AT_FDCWD, path_.c_str(),
                  RENAME_NOREPLACE) != 0) {
    // A file system without RENAME_NOREPLACE: a hard link never replaces
    // either.
    if (errno != EINVAL || ::link(bind_path_.c_str(), path_.c_str()) != 0) {
      return Failed(what_, absl::StrCat("moving ", bind_path_, " to"), path_,
                    errno);
    }
    ::unlink(bind_path_.c_str());
  }
  ::rmdir(dir_.c_str());
  dir_.clear();
  return absl::OkStatus();
}

}  // namespace kvtier::daemon
