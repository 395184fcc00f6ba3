// The daemon-owned device pool on a GPU, with a real kvtierd
// (--device_pool_bytes): an engine fills snapshots into the pool (and the
// host tier) and is SIGKILLed; a new engine attaches, restores every one of
// them device-to-device with identical bytes, times that against the same
// restores from the host tier (printed, not asserted), and once the daemon
// stops gets UNAVAILABLE from every use of the pool instead of a crash.
// Also: with the flag on the daemon does map the CUDA driver (the positive
// control of tests/device_pool_test.cc's flag-off check). And a forced drop
// of a namespace whose engine still has a copy into its slot queued: no
// other namespace gets that slot until the engine is gone. Skips without a
// GPU.
#include <cuda_runtime_api.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/daemon_process.h"

namespace kvtier::testing {
namespace {

bool HaveGpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

std::string DaemonMaps(const std::string& socket) {
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in(e.path() / "cmdline", std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    if (ss.str().find("--socket=" + socket) == std::string::npos) continue;
    std::ifstream maps(e.path() / "maps");
    std::stringstream ms;
    ms << maps.rdbuf();
    return ms.str();
  }
  return "";
}

constexpr char kSnapBytes[] = "33554432";  // 32 MiB, a hybrid model's state.
constexpr char kSnapshots[] = "16";

TEST(DevicePoolGpuTest, SurvivesEngineKillRestoresDeviceToDevice) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  const std::string engine = ResolveProgram(
      KVTIER_DEVICE_POOL_ENGINE_PATH, "tests/gpu/kvtier_device_pool_engine");
  DaemonProcess daemon;
  ASSERT_TRUE(daemon
                  .Start({"--metrics_address=", "--device_pool_gpus=0",
                          "--device_pool_bytes=1073741824",
                          absl::StrCat("--device_pool_row_bytes=", kSnapBytes)})
                  .ok());
  EXPECT_THAT(DaemonMaps(daemon.socket()), ::testing::HasSubstr("libcuda"));

  auto filler = Child::Spawn({engine, "fill", daemon.socket(), "dp", "0", "0",
                              "1", kSnapshots, kSnapBytes, "all"});
  ASSERT_TRUE(filler.ok()) << filler.status();
  ASSERT_TRUE(filler
                  ->WaitForLine(absl::StrCat("FILLED pages=", kSnapshots,
                                             " snapshots=", kSnapshots,
                                             " device_snapshots=", kSnapshots),
                                absl::Seconds(60))
                  .ok())
      << filler->output();
  filler->Signal(SIGKILL);  // The engine dies holding the pool open.
  auto killed = filler->Wait(absl::Seconds(10));
  ASSERT_TRUE(killed.ok());
  EXPECT_EQ(*killed, 128 + SIGKILL);

  auto restorer = Child::Spawn({engine, "restore", daemon.socket(), "dp", "0",
                                "0", "1", kSnapshots, kSnapBytes, kSnapshots});
  ASSERT_TRUE(restorer.ok()) << restorer.status();
  ASSERT_TRUE(restorer->WaitForLine("RESTORED_OK", absl::Seconds(60)).ok())
      << restorer->output();
  ASSERT_TRUE(daemon.Stop().ok());
  auto rc = restorer->Wait(absl::Seconds(60));
  ASSERT_TRUE(rc.ok()) << rc.status();
  std::printf("%s", restorer->output().c_str());
  EXPECT_EQ(*rc, 0) << restorer->output();
  EXPECT_THAT(restorer->output(), ::testing::HasSubstr("STALE_OK"));
}

// The word after `prefix` on the child's line that starts with it.
std::string Field(const std::string& output, const std::string& prefix) {
  for (absl::string_view line : absl::StrSplit(output, '\n')) {
    if (absl::ConsumePrefix(&line, prefix)) return std::string(line);
  }
  return "";
}

// Engine A's copy into its device slot is queued behind a spin kernel when
// engine B force-drops A's namespace and takes every slot the pool hands
// it: A's slot must not be among them while the copy is pending, so the
// late copy never overwrites B's bytes; once A is gone, B gets it.
TEST(DevicePoolGpuTest, AForcedDropKeepsASlotWhoseCopyIsQueued) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  const std::string engine = ResolveProgram(
      KVTIER_DEVICE_POOL_ENGINE_PATH, "tests/gpu/kvtier_device_pool_engine");
  constexpr char kSlotBytes[] = "4194304";
  DaemonProcess daemon;
  ASSERT_TRUE(daemon
                  .Start({"--metrics_address=", "--device_pool_gpus=0",
                          "--device_pool_bytes=16777216",  // 4 slots.
                          absl::StrCat("--device_pool_row_bytes=", kSlotBytes),
                          "--fence_sweep_ms=10"})
                  .ok());
  auto a = Child::Spawn({engine, "late", daemon.socket(), "a", "0", "0", "1",
                         "1", kSlotBytes, "-"});
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(a->WaitForLine("QUEUED", absl::Seconds(60)).ok()) << a->output();
  const std::string a_row = Field(a->output(), "ROW ");
  ASSERT_FALSE(a_row.empty()) << a->output();

  auto b = Child::Spawn({engine, "claim", daemon.socket(), "b", "0", "0", "1",
                         "1", kSlotBytes, "a"});
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_TRUE(b->WaitForLine("WRITTEN", absl::Seconds(60)).ok()) << b->output();
  const std::vector<std::string> b_rows =
      absl::StrSplit(Field(b->output(), "ROWS "), ',');
  EXPECT_EQ(b_rows.size(), 3u) << b->output();
  EXPECT_THAT(b_rows, ::testing::Not(::testing::Contains(a_row)))
      << "B got slot " << a_row << " while A's copy into it was queued";

  a->Signal(SIGUSR1);  // A's copy lands now.
  ASSERT_TRUE(a->WaitForLine("LANDED", absl::Seconds(60)).ok()) << a->output();
  b->Signal(SIGUSR1);
  ASSERT_TRUE(b->WaitForLine("CHECKED", absl::Seconds(60)).ok()) << b->output();
  EXPECT_THAT(b->output(), ::testing::HasSubstr("INTACT 1\n"))
      << "A's late copy overwrote B's bytes";

  a->Signal(SIGKILL);  // A is gone: its slot comes back.
  ASSERT_TRUE(a->Wait(absl::Seconds(10)).ok());
  b->Signal(SIGUSR1);
  ASSERT_TRUE(
      b->WaitForLine(absl::StrCat("GOT ", a_row), absl::Seconds(60)).ok())
      << b->output();
  auto rc = b->Wait(absl::Seconds(30));
  ASSERT_TRUE(rc.ok()) << rc.status();
  EXPECT_EQ(*rc, 0) << b->output();
  ASSERT_TRUE(daemon.Stop().ok());
}

}  // namespace
}  // namespace kvtier::testing
