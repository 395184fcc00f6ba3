// Tests of the staged path's plan (slices, staging layout, copy lists) on
// the CPU: the plan executed with memcpy against a host "staging buffer" and
// compared with the reference backend byte for byte; the GPU tests
// (tests/gpu/transfer_engine_gpu_test.cc) run it on the device.

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "client/pool.h"
#include "client/transfer_engine.h"
#include "client/transfer_engine_test_util.h"
#include "gtest/gtest.h"
#include "kernels/page_copy.h"

namespace kvtier::client {
namespace {

using transfer_test::BankSpec;
using transfer_test::Bf16Layout;
using transfer_test::Buffer;
using transfer_test::DistinctRandom;
using transfer_test::Fp8Layout;
using transfer_test::HostSetup;
using transfer_test::OddLayout;
using transfer_test::RoundUp16;
using transfer_test::TensorSpec;

using kernels::CopyDirection;

// Rows with runs of consecutive ids (the copy lists merge those) mixed with
// scattered ones: n distinct rows below `below`.
std::vector<uint32_t> RowsWithRuns(uint32_t n, uint32_t below,
                                   std::mt19937& rng) {
  std::vector<uint32_t> starts(below);
  std::iota(starts.begin(), starts.end(), 0);
  std::shuffle(starts.begin(), starts.end(), rng);
  std::vector<bool> used(below, false);
  std::vector<uint32_t> out;
  for (uint32_t start : starts) {
    const uint32_t len = 1 + rng() % 6;
    for (uint32_t r = start;
         r < below && r < start + len && !used[r] && out.size() < n; ++r) {
      used[r] = true;
      out.push_back(r);
    }
    if (out.size() == n) break;
  }
  return out;
}

// Runs a transfer the way the staged CUDA path does, with memcpy for the
// kernel and the copy engine, through one host staging buffer pre-filled
// with 0xcd (so stray staging bytes in a row would show).
void RunStaged(const TransferPlan& plan, CopyDirection dir,
               absl::Span<const uint32_t> pages,
               absl::Span<const uint32_t> rows, size_t* copies_out = nullptr) {
  Buffer staging(plan.staging().buffer_bytes);
  std::memset(staging.data(), 0xcd, staging.size());
  kernels::PageCopyParams params;
  std::vector<EngineCopy> copies;
  size_t begin = 0;
  for (uint32_t n : plan.StagedSlices(dir, pages.size())) {
    ASSERT_LE(n, plan.staging().slice_pages);
    copies.clear();
    plan.StagedCopies(rows.subspan(begin, n), staging.addr(), &copies);
    for (const EngineCopy& c : copies) {
      ASSERT_GE(c.device, staging.addr());
      ASSERT_LE(c.device + c.bytes, staging.addr() + staging.size());
    }
    plan.FillStagedSlice(dir, pages, begin, n, staging.addr(), &params);
    EXPECT_EQ(params.header.max_ctas, plan.options().staging_ctas);
    if (dir == CopyDirection::kToHost) {
      ASSERT_TRUE(kernels::RunPageCopyReference(params).ok());
    }
    for (const EngineCopy& c : copies) {
      if (dir == CopyDirection::kToHost) {
        std::memcpy(reinterpret_cast<void*>(c.host),
                    reinterpret_cast<const void*>(c.device), c.bytes);
      } else {
        std::memcpy(reinterpret_cast<void*>(c.device),
                    reinterpret_cast<const void*>(c.host), c.bytes);
      }
    }
    if (dir == CopyDirection::kFromHost) {
      ASSERT_TRUE(kernels::RunPageCopyReference(params).ok());
    }
    if (copies_out != nullptr) *copies_out += copies.size();
    begin += n;
  }
  EXPECT_EQ(begin, pages.size());
}

// Evicts and rehydrates with the staged plan on one setup and with the
// reference engine on an identical one; compares banks (padding included)
// and pools after each step.
void StagedMatchesReference(const std::vector<BankSpec>& spec,
                            uint64_t num_pages, uint64_t rows, uint32_t n,
                            uint64_t staging_pages) {
  HostSetup staged(spec, num_pages, rows), ref(spec, num_pages, rows);
  staged.FillPoolRandom(17);
  ref.FillPoolRandom(17);
  TransferOptions o;
  o.path = TransferPath::kStaged;
  uint64_t page_bytes = 0;
  for (const NamedHostBank& b : staged.views) page_bytes += b.second.row_stride;
  o.staging_bytes = staging_pages * page_bytes + page_bytes / 2;
  auto plan = TransferPlan::Create(staged.pool, staged.views, std::nullopt, o);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->path(), TransferPath::kStaged);
  ASSERT_EQ(plan->staging().slice_pages, staging_pages);
  ASSERT_EQ(plan->staging().buffer_bytes, staging_pages * page_bytes);
  auto engine = TransferEngine::Create(Backend::kReference, ref.pool, ref.views,
                                       std::nullopt);
  ASSERT_TRUE(engine.ok()) << engine.status();

