// The device pool without a GPU: (1) with --device_pool_bytes off (the
// default) a real kvtierd serving attaches and lookups never maps a CUDA
// library (/proc/<pid>/maps), so it cannot have created a CUDA context;
// (2) with it on where no CUDA driver can be loaded, kvtierd refuses to
// start instead of running without the pool; (3) TierCore's device tier
// (Reserve/Commit/Lookup/Release of device slots, eviction, session end,
// the slots a force-dropped namespace's live engine holds), driven through
// a pool export that needs no GPU: the core only indexes slots, the memory
// is the daemon main's.
#include <dirent.h>
#include <dlfcn.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "daemon/tier_core.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/daemon_process.h"

namespace kvtier::client {
namespace {

using ::testing::HasSubstr;

// The pid of the kvtierd whose command line names `socket` (DaemonProcess
// keeps its child's pid to itself).
pid_t FindDaemon(const std::string& socket) {
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in(e.path() / "cmdline", std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    if (ss.str().find("kvtierd") != std::string::npos &&
        ss.str().find("--socket=" + socket) != std::string::npos) {
      return static_cast<pid_t>(std::stol(name));
    }
  }
  return -1;
}

std::string Maps(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/maps"));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(DevicePoolDaemon, FlagOffLoadsNoCuda) {
  testing::DaemonProcess daemon;
  ASSERT_TRUE(daemon.Start({"--metrics_address="}).ok());
  const pid_t pid = FindDaemon(daemon.socket());
  ASSERT_GT(pid, 0);
  // Serve real traffic first: attach a hybrid namespace, reserve, commit,
  // look up.
  auto client = Client::Connect(
      {.socket = daemon.socket(), .client_name = "device-pool-test"});
  ASSERT_TRUE(client.ok()) << client.status();
  Layout layout;
  layout.model = "m";
  layout.num_layers = 1;
  layout.page_banks = {{"kv", 4096, "bf16"}};
  layout.snapshot_row_bytes = 8192;
  auto ns =
      (*client)->Attach({.name = "dp",
                         .layout = layout,
                         .capacity = {.page_rows = 16, .snapshot_rows = 4},
                         .register_with_cuda = false});
  ASSERT_TRUE(ns.ok()) << ns.status();
  EXPECT_TRUE((*ns)->device_pools().empty());
  EXPECT_FALSE((*ns)->device_pools_valid());
  EXPECT_EQ((*ns)->Reserve(0, 0, 1, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::string hashes((*ns)->hasher().hash_bytes() * 2, 'x');
  hashes[0] = 'a';
  auto res = (*ns)->Reserve(2, 1);
  ASSERT_TRUE(res.ok()) << res.status();
  ASSERT_TRUE(res->Commit("", hashes,
                          {{0, hashes.substr((*ns)->hasher().hash_bytes())}})
                  .ok());
  auto lease = (*ns)->Lookup(hashes);
  ASSERT_TRUE(lease.ok());
  EXPECT_EQ(lease->usable_pages(), 2u);
  EXPECT_EQ((*ns)->LookupWithDevice(hashes, 0).status().code(),
            absl::StatusCode::kInvalidArgument);

  const std::string maps = Maps(pid);
  ASSERT_THAT(maps, HasSubstr("kvtierd"));  // We read the right process.
  EXPECT_EQ(maps.find("libcuda"), std::string::npos) << maps;
  EXPECT_EQ(maps.find("libcudart"), std::string::npos) << maps;
  EXPECT_EQ(maps.find("libnvidia"), std::string::npos) << maps;
  // No CUDA device file is open either (a context opens /dev/nvidia*).
  for (const auto& fd : std::filesystem::directory_iterator(
           absl::StrCat("/proc/", pid, "/fd"))) {
    std::error_code ec;
    const auto target = std::filesystem::read_symlink(fd.path(), ec);
    EXPECT_EQ(target.string().find("/dev/nvidia"), std::string::npos);
  }
  ASSERT_TRUE(daemon.Stop().ok());
}

TEST(DevicePoolDaemon, FlagOnWithoutDriverRefusesToStart) {
  if (void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL)) {
    dlclose(h);
    GTEST_SKIP() << "a CUDA driver is installed: the GPU tests cover this";
  }
  char tmpl[] = "/tmp/kvtier-devpool-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  auto daemon = testing::Child::Spawn(testing::DaemonCommand(
      {testing::ResolveProgram(KVTIER_KVTIERD_PATH, "daemon/kvtierd"),
       "--socket=" + dir + "/kvtierd.sock", "--shm_dir=" + dir,
       "--metrics_address=", "--device_pool_bytes=1048576",
       "--device_pool_row_bytes=4096"}));
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  auto rc = daemon->Wait(absl::Seconds(20));
  ASSERT_TRUE(rc.ok()) << rc.status();
  EXPECT_EQ(*rc, 2);  // Refused (the flag's error), not serving without it.
  EXPECT_FALSE(std::filesystem::exists(dir + "/kvtierd.sock"));
  std::filesystem::remove_all(dir);
}

// ---------------------------------------------------------------- core --

class DevicePoolCoreTest : public ::testing::Test {
 protected:
  static constexpr uint32_t kHashBytes = 32;
  void SetUp() override {
    char tmpl[] = "/dev/shm/kvtier-devpool-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    daemon::TierOptions o;
    o.segments.shm_dir = dir_;
    o.segments.huge_pages = shm::HugePagePolicy::kOff;
    daemon::DevicePoolExport e;
    e.device_ordinal = 0;
    e.ipc_handle = std::string(64, '\1');
    e.rows = 2;
    e.row_bytes = 8192;
    e.row_stride = 8192;
    o.device_pools.push_back(e);
    core_ = std::make_unique<daemon::TierCore>(o);
    v1::Hello hello;
    auto id = core_->OpenSession(hello, daemon::PeerInfo{});
    ASSERT_TRUE(id.ok());
    session_ = *id;
    v1::AttachRequest req;
    req.set_session_id(session_);
    req.set_namespace_("hybrid");
    auto* l = req.mutable_layout();
    l->set_model("m");
    l->set_tokens_per_page(16);
    l->set_num_layers(1);
    auto* kv = l->add_page_banks();
    kv->set_name("kv");
    kv->set_row_bytes(1024);
    l->set_snapshot_row_bytes(4096);
    req.mutable_capacity()->set_page_rows(32);
    req.mutable_capacity()->set_snapshot_rows(8);
    v1::AttachResponse resp;
    ASSERT_TRUE(core_->Attach(req, &resp).ok());
    ns_ = resp.namespace_id();
    ASSERT_EQ(resp.device_pools_size(), 1);
    EXPECT_EQ(resp.device_pools(0).rows(), 2u);
    EXPECT_EQ(resp.device_pools(0).ipc_handle(), std::string(64, '\1'));
    EXPECT_EQ(resp.device_pools(0).kind(), "snapshot");
    std::mt19937_64 rng(7);
    chain_.resize(8 * kHashBytes);
    for (auto& c : chain_) c = static_cast<char>(rng());
  }
  void TearDown() override {
    core_.reset();
    std::filesystem::remove_all(dir_);
  }
  std::string Hash(int i) { return chain_.substr(i * kHashBytes, kHashBytes); }

