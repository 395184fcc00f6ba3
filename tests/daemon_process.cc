// DaemonProcess and Child: real processes for multi-process tests.
#include "tests/daemon_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

extern char** environ;

namespace kvtier::testing {

absl::StatusOr<Child> Child::Spawn(const std::vector<std::string>& argv) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe: ", strerror(errno)));
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = -1;
  const int rc =
      posix_spawn(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(fds[1]);
  if (rc != 0) {
    close(fds[0]);
    return absl::InternalError(
        absl::StrCat("posix_spawn ", argv[0], ": ", strerror(rc)));
  }
  return Child(pid, fds[0]);
}

Child::Child(Child&& o) noexcept
    : pid_(std::exchange(o.pid_, -1)),
      out_fd_(std::exchange(o.out_fd_, -1)),
      output_(std::move(o.output_)),
      reaped_(o.reaped_) {}

Child::~Child() {
  if (pid_ > 0 && !reaped_) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  if (out_fd_ >= 0) close(out_fd_);
}

bool Child::ReadSome(absl::Duration timeout) {
  pollfd p{out_fd_, POLLIN, 0};
  const int ms = static_cast<int>(absl::ToInt64Milliseconds(timeout));
  if (poll(&p, 1, ms) <= 0) return false;
  char buf[4096];
  const ssize_t n = read(out_fd_, buf, sizeof(buf));
  if (n <= 0) return false;
  output_.append(buf, n);
  return true;
}

absl::Status Child::WaitForLine(const std::string& line,
                                absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    if (output_.find(line + "\n") != std::string::npos) return absl::OkStatus();
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(
          absl::StrCat("no line '", line, "' from child; output: ", output_));
    }
    if (!ReadSome(std::min(left, absl::Milliseconds(100)))) {
      int status = 0;
      if (!reaped_ && waitpid(pid_, &status, WNOHANG) == pid_) {
        reaped_ = true;
        while (ReadSome(absl::ZeroDuration())) {
        }
        if (output_.find(line + "\n") != std::string::npos) {
          return absl::OkStatus();
        }
        return absl::NotFoundError(absl::StrCat("child exited (status ", status,
                                                ") before '", line,
                                                "'; output: ", output_));
      }
    }
  }
}

absl::StatusOr<int> Child::Wait(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  int status = 0;
  while (!reaped_) {
    const pid_t r = waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      reaped_ = true;
      break;
    }
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError("child did not exit in time");
    }
    ReadSome(absl::Milliseconds(10));
  }
  while (ReadSome(absl::ZeroDuration())) {
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

void Child::Signal(int sig) {
  if (pid_ > 0 && !reaped_) kill(pid_, sig);
}

Ran RunProgram(const std::vector<std::string>& argv, absl::Duration timeout) {
  Ran r;
  auto child = Child::Spawn(argv);
  if (!child.ok()) {
    r.out = child.status().ToString();
    return r;
  }
  auto rc = child->Wait(timeout);
  r.out = child->output();
  if (rc.ok()) {
    r.rc = *rc;
  } else {
    r.out += "\n(" + rc.status().ToString() + ")";
  }
  return r;
}

std::string ResolveProgram(const std::string& compiled,
                           const std::string& relative) {
  std::error_code ec;
  if (std::filesystem::exists(compiled, ec)) return compiled;
  std::filesystem::path dir =
      std::filesystem::read_symlink("/proc/self/exe", ec).parent_path();
  for (int up = 0; up < 4 && !dir.empty(); ++up) {
    const std::filesystem::path candidate = dir / relative;
    if (std::filesystem::exists(candidate, ec)) return candidate.string();
    dir = dir.parent_path();
  }
  return compiled;
}

std::vector<std::string> DaemonCommand(std::vector<std::string> argv) {
  const char* dir = std::getenv(kSeccompEnv);
  if (dir == nullptr || *dir == '\0') return argv;
  const std::string d = dir;
  std::vector<std::string> cmd = {
      ResolveProgram(KVTIER_SECCOMP_EXEC_PATH, "tests/seccomp_exec"),
      "--allow=" + d + "/system-service.syscalls",
      "--allow=" + d + "/kvtierd-extra.syscalls",
      "--known=" + d + "/known.syscalls",
      std::string("--address_families=") + kUnitAddressFamilies,
      "--deny_write_execute"};
  if (const char* action = std::getenv("KVTIER_DAEMON_SECCOMP_ACTION")) {
    cmd.push_back(std::string("--action=") + action);
  }
  cmd.push_back("--");
  cmd.insert(cmd.end(), std::make_move_iterator(argv.begin()),
             std::make_move_iterator(argv.end()));
  return cmd;
}

namespace {

// Fields `NoNewPrivs` and `Seccomp_filters` of /proc/<pid>/status.
struct SeccompStatus {
  int no_new_privs = -1;
  int filters = -1;
};

SeccompStatus ReadSeccompStatus(const std::string& pid) {
  SeccompStatus st;
  std::ifstream in("/proc/" + pid + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("NoNewPrivs:", 0) == 0) {
      st.no_new_privs = std::atoi(line.c_str() + 11);
    } else if (line.rfind("Seccomp_filters:", 0) == 0) {
      st.filters = std::atoi(line.c_str() + 16);
    }
  }
  return st;
}

}  // namespace

