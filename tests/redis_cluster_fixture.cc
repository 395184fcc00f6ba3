// RedisClusterFixture (tests/redis_cluster_fixture.h): real redis-server
// processes, redis-cli --cluster create, and the cluster's own CLUSTER NODES
// and CLUSTER INFO read over hiredis.
#include "tests/redis_cluster_fixture.h"

#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"

namespace kvtier::testing {
namespace {

constexpr int kBusPortOffset = 10000;  // Redis Cluster's bus: port + 10000
constexpr int kMaxClientPort = 65535 - kBusPortOffset;

// The path of `name`: the first executable one in $KVTIER_REDIS_BIN_DIR
// when set (only there), else on PATH, in /usr/bin or /usr/sbin.
std::string FindProgram(const std::string& name) {
  std::vector<std::string> dirs;
  if (const char* bin = std::getenv("KVTIER_REDIS_BIN_DIR")) {
    dirs.push_back(bin);
  } else {
    if (const char* path = std::getenv("PATH")) {
      dirs = absl::StrSplit(path, ':', absl::SkipEmpty());
    }
    dirs.push_back("/usr/bin");
    dirs.push_back("/usr/sbin");
  }
  for (const std::string& dir : dirs) {
    std::string candidate = absl::StrCat(dir, "/", name);
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

std::string RandomHex(size_t bytes) {
  std::string raw(bytes, '\0');
  std::ifstream urandom("/dev/urandom", std::ios::binary);
  urandom.read(raw.data(), static_cast<std::streamsize>(raw.size()));
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : raw) {
    out.push_back(kHex[c >> 4]);
    out.push_back(kHex[c & 15]);
  }
  return out;
}

// True when `port` can be bound on every local address right now.
bool PortFree(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  bool ok = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  close(fd);
  return ok;
}

// A port the kernel hands out whose cluster bus port is free too.
absl::StatusOr<int> PickPort(const std::set<int>& taken) {
  for (int attempt = 0; attempt < 200; ++attempt) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return absl::InternalError("socket() failed");
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
    socklen_t len = sizeof(addr);
    int port = -1;
    if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
        getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
      port = ntohs(addr.sin_port);
    }
    close(fd);
    if (port <= 0 || port > kMaxClientPort) continue;
    if (taken.count(port) || taken.count(port + kBusPortOffset) ||
        taken.count(port - kBusPortOffset)) {
      continue;
    }
    if (PortFree(port + kBusPortOffset)) return port;
  }
  return absl::ResourceExhaustedError("no free port pair (port, port+10000)");
}

// Forks and execs `argv` (searched on PATH) with stdin from /dev/null and
// stdout and stderr to `out_fd`; the child dies with this thread.
pid_t Spawn(const std::vector<std::string>& argv, int out_fd) {
  std::vector<char*> args;
  for (const std::string& a : argv)
    args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t parent = getpid();
  pid_t pid = fork();
  if (pid != 0) return pid;
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(127);
  int null_fd = open("/dev/null", O_RDONLY);
  if (null_fd >= 0) dup2(null_fd, 0);
  dup2(out_fd, 1);
  dup2(out_fd, 2);
  execvp(args[0], args.data());
  _exit(127);
}

struct Ran {
  int rc = -1;
  std::string out;
};

// Runs `argv` to completion (killed after `timeout`), capturing its output.
Ran RunCapture(const std::vector<std::string>& argv, absl::Duration timeout) {
  Ran ran;
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    ran.out = "pipe2 failed";
    return ran;
  }
  pid_t pid = Spawn(argv, fds[1]);
  close(fds[1]);
  if (pid < 0) {
    close(fds[0]);
    ran.out = "fork failed";
    return ran;
  }
  const absl::Time deadline = absl::Now() + timeout;
  char buf[4096];
  while (true) {
    pollfd p{fds[0], POLLIN, 0};
    int wait_ms =
        static_cast<int>(absl::ToInt64Milliseconds(deadline - absl::Now()));
    if (wait_ms <= 0) {
      kill(pid, SIGKILL);
      absl::StrAppend(&ran.out, "\n[killed: still running after ",
                      absl::FormatDuration(timeout), "]");
      break;
    }
    int n = poll(&p, 1, wait_ms);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) continue;
    ssize_t got = read(fds[0], buf, sizeof(buf));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    ran.out.append(buf, static_cast<size_t>(got));
  }
  close(fds[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  ran.rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return ran;
}

void AppendReply(const redisReply* r, std::string* out) {
  switch (r->type) {
    case REDIS_REPLY_STRING:
    case REDIS_REPLY_STATUS:
      out->append(r->str, r->len);
      break;
    case REDIS_REPLY_INTEGER:
      absl::StrAppend(out, r->integer);
      break;
    case REDIS_REPLY_ARRAY:
      for (size_t i = 0; i < r->elements; ++i) {
        if (i > 0) out->push_back('\n');
        AppendReply(r->element[i], out);
      }
      break;
    default:  // nil
      break;
  }
}

}  // namespace

