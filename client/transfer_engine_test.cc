// Tests of TransferEngine on the reference backend: bit-exact round trips for
// realistic layouts (bf16 K/V, fp8 K/V with a separate per-token scale bank,
// odd row sizes), snapshots, slicing, and bad input that must change nothing.
// The staged path's plan is checked in transfer_engine_staged_test.cc; the
// GPU tests (tests/gpu/transfer_engine_gpu_test.cc) run it on the device.
// Pool "device addresses" are ordinary host buffers here.

#include "client/transfer_engine.h"

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
#include "client/reference_stream.h"
#include "client/transfer_engine_test_util.h"
#include "gtest/gtest.h"
#include "kernels/page_copy.h"

#if KVTIER_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

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

// Evicts `n` random pages into random rows, checks every row, rehydrates the
// rows into a disjoint set of pages and checks those pages and that nothing
// else changed.
void RoundTrip(const std::vector<BankSpec>& spec, uint64_t num_pages,
               uint64_t rows, uint32_t n) {
  HostSetup s(spec, num_pages, rows);
  s.FillPoolRandom(42);
  const auto original = s.SnapshotPool();
  auto engine = TransferEngine::Create(Backend::kReference, s.pool, s.views,
                                       std::nullopt);
  ASSERT_TRUE(engine.ok()) << engine.status();

  std::mt19937 rng(7);
  std::vector<uint32_t> shuffled = DistinctRandom(
      static_cast<uint32_t>(num_pages), static_cast<uint32_t>(num_pages), rng);
  const std::vector<uint32_t> src(shuffled.begin(), shuffled.begin() + n);
  const std::vector<uint32_t> dst(shuffled.begin() + n,
                                  shuffled.begin() + 2 * n);
  const std::vector<uint32_t> row_ids =
      DistinctRandom(n, static_cast<uint32_t>(rows), rng);

  ASSERT_TRUE((*engine)->Evict(src, row_ids, nullptr).ok());
  // Each row: the page's tensors back to back, bank by bank.
  size_t t = 0;
  for (size_t b = 0; b < spec.size(); ++b) {
    const HostBankView& v = s.views[b].second;
    std::vector<bool> written(rows, false);
    uint64_t offset = 0;
    for (const TensorSpec& ts : spec[b].tensors) {
      for (uint32_t i = 0; i < n; ++i) {
        const uint8_t* row = reinterpret_cast<const uint8_t*>(v.base) +
                             row_ids[i] * v.row_stride;
        ASSERT_EQ(0, std::memcmp(row + offset, s.Page(t, src[i]), ts.bytes))
            << "bank " << b << " tensor " << t << " item " << i;
        written[row_ids[i]] = true;
      }
      offset += ts.bytes;
      ++t;
    }
    for (uint64_t r = 0; r < rows; ++r) {
      if (written[r]) continue;
      const uint8_t* row =
          reinterpret_cast<const uint8_t*>(v.base) + r * v.row_stride;
      ASSERT_TRUE(std::all_of(row, row + v.row_stride,
                              [](uint8_t x) { return x == 0; }))
          << "row " << r << " of bank " << b << " was written";
    }
  }

  ASSERT_TRUE((*engine)->Rehydrate(dst, row_ids, nullptr).ok());
  std::vector<int64_t> source_of(num_pages, -1);
  for (uint32_t i = 0; i < n; ++i) source_of[dst[i]] = src[i];
  for (size_t k = 0; k < s.tensors.size(); ++k) {
    const PoolTensor* pt = nullptr;
    size_t j = 0;
    for (const BankPool& b : s.pool.banks) {
      for (const PoolTensor& x : b.tensors) {
        if (j++ == k) pt = &x;
      }
    }
    for (uint64_t p = 0; p < num_pages; ++p) {
      const uint64_t from = source_of[p] >= 0 ? source_of[p] : p;
      ASSERT_EQ(0, std::memcmp(s.Page(k, p),
                               original[k].data() + from * pt->page_stride,
                               pt->bytes_per_page))
          << "tensor " << k << " page " << p;
      // Padding between pages is never touched.
      const uint8_t* pad = s.Page(k, p) + pt->bytes_per_page;
      ASSERT_EQ(0, std::memcmp(pad,
                               original[k].data() + p * pt->page_stride +
                                   pt->bytes_per_page,
                               pt->page_stride - pt->bytes_per_page));
    }
  }
  EXPECT_EQ((*engine)->slices_launched(), 2 * TransferPlan::NumSlices(n));
}

