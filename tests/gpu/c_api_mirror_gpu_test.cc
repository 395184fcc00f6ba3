// The C ABI's CUDA paths with a real kvtierd, through libkvtier.so (whose
// CUDA runtime is its own, as in an engine that brings another one): a
// kvt_mirror store captured in a CUDA graph and replayed writes the host
// rows bit for bit, ensure brings rows back into the pool, adoption makes
// the pages visible to a lookup; the daemon's device pool is written, looked
// up with a device snapshot and restored device-to-device, and answers
// UNAVAILABLE once the daemon stopped. GTEST_SKIPs without a device.
//
// Thread-safety: single-threaded tests.

#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "kvtier/kvtier.h"
#include "tests/daemon_process.h"

namespace {

constexpr uint32_t kTokens = 16;
constexpr uint64_t kKvBytes = 4096;    // 256 per token
constexpr uint64_t kScaleBytes = 100;  // per page (not a multiple of 16)
constexpr uint64_t kScaleStride = 112;
constexpr uint32_t kSlots = 12;
constexpr uint32_t kPages = 4;

bool HasDevice() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return n > 0;
}

#define CUDA_OK(x) ASSERT_EQ((x), cudaSuccess) << #x
#define KVT_OK_(x) ASSERT_EQ((x), KVT_OK) << #x << ": " << kvt_last_error()