  std::mt19937 rng(23);
  const std::vector<uint32_t> shuffled = DistinctRandom(
      static_cast<uint32_t>(num_pages), static_cast<uint32_t>(num_pages), rng);
  const std::vector<uint32_t> src(shuffled.begin(), shuffled.begin() + n);
  const std::vector<uint32_t> dst(shuffled.begin() + n,
                                  shuffled.begin() + 2 * n);
  const std::vector<uint32_t> row_ids =
      RowsWithRuns(n, static_cast<uint32_t>(rows), rng);
  ASSERT_EQ(row_ids.size(), n);

  ASSERT_NO_FATAL_FAILURE(
      RunStaged(*plan, CopyDirection::kToHost, src, row_ids));
  ASSERT_TRUE((*engine)->Evict(src, row_ids, nullptr).ok());
  ASSERT_EQ(staged.SnapshotBanks(), ref.SnapshotBanks());
  ASSERT_NO_FATAL_FAILURE(
      RunStaged(*plan, CopyDirection::kFromHost, dst, row_ids));
  ASSERT_TRUE((*engine)->Rehydrate(dst, row_ids, nullptr).ok());
  ASSERT_EQ(staged.SnapshotPool(), ref.SnapshotPool());
}

TEST(TransferEngineStagedPlan, Bf16MatchesReference) {
  StagedMatchesReference(Bf16Layout(4), 64, 48, 30, 4);
}

TEST(TransferEngineStagedPlan, Fp8WithScaleBankMatchesReference) {
  StagedMatchesReference(Fp8Layout(4), 80, 60, 37, 5);
}

TEST(TransferEngineStagedPlan, OddRowSizesWithPaddingMatchReference) {
  StagedMatchesReference(OddLayout(), 700, 400, 333, 64);
}

TEST(TransferEngineStagedPlan, OnePageSlicesMatchReference) {
  StagedMatchesReference(Fp8Layout(2), 20, 16, 9, 1);
}

TEST(TransferEngineStagedPlan, ConsecutivePackedRowsTakeOneCopyPerSlice) {
  const std::vector<BankSpec> spec = {BankSpec{"kv", {{64, 64}, {48, 48}}}};
  HostSetup s(spec, 256, 256);
  TransferOptions o;
  o.staging_bytes = 16 * 112;
  auto plan = TransferPlan::Create(s.pool, s.views, std::nullopt, o);
  ASSERT_TRUE(plan.ok()) << plan.status();
  std::vector<uint32_t> pages(100), rows(100);
  std::iota(pages.begin(), pages.end(), 50);
  std::iota(rows.begin(), rows.end(), 7);
  size_t copies = 0;
  ASSERT_NO_FATAL_FAILURE(
      RunStaged(*plan, CopyDirection::kToHost, pages, rows, &copies));
  EXPECT_EQ(copies, plan->StagedSlices(CopyDirection::kToHost, 100).size());
  for (uint32_t i = 0; i < 100; ++i) {
    ASSERT_EQ(0, std::memcmp(s.banks[0]->data() + (7 + i) * 112,
                             s.Page(0, 50 + i), 64));
  }
  // Padded rows are copied one by one, never across the padding.
  HostSetup odd(OddLayout(), 64, 64);
  auto odd_plan = TransferPlan::Create(odd.pool, odd.views, std::nullopt, o);
  ASSERT_TRUE(odd_plan.ok());
  std::vector<EngineCopy> list;
  odd_plan->StagedCopies(absl::MakeSpan(rows).subspan(0, 5), 0x1000, &list);
  EXPECT_EQ(list.size(), 10u);  // 5 rows x 2 banks
  for (const EngineCopy& c : list) EXPECT_TRUE(c.bytes == 194 || c.bytes == 3);
}

// By default the first slice is kAutoFirstSliceBytes whatever the buffer,
// so the default 64 MiB buffers leave small transfers as 16 MiB ones did.
TEST(TransferEngineStagedPlan, DefaultFirstSliceIsTwoMiB) {
  const std::vector<BankSpec> spec = {BankSpec{"kv", {{65536, 65536}}}};
  HostSetup s(spec, 300, 300);
  auto plan =
      TransferPlan::Create(s.pool, s.views, std::nullopt, TransferOptions());
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->staging().slice_pages, kMaxSlicePages);
  static_assert(kAutoFirstSliceBytes / 65536 == 32);
  EXPECT_EQ(plan->StagedSlices(CopyDirection::kToHost, 300),
            (std::vector<uint32_t>{32, 64, 128, 76}));
  EXPECT_EQ(plan->StagedSlices(CopyDirection::kFromHost, 300),
            (std::vector<uint32_t>{76, 128, 64, 32}));
  EXPECT_EQ(plan->StagedSlices(CopyDirection::kToHost, 20),
            (std::vector<uint32_t>{20}));
}