TEST(TransferEngine, RoundTripBf16Layout) {
  RoundTrip(Bf16Layout(32), 40, 24, 18);
}

TEST(TransferEngine, RoundTripFp8LayoutWithScaleBank) {
  RoundTrip(Fp8Layout(32), 48, 32, 20);
}

TEST(TransferEngine, RoundTripOddRowSizes) {
  RoundTrip(OddLayout(), 600, 300, 260);
}

TEST(TransferEngine, TwoThousandPagesTakeSixteenSlices) {
  const std::vector<BankSpec> spec = {BankSpec{"kv", {{64, 64}, {48, 48}}}};
  HostSetup s(spec, 4096, 2048);
  s.FillPoolRandom(3);
  auto engine = TransferEngine::Create(Backend::kReference, s.pool, s.views,
                                       std::nullopt);
  ASSERT_TRUE(engine.ok()) << engine.status();
  std::vector<uint32_t> pages(2000), rows(2000);
  for (uint32_t i = 0; i < 2000; ++i) {
    pages[i] = 4095 - 2 * i;
    rows[i] = i;
  }
  ASSERT_TRUE((*engine)->Evict(pages, rows, nullptr).ok());
  EXPECT_EQ((*engine)->slices_launched(), 16u);
  for (uint32_t i = 0; i < 2000; ++i) {
    const uint8_t* row = s.banks[0]->data() + i * 112;
    ASSERT_EQ(0, std::memcmp(row, s.Page(0, pages[i]), 64)) << i;
    ASSERT_EQ(0, std::memcmp(row + 64, s.Page(1, pages[i]), 48)) << i;
  }
  ASSERT_TRUE((*engine)
                  ->Rehydrate(absl::MakeSpan(pages).subspan(0, 129),
                              absl::MakeSpan(rows).subspan(1000, 129), nullptr)
                  .ok());
  EXPECT_EQ((*engine)->slices_launched(), 18u);
  ASSERT_TRUE((*engine)->Evict({}, {}, nullptr).ok());
  EXPECT_EQ((*engine)->slices_launched(), 18u);
}

// On a ReferenceStream the copies are queued like kernel launches: nothing
// lands while the stream is held, everything once it resumes.
TEST(TransferEngine, ReferenceCopiesQueueOnAReferenceStream) {
  HostSetup s({{"kv", {{256, 256}}}}, 8, 8);
  s.FillPoolRandom(5);
  auto engine = TransferEngine::Create(Backend::kReference, s.pool, s.views,
                                       std::nullopt);
  ASSERT_TRUE(engine.ok()) << engine.status();
  const HostBankView& bank = s.views[0].second;
  const std::vector<uint8_t> before(
      reinterpret_cast<const uint8_t*>(bank.base),
      reinterpret_cast<const uint8_t*>(bank.base) + 8 * bank.row_stride);
  ReferenceStream stream;
  stream.Hold();
  const std::vector<uint32_t> pages = {0, 1, 2}, rows = {5, 6, 7};
  ASSERT_TRUE((*engine)->Evict(pages, rows, stream.handle()).ok());
  EXPECT_EQ(stream.pending(), 1u);
  EXPECT_EQ(
      0, std::memcmp(before.data(), reinterpret_cast<const uint8_t*>(bank.base),
                     before.size()));
  stream.Resume();
  stream.Synchronize();
  for (size_t i = 0; i < pages.size(); ++i) {
    EXPECT_EQ(0, std::memcmp(reinterpret_cast<const uint8_t*>(bank.base) +
                                 rows[i] * bank.row_stride,
                             s.Page(0, pages[i]), 256));
  }
}

