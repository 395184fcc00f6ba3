// GPU tests of the sparse-attention offload kernels against their plain C++
// references: the ensure plan + copy match the reference LRU step by step on
// random selection traces (residency, translated tables, copy lists, pool
// bytes); mirrored fp8 codes and fp32 scales round-trip bit-exactly through
// an eviction; mirror store + ensure captured in a CUDA graph and replayed
// give the same results as the reference. GTEST_SKIP without a device.
//
// Thread-safety: single-threaded tests.

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/sparse_offload.h"
#include "kernels/sparse_offload_launch.h"

namespace kvtier::kernels {
namespace {

bool HasDevice() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return n > 0;
}

#define SKIP_WITHOUT_DEVICE() \
  if (!HasDevice()) GTEST_SKIP() << "no CUDA device present"

#define CUDA_OK(x) ASSERT_EQ((x), cudaSuccess) << #x

uint64_t Addr(const void* p) { return reinterpret_cast<uint64_t>(p); }

// A paged pool of `segments` tensors (each `page_bytes` per page, one region
// per tensor) over `slots` slots, a mapped pinned mirror bank of `rows` rows
// holding the tensors back to back, and an ensure over it.
struct Fixture {
  uint32_t segments = 0, page_bytes = 0, slots = 0, rows = 0;
  uint32_t tokens_per_page = 16;
  uint8_t* pool = nullptr;    // device
  uint8_t* mirror = nullptr;  // mapped host
  uint64_t row_bytes = 0;
  EnsureConfig config;
  EnsureState state;
  int32_t* d_selected = nullptr;
  int32_t* d_translated = nullptr;
  uint32_t* d_mirror_rows = nullptr;
  std::vector<uint32_t> mirror_rows;
  cudaStream_t stream = nullptr;

  void Init(uint32_t segs, uint32_t pb, EnsureConfig c) {
    segments = segs;
    page_bytes = pb;
    slots = c.num_slots;
    rows = c.num_logical + 3;
    config = c;
    row_bytes = static_cast<uint64_t>(segs) * pb;
    ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&pool, row_bytes * slots), cudaSuccess);
    ASSERT_EQ(cudaMemset(pool, 0, row_bytes * slots), cudaSuccess);
    ASSERT_EQ(cudaHostAlloc(&mirror, row_bytes * rows, cudaHostAllocMapped),
              cudaSuccess);
    std::mt19937_64 rng(11);
    for (uint64_t i = 0; i < row_bytes * rows; ++i) {
      mirror[i] = static_cast<uint8_t>(rng());
    }
    // A permutation so logical pages and rows differ.
    mirror_rows.resize(c.num_logical);
    for (uint32_t l = 0; l < c.num_logical; ++l) mirror_rows[l] = l + 3;
    std::shuffle(mirror_rows.begin(), mirror_rows.end(), rng);
    const uint32_t n = c.max_batch * c.max_selected;
    ASSERT_EQ(cudaMalloc(&d_selected, n * 4), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&d_translated, n * 4), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&d_mirror_rows, c.num_logical * 4), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(d_mirror_rows, mirror_rows.data(), c.num_logical * 4,
                         cudaMemcpyHostToDevice),
              cudaSuccess);
    auto st = AllocateEnsureState(c, stream);
    ASSERT_TRUE(st.ok()) << st.status();
    state = *st;
  }
  ~Fixture() {
    if (stream != nullptr) cudaStreamSynchronize(stream);
    FreeEnsureState(state);
    cudaFree(pool);
    cudaFreeHost(mirror);
    cudaFree(d_selected);
    cudaFree(d_translated);
    cudaFree(d_mirror_rows);
    if (stream != nullptr) cudaStreamDestroy(stream);
  }
  EnsurePlanParams Plan() const {
    EnsurePlanParams p;
    p.state = state;
    p.selected = d_selected;
    p.translated = d_translated;
    p.mirror_rows = d_mirror_rows;
    return p;
  }
  EnsureCopyParams Copy() const {
    EnsureCopyParams p;
    uint32_t chunks = 0;
    for (uint32_t s = 0; s < segments; ++s) {
      p.segments[s] = {
          .gpu_base = Addr(pool) + uint64_t{s} * page_bytes * slots,
          .gpu_stride = page_bytes,
          .host_base = Addr(mirror) + uint64_t{s} * page_bytes,
          .host_stride = row_bytes,
          .bytes = page_bytes,
          .chunk_begin = chunks};
      chunks += (page_bytes + kChunkBytes - 1) / kChunkBytes;
    }
    p.header = {.num_segments = segments,
                .chunks_per_item = chunks,
                .max_ctas = 32,
                .max_items = state.max_entries,
                .copy_slot = state.copy_slot,
                .copy_row = state.copy_row,
                .copy_count = state.copy_count};
    return p;
  }
  // Checks that slot `slot` of the pool holds mirror row `row`, bit for bit.
  void ExpectSlotHoldsRow(uint32_t slot, uint32_t row) {
    std::vector<uint8_t> got(page_bytes);
    for (uint32_t s = 0; s < segments; ++s) {
      ASSERT_EQ(cudaMemcpy(got.data(),
                           pool + uint64_t{s} * page_bytes * slots +
                               uint64_t{slot} * page_bytes,
                           page_bytes, cudaMemcpyDeviceToHost),
                cudaSuccess);
      ASSERT_EQ(0,
                std::memcmp(got.data(),
                            mirror + row * row_bytes + uint64_t{s} * page_bytes,
                            page_bytes))
          << "slot " << slot << " row " << row << " segment " << s;
    }
  }
};

