// Tests of the checkpointer (daemon/checkpointer.h) through TierCore: while
// a journal's checkpoint write is stalled (a test hook; a slow or hung
// disk), no request waits for it — not the namespace's own lookups and
// commits, not an Attach to it (which holds TierCore's lock), not Stats
// (the systemd watchdog's probe), not another namespace's lookups. And the
// journal it finally writes holds every record appended meanwhile.
//
// Nothing here asserts a duration: a request "completes while the stall
// holds" when it is seen complete before the test lifts the stall; the
// polls that wait for it are bounded only so that a test that fails ends.
//
// Thread-safety: the test's threads share only atomics and Notifications.
#include "daemon/checkpointer.h"

#include <stdlib.h>

#include <atomic>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "daemon/tier_core.h"
#include "daemon/tier_core_test_util.h"
#include "gtest/gtest.h"

namespace kvtier::daemon {
namespace {

class CheckpointerTest : public TierCoreTest {
 protected:
  void SetUp() override {
    char tmpl[] = "/dev/shm/kvtier-checkpoint-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    options_.segments.shm_dir = dir_;
    options_.segments.huge_pages = shm::HugePagePolicy::kOff;
    options_.default_namespace_bytes = 1 << 20;
    options_.namespace_budget_bytes = 64 << 20;
    options_.state_dir = dir_ + "/state";
    // Every append is past the threshold: each asks for a checkpoint.
    options_.journal.min_compact_bytes = 0;
    options_.journal.compact_factor = 0;
    Start();
  }
  void Start() {
    core_ = std::make_unique<TierCore>(options_);
    core_->SetTestHook([this](const char* point) {
      if (std::string(point) != "checkpoint:writing") return;
      if (!armed_.exchange(false)) return;
      stalled_.Notify();
      release_.WaitForNotification();
    });
    auto report = core_->Recover();
    ASSERT_TRUE(report.ok()) << report.status();
  }

  // Polls (bounded) until `done`; true if it was seen set.
  static bool SeenWithin(const std::atomic<bool>& done) {
    for (int i = 0; i < 3000 && !done.load(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return done.load();
  }

  TierOptions options_;
  std::atomic<bool> armed_{false};
  absl::Notification stalled_, release_;
};

TEST_F(CheckpointerTest, AStalledCheckpointWriteHoldsUpNoRequest) {
  const v1::Layout layout = AttentionLayout();
  const uint64_t sa = Open("a"), sb = Open("b");
  const uint64_t a = Attach(sa, "ns-a", layout).namespace_id();
  const uint64_t b = Attach(sb, "ns-b", layout).namespace_id();
  const std::string b_hashes = RandomHashes(4, 32, 11);
  auto rb = Reserve(sb, b, 4);
  ASSERT_TRUE(rb.ok()) << rb.status();
  ASSERT_TRUE(Commit(sb, b, rb->reservation_id(), "", b_hashes).ok());

  // A Reserve on ns-a crosses the threshold: its checkpoint write stalls.
  armed_ = true;
  const std::string first = RandomHashes(4, 32, 12);
  absl::StatusOr<v1::ReserveResponse> r1;
  std::atomic<bool> reserved{false};
  std::thread reserving([&] {
    r1 = Reserve(sa, a, 4);
    reserved = true;
  });
  ASSERT_TRUE(stalled_.WaitForNotificationWithTimeout(absl::Seconds(30)))
      << "no checkpoint was written";

  // While it holds, each of these completes.
  const std::string second = RandomHashes(3, 32, 13);
  std::atomic<bool> attached{false}, looked_b{false}, stats{false},
      looked_a{false}, committed_a{false};
  std::vector<std::thread> others;
  others.emplace_back([&] {
    Attach(Open("late"), "ns-a", layout);
    attached = true;
  });
  others.emplace_back([&] {
    EXPECT_EQ(Lookup(sb, b, b_hashes).matched_pages(), 4u);
    looked_b = true;
  });
  others.emplace_back([&] {
    v1::StatsResponse resp;
    EXPECT_TRUE(core_->Stats({}, &resp).ok());
    stats = true;
  });
  others.emplace_back([&] {
    Lookup(sa, a, second);
    looked_a = true;
  });
  others.emplace_back([&] {
    auto r2 = Reserve(sa, a, 3);
    ASSERT_TRUE(r2.ok()) << r2.status();
    ASSERT_TRUE(Commit(sa, a, r2->reservation_id(), "", second).ok());
    committed_a = true;
  });
  EXPECT_TRUE(SeenWithin(reserved)) << "the Reserve that asked for it";
  EXPECT_TRUE(SeenWithin(attached)) << "an Attach to the namespace";
  EXPECT_TRUE(SeenWithin(looked_b)) << "a Lookup in another namespace";
  EXPECT_TRUE(SeenWithin(stats)) << "Stats (the watchdog's probe)";
  EXPECT_TRUE(SeenWithin(looked_a)) << "a Lookup in the namespace";
  EXPECT_TRUE(SeenWithin(committed_a)) << "a Commit in the namespace";
  release_.Notify();
  reserving.join();
  for (auto& t : others) t.join();
  ASSERT_TRUE(r1.ok()) << r1.status();
  ASSERT_TRUE(Commit(sa, a, r1->reservation_id(), "", first).ok());

  // What was committed while the checkpoint was being written, and after,
  // survives a restart: the new journal took the records appended
  // meanwhile.
  core_.reset();
  Start();
  const uint64_t s = Open("after");
  const uint64_t a2 = Attach(s, "ns-a", layout).namespace_id();
  const uint64_t b2 = Attach(s, "ns-b", layout).namespace_id();
  EXPECT_EQ(Lookup(s, a2, first).matched_pages(), 4u);
  EXPECT_EQ(Lookup(s, a2, second).matched_pages(), 3u);
  EXPECT_EQ(Lookup(s, b2, b_hashes).matched_pages(), 4u);
  EXPECT_TRUE(core_->CheckInvariants().ok()) << core_->CheckInvariants();
}

}  // namespace
}  // namespace kvtier::daemon
