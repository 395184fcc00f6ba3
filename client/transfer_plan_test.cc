// Tests of TransferPlan: descriptor validation (every rule, with its message),
// per-call checks, and slicing into kernel parameter blocks. The plan never
// touches memory, so addresses here are synthetic.

#include "client/transfer_plan.h"

#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "client/pool.h"
#include "gtest/gtest.h"
#include "kernels/page_copy.h"

namespace kvtier::client {
namespace {

using kernels::CopyDirection;
using kernels::PageCopyParams;

constexpr uint64_t kPages = 64;
constexpr uint64_t kRows = 32;

// Two banks: "kv" with 4 tensors of 4 KiB (region per tensor) and "scale"
// with 4 tensors of 100 bytes.
struct PlanInputs {
  GpuPoolDescriptor pool;
  std::vector<NamedHostBank> banks;
  std::optional<HostBankView> snapshot;

  PlanInputs() {
    pool.device = 0;
    pool.num_pages = kPages;
    BankPool kv{"kv", {}};
    uint64_t addr = 0x7f0000000000;
    for (int i = 0; i < 4; ++i) {
      kv.tensors.push_back(PoolTensor{addr, 4096, 4096});
      addr += 4096 * kPages;
    }
    BankPool scale{"scale", {}};
    for (int i = 0; i < 4; ++i) {
      scale.tensors.push_back(PoolTensor{addr, 112, 100});
      addr += 112 * kPages;
    }
    pool.banks = {kv, scale};
    banks = {{"kv", HostBankView{0x100000000, kRows, 4 * 4096, 4 * 4096}},
             {"scale", HostBankView{0x200000000, kRows, 400, 400}}};
  }

  void AddSnapshot() {
    pool.snapshot = {PoolTensor{0x7e0000000000, 1 << 20, 1 << 20},
                     PoolTensor{0x7e0001000000, 4096, 1000}};
    pool.num_snapshot_slots = 4;
    snapshot = HostBankView{0x300000000, 3, (1 << 20) + 1000, (1 << 20) + 1008};
  }

  absl::StatusOr<TransferPlan> Create() const {
    return TransferPlan::Create(pool, banks, snapshot);
  }
};

// Expects Create to fail with INVALID_ARGUMENT and a message containing
// every one of `parts`.
void ExpectRejected(const PlanInputs& s, std::vector<std::string> parts) {
  absl::StatusOr<TransferPlan> plan = s.Create();
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument)
      << plan.status();
  for (const std::string& p : parts) {
    EXPECT_NE(plan.status().message().find(p), std::string::npos)
        << "'" << p << "' not in: " << plan.status().message();
  }
}

TEST(TransferPlan, AcceptsValidDescriptorAndBuildsSegments) {
  PlanInputs s;
  s.AddSnapshot();
  absl::StatusOr<TransferPlan> plan = s.Create();
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->rows(), kRows);
  EXPECT_TRUE(plan->has_snapshot());

  const std::vector<uint32_t> pages = {3, 9, 63};
  const std::vector<uint32_t> rows = {0, 31, 7};
  ASSERT_TRUE(plan->CheckPages(CopyDirection::kToHost, pages, rows).ok());
  auto p = std::make_unique<PageCopyParams>();
  plan->FillPageSlice(CopyDirection::kToHost, pages, rows, 0, p.get());
  EXPECT_TRUE(kernels::CheckPageCopyParams(*p).ok());
  EXPECT_EQ(p->header.num_items, 3u);
  EXPECT_EQ(p->header.num_segments, 8u);
  EXPECT_EQ(p->header.direction, CopyDirection::kToHost);
  EXPECT_EQ(p->header.chunks_per_item, 8u);  // every tensor fits one chunk
  EXPECT_EQ(p->gpu_index[2], 63u);
  EXPECT_EQ(p->host_index[1], 31u);
  // Rows are page-first: tensors back to back in descriptor order.
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(p->segments[i].host_base, 0x100000000u + 4096u * i);
    EXPECT_EQ(p->segments[i].host_stride, 4u * 4096);
    EXPECT_EQ(p->segments[4 + i].host_base, 0x200000000u + 100u * i);
    EXPECT_EQ(p->segments[4 + i].host_stride, 400u);
    EXPECT_EQ(p->segments[4 + i].gpu_stride, 112u);
    EXPECT_EQ(p->segments[4 + i].bytes, 100u);
  }

  ASSERT_TRUE(plan->CheckSnapshot({3}, 2).ok());
  plan->FillSnapshot(CopyDirection::kFromHost, {3}, 2, p.get());
  EXPECT_TRUE(kernels::CheckPageCopyParams(*p).ok());
  EXPECT_EQ(p->header.num_items, 1u);
  EXPECT_EQ(p->header.num_segments, 2u);
  EXPECT_EQ(p->header.chunks_per_item, 64u + 1u);  // 1 MiB = 64 chunks
  EXPECT_EQ(p->segments[1].host_base, 0x300000000u + (1u << 20));
  EXPECT_EQ(p->gpu_index[0], 3u);
  EXPECT_EQ(p->host_index[0], 2u);
}

