// Real local users for multi-process tests (tests/test_users.h).
#include "tests/test_users.h"

#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "tests/daemon_process.h"

namespace kvtier::testing {

std::string Tool(const std::string& name) {
  for (const char* dir : {"/usr/sbin/", "/sbin/", "/usr/bin/"}) {
    const std::string p = std::string(dir) + name;
    if (access(p.c_str(), X_OK) == 0) return p;
  }
  return "";
}

bool UsersRequired() {
  const char* v = std::getenv("KVTIER_REQUIRE_USERS");
  return v != nullptr && std::string(v) == "1";
}

std::string CannotCreateUsers() {
  if (geteuid() != 0) return "needs root to create users";
  if (Tool("useradd").empty() || Tool("groupadd").empty() ||
      Tool("usermod").empty()) {
    return "useradd/groupadd/usermod not installed";
  }
  return "";
}

absl::Status RunTool(const std::vector<std::string>& argv) {
  const Ran r = RunProgram(argv, absl::Seconds(30));
  if (r.rc != 0) {
    return absl::InternalError(
        absl::StrCat(argv[0], " exited with ", r.rc, ": ", r.out));
  }
  return absl::OkStatus();
}

absl::StatusOr<gid_t> EnsureGroup(const std::string& name) {
  if (group* g = getgrnam(name.c_str()); g != nullptr) return g->gr_gid;
  if (absl::Status s = RunTool({Tool("groupadd"), "-f", name}); !s.ok()) {
    return s;
  }
  group* g = getgrnam(name.c_str());
  if (g == nullptr) {
    return absl::InternalError("groupadd made no group " + name);
  }
  return g->gr_gid;
}

absl::StatusOr<User> EnsureUser(const std::string& name,
                                const std::string& groups) {
  if (getpwnam(name.c_str()) == nullptr) {
    std::vector<std::string> argv = {Tool("useradd"), "-M", "-N", "-s",
                                     "/usr/sbin/nologin"};
    if (!groups.empty()) argv.insert(argv.end(), {"-G", groups});
    argv.push_back(name);
    if (absl::Status s = RunTool(argv); !s.ok()) return s;
  } else if (absl::Status s = RunTool({Tool("usermod"), "-G", groups, name});
             !s.ok()) {
    return s;
  }
  passwd* pw = getpwnam(name.c_str());
  if (pw == nullptr) {
    return absl::InternalError("useradd made no user " + name);
  }
  return User{name, pw->pw_uid, pw->pw_gid};
}

Outcome RunAs(const User* user, const std::function<int(std::string*)>& body) {
  int fds[2];
  if (pipe(fds) != 0) return {};
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    if (user != nullptr && (initgroups(user->name.c_str(), user->gid) != 0 ||
                            setgid(user->gid) != 0 || setuid(user->uid) != 0 ||
                            getuid() != user->uid)) {
      _exit(120);
    }
    std::string out;
    const int rc = body(&out);
    size_t done = 0;
    while (done < out.size()) {
      const ssize_t w = write(fds[1], out.data() + done, out.size() - done);
      if (w <= 0) break;
      done += static_cast<size_t>(w);
    }
    _exit(rc);
  }
  close(fds[1]);
  Outcome o;
  char buf[4096];
  ssize_t n;
  while ((n = read(fds[0], buf, sizeof(buf))) > 0) o.output.append(buf, n);
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  o.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return o;
}

int ConnectErrno(const std::string& path) {
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  const int rc = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  const int err = rc == 0 ? 0 : errno;
  close(fd);
  return err;
}

int OpenErrno(const std::string& path) {
  for (int flags : {O_RDWR, O_RDONLY}) {
    const int fd = open(path.c_str(), flags | O_CLOEXEC);
    if (fd >= 0) {
      close(fd);
      return 0;
    }
    if (errno != EACCES) return errno;
  }
  return EACCES;
}

}  // namespace kvtier::testing
