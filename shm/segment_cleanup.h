// Removal of the temporary segment files that creators killed part-way
// leave behind. Segment::Create builds each segment under a private name
// (TempSegmentName, segment.h) and links it to its final name when
// complete; a creator killed before that leaves the temporary, sized and
// possibly populated, and nothing else ever opens or removes it. kvtierd
// runs RemoveTempSegments over its segment folders at start, before it
// creates any segment.
//
// Thread-safety: thread-safe (no shared state).
#ifndef KVTIER_SHM_SEGMENT_CLEANUP_H_
#define KVTIER_SHM_SEGMENT_CLEANUP_H_

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvtier::shm {

// True when `entry` (a file name, no folder) is the temporary name of a
// segment whose file name is `file_prefix` + "." + something:
// TempSegmentName(file_prefix + "." + rest, pid, counter) with rest a
// non-empty file name, pid and counter decimal. Sets *pid then.
bool ParseTempSegmentName(absl::string_view entry,
                          absl::string_view file_prefix, pid_t* pid);

struct TempSegmentCleanup {
  // Absolute paths unlinked.
  std::vector<std::string> removed;
  // Paths of matching names left alone, each with why: another owner, not a
  // regular file (a symlink, a folder), its creator still runs, or unlink
  // failed.
  struct Kept {
    std::string path;
    std::string reason;
  };
  std::vector<Kept> kept;
};

// Unlinks, in folder `dir`, every entry ParseTempSegmentName matches for
// `file_prefix` that is a regular file (never following a symlink: fstatat
// with AT_SYMLINK_NOFOLLOW, then unlinkat relative to the opened folder)
// owned by `owner`, and whose creator is gone: its pid is `stale_pid` (the
// caller's own pid before it creates any segment: a previous process of
// that pid left it) or no live process. A folder that does not exist is
// an empty result; another error opening or reading it is returned as
// the errno's status, naming `dir`.
absl::StatusOr<TempSegmentCleanup> RemoveTempSegments(
    const std::string& dir, absl::string_view file_prefix, uid_t owner,
    pid_t stale_pid);

}  // namespace kvtier::shm

#endif  // KVTIER_SHM_SEGMENT_CLEANUP_H_
