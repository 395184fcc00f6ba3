// A flood from one uid never locks another uid's engine out (issue 27, item
// 5), against a real kvtierd and real users.
//
// The daemon runs as root with --group=kvtier and a file limit of kDaemonFds
// (prlimit(2) once it runs, so that the flood needs a thousand connections,
// not a million). An attacker child (a member of
// the group) opens as many gRPC connections to the main socket as it can
// (each says the HTTP/2 preface, so it is a served connection, not one
// waiting for its handshake), as many sessions on the engine socket, and
// trickles Open frames a byte at a time; it reopens every connection the
// daemon closes until the test says stop. Meanwhile an engine child of
// another user connects with kvtier::client::Client, attaches, reserves,
// commits and looks its page up, and calls Stats over gRPC. Before, gRPC
// accepted every connection of any uid until the daemon ran out of file
// descriptors (and gRPC 1.51 then stops accepting for good), so the engine
// got neither socket. Now each uid has its own caps
// (--grpc_max_connections_per_uid,
// --fast_lookup_max_connections_per_uid, --max_sessions_per_uid) and the
// daemon's fds outlast them; the metrics show the gRPC cap refused the
// attacker, so the attack really happened.
//
// The test process creates no gRPC object (it forks): the engine's gRPC
// call runs in its child. Needs root (to create users and become them);
// skips otherwise with the reason, and fails instead with
// KVTIER_REQUIRE_USERS=1 or CI=true.
//
// Thread-safety: single-threaded test.
#include <grp.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "client/client.h"
#include "gmock/gmock.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "kvtier/v1/tier.grpc.pb.h"
#include "tests/daemon_process.h"
#include "tests/metrics_scrape.h"
#include "tests/raw_sockets.h"
#include "tests/test_pattern.h"
#include "tests/test_users.h"

