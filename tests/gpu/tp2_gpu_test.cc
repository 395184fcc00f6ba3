// A TP=2 group across two GPUs sharing one kvtierd, for nvidia-h200-x2:
// rank 0 (GPU 0) commits 8 pages with snapshots after pages 3 and 7, rank 1
// (GPU 1) only 4 pages with a snapshot after page 3, each snapshot also in
// the device pool of its own GPU. Then both ranks, as two processes at once,
// look the 8-page prefix up: each must get 4 usable pages (what both ranks
// can serve), its own snapshot from its own GPU's pool, and identical bytes
// (its rank's KV pages and snapshot). Skips with fewer than two GPUs.
#include <cuda_runtime_api.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/daemon_process.h"

namespace kvtier::testing {
namespace {

int GpuCount() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

constexpr char kSnapBytes[] = "8388608";  // 8 MiB.

TEST(Tp2GpuTest, LookupReturnsWhatBothRanksServe) {
  if (GpuCount() < 2) GTEST_SKIP() << "needs two GPUs";
  const std::string engine = ResolveProgram(
      KVTIER_DEVICE_POOL_ENGINE_PATH, "tests/gpu/kvtier_device_pool_engine");
  DaemonProcess daemon;
  ASSERT_TRUE(daemon
                  .Start({"--metrics_address=", "--device_pool_gpus=0,1",
                          "--device_pool_bytes=268435456",
                          std::string("--device_pool_row_bytes=") + kSnapBytes})
                  .ok());
  // Each filler stays alive until killed (it commits, then waits).
  auto rank0 = Child::Spawn({engine, "fill", daemon.socket(), "tp2", "0", "0",
                             "2", "8", kSnapBytes, "3,7"});
  ASSERT_TRUE(rank0.ok()) << rank0.status();
  ASSERT_TRUE(rank0
                  ->WaitForLine("FILLED pages=8 snapshots=2 "
                                "device_snapshots=2",
                                absl::Seconds(60))
                  .ok())
      << rank0->output();
  auto rank1 = Child::Spawn({engine, "fill", daemon.socket(), "tp2", "1", "1",
                             "2", "4", kSnapBytes, "3"});
  ASSERT_TRUE(rank1.ok()) << rank1.status();
  ASSERT_TRUE(rank1
                  ->WaitForLine("FILLED pages=4 snapshots=1 "
                                "device_snapshots=1",
                                absl::Seconds(60))
                  .ok())
      << rank1->output();
  rank0->Signal(SIGKILL);
  rank1->Signal(SIGKILL);
  (void)rank0->Wait(absl::Seconds(10));
  (void)rank1->Wait(absl::Seconds(10));

  // Both ranks at once, each on its GPU.
  auto r0 = Child::Spawn({engine, "restore", daemon.socket(), "tp2", "0", "0",
                          "2", "8", kSnapBytes, "4"});
  auto r1 = Child::Spawn({engine, "restore", daemon.socket(), "tp2", "1", "1",
                          "2", "8", kSnapBytes, "4"});
  ASSERT_TRUE(r0.ok() && r1.ok());
  ASSERT_TRUE(r0->WaitForLine("RESTORED_OK", absl::Seconds(60)).ok())
      << r0->output();
  ASSERT_TRUE(r1->WaitForLine("RESTORED_OK", absl::Seconds(60)).ok())
      << r1->output();
  EXPECT_THAT(r0->output(),
              ::testing::HasSubstr("lookup matched=4 usable=4 device=1"));
  EXPECT_THAT(r1->output(),
              ::testing::HasSubstr("lookup matched=4 usable=4 device=1"));
  ASSERT_TRUE(daemon.Stop().ok());
  auto rc0 = r0->Wait(absl::Seconds(60));
  auto rc1 = r1->Wait(absl::Seconds(60));
  ASSERT_TRUE(rc0.ok() && rc1.ok());
  std::printf("rank 0: %srank 1: %s", r0->output().c_str(),
              r1->output().c_str());
  EXPECT_EQ(*rc0, 0) << r0->output();
  EXPECT_EQ(*rc1, 0) << r1->output();
}

}  // namespace
}  // namespace kvtier::testing
