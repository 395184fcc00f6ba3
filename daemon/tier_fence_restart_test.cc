// Tests of the restart fence per namespace and of the file that carries it
// across restarts (fence_registry.h, fence_registry_file.cc), through
// TierCore called directly: a namespace's restart fence waits only for the
// holders recorded in it, one uid's recorded holders are capped and the
// dead ones pruned, so that client-chosen connection ids cannot grow the
// file; and the file is written with no lock another session's request
// needs. The fixture: tier_fence_test_util.h.
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/notification.h"
#include "common/crc32c.h"
#include "daemon/process_watch.h"
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

// A file an older kvtierd wrote (kvtier-fence-v1 lines, no namespace):
// its holder waits in every namespace, and one complete report that left
// out nothing it held resolves it everywhere.
TEST_F(TierFenceTest, AnOlderDaemonsFileWaitsInEveryNamespace) {
  Sleeper old_engine, gone;
  StartWithState();
  const uint64_t s = Open("", gone.pid(), 1);
  ASSERT_TRUE(Reserve(s, Attach(s, 16, "a"), 4).ok());
  ASSERT_TRUE(Reserve(s, Attach(s, 16, "b"), 4).ok());
  gone.Kill();
  auto ticks = ReadProcessStartTicks(old_engine.pid());
  ASSERT_TRUE(ticks.ok()) << ticks.status();
  const std::string body =
      absl::StrCat("kvtier-fence-v1 ", absl::BytesToHexString(kInstance), " ",
                   old_engine.pid(), " ", *ticks, " 7");
  std::ofstream(options_.state_dir + "/fence.instances", std::ios::trunc)
      << absl::StrFormat("%s %08x\n", body, Crc32c(body.data(), body.size()));
  Restart();
  EXPECT_EQ(Info("a").restart_fence_processes(), 1u);
  EXPECT_EQ(Info("b").restart_fence_processes(), 1u);
  EXPECT_EQ(Info("a").fenced_page_rows(), 4u);
  EXPECT_EQ(Info("b").fenced_page_rows(), 4u);
  const uint64_t again = Open(kInstance, old_engine.pid(), 7);
  Attach(again, 16, "a");
  v1::FenceRequest done;
  done.set_report_complete(true);
  auto resp = Fence(again, done);
  ASSERT_TRUE(resp.ok()) << resp.status();
  core_->SweepFences();
  EXPECT_EQ(Info("a").fenced_page_rows(), 0u);
  EXPECT_EQ(Info("b").fenced_page_rows(), 0u);
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

// While a write of the fence's file stalls (the hook stands in for a slow
// disk), another session's Lookup and Stats complete: the write holds no
// lock they need. Bounded waits only end a failing test.
TEST_F(TierFenceTest, AStalledFenceRecordBlocksNoOtherSession) {
  Sleeper engine, reader_proc;
  StartWithState();
  const uint64_t reader = Open(kOther, reader_proc.pid(), 1);
  const uint64_t ns = Attach(reader);
  const std::string hashes = testing::RandomHashes(2, 4);
  auto put = Reserve(reader, ns, 2);
  ASSERT_TRUE(put.ok()) << put.status();
  ASSERT_TRUE(Commit(reader, ns, put->reservation_id(), hashes).ok());
  // `stalled` runs in a thread of its own and writes one line.
  auto expect_others_proceed = [&](const char* what,
                                   std::function<void()> stalled) {
    absl::Notification entered, lift, done;
    std::atomic<bool> armed{true};
    core_->SetTestHook([&](const char* point) {
      if (std::string(point) == "fence:record" && armed.exchange(false)) {
        entered.Notify();
        lift.WaitForNotification();
      }
    });
    std::thread writer(stalled);
    ASSERT_TRUE(entered.WaitForNotificationWithTimeout(absl::Seconds(30)))
        << what << " wrote no line";
    std::thread other([&] {
      auto l = Lookup(reader, ns, hashes, /*pin=*/false);
      EXPECT_TRUE(l.ok()) << l.status();
      v1::StatsResponse stats;
      EXPECT_TRUE(core_->Stats({}, &stats).ok());
      done.Notify();
    });
    const bool completed =
        done.WaitForNotificationWithTimeout(absl::Seconds(10));
    lift.Notify();
    writer.join();
    other.join();
    core_->SetTestHook(nullptr);
    EXPECT_TRUE(completed) << "Lookup and Stats waited for the write of "
                           << what;
  };
  const uint64_t s = Open(kInstance, engine.pid(), 2);
  expect_others_proceed("an Attach's line",
                        [&] { EXPECT_TRUE(TryAttach(s).ok()); });
  // A session that attached before its credentials were bound gets its
  // bound line at BindPeerCredentials.
  const uint64_t unbound = Open(kInstance, 0, 3);
  Attach(unbound);
  expect_others_proceed("a binding's line", [&] {
    EXPECT_TRUE(core_->BindPeerCredentials(unbound, Peer(engine.pid())).ok());
  });
}

}  // namespace
}  // namespace kvtier::daemon