  // Commits pages [0, n) with a host snapshot at page n-1 and, when
  // `device`, the same snapshot in a device slot.
  absl::StatusOr<v1::CommitResponse> Fill(int n, bool device,
                                          uint64_t session = 0,
                                          uint64_t ns = 0) {
    if (session == 0) session = session_;
    if (ns == 0) ns = ns_;
    v1::ReserveRequest rq;
    rq.set_session_id(session);
    rq.set_namespace_id(ns);
    rq.set_pages(n);
    rq.set_snapshots(1);
    rq.set_device_snapshots(device ? 1 : 0);
    v1::ReserveResponse rr;
    if (absl::Status s = core_->Reserve(rq, &rr); !s.ok()) return s;
    v1::CommitRequest cq;
    cq.set_session_id(session);
    cq.set_namespace_id(ns);
    cq.set_reservation_id(rr.reservation_id());
    cq.set_hashes(chain_.substr(0, n * kHashBytes));
    auto* p = cq.add_snapshots();
    p->set_index(0);
    p->set_hash(Hash(n - 1));
    if (device) {
      auto* d = cq.add_device_snapshots();
      d->set_index(0);
      d->set_hash(Hash(n - 1));
    }
    v1::CommitResponse cr;
    if (absl::Status s = core_->Commit(cq, &cr); !s.ok()) return s;
    return cr;
  }
  v1::LookupResponse Lookup(int n, bool pin, bool device) {
    v1::LookupRequest req;
    req.set_session_id(session_);
    req.set_namespace_id(ns_);
    req.set_hashes(chain_.substr(0, n * kHashBytes));
    req.set_pin(pin);
    if (device) req.set_device_pool(0);
    v1::LookupResponse resp;
    absl::Status s = core_->Lookup(req, &resp);
    EXPECT_TRUE(s.ok()) << s;
    return resp;
  }

