// ensure_bench: the sparse-attention offload kernels on one GPU. Prints one
// JSON object with three parts:
//
//  misses       GB/s of missed pages moved by one ensure step (plan + copy,
//               every selected page a miss) against the contiguous ceiling
//               (one cudaMemcpyAsync of the same bytes from the same pinned
//               mirror), and the plan kernel's time on an all-hit step.
//  mirror       the mirror store's cost on a synthetic decode step. The step
//               proxy, stated honestly: (a) a store kernel writing one token
//               per sequence into the pool (--seqs x 2 x --layers tensors of
//               --bytes_per_token), (b) an attention-like read of the
//               selected KV (--seqs x --selected_tokens tokens x 2 x
//               --layers x --bytes_per_token bytes of HBM), (c) a weight
//               stream of --weights_gib GiB of HBM (a dense model's weights
//               read once per decode step; 16 GiB ~ an 8B model in bf16).
//               overhead_pct = (step with mirror - step) / step.
//  hit_rate     hit rate of the ensure against pool size on a drifting
//               selection trace: --hr_seqs sequences of --hr_context pages,
//               --hr_selected pages each, --hr_keep of a sequence's selection
//               kept from one step to the next, the rest drawn uniformly
//               from its context. The pool sweep shows where it falls off.
//
// Runs in well under a minute on an H200 with the defaults.
//
// Thread-safety: single-threaded program.

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/sparse_offload.h"
#include "kernels/sparse_offload_launch.h"

ABSL_FLAG(uint32_t, layers, 32, "attention layers (K and V each)");
ABSL_FLAG(uint32_t, tokens_per_page, 16, "tokens per page");
ABSL_FLAG(uint32_t, bytes_per_token, 2048,
          "bytes of one token of one K or V tensor of one layer (8 KV heads "
          "x 128 x bf16 = 2048)");
ABSL_FLAG(uint32_t, miss_pages, 512, "pages one ensure step misses");
ABSL_FLAG(uint32_t, copy_ctas, 32, "CTAs of the ensure copy kernel");
ABSL_FLAG(uint32_t, mirror_ctas, 16, "CTAs of the mirror store kernel");
ABSL_FLAG(uint32_t, seqs, 64, "decode sequences (mirror part)");
ABSL_FLAG(uint32_t, selected_tokens, 2048,
          "tokens the attention-like read touches per sequence per layer");
ABSL_FLAG(double, weights_gib, 16.0, "weight bytes streamed per decode step");
ABSL_FLAG(uint32_t, iters, 20, "timed iterations per measurement");
ABSL_FLAG(uint32_t, hr_seqs, 8, "hit-rate trace: sequences");
ABSL_FLAG(uint32_t, hr_context, 2048, "hit-rate trace: pages per sequence");
ABSL_FLAG(uint32_t, hr_selected, 256, "hit-rate trace: selected per sequence");
ABSL_FLAG(double, hr_keep, 0.9, "hit-rate trace: selection kept per step");
ABSL_FLAG(uint32_t, hr_steps, 200, "hit-rate trace: steps per pool size");

namespace kvtier::kernels {
namespace {

void Check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}
void Check(const absl::Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, s.ToString().c_str());
    std::exit(1);
  }
}
#define CK(x) Check((x), #x)

uint64_t Addr(const void* p) { return reinterpret_cast<uint64_t>(p); }

float Elapsed(cudaEvent_t a, cudaEvent_t b) {
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, a, b));
  return ms;
}