TEST(TransferPlan, SlicesAtMost128Pages) {
  EXPECT_EQ(TransferPlan::NumSlices(0), 0u);
  EXPECT_EQ(TransferPlan::NumSlices(1), 1u);
  EXPECT_EQ(TransferPlan::NumSlices(128), 1u);
  EXPECT_EQ(TransferPlan::NumSlices(129), 2u);
  EXPECT_EQ(TransferPlan::NumSlices(2000), 16u);

  PlanInputs s;
  s.pool.num_pages = 4096;
  for (auto& b : s.pool.banks) {
    for (size_t j = 0; j < b.tensors.size(); ++j) {
      b.tensors[j].base =
          0x10000000000 * (j + 1) + (b.bank == "kv" ? 0 : 0x8000000000);
    }
  }
  for (auto& b : s.banks) b.second.rows = 4096;
  absl::StatusOr<TransferPlan> plan = s.Create();
  ASSERT_TRUE(plan.ok()) << plan.status();
  std::vector<uint32_t> pages(2000), rows(2000);
  for (uint32_t i = 0; i < 2000; ++i) {
    pages[i] = 4095 - i;
    rows[i] = i;
  }
  ASSERT_TRUE(plan->CheckPages(CopyDirection::kFromHost, pages, rows).ok());
  auto p = std::make_unique<PageCopyParams>();
  size_t items = 0;
  for (size_t k = 0; k < 16; ++k) {
    plan->FillPageSlice(CopyDirection::kFromHost, pages, rows, k, p.get());
    ASSERT_LE(p->header.num_items, kMaxSlicePages);
    for (uint32_t i = 0; i < p->header.num_items; ++i) {
      ASSERT_EQ(p->gpu_index[i], pages[items + i]);
      ASSERT_EQ(p->host_index[i], rows[items + i]);
    }
    items += p->header.num_items;
  }
  EXPECT_EQ(items, 2000u);
  EXPECT_EQ(p->header.num_items, 2000u - 15 * 128);
}

TEST(TransferPlan, RejectsBankMismatches) {
  {
    PlanInputs s;
    s.pool.num_pages = 0;
    ExpectRejected(s, {"num_pages is 0"});
  }
  {
    PlanInputs s;
    s.pool.banks.pop_back();
    ExpectRejected(s, {"describes 1 banks", "namespace has 2", "kv, scale"});
  }
  {
    PlanInputs s;
    std::swap(s.pool.banks[0], s.pool.banks[1]);
    ExpectRejected(s, {"banks[0].bank is 'scale'", "page bank 0 is 'kv'"});
  }
  {
    PlanInputs s;
    s.pool.banks[1].bank = "scales";
    ExpectRejected(s, {"banks[1].bank is 'scales'"});
  }
  {
    PlanInputs s;
    s.banks[1].first = "kv";
    s.pool.banks[1].bank = "kv";
    ExpectRejected(s, {"'kv' appears twice"});
  }
  {
    PlanInputs s;
    s.banks.clear();
    s.pool.banks.clear();
    ExpectRejected(s, {"no page banks"});
  }
  {
    PlanInputs s;
    s.pool.banks[1].tensors.clear();
    ExpectRejected(s, {"banks[1] ('scale') lists no tensors"});
  }
}

