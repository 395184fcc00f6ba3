// The sockets are never born open (issue 27, item 3), against a real kvtierd
// and real users.
//
// Under the unit kvtierd runs as its own user and group with UMask=0007, so
// a unix socket bound with plain bind(2) appears mode 0770 in the daemon's
// group: every engine user (a member of that group) may connect until the
// daemon narrows it. A connection made in that moment keeps whatever the
// socket grants for its whole life; on the operator socket that is every
// right. Here the daemon runs exactly that way (a `useradd` user, its group,
// umask 0007) under strace, which delays every chmod and chown family call
// by a second: the moment between a socket's bind and its final mode, if
// there is one, lasts a second at least. A racer (a member of the daemon's
// group, like any engine user) hammers the sockets it must not reach from
// before the daemon exists until each of them refuses it, and makes an
// operator call (Verify) on every connection it gets. Checked: it never
// connects to one of them, so no operator call gets through; an operator
// (root) then calls Verify on the same socket (the call itself works).
//
// The daemon starts only once the racer has found the socket missing
// (a gate file the racer creates), so the racer covers the whole start. No
// timing is asserted: the delays only widen a window that must not exist.
//
// The test process never creates a gRPC object (forking a process that runs
// gRPC threads is unsafe): the racer and the operator are forked children.
// Needs root, useradd, strace (ptrace) and setpriv; skips otherwise, and
// fails then with KVTIER_REQUIRE_USERS=1 (`make test`) or CI=true.
//
// Thread-safety: single-threaded test.
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/create_channel_posix.h"
#include "gtest/gtest.h"
#include "kvtier/v1/tier.grpc.pb.h"
#include "tests/daemon_process.h"
#include "tests/test_users.h"

namespace kvtier::testing {
namespace {

constexpr char kDaemonUser[] = "kvtier-birth-d";
constexpr char kDaemonGroup[] = "kvtier-birth";    // the unit's Group=kvtier
constexpr char kEngineGroup[] = "kvtier-birth-e";  // --group, case 2
constexpr char kOpsGroup[] = "kvtier-birth-ops";   // --admin_group, case 2
constexpr char kRacerUser[] = "kvtier-birth-m";

// The calls that can widen a freshly bound socket's mode or group. strace
// delays each by a second ("?": the ones this architecture lacks are
// skipped).
constexpr char kWidenCalls[] =
    "?chmod,?fchmodat,?fchmodat2,?chown,?fchownat,?lchown";

// What the racer saw on one socket.
struct Tally {
  int missing = 0;       // ENOENT / ECONNREFUSED: not there (yet)
  int connected = 0;     // connect(2) succeeded: the socket let it in
  int granted = 0;       // ... and Verify, an operator's call, succeeded
  bool refused = false;  // EACCES: its final mode is in place
};

// Connects to the unix socket `path`; returns the fd, or -1 with errno set.
int Connect(const std::string& path) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    const int err = errno;
    ::close(fd);
    errno = err;
    return -1;
  }
  return fd;
}

// Verify over the already connected `fd` (taken); "" when it succeeded,
// else the refusal.
std::string VerifyOver(int fd) {
  auto stub = v1::TierService::NewStub(
      grpc::CreateInsecureChannelFromFd("kvtierd", fd));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  v1::VerifyResponse resp;
  const grpc::Status s = stub->Verify(&ctx, v1::VerifyRequest(), &resp);
  return s.ok() ? "" : absl::StrCat(s.error_code(), " ", s.error_message());
}

