// Tests of namespace creation and Drop outside TierCore's global lock
// (tier_attach.cc): while one Attach populates a namespace's banks, held at
// the "attach:populating" hook, the rest of the daemon answers; requests
// for the same name wait for it; a failed creation rolls back; and Recover
// removes the temporaries of killed segment creators.
//
// Every wait is bounded (kLiveness) so that a regression that blocks fails
// instead of hanging; no test asserts how long anything takes.
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "daemon/journal.h"
#include "daemon/tier_core.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "shm/segment.h"

namespace kvtier::daemon {
namespace {

using ::testing::HasSubstr;

constexpr absl::Duration kLiveness = absl::Seconds(30);

v1::Layout AttentionLayout() {
  v1::Layout l;
  l.set_model("test-model");
  l.set_tokens_per_page(16);
  l.set_num_layers(2);
  auto* kv = l.add_page_banks();
  kv->set_name("kv");
  kv->set_row_bytes(1024);
  auto* sc = l.add_page_banks();
  sc->set_name("scale");
  sc->set_row_bytes(100);
  return l;
}
constexpr uint64_t kPageRows = 64;
constexpr uint64_t kNamespaceBytes = kPageRows * (1024 + 112);

std::string RandomHashes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string out(n * 32, '\0');
  for (auto& c : out) c = static_cast<char>(rng());
  return out;
}

bool Exists(const std::string& path) {
  struct stat st;
  return lstat(path.c_str(), &st) == 0;
}

// Holds the first request that reaches hook point `point` (once armed)
// until released; notes when a request starts waiting for a pending name.
struct Gate {
  explicit Gate(std::string point) : point(std::move(point)) {}
  void operator()(const char* at) {
    if (at == point && armed.exchange(false)) {
      entered.Notify();
      // Bounded: a test that fails before releasing still ends.
      (void)release.WaitForNotificationWithTimeout(absl::Seconds(120));
    } else if (std::string(at) == "namespace:wait") {
      if (waits.fetch_add(1) == 0) waiting.Notify();
    }
  }
  void Release() {
    if (!release.HasBeenNotified()) release.Notify();
  }
  const std::string point;
  std::atomic<bool> armed{false};
  absl::Notification entered;
  absl::Notification release;
  std::atomic<int> waits{0};
  absl::Notification waiting;  // The first "namespace:wait".
};

// A request run on its own thread.
struct Async {
  template <typename F>
  explicit Async(F f)
      : thread([this, f = std::move(f)]() mutable {
          status = f();
          done.Notify();
        }) {}
  ~Async() {
    if (thread.joinable()) thread.join();
  }
  bool Finished() { return done.WaitForNotificationWithTimeout(kLiveness); }
  absl::Status status;
  absl::Notification done;
  std::thread thread;
};

class TierAttachTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/dev/shm/kvtier-attach-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    options_.segments.shm_dir = dir_;
    options_.segments.huge_pages = shm::HugePagePolicy::kOff;
    options_.default_namespace_bytes = 1 << 20;
    options_.namespace_budget_bytes = 64 << 20;
  }
  void TearDown() override {
    core_.reset();
    std::filesystem::remove_all(dir_);
  }

  // Makes the core with options_, the gate as its test hook.
  void Start(const std::string& gate_point = "attach:populating") {
    gate_ = std::make_unique<Gate>(gate_point);
    core_ = std::make_unique<TierCore>(options_);
    core_->SetTestHook([this](const char* point) { (*gate_)(point); });
  }

  uint64_t Open(uid_t uid = 0) {
    v1::Hello hello;
    hello.set_client_name("engine");
    auto id = core_->OpenSession(hello, PeerInfo{});
    EXPECT_TRUE(id.ok()) << id.status();
    if (uid != 0) {
      PeerInfo p;
      p.pid = 1000 + static_cast<pid_t>(uid);
      p.uid = uid;
      p.gid = uid;
      p.verified = true;
      EXPECT_TRUE(core_->BindPeerCredentials(*id, p).ok());
    }
    return *id;
  }

  absl::Status Attach(uint64_t session, const std::string& ns,
                      v1::AttachResponse* resp) {
    v1::AttachRequest req;
    req.set_session_id(session);
    req.set_namespace_(ns);
    *req.mutable_layout() = AttentionLayout();
    req.mutable_capacity()->set_page_rows(kPageRows);
    return core_->Attach(req, resp);
  }

  absl::Status Drop(const std::string& ns, bool force) {
    v1::DropRequest req;
    req.set_namespace_(ns);
    req.set_force(force);
    v1::DropResponse resp;
    return core_->Drop(req, &resp);
  }

  // The namespace `name` in Stats (nullptr: none).
  std::unique_ptr<v1::NamespaceInfo> Find(const std::string& name) {
    v1::StatsResponse stats;
    EXPECT_TRUE(core_->Stats(v1::StatsRequest(), &stats).ok());
    for (const auto& ns : stats.namespaces()) {
      if (ns.name() == name) return std::make_unique<v1::NamespaceInfo>(ns);
    }
    return nullptr;
  }

  std::string SegmentPath(const std::string& ns, const std::string& bank) {
    return absl::StrCat(dir_, "/kvtier.", ns, ".", bank, ".r0");
  }

  std::string dir_;
  TierOptions options_;
  std::unique_ptr<Gate> gate_;
  std::unique_ptr<TierCore> core_;
};

