// ProcessWatch: a process named by pid and start time, watched by pidfd.
#include "daemon/process_watch.h"

#include <poll.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace kvtier::daemon {
namespace {

int PidfdOpen(pid_t pid) {
#ifdef SYS_pidfd_open
  return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
#else
  errno = ENOSYS;
  return -1;
#endif
}

// State letter of /proc/<pid>/stat (field 3); 0 when unreadable.
char ReadState(pid_t pid, uint64_t* start_ticks) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string line;
  if (!std::getline(in, line)) return 0;
  // "pid (comm) S ...": comm may hold spaces and parentheses, so fields
  // count from the last ')'.
  const size_t close = line.rfind(')');
  if (close == std::string::npos || close + 2 >= line.size()) return 0;
  std::vector<std::string> f =
      absl::StrSplit(line.substr(close + 2), ' ', absl::SkipEmpty());
  // f[0] is field 3 (state); field 22 (starttime) is f[19].
  if (f.size() < 20 || f[0].empty()) return 0;
  if (start_ticks != nullptr && !absl::SimpleAtoi(f[19], start_ticks)) {
    return 0;
  }
  return f[0][0];
}

}  // namespace

absl::StatusOr<uint64_t> ReadProcessStartTicks(pid_t pid) {
  if (pid <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("pid: ", pid));
  }
  if (::access(absl::StrCat("/proc/", pid).c_str(), F_OK) != 0) {
    return absl::NotFoundError(absl::StrCat("no process ", pid));
  }
  uint64_t ticks = 0;
  if (ReadState(pid, &ticks) == 0) {
    return absl::InternalError(
        absl::StrCat("/proc/", pid, "/stat: unreadable or unparsable"));
  }
  return ticks;
}

absl::StatusOr<std::unique_ptr<ProcessWatch>> ProcessWatch::Open(
    pid_t pid, uint64_t start_ticks) {
  if (pid <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("pid: ", pid, " names no process"));
  }
  // pidfd first: if the process then still has the start time we expect,
  // the pidfd refers to it (a pid is reused only after its process exits,
  // and then the pidfd reads as exited).
  const int fd = PidfdOpen(pid);
  if (fd < 0 && errno == ESRCH) {
    return absl::NotFoundError(absl::StrCat("process ", pid, " has exited"));
  }
  uint64_t now_ticks = 0;
  const char state = ReadState(pid, &now_ticks);
  if (state == 0 || state == 'Z' || state == 'X' ||
      (start_ticks != 0 && now_ticks != start_ticks)) {
    if (fd >= 0) ::close(fd);
    return absl::NotFoundError(absl::StrCat(
        "process ", pid, " started at tick ", start_ticks, " has exited"));
  }
  auto watch = std::unique_ptr<ProcessWatch>(
      new ProcessWatch(ProcessKey{pid, now_ticks}, fd));
  if (watch->Exited()) {
    return absl::NotFoundError(absl::StrCat("process ", pid, " has exited"));
  }
  return watch;
}

ProcessWatch::~ProcessWatch() {
  if (pidfd_ >= 0) ::close(pidfd_);
}

bool ProcessWatch::Exited() const {
  if (pidfd_ >= 0) {
    pollfd p{pidfd_, POLLIN, 0};
    const int r = ::poll(&p, 1, 0);
    if (r > 0) return true;  // Readable: exited (zombie or reaped).
    if (r == 0) return false;
    // poll failing on a valid fd is unexpected: fall through to /proc.
  }
  uint64_t ticks = 0;
  const char state = ReadState(key_.pid, &ticks);
  return state == 0 || state == 'Z' || state == 'X' ||
         ticks != key_.start_ticks;
}

}  // namespace kvtier::daemon