// The reference's state in host memory.
struct RefEnsure {
  explicit RefEnsure(const EnsureConfig& c, const std::vector<uint32_t>& rows)
      : memory(EnsureStateBytes(c) / 8 + 2),
        selected(c.max_batch * c.max_selected, -1),
        translated(c.max_batch * c.max_selected),
        mirror_rows(rows) {
    p.state = LayOutEnsureState(c, memory.data());
    ResetEnsureStateHost(p.state);
    p.selected = selected.data();
    p.translated = translated.data();
    p.mirror_rows = mirror_rows.data();
  }
  std::vector<uint64_t> memory;
  std::vector<int32_t> selected, translated;
  std::vector<uint32_t> mirror_rows;
  EnsurePlanParams p;
};

// Reads the GPU state back and compares it with the reference's.
void ExpectSameState(const Fixture& f, const RefEnsure& ref) {
  const EnsureState& g = f.state;
  const EnsureState& r = ref.p.state;
  std::vector<int32_t> slot_logical(g.num_slots), translated(g.max_entries);
  uint32_t count = 0;
  unsigned long long drops = 0;
  ASSERT_EQ(cudaMemcpy(slot_logical.data(), g.slot_logical, g.num_slots * 4,
                       cudaMemcpyDeviceToHost),
            cudaSuccess);
  ASSERT_EQ(cudaMemcpy(translated.data(), f.d_translated, g.max_entries * 4,
                       cudaMemcpyDeviceToHost),
            cudaSuccess);
  ASSERT_EQ(cudaMemcpy(&count, g.copy_count, 4, cudaMemcpyDeviceToHost),
            cudaSuccess);
  ASSERT_EQ(cudaMemcpy(&drops, g.drops, 8, cudaMemcpyDeviceToHost),
            cudaSuccess);
  ASSERT_EQ(count, *r.copy_count);
  ASSERT_EQ(drops, *r.drops);
  ASSERT_EQ(translated, ref.translated);
  ASSERT_EQ(slot_logical,
            std::vector<int32_t>(r.slot_logical, r.slot_logical + r.num_slots));
  std::vector<uint32_t> copy_slot(count), copy_row(count);
  if (count > 0) {
    ASSERT_EQ(cudaMemcpy(copy_slot.data(), g.copy_slot, count * 4,
                         cudaMemcpyDeviceToHost),
              cudaSuccess);
    ASSERT_EQ(cudaMemcpy(copy_row.data(), g.copy_row, count * 4,
                         cudaMemcpyDeviceToHost),
              cudaSuccess);
  }
  ASSERT_EQ(copy_slot, std::vector<uint32_t>(r.copy_slot, r.copy_slot + count));
  ASSERT_EQ(copy_row, std::vector<uint32_t>(r.copy_row, r.copy_row + count));
}

void RandomSelection(std::mt19937& rng, uint32_t num_logical,
                     std::vector<int32_t>* sel) {
  std::geometric_distribution<int32_t> hot(0.01);
  for (auto& v : *sel) {
    const uint32_t r = rng() % 20;
    if (r == 0) {
      v = -1;
    } else if (r == 1) {
      v = static_cast<int32_t>(num_logical + rng() % 5);  // dropped
    } else {
      v = std::min<int32_t>(hot(rng), num_logical - 1);
    }
  }
}