std::string MissesPart(cudaStream_t st) {
  const uint32_t layers = absl::GetFlag(FLAGS_layers);
  const uint32_t tpp = absl::GetFlag(FLAGS_tokens_per_page);
  const uint32_t bpt = absl::GetFlag(FLAGS_bytes_per_token);
  const uint32_t miss = absl::GetFlag(FLAGS_miss_pages);
  const uint32_t iters = absl::GetFlag(FLAGS_iters);
  const uint32_t segs = 2 * layers;
  const uint64_t page_bytes = uint64_t{tpp} * bpt;
  const uint64_t row_bytes = segs * page_bytes;
  const EnsureConfig c{.num_slots = 2 * miss,
                       .num_logical = 4 * miss,
                       .max_batch = 1,
                       .max_selected = miss};
  uint8_t* pool = nullptr;
  uint8_t* mirror = nullptr;
  CK(cudaMalloc(&pool, row_bytes * c.num_slots));
  CK(cudaHostAlloc(&mirror, row_bytes * c.num_logical, cudaHostAllocMapped));
  std::memset(mirror, 1, row_bytes * c.num_logical);
  auto state_or = AllocateEnsureState(c, st);
  Check(state_or.status(), "AllocateEnsureState");
  EnsureState state = *state_or;
  std::vector<uint32_t> rows(c.num_logical);
  for (uint32_t l = 0; l < c.num_logical; ++l) rows[l] = l;
  uint32_t* d_rows = nullptr;
  int32_t *d_sel = nullptr, *d_tr = nullptr;
  CK(cudaMalloc(&d_rows, c.num_logical * 4));
  CK(cudaMalloc(&d_sel, uint64_t{4} * miss * 4));
  CK(cudaMalloc(&d_tr, miss * 4));
  CK(cudaMemcpy(d_rows, rows.data(), c.num_logical * 4,
                cudaMemcpyHostToDevice));
  // Four windows of `miss` pages; window k is evicted two steps later, so a
  // cycle over the four always misses.
  std::vector<int32_t> windows(uint64_t{4} * miss);
  for (uint32_t i = 0; i < 4 * miss; ++i) windows[i] = static_cast<int32_t>(i);
  CK(cudaMemcpy(d_sel, windows.data(), windows.size() * 4,
                cudaMemcpyHostToDevice));
  EnsureCopyParams copy;
  uint32_t chunks = 0;
  for (uint32_t s = 0; s < segs; ++s) {
    copy.segments[s] = {.gpu_base = Addr(pool) + s * page_bytes * c.num_slots,
                        .gpu_stride = page_bytes,
                        .host_base = Addr(mirror) + s * page_bytes,
                        .host_stride = row_bytes,
                        .bytes = static_cast<uint32_t>(page_bytes),
                        .chunk_begin = chunks};
    chunks +=
        static_cast<uint32_t>((page_bytes + kChunkBytes - 1) / kChunkBytes);
  }
  copy.header = {.num_segments = segs,
                 .chunks_per_item = chunks,
                 .max_ctas = absl::GetFlag(FLAGS_copy_ctas),
                 .max_items = miss,
                 .copy_slot = state.copy_slot,
                 .copy_row = state.copy_row,
                 .copy_count = state.copy_count};
  auto step = [&](uint32_t k) {
    EnsurePlanParams plan{.state = state,
                          .selected = d_sel + (k % 4) * miss,
                          .translated = d_tr,
                          .mirror_rows = d_rows};
    Check(LaunchEnsurePlan(plan, st), "plan");
    Check(LaunchEnsureCopy(copy, st), "copy");
  };
  for (uint32_t k = 0; k < 8; ++k) step(k);  // warm up
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  CK(cudaEventRecord(a, st));
  for (uint32_t k = 0; k < iters; ++k) step(k);
  CK(cudaEventRecord(b, st));
  CK(cudaEventSynchronize(b));
  const double ensure_ms = Elapsed(a, b) / iters;
  uint32_t count = 0;
  CK(cudaMemcpy(&count, state.copy_count, 4, cudaMemcpyDeviceToHost));
  const double bytes = double(miss) * row_bytes;
  // All-hit step: the same window twice; time the second plan alone.
  EnsurePlanParams plan{.state = state,
                        .selected = d_sel,
                        .translated = d_tr,
                        .mirror_rows = d_rows};
  Check(LaunchEnsurePlan(plan, st), "plan");
  CK(cudaEventRecord(a, st));
  for (uint32_t k = 0; k < iters; ++k)
    Check(LaunchEnsurePlan(plan, st), "plan");
  CK(cudaEventRecord(b, st));
  CK(cudaEventSynchronize(b));
  const double plan_hit_us = Elapsed(a, b) * 1000.0 / iters;
  // Ceiling: one contiguous copy of the same bytes.
  CK(cudaMemcpyAsync(pool, mirror, static_cast<size_t>(bytes),
                     cudaMemcpyHostToDevice, st));
  CK(cudaEventRecord(a, st));
  for (uint32_t k = 0; k < iters; ++k) {
    CK(cudaMemcpyAsync(pool, mirror + (k % 2) * static_cast<size_t>(bytes),
                       static_cast<size_t>(bytes), cudaMemcpyHostToDevice, st));
  }
  CK(cudaEventRecord(b, st));
  CK(cudaEventSynchronize(b));
  const double ceil_ms = Elapsed(a, b) / iters;
  const double gbps = bytes / (ensure_ms * 1e6);
  const double ceil = bytes / (ceil_ms * 1e6);
  FreeEnsureState(state);
  cudaFree(pool);
  cudaFreeHost(mirror);
  cudaFree(d_rows);
  cudaFree(d_sel);
  cudaFree(d_tr);
  return absl::StrFormat(
      "{\"page_bytes\": %u, \"pages_per_step\": %u, \"copied_last_step\": %u, "
      "\"step_ms\": %.3f, \"gbps\": %.2f, \"contiguous_gbps\": %.2f, "
      "\"pct_of_ceiling\": %.1f, \"target_pct\": 80, \"copy_ctas\": %u, "
      "\"plan_all_hit_us\": %.1f}",
      row_bytes, miss, count, ensure_ms, gbps, ceil, 100.0 * gbps / ceil,
      absl::GetFlag(FLAGS_copy_ctas), plan_hit_us);
}