TEST(TransferPlan, RejectsBadTensors) {
  {
    PlanInputs s;
    s.pool.banks[0].tensors[1].base = 0;
    ExpectRejected(s, {"banks[0].tensors[1].base is null"});
  }
  {
    PlanInputs s;
    s.pool.banks[1].tensors[2].base += 8;
    ExpectRejected(s, {"banks[1].tensors[2].base 0x7f0000103808 is misaligned",
                       "multiples of 16"});
  }
  {
    PlanInputs s;
    s.pool.banks[1].tensors[0].page_stride = 120;
    ExpectRejected(s, {"banks[1].tensors[0].page_stride 120", "misaligned"});
  }
  {
    PlanInputs s;
    s.pool.banks[0].tensors[3].bytes_per_page = 0;
    ExpectRejected(s, {"banks[0].tensors[3].bytes_per_page is 0"});
  }
  {
    PlanInputs s;
    s.pool.num_pages = 1;
    s.pool.banks[0].tensors[0].bytes_per_page = 1ull << 32;
    ExpectRejected(s, {"banks[0].tensors[0].bytes_per_page", "below 4 GiB"});
  }
  {
    PlanInputs s;
    s.pool.banks[0].tensors[2].page_stride = 2048;
    ExpectRejected(s, {"banks[0].tensors[2]", "pages overlap each other",
                       "page_stride 2048 < bytes_per_page 4096"});
  }
  {
    PlanInputs s;  // tensor 1 starts inside tensor 0's range
    s.pool.banks[0].tensors[1].base = s.pool.banks[0].tensors[0].base + 4096;
    ExpectRejected(s, {"banks[0].tensors[1] overlaps banks[0].tensors[0]"});
  }
  {
    PlanInputs s;  // a scale tensor on top of a kv tensor
    s.pool.banks[1].tensors[3].base = s.pool.banks[0].tensors[2].base + 64;
    ExpectRejected(s, {"banks[1].tensors[3] overlaps banks[0].tensors[2]"});
  }
  {
    PlanInputs s;
    s.pool.banks[0].tensors[0].base = 0xfffffffffffff000;
    ExpectRejected(s, {"banks[0].tensors[0]", "address range overflows"});
  }
  {
    PlanInputs s;
    s.pool.banks[1].tensors[1].bytes_per_page = 96;
    ExpectRejected(
        s, {"banks[1] ('scale')", "add up to 396 bytes", "row_bytes is 400"});
  }
  {
    PlanInputs s;
    s.pool.banks[0].tensors.resize(kMaxPoolTensors);
    uint64_t addr = 0x10000000000;
    for (auto& t : s.pool.banks[0].tensors) {
      t = PoolTensor{addr, 16, 16};
      addr += 16 * kPages;
    }
    s.banks[0].second.row_bytes = s.banks[0].second.row_stride =
        16 * kMaxPoolTensors;
    // 768 kv tensors + 4 scale tensors.
    ExpectRejected(s, {"772 tensors", "at most 768"});
    s.pool.banks[0].tensors.resize(kMaxPoolTensors - 4);
    s.banks[0].second.row_bytes = s.banks[0].second.row_stride =
        16 * (kMaxPoolTensors - 4);
    EXPECT_TRUE(s.Create().ok()) << s.Create().status();
  }
}

TEST(TransferPlan, InterleavedTensorsMayShareAStrideButNotBytes) {
  // K and V of a page side by side: [K0 V0][K1 V1]..., stride 2 * 4096.
  PlanInputs s;
  const uint64_t base = 0x7a0000000000;
  s.pool.banks[0].tensors = {PoolTensor{base, 8192, 4096},
                             PoolTensor{base + 4096, 8192, 4096}};
  s.banks[0].second.row_bytes = s.banks[0].second.row_stride = 8192;
  ASSERT_TRUE(s.Create().ok()) << s.Create().status();
  // V shifted by 16 bytes into K's bytes.
  s.pool.banks[0].tensors[1].base = base + 4096 - 16;
  ExpectRejected(s, {"banks[0].tensors[1] overlaps banks[0].tensors[0]"});
  // V ending past the stride runs into the next page's K.
  s.pool.banks[0].tensors[1].base = base + 4096 + 16;
  ExpectRejected(s, {"banks[0].tensors[1] overlaps banks[0].tensors[0]"});
}

