// The fixture of TierCore's fence tests (tier_fence_test.cc,
// tier_fence_access_test.cc): a core over a test folder, called directly,
// whose sessions are bound to the credentials a test names (as the engine
// socket binds the kernel's), with real child processes as their peers so
// that the fence can watch them, and restarts (a new core over the same
// folder that recovers) when the test gives it a state folder.
//
// Thread-safety: not thread-safe; one test thread drives it.
#ifndef KVTIER_DAEMON_TIER_FENCE_TEST_UTIL_H_
#define KVTIER_DAEMON_TIER_FENCE_TEST_UTIL_H_

#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/tier_core.h"
#include "gtest/gtest.h"

namespace kvtier::daemon::testing {

inline std::string RandomHashes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string out(n * 32, '\0');
  for (auto& c : out) c = static_cast<char>(rng());
  return out;
}

inline v1::Layout TestLayout() {
  v1::Layout l;
  l.set_model("fence-test");
  l.set_tokens_per_page(16);
  l.set_num_layers(1);
  auto* kv = l.add_page_banks();
  kv->set_name("kv");
  kv->set_row_bytes(256);
  return l;
}

// A child process that lives until killed: a peer whose pid the daemon can
// watch. With `new_pid_namespace` it is the first process of a pid
// namespace of its own (clone(CLONE_NEWPID): needs CAP_SYS_ADMIN; pid() is
// -1 when that was refused), its pid still visible from this one.
class Sleeper {
 public:
  explicit Sleeper(bool new_pid_namespace = false) {
    if (new_pid_namespace) {
      // Raw clone with no stack argument forks, into a new pid namespace.
      pid_ = static_cast<pid_t>(syscall(SYS_clone, CLONE_NEWPID | SIGCHLD,
                                        nullptr, nullptr, nullptr, nullptr));
    } else {
      pid_ = fork();
    }
    if (pid_ == 0) {
      for (;;) pause();
    }
  }
  ~Sleeper() { Kill(); }
  pid_t pid() const { return pid_; }
  void Kill() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

 private:
  pid_t pid_ = -1;
};

class TierFenceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/dev/shm/kvtier-fence-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    options_.segments.shm_dir = dir_;
    options_.segments.huge_pages = shm::HugePagePolicy::kOff;
    options_.fence.unseen_pid_hold = absl::Hours(1);
    Start();
  }
  void TearDown() override {
    core_.reset();
    std::filesystem::remove_all(dir_);
  }
  void Start() { core_ = std::make_unique<TierCore>(options_); }
  // With a state folder from now on: a new core that recovers. Fork the
  // test's Sleepers first: a child forked later keeps the folder's lock.
  void StartWithState() {
    options_.state_dir = dir_ + "/state";
    Restart();
  }
  // The daemon "restarts": a new core over the same folder recovers.
  void Restart() {
    core_.reset();
    Start();
    auto report = core_->Recover();
    ASSERT_TRUE(report.ok()) << report.status();
  }

  // Credentials as the kernel reports them (SO_PEERCRED) for process `pid`
  // of user `uid`.
  static PeerInfo Peer(pid_t pid, uid_t uid = getuid()) {
    PeerInfo p;
    p.pid = pid;
    p.uid = uid;
    p.gid = uid == getuid() ? getgid() : static_cast<gid_t>(uid);
    p.verified = true;
    return p;
  }
  // A session of instance `instance` (16 bytes; empty: its own) whose
  // credentials are `peer` when it is verified (else never bound), from
  // client connection `connection` (the same one after a reconnection).
  uint64_t OpenAs(const std::string& instance, const PeerInfo& peer,
                  uint64_t connection = 7) {
    v1::Hello hello;
    hello.set_client_name("engine");
    hello.set_instance_id(instance);
    hello.set_fence_version(1);
    hello.set_connection_id(connection);
    auto id = core_->OpenSession(hello, PeerInfo{});
    EXPECT_TRUE(id.ok()) << id.status();
    if (!id.ok()) return 0;
    if (peer.verified) {
      absl::Status s = core_->BindPeerCredentials(*id, peer);
      EXPECT_TRUE(s.ok()) << s;
    }
    return *id;
  }
  // OpenAs, bound to process `pid` of this user when pid > 0.
  uint64_t Open(const std::string& instance = "", pid_t pid = 0,
                uint64_t connection = 7) {
    return OpenAs(instance, pid > 0 ? Peer(pid) : PeerInfo{}, connection);
  }
  absl::StatusOr<uint64_t> TryAttach(uint64_t session, uint64_t rows = 16,
                                     const std::string& name = "ns") {
    v1::AttachRequest req;
    req.set_session_id(session);
    req.set_namespace_(name);
    *req.mutable_layout() = TestLayout();
    req.mutable_capacity()->set_page_rows(rows);
    v1::AttachResponse resp;
    absl::Status s = core_->Attach(req, &resp);
    if (!s.ok()) return s;
    return resp.namespace_id();
  }
  uint64_t Attach(uint64_t session, uint64_t rows = 16,
                  const std::string& name = "ns") {
    auto id = TryAttach(session, rows, name);
    EXPECT_TRUE(id.ok()) << id.status();
    return id.ok() ? *id : 0;
  }
  absl::StatusOr<v1::ReserveResponse> Reserve(uint64_t session, uint64_t ns,
                                              uint32_t pages) {
    v1::ReserveRequest req;
    req.set_session_id(session);
    req.set_namespace_id(ns);
    req.set_pages(pages);
    v1::ReserveResponse resp;
    absl::Status s = core_->Reserve(req, &resp);
    if (!s.ok()) return s;
    return resp;
  }
  // Reserves `pages` and aborts with fenced (queued writes may remain):
  // returns the hold, its rows in *rows.
  uint64_t FencedAbort(uint64_t session, uint64_t ns, uint32_t pages,
                       std::vector<uint32_t>* rows = nullptr) {
    auto r = Reserve(session, ns, pages);
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return 0;
    if (rows != nullptr)
      rows->assign(r->page_rows().begin(), r->page_rows().end());
    v1::AbortRequest abort;
    abort.set_session_id(session);
    abort.set_namespace_id(ns);
    abort.set_reservation_id(r->reservation_id());
    abort.set_fenced(true);
    v1::AbortResponse aborted;
    absl::Status s = core_->Abort(abort, &aborted);
    EXPECT_TRUE(s.ok()) << s;
    return aborted.fence_hold();
  }
  absl::Status Commit(uint64_t session, uint64_t ns, uint64_t reservation,
                      const std::string& hashes) {
    v1::CommitRequest req;
    req.set_session_id(session);
    req.set_namespace_id(ns);
    req.set_reservation_id(reservation);
    req.set_hashes(hashes);
    v1::CommitResponse resp;
    return core_->Commit(req, &resp);
  }
  absl::StatusOr<v1::LookupResponse> Lookup(uint64_t session, uint64_t ns,
                                            const std::string& hashes,
                                            bool pin) {
    v1::LookupRequest req;
    req.set_session_id(session);
    req.set_namespace_id(ns);
    req.set_hashes(hashes);
    req.set_pin(pin);
    v1::LookupResponse resp;
    absl::Status s = core_->Lookup(req, &resp);
    if (!s.ok()) return s;
    return resp;
  }
  absl::StatusOr<v1::FenceResponse> Fence(uint64_t session,
                                          v1::FenceRequest req) {
    req.set_session_id(session);
    v1::FenceResponse resp;
    absl::Status s = core_->Fence(req, &resp);
    if (!s.ok()) return s;
    return resp;
  }
  // Namespace `name` as Stats shows it (empty when there is none).
  v1::NamespaceInfo Info(const std::string& name = "ns") {
    v1::StatsResponse stats;
    EXPECT_TRUE(core_->Stats({}, &stats).ok());
    for (const auto& n : stats.namespaces()) {
      if (n.name() == name) return n;
    }
    return {};
  }
  static uint64_t Free(const v1::NamespaceInfo& n) {
    return n.banks_size() > 0 ? n.banks(0).free_rows() : 0;
  }
  void ExpectInvariants() {
    absl::Status s = core_->CheckInvariants();
    EXPECT_TRUE(s.ok()) << s;
  }

  std::string dir_;
  TierOptions options_;
  std::unique_ptr<TierCore> core_;
};

inline const std::string kInstance(16, 'i');
inline const std::string kOther(16, 'o');

}  // namespace kvtier::daemon::testing

#endif  // KVTIER_DAEMON_TIER_FENCE_TEST_UTIL_H_