TEST_F(TierAttachTest, OtherRequestsProceedWhileANamespaceIsPopulated) {
  Start();
  // An attached namespace with two committed pages.
  const uint64_t s0 = Open();
  v1::AttachResponse small;
  ASSERT_TRUE(Attach(s0, "small", &small).ok());
  v1::ReserveRequest rreq;
  rreq.set_session_id(s0);
  rreq.set_namespace_id(small.namespace_id());
  rreq.set_pages(2);
  v1::ReserveResponse rresp;
  ASSERT_TRUE(core_->Reserve(rreq, &rresp).ok());
  const std::string hashes = RandomHashes(2, 7);
  v1::CommitRequest creq;
  creq.set_session_id(s0);
  creq.set_namespace_id(small.namespace_id());
  creq.set_reservation_id(rresp.reservation_id());
  creq.set_hashes(hashes);
  v1::CommitResponse cresp;
  ASSERT_TRUE(core_->Commit(creq, &cresp).ok());

  const uint64_t s1 = Open();
  const uint64_t s2 = Open();
  gate_->armed = true;
  v1::AttachResponse first, second;
  // Declared after the gate's release below: every thread ends first.
  std::unique_ptr<Async> creator, other, waiter;
  absl::Cleanup release = [&] {
    gate_->Release();
    creator.reset();
    other.reset();
    waiter.reset();
  };
  creator = std::make_unique<Async>([&] { return Attach(s1, "big", &first); });
  ASSERT_TRUE(gate_->entered.WaitForNotificationWithTimeout(kLiveness))
      << "the Attach of 'big' never reached attach:populating";

  // Held populating 'big': Stats and a lookup elsewhere are answered.
  TierCore::LookupOutcome looked;
  other = std::make_unique<Async>([&]() -> absl::Status {
    v1::StatsResponse stats;
    if (absl::Status s = core_->Stats(v1::StatsRequest(), &stats); !s.ok()) {
      return s;
    }
    return core_->LookupHashes(s0, small.namespace_id(), hashes,
                               /*pin=*/false, &looked);
  });
  ASSERT_TRUE(other->Finished())
      << "Stats or a lookup in another namespace blocked while 'big' was "
         "being populated";
  EXPECT_TRUE(other->status.ok()) << other->status;
  EXPECT_EQ(looked.matched_pages, 2u);

  // A second Attach of 'big' waits for the first.
  waiter = std::make_unique<Async>([&] { return Attach(s2, "big", &second); });
  ASSERT_TRUE(gate_->waiting.WaitForNotificationWithTimeout(kLiveness));
  EXPECT_FALSE(waiter->done.HasBeenNotified());
  EXPECT_FALSE(creator->done.HasBeenNotified());

  gate_->Release();
  ASSERT_TRUE(creator->Finished());
  ASSERT_TRUE(waiter->Finished());
  ASSERT_TRUE(creator->status.ok()) << creator->status;
  ASSERT_TRUE(waiter->status.ok()) << waiter->status;
  EXPECT_TRUE(first.created());
  EXPECT_FALSE(second.created());
  EXPECT_NE(first.namespace_id(), 0u);
  EXPECT_EQ(second.namespace_id(), first.namespace_id());
  ASSERT_EQ(second.segments_size(), first.segments_size());
  EXPECT_EQ(second.segments(0).path(), first.segments(0).path());
  auto big = Find("big");
  ASSERT_NE(big, nullptr);
  EXPECT_EQ(big->sessions(), 2u);
  EXPECT_TRUE(core_->CheckInvariants().ok());
}