TEST(TransferEngine, SnapshotSaveAndRestore) {
  HostSetup s(Fp8Layout(2), 8, 8);
  // Two recurrent layers: a 128x128 fp32 state for each of 32 heads (2 MiB),
  // and an odd-sized conv state.
  std::vector<std::unique_ptr<Buffer>> seg;
  const std::vector<TensorSpec> segs = {
      {2 << 20, 2 << 20}, {12300, 12304}, {2 << 20, 2 << 20}, {12300, 12304}};
  uint64_t row_bytes = 0;
  for (const TensorSpec& t : segs) {
    seg.push_back(std::make_unique<Buffer>(t.stride * 4));
    s.pool.snapshot.push_back(
        PoolTensor{seg.back()->addr(), t.stride, t.bytes});
    row_bytes += t.bytes;
  }
  s.pool.num_snapshot_slots = 4;
  const uint64_t row_stride = RoundUp16(row_bytes);
  Buffer bank(row_stride * 3);
  std::mt19937_64 rng(5);
  for (auto& b : seg) {
    for (size_t i = 0; i < b->size(); ++i)
      b->data()[i] = static_cast<uint8_t>(rng());
  }
  auto engine = TransferEngine::Create(
      Backend::kReference, s.pool, s.views,
      HostBankView{bank.addr(), 3, row_bytes, row_stride});
  ASSERT_TRUE(engine.ok()) << engine.status();
  ASSERT_TRUE((*engine)->SaveSnapshot(2, 1, nullptr).ok());
  uint64_t off = 0;
  for (size_t k = 0; k < segs.size(); ++k) {
    ASSERT_EQ(0,
              std::memcmp(bank.data() + row_stride + off,
                          seg[k]->data() + 2 * segs[k].stride, segs[k].bytes))
        << k;
    off += segs[k].bytes;
  }
  ASSERT_TRUE((*engine)->RestoreSnapshot(0, 1, nullptr).ok());
  for (size_t k = 0; k < segs.size(); ++k) {
    ASSERT_EQ(0,
              std::memcmp(seg[k]->data(), seg[k]->data() + 2 * segs[k].stride,
                          segs[k].bytes))
        << k;
  }
  EXPECT_EQ((*engine)->slices_launched(), 2u);

  const std::vector<uint8_t> bank_before(bank.data(),
                                         bank.data() + bank.size());
  const std::vector<uint8_t> slot3_before(seg[0]->data() + 3 * segs[0].stride,
                                          seg[0]->data() + 4 * segs[0].stride);
  absl::Status st = (*engine)->SaveSnapshot(4, 0, nullptr);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("slot 4"), std::string::npos);
  st = (*engine)->RestoreSnapshot(0, 3, nullptr);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("row 3"), std::string::npos);
  st = (*engine)->RestoreSnapshot(3, 3, nullptr);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*engine)->slices_launched(), 2u);
  EXPECT_EQ(std::vector<uint8_t>(bank.data(), bank.data() + bank.size()),
            bank_before);
  EXPECT_EQ(std::vector<uint8_t>(seg[0]->data() + 3 * segs[0].stride,
                                 seg[0]->data() + 4 * segs[0].stride),
            slot3_before);
}

// A snapshot row of three groups (vLLM's several Mamba groups, one state
// block each at a page boundary): slots[g] <-> bytes [g * S, (g + 1) * S)
// of the row, S the segments' bytes; one slot alone is refused.
TEST(TransferEngine, SnapshotGroupsShareOneRow) {
  HostSetup s(OddLayout(), 4, 4);
  const std::vector<TensorSpec> segs = {{4096, 4096}, {1024, 1024}};
  std::vector<std::unique_ptr<Buffer>> seg;
  uint64_t group_bytes = 0;
  std::mt19937_64 rng(9);
  for (const TensorSpec& t : segs) {
    seg.push_back(std::make_unique<Buffer>(t.stride * 8));
    for (size_t i = 0; i < seg.back()->size(); ++i) {
      seg.back()->data()[i] = static_cast<uint8_t>(rng());
    }
    s.pool.snapshot.push_back(
        PoolTensor{seg.back()->addr(), t.stride, t.bytes});
    group_bytes += t.bytes;
  }
  s.pool.num_snapshot_slots = 8;
  const uint64_t row_bytes = 3 * group_bytes;
  Buffer bank(row_bytes * 4);
  auto engine = TransferEngine::Create(
      Backend::kReference, s.pool, s.views,
      HostBankView{bank.addr(), 4, row_bytes, row_bytes});
  ASSERT_TRUE(engine.ok()) << engine.status();
  const std::vector<uint32_t> saved = {5, 1, 6};
  ASSERT_TRUE((*engine)->SaveSnapshots(saved, 2, nullptr).ok());
  uint64_t off = 2 * row_bytes;
  for (uint32_t slot : saved) {
    for (size_t k = 0; k < segs.size(); ++k) {
      ASSERT_EQ(
          0, std::memcmp(bank.data() + off,
                         seg[k]->data() + slot * segs[k].stride, segs[k].bytes))
          << "slot " << slot << " segment " << k;
      off += segs[k].bytes;
    }
  }
  const std::vector<uint32_t> restored = {0, 2, 3};
  ASSERT_TRUE((*engine)->RestoreSnapshots(restored, 2, nullptr).ok());
  for (size_t g = 0; g < 3; ++g) {
    for (size_t k = 0; k < segs.size(); ++k) {
      ASSERT_EQ(0, std::memcmp(seg[k]->data() + restored[g] * segs[k].stride,
                               seg[k]->data() + saved[g] * segs[k].stride,
                               segs[k].bytes))
          << "group " << g << " segment " << k;
    }
  }
  absl::Status st = (*engine)->SaveSnapshot(1, 0, nullptr);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("3 group(s)"), std::string::npos) << st;
  st = (*engine)->RestoreSnapshots({0, 1, 8}, 0, nullptr);
  EXPECT_NE(st.message().find("slot 8 (group 2)"), std::string::npos) << st;

  // Not a whole number of groups, or rows with padding between them.
  auto bad = TransferEngine::Create(
      Backend::kReference, s.pool, s.views,
      HostBankView{bank.addr(), 2, row_bytes + 16, row_bytes + 16});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  bad = TransferEngine::Create(
      Backend::kReference, s.pool, s.views,
      HostBankView{bank.addr(), 2, row_bytes, row_bytes + 16});
  EXPECT_NE(bad.status().message().find("back to back"), std::string::npos)
      << bad.status();
}