absl::Status RedisClusterFixture::Available() {
  for (const char* name : {"redis-server", "redis-cli"}) {
    if (FindProgram(name).empty()) {
      return absl::NotFoundError(
          absl::StrCat(name,
                       " not found (in $KVTIER_REDIS_BIN_DIR, or on PATH, in "
                       "/usr/bin or /usr/sbin; apt-get install redis-server "
                       "redis-tools)"));
    }
  }
  return absl::OkStatus();
}

bool RedisClusterFixture::Required() {
  const char* v = std::getenv("KVTIER_REQUIRE_REDIS");
  return v != nullptr && std::string(v) == "1";
}

RedisClusterFixture::RedisClusterFixture(RedisClusterConfig config)
    : config_(std::move(config)),
      password_(RandomHex(12)),
      admin_password_(RandomHex(12)) {}

RedisClusterFixture::~RedisClusterFixture() { Stop(); }

std::string RedisClusterFixture::Address(int i) const {
  return absl::StrCat(nodes_[i].placement.bind_address, ":", nodes_[i].port);
}

std::string RedisClusterFixture::Seeds() const {
  std::vector<std::string> all;
  for (int i = 0; i < size(); ++i) all.push_back(Address(i));
  return absl::StrJoin(all, ",");
}

std::string RedisClusterFixture::LogTail(int i, size_t max_bytes) const {
  std::ifstream in(nodes_[i].dir + "/redis.log");
  std::stringstream ss;
  ss << in.rdbuf();
  std::string all = ss.str();
  return all.size() > max_bytes ? all.substr(all.size() - max_bytes) : all;
}

absl::Status RedisClusterFixture::Start() {
  if (absl::Status s = Available(); !s.ok()) return s;
  if (!nodes_.empty()) return absl::FailedPreconditionError("started twice");
  if (config_.masters < 3) {
    return absl::InvalidArgumentError(
        "masters: redis-cli --cluster create needs at least 3");
  }
  server_path_ = FindProgram("redis-server");
  cli_path_ = FindProgram("redis-cli");
  const char* tmp = std::getenv("TMPDIR");
  std::string templ =
      absl::StrCat(tmp && *tmp ? tmp : "/tmp", "/kvtier-redis-cluster-XXXXXX");
  if (mkdtemp(templ.data()) == nullptr) {
    return absl::InternalError(absl::StrCat("mkdtemp ", templ, " failed"));
  }
  root_ = templ;

  const int total = config_.masters * (1 + config_.replicas);
  std::set<int> taken;
  for (int i = 0; i < total; ++i) {
    Node node;
    if (config_.placement) node.placement = config_.placement(i);
    absl::StatusOr<int> port = PickPort(taken);
    if (!port.ok()) return port.status();
    node.port = *port;
    taken.insert(*port);
    taken.insert(*port + kBusPortOffset);
    node.dir = absl::StrCat(root_, "/node", i);
    std::filesystem::create_directories(node.dir);
    std::ofstream conf(node.dir + "/redis.conf");
    conf << "port " << node.port << "\n"
         << "bind " << node.placement.bind_address << "\n"
         << "protected-mode no\n"
         << "daemonize no\n"
         << "dir " << node.dir << "\n"
         << "logfile " << node.dir << "/redis.log\n"
         << "cluster-enabled yes\n"
         << "cluster-config-file nodes.conf\n"
         << "cluster-node-timeout "
         << absl::ToInt64Milliseconds(config_.node_timeout) << "\n"
         << "cluster-require-full-coverage no\n"
         // A replica may take over however stale its data (tests kill
         // masters right after writing).
         << "cluster-replica-validity-factor 0\n"
         << "appendonly no\n"
         << "save \"\"\n"
         << "maxmemory " << config_.maxmemory << "\n"
         << "maxmemory-policy allkeys-lru\n"
         << "repl-diskless-sync yes\n"
         << "repl-diskless-sync-delay 0\n"
         << "masterauth " << admin_password_ << "\n"
         << "user default on >" << admin_password_ << " ~* &* +@all\n"
         << "user " << config_.user << " on >" << password_ << " resetkeys ~"
         << config_.key_pattern << " " << kDaemonAcl << "\n";
    for (const std::string& line : config_.extra_config) conf << line << "\n";
    conf.close();
    if (!conf) return absl::InternalError("cannot write " + node.dir);
    nodes_.push_back(std::move(node));
  }
  for (int i = 0; i < total; ++i) {
    if (absl::Status s = StartNode(i); !s.ok()) return s;
  }
  for (int i = 0; i < total; ++i) {
    if (absl::Status s = WaitPing(i); !s.ok()) return s;
  }

  std::vector<std::string> create = {cli_path_, "--cluster", "create"};
  for (int i = 0; i < total; ++i) create.push_back(Address(i));
  for (std::string a :
       {std::string("--cluster-replicas"), absl::StrCat(config_.replicas),
        std::string("--cluster-yes"), std::string("--no-auth-warning"),
        std::string("-a"), admin_password_}) {
    create.push_back(std::move(a));
  }
  Ran ran = RunCapture(create, absl::Minutes(2));
  if (ran.rc != 0) {
    return absl::InternalError(absl::StrCat(
        "redis-cli --cluster create exited ", ran.rc, ":\n", ran.out));
  }
  if (absl::Status s = WaitHealthy(); !s.ok()) return s;
  if (config_.replicas > 0) return WaitReplicasSynced();
  return absl::OkStatus();
}