TEST(TransferPlan, RejectsBadHostBanks) {
  {
    PlanInputs s;
    s.banks[0].second.base = 0;
    ExpectRejected(s, {"page bank 'kv': base is null"});
  }
  {
    PlanInputs s;
    s.banks[1].second.base += 4;
    ExpectRejected(s, {"page bank 'scale': base", "misaligned"});
  }
  {
    PlanInputs s;
    s.banks[1].second.row_stride = 408;
    ExpectRejected(s, {"page bank 'scale': row_stride 408", "misaligned"});
  }
  {
    PlanInputs s;
    s.banks[1].second.row_stride = 384;
    ExpectRejected(s, {"row_stride 384 is smaller than row_bytes 400"});
  }
  {
    PlanInputs s;
    s.banks[0].second.rows = 0;
    ExpectRejected(s, {"page bank 'kv': rows is 0"});
  }
  {
    PlanInputs s;
    s.banks[1].second.rows = kRows - 1;
    ExpectRejected(s, {"page bank 'scale' has 31 rows", "same rows"});
  }
  {
    PlanInputs s;
    s.banks[1].second.base = s.banks[0].second.base + 4096;
    ExpectRejected(s, {"page bank 'scale' overlaps page bank 'kv'"});
  }
  {
    PlanInputs s;
    s.banks[0].second.base = s.pool.banks[0].tensors[1].base;
    ExpectRejected(s, {"banks[0].tensors[1] overlaps page bank 'kv'"});
  }
  {
    PlanInputs s;
    TransferOptions o;
    o.max_ctas = 0;
    auto plan = TransferPlan::Create(s.pool, s.banks, s.snapshot, o);
    EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(plan.status().message().find("max_ctas 0"), std::string::npos);
  }
}

TEST(TransferPlan, RejectsBadSnapshots) {
  {
    PlanInputs s;
    s.AddSnapshot();
    s.pool.num_snapshot_slots = 0;
    ExpectRejected(s, {"num_snapshot_slots is 0"});
  }
  {
    PlanInputs s;
    s.AddSnapshot();
    s.snapshot.reset();
    ExpectRejected(s, {"no snapshot bank is given"});
  }
  {
    PlanInputs s;
    s.AddSnapshot();
    s.pool.snapshot.clear();
    ExpectRejected(s,
                   {"num_snapshot_slots is 4", "lists no snapshot segments"});
  }
  {
    PlanInputs s;
    s.AddSnapshot();
    s.pool.snapshot.clear();
    s.pool.num_snapshot_slots = 0;
    ExpectRejected(s, {"a snapshot bank is given"});
  }
  {
    PlanInputs s;
    s.AddSnapshot();
    s.pool.snapshot[1].bytes_per_page = 999;
    ExpectRejected(s, {"snapshot", "add up to", "row_bytes is 1049576"});
  }
  {
    PlanInputs s;
    s.AddSnapshot();
    s.pool.snapshot[0].base = 0x7e0000000008;
    ExpectRejected(s, {"snapshot[0].base", "misaligned"});
  }
  {
    PlanInputs s;
    s.AddSnapshot();  // slot 1 of segment 1 lands on segment 0's slot 0
    s.pool.snapshot[1].base =
        s.pool.snapshot[0].base - s.pool.snapshot[1].page_stride;
    ExpectRejected(s, {"snapshot[1] overlaps snapshot[0]"});
  }
  {
    PlanInputs s;
    s.AddSnapshot();
    s.snapshot->row_stride = 16;
    ExpectRejected(s, {"snapshot bank: row_stride 16 is smaller"});
  }
}

// vLLM's hybrid manager overlays Mamba state blocks and attention pages on
// one allocation: a snapshot segment may be the very memory of a page tensor.
TEST(TransferPlan, AcceptsSnapshotSegmentsOverlayingPages) {
  PlanInputs s;
  s.AddSnapshot();
  const PoolTensor& kv = s.pool.banks[0].tensors[0];
  s.pool.snapshot = {PoolTensor{kv.base, kv.page_stride, kv.bytes_per_page}};
  s.pool.num_snapshot_slots = s.pool.num_pages;
  s.snapshot =
      HostBankView{0x300000000, 3, kv.bytes_per_page, kv.bytes_per_page};
  absl::StatusOr<TransferPlan> plan = s.Create();
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(plan->has_snapshot());
  EXPECT_TRUE(plan->CheckSnapshot({1}, 2).ok());
}

