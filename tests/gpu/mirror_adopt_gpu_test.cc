// Adoption of a write-through mirror into the prefix index, end to end with a
// real kvtierd: the pages reach the index host-to-host inside the daemon, and
// a lookup from another process (kvtier_test_client verify) reads identical
// bytes. HostWritten runs everywhere (the mirror rows are written on the
// host, standing in for MirrorStore); GpuMirrorStore stores the pages from a
// GPU pool with kvtier::client::Mirror first and GTEST_SKIPs without a device.
//
// Thread-safety: single-threaded tests.

#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "client/client.h"
#include "client/mirror.h"
#include "gtest/gtest.h"
#include "tests/daemon_process.h"
#include "tests/test_pattern.h"

namespace kvtier::testing {
namespace {

using client::AttachOptions;
using client::BankMapping;
using client::Client;
using client::GpuPoolDescriptor;
using client::Mirror;
using client::MirrorStoreEntry;

constexpr uint32_t kPages = 8;
constexpr uint64_t kSeed = 777;

std::string TestClient() {
  return ResolveProgram(KVTIER_TEST_CLIENT_PATH, "tests/kvtier_test_client");
}

// Runs `kvtier_test_client verify` for `ns`: exit 0 iff another process
// looks the kPages pages up and every byte of every bank matches.
void ExpectVerifiedElsewhere(const DaemonProcess& d, const std::string& ns) {
  auto child = Child::Spawn({TestClient(), "verify", d.socket(), ns,
                             std::to_string(kPages), std::to_string(kSeed)});
  ASSERT_TRUE(child.ok()) << child.status();
  auto rc = child->Wait(absl::Seconds(60));
  ASSERT_TRUE(rc.ok()) << rc.status();
  EXPECT_EQ(*rc, 0) << child->output();
}

bool HasDevice() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return n > 0;
}

TEST(MirrorAdopt, HostWrittenMirrorIsAdoptedAndReadElsewhere) {
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.Start().ok());
  auto client = Client::Connect({.socket = daemon.socket()});
  ASSERT_TRUE(client.ok()) << client.status();
  AttachOptions o = TestAttachOptions("adopt_host");
  o.register_with_cuda = false;
  auto ns = (*client)->Attach(o);
  ASSERT_TRUE(ns.ok()) << ns.status();
  // The mirror: 16 rows; logical page i sits at mirror index 15 - i.
  auto mirror = (*ns)->Reserve(16);
  ASSERT_TRUE(mirror.ok()) << mirror.status();
  std::vector<uint32_t> indices;
  for (uint32_t i = 0; i < kPages; ++i) {
    const uint32_t k = 15 - i;
    indices.push_back(k);
    for (size_t b = 0; b < (*ns)->page_banks().size(); ++b) {
      const BankMapping& bank = (*ns)->page_banks()[b];
      FillPattern(
          bank.base + uint64_t{mirror->page_rows()[k]} * bank.row_stride,
          bank.row_bytes, kSeed, i, b);
    }
  }
  const std::string hashes =
      (*ns)->hasher().HashChain(TestTokens(kSeed, kPages * 16));
  // Bad requests are refused and change nothing.
  std::vector<uint32_t> bad = indices;
  bad[3] = 16;
  auto refused = (*ns)->AdoptMirror(*mirror, bad, "", hashes);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("mirror_indices[3]"),
            std::string::npos)
      << refused.status();
  refused = (*ns)->AdoptMirror(
      *mirror, absl::MakeConstSpan(indices).subspan(0, 7), "", hashes);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  auto before = (*ns)->Lookup(hashes, /*pin=*/false);
  ASSERT_TRUE(before.ok());
  EXPECT_EQ(before->matched_pages(), 0u);

  auto adopted = (*ns)->AdoptMirror(*mirror, indices, "", hashes);
  ASSERT_TRUE(adopted.ok()) << adopted.status();
  EXPECT_EQ(adopted->committed_pages, kPages);
  // The index got its own rows: the mirror's rows stay the session's.
  auto lease = (*ns)->Lookup(hashes, /*pin=*/true);
  ASSERT_TRUE(lease.ok());
  ASSERT_EQ(lease->matched_pages(), kPages);
  for (uint32_t r : lease->rows()) {
    for (uint32_t m : mirror->page_rows()) EXPECT_NE(r, m);
  }
  ASSERT_TRUE(lease->Release().ok());
  // Overwriting the mirror now does not change what was adopted.
  for (size_t b = 0; b < (*ns)->page_banks().size(); ++b) {
    const BankMapping& bank = (*ns)->page_banks()[b];
    for (uint32_t m : mirror->page_rows()) {
      std::memset(bank.base + uint64_t{m} * bank.row_stride, 0xEE,
                  bank.row_bytes);
    }
  }
  ExpectVerifiedElsewhere(daemon, "adopt_host");
  // Adopting the same prefix again deduplicates.
  auto again = (*ns)->AdoptMirror(*mirror, indices, "", hashes);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->deduplicated_pages, kPages);
  EXPECT_TRUE(mirror->Abort().ok());
}