TEST_F(TierAttachTest, SessionClosedWhilePopulatingLeavesTheNamespace) {
  Start();
  const uint64_t s1 = Open();
  gate_->armed = true;
  v1::AttachResponse resp;
  std::unique_ptr<Async> creator, closer;
  absl::Cleanup release = [&] {
    gate_->Release();
    creator.reset();
    closer.reset();
  };
  creator = std::make_unique<Async>([&] { return Attach(s1, "big", &resp); });
  ASSERT_TRUE(gate_->entered.WaitForNotificationWithTimeout(kLiveness));
  closer = std::make_unique<Async>([&] {
    core_->CloseSession(s1);
    return absl::OkStatus();
  });
  ASSERT_TRUE(closer->Finished()) << "CloseSession blocked on the creation";
  gate_->Release();
  ASSERT_TRUE(creator->Finished());
  EXPECT_EQ(creator->status.code(), absl::StatusCode::kNotFound)
      << creator->status;
  EXPECT_THAT(std::string(creator->status.message()),
              HasSubstr("closed while namespace 'big' was being created"));
  // Created, with nobody attached: a plain Drop removes it.
  auto big = Find("big");
  ASSERT_NE(big, nullptr);
  EXPECT_EQ(big->sessions(), 0u);
  EXPECT_TRUE(core_->CheckInvariants().ok());
  EXPECT_TRUE(Drop("big", /*force=*/false).ok());
  EXPECT_FALSE(Exists(SegmentPath("big", "kv")));
}

TEST_F(TierAttachTest, DropWaitsForTheCreation) {
  Start();
  const uint64_t s1 = Open();
  gate_->armed = true;
  v1::AttachResponse resp;
  std::unique_ptr<Async> creator, dropper;
  absl::Cleanup release = [&] {
    gate_->Release();
    creator.reset();
    dropper.reset();
  };
  creator = std::make_unique<Async>([&] { return Attach(s1, "big", &resp); });
  ASSERT_TRUE(gate_->entered.WaitForNotificationWithTimeout(kLiveness));
  dropper = std::make_unique<Async>([&] { return Drop("big", false); });
  ASSERT_TRUE(gate_->waiting.WaitForNotificationWithTimeout(kLiveness));
  EXPECT_FALSE(dropper->done.HasBeenNotified());
  gate_->Release();
  ASSERT_TRUE(creator->Finished());
  ASSERT_TRUE(dropper->Finished());
  EXPECT_TRUE(creator->status.ok()) << creator->status;
  // It dropped what was created, which has the creator attached.
  EXPECT_EQ(dropper->status.code(), absl::StatusCode::kFailedPrecondition)
      << dropper->status;
  EXPECT_THAT(std::string(dropper->status.message()),
              HasSubstr("1 attached sessions"));
  EXPECT_TRUE(Drop("big", /*force=*/true).ok());
  EXPECT_EQ(Find("big"), nullptr);
}

TEST_F(TierAttachTest, FailedCreationRollsBackAndFailsItsWaiters) {
  options_.uid_budget_bytes = kNamespaceBytes;  // One namespace per uid.
  Start();
  // 'big''s scale bank exists with other rows: its creation fails there,
  // after making the kv bank.
  shm::SegmentSpec spec;
  spec.file_name = "kvtier.big.scale.r0";
  spec.namespace_name = "big";
  spec.bank = "scale";
  spec.rows = 7;
  spec.row_bytes = 100;
  ASSERT_TRUE(shm::Segment::Create(spec, options_.segments).ok());

  const uint64_t s1 = Open(1001);
  const uint64_t s2 = Open(1002);
  const uint64_t s3 = Open(1001);
  gate_->armed = true;
  v1::AttachResponse first, second, third;
  std::unique_ptr<Async> creator, waiter;
  absl::Cleanup release = [&] {
    gate_->Release();
    creator.reset();
    waiter.reset();
  };
  creator = std::make_unique<Async>([&] { return Attach(s1, "big", &first); });
  ASSERT_TRUE(gate_->entered.WaitForNotificationWithTimeout(kLiveness));
  // uid 1001's budget is taken by the pending creation.
  absl::Status over = Attach(s3, "other", &third);
  EXPECT_EQ(over.code(), absl::StatusCode::kResourceExhausted) << over;
  EXPECT_THAT(std::string(over.message()), HasSubstr("--uid_budget_bytes"));
  waiter = std::make_unique<Async>([&] { return Attach(s2, "big", &second); });
  ASSERT_TRUE(gate_->waiting.WaitForNotificationWithTimeout(kLiveness));
  gate_->Release();
  ASSERT_TRUE(creator->Finished());
  ASSERT_TRUE(waiter->Finished());
  EXPECT_EQ(creator->status.code(), absl::StatusCode::kFailedPrecondition)
      << creator->status;
  EXPECT_THAT(std::string(creator->status.message()),
              HasSubstr("bank 'scale' rank 0"));
  EXPECT_EQ(waiter->status, creator->status);
  // Rolled back: no namespace, the kv bank it made unlinked, the scale
  // bank it did not make kept, and the charge refunded.
  EXPECT_EQ(Find("big"), nullptr);
  EXPECT_FALSE(Exists(SegmentPath("big", "kv")));
  EXPECT_TRUE(Exists(SegmentPath("big", "scale")));
  EXPECT_TRUE(Attach(s3, "other", &third).ok());
  EXPECT_TRUE(core_->CheckInvariants().ok());
}