// Page rows of two groups (vLLM's sliding-window group beside full
// attention: one block of each per page): the plan addresses group g of
// row r as row r * 2 + g, so one Evict fills both halves of a row from two
// pool pages and one Rehydrate brings them back.
TEST(TransferEngine, PageGroupsShareOneRow) {
  HostSetup s({{"kv", {{256, 256}, {96, 112}}}}, 16, 8);
  s.FillPoolRandom(11);
  const uint64_t part = s.row_bytes[0];  // 352: one pool page
  Buffer bank(2 * part * 8);
  std::vector<NamedHostBank> views = {
      {"kv", HostBankView{bank.addr(), 8, 2 * part, 2 * part}}};
  auto engine =
      TransferEngine::Create(Backend::kReference, s.pool, views, std::nullopt);
  ASSERT_TRUE(engine.ok()) << engine.status();
  EXPECT_EQ((*engine)->plan().page_groups(), 2u);
  // Row 3: pool pages 5 (group 0) and 9 (group 1); row 6: 2 and 7.
  const std::vector<uint32_t> pages = {5, 9, 2, 7}, rows = {6, 7, 12, 13};
  ASSERT_TRUE((*engine)->Evict(pages, rows, nullptr).ok());
  for (size_t i = 0; i < pages.size(); ++i) {
    const uint8_t* at = bank.data() + rows[i] * part;
    ASSERT_EQ(0, std::memcmp(at, s.Page(0, pages[i]), 256)) << i;
    ASSERT_EQ(0, std::memcmp(at + 256, s.Page(1, pages[i]), 96)) << i;
  }
  const std::vector<uint32_t> back = {0, 1, 3, 4};
  ASSERT_TRUE((*engine)->Rehydrate(back, rows, nullptr).ok());
  for (size_t i = 0; i < back.size(); ++i) {
    ASSERT_EQ(0, std::memcmp(s.Page(0, back[i]), s.Page(0, pages[i]), 256));
    ASSERT_EQ(0, std::memcmp(s.Page(1, back[i]), s.Page(1, pages[i]), 96));
  }
  absl::Status st = (*engine)->Evict({0}, {16}, nullptr);  // 8 rows x 2
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
}

TEST(TransferEngine, SnapshotWithoutSegmentsIsAPreconditionFailure) {
  HostSetup s(OddLayout(), 4, 4);
  auto engine = TransferEngine::Create(Backend::kReference, s.pool, s.views,
                                       std::nullopt);
  ASSERT_TRUE(engine.ok());
  absl::Status st = (*engine)->SaveSnapshot(0, 0, nullptr);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("no snapshot"), std::string::npos);
}

