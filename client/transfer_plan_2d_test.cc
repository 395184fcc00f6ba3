// TransferPlan::PageCopies2D: how a pool's tensors group into 2D copies, and
// that the copies, executed with memcpy on host memory, move exactly what
// the reference engine moves (the copy-engine share of a staged transfer,
// TransferOptions::copy_engine_share, enqueues them as cudaMemcpy2DAsync).
#include <cstdint>
#include <cstring>
#include <optional>
#include <random>
#include <vector>

#include "client/pool.h"
#include "client/transfer_engine.h"
#include "client/transfer_plan.h"
#include "gtest/gtest.h"
#include "kernels/page_copy.h"

namespace kvtier::client {
namespace {

constexpr uint64_t kPages = 24;
constexpr uint64_t kRows = 16;
constexpr uint64_t kChunk = 96;

// One backing buffer: bank "kv" holds 6 tensors of kChunk bytes per page,
// each a [kPages][kChunk] array, back to back (a layer-first buffer: a
// page's chunks one array apart); bank "scale" holds two tensors of 40 and
// 24 bytes in arrays of their own, spaced irregularly.
struct Pool2D {
  std::vector<uint8_t> gpu, host;
  GpuPoolDescriptor pool;
  std::vector<NamedHostBank> banks;

  Pool2D() : gpu(8 * kPages * kChunk + 4096), host(2 * kRows * 1024) {
    const uint64_t g = reinterpret_cast<uint64_t>(gpu.data());
    const uint64_t h = reinterpret_cast<uint64_t>(host.data());
    pool.num_pages = kPages;
    BankPool kv{"kv", {}};
    for (uint64_t t = 0; t < 6; ++t) {
      kv.tensors.push_back(PoolTensor{g + t * kPages * kChunk, kChunk, kChunk});
    }
    const uint64_t scale = g + 6 * kPages * kChunk;
    BankPool sc{"scale", {{scale, 48, 40}, {scale + kPages * 48 + 32, 32, 24}}};
    pool.banks = {kv, sc};
    banks = {{"kv", HostBankView{h, kRows, 6 * kChunk, 6 * kChunk + 32}},
             {"scale", HostBankView{h + kRows * 1024, kRows, 64, 64}}};
    std::mt19937_64 rng(5);
    for (uint8_t& b : gpu) b = static_cast<uint8_t>(rng());
    for (uint8_t& b : host) b = static_cast<uint8_t>(rng());
  }
};

void Run2D(const std::vector<EngineCopy2D>& copies,
           kernels::CopyDirection dir) {
  for (const EngineCopy2D& c : copies) {
    for (uint64_t l = 0; l < c.lines; ++l) {
      auto* dev = reinterpret_cast<uint8_t*>(c.device + l * c.device_pitch);
      auto* host = reinterpret_cast<uint8_t*>(c.host + l * c.host_pitch);
      if (dir == kernels::CopyDirection::kToHost) {
        std::memcpy(host, dev, c.width);
      } else {
        std::memcpy(dev, host, c.width);
      }
    }
  }
}

TEST(TransferPlan2D, GroupsEquallySpacedTensorsOfABank) {
  Pool2D s;
  auto plan = TransferPlan::Create(s.pool, s.banks, std::nullopt);
  ASSERT_TRUE(plan.ok()) << plan.status();
  // kv: one copy of 6 lines; scale: two single lines (different sizes).
  EXPECT_EQ(plan->page_copies_2d(), 3u);
  std::vector<EngineCopy2D> copies;
  const uint32_t page = 5, row = 7;
  plan->PageCopies2D(absl::MakeConstSpan(&page, 1),
                     absl::MakeConstSpan(&row, 1), &copies);
  ASSERT_EQ(copies.size(), 3u);
  EXPECT_EQ(copies[0].lines, 6u);
  EXPECT_EQ(copies[0].width, kChunk);
  EXPECT_EQ(copies[0].device_pitch, kPages * kChunk);
  EXPECT_EQ(copies[0].host_pitch, kChunk);
  EXPECT_EQ(copies[0].device,
            reinterpret_cast<uint64_t>(s.gpu.data()) + page * kChunk);
  EXPECT_EQ(copies[0].host, s.banks[0].second.base + row * (6 * kChunk + 32));
  EXPECT_EQ(copies[1].lines, 1u);
  EXPECT_EQ(copies[1].width, 40u);
  EXPECT_EQ(copies[2].width, 24u);
}

TEST(TransferPlan2D, CopiesMatchTheReferenceBothWays) {
  // Two identical setups (the same seed), each over its own memory.
  Pool2D a, fresh;
  auto plan = TransferPlan::Create(a.pool, a.banks, std::nullopt);
  ASSERT_TRUE(plan.ok()) << plan.status();
  auto engine = TransferEngine::Create(Backend::kReference, fresh.pool,
                                       fresh.banks, std::nullopt);
  ASSERT_TRUE(engine.ok()) << engine.status();
  const std::vector<uint32_t> pages = {3, 17, 0, 23, 9};
  const std::vector<uint32_t> rows = {15, 2, 3, 0, 8};
  std::vector<EngineCopy2D> copies;
  plan->PageCopies2D(pages, rows, &copies);
  EXPECT_EQ(copies.size(), pages.size() * 3);
  Run2D(copies, kernels::CopyDirection::kToHost);
  ASSERT_TRUE((*engine)->Evict(pages, rows, nullptr).ok());
  EXPECT_EQ(a.host, fresh.host);  // padding and other rows untouched alike
  // Back into other pages.
  const std::vector<uint32_t> back = {1, 2, 4, 11, 20};
  copies.clear();
  plan->PageCopies2D(back, rows, &copies);
  Run2D(copies, kernels::CopyDirection::kFromHost);
  ASSERT_TRUE((*engine)->Rehydrate(back, rows, nullptr).ok());
  EXPECT_EQ(a.gpu, fresh.gpu);
}

TEST(TransferPlan2D, ShareOfAStagedTransferIsChecked) {
  Pool2D s;
  TransferOptions o;
  o.copy_engine_share = 40;
  auto plan = TransferPlan::Create(s.pool, s.banks, std::nullopt, o);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->CopyEngineSharePages(10), 4u);
  EXPECT_EQ(plan->CopyEngineSharePages(2), 0u);
  o.copy_engine_share = 101;
  plan = TransferPlan::Create(s.pool, s.banks, std::nullopt, o);
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(plan.status().message().find("copy_engine_share 101"),
            std::string::npos);
}

}  // namespace
}  // namespace kvtier::client