std::vector<uint8_t> Random(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

std::vector<uint8_t> Hashes(kvt_namespace* ns, uint32_t pages) {
  std::vector<int32_t> tokens(pages * kTokens);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = 7 + i;
  std::vector<uint8_t> h(pages * kvt_hash_bytes(ns));
  size_t n = 0;
  EXPECT_EQ(kvt_hash_tokens(ns, tokens.data(), tokens.size(), nullptr, 0,
                            nullptr, 0, h.data(), h.size(), &n),
            KVT_OK);
  return h;
}

TEST(CApiMirrorGpu, GraphCapturedStoreEnsureAndAdopt) {
  if (!HasDevice()) GTEST_SKIP() << "no CUDA device present";
  kvtier::testing::DaemonProcess daemon;
  ASSERT_TRUE(daemon.Start().ok());
  kvt_client* client = nullptr;
  KVT_OK_(kvt_connect(daemon.socket().c_str(), "c-gpu", 0, &client));
  kvt_bank_layout banks[2] = {{"kv", kKvBytes, "fp8_e4m3"},
                              {"scale", kScaleBytes, "fp32"}};
  kvt_layout layout{};
  layout.model = "c-gpu";
  layout.tokens_per_page = kTokens;
  layout.num_layers = 1;
  layout.page_banks = banks;
  layout.num_page_banks = 2;
  kvt_attach_options o{};
  o.name = "c_gpu_mirror";
  o.layout = &layout;
  o.page_rows = 64;
  o.register_with_cuda = 1;
  kvt_namespace* ns = nullptr;
  KVT_OK_(kvt_attach(client, &o, &ns));
  kvt_bank_info kv{}, scale{};
  KVT_OK_(kvt_page_bank(ns, 0, &kv));
  KVT_OK_(kvt_page_bank(ns, 1, &scale));
  ASSERT_TRUE(kv.cuda_registered && scale.cuda_registered);

  uint8_t *d_kv = nullptr, *d_scale = nullptr;
  CUDA_OK(cudaMalloc(&d_kv, kKvBytes * kSlots));
  CUDA_OK(cudaMalloc(&d_scale, kScaleStride * kSlots));
  const std::vector<uint8_t> h_kv = Random(kKvBytes * kSlots, 1);
  const std::vector<uint8_t> h_scale = Random(kScaleStride * kSlots, 2);
  CUDA_OK(cudaMemcpy(d_kv, h_kv.data(), h_kv.size(), cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(d_scale, h_scale.data(), h_scale.size(),
                     cudaMemcpyHostToDevice));
  kvt_pool_tensor tensors[2] = {
      {reinterpret_cast<uint64_t>(d_kv), kKvBytes, kKvBytes},
      {reinterpret_cast<uint64_t>(d_scale), kScaleStride, kScaleBytes}};
  kvt_bank_pool bank_pools[2] = {{"kv", &tensors[0], 1},
                                 {"scale", &tensors[1], 1}};
  kvt_pool pool{};
  pool.num_pages = kSlots;
  pool.banks = bank_pools;
  pool.num_banks = 2;
  kvt_mirror_options mo{};
  mo.logical_pages = 16;
  mo.gpu_slots = kSlots;
  mo.max_batch = 1;
  mo.max_selected = kPages;
  mo.max_store_entries = kPages * kTokens;
  mo.backend = KVT_BACKEND_CUDA;
  cudaStream_t stream = nullptr;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  kvt_mirror* m = nullptr;
  KVT_OK_(kvt_mirror_create(ns, &pool, &mo, stream, &m));
  const std::vector<uint32_t> rows(kvt_mirror_rows(m), kvt_mirror_rows(m) + 16);

  // Every token of logical pages 0..3, logical l in slot 11 - l.
  std::vector<kvt_mirror_entry> entries;
  for (int32_t l = 0; l < static_cast<int32_t>(kPages); ++l) {
    for (int32_t t = 0; t < static_cast<int32_t>(kTokens); ++t) {
      entries.push_back({l, static_cast<int32_t>(kSlots) - 1 - l, t});
    }
  }
  kvt_mirror_entry* d_entries = nullptr;
  uint32_t* d_count = nullptr;
  CUDA_OK(cudaMalloc(&d_entries, entries.size() * sizeof(kvt_mirror_entry)));
  CUDA_OK(cudaMalloc(&d_count, 4));
  CUDA_OK(cudaMemcpy(d_entries, entries.data(),
                     entries.size() * sizeof(kvt_mirror_entry),
                     cudaMemcpyHostToDevice));
  const uint32_t count = static_cast<uint32_t>(entries.size());
  CUDA_OK(cudaMemcpy(d_count, &count, 4, cudaMemcpyHostToDevice));
  CUDA_OK(cudaStreamSynchronize(stream));
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  ASSERT_EQ(kvt_mirror_store(m, d_entries, d_count, stream), KVT_OK)
      << kvt_last_error();
  CUDA_OK(cudaStreamEndCapture(stream, &graph));
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  CUDA_OK(cudaGraphLaunch(exec, stream));
  CUDA_OK(cudaStreamSynchronize(stream));
  auto kv_row = [&](uint32_t r) {
    return static_cast<const uint8_t*>(kv.base) + r * kv.row_stride;
  };
  auto scale_row = [&](uint32_t r) {
    return static_cast<const uint8_t*>(scale.base) + r * scale.row_stride;
  };
  for (uint32_t l = 0; l < kPages; ++l) {
    const uint32_t slot = kSlots - 1 - l;
    EXPECT_EQ(0, std::memcmp(kv_row(rows[l]), h_kv.data() + slot * kKvBytes,
                             kKvBytes))
        << "logical " << l;
    EXPECT_EQ(0, std::memcmp(scale_row(rows[l]),
                             h_scale.data() + slot * kScaleStride, kScaleBytes))
        << "logical " << l;
  }
  uint64_t drops = 1;
  CUDA_OK(
      cudaMemcpy(&drops, kvt_mirror_store_drops(m), 8, cudaMemcpyDeviceToHost));
  EXPECT_EQ(drops, 0u);

  // Ensure the 4 pages back into a zeroed pool.
  CUDA_OK(cudaMemsetAsync(d_kv, 0, kKvBytes * kSlots, stream));
  CUDA_OK(cudaMemsetAsync(d_scale, 0, kScaleStride * kSlots, stream));
  int32_t *d_selected = nullptr, *d_translated = nullptr;
  const int32_t selected[kPages] = {2, 0, 3, 1};
  CUDA_OK(cudaMalloc(&d_selected, sizeof(selected)));
  CUDA_OK(cudaMalloc(&d_translated, sizeof(selected)));
  CUDA_OK(cudaMemcpy(d_selected, selected, sizeof(selected),
                     cudaMemcpyHostToDevice));
  ASSERT_EQ(kvt_mirror_ensure(m, d_selected, d_translated, stream), KVT_OK)
      << kvt_last_error();
  CUDA_OK(cudaStreamSynchronize(stream));
  int32_t translated[kPages];
  CUDA_OK(cudaMemcpy(translated, d_translated, sizeof(translated),
                     cudaMemcpyDeviceToHost));
  std::vector<uint8_t> got_kv(kKvBytes * kSlots), got_scale(h_scale.size());
  CUDA_OK(
      cudaMemcpy(got_kv.data(), d_kv, got_kv.size(), cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(got_scale.data(), d_scale, got_scale.size(),
                     cudaMemcpyDeviceToHost));
  std::set<int32_t> slots;
  for (uint32_t i = 0; i < kPages; ++i) {
    const int32_t s = translated[i];
    ASSERT_GE(s, 0);
    ASSERT_LT(s, static_cast<int32_t>(kSlots));
    slots.insert(s);
    EXPECT_EQ(0, std::memcmp(got_kv.data() + s * kKvBytes,
                             kv_row(rows[selected[i]]), kKvBytes));
    EXPECT_EQ(0, std::memcmp(got_scale.data() + s * kScaleStride,
                             scale_row(rows[selected[i]]), kScaleBytes));
  }
  EXPECT_EQ(slots.size(), kPages);

  // Adopt: another lookup finds the pages.
  const std::vector<uint8_t> h = Hashes(ns, kPages);
  const uint32_t logical[kPages] = {0, 1, 2, 3};
  kvt_commit_result res{};
  KVT_OK_(
      kvt_mirror_adopt(m, logical, kPages, nullptr, 0, h.data(), kPages, &res));
  EXPECT_EQ(res.committed_pages, kPages);
  kvt_lease* lease = nullptr;
  KVT_OK_(kvt_lookup(ns, h.data(), kPages, 1, &lease));
  ASSERT_EQ(kvt_lease_usable_pages(lease), kPages);
  for (uint32_t i = 0; i < kPages; ++i) {
    EXPECT_EQ(0, std::memcmp(kv_row(kvt_lease_rows(lease)[i]), kv_row(rows[i]),
                             kKvBytes));
  }
  EXPECT_EQ(kvt_lease_release(lease, nullptr), KVT_OK);

  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  kvt_mirror_close(m);
  cudaFree(d_entries);
  cudaFree(d_count);
  cudaFree(d_selected);
  cudaFree(d_translated);
  cudaFree(d_kv);
  cudaFree(d_scale);
  cudaStreamDestroy(stream);
  kvt_namespace_close(ns);
  kvt_client_close(client);
}

TEST(CApiDevicePoolGpu, DeviceSnapshotRestoredDeviceToDevice) {
  if (!HasDevice()) GTEST_SKIP() << "no CUDA device present";
  constexpr uint64_t kSnap = 65536;
  kvtier::testing::DaemonProcess daemon;
  ASSERT_TRUE(daemon
                  .Start({"--metrics_address=", "--device_pool_gpus=0",
                          "--device_pool_bytes=67108864",
                          "--device_pool_row_bytes=1048576"})
                  .ok());
  kvt_client* client = nullptr;
  KVT_OK_(kvt_connect(daemon.socket().c_str(), "c-gpu-pool", 0, &client));
  kvt_bank_layout bank = {"kv", kKvBytes, "bf16"};
  kvt_layout layout{};
  layout.model = "c-gpu-pool";
  layout.tokens_per_page = kTokens;
  layout.num_layers = 1;
  layout.page_banks = &bank;
  layout.num_page_banks = 1;
  layout.snapshot_row_bytes = kSnap;
  kvt_attach_options o{};
  o.name = "c_gpu_pool";
  o.layout = &layout;
  o.page_rows = 16;
  o.snapshot_rows = 4;
  o.register_with_cuda = 1;
  kvt_namespace* ns = nullptr;
  KVT_OK_(kvt_attach(client, &o, &ns));
  ASSERT_EQ(kvt_num_device_pools(ns), 1u);
  ASSERT_NE(kvt_device_pools_valid(ns), 0);
  kvt_device_pool_info info{};
  KVT_OK_(kvt_device_pool(ns, 0, &info));
  EXPECT_EQ(info.ipc_handle_len, 64u);
  EXPECT_EQ(info.withheld, 0);
  ASSERT_GE(info.row_bytes, kSnap);
  CUDA_OK(cudaSetDevice(0));
  kvt_device_pool_handle* dp = nullptr;
  KVT_OK_(kvt_device_pool_open(ns, 0, &dp));
  KVT_OK_(kvt_device_pool_check(dp));
  kvt_device_pool_info opened{};
  KVT_OK_(kvt_device_pool_describe(dp, &opened));
  EXPECT_EQ(opened.rows, info.rows);

  const std::vector<uint8_t> h = Hashes(ns, 2);
  const uint32_t hb = kvt_hash_bytes(ns);
  kvt_reservation* r = nullptr;
  KVT_OK_(kvt_reserve_with_device(ns, 2, 1, 1, 0, &r));
  ASSERT_EQ(kvt_reservation_num_device_snapshot_rows(r), 1u);
  const uint32_t slot = kvt_reservation_device_snapshot_rows(r)[0];
  kvt_bank_info snap_bank{};
  KVT_OK_(kvt_snapshot_bank(ns, &snap_bank));
  const std::vector<uint8_t> state = Random(kSnap, 3);
  std::memcpy(static_cast<uint8_t*>(snap_bank.base) +
                  kvt_reservation_snapshot_rows(r)[0] * snap_bank.row_stride,
              state.data(), kSnap);
  // The device copy differs in its first byte, so a restore shows its tier.
  std::vector<uint8_t> device_state = state;
  device_state[0] ^= 0xFF;
  uint8_t* d_src = nullptr;
  uint8_t* d_dst = nullptr;
  CUDA_OK(cudaMalloc(&d_src, kSnap));
  CUDA_OK(cudaMalloc(&d_dst, kSnap));
  CUDA_OK(
      cudaMemcpy(d_src, device_state.data(), kSnap, cudaMemcpyHostToDevice));
  KVT_OK_(kvt_device_pool_save(dp, slot, d_src, kSnap, nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  kvt_snapshot_placement host_snap = {0, h.data() + hb};
  kvt_snapshot_placement device_snap = {0, h.data() + hb};
  kvt_commit_result res{};
  KVT_OK_(kvt_commit_with_device(r, nullptr, 0, h.data(), 2, &host_snap, 1,
                                 &device_snap, 1, &res));
  EXPECT_EQ(res.committed_snapshots, 1u);

  std::vector<uint8_t> got(kSnap);
  kvt_lease* lease = nullptr;
  KVT_OK_(kvt_lookup_with_device(ns, h.data(), 2, 0, 1, &lease));
  ASSERT_NE(kvt_lease_has_device_snapshot(lease), 0);
  EXPECT_EQ(kvt_lease_device_snapshot_row(lease), slot);
  KVT_OK_(kvt_device_pool_restore(dp, lease, d_dst, kSnap, nullptr));
  CUDA_OK(cudaMemcpy(got.data(), d_dst, kSnap, cudaMemcpyDeviceToHost));
  EXPECT_EQ(got, device_state);
  EXPECT_EQ(kvt_lease_release(lease, nullptr), KVT_OK);
  KVT_OK_(kvt_lookup(ns, h.data(), 2, 1, &lease));
  ASSERT_NE(kvt_lease_has_snapshot(lease), 0);
  ASSERT_EQ(kvt_lease_has_device_snapshot(lease), 0);
  KVT_OK_(kvt_device_pool_restore(dp, lease, d_dst, kSnap, nullptr));
  CUDA_OK(cudaMemcpy(got.data(), d_dst, kSnap, cudaMemcpyDeviceToHost));
  EXPECT_EQ(got, state);
  EXPECT_EQ(kvt_lease_release(lease, nullptr), KVT_OK);

  ASSERT_TRUE(daemon.Stop().ok());
  const absl::Time end = absl::Now() + absl::Seconds(30);
  while (kvt_device_pools_valid(ns) != 0 && absl::Now() < end) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_EQ(kvt_device_pools_valid(ns), 0);
  EXPECT_EQ(kvt_device_pool_check(dp), KVT_UNAVAILABLE);
  void* p = nullptr;
  EXPECT_EQ(kvt_device_pool_slot(dp, 0, &p), KVT_UNAVAILABLE);
  kvt_device_pool_close(dp);
  cudaFree(d_src);
  cudaFree(d_dst);
  kvt_namespace_close(ns);
  kvt_client_close(client);
}

}  // namespace