namespace kvtier::testing {
namespace {

using client::Client;
using ::testing::HasSubstr;

constexpr char kGroup[] = "kvtier";
// The daemon's file limit: the flood below asks for more.
constexpr rlim_t kDaemonFds = 1024;
// What the attacker asks for.
constexpr int kGrpcFlood = 1500;
constexpr int kSessionFlood = 400;
constexpr int kTrickles = 64;

bool Required() {
  const char* ci = std::getenv("CI");
  return UsersRequired() || (ci != nullptr && std::string(ci) == "true");
}

// Writes `line` to pipe `fd`.
void WriteLine(int fd, const std::string& line) {
  size_t done = 0;
  while (done < line.size()) {
    const ssize_t w = ::write(fd, line.data() + done, line.size() - done);
    if (w <= 0) return;
    done += static_cast<size_t>(w);
  }
}

// The attacker's connections of one kind, reopened as the daemon closes
// them.
struct Flood {
  std::vector<int> fds;
  int opened = 0;  // Connections the daemon took at first.
  int closed = 0;  // Closes seen since.
};

// Opens a gRPC connection (preface said), an engine-socket session, or an
// Open whose v1.Hello never comes whole; -1 when the daemon would not take
// it. Gives up after a second (a daemon out of fds does not answer).
int OpenOne(int kind, const std::string& socket) {
  if (kind == 0) return RawHttp2Connection(socket, 1);
  const std::string lookup = socket + ".lookup";
  if (kind == 1) {
    RawSession s = OpenRawSession(lookup, "flood", 1);
    if (s.answered && s.reply.code == 0) return s.fd;
    if (s.fd >= 0) ::close(s.fd);
    return -1;
  }
  const int fd = DialUnix(lookup, 1);
  fastpath::Open open;
  open.hello_bytes = 60000;
  if (fd >= 0 && !SendAll(fd, &open, sizeof(open))) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// True once `stop` reads EOF (the test says stop).
bool Stopped(int stop, int wait_ms) {
  pollfd p{stop, POLLIN, 0};
  return ::poll(&p, 1, wait_ms) != 0;
}

// The attacker's body: opens its floods (sessions and trickled Opens first:
// they need the engine socket to accept, which it cannot once the gRPC
// flood has taken every fd of a daemon without caps), reports "READY grpc=G
// sessions=S trickles=T" on `report`, keeps them up (a byte more of each
// trickled Open per round) until `stop` reads EOF, then reports "DONE
// grpc_closed=..." and returns 0.
int Attack(const std::string& socket, int report, int stop) {
  constexpr int kOrder[3] = {1, 2, 0};
  const int sizes[3] = {kGrpcFlood, kSessionFlood, kTrickles};
  Flood floods[3];
  for (int k : kOrder) {
    // As many as it can: a few failures in a row say the daemon takes no
    // more (each may have waited its second).
    for (int i = 0, failed = 0; i < sizes[k] && failed < 3; ++i) {
      const int fd = OpenOne(k, socket);
      floods[k].fds.push_back(fd);
      failed = fd >= 0 ? 0 : failed + 1;
      if (fd >= 0) ++floods[k].opened;
    }
  }
  WriteLine(report, absl::StrCat("READY grpc=", floods[0].opened,
                                 " sessions=", floods[1].opened,
                                 " trickles=", floods[2].opened, "\n"));
  while (!Stopped(stop, 100)) {
    for (int k : kOrder) {
      // A kind the daemon refuses to connect at all waits for the next
      // round after one try.
      bool refused = false;
      for (int& fd : floods[k].fds) {
        const char zero = 0;
        const bool gone =
            fd < 0 || PeerClosed(fd, 0) || (k == 2 && !SendAll(fd, &zero, 1));
        if (!gone) continue;
        if (fd >= 0) {
          ::close(fd);
          ++floods[k].closed;
        }
        fd = -1;
        if (refused || Stopped(stop, 0)) continue;
        fd = OpenOne(k, socket);  // Keep the flood up.
        refused = fd < 0;
      }
    }
  }
  WriteLine(report, absl::StrCat("DONE grpc_closed=", floods[0].closed,
                                 " sessions_closed=", floods[1].closed,
                                 " trickles_closed=", floods[2].closed, "\n"));
  return 0;
}

// The engine's body: attaches, commits a page and finds it pinned over the
// engine socket, then calls Stats over gRPC; prints "MATCHED n" and
// "STATS ok".
int Engine(const std::string& socket, std::string* out) {
  auto client = Client::Connect({.socket = socket,
                                 .client_name = "flooded-engine",
                                 .timeout = absl::Seconds(20)});
  if (!client.ok()) {
    *out += "Connect: " + client.status().ToString() + "\n";
    return 10;
  }
  auto ns = (*client)->Attach(TestAttachOptions("flooded"));
  if (!ns.ok()) {
    *out += "Attach: " + ns.status().ToString() + "\n";
    return 11;
  }
  const std::string hashes = (*ns)->hasher().HashChain(TestTokens(5, 16));
  auto res = (*ns)->Reserve(1);
  if (!res.ok()) {
    *out += "Reserve: " + res.status().ToString() + "\n";
    return 12;
  }
  for (size_t b = 0; b < (*ns)->page_banks().size(); ++b) {
    const auto& bank = (*ns)->page_banks()[b];
    FillPattern(bank.base + uint64_t{res->page_rows()[0]} * bank.row_stride,
                bank.row_bytes, 5, 0, b);
  }
  if (auto c = res->Commit("", hashes); !c.ok()) {
    *out += "Commit: " + c.status().ToString() + "\n";
    return 13;
  }
  auto lease = (*ns)->Lookup(hashes, /*pin=*/true);
  if (!lease.ok()) {
    *out += "Lookup: " + lease.status().ToString() + "\n";
    return 14;
  }
  *out += absl::StrCat("MATCHED ", lease->matched_pages(), "\n");
  auto stub = v1::TierService::NewStub(grpc::CreateChannel(
      "unix:" + socket, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  v1::StatsRequest req;
  v1::StatsResponse resp;
  const grpc::Status s = stub->Stats(&ctx, req, &resp);
  if (!s.ok()) {
    *out +=
        absl::StrCat("Stats: ", s.error_code(), " ", s.error_message(), "\n");
    return 15;
  }
  *out += "STATS ok\n";
  return 0;
}

// A child running as a user and reporting on a pipe.
struct Attacker {
  pid_t pid = -1;
  int report = -1;
  std::string output;

  bool WaitFor(const std::string& prefix) {
    for (;;) {
      for (absl::string_view line : absl::StrSplit(output, '\n')) {
        if (absl::StartsWith(line, prefix) &&
            output.find('\n', line.data() - output.data()) !=
                std::string::npos) {
          return true;
        }
      }
      char buf[256];
      const ssize_t n = ::read(report, buf, sizeof(buf));
      if (n <= 0) return false;
      output.append(buf, static_cast<size_t>(n));
    }
  }
  int64_t Value(const std::string& prefix, const std::string& key) const {
    for (absl::string_view line : absl::StrSplit(output, '\n')) {
      if (!absl::ConsumePrefix(&line, prefix)) continue;
      for (absl::string_view field : absl::StrSplit(line, ' ')) {
        int64_t v = 0;
        if (absl::ConsumePrefix(&field, key + "=") &&
            absl::SimpleAtoi(field, &v)) {
          return v;
        }
      }
    }
    return -1;
  }
};

class UidFloodTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const std::string why = CannotCreateUsers(); !why.empty()) {
      if (Required()) FAIL() << why << " (KVTIER_REQUIRE_USERS=1 or CI=true)";
      GTEST_SKIP() << why;
    }
    auto g = EnsureGroup(kGroup);
    ASSERT_TRUE(g.ok()) << g.status();
    auto attacker = EnsureUser("kvtier-flood-a", kGroup);
    auto engine = EnsureUser("kvtier-flood-b", kGroup);
    ASSERT_TRUE(attacker.ok() && engine.ok())
        << attacker.status() << engine.status();
    attacker_ = *attacker;
    engine_ = *engine;
    // The attacker (forked from here) holds a connection per flood entry.
    rlimit rl{};
    ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &rl), 0);
    const rlim_t want = 2 * (kGrpcFlood + kSessionFlood + kTrickles);
    if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < want) rl.rlim_max = want;
    rl.rlim_cur = rl.rlim_max;
    ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &rl), 0) << strerror(errno);
    metrics_port_ = FreeLoopbackPort();
    ASSERT_NE(metrics_port_, 0);
    ASSERT_TRUE(daemon_
                    .Start({absl::StrCat("--group=", kGroup),
                            absl::StrCat("--metrics_address=127.0.0.1:",
                                         metrics_port_)})
                    .ok());
    // The running daemon gets a small file limit (the test keeps its own,
    // for the attacker it forks). Its pid is the engine socket's listener's
    // (SO_PEERCRED of a connection to it).
    const int probe = DialUnix(daemon_.socket() + ".lookup");
    ASSERT_GE(probe, 0);
    ucred daemon{};
    socklen_t len = sizeof(daemon);
    ASSERT_EQ(getsockopt(probe, SOL_SOCKET, SO_PEERCRED, &daemon, &len), 0);
    ::close(probe);
    const rlimit small{kDaemonFds, kDaemonFds};
    ASSERT_EQ(prlimit(daemon.pid, RLIMIT_NOFILE, &small, nullptr), 0)
        << strerror(errno);
    ASSERT_EQ(chmod(daemon_.dir().c_str(), 0755), 0);
    ASSERT_EQ(chmod(daemon_.shm_dir().c_str(), 0755), 0);
  }

  double Metric(const std::string& key) {
    auto body = HttpGet(metrics_port_, "/metrics");
    if (!body.ok()) {
      ADD_FAILURE() << body.status();
      return -1;
    }
    const auto samples = ParseMetrics(*body);
    auto it = samples.find(key);
    if (it == samples.end()) {
      ADD_FAILURE() << "no sample " << key;
      return -1;
    }
    return it->second;
  }

  DaemonProcess daemon_;
  User attacker_, engine_;
  int metrics_port_ = 0;
};