absl::Status RedisClusterFixture::StartNode(int i) {
  Node& node = nodes_[i];
  if (node.pid > 0) return absl::FailedPreconditionError("node running");
  std::vector<std::string> argv = node.placement.command_prefix;
  argv.push_back(server_path_);
  argv.push_back(node.dir + "/redis.conf");
  int out = open((node.dir + "/stdout.log").c_str(),
                 O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (out < 0) return absl::InternalError("cannot open stdout.log");
  node.pid = Spawn(argv, out);
  close(out);
  if (node.pid < 0) return absl::InternalError("fork failed");
  return absl::OkStatus();
}

absl::Status RedisClusterFixture::WaitPing(int i) {
  absl::Status last;
  for (int poll = 0; poll < 400; ++poll) {
    int status = 0;
    if (waitpid(nodes_[i].pid, &status, WNOHANG) == nodes_[i].pid) {
      nodes_[i].pid = -1;
      return absl::InternalError(
          absl::StrCat("redis-server ", Address(i), " exited:\n", LogTail(i)));
    }
    absl::StatusOr<std::string> pong = Command(i, {"PING"});
    if (pong.ok() && *pong == "PONG") return absl::OkStatus();
    last = pong.status();
    absl::SleepFor(absl::Milliseconds(25));
  }
  return absl::DeadlineExceededError(absl::StrCat(
      "node ", Address(i), " never answered PING: ", last.ToString(), "\n",
      LogTail(i)));
}

void RedisClusterFixture::Stop() {
  for (Node& node : nodes_) {
    if (node.pid <= 0) continue;
    kill(node.pid, SIGKILL);
    while (waitpid(node.pid, nullptr, 0) < 0 && errno == EINTR) {
    }
    node.pid = -1;
  }
  if (!root_.empty()) {
    std::error_code ignored;
    std::filesystem::remove_all(root_, ignored);
    root_.clear();
  }
}

absl::Status RedisClusterFixture::Kill(int i) {
  if (nodes_[i].pid <= 0) return absl::FailedPreconditionError("not running");
  kill(nodes_[i].pid, SIGKILL);
  while (waitpid(nodes_[i].pid, nullptr, 0) < 0 && errno == EINTR) {
  }
  nodes_[i].pid = -1;
  return absl::OkStatus();
}

absl::Status RedisClusterFixture::Pause(int i) {
  if (nodes_[i].pid <= 0) return absl::FailedPreconditionError("not running");
  kill(nodes_[i].pid, SIGSTOP);
  return absl::OkStatus();
}

absl::Status RedisClusterFixture::Resume(int i) {
  if (nodes_[i].pid <= 0) return absl::FailedPreconditionError("not running");
  kill(nodes_[i].pid, SIGCONT);
  return absl::OkStatus();
}

absl::Status RedisClusterFixture::Restart(int i) {
  if (absl::Status s = StartNode(i); !s.ok()) return s;
  return WaitPing(i);
}

absl::StatusOr<std::string> RedisClusterFixture::Command(
    int i, const std::vector<std::string>& argv) {
  timeval connect_tv{1, 0};
  std::unique_ptr<redisContext, void (*)(redisContext*)> c(
      redisConnectWithTimeout(nodes_[i].placement.bind_address.c_str(),
                              nodes_[i].port, connect_tv),
      redisFree);
  if (c == nullptr) return absl::ResourceExhaustedError("redisContext");
  if (c->err) {
    return absl::UnavailableError(
        absl::StrCat("connect ", Address(i), ": ", c->errstr));
  }
  timeval io_tv{10, 0};
  redisSetTimeout(c.get(), io_tv);
  auto run =
      [&](const std::vector<std::string>& args) -> absl::StatusOr<std::string> {
    std::vector<const char*> ptrs;
    std::vector<size_t> lens;
    for (const std::string& a : args) {
      ptrs.push_back(a.data());
      lens.push_back(a.size());
    }
    std::unique_ptr<redisReply, void (*)(void*)> r(
        static_cast<redisReply*>(redisCommandArgv(
            c.get(), static_cast<int>(args.size()), ptrs.data(), lens.data())),
        freeReplyObject);
    if (r == nullptr) {
      return absl::UnavailableError(
          absl::StrCat(Address(i), " ", args[0], ": ", c->errstr));
    }
    if (r->type == REDIS_REPLY_ERROR) {
      return absl::InternalError(absl::StrCat(Address(i), " ", args[0], ": ",
                                              std::string(r->str, r->len)));
    }
    std::string out;
    AppendReply(r.get(), &out);
    return out;
  };
  absl::StatusOr<std::string> auth = run({"AUTH", admin_password_});
  if (!auth.ok()) return auth.status();
  return run(argv);
}

}  // namespace kvtier::testing