TEST(TransferPlan, RejectsBadCalls) {
  PlanInputs s;
  absl::StatusOr<TransferPlan> plan = s.Create();
  ASSERT_TRUE(plan.ok());
  auto expect = [&](CopyDirection d, std::vector<uint32_t> pages,
                    std::vector<uint32_t> rows, std::string want) {
    absl::Status st = plan->CheckPages(d, pages, rows);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_NE(st.message().find(want), std::string::npos)
        << "'" << want << "' not in: " << st.message();
  };
  expect(CopyDirection::kToHost, {1, 2, 3}, {1, 2},
         "gpu_pages has 3 entries but rows has 2");
  expect(CopyDirection::kToHost, {1, 64, 3}, {1, 2, 3},
         "gpu_pages[1] = 64 is out of range: the pool has 64 pages");
  expect(CopyDirection::kFromHost, {1, 2, 3}, {1, 2, 32},
         "rows[2] = 32 is out of range: the page banks have 32 rows");
  expect(CopyDirection::kToHost, {1, 2, 3}, {5, 6, 5},
         "rows[2] = 5 repeats rows[0]");
  expect(CopyDirection::kFromHost, {7, 2, 2}, {1, 2, 3},
         "gpu_pages[2] = 2 repeats gpu_pages[1]");
  // Repeated sources are fine: only destinations must be distinct.
  EXPECT_TRUE(
      plan->CheckPages(CopyDirection::kToHost, {{2, 2}}, {{0, 1}}).ok());
  EXPECT_TRUE(
      plan->CheckPages(CopyDirection::kFromHost, {{0, 1}}, {{2, 2}}).ok());
  EXPECT_TRUE(plan->CheckPages(CopyDirection::kToHost, {}, {}).ok());

  EXPECT_EQ(plan->CheckSnapshot({0}, 0).code(),
            absl::StatusCode::kFailedPrecondition);
  s.AddSnapshot();
  plan = s.Create();
  ASSERT_TRUE(plan.ok());
  absl::Status st = plan->CheckSnapshot({4}, 0);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("slot 4 is out of range"), std::string::npos);
  st = plan->CheckSnapshot({0}, 3);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("row 3 is out of range"), std::string::npos);
}

// --------------------------------------------------------- staged ramp --

// The slices of a staged transfer: the first of an eviction (the last of a
// rehydration) is first_slice_bytes in whole pages (kAutoFirstSliceBytes
// by default, a whole buffer where that is smaller), then they double up to
// a full buffer.
TEST(TransferPlan, StagedSlicesRampFromTheFirstSlice) {
  PlanInputs s;
  const uint64_t page = 4 * 4096 + 400;  // both banks' row strides
  auto sizes = [&](uint64_t first_slice_bytes, kernels::CopyDirection d,
                   size_t pages) {
    TransferOptions o;
    o.path = TransferPath::kStaged;
    o.staging_bytes = 32 * page;
    o.first_slice_bytes = first_slice_bytes;
    absl::StatusOr<TransferPlan> plan =
        TransferPlan::Create(s.pool, s.banks, s.snapshot, o);
    EXPECT_TRUE(plan.ok()) << plan.status();
    EXPECT_EQ(plan->staging().slice_pages, 32u);
    return plan->StagedSlices(d, pages);
  };
  using V = std::vector<uint32_t>;
  const auto out = kernels::CopyDirection::kToHost;
  const auto in = kernels::CopyDirection::kFromHost;
  // 2 MiB is 124 of these pages: more than the 32-page buffer.
  EXPECT_EQ(sizes(0, out, 64), (V{32, 32}));
  EXPECT_EQ(sizes(page, out, 64), (V{1, 2, 4, 8, 16, 32, 1}));
  EXPECT_EQ(sizes(3 * page - 1, out, 10), (V{2, 4, 4}));
  EXPECT_EQ(sizes(page - 1, out, 3), (V{1, 2}));  // at least one page
  EXPECT_EQ(sizes(32 * page, out, 40), (V{32, 8}));
  EXPECT_EQ(sizes(page, in, 64), (V{1, 32, 16, 8, 4, 2, 1}));
}

