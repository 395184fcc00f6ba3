// Tests of kvtier::client::ReferenceStream: in-order execution, Hold/Resume,
// Synchronize, FromHandle, and the reference backend's copies queued on it.
#include "client/reference_stream.h"

#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/spin_wait.h"

namespace kvtier::client {
namespace {

TEST(ReferenceStreamTest, RunsInOrderAndSynchronizes) {
  ReferenceStream s;
  std::vector<int> seen;
  for (int i = 0; i < 100; ++i) s.Enqueue([&seen, i] { seen.push_back(i); });
  s.Synchronize();
  ASSERT_EQ(seen.size(), 100u);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(seen[i], i);
  EXPECT_EQ(s.pending(), 0u);
}

TEST(ReferenceStreamTest, HeldWorkWaitsForResume) {
  ReferenceStream s;
  std::atomic<int> ran{0};
  s.Hold();
  s.Enqueue([&] { ran = 1; });
  // Nothing runs while held, however long: check the queue, not a clock.
  std::this_thread::yield();
  EXPECT_EQ(s.pending(), 1u);
  EXPECT_EQ(ran.load(), 0);
  s.Resume();
  s.Synchronize();
  EXPECT_EQ(ran.load(), 1);
}

TEST(ReferenceStreamTest, ASpinFirstHoldsWhatFollows) {
  ReferenceStream s;
  volatile uint32_t flag = 0;
  std::atomic<int> ran{0};
  s.Enqueue([&flag] { kernels::SpinUntilReference(&flag); });
  s.Enqueue([&] { ran = 1; });
  EXPECT_EQ(ran.load(), 0);
  EXPECT_EQ(s.pending(), 2u);
  __atomic_store_n(&flag, 1, __ATOMIC_RELEASE);  // The spin reads it.
  s.Synchronize();
  EXPECT_EQ(ran.load(), 1);
}

TEST(ReferenceStreamTest, FromHandleKnowsLiveStreamsOnly) {
  EXPECT_EQ(ReferenceStream::FromHandle(nullptr), nullptr);
  int not_a_stream = 0;
  EXPECT_EQ(ReferenceStream::FromHandle(&not_a_stream), nullptr);
  const size_t before = ReferenceStream::live_count();
  auto s = std::make_unique<ReferenceStream>();
  void* handle = s->handle();
  EXPECT_EQ(ReferenceStream::FromHandle(handle), s.get());
  EXPECT_EQ(ReferenceStream::live_count(), before + 1);
  s.reset();  // Forgotten: its address no longer counts as a stream.
  EXPECT_EQ(ReferenceStream::live_count(), before);
}

TEST(ReferenceStreamTest, DestructionResumesAndDrains) {
  std::atomic<int> ran{0};
  {
    ReferenceStream s;
    s.Hold();
    s.Enqueue([&] { ran = 1; });
  }
  EXPECT_EQ(ran.load(), 1);
}

}  // namespace
}  // namespace kvtier::client