// The mirror part's decode-step proxy: its shape and device buffers.
struct DecodeStep {
  uint32_t seqs = 0, tensors = 0, tpp = 0, bpt = 0;
  uint32_t page_bytes = 0;    // one page of one tensor
  uint64_t tensor_bytes = 0;  // one tensor's pages: one per sequence
  uint64_t attn_bytes = 0, weight_bytes = 0;
  uint8_t* pool = nullptr;     // what the store writes, tensor-major
  uint8_t* src = nullptr;      // the tokens it stores
  uint8_t* attn = nullptr;     // the selected KV the attention read touches
  uint8_t* weights = nullptr;  // null when weight_bytes is 0
  uint32_t* sink = nullptr;    // the reads' result
};

// Allocates the decode step of the flags (--seqs sequences, 2 x --layers
// tensors, ...), the stored tokens set to 3 and the rest of the memory to 0.
DecodeStep AllocateDecodeStep() {
  DecodeStep d;
  d.seqs = absl::GetFlag(FLAGS_seqs);
  d.tensors = 2 * absl::GetFlag(FLAGS_layers);
  d.tpp = absl::GetFlag(FLAGS_tokens_per_page);
  d.bpt = absl::GetFlag(FLAGS_bytes_per_token);
  d.page_bytes = d.tpp * d.bpt;
  d.tensor_bytes = uint64_t{d.seqs} * d.page_bytes;  // slot = seq
  CK(cudaMalloc(&d.pool, d.tensor_bytes * d.tensors));
  CK(cudaMalloc(&d.src, uint64_t{d.seqs} * d.tensors * d.bpt));
  CK(cudaMemset(d.src, 3, uint64_t{d.seqs} * d.tensors * d.bpt));
  d.attn_bytes = uint64_t{d.seqs} * absl::GetFlag(FLAGS_selected_tokens) *
                 d.tensors * d.bpt;
  d.weight_bytes =
      static_cast<uint64_t>(absl::GetFlag(FLAGS_weights_gib) * (1ull << 30)) /
      16 * 16;
  CK(cudaMalloc(&d.attn, d.attn_bytes));
  CK(cudaMemset(d.attn, 0, d.attn_bytes));
  if (d.weight_bytes > 0) {
    CK(cudaMalloc(&d.weights, d.weight_bytes));
    CK(cudaMemset(d.weights, 0, d.weight_bytes));
  }
  CK(cudaMalloc(&d.sink, 4));
  return d;
}

void FreeDecodeStep(const DecodeStep& d) {
  cudaFree(d.pool);
  cudaFree(d.src);
  cudaFree(d.attn);
  if (d.weights != nullptr) cudaFree(d.weights);
  cudaFree(d.sink);
}