TEST_F(TierAttachTest, PendingCreationCountsAgainstMaxNamespaces) {
  options_.max_namespaces = 2;
  Start();
  const uint64_t s1 = Open();
  v1::AttachResponse resp;
  ASSERT_TRUE(Attach(s1, "small", &resp).ok());
  gate_->armed = true;
  std::unique_ptr<Async> creator;
  absl::Cleanup release = [&] {
    gate_->Release();
    creator.reset();
  };
  v1::AttachResponse big;
  creator = std::make_unique<Async>([&] { return Attach(s1, "big", &big); });
  ASSERT_TRUE(gate_->entered.WaitForNotificationWithTimeout(kLiveness));
  absl::Status s = Attach(s1, "third", &resp);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("already holds 2 namespaces (--max_namespaces)"));
  gate_->Release();
  ASSERT_TRUE(creator->Finished());
  EXPECT_TRUE(creator->status.ok()) << creator->status;
}

TEST_F(TierAttachTest, DropRemovesFilesWithoutTheGlobalLock) {
  options_.state_dir = dir_ + "/state";
  Start("drop:unlinking");
  ASSERT_TRUE(core_->Recover().ok());
  const uint64_t s1 = Open();
  v1::AttachResponse old_ns;
  ASSERT_TRUE(Attach(s1, "big", &old_ns).ok());
  const std::string journal = JournalPath(options_.state_dir, "big");
  ASSERT_TRUE(Exists(journal));
  gate_->armed = true;
  v1::AttachResponse new_ns;
  std::unique_ptr<Async> dropper, stats, creator;
  absl::Cleanup release = [&] {
    gate_->Release();
    dropper.reset();
    stats.reset();
    creator.reset();
  };
  dropper = std::make_unique<Async>([&] { return Drop("big", true); });
  ASSERT_TRUE(gate_->entered.WaitForNotificationWithTimeout(kLiveness));
  stats = std::make_unique<Async>([&] {
    v1::StatsResponse out;
    return core_->Stats(v1::StatsRequest(), &out);
  });
  ASSERT_TRUE(stats->Finished()) << "Stats blocked on a Drop's unlinking";
  EXPECT_TRUE(stats->status.ok());
  // A new 'big' waits until the old one's files are gone.
  creator = std::make_unique<Async>([&] { return Attach(s1, "big", &new_ns); });
  ASSERT_TRUE(gate_->waiting.WaitForNotificationWithTimeout(kLiveness));
  EXPECT_FALSE(creator->done.HasBeenNotified());
  gate_->Release();
  ASSERT_TRUE(dropper->Finished());
  ASSERT_TRUE(creator->Finished());
  EXPECT_TRUE(dropper->status.ok()) << dropper->status;
  ASSERT_TRUE(creator->status.ok()) << creator->status;
  EXPECT_TRUE(new_ns.created());
  EXPECT_NE(new_ns.namespace_id(), old_ns.namespace_id());
  // The new namespace's files are its own, not removed by the drop.
  EXPECT_TRUE(Exists(journal));
  for (const auto& seg : new_ns.segments()) {
    EXPECT_TRUE(Exists(seg.path())) << seg.path();
  }
}

// A pid that is no live process: a child that has exited and been reaped.
pid_t DeadPid() {
  const pid_t pid = fork();
  if (pid == 0) _exit(0);
  int status = 0;
  waitpid(pid, &status, 0);
  return pid;
}

TEST_F(TierAttachTest, RecoverRemovesOrphanedTemporarySegments) {
  for (const bool with_state : {false, true}) {
    SCOPED_TRACE(with_state ? "with a state_dir" : "without a state_dir");
    options_.state_dir = with_state ? dir_ + "/state" : "";
    const std::string killed = absl::StrCat(
        dir_, "/", shm::TempSegmentName("kvtier.big.kv.r0", DeadPid(), 3));
    const std::string same_pid = absl::StrCat(
        dir_, "/", shm::TempSegmentName("kvtier.big.kv.r1", getpid(), 0));
    const std::string other_prefix = absl::StrCat(
        dir_, "/", shm::TempSegmentName("other.big.kv.r0", DeadPid(), 0));
    for (const std::string& path : {killed, same_pid, other_prefix}) {
      std::FILE* f = std::fopen(path.c_str(), "w");
      ASSERT_NE(f, nullptr) << path;
      std::fclose(f);
    }
    core_.reset();
    Start();
    auto report = core_->Recover();
    ASSERT_TRUE(report.ok()) << report.status();
    EXPECT_EQ(report->temp_segments_removed, 2u);
    EXPECT_FALSE(Exists(killed));
    EXPECT_FALSE(Exists(same_pid));
    EXPECT_TRUE(Exists(other_prefix));
    std::filesystem::remove(other_prefix);
  }
}

}  // namespace
}  // namespace kvtier::daemon
