// Removal of orphaned temporary segment files. See segment_cleanup.h.
//
// Thread-safety: thread-safe (no shared state).
#include "shm/segment_cleanup.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "absl/cleanup/cleanup.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "shm/segment.h"

namespace kvtier::shm {
namespace {

bool AllDigits(absl::string_view s) {
  if (s.empty() || s.size() > 20) return false;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
  }
  return true;
}

// True when process `pid` exists (kill(2) with signal 0; EPERM: it exists
// but belongs to someone else).
bool ProcessAlive(pid_t pid) {
  if (pid <= 0) return false;
  return kill(pid, 0) == 0 || errno == EPERM;
}

}  // namespace

bool ParseTempSegmentName(absl::string_view entry,
                          absl::string_view file_prefix, pid_t* pid) {
  // "." + file_prefix + "." + rest + "." + pid + "." + counter + ".tmp"
  if (file_prefix.empty()) return false;
  absl::string_view s = entry;
  if (!absl::ConsumePrefix(&s, ".") || !absl::ConsumePrefix(&s, file_prefix) ||
      !absl::ConsumePrefix(&s, ".") || !absl::ConsumeSuffix(&s, ".tmp")) {
    return false;
  }
  const size_t counter_dot = s.rfind('.');
  if (counter_dot == absl::string_view::npos) return false;
  const absl::string_view counter = s.substr(counter_dot + 1);
  s = s.substr(0, counter_dot);
  const size_t pid_dot = s.rfind('.');
  if (pid_dot == absl::string_view::npos) return false;
  const absl::string_view pid_text = s.substr(pid_dot + 1);
  const absl::string_view rest = s.substr(0, pid_dot);
  if (!AllDigits(counter) || !AllDigits(pid_text) || rest.empty()) {
    return false;
  }
  // The final name must be one Segment::Create accepts.
  if (!ValidateFileName(absl::StrCat(file_prefix, ".", rest)).ok()) {
    return false;
  }
  int64_t value = 0;
  if (!absl::SimpleAtoi(pid_text, &value) || value <= 0 || value > INT32_MAX) {
    return false;
  }
  *pid = static_cast<pid_t>(value);
  return true;
}

absl::StatusOr<TempSegmentCleanup> RemoveTempSegments(
    const std::string& dir, absl::string_view file_prefix, uid_t owner,
    pid_t stale_pid) {
  TempSegmentCleanup out;
  const int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return out;
    return absl::ErrnoToStatus(errno, absl::StrCat("open folder '", dir, "'"));
  }
  DIR* d = fdopendir(fd);
  if (d == nullptr) {
    const int err = errno;
    close(fd);
    return absl::ErrnoToStatus(err, absl::StrCat("read folder '", dir, "'"));
  }
  absl::Cleanup close_dir = [d] { closedir(d); };
  const std::string sep = !dir.empty() && dir.back() == '/' ? "" : "/";
  for (;;) {
    errno = 0;
    const dirent* e = readdir(d);
    if (e == nullptr) {
      if (errno != 0) {
        return absl::ErrnoToStatus(errno,
                                   absl::StrCat("read folder '", dir, "'"));
      }
      break;
    }
    pid_t pid = 0;
    if (!ParseTempSegmentName(e->d_name, file_prefix, &pid)) continue;
    const std::string path = absl::StrCat(dir, sep, e->d_name);
    struct stat st;
    if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
      if (errno != ENOENT) {
        out.kept.push_back({path, absl::StrCat("fstatat: ", strerror(errno))});
      }
      continue;
    }
    if (!S_ISREG(st.st_mode)) {
      out.kept.push_back({path, "not a regular file"});
      continue;
    }
    if (st.st_uid != owner) {
      out.kept.push_back(
          {path, absl::StrCat("owned by uid ", st.st_uid, ", not ", owner)});
      continue;
    }
    if (pid != stale_pid && ProcessAlive(pid)) {
      out.kept.push_back(
          {path, absl::StrCat("its creator, pid ", pid, ", still runs")});
      continue;
    }
    if (unlinkat(dirfd(d), e->d_name, 0) != 0) {
      if (errno != ENOENT) {
        out.kept.push_back({path, absl::StrCat("unlink: ", strerror(errno))});
      }
      continue;
    }
    out.removed.push_back(path);
  }
  return out;
}

}  // namespace kvtier::shm
