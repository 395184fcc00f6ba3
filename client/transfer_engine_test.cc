// Tests of TransferEngine on the reference backend: bit-exact round trips for
// realistic layouts (bf16 K/V, fp8 K/V with a separate per-token scale bank,
// odd row sizes), snapshots, slicing, and bad input that must change nothing.
// The staged path's plan (slices, staging layout, copy lists) is checked here
// too, by executing it with memcpy against a host "staging buffer" and
// comparing with the reference backend byte for byte; the GPU tests
// (tests/gpu/transfer_engine_gpu_test.cc) run it on the device.
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
#include "gtest/gtest.h"
#include "kernels/page_copy.h"

#if KVTIER_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace kvtier::client {
namespace {

// A 64-byte aligned, zeroed host buffer.
class Buffer {
 public:
  explicit Buffer(size_t bytes)
      : bytes_(bytes),
        data_(static_cast<uint8_t*>(std::aligned_alloc(
            64, (std::max<size_t>(bytes, 1) + 63) / 64 * 64))) {
    std::memset(data_.get(), 0, bytes_);
  }
  uint8_t* data() const { return data_.get(); }
  size_t size() const { return bytes_; }
  uint64_t addr() const { return reinterpret_cast<uint64_t>(data_.get()); }

 private:
  struct Free {
    void operator()(uint8_t* p) const { std::free(p); }
  };
  size_t bytes_;
  std::unique_ptr<uint8_t, Free> data_;
};

struct TensorSpec {
  uint64_t bytes;
  uint64_t stride;
};
struct BankSpec {
  std::string name;
  std::vector<TensorSpec> tensors;
};

uint64_t RoundUp16(uint64_t v) { return (v + 15) / 16 * 16; }

// A pool in host memory (one buffer per tensor, region per tensor) and its
// host banks, with the descriptor and bank views describing them.
struct HostSetup {
  GpuPoolDescriptor pool;
  std::vector<std::unique_ptr<Buffer>> tensors;  // in descriptor order
  std::vector<std::unique_ptr<Buffer>> banks;
  std::vector<NamedHostBank> views;
  std::vector<uint64_t> row_bytes;

  HostSetup(const std::vector<BankSpec>& spec, uint64_t num_pages,
            uint64_t rows) {
    pool.num_pages = num_pages;
    for (const BankSpec& b : spec) {
      BankPool bp{b.name, {}};
      uint64_t sum = 0;
      for (const TensorSpec& t : b.tensors) {
        tensors.push_back(std::make_unique<Buffer>(t.stride * num_pages));
        bp.tensors.push_back(
            PoolTensor{tensors.back()->addr(), t.stride, t.bytes});
        sum += t.bytes;
      }
      pool.banks.push_back(bp);
      const uint64_t stride = RoundUp16(sum);
      banks.push_back(std::make_unique<Buffer>(stride * rows));
      views.push_back(
          {b.name, HostBankView{banks.back()->addr(), rows, sum, stride}});
      row_bytes.push_back(sum);
    }
  }

  void FillPoolRandom(uint64_t seed) {
    std::mt19937_64 rng(seed);
    for (auto& t : tensors) {
      for (size_t i = 0; i < t->size(); i += 8) {
        const uint64_t v = rng();
        std::memcpy(t->data() + i, &v, std::min<size_t>(8, t->size() - i));
      }
    }
  }

  std::vector<std::vector<uint8_t>> SnapshotPool() const {
    std::vector<std::vector<uint8_t>> out;
    for (auto& t : tensors) out.emplace_back(t->data(), t->data() + t->size());
    return out;
  }
  std::vector<std::vector<uint8_t>> SnapshotBanks() const {
    std::vector<std::vector<uint8_t>> out;
    for (auto& b : banks) out.emplace_back(b->data(), b->data() + b->size());
    return out;
  }

  // Page `page` of tensor `t` (flat index over all banks).
  const uint8_t* Page(size_t t, uint64_t page) const {
    size_t k = 0;
    for (const BankPool& b : pool.banks) {
      for (const PoolTensor& pt : b.tensors) {
        if (k++ == t)
          return reinterpret_cast<const uint8_t*>(pt.base) +
                 page * pt.page_stride;
      }
    }
    return nullptr;
  }
};

std::vector<uint32_t> DistinctRandom(uint32_t count, uint32_t below,
                                     std::mt19937& rng) {
  std::vector<uint32_t> all(below);
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), rng);
  all.resize(count);
  return all;
}

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

// bf16: 32 layers x (K, V); a page is 16 tokens x 8 KV heads x 128 dims x 2
// bytes = 32 KiB per tensor, 2 MiB per row.
std::vector<BankSpec> Bf16Layout(int layers) {
  BankSpec kv{"kv", {}};
  for (int i = 0; i < 2 * layers; ++i) kv.tensors.push_back({32768, 32768});
  return {kv};
}

// fp8: 32 layers x (K, V) of 16 x 8 x 128 x 1 byte, and a "scale" bank of
// per-token fp32 scales (16 x 4 bytes) per layer and K/V.
std::vector<BankSpec> Fp8Layout(int layers) {
  BankSpec kv{"kv", {}};
  BankSpec scale{"scale", {}};
  for (int i = 0; i < 2 * layers; ++i) {
    kv.tensors.push_back({16384, 16384});
    scale.tensors.push_back({64, 64});
  }
  return {kv, scale};
}

// Odd sizes: rows of 194 and 3 bytes; later tensors sit at odd offsets.
std::vector<BankSpec> OddLayout() {
  return {BankSpec{"kv", {{100, 112}, {37, 48}, {7, 16}, {50, 64}}},
          BankSpec{"scale", {{3, 16}}}};
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

// ---------------------------------------------------------------------------
// The staged path's plan, executed with memcpy.

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
  plan->SnapshotCopies(2, 1, &copies);
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