TEST(TransferEngineStagedPlan, SlicesRampUpForEvictAndDownForRehydrate) {
  const std::vector<BankSpec> spec = {BankSpec{"kv", {{4096, 4096}}}};
  HostSetup s(spec, 1024, 1024);
  TransferOptions o;
  o.staging_bytes = 64 * 4096;
  o.first_slice_bytes = 8 * 4096;
  auto plan = TransferPlan::Create(s.pool, s.views, std::nullopt, o);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->staging().slice_pages, 64u);
  EXPECT_EQ(plan->StagedSlices(CopyDirection::kToHost, 300),
            (std::vector<uint32_t>{8, 16, 32, 64, 64, 64, 52}));
  EXPECT_EQ(plan->StagedSlices(CopyDirection::kFromHost, 300),
            (std::vector<uint32_t>{52, 64, 64, 64, 32, 16, 8}));
  EXPECT_EQ(plan->StagedSlices(CopyDirection::kToHost, 5),
            (std::vector<uint32_t>{5}));
  EXPECT_TRUE(plan->StagedSlices(CopyDirection::kToHost, 0).empty());
  // Never more than kMaxSlicePages pages, whatever the buffer.
  o.staging_bytes = 1 << 30;
  plan = TransferPlan::Create(s.pool, s.views, std::nullopt, o);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->staging().slice_pages, kMaxSlicePages);
  EXPECT_EQ(plan->staging().buffer_bytes, kMaxSlicePages * 4096ull);
}

TEST(TransferEngineStagedPlan, OptionsAreChecked) {
  HostSetup s(Fp8Layout(2), 16, 8);  // a page: 4 x 16 KiB + 4 x 64 B
  const uint64_t page = 4 * 16384 + 4 * 64;
  TransferOptions o;
  o.path = TransferPath::kStaged;
  o.staging_bytes = page - 16;
  auto plan = TransferPlan::Create(s.pool, s.views, std::nullopt, o);
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(plan.status().message().find("staging_bytes"), std::string::npos)
      << plan.status();
  o.path = TransferPath::kAuto;  // falls back to the direct path
  plan = TransferPlan::Create(s.pool, s.views, std::nullopt, o);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->path(), TransferPath::kDirect);
  EXPECT_EQ(plan->staging().slice_pages, 0u);
  o.staging_bytes = page;
  plan = TransferPlan::Create(s.pool, s.views, std::nullopt, o);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->path(), TransferPath::kStaged);
  o.path = TransferPath::kDirect;
  plan = TransferPlan::Create(s.pool, s.views, std::nullopt, o);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->path(), TransferPath::kDirect);

  struct Bad {
    TransferOptions o;
    std::string want;
  };
  std::vector<Bad> bad(5);
  bad[0].o.staging_bytes = 0;
  bad[0].want = "staging_bytes 0";
  bad[1].o.staging_bytes = kMaxStagingBytes + 1;
  bad[1].want = "staging_bytes";
  bad[2].o.staging_ctas = 0;
  bad[2].want = "staging_ctas 0";
  bad[3].o.max_ctas = kernels::kMaxCtasLimit + 1;
  bad[3].want = "max_ctas";
  bad[4].o.path = static_cast<TransferPath>(7);
  bad[4].want = "path 7";
  for (const Bad& b : bad) {
    plan = TransferPlan::Create(s.pool, s.views, std::nullopt, b.o);
    EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(plan.status().message().find(b.want), std::string::npos)
        << "'" << b.want << "' not in: " << plan.status();
  }
  // The reference backend always copies directly.
  auto engine = TransferEngine::Create(Backend::kReference, s.pool, s.views,
                                       std::nullopt);
  ASSERT_TRUE(engine.ok());
  EXPECT_EQ((*engine)->path(), TransferPath::kDirect);
  EXPECT_EQ((*engine)->SlicesFor(CopyDirection::kToHost, 300), 3u);
}

TEST(TransferEngineStagedPlan, SnapshotCopiesMergeDeviceContiguousSegments) {
  HostSetup s(OddLayout(), 4, 4);
  // Segments 0 and 1 interleaved in one slot-major block (contiguous per
  // slot), segment 2 on its own.
  Buffer block(4 * 1024), other(4 * 512);
  s.pool.snapshot = {PoolTensor{block.addr(), 1024, 608},
                     PoolTensor{block.addr() + 608, 1024, 400},
                     PoolTensor{other.addr(), 512, 500}};
  s.pool.num_snapshot_slots = 4;
  Buffer bank(3 * 1520);
  auto plan = TransferPlan::Create(s.pool, s.views,
                                   HostBankView{bank.addr(), 3, 1508, 1520});
  ASSERT_TRUE(plan.ok()) << plan.status();
  std::vector<EngineCopy> copies;
  plan->SnapshotCopies({2}, 1, &copies);
  ASSERT_EQ(copies.size(), 2u);
  EXPECT_EQ(copies[0].device, block.addr() + 2 * 1024);
  EXPECT_EQ(copies[0].host, bank.addr() + 1520);
  EXPECT_EQ(copies[0].bytes, 1008u);
  EXPECT_EQ(copies[1].device, other.addr() + 2 * 512);
  EXPECT_EQ(copies[1].host, bank.addr() + 1520 + 1008);
  EXPECT_EQ(copies[1].bytes, 500u);
}

}  // namespace
}  // namespace kvtier::client
