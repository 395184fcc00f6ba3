// Tests of the restart fence per namespace and of the file that carries it
// across restarts (fence_registry.h, fence_registry_file.cc), through
// TierCore called directly: a namespace's restart fence waits only for the
// holders recorded in it, one uid's recorded holders are capped and the
// dead ones pruned, so that client-chosen connection ids cannot grow the
// file. The fixture: tier_fence_test_util.h.
#include <unistd.h>

#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/tier_core.h"
#include "daemon/tier_fence_test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvtier::daemon {
namespace {

using ::testing::HasSubstr;
using testing::kInstance;
using testing::kOther;
using testing::Sleeper;
using testing::TierFenceTest;

size_t Lines(const std::string& path) {
  std::ifstream in(path);
  size_t n = 0;
  for (std::string line; std::getline(in, line);) ++n;
  return n;
}

// P1 held rows in namespace "a" only, P2 in "b" only. After a restart,
// P2's report lifts b's restart fence; a's waits for P1 alone.
TEST_F(TierFenceTest, ARestartFenceWaitsOnlyForItsOwnNamespacesHolders) {
  Sleeper p1, p2;  // Forked first: they would inherit the folder's lock.
  StartWithState();
  const uint64_t s1 = Open(kInstance, p1.pid(), 1);
  const uint64_t a = Attach(s1, 16, "a");
  ASSERT_TRUE(Reserve(s1, a, 4).ok());
  const uint64_t s2 = Open(kOther, p2.pid(), 2);
  const uint64_t b = Attach(s2, 16, "b");
  ASSERT_TRUE(Reserve(s2, b, 4).ok());
  Restart();
  EXPECT_EQ(Info("a").fenced_page_rows(), 4u);
  EXPECT_EQ(Info("b").fenced_page_rows(), 4u);
  // P2 reconnects to b and holds nothing there.
  const uint64_t again = Open(kOther, p2.pid(), 2);
  Attach(again, 16, "b");
  v1::FenceRequest done;
  done.set_report_complete(true);
  auto resp = Fence(again, done);
  ASSERT_TRUE(resp.ok()) << resp.status();
  core_->SweepFences();
  EXPECT_EQ(Info("b").restart_fence_processes(), 0u);
  EXPECT_EQ(Info("b").fenced_page_rows(), 0u);
  EXPECT_EQ(Free(Info("b")), 16u);
  // a's still waits for P1, and only for it.
  EXPECT_EQ(Info("a").restart_fence_processes(), 1u);
  EXPECT_EQ(Info("a").fenced_page_rows(), 4u);
  EXPECT_EQ(Free(Info("a")), 12u);
  p1.Kill();
  core_->SweepFences();
  EXPECT_EQ(Info("a").fenced_page_rows(), 0u);
  EXPECT_EQ(Free(Info("a")), 16u);
  ExpectInvariants();
}

// One uid presenting ever new connection ids: its recorded holders are
// capped (the refusal names the flag; another uid is not charged), lines of
// exited processes are forgotten, and the file stays small.
TEST_F(TierFenceTest, AFloodOfConnectionIdsIsCappedAndPruned) {
  constexpr uint32_t kCap = 8;
  constexpr uid_t kOtherUid = 61004;
  options_.fence.max_holders_per_uid = kCap;
  Sleeper first, other;
  StartWithState();
  const std::string file = options_.state_dir + "/fence.instances";
  uint64_t connection = 1;
  for (uint32_t i = 0; i < kCap; ++i) {
    const uint64_t s = Open(kInstance, first.pid(), connection++);
    ASSERT_TRUE(TryAttach(s).ok()) << i;
  }
  auto refused = TryAttach(Open(kInstance, first.pid(), connection++));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted)
      << refused.status();
  EXPECT_THAT(refused.status().message(),
              HasSubstr("--max_fence_holders_per_uid"));
  EXPECT_TRUE(
      TryAttach(OpenAs(kInstance, Peer(other.pid(), kOtherUid), 1)).ok());
  first.Kill();
  core_->SweepFences();  // The sweeper's work (every --fence_sweep_ms).
  // Process after process, each at the cap, then gone.
  for (int round = 0; round < 40; ++round) {
    Sleeper engine;
    for (uint32_t i = 0; i < kCap; ++i) {
      const uint64_t s = Open(kInstance, engine.pid(), connection++);
      ASSERT_TRUE(TryAttach(s).ok()) << round << "/" << i;
    }
    engine.Kill();
    core_->SweepFences();
  }
  // Live: the other uid's line; the dead ones rewritten away past
  // kCompactAfter.
  EXPECT_LE(Lines(file), 2 * kCap + 1 + 64) << file;
}

}  // namespace
}  // namespace kvtier::daemon