absl::Status CheckDaemonFiltered(pid_t pid) {
  const char* dir = std::getenv(kSeccompEnv);
  if (dir == nullptr || *dir == '\0') return absl::OkStatus();
  const SeccompStatus mine = ReadSeccompStatus("self");
  const SeccompStatus its = ReadSeccompStatus(std::to_string(pid));
  if (its.no_new_privs != 1 || its.filters <= mine.filters) {
    return absl::FailedPreconditionError(
        absl::StrCat(kSeccompEnv, " is set but kvtierd (pid ", pid,
                     ") is not under the filter: NoNewPrivs ", its.no_new_privs,
                     ", Seccomp_filters ", its.filters,
                     " (this process: ", mine.filters, ")"));
  }
  return absl::OkStatus();
}

DaemonProcess::DaemonProcess() {
  char tmpl[] = "/dev/shm/kvtier-test-XXXXXX";
  if (mkdtemp(tmpl) != nullptr) dir_ = tmpl;
  shm_dir_ = dir_ + "/shm";
  socket_ = dir_ + "/kvtierd.sock";
  std::filesystem::create_directories(shm_dir_);
  // kvtierd refuses a bank folder others can write, whatever the umask.
  ::chmod(shm_dir_.c_str(), 0750);
}

DaemonProcess::~DaemonProcess() {
  Kill();
  std::error_code ec;
  if (!dir_.empty()) std::filesystem::remove_all(dir_, ec);
}

absl::Status DaemonProcess::Start(const std::vector<std::string>& extra) {
  std::vector<std::string> argv = {
      ResolveProgram(KVTIER_KVTIERD_PATH, "daemon/kvtierd"),
      "--socket=" + socket_, "--shm_dir=" + shm_dir_, "--huge_pages=off",
      "--log_level=warn"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  auto child = Child::Spawn(DaemonCommand(std::move(argv)));
  if (!child.ok()) return child.status();
  child_ = std::make_unique<Child>(*std::move(child));
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (absl::Now() < deadline) {
    const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, socket_.c_str(), sizeof(addr.sun_path) - 1);
    const bool up =
        connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    close(fd);
    if (up) return CheckDaemonFiltered(child_->pid());
    absl::SleepFor(absl::Milliseconds(20));
  }
  return absl::DeadlineExceededError("kvtierd did not start listening");
}

absl::Status DaemonProcess::Stop() {
  if (child_ == nullptr) return absl::OkStatus();
  child_->Signal(SIGTERM);
  auto rc = child_->Wait(absl::Seconds(10));
  child_.reset();
  if (!rc.ok()) return rc.status();
  if (*rc != 0) {
    return absl::InternalError(absl::StrCat("kvtierd exited with ", *rc));
  }
  return absl::OkStatus();
}

void DaemonProcess::Signal(int sig) {
  if (child_ != nullptr) child_->Signal(sig);
}

void DaemonProcess::Kill() {
  if (child_ == nullptr) return;
  child_->Signal(SIGKILL);
  (void)child_->Wait(absl::Seconds(10));
  child_.reset();
}

}  // namespace kvtier::testing