// The mirror of a decode step's pool: one mapped host row per sequence's
// page (logical = seq), and the mirror store's parameters with one entry
// per sequence (token 5 of its page).
struct Mirror {
  uint8_t* host = nullptr;
  uint64_t row_bytes = 0;
  uint32_t* d_rows = nullptr;
  MirrorEntry* d_entries = nullptr;
  uint32_t* d_count = nullptr;
  unsigned long long* d_drops = nullptr;
  MirrorStoreParams params;
};

Mirror AllocateMirror(const DecodeStep& d) {
  Mirror m;
  m.row_bytes = uint64_t{d.tensors} * d.page_bytes;
  CK(cudaHostAlloc(&m.host, m.row_bytes * d.seqs, cudaHostAllocMapped));
  std::vector<uint32_t> rows(d.seqs);
  for (uint32_t s = 0; s < d.seqs; ++s) rows[s] = s;
  std::vector<MirrorEntry> entries(d.seqs);
  for (uint32_t s = 0; s < d.seqs; ++s) {
    entries[s] = {.logical = static_cast<int32_t>(s),
                  .slot = static_cast<int32_t>(s),
                  .token = 5};
  }
  CK(cudaMalloc(&m.d_rows, d.seqs * 4));
  CK(cudaMalloc(&m.d_entries, d.seqs * sizeof(MirrorEntry)));
  CK(cudaMalloc(&m.d_count, 4));
  CK(cudaMalloc(&m.d_drops, 8));
  CK(cudaMemcpy(m.d_rows, rows.data(), d.seqs * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(m.d_entries, entries.data(), d.seqs * sizeof(MirrorEntry),
                cudaMemcpyHostToDevice));
  CK(cudaMemcpy(m.d_count, &d.seqs, 4, cudaMemcpyHostToDevice));
  CK(cudaMemset(m.d_drops, 0, 8));
  for (uint32_t t = 0; t < d.tensors; ++t) {
    m.params.segments[t] = {
        .pool_base = Addr(d.pool) + t * d.tensor_bytes,
        .pool_page_stride = d.page_bytes,
        .bank_base = Addr(m.host) + uint64_t{t} * d.page_bytes,
        .bank_row_stride = m.row_bytes,
        .bytes_per_token = d.bpt};
  }
  m.params.header = {.num_segments = d.tensors,
                     .tokens_per_page = d.tpp,
                     .max_entries = d.seqs,
                     .num_logical = d.seqs,
                     .num_slots = d.seqs,
                     .max_ctas = absl::GetFlag(FLAGS_mirror_ctas),
                     .entries = m.d_entries,
                     .count = m.d_count,
                     .mirror_rows = m.d_rows,
                     .drops = m.d_drops};
  return m;
}

void FreeMirror(const Mirror& m) {
  cudaFreeHost(m.host);
  cudaFree(m.d_rows);
  cudaFree(m.d_entries);
  cudaFree(m.d_count);
  cudaFree(m.d_drops);
}

// One decode step captured into a graph, as an engine's is: the store proxy
// (`store`), the mirror store (`with_mirror`), then the attention and weight
// reads (`read`), on `sms` SMs' worth of CTAs.
cudaGraphExec_t CaptureStep(const DecodeStep& d, const Mirror& m, int sms,
                            bool with_mirror, bool store, bool read,
                            cudaStream_t st) {
  cudaGraph_t g;
  cudaGraphExec_t e;
  CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  if (store) {
    Check(
        LaunchTokenStoreProxy(d.src, d.pool, d.seqs, d.tensors, d.tensor_bytes,
                              d.page_bytes, d.bpt, 5, 2 * sms, st),
        "store proxy");
  }
  if (with_mirror) Check(LaunchMirrorStore(m.params, st), "mirror");
  if (read) {
    Check(LaunchHbmReadProxy(d.attn, d.attn_bytes, d.sink, 4 * sms, st),
          "attention read proxy");
    if (d.weight_bytes > 0) {
      Check(LaunchHbmReadProxy(d.weights, d.weight_bytes, d.sink, 4 * sms, st),
            "weight read proxy");
    }
  }
  CK(cudaStreamEndCapture(st, &g));
  CK(cudaGraphInstantiate(&e, g, 0));
  CK(cudaGraphDestroy(g));
  return e;
}

// Microseconds per replay of `e` over `iters` replays after three warm-up
// ones, timed between events `a` and `b`.
double TimeGraph(cudaGraphExec_t e, uint32_t iters, cudaEvent_t a,
                 cudaEvent_t b, cudaStream_t st) {
  for (int i = 0; i < 3; ++i) CK(cudaGraphLaunch(e, st));
  CK(cudaEventRecord(a, st));
  for (uint32_t i = 0; i < iters; ++i) CK(cudaGraphLaunch(e, st));
  CK(cudaEventRecord(b, st));
  CK(cudaEventSynchronize(b));
  return Elapsed(a, b) * 1000.0 / iters;  // us
}

std::string MirrorPart(cudaStream_t st) {
  const uint32_t iters = absl::GetFlag(FLAGS_iters);
  const DecodeStep d = AllocateDecodeStep();
  const Mirror m = AllocateMirror(d);
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  cudaGraphExec_t base = CaptureStep(d, m, sms, false, true, true, st);
  cudaGraphExec_t with = CaptureStep(d, m, sms, true, true, true, st);
  cudaGraphExec_t only = CaptureStep(d, m, sms, true, false, false, st);
  // Interleave to cancel drift; best of three each.
  double t_base = 1e30, t_with = 1e30, t_only = 1e30;
  for (int r = 0; r < 3; ++r) {
    t_base = std::min(t_base, TimeGraph(base, iters, a, b, st));
    t_with = std::min(t_with, TimeGraph(with, iters, a, b, st));
    t_only = std::min(t_only, TimeGraph(only, iters, a, b, st));
  }
  // The mirror must hold what the store wrote.
  const uint32_t bpt = d.bpt;
  const bool match =
      m.host[5 * bpt] == 3 &&
      m.host[m.row_bytes * (d.seqs - 1) + 5 * bpt + bpt - 1] == 3;
  for (auto e : {base, with, only}) cudaGraphExecDestroy(e);
  FreeDecodeStep(d);
  FreeMirror(m);
  return absl::StrFormat(
      "{\"seqs\": %u, \"layers\": %u, \"bytes_per_token\": %u, "
      "\"mirror_bytes_per_step\": %u, \"attention_read_bytes\": %u, "
      "\"weight_bytes\": %u, \"step_us\": %.1f, \"step_with_mirror_us\": %.1f, "
      "\"mirror_alone_us\": %.1f, \"overhead_pct\": %.2f, \"target_pct\": 3, "
      "\"mirror_bytes_verified\": %s}",
      d.seqs, absl::GetFlag(FLAGS_layers), bpt,
      uint64_t{d.seqs} * d.tensors * bpt, d.attn_bytes, d.weight_bytes, t_base,
      t_with, t_only, 100.0 * (t_with - t_base) / t_base,
      match ? "true" : "false");
}

std::string HitRatePart(cudaStream_t st) {
  const uint32_t seqs = absl::GetFlag(FLAGS_hr_seqs);
  const uint32_t ctx = absl::GetFlag(FLAGS_hr_context);
  const uint32_t sel = absl::GetFlag(FLAGS_hr_selected);
  const double keep = absl::GetFlag(FLAGS_hr_keep);
  const uint32_t steps = absl::GetFlag(FLAGS_hr_steps);
  const uint32_t logical = seqs * ctx;
  const uint32_t n = seqs * sel;
  std::vector<uint32_t> rows(logical);
  for (uint32_t l = 0; l < logical; ++l) rows[l] = l;
  uint32_t* d_rows = nullptr;
  int32_t *d_sel = nullptr, *d_tr = nullptr;
  CK(cudaMalloc(&d_rows, logical * 4));
  CK(cudaMalloc(&d_sel, n * 4));
  CK(cudaMalloc(&d_tr, n * 4));
  CK(cudaMemcpy(d_rows, rows.data(), logical * 4, cudaMemcpyHostToDevice));
  std::string out = "[";
  const double fractions[] = {1.0, 1.25, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0};
  for (double f : fractions) {
    const uint32_t slots = std::min<uint32_t>(logical, uint32_t(n * f));
    const EnsureConfig c{.num_slots = slots,
                         .num_logical = logical,
                         .max_batch = seqs,
                         .max_selected = sel};
    auto state_or = AllocateEnsureState(c, st);
    Check(state_or.status(), "AllocateEnsureState");
    EnsureState state = *state_or;
    std::mt19937 rng(42);
    std::vector<int32_t> cur(n);
    for (uint32_t s = 0; s < seqs; ++s) {
      for (uint32_t i = 0; i < sel; ++i)
        cur[s * sel + i] = s * ctx + rng() % ctx;
    }
    EnsurePlanParams plan{.state = state,
                          .selected = d_sel,
                          .translated = d_tr,
                          .mirror_rows = d_rows};
    uint64_t misses = 0, total = 0;
    std::vector<uint32_t> counts(steps);
    std::vector<int32_t> trace(uint64_t{steps} * n);
    for (uint32_t t = 0; t < steps; ++t) {
      for (uint32_t s = 0; s < seqs; ++s) {
        for (uint32_t i = 0; i < sel; ++i) {
          if (std::uniform_real_distribution<double>(0, 1)(rng) >= keep) {
            cur[s * sel + i] = s * ctx + rng() % ctx;
          }
        }
      }
      std::copy(cur.begin(), cur.end(), trace.begin() + uint64_t{t} * n);
    }
    uint32_t* d_counts = nullptr;
    CK(cudaMalloc(&d_counts, steps * 4));
    int32_t* d_trace = nullptr;
    CK(cudaMalloc(&d_trace, trace.size() * 4));
    CK(cudaMemcpy(d_trace, trace.data(), trace.size() * 4,
                  cudaMemcpyHostToDevice));
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    CK(cudaEventRecord(a, st));
    for (uint32_t t = 0; t < steps; ++t) {
      plan.selected = d_trace + uint64_t{t} * n;
      Check(LaunchEnsurePlan(plan, st), "plan");
      CK(cudaMemcpyAsync(d_counts + t, state.copy_count, 4,
                         cudaMemcpyDeviceToDevice, st));
    }
    CK(cudaEventRecord(b, st));
    CK(cudaEventSynchronize(b));
    const double plan_us = Elapsed(a, b) * 1000.0 / steps;
    CK(cudaMemcpy(counts.data(), d_counts, steps * 4, cudaMemcpyDeviceToHost));
    // Distinct pages per step are what can hit or miss; skip the warm-up.
    const uint32_t warm = steps / 5;
    for (uint32_t t = warm; t < steps; ++t) {
      std::vector<int32_t> d(trace.begin() + uint64_t{t} * n,
                             trace.begin() + uint64_t{t + 1} * n);
      std::sort(d.begin(), d.end());
      total += std::unique(d.begin(), d.end()) - d.begin();
      misses += counts[t];
    }
    out += absl::StrFormat(
        "%s{\"pool_slots\": %u, \"pool_over_selection\": %.2f, "
        "\"pool_over_logical\": %.3f, \"hit_rate\": %.4f, "
        "\"plan_us\": %.1f}",
        out.size() > 1 ? ", " : "", slots, f, double(slots) / logical,
        1.0 - double(misses) / total, plan_us);
    cudaFree(d_counts);
    cudaFree(d_trace);
    FreeEnsureState(state);
  }
  cudaFree(d_rows);
  cudaFree(d_sel);
  cudaFree(d_tr);
  return out + "]";
}

}  // namespace
}  // namespace kvtier::kernels

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::printf("{\"error\": \"no CUDA device\"}\n");
    return 1;
  }
  cudaDeviceProp prop;
  kvtier::kernels::Check(cudaGetDeviceProperties(&prop, 0), "props");
  cudaStream_t st;
  kvtier::kernels::Check(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking),
                         "stream");
  const std::string misses = kvtier::kernels::MissesPart(st);
  const std::string mirror = kvtier::kernels::MirrorPart(st);
  const std::string hit = kvtier::kernels::HitRatePart(st);
  std::printf(
      "{\"bench\": \"ensure\", \"device\": \"%s\", \"misses\": %s, "
      "\"mirror\": %s, \"hit_rate\": %s}\n",
      prop.name, misses.c_str(), mirror.c_str(), hit.c_str());
  return 0;
}