  // A session of an engine whose process is `pid` (the daemon watches it),
  // attached to the hybrid namespace `name`; its id in *ns.
  uint64_t OpenEngine(const std::string& name, pid_t pid, uint64_t* ns) {
    auto id = core_->OpenSession(v1::Hello(), daemon::PeerInfo{});
    EXPECT_TRUE(id.ok()) << id.status();
    daemon::PeerInfo peer;
    peer.pid = pid;
    peer.uid = getuid();
    peer.gid = getgid();
    peer.verified = true;
    EXPECT_TRUE(core_->BindPeerCredentials(*id, peer).ok());
    v1::AttachRequest req;
    req.set_session_id(*id);
    req.set_namespace_(name);
    auto* l = req.mutable_layout();
    l->set_model("m");
    l->set_tokens_per_page(16);
    l->set_num_layers(1);
    l->add_page_banks()->set_name("kv");
    l->mutable_page_banks(0)->set_row_bytes(1024);
    l->set_snapshot_row_bytes(4096);
    req.mutable_capacity()->set_page_rows(32);
    req.mutable_capacity()->set_snapshot_rows(8);
    v1::AttachResponse resp;
    absl::Status s = core_->Attach(req, &resp);
    EXPECT_TRUE(s.ok()) << s;
    *ns = resp.namespace_id();
    return *id;
  }
  // Reserves `slots` device slots (and nothing else) for `session`.
  absl::StatusOr<v1::ReserveResponse> ReserveSlots(uint64_t session,
                                                   uint64_t ns,
                                                   uint32_t slots) {
    v1::ReserveRequest rq;
    rq.set_session_id(session);
    rq.set_namespace_id(ns);
    rq.set_device_snapshots(slots);
    v1::ReserveResponse rr;
    if (absl::Status s = core_->Reserve(rq, &rr); !s.ok()) return s;
    return rr;
  }
  absl::Status ForceDrop(const std::string& name) {
    v1::DropRequest drop;
    drop.set_namespace_(name);
    drop.set_force(true);
    v1::DropResponse resp;
    return core_->Drop(drop, &resp);
  }