// The racer's body: checks `paths` are all missing, opens the gate (the
// daemon starts), then connects to each in turn until every one has refused
// it (EACCES: its final mode is set and nothing widens it again), calling
// Verify on each connection it gets to an operator socket (".admin"). Reports a
// line per path; returns 0 when it never connected, 1 when it did, 2 when the
// start was not covered.
int Race(const std::vector<std::string>& paths, const std::string& gate,
         std::string* out) {
  for (const std::string& p : paths) {
    if (const int err = ConnectErrno(p); err != ENOENT) {
      *out +=
          absl::StrCat(p, " is there before the daemon: ", strerror(err), "\n");
      return 2;
    }
  }
  const int g = ::open(gate.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
  if (g < 0) {
    *out += absl::StrCat("gate ", gate, ": ", strerror(errno), "\n");
    return 2;
  }
  ::close(g);
  std::map<std::string, Tally> tally;
  size_t refused = 0;
  // A bound for a daemon that never comes up, not a measurement.
  const absl::Time give_up = absl::Now() + absl::Minutes(2);
  while (refused < paths.size()) {
    if (absl::Now() > give_up) {
      *out += "gave up: the daemon never closed every socket\n";
      return 2;
    }
    for (const std::string& p : paths) {
      Tally& t = tally[p];
      if (t.refused) continue;
      const int fd = Connect(p);
      if (fd >= 0) {
        ++t.connected;
        if (!absl::EndsWith(p, ".admin")) {
          ::close(fd);
        } else if (VerifyOver(fd).empty() && ++t.granted == 1) {
          *out += absl::StrCat("GRANTED: Verify on ", p, "\n");
        }
      } else if (errno == EACCES) {
        t.refused = true;
        ++refused;
      } else if (errno == ENOENT || errno == ECONNREFUSED) {
        ++t.missing;
      } else {
        *out += absl::StrCat("connect ", p, ": ", strerror(errno), "\n");
        return 2;
      }
    }
  }
  int reached = 0;
  for (const std::string& p : paths) {
    const Tally& t = tally[p];
    *out += absl::StrCat(p, ": missing ", t.missing, ", connected ",
                         t.connected, ", operator calls granted ", t.granted,
                         ", then refused\n");
    reached += t.connected;
  }
  return reached == 0 ? 0 : 1;
}

// Whether a missing prerequisite fails the test instead of skipping it.
bool Required() {
  const char* ci = std::getenv("CI");
  return UsersRequired() || (ci != nullptr && std::string(ci) == "true");
}

class SocketBirthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why = CannotCreateUsers();
    if (why.empty() && (Tool("strace").empty() || Tool("setpriv").empty())) {
      why = "strace or setpriv (util-linux) not installed";
    }
    if (why.empty()) {
      const Ran r = RunProgram({Tool("strace"), "-qq", "-o", "/dev/null", "-e",
                                "trace=none", "/bin/true"});
      if (r.rc != 0) why = "strace cannot trace here: " + r.out;
    }
    if (!why.empty()) {
      if (Required()) FAIL() << why << " (KVTIER_REQUIRE_USERS=1 or CI=true)";
      GTEST_SKIP() << why;
    }
    for (const char* g : {kDaemonGroup, kEngineGroup, kOpsGroup}) {
      auto gid = EnsureGroup(g);
      ASSERT_TRUE(gid.ok()) << gid.status();
      gids_[g] = *gid;
    }
    // The daemon may give its files to --group and --admin_group.
    auto d = EnsureUser(
        kDaemonUser,
        absl::StrCat(kDaemonGroup, ",", kEngineGroup, ",", kOpsGroup));
    ASSERT_TRUE(d.ok()) << d.status();
    daemon_user_ = *d;
    // An engine user: in the daemon's group, in neither of the others.
    auto m = EnsureUser(kRacerUser, kDaemonGroup);
    ASSERT_TRUE(m.ok()) << m.status();
    racer_ = *m;

    char tmpl[] = "/dev/shm/kvtier-birth-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    root_ = tmpl;
    ASSERT_EQ(chmod(root_.c_str(), 0711), 0);
    // Like /run/kvtier (tmpfiles.d): the daemon's, its group may enter.
    run_ = root_ + "/run";
    MakeDir(run_, daemon_user_.uid, gids_[kDaemonGroup], 0750);
    shm_ = root_ + "/shm";
    MakeDir(shm_, daemon_user_.uid, gids_[kDaemonGroup], 0750);
    // The racer's own folder, for the gate.
    gate_ = root_ + "/gate";
    MakeDir(gate_, racer_.uid, racer_.gid, 0700);
    gate_ += "/go";
  }

  void TearDown() override {
    daemon_.reset();
    if (!root_.empty()) {
      std::system(absl::StrCat("rm -rf '", root_, "'").c_str());
    }
  }

  void MakeDir(const std::string& path, uid_t uid, gid_t gid, mode_t mode) {
    ASSERT_EQ(mkdir(path.c_str(), 0700), 0) << path;
    ASSERT_EQ(chown(path.c_str(), uid, gid), 0) << path;
    ASSERT_EQ(chmod(path.c_str(), mode), 0) << path;
  }

  std::string Socket() const { return run_ + "/kvtierd.sock"; }

  // Starts kvtierd with `flags` as the unit would (its user, its group,
  // umask 0007) under strace, once the gate file exists.
  void StartGatedDaemon(const std::vector<std::string>& flags) {
    std::vector<std::string> argv = {
        "/bin/sh",
        "-c",
        "umask 0007; while [ ! -e \"$0\" ]; do sleep 0.01; done; "
        "exec \"$@\" 2>&1",
        gate_,
        Tool("strace"),
        "-f",
        "--seccomp-bpf",
        "-qq",
        "-o",
        root_ + "/strace.log",
        std::string("-e") + "trace=" + kWidenCalls,
        std::string("-e") + "inject=" + kWidenCalls + ":delay_enter=1s",
        "--",
        Tool("setpriv"),
        absl::StrCat("--reuid=", daemon_user_.uid),
        absl::StrCat("--regid=", gids_[kDaemonGroup]),
        "--init-groups",
        "--",
        ResolveProgram(KVTIER_KVTIERD_PATH, "daemon/kvtierd"),
        "--socket=" + Socket(),
        "--shm_dir=" + shm_,
        "--huge_pages=off",
        "--state_dir=none",
        "--metrics_address=",
        "--log_level=info"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    auto child = Child::Spawn(argv);
    ASSERT_TRUE(child.ok()) << child.status();
    daemon_ = std::make_unique<Child>(*std::move(child));
  }

  // As root, the operator: Verify on `admin` succeeds (the daemon is up and
  // the call the racer made is one an operator may make).
  void ExpectOperatorVerifies(const std::string& admin) {
    Outcome op = RunAs(nullptr, [&](std::string* out) {
      auto stub = v1::TierService::NewStub(grpc::CreateChannel(
          "unix:" + admin, grpc::InsecureChannelCredentials()));
      grpc::ClientContext ctx;
      ctx.set_wait_for_ready(true);
      ctx.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(60));
      v1::VerifyResponse resp;
      const grpc::Status s = stub->Verify(&ctx, v1::VerifyRequest(), &resp);
      *out += absl::StrCat("Verify: ", s.error_code(), " ", s.error_message(),
                           "\n");
      return s.ok() ? 0 : 1;
    });
    EXPECT_EQ(op.code, 0) << op.output;
  }

  // Races `paths` against a gated daemon started with `flags`.
  void RaceDaemonStart(const std::vector<std::string>& flags,
                       const std::vector<std::string>& paths) {
    StartGatedDaemon(flags);
    if (HasFatalFailure()) return;
    Outcome race = RunAs(
        &racer_, [&](std::string* out) { return Race(paths, gate_, out); });
    std::stringstream trace;
    trace << std::ifstream(root_ + "/strace.log").rdbuf();
    EXPECT_EQ(race.code, 0) << race.output << "strace (delayed calls):\n"
                            << trace.str();
    // The window was widened: strace did delay the daemon's calls.
    EXPECT_NE(trace.str().find("(DELAYED)"), std::string::npos) << trace.str();
    ExpectOperatorVerifies(paths.front());
    std::cout << "racer (" << racer_.name << "):\n"
              << race.output << "strace (delayed calls):\n"
              << trace.str();
  }

  std::map<std::string, gid_t> gids_;
  User daemon_user_, racer_;
  std::string root_, run_, shm_, gate_;
  std::unique_ptr<Child> daemon_;
};

// The unit's own set-up: no --group (engines are the daemon's group), no
// --admin_group (the operator socket is 0600). The racer, an engine user,
// may use the engine sockets but must never reach the operator socket.
TEST_F(SocketBirthTest, AnEngineUserNeverReachesTheOperatorSocketAtStart) {
  RaceDaemonStart({}, {Socket() + ".admin"});
}

// --group and --admin_group name groups the racer is not in: during the
// whole start it reaches none of the three sockets, though it is in the
// daemon's own group (which each socket has when bind makes it).
TEST_F(SocketBirthTest, NoSocketIsReachableBeforeItsGroupAndModeAreSet) {
  RaceDaemonStart({absl::StrCat("--group=", kEngineGroup),
                   absl::StrCat("--admin_group=", kOpsGroup)},
                  {Socket() + ".admin", Socket(), Socket() + ".lookup"});
}

}  // namespace
}  // namespace kvtier::testing
