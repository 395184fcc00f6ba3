// Folders and files the daemon and its clients can trust
// (shm/trusted_path.h).
#include "shm/trusted_path.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace kvtier::shm {
namespace {

std::string Mode(mode_t m) { return absl::StrFormat("%04o", m & 07777); }

std::string Parent(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

}  // namespace

absl::Status EnsureTrustedDir(const std::string& dir, mode_t create_mode,
                              absl::string_view what) {
  if (dir.empty() || dir[0] != '/') {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": '", dir, "' is not an absolute path"));
  }
  struct stat st;
  if (::lstat(dir.c_str(), &st) != 0) {
    if (errno != ENOENT) {
      return absl::ErrnoToStatus(errno,
                                 absl::StrCat(what, ": lstat '", dir, "'"));
    }
    if (::mkdir(dir.c_str(), create_mode) != 0 && errno != EEXIST) {
      return absl::FailedPreconditionError(absl::StrCat(
          what, ": cannot create '", dir, "': ", strerror(errno),
          errno == ENOENT ? " (its parent folder does not exist)" : ""));
    }
    // Whoever made it (this call, or someone racing it), check it as found;
    // chmod only what this process owns and just made.
    if (::lstat(dir.c_str(), &st) != 0) {
      return absl::ErrnoToStatus(errno,
                                 absl::StrCat(what, ": lstat '", dir, "'"));
    }
    if (S_ISDIR(st.st_mode) && st.st_uid == ::geteuid() &&
        (st.st_mode & 07777) != create_mode) {
      const int fd =
          ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (fd >= 0) {
        ::fchmod(fd, create_mode);
        ::fstat(fd, &st);
        ::close(fd);
      }
    }
  }
  if (S_ISLNK(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, ": '", dir,
        "' is a symlink; kvtierd keeps banks, journals and sockets only in a "
        "real folder it owns (remove the link, or name the folder itself)"));
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": '", dir, "' exists and is not a folder"));
  }
  if (st.st_uid != ::geteuid()) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, ": '", dir, "' belongs to uid ", st.st_uid,
        ", not to kvtierd's uid ", ::geteuid(),
        ": whoever owns it could plant or swap banks and journals. Remove it "
        "(kvtierd then creates it) or give it to uid ",
        ::geteuid()));
  }
  if ((st.st_mode & 022) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, ": '", dir, "' has mode ", Mode(st.st_mode),
        ", writable by other users, who could pre-create banks under their "
        "predictable names; use a folder only kvtierd can write (e.g. ",
        Parent(dir) == "/dev/shm" ? dir : "/dev/shm/kvtier",
        ", mode 0750; kvtierd creates it when missing) or chmod go-w it"));
  }
  return absl::OkStatus();
}

absl::Status CheckTrustedFile(const struct stat& st, const std::string& path,
                              uid_t owner, absl::string_view what) {
  if (!S_ISREG(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, " '", path, "' is not a regular file"));
  }
  if (owner != kAnyOwner && st.st_uid != owner) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, " '", path, "' belongs to uid ", st.st_uid, ", not to uid ",
        owner,
        " (kvtierd's): refused, never adopted; it was not made by kvtierd "
        "(another user may have planted it). Remove it"));
  }
  if ((st.st_mode & 002) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, " '", path, "' has mode ", Mode(st.st_mode),
                     ", writable by every user: refused"));
  }
  return absl::OkStatus();
}

absl::StatusOr<uid_t> CheckDaemonSocket(const std::string& socket) {
  struct stat st;
  if (::lstat(socket.c_str(), &st) != 0) {
    if (errno == ENOENT) {
      return absl::NotFoundError(
          absl::StrCat("kvtierd socket '", socket, "' does not exist"));
    }
    return absl::ErrnoToStatus(errno, absl::StrCat("lstat '", socket, "'"));
  }
  if (!S_ISSOCK(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "kvtierd socket '", socket, "' is not a socket",
        S_ISLNK(st.st_mode) ? " (a symlink: name the socket itself)" : ""));
  }
  const uid_t daemon_uid = st.st_uid;
  const std::string dir = Parent(socket);
  struct stat dst;
  if (::lstat(dir.c_str(), &dst) != 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat("lstat '", dir, "'"));
  }
  if (!S_ISDIR(dst.st_mode) || dst.st_uid != daemon_uid ||
      (dst.st_mode & 022) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "kvtierd socket '", socket, "': its folder '", dir,
        "' must be a real folder of the socket's owner (uid ", daemon_uid,
        ") that nobody else can write; found ",
        S_ISDIR(dst.st_mode) ? "a folder" : "no folder", " of uid ", dst.st_uid,
        " mode ", Mode(dst.st_mode),
        ": anyone who can write there could stand in for kvtierd"));
  }
  struct stat gst;
  const std::string grand = Parent(dir);
  if (::stat(grand.c_str(), &gst) == 0 && (gst.st_mode & 002) != 0 &&
      daemon_uid != ::getuid() && daemon_uid != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "kvtierd socket '", socket, "' belongs to uid ", daemon_uid,
        " in a folder of world-writable '", grand,
        "', where any user could have made it first: only a daemon of your "
        "own uid (",
        ::getuid(),
        ") or root is trusted there. Use the system socket (/run/kvtier) or "
        "one under a folder only its owner can write"));
  }
  return daemon_uid;
}

}  // namespace kvtier::shm