// The pipeline's edge slice (an eviction's first gather, a rehydration's
// last scatter) runs on max(staging_ctas, edge_slice_ctas) CTAs; every other
// slice on staging_ctas; edge_slice_ctas = 0 turns it off.
TEST(TransferPlan, EdgeSliceRunsOnAWiderGrid) {
  PlanInputs s;
  auto ctas = [&](uint32_t staging, uint32_t edge_ctas, bool edge) {
    TransferOptions o;
    o.path = TransferPath::kStaged;
    o.staging_ctas = staging;
    o.edge_slice_ctas = edge_ctas;
    absl::StatusOr<TransferPlan> plan =
        TransferPlan::Create(s.pool, s.banks, s.snapshot, o);
    EXPECT_TRUE(plan.ok()) << plan.status();
    const std::vector<uint32_t> pages = {0, 1};
    auto params = std::make_unique<kernels::PageCopyParams>();
    plan->FillStagedSlice(kernels::CopyDirection::kToHost, pages, 0, 2,
                          /*staging_base=*/4096, params.get(), edge);
    return params->header.max_ctas;
  };
  EXPECT_EQ(TransferOptions().edge_slice_ctas, kDefaultEdgeSliceCtas);
  EXPECT_EQ(ctas(8, 32, false), 8u);
  EXPECT_EQ(ctas(8, 32, true), 32u);
  EXPECT_EQ(ctas(48, 32, true), 48u);  // never fewer than staging_ctas
  EXPECT_EQ(ctas(8, 0, true), 8u);
}

TEST(TransferPlan, RejectsBadStagingOptions) {
  PlanInputs s;
  {
    TransferOptions o;
    o.edge_slice_ctas = kernels::kMaxCtasLimit + 1;
    auto plan = TransferPlan::Create(s.pool, s.banks, s.snapshot, o);
    EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(plan.status().message().find("edge_slice_ctas"),
              std::string::npos);
  }
  {
    TransferOptions o;
    o.staging_bytes = 1 << 20;
    o.first_slice_bytes = (1 << 20) + 1;
    auto plan = TransferPlan::Create(s.pool, s.banks, s.snapshot, o);
    EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(plan.status().message().find("first_slice_bytes"),
              std::string::npos);
  }
  {
    TransferOptions o;
    o.staging_priority = static_cast<StagingPriority>(7);
    auto plan = TransferPlan::Create(s.pool, s.banks, s.snapshot, o);
    EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(plan.status().message().find("staging_priority 7"),
              std::string::npos);
  }
}

// ----------------------------------------------------- copy-engine path --

// One bank "kv" of kTensors tensors of `bytes` each, block-first on the GPU
// (page i of every tensor back to back: a page is one contiguous run) and
// page-first in the host rows.
PlanInputs BlockFirst(uint64_t gpu_base, uint64_t host_base, uint64_t bytes) {
  constexpr int kTensors = 8;
  PlanInputs s;
  BankPool kv{"kv", {}};
  for (int t = 0; t < kTensors; ++t) {
    kv.tensors.push_back(
        PoolTensor{gpu_base + t * bytes, kTensors * bytes, bytes});
  }
  s.pool.banks = {kv};
  s.banks = {{"kv", HostBankView{host_base, kRows, kTensors * bytes,
                                 kTensors * bytes}}};
  return s;
}

TEST(TransferPlan, TensorMajorPoolsStayOnTheStagedPath) {
  PlanInputs s;
  auto plan = s.Create();
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->page_runs(), 8u);  // 4 + 4 tensors, each its own region.
  EXPECT_EQ(plan->path(), TransferPath::kStaged);
}

TEST(TransferPlan, BlockFirstPoolsTakeTheCopyEngine) {
  PlanInputs s = BlockFirst(0x7f0000000000, 0x100000000, 32 << 10);
  auto plan = s.Create();
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->page_runs(), 1u);  // 8 x 32 KiB, adjacent on both sides.
  EXPECT_EQ(plan->path(), TransferPath::kCopyEngine);
  std::vector<EngineCopy> runs;
  // Pages 3, 4 into rows 7, 8: adjacent on both sides, so one copy.
  std::vector<uint32_t> pages = {3, 4}, rows = {7, 8};
  plan->PageRuns(pages, rows, &runs);
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0].device, 0x7f0000000000 + 3 * (256 << 10));
  EXPECT_EQ(runs[0].host, 0x100000000 + 7 * (256 << 10));
  EXPECT_EQ(runs[0].bytes, 512u << 10);
  // Not adjacent in the pool: one copy per page.
  runs.clear();
  pages = {3, 5};
  plan->PageRuns(pages, rows, &runs);
  ASSERT_EQ(runs.size(), 2u);
  EXPECT_EQ(runs[1].device, 0x7f0000000000 + 5 * (256 << 10));
  EXPECT_EQ(runs[1].host, 0x100000000 + 8 * (256 << 10));
  EXPECT_EQ(runs[1].bytes, 256u << 10);
  // An explicit path wins over the layout.
  auto staged = TransferPlan::Create(s.pool, s.banks, std::nullopt,
                                     {.path = TransferPath::kStaged});
  ASSERT_TRUE(staged.ok()) << staged.status();
  EXPECT_EQ(staged->path(), TransferPath::kStaged);
}