  std::string dir_;
  std::unique_ptr<daemon::TierCore> core_;
  uint64_t session_ = 0;
  uint64_t ns_ = 0;
  std::string chain_;
};

// A pool's IPC handle maps all of its GPU memory: it goes only to sessions
// of the namespaces the pool serves (kvtierd --device_pool_namespaces).
TEST(DevicePoolCore, HandlesAreWithheldFromOtherNamespacesSessions) {
  char tmpl[] = "/dev/shm/kvtier-devpool-acl-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  {
    daemon::TierOptions o;
    o.segments.shm_dir = dir;
    o.segments.huge_pages = shm::HugePagePolicy::kOff;
    daemon::DevicePoolExport e;
    e.ipc_handle = std::string(64, '\1');
    e.rows = 2;
    e.row_bytes = 8192;
    e.row_stride = 8192;
    o.device_pools.push_back(e);
    o.device_pool_namespaces = {"served", "team-*"};
    daemon::TierCore core(o);
    auto attach = [&](const std::string& name, v1::AttachResponse* resp) {
      auto id = core.OpenSession(v1::Hello(), daemon::PeerInfo{});
      EXPECT_TRUE(id.ok());
      v1::AttachRequest req;
      req.set_session_id(*id);
      req.set_namespace_(name);
      auto* l = req.mutable_layout();
      l->set_model("m");
      l->set_tokens_per_page(16);
      l->set_num_layers(1);
      l->add_page_banks()->set_name("kv");
      l->mutable_page_banks(0)->set_row_bytes(1024);
      l->set_snapshot_row_bytes(4096);
      req.mutable_capacity()->set_page_rows(8);
      req.mutable_capacity()->set_snapshot_rows(4);
      EXPECT_TRUE(core.Attach(req, resp).ok());
      return *id;
    };
    for (const std::string name : {"served", "team-a"}) {
      v1::AttachResponse resp;
      attach(name, &resp);
      ASSERT_EQ(resp.device_pools_size(), 1);
      EXPECT_FALSE(resp.device_pools(0).withheld()) << name;
      EXPECT_EQ(resp.device_pools(0).ipc_handle(), std::string(64, '\1'));
    }
    v1::AttachResponse other;
    const uint64_t session = attach("other", &other);
    ASSERT_EQ(other.device_pools_size(), 1) << "indices stay the daemon's";
    EXPECT_TRUE(other.device_pools(0).withheld());
    EXPECT_TRUE(other.device_pools(0).ipc_handle().empty());
    EXPECT_EQ(other.device_pools(0).rows(), 0u);
    // Nor can that session use the pool by its index.
    v1::ReserveRequest rq;
    rq.set_session_id(session);
    rq.set_namespace_id(other.namespace_id());
    rq.set_pages(1);
    rq.set_snapshots(1);
    rq.set_device_snapshots(1);
    v1::ReserveResponse rr;
    absl::Status reserved = core.Reserve(rq, &rr);
    EXPECT_EQ(reserved.code(), absl::StatusCode::kPermissionDenied);
    EXPECT_THAT(reserved.message(), HasSubstr("does not serve namespace"));
    v1::LookupRequest lq;
    lq.set_session_id(session);
    lq.set_namespace_id(other.namespace_id());
    lq.set_hashes(std::string(32, 'h'));
    lq.set_device_pool(0);
    v1::LookupResponse lr;
    EXPECT_EQ(core.Lookup(lq, &lr).code(), absl::StatusCode::kPermissionDenied);
    EXPECT_TRUE(core.CheckInvariants().ok());
  }
  std::filesystem::remove_all(dir);
}

TEST_F(DevicePoolCoreTest, LookupServesTheDeviceCopyOfTheUsableSnapshot) {
  auto c = Fill(4, /*device=*/true);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->committed_device_snapshots(), 1u);
  auto r = Lookup(8, /*pin=*/true, /*device=*/true);
  EXPECT_EQ(r.usable_pages(), 4u);
  EXPECT_TRUE(r.has_snapshot());
  EXPECT_TRUE(r.has_device_snapshot());
  EXPECT_NE(r.lease_id(), 0u);
  // Without asking for the device pool: the host answer only.
  auto h = Lookup(8, false, false);
  EXPECT_EQ(h.usable_pages(), 4u);
  EXPECT_FALSE(h.has_device_snapshot());
  v1::ReleaseRequest rel;
  rel.set_session_id(session_);
  rel.set_namespace_id(ns_);
  rel.set_lease_id(r.lease_id());
  v1::ReleaseResponse rr;
  ASSERT_TRUE(core_->Release(rel, &rr).ok());
  EXPECT_TRUE(core_->CheckInvariants().ok());
}

