// Two engine processes and a real kvtierd on a GPU: A evicts a prefix from
// its GPU pool with the CUDA kernel, commits behind its stream and exits; B
// rehydrates it into other pages of a fresh pool and gets identical bytes
// (fp8 codes, their scales and a snapshot). Skips without a GPU.
#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/daemon_process.h"

namespace kvtier::testing {
namespace {

bool HaveGpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

TEST(GpuMultiProcessTest, EvictInOneProcessRehydrateInAnother) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  const std::string engine =
      ResolveProgram(KVTIER_GPU_ENGINE_PATH, "tests/gpu/kvtier_gpu_engine");
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.Start().ok());
  for (const char* mode : {"evict", "rehydrate"}) {
    auto child =
        Child::Spawn({engine, mode, daemon.socket(), "gpu2p", "200", "4242"});
    ASSERT_TRUE(child.ok()) << child.status();
    auto rc = child->Wait(absl::Seconds(120));
    ASSERT_TRUE(rc.ok()) << rc.status();
    std::printf("%s: %s", mode, child->output().c_str());
    ASSERT_EQ(*rc, 0) << mode << ": " << child->output();
  }
  // A different prefix is not found: the check can fail.
  auto miss = Child::Spawn(
      {engine, "rehydrate", daemon.socket(), "gpu2p", "200", "4243"});
  ASSERT_TRUE(miss.ok());
  auto rc = miss->Wait(absl::Seconds(120));
  ASSERT_TRUE(rc.ok());
  EXPECT_EQ(*rc, 1);
}

}  // namespace
}  // namespace kvtier::testing