TEST(MirrorAdopt, GpuMirrorStoreThenAdoptIsReadElsewhere) {
  if (!HasDevice()) GTEST_SKIP() << "no CUDA device present";
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.Start().ok());
  auto client = Client::Connect({.socket = daemon.socket()});
  ASSERT_TRUE(client.ok()) << client.status();
  auto ns = (*client)->Attach(TestAttachOptions("adopt_gpu"));
  ASSERT_TRUE(ns.ok()) << ns.status();
  ASSERT_TRUE((*ns)->cuda_registered());
  // GPU pool: one tensor per bank ("kv" 4096 bytes = 256 per token,
  // "scale" 100 bytes: per page), 12 slots; logical page i in slot 11 - i.
  const uint32_t slots = 12;
  const uint64_t kv_bytes = 4096, scale_bytes = 100, scale_stride = 112;
  uint8_t *kv = nullptr, *scale = nullptr;
  ASSERT_EQ(cudaMalloc(&kv, kv_bytes * slots), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&scale, scale_stride * slots), cudaSuccess);
  std::vector<uint8_t> page(kv_bytes);
  for (uint32_t i = 0; i < kPages; ++i) {
    FillPattern(page.data(), kv_bytes, kSeed, i, 0);
    ASSERT_EQ(cudaMemcpy(kv + (11 - i) * kv_bytes, page.data(), kv_bytes,
                         cudaMemcpyHostToDevice),
              cudaSuccess);
    FillPattern(page.data(), scale_bytes, kSeed, i, 1);
    ASSERT_EQ(cudaMemcpy(scale + (11 - i) * scale_stride, page.data(),
                         scale_bytes, cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  GpuPoolDescriptor pool;
  pool.num_pages = slots;
  pool.banks = {
      {"kv", {{reinterpret_cast<uint64_t>(kv), kv_bytes, kv_bytes}}},
      {"scale",
       {{reinterpret_cast<uint64_t>(scale), scale_stride, scale_bytes}}}};
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  auto mirror = Mirror::Create(**ns, pool,
                               {.logical_pages = 16,
                                .gpu_slots = slots,
                                .max_batch = 1,
                                .max_selected = 8,
                                .max_store_entries = kPages * 16},
                               stream);
  ASSERT_TRUE(mirror.ok()) << mirror.status();
  // Store every token of the kPages pages (as prefill's store_kv would).
  std::vector<MirrorStoreEntry> entries;
  for (uint32_t i = 0; i < kPages; ++i) {
    for (int32_t t = 0; t < 16; ++t) {
      entries.push_back({.logical = static_cast<int32_t>(i),
                         .slot = static_cast<int32_t>(11 - i),
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
  ASSERT_TRUE((*mirror)->Store(d_entries, d_count, stream).ok());
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  unsigned long long drops = 1;
  ASSERT_EQ(
      cudaMemcpy(&drops, (*mirror)->store_drops(), 8, cudaMemcpyDeviceToHost),
      cudaSuccess);
  EXPECT_EQ(drops, 0u);
  std::vector<uint32_t> logical;
  for (uint32_t i = 0; i < kPages; ++i) logical.push_back(i);
  const std::string hashes =
      (*ns)->hasher().HashChain(TestTokens(kSeed, kPages * 16));
  auto adopted = (*mirror)->Adopt(logical, "", hashes);
  ASSERT_TRUE(adopted.ok()) << adopted.status();
  EXPECT_EQ(adopted->committed_pages, kPages);
  ExpectVerifiedElsewhere(daemon, "adopt_gpu");
  mirror->reset();
  cudaFree(d_entries);
  cudaFree(d_count);
  cudaFree(kv);
  cudaFree(scale);
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace kvtier::testing