TEST(TransferPlan, ShortRunsStayStagedUnlessTheCopyEngineIsAskedFor) {
  // Block-first but 8 x 4 KiB: 32 KiB runs, below kMinCopyEngineRunBytes.
  PlanInputs s = BlockFirst(0x7f0000000000, 0x100000000, 4 << 10);
  auto plan = s.Create();
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->page_runs(), 1u);
  EXPECT_EQ(plan->path(), TransferPath::kStaged);
  auto ce = TransferPlan::Create(s.pool, s.banks, std::nullopt,
                                 {.path = TransferPath::kCopyEngine});
  ASSERT_TRUE(ce.ok()) << ce.status();
  EXPECT_EQ(ce->path(), TransferPath::kCopyEngine);
}

// The runs move exactly the bytes the copy kernel's reference moves: both
// executed with memcpy on real buffers, for a tensor-major pool with padded
// rows (nothing merges) and a block-first one (pages merge).
TEST(TransferPlan, PageRunsMoveWhatTheKernelMoves) {
  for (bool block_first : {false, true}) {
    SCOPED_TRACE(block_first ? "block-first" : "tensor-major");
    constexpr uint64_t kBytes = 96;  // per tensor and page
    std::vector<uint8_t> gpu(kPages * 8 * kBytes + 4096);
    for (size_t i = 0; i < gpu.size(); ++i)
      gpu[i] = static_cast<uint8_t>(i * 7 + 3);
    std::vector<uint8_t> via_runs(kRows * 8 * kBytes + 4096, 0xee);
    std::vector<uint8_t> via_kernel = via_runs;
    const uint64_t g = reinterpret_cast<uint64_t>(gpu.data());
    auto pool_for = [&](uint64_t host) {
      if (block_first) return BlockFirst(g, host, kBytes);
      PlanInputs s;
      BankPool kv{"kv", {}};
      for (int t = 0; t < 8; ++t) {
        kv.tensors.push_back(
            PoolTensor{g + t * kPages * kBytes, kBytes, kBytes});
      }
      s.pool.banks = {kv};
      // Rows padded by 16 bytes: those must never be written.
      s.banks = {
          {"kv", HostBankView{host, kRows - 1, 8 * kBytes, 8 * kBytes + 16}}};
      return s;
    };
    PlanInputs a = pool_for(reinterpret_cast<uint64_t>(via_runs.data()));
    PlanInputs b = pool_for(reinterpret_cast<uint64_t>(via_kernel.data()));
    auto runs_plan = TransferPlan::Create(a.pool, a.banks, std::nullopt);
    auto kernel_plan = TransferPlan::Create(b.pool, b.banks, std::nullopt);
    ASSERT_TRUE(runs_plan.ok()) << runs_plan.status();
    ASSERT_TRUE(kernel_plan.ok()) << kernel_plan.status();
    const std::vector<uint32_t> pages = {9, 10, 11, 40, 2};
    const std::vector<uint32_t> rows = {4, 5, 6, 0, 20};
    std::vector<EngineCopy> runs;
    runs_plan->PageRuns(pages, rows, &runs);
    EXPECT_EQ(runs.size(), block_first ? 3u : 5u * 8u);
    for (const EngineCopy& r : runs) {
      std::memcpy(reinterpret_cast<void*>(r.host),
                  reinterpret_cast<const void*>(r.device), r.bytes);
    }
    PageCopyParams params;
    for (size_t k = 0; k < TransferPlan::NumSlices(pages.size()); ++k) {
      kernel_plan->FillPageSlice(CopyDirection::kToHost, pages, rows, k,
                                 &params);
      ASSERT_TRUE(kernels::RunPageCopyReference(params).ok());
    }
    EXPECT_EQ(via_runs, via_kernel);
  }
}

}  // namespace
}  // namespace kvtier::client