TEST_F(UidFloodTest, OneUidsFloodNeverLocksAnotherUidOut) {
  int stop[2];
  int report[2];
  ASSERT_EQ(pipe(stop), 0);
  ASSERT_EQ(pipe(report), 0);
  Attacker a;
  a.pid = ::fork();
  if (a.pid == 0) {
    ::close(stop[1]);
    ::close(report[0]);
    if (initgroups(attacker_.name.c_str(), attacker_.gid) != 0 ||
        setgid(attacker_.gid) != 0 || setuid(attacker_.uid) != 0) {
      _exit(120);
    }
    _exit(Attack(daemon_.socket(), report[1], stop[0]));
  }
  ::close(stop[0]);
  ::close(report[1]);
  a.report = report[0];
  ASSERT_GT(a.pid, 0);
  ASSERT_TRUE(a.WaitFor("READY")) << a.output;
  std::printf("attacker: %s", a.output.c_str());
  std::fflush(stdout);

  // The flood stays up (and reopens what the daemon closes) meanwhile.
  Outcome engine = RunAs(&engine_, [&](std::string* out) {
    return Engine(daemon_.socket(), out);
  });

  ::close(stop[1]);
  EXPECT_TRUE(a.WaitFor("DONE")) << a.output;
  int status = 0;
  ::waitpid(a.pid, &status, 0);
  ::close(a.report);
  // Read once the attacker has let go of the daemon's fds.
  const double grpc_refused =
      Metric("kvtier_grpc_connections_closed_total{reason=\"uid_cap\"}");
  std::printf("attacker: %s\nengine: exit %d\n%s", a.output.c_str(),
              engine.code, engine.output.c_str());
  std::printf("daemon refused %.0f gRPC connections at the per-uid cap\n",
              grpc_refused);
  ASSERT_EQ(engine.code, 0) << engine.output;
  EXPECT_THAT(engine.output, HasSubstr("MATCHED 1\n"));
  EXPECT_THAT(engine.output, HasSubstr("STATS ok\n"));
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  // The attack pressed the caps: more gRPC connections than its uid may
  // have, so the daemon refused some (and kept refusing the reopened ones).
  EXPECT_GT(a.Value("READY", "grpc"), 0) << a.output;
  EXPECT_GT(grpc_refused, 0);
}

}  // namespace
}  // namespace kvtier::testing
