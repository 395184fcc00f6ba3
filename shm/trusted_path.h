// Folders and files the daemon and its clients can trust.
//
// kvtier's banks hold every tenant's prompts, on machines where other users
// run code. A folder anyone else can write lets them pre-create a bank under
// a predictable name (then read every tenant's KV and write poisoned KV),
// plant a symlink, or swap a file between the daemon's check and an engine's
// open. So every folder the daemon keeps banks, journals or sockets in must
// be a real directory (not a symlink) owned by the daemon's uid and writable
// by nobody else, and every file it adopts or a client maps is opened with
// O_NOFOLLOW and checked with fstat: a regular file, owned by the expected
// uid, not writable by others. Anything else is refused with an error that
// says what was found and what to do; nothing is adopted or changed.
//
// Thread-safety: stateless functions, thread-safe.
#ifndef KVTIER_SHM_TRUSTED_PATH_H_
#define KVTIER_SHM_TRUSTED_PATH_H_

#include <sys/stat.h>
#include <sys/types.h>

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvtier::shm {

// Any owner: no uid check (tests and tools that open a file they name).
inline constexpr uid_t kAnyOwner = static_cast<uid_t>(-1);

// Makes sure `dir` (absolute) is a folder this process can trust: when it
// does not exist it is created with `create_mode` (its parent must exist;
// the umask cannot weaken the mode: it is set with chmod); when it exists
// it must be a directory, not a symlink, owned by geteuid(), with no group
// or other write bit. FAILED_PRECONDITION naming `what` (e.g. "--shm_dir"),
// the owner and mode found, and the fix; INVALID_ARGUMENT for a relative
// path. An existing folder is never changed.
absl::Status EnsureTrustedDir(const std::string& dir, mode_t create_mode,
                              absl::string_view what);

// Checks `st` (fstat of a file opened with O_NOFOLLOW at `path`): a regular
// file, not writable by others, and owned by `owner` unless it is
// kAnyOwner. FAILED_PRECONDITION naming `what`, the path, the owner and mode
// found.
absl::Status CheckTrustedFile(const struct stat& st, const std::string& path,
                              uid_t owner, absl::string_view what);

// Checks the daemon socket a client is about to connect to and returns the
// daemon's uid (the socket's owner), which the client then requires of
// every segment it maps. The socket must be a socket (lstat: not a symlink)
// in a folder that is a real directory owned by the socket's owner with no
// group or other write bit; when that folder sits in a world-writable
// folder (/tmp), where anyone could have made it first, its owner must be
// this process's uid or root. FAILED_PRECONDITION naming what was found;
// NOT_FOUND when the socket does not exist.
absl::StatusOr<uid_t> CheckDaemonSocket(const std::string& socket);

}  // namespace kvtier::shm

#endif  // KVTIER_SHM_TRUSTED_PATH_H_