TEST(EnsureGpu, MatchesReferenceLruStepByStep) {
  SKIP_WITHOUT_DEVICE();
  // P > 1024 so the plan kernel's loops and scans take several rounds.
  const EnsureConfig c{.num_slots = 2500,
                       .num_logical = 20000,
                       .max_batch = 8,
                       .max_selected = 300};
  Fixture f;
  ASSERT_NO_FATAL_FAILURE(f.Init(/*segs=*/3, /*page_bytes=*/1040, c));
  RefEnsure ref(c, f.mirror_rows);
  std::mt19937 rng(5);
  for (int t = 0; t < 60; ++t) {
    RandomSelection(rng, c.num_logical, &ref.selected);
    CUDA_OK(cudaMemcpyAsync(f.d_selected, ref.selected.data(),
                            ref.selected.size() * 4, cudaMemcpyHostToDevice,
                            f.stream));
    ASSERT_TRUE(LaunchEnsurePlan(f.Plan(), f.stream).ok());
    ASSERT_TRUE(LaunchEnsureCopy(f.Copy(), f.stream).ok());
    CUDA_OK(cudaStreamSynchronize(f.stream));
    ASSERT_TRUE(RunEnsurePlanReference(ref.p).ok());
    ASSERT_NO_FATAL_FAILURE(ExpectSameState(f, ref)) << "step " << t;
    // Every selected page's slot holds its mirror row.
    if (t % 10 == 9) {
      for (size_t i = 0; i < ref.selected.size(); i += 37) {
        const int32_t l = ref.selected[i];
        if (l < 0 || static_cast<uint32_t>(l) >= c.num_logical) continue;
        ASSERT_NO_FATAL_FAILURE(f.ExpectSlotHoldsRow(
            static_cast<uint32_t>(ref.translated[i]), f.mirror_rows[l]));
      }
    }
  }
  EXPECT_GT(*ref.p.state.drops, 0u);  // the out-of-range ids were counted
}

TEST(EnsureGpu, RefusesConfigThatCannotFit) {
  SKIP_WITHOUT_DEVICE();
  auto st = AllocateEnsureState({.num_slots = 100,
                                 .num_logical = 1000,
                                 .max_batch = 8,
                                 .max_selected = 13},
                                nullptr);
  EXPECT_EQ(st.status().code(), absl::StatusCode::kInvalidArgument);
}

