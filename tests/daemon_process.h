// DaemonProcess: starts a real kvtierd for multi-process tests, in its own
// temporary folder (socket and /dev/shm segments), and stops or kills it.
// Also runs helper programs and collects their exit status and output.
// With KVTIER_DAEMON_SECCOMP set (kSeccompEnv) every kvtierd it starts runs
// under the unit's system call filter (DaemonCommand).
//
// Thread-safety: not thread-safe; one test thread drives it.
#ifndef KVTIER_TESTS_DAEMON_PROCESS_H_
#define KVTIER_TESTS_DAEMON_PROCESS_H_

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace kvtier::testing {

// A child process whose stdout is captured through a pipe.
class Child {
 public:
  // Starts `argv` (argv[0] is a path). REQUIRES: argv non-empty.
  static absl::StatusOr<Child> Spawn(const std::vector<std::string>& argv);
  Child(Child&& o) noexcept;
  Child& operator=(Child&&) = delete;
  ~Child();  // Kills and reaps a child still running.

  pid_t pid() const { return pid_; }
  // Reads stdout until a line equal to `line` arrives; DEADLINE_EXCEEDED or
  // NOT_FOUND (the child exited first).
  absl::Status WaitForLine(const std::string& line, absl::Duration timeout);
  // Waits for exit; returns the exit code (128+signal when killed).
  absl::StatusOr<int> Wait(absl::Duration timeout);
  void Signal(int sig);
  // Everything read from stdout so far.
  const std::string& output() const { return output_; }

 private:
  Child(pid_t pid, int out_fd) : pid_(pid), out_fd_(out_fd) {}
  bool ReadSome(absl::Duration timeout);
  pid_t pid_ = -1;
  int out_fd_ = -1;
  std::string output_;
  bool reaped_ = false;
};

// What a program run to completion printed on stdout and how it ended.
struct Ran {
  int rc = -1;  // Exit code (128+signal); -1 when it could not be run or
                // did not exit within the timeout (then `out` says why).
  std::string out;
};
// Runs `argv` (argv[0] a path) and waits for it, `timeout` at most (then it
// is killed).
Ran RunProgram(const std::vector<std::string>& argv,
               absl::Duration timeout = absl::Seconds(60));

// Returns the path of a program of this build: `compiled` (an absolute path
// baked in at build time) when it exists, else `relative` (from the build
// root, e.g. "daemon/kvtierd") found by walking up from this executable's
// folder — so a build copied elsewhere (the GPU machine's bundle) works.
std::string ResolveProgram(const std::string& compiled,
                           const std::string& relative);

// The unit's RestrictAddressFamilies= (deploy/kvtierd.service), handed to
// seccomp_exec; seccomp_test checks the two agree.
inline constexpr char kUnitAddressFamilies[] = "AF_UNIX,AF_INET,AF_INET6";

// The environment variable that runs every kvtierd of the tests under the
// unit's system call filter: the folder of the allow-lists (deploy/seccomp).
// ctest's <suite>_seccomp registrations set it (label seccomp).
inline constexpr char kSeccompEnv[] = "KVTIER_DAEMON_SECCOMP";

// The command that starts kvtierd with `argv` (argv[0] its path): `argv`
// itself, or, while kSeccompEnv names a folder, `argv` behind seccomp_exec
// with that folder's system-service.syscalls and kvtierd-extra.syscalls
// (unknown calls ENOSYS per known.syscalls, the rest EPERM), the unit's
// address families and MemoryDenyWriteExecute=. The exec keeps the pid.
// KVTIER_DAEMON_SECCOMP_ACTION=kill or =log picks seccomp_exec's --action
// (log: nothing is refused and the kernel logs each call outside the lists,
// audit type 1326 in dmesg -- how to find what the daemon needs).
std::vector<std::string> DaemonCommand(std::vector<std::string> argv);

// OK when kSeccompEnv is unset, or when process `pid` runs with
// no_new_privs under more seccomp filters than this process (read from
// /proc/<pid>/status): a launcher that silently did nothing fails here.
absl::Status CheckDaemonFiltered(pid_t pid);

class DaemonProcess {
 public:
  DaemonProcess();
  ~DaemonProcess();  // Kills the daemon, removes its folder and segments.

  // Starts kvtierd with the test folder's socket and shm dir plus `extra`
  // flags (through DaemonCommand); returns once the socket accepts
  // connections and CheckDaemonFiltered passes.
  absl::Status Start(const std::vector<std::string>& extra = {});
  // SIGTERM and wait.
  absl::Status Stop();
  // SIGKILL and wait.
  void Kill();
  // Sends `sig` to the daemon without waiting.
  void Signal(int sig);

  const std::string& socket() const { return socket_; }
  // The operator socket (kvtierd --admin_socket's default).
  std::string admin_socket() const { return socket_ + ".admin"; }
  const std::string& shm_dir() const { return shm_dir_; }
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  std::string shm_dir_;
  std::string socket_;
  std::unique_ptr<Child> child_;
};

}  // namespace kvtier::testing

#endif  // KVTIER_TESTS_DAEMON_PROCESS_H_