TEST(TransferEngine, BadCallsChangeNothing) {
  HostSetup s(Fp8Layout(2), 16, 8);
  s.FillPoolRandom(9);
  for (auto& b : s.banks) std::memset(b->data(), 0xab, b->size());
  const auto pool_before = s.SnapshotPool();
  const auto banks_before = s.SnapshotBanks();
  auto engine = TransferEngine::Create(Backend::kReference, s.pool, s.views,
                                       std::nullopt);
  ASSERT_TRUE(engine.ok());
  struct Case {
    bool evict;
    std::vector<uint32_t> pages, rows;
    std::string want;
  };
  const std::vector<Case> cases = {
      {true, {1, 2, 3}, {1, 2}, "gpu_pages has 3 entries but rows has 2"},
      {true, {1, 2, 16}, {1, 2, 3}, "gpu_pages[2] = 16 is out of range"},
      {false, {1, 2, 3}, {0, 8, 3}, "rows[1] = 8 is out of range"},
      {true, {1, 2, 3}, {4, 5, 4}, "rows[2] = 4 repeats rows[0]"},
      {false, {9, 9, 3}, {4, 5, 6}, "gpu_pages[1] = 9 repeats gpu_pages[0]"},
  };
  for (const Case& c : cases) {
    absl::Status st = c.evict ? (*engine)->Evict(c.pages, c.rows, nullptr)
                              : (*engine)->Rehydrate(c.pages, c.rows, nullptr);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_NE(st.message().find(c.want), std::string::npos)
        << "'" << c.want << "' not in: " << st.message();
  }
  EXPECT_EQ((*engine)->slices_launched(), 0u);
  EXPECT_EQ(s.SnapshotPool(), pool_before);
  EXPECT_EQ(s.SnapshotBanks(), banks_before);
}

TEST(TransferEngine, BadEntryAfterFirstSliceWritesNothing) {
  const std::vector<BankSpec> spec = {BankSpec{"kv", {{32, 32}}}};
  HostSetup s(spec, 512, 512);
  s.FillPoolRandom(11);
  const auto banks_before = s.SnapshotBanks();
  auto engine = TransferEngine::Create(Backend::kReference, s.pool, s.views,
                                       std::nullopt);
  ASSERT_TRUE(engine.ok());
  std::vector<uint32_t> pages(300), rows(300);
  std::iota(pages.begin(), pages.end(), 0);
  std::iota(rows.begin(), rows.end(), 0);
  rows[299] = 512;
  absl::Status st = (*engine)->Evict(pages, rows, nullptr);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("rows[299] = 512"), std::string::npos) << st;
  EXPECT_EQ((*engine)->slices_launched(), 0u);
  EXPECT_EQ(s.SnapshotBanks(), banks_before);
}

TEST(TransferEngine, CreateRejectsBadDescriptors) {
  HostSetup s(Fp8Layout(2), 16, 8);
  GpuPoolDescriptor pool = s.pool;
  pool.banks[1].tensors[0].base += 8;
  auto engine =
      TransferEngine::Create(Backend::kReference, pool, s.views, std::nullopt);
  EXPECT_EQ(engine.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(engine.status().message().find("multiples of 16"),
            std::string::npos);

  pool = s.pool;
  pool.banks[0].tensors[1].base = pool.banks[0].tensors[0].base;
  engine =
      TransferEngine::Create(Backend::kReference, pool, s.views, std::nullopt);
  EXPECT_EQ(engine.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(engine.status().message().find("overlaps"), std::string::npos);

  std::vector<NamedHostBank> views = s.views;
  std::swap(views[0], views[1]);
  engine =
      TransferEngine::Create(Backend::kReference, s.pool, views, std::nullopt);
  EXPECT_EQ(engine.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(engine.status().message().find("namespace order"),
            std::string::npos);
}

TEST(TransferEngine, CudaBackendNeedsADeviceAndDeviceMemory) {
  HostSetup s(OddLayout(), 4, 4);
  auto engine =
      TransferEngine::Create(Backend::kCuda, s.pool, s.views, std::nullopt);
  ASSERT_FALSE(engine.ok());
  int devices = 0;
#if KVTIER_HAVE_CUDA
  if (cudaGetDeviceCount(&devices) != cudaSuccess) devices = 0;
#endif
  if (devices == 0) {
    // Built without CUDA, or no device (as on the CPU CI machines).
    EXPECT_EQ(engine.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(engine.status().message().find("CUDA backend"), std::string::npos)
        << engine.status();
  } else {
    // Host buffers are not device memory.
    EXPECT_EQ(engine.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(engine.status().message().find("not memory of CUDA device"),
              std::string::npos)
        << engine.status();
  }
}

}  // namespace
}  // namespace kvtier::client