// Mirror store of fp8 pages (e4m3 codes written into the pool by a
// "quantising" store, then fp32 scales), eviction of every page, and an
// ensure that brings them back into other slots: bit-exact.
TEST(MirrorGpu, Fp8PagesWithScalesRoundTripBitExactly) {
  SKIP_WITHOUT_DEVICE();
  const uint32_t tpp = 16, layers = 4, code_bpt = 128, scale_bpt = 4;
  // Segments: per layer K codes, V codes, K scales, V scales.
  const uint32_t slots = 64, logical = 256;
  const uint64_t page_codes = tpp * code_bpt, page_scales = tpp * scale_bpt;
  const uint64_t kv_row = 2ull * layers * page_codes;
  const uint64_t sc_row = 2ull * layers * page_scales;
  uint8_t *codes = nullptr, *scales = nullptr, *kv = nullptr, *sc = nullptr;
  CUDA_OK(cudaMalloc(&codes, 2ull * layers * slots * page_codes));
  CUDA_OK(cudaMalloc(&scales, 2ull * layers * slots * page_scales));
  CUDA_OK(cudaHostAlloc(&kv, kv_row * logical, cudaHostAllocMapped));
  CUDA_OK(cudaHostAlloc(&sc, sc_row * logical, cudaHostAllocMapped));
  std::memset(kv, 0, kv_row * logical);
  std::memset(sc, 0, sc_row * logical);
  std::vector<uint8_t> h_codes(2ull * layers * slots * page_codes);
  std::vector<float> h_scales(2ull * layers * slots * tpp);
  std::mt19937 rng(3);
  for (auto& b : h_codes) b = static_cast<uint8_t>(rng());  // any e4m3 code
  for (auto& s : h_scales) {
    uint32_t bits = rng();
    std::memcpy(&s, &bits, 4);  // every bit pattern, NaNs included
  }
  CUDA_OK(cudaMemcpy(codes, h_codes.data(), h_codes.size(),
                     cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(scales, h_scales.data(), h_scales.size() * 4,
                     cudaMemcpyHostToDevice));
  // Logical page l (< slots) currently sits in slot (l * 5) % slots.
  std::vector<uint32_t> mirror_rows(logical);
  for (uint32_t l = 0; l < logical; ++l) mirror_rows[l] = logical - 1 - l;
  uint32_t* d_rows = nullptr;
  CUDA_OK(cudaMalloc(&d_rows, logical * 4));
  CUDA_OK(cudaMemcpy(d_rows, mirror_rows.data(), logical * 4,
                     cudaMemcpyHostToDevice));
  MirrorStoreParams m;
  for (uint32_t s = 0; s < 2 * layers; ++s) {
    m.segments[s] = {.pool_base = Addr(codes) + s * slots * page_codes,
                     .pool_page_stride = page_codes,
                     .bank_base = Addr(kv) + s * page_codes,
                     .bank_row_stride = kv_row,
                     .bytes_per_token = code_bpt};
    m.segments[2 * layers + s] = {
        .pool_base = Addr(scales) + s * slots * page_scales,
        .pool_page_stride = page_scales,
        .bank_base = Addr(sc) + s * page_scales,
        .bank_row_stride = sc_row,
        .bytes_per_token = scale_bpt};
  }
  const uint32_t max_entries = slots * tpp;
  std::vector<MirrorEntry> entries(max_entries);
  for (uint32_t l = 0; l < slots; ++l) {
    for (uint32_t t = 0; t < tpp; ++t) {
      entries[l * tpp + t] = {.logical = static_cast<int32_t>(l),
                              .slot = static_cast<int32_t>((l * 5) % slots),
                              .token = static_cast<int32_t>(t)};
    }
  }
  MirrorEntry* d_entries = nullptr;
  uint32_t* d_count = nullptr;
  unsigned long long* d_drops = nullptr;
  CUDA_OK(cudaMalloc(&d_entries, max_entries * sizeof(MirrorEntry)));
  CUDA_OK(cudaMalloc(&d_count, 4));
  CUDA_OK(cudaMalloc(&d_drops, 8));
  CUDA_OK(cudaMemcpy(d_entries, entries.data(),
                     max_entries * sizeof(MirrorEntry),
                     cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(d_count, &max_entries, 4, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemset(d_drops, 0, 8));
  m.header = {.num_segments = 4 * layers,
              .tokens_per_page = tpp,
              .max_entries = max_entries,
              .num_logical = logical,
              .num_slots = slots,
              .max_ctas = 16,
              .entries = d_entries,
              .count = d_count,
              .mirror_rows = d_rows,
              .drops = d_drops};
  ASSERT_TRUE(LaunchMirrorStore(m, nullptr).ok());
  CUDA_OK(cudaDeviceSynchronize());
  // The reference over host copies of the pool gives the same mirror.
  std::vector<uint8_t> ref_kv(kv_row * logical, 0), ref_sc(sc_row * logical, 0);
  MirrorStoreParams r = m;
  uint32_t count = max_entries;
  unsigned long long drops = 0;
  for (uint32_t s = 0; s < 2 * layers; ++s) {
    r.segments[s].pool_base = Addr(h_codes.data()) + s * slots * page_codes;
    r.segments[s].bank_base = Addr(ref_kv.data()) + s * page_codes;
    r.segments[2 * layers + s].pool_base =
        Addr(h_scales.data()) + s * slots * page_scales;
    r.segments[2 * layers + s].bank_base =
        Addr(ref_sc.data()) + s * page_scales;
  }
  r.header.entries = entries.data();
  r.header.count = &count;
  r.header.mirror_rows = mirror_rows.data();
  r.header.drops = &drops;
  ASSERT_TRUE(RunMirrorStoreReference(r).ok());
  ASSERT_EQ(0, std::memcmp(kv, ref_kv.data(), kv_row * logical));
  ASSERT_EQ(0, std::memcmp(sc, ref_sc.data(), sc_row * logical));
  // Wipe the pool (every slot evicted), then ensure pages 0..slots-1 back.
  CUDA_OK(cudaMemset(codes, 0, h_codes.size()));
  CUDA_OK(cudaMemset(scales, 0, h_scales.size() * 4));
  const EnsureConfig c{.num_slots = slots,
                       .num_logical = logical,
                       .max_batch = 1,
                       .max_selected = slots};
  auto st = AllocateEnsureState(c, nullptr);
  ASSERT_TRUE(st.ok()) << st.status();
  EnsureState state = *st;
  std::vector<int32_t> sel(slots);
  for (uint32_t i = 0; i < slots; ++i)
    sel[i] = static_cast<int32_t>(slots - 1 - i);
  int32_t *d_sel = nullptr, *d_tr = nullptr;
  CUDA_OK(cudaMalloc(&d_sel, slots * 4));
  CUDA_OK(cudaMalloc(&d_tr, slots * 4));
  CUDA_OK(cudaMemcpy(d_sel, sel.data(), slots * 4, cudaMemcpyHostToDevice));
  EnsurePlanParams plan{.state = state,
                        .selected = d_sel,
                        .translated = d_tr,
                        .mirror_rows = d_rows};
  EnsureCopyParams copy;
  uint32_t chunk = 0;
  for (uint32_t s = 0; s < 4 * layers; ++s) {
    const bool is_code = s < 2 * layers;
    copy.segments[s] = {
        .gpu_base = m.segments[s].pool_base,
        .gpu_stride = m.segments[s].pool_page_stride,
        .host_base = m.segments[s].bank_base,
        .host_stride = m.segments[s].bank_row_stride,
        .bytes = static_cast<uint32_t>(is_code ? page_codes : page_scales),
        .chunk_begin = chunk};
    ++chunk;
  }
  copy.header = {.num_segments = 4 * layers,
                 .chunks_per_item = chunk,
                 .max_ctas = 16,
                 .max_items = slots,
                 .copy_slot = state.copy_slot,
                 .copy_row = state.copy_row,
                 .copy_count = state.copy_count};
  ASSERT_TRUE(LaunchEnsurePlan(plan, nullptr).ok());
  ASSERT_TRUE(LaunchEnsureCopy(copy, nullptr).ok());
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<int32_t> tr(slots);
  CUDA_OK(cudaMemcpy(tr.data(), d_tr, slots * 4, cudaMemcpyDeviceToHost));
  std::vector<uint8_t> back_codes(h_codes.size());
  std::vector<float> back_scales(h_scales.size());
  CUDA_OK(cudaMemcpy(back_codes.data(), codes, back_codes.size(),
                     cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(back_scales.data(), scales, back_scales.size() * 4,
                     cudaMemcpyDeviceToHost));
  for (uint32_t i = 0; i < slots; ++i) {
    const uint32_t l = static_cast<uint32_t>(sel[i]);
    const uint32_t old_slot = (l * 5) % slots;
    const uint32_t new_slot = static_cast<uint32_t>(tr[i]);
    for (uint32_t s = 0; s < 2 * layers; ++s) {
      ASSERT_EQ(0, std::memcmp(
                       back_codes.data() + (s * slots + new_slot) * page_codes,
                       h_codes.data() + (s * slots + old_slot) * page_codes,
                       page_codes))
          << "page " << l << " codes segment " << s;
      ASSERT_EQ(0,
                std::memcmp(back_scales.data() + (s * slots + new_slot) * tpp,
                            h_scales.data() + (s * slots + old_slot) * tpp,
                            page_scales))
          << "page " << l << " scales segment " << s;
    }
  }
  FreeEnsureState(state);
  cudaFree(d_sel);
  cudaFree(d_tr);
  cudaFree(d_entries);
  cudaFree(d_count);
  cudaFree(d_drops);
  cudaFree(d_rows);
  cudaFree(codes);
  cudaFree(scales);
  cudaFreeHost(kv);
  cudaFreeHost(sc);
}

// Plan + copy captured once into a CUDA graph; the selection buffer is
// rewritten between replays (outside the graph). Each replay must equal a
// reference step.
TEST(EnsureGpu, CapturedGraphReplaysMatchReference) {
  SKIP_WITHOUT_DEVICE();
  const EnsureConfig c{.num_slots = 300,
                       .num_logical = 4000,
                       .max_batch = 4,
                       .max_selected = 64};
  Fixture f;
  ASSERT_NO_FATAL_FAILURE(f.Init(/*segs=*/2, /*page_bytes=*/4096, c));
  RefEnsure ref(c, f.mirror_rows);
  // A mirror store in the same graph, writing token 2 of a one-slot store
  // pool (apart from the ensure's slots, which the copies overwrite) into
  // the mirror row of logical page 0 every replay.
  uint8_t* d_store = nullptr;
  CUDA_OK(cudaMalloc(&d_store, 2 * 4096));
  MirrorEntry* d_entry = nullptr;
  uint32_t* d_count = nullptr;
  unsigned long long* d_drops = nullptr;
  CUDA_OK(cudaMalloc(&d_entry, sizeof(MirrorEntry)));
  CUDA_OK(cudaMalloc(&d_count, 4));
  CUDA_OK(cudaMalloc(&d_drops, 8));
  const MirrorEntry e{.logical = 0, .slot = 0, .token = 2};
  const uint32_t one = 1;
  CUDA_OK(cudaMemcpy(d_entry, &e, sizeof(e), cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(d_count, &one, 4, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemset(d_drops, 0, 8));
  MirrorStoreParams m;
  for (uint32_t s = 0; s < 2; ++s) {
    m.segments[s] = {.pool_base = Addr(d_store) + s * 4096ull,
                     .pool_page_stride = 4096,
                     .bank_base = Addr(f.mirror) + s * 4096ull,
                     .bank_row_stride = f.row_bytes,
                     .bytes_per_token = 256};
  }
  m.header = {.num_segments = 2,
              .tokens_per_page = 16,
              .max_entries = 1,
              .num_logical = c.num_logical,
              .num_slots = 1,
              .max_ctas = 4,
              .entries = d_entry,
              .count = d_count,
              .mirror_rows = f.d_mirror_rows,
              .drops = d_drops};
  // Token 2 of both segments: a known pattern the store mirrors.
  std::vector<uint8_t> pattern(256);
  for (uint32_t i = 0; i < 256; ++i)
    pattern[i] = static_cast<uint8_t>(i ^ 0x5A);
  for (uint32_t s = 0; s < 2; ++s) {
    CUDA_OK(cudaMemcpy(d_store + s * 4096ull + 2 * 256, pattern.data(), 256,
                       cudaMemcpyHostToDevice));
  }
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  CUDA_OK(cudaStreamBeginCapture(f.stream, cudaStreamCaptureModeThreadLocal));
  ASSERT_TRUE(LaunchMirrorStore(m, f.stream).ok());
  ASSERT_TRUE(LaunchEnsurePlan(f.Plan(), f.stream).ok());
  ASSERT_TRUE(LaunchEnsureCopy(f.Copy(), f.stream).ok());
  CUDA_OK(cudaStreamEndCapture(f.stream, &graph));
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  // The store precedes the ensure copy in every replay, so a page 0 brought
  // in carries the stored token.
  std::mt19937 rng(17);
  for (int t = 0; t < 40; ++t) {
    RandomSelection(rng, c.num_logical, &ref.selected);
    CUDA_OK(cudaMemcpyAsync(f.d_selected, ref.selected.data(),
                            ref.selected.size() * 4, cudaMemcpyHostToDevice,
                            f.stream));
    CUDA_OK(cudaGraphLaunch(exec, f.stream));
    CUDA_OK(cudaStreamSynchronize(f.stream));
    ASSERT_TRUE(RunEnsurePlanReference(ref.p).ok());
    ASSERT_NO_FATAL_FAILURE(ExpectSameState(f, ref)) << "replay " << t;
  }
  for (uint32_t s = 0; s < 2; ++s) {
    EXPECT_EQ(0, std::memcmp(f.mirror + f.mirror_rows[0] * f.row_bytes +
                                 s * 4096ull + 2 * 256,
                             pattern.data(), 256));
  }
  // A page brought in after the store carries the stored token.
  std::vector<int32_t> translated(ref.translated);
  for (size_t i = 0; i < ref.selected.size(); ++i) {
    const int32_t l = ref.selected[i];
    if (l >= 0 && static_cast<uint32_t>(l) < c.num_logical && i % 7 == 0) {
      ASSERT_NO_FATAL_FAILURE(f.ExpectSlotHoldsRow(
          static_cast<uint32_t>(translated[i]), f.mirror_rows[l]));
    }
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaFree(d_store);
  cudaFree(d_entry);
  cudaFree(d_count);
  cudaFree(d_drops);
}

}  // namespace
}  // namespace kvtier::kernels