TEST_F(DevicePoolCoreTest, DeviceEvictsFirstAndKeepsPinnedSlots) {
  ASSERT_TRUE(Fill(2, true).ok());
  auto pinned = Lookup(8, true, true);  // Pins the slot of page 1.
  ASSERT_TRUE(pinned.has_device_snapshot());
  ASSERT_TRUE(Fill(4, true).ok());  // Second slot.
  // Both slots are taken, one pinned: the third evicts the unpinned one
  // (page 3's) and the host tier keeps its copy.
  ASSERT_TRUE(Fill(6, true).ok());
  auto r = Lookup(4, false, true);
  EXPECT_EQ(r.usable_pages(), 4u);
  EXPECT_TRUE(r.has_snapshot());
  EXPECT_FALSE(r.has_device_snapshot());
  EXPECT_TRUE(Lookup(6, false, true).has_device_snapshot());
  // A fourth: the only unpinned committed slot is page 5's.
  ASSERT_TRUE(Fill(8, true).ok());
  EXPECT_TRUE(Lookup(2, false, true).has_device_snapshot());  // Pinned.
  EXPECT_FALSE(Lookup(6, false, true).has_device_snapshot());
  EXPECT_TRUE(Lookup(8, false, true).has_device_snapshot());
}

TEST_F(DevicePoolCoreTest, BadDeviceRequestsNameTheFieldAndChangeNothing) {
  v1::ReserveRequest rq;
  rq.set_session_id(session_);
  rq.set_namespace_id(ns_);
  rq.set_device_snapshots(1);
  rq.set_device_pool(3);
  v1::ReserveResponse rr;
  absl::Status s = core_->Reserve(rq, &rr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("device_pool"));
  rq.set_device_pool(0);
  rq.set_device_snapshots(3);
  s = core_->Reserve(rq, &rr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("device_snapshots"));
  v1::LookupRequest lq;
  lq.set_session_id(session_);
  lq.set_namespace_id(ns_);
  lq.set_hashes(chain_.substr(0, kHashBytes));
  lq.set_device_pool(1);
  v1::LookupResponse lr;
  s = core_->Lookup(lq, &lr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("device_pool"));
  // A commit placing a device slot the reservation lacks.
  rq.set_device_snapshots(0);
  rq.set_pages(1);
  ASSERT_TRUE(core_->Reserve(rq, &rr).ok());
  v1::CommitRequest cq;
  cq.set_session_id(session_);
  cq.set_namespace_id(ns_);
  cq.set_reservation_id(rr.reservation_id());
  cq.set_hashes(Hash(0));
  cq.add_device_snapshots()->set_index(0);
  v1::CommitResponse cr;
  s = core_->Commit(cq, &cr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("device_snapshots[0].index"));
  EXPECT_EQ(Lookup(1, false, false).matched_pages(), 0u);
  EXPECT_TRUE(core_->CheckInvariants().ok());
}

TEST_F(DevicePoolCoreTest, SessionEndReturnsSlotsAndKeepsCommittedOnes) {
  v1::Hello hello;
  auto other = core_->OpenSession(hello, daemon::PeerInfo{});
  ASSERT_TRUE(other.ok());
  v1::AttachRequest aq;
  aq.set_session_id(*other);
  aq.set_namespace_("hybrid");
  auto* l = aq.mutable_layout();
  l->set_model("m");
  l->set_tokens_per_page(16);
  l->set_num_layers(1);
  auto* kv = l->add_page_banks();
  kv->set_name("kv");
  kv->set_row_bytes(1024);
  l->set_snapshot_row_bytes(4096);
  v1::AttachResponse ar;
  ASSERT_TRUE(core_->Attach(aq, &ar).ok());
  // The other engine commits one device snapshot, then holds both slots
  // (one reserved, one pinned) and dies.
  ASSERT_TRUE(Fill(2, true, *other).ok());
  v1::ReserveRequest rq;
  rq.set_session_id(*other);
  rq.set_namespace_id(ns_);
  rq.set_device_snapshots(1);
  v1::ReserveResponse rr;
  ASSERT_TRUE(core_->Reserve(rq, &rr).ok());
  v1::LookupRequest lq;
  lq.set_session_id(*other);
  lq.set_namespace_id(ns_);
  lq.set_hashes(chain_.substr(0, 2 * kHashBytes));
  lq.set_pin(true);
  lq.set_device_pool(0);
  v1::LookupResponse lr;
  ASSERT_TRUE(core_->Lookup(lq, &lr).ok());
  ASSERT_TRUE(lr.has_device_snapshot());
  EXPECT_EQ(Fill(4, true).status().code(),
            absl::StatusCode::kResourceExhausted);
  core_->SessionGoodbye(*other, /*quiescent=*/true);  // A clean close.
  core_->CloseSession(*other);
  // What it committed survives it; its reservation and pin are gone.
  EXPECT_TRUE(Lookup(2, false, true).has_device_snapshot());
  ASSERT_TRUE(Fill(4, true).ok());
  EXPECT_TRUE(Lookup(4, false, true).has_device_snapshot());
  EXPECT_TRUE(core_->CheckInvariants().ok());
}

