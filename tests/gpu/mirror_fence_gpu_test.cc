// A mirror whose session ended (the fence, issue 13): its store is captured
// in a CUDA graph, kvtierd is SIGKILLed and restarted, and the graph is
// replayed with other bytes in the pool. The store kernel reads the
// mirror's device-visible revocation flag, set when the session ended, and
// writes nothing: the rows stay what they were, and the daemon keeps them
// fenced until the Mirror is destroyed. GTEST_SKIPs without a device.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "client/mirror.h"
#include "gtest/gtest.h"
#include "tests/daemon_probe.h"
#include "tests/daemon_process.h"
#include "tests/test_pattern.h"

namespace kvtier::testing {
namespace {

using client::Client;
using client::GpuPoolDescriptor;
using client::Mirror;
using client::MirrorStoreEntry;

constexpr uint32_t kPages = 8;

bool HasDevice() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return n > 0;
}

// Holds for `limit` at most until `done()`; false if it never was.
template <typename F>
bool WaitUntil(F done, absl::Duration limit = absl::Seconds(30)) {
  const absl::Time end = absl::Now() + limit;
  while (!done()) {
    if (absl::Now() > end) return false;
    absl::SleepFor(absl::Milliseconds(2));
  }
  return true;
}

TEST(MirrorFence, ACapturedStoreReplayedAfterItsSessionEndedWritesNothing) {
  if (!HasDevice()) GTEST_SKIP() << "no CUDA device present";
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.Start({"--fence_sweep_ms=10"}).ok());
  auto client = Client::Connect({.socket = daemon.socket()});
  ASSERT_TRUE(client.ok()) << client.status();
  auto ns = (*client)->Attach(TestAttachOptions("mirror_fence"));
  ASSERT_TRUE(ns.ok()) << ns.status();
  ASSERT_TRUE((*ns)->cuda_registered());
  // The pool: "kv" 4096 bytes (256 per token), "scale" 100 (per page);
  // logical page i in slot i.
  const uint64_t kv_bytes = 4096, scale_bytes = 100, scale_stride = 112;
  uint8_t *kv = nullptr, *scale = nullptr;
  ASSERT_EQ(cudaMalloc(&kv, kv_bytes * kPages), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&scale, scale_stride * kPages), cudaSuccess);
  auto fill_pool = [&](uint64_t seed) {
    std::vector<uint8_t> page(kv_bytes);
    for (uint32_t i = 0; i < kPages; ++i) {
      FillPattern(page.data(), kv_bytes, seed, i, 0);
      ASSERT_EQ(cudaMemcpy(kv + i * kv_bytes, page.data(), kv_bytes,
                           cudaMemcpyHostToDevice),
                cudaSuccess);
      FillPattern(page.data(), scale_bytes, seed, i, 1);
      ASSERT_EQ(cudaMemcpy(scale + i * scale_stride, page.data(), scale_bytes,
                           cudaMemcpyHostToDevice),
                cudaSuccess);
    }
  };
  fill_pool(1);
  GpuPoolDescriptor pool;
  pool.num_pages = kPages;
  pool.banks = {
      {"kv", {{reinterpret_cast<uint64_t>(kv), kv_bytes, kv_bytes}}},
      {"scale",
       {{reinterpret_cast<uint64_t>(scale), scale_stride, scale_bytes}}}};
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
            cudaSuccess);
  auto mirror = Mirror::Create(**ns, pool,
                               {.logical_pages = kPages,
                                .gpu_slots = kPages,
                                .max_batch = 1,
                                .max_selected = kPages,
                                .max_store_entries = kPages * 16},
                               stream);
  ASSERT_TRUE(mirror.ok()) << mirror.status();
  std::vector<MirrorStoreEntry> entries;
  for (uint32_t i = 0; i < kPages; ++i) {
    for (int32_t t = 0; t < 16; ++t) {
      entries.push_back({.logical = static_cast<int32_t>(i),
                         .slot = static_cast<int32_t>(i),
                         .token = t});
    }
  }
  MirrorStoreEntry* d_entries = nullptr;
  uint32_t* d_count = nullptr;
  const uint32_t count = static_cast<uint32_t>(entries.size());
  ASSERT_EQ(cudaMalloc(&d_entries, entries.size() * sizeof(MirrorStoreEntry)),
            cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d_count, 4), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(d_entries, entries.data(),
                       entries.size() * sizeof(MirrorStoreEntry),
                       cudaMemcpyHostToDevice),
            cudaSuccess);
  ASSERT_EQ(cudaMemcpy(d_count, &count, 4, cudaMemcpyHostToDevice),
            cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  // The engine's step, captured once and replayed.
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal),
            cudaSuccess);
  ASSERT_TRUE((*mirror)->Store(d_entries, d_count, stream).ok());
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  // Every mirror row holds seed 1's bytes.
  auto rows_hold = [&](uint64_t seed) {
    for (uint32_t i = 0; i < kPages; ++i) {
      for (size_t b = 0; b < (*ns)->page_banks().size(); ++b) {
        const auto& bank = (*ns)->page_banks()[b];
        if (!CheckPattern(
                bank.base + uint64_t{(*mirror)->rows()[i]} * bank.row_stride,
                bank.row_bytes, seed, i, b)) {
          return false;
        }
      }
    }
    return true;
  };
  ASSERT_TRUE(rows_hold(1));
  EXPECT_FALSE((*mirror)->revoked());

  daemon.Kill();
  ASSERT_TRUE(WaitUntil([&] { return (*mirror)->revoked(); }));
  ASSERT_TRUE(daemon.Start({"--fence_sweep_ms=10"}).ok());
  ASSERT_TRUE(WaitUntil([&] { return (*client)->session_alive(); }));
  // The reconnected library reported the mirror's rows: they are fenced.
  DaemonProbe probe(daemon.socket());
  auto totals = probe.Totals("mirror_fence");
  ASSERT_TRUE(totals.ok()) << totals.status();
  EXPECT_EQ(totals->fence_holds, 1u);
  EXPECT_EQ(totals->fenced, 2u * kPages);  // kv and scale rows.
  // Other bytes in the pool, the same graph replayed: nothing is written.
  fill_pool(2);
  ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_TRUE(rows_hold(1)) << "a revoked mirror store wrote its rows";
  EXPECT_FALSE(rows_hold(2));
  // Destroying the mirror releases the hold.
  const absl::Time released = absl::Now();
  mirror->reset();
  auto held = probe.WaitUntilNothingHeld("mirror_fence", absl::Seconds(10));
  ASSERT_TRUE(held.ok()) << held.status();
  std::printf(
      "FENCE cuda {\"scenario\": \"mirror-session-ended\", \"fenced_rows\": "
      "%u, \"freed_after_confirm_ms\": %.3f, \"rows_changed_by_replay\": 0}\n",
      2 * kPages, absl::ToDoubleMilliseconds(absl::Now() - released));
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaFree(d_entries);
  cudaFree(d_count);
  cudaFree(kv);
  cudaFree(scale);
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace kvtier::testing