// A child that lives until killed: an engine process the daemon watches.
class EngineProcess {
 public:
  EngineProcess() : pid_(fork()) {
    if (pid_ == 0) {
      for (;;) pause();
    }
  }
  ~EngineProcess() { Kill(); }
  pid_t pid() const { return pid_; }
  void Kill() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

 private:
  pid_t pid_;
};

// Device slots are shared by every namespace a pool serves: a forced drop
// of namespace "a" must not hand the slots its live engine still copies
// into (a reservation) or out of (a lease) to namespace "hybrid" until that
// engine's instance is gone.
TEST_F(DevicePoolCoreTest, AForcedDropKeepsALiveEnginesSlotsUntilItIsGone) {
  EngineProcess engine;
  ASSERT_GT(engine.pid(), 0);
  uint64_t a_ns = 0;
  const uint64_t a = OpenEngine("a", engine.pid(), &a_ns);
  // Both slots: one committed and pinned by a lease, one reserved.
  ASSERT_TRUE(Fill(2, /*device=*/true, a, a_ns).ok());
  v1::LookupRequest lq;
  lq.set_session_id(a);
  lq.set_namespace_id(a_ns);
  lq.set_hashes(chain_.substr(0, 2 * kHashBytes));
  lq.set_pin(true);
  lq.set_device_pool(0);
  v1::LookupResponse lr;
  ASSERT_TRUE(core_->Lookup(lq, &lr).ok());
  ASSERT_TRUE(lr.has_device_snapshot());
  ASSERT_TRUE(ReserveSlots(a, a_ns, 1).ok());

  ASSERT_TRUE(ForceDrop("a").ok());
  EXPECT_EQ(ReserveSlots(session_, ns_, 1).status().code(),
            absl::StatusCode::kResourceExhausted)
      << "a slot of the dropped namespace's live engine was handed out";
  EXPECT_EQ(core_->SweepFences(), 0u);
  EXPECT_EQ(ReserveSlots(session_, ns_, 1).status().code(),
            absl::StatusCode::kResourceExhausted);
  // Its session ends without saying its work is done: still held.
  core_->CloseSession(a);
  core_->SweepFences();
  EXPECT_EQ(ReserveSlots(session_, ns_, 1).status().code(),
            absl::StatusCode::kResourceExhausted);
  // The engine is gone: both slots come back.
  engine.Kill();
  core_->SweepFences();
  auto both = ReserveSlots(session_, ns_, 2);
  ASSERT_TRUE(both.ok()) << both.status();
  EXPECT_TRUE(core_->CheckInvariants().ok());
}

// ...or until the engine confirms: a quiescent Goodbye says nothing it
// queued on the session's slots is pending any more.
TEST_F(DevicePoolCoreTest, AForcedDropFreesTheSlotsOnceTheEngineIsQuiescent) {
  EngineProcess engine;
  ASSERT_GT(engine.pid(), 0);
  uint64_t a_ns = 0;
  const uint64_t a = OpenEngine("a", engine.pid(), &a_ns);
  auto held = ReserveSlots(a, a_ns, 2);
  ASSERT_TRUE(held.ok()) << held.status();

  ASSERT_TRUE(ForceDrop("a").ok());
  core_->SweepFences();
  EXPECT_EQ(ReserveSlots(session_, ns_, 1).status().code(),
            absl::StatusCode::kResourceExhausted)
      << "a slot of the dropped namespace's live engine was handed out";
  core_->SessionGoodbye(a, /*quiescent=*/true);
  core_->CloseSession(a);
  auto both = ReserveSlots(session_, ns_, 2);
  ASSERT_TRUE(both.ok()) << both.status();
  EXPECT_TRUE(core_->CheckInvariants().ok());
}

}  // namespace
}  // namespace kvtier::client
