// transfer_bench: GB/s of moving KV pages and recurrent-state snapshots
// between a GPU pool and page-first host rows, kvtier's copy kernel side by
// side with the usual ways, on one GPU. Prints one JSON object on stdout and a
// progress line per measurement on stderr.
//
// Setup: a GPU pool of --pool_gib (default 20 GiB, filled with varied bytes),
// carved per layout into tensor-major tensors (per layer K and V each a
// [pages][bytes] array, as engines keep them); one host arena
// (MAP_SHARED | MAP_ANONYMOUS -- with --huge_pages MAP_HUGETLB too --,
// populated, cudaHostRegister'd Mapped |
// Portable, used through its device pointer) carved per layout into
// page-first banks like the daemon's: row r of a bank holds every tensor's
// bytes of one page back to back. Each transfer picks fresh random GPU pages
// (over the whole pool) and fresh random distinct host rows.
//
// Layouts (chunk = one page of one tensor, the unit a per-chunk copy moves):
//   a  bf16_16tok   32 layers x (K, V), 8 KV heads x 128 dims, 16-token
//                   pages: 64 chunks of 32 KiB, 2 MiB per page.
//   b  fp8_16tok    as a in fp8 (64 chunks of 16 KiB in bank "kv") plus a
//                   "scale" bank of per-token, per-head fp32 scales: 16
//                   tokens x 8 heads x 4 B = 512 B per layer and K/V, 64
//                   chunks of 512 B (32 KiB per page). chunk_bytes reports
//                   16 KiB; side_chunk_bytes 512.
//   c  bf16_64tok   as a with 64-token pages: 64 chunks of 128 KiB, 8 MiB.
//   d  tp8_bf16_16tok  one tensor-parallel rank of a with 1 KV head: 64
//                   chunks of 4 KiB (16 tokens x 128 x 2 B), 256 KiB.
//   e  hybrid_snapshot  36 recurrent (Gated DeltaNet) layers, each a 32-head
//                   128x128 fp32 state (2 MiB) plus a conv state of 8192
//                   channels x 3 taps x bf16 (48 KiB): 72 segments, 73.7 MiB
//                   per snapshot; --snapshots (8) random slots <-> rows per
//                   transfer. kvtier moves them with SaveSnapshot /
//                   RestoreSnapshot, one call per snapshot.
//   f  block_first_2m  a's shapes in vLLM's block-first pool (BLNHC /
//                   BLHNC): page i of every layer back to back, so a page
//                   is one contiguous 2 MiB run over all layers.
//   f256k block_first_256k  d's shapes (64 x 4 KiB) block-first: a page is
//                   one contiguous 256 KiB run.
//   g  layer_first_buffer  a's shapes in vLLM's layer-first single buffer:
//                   one allocation, layer t's [pages][32 KiB] array at t x a
//                   fixed stride, a page's chunks that stride apart.
//   f640k block_first_640k_tp8  one TP-8 rank of Llama-3-70B block-first:
//                   80 layers x K,V of 4 KiB (1 KV head x 128 x 16 tokens
//                   x bf16), a page one contiguous 640 KiB run.
// f, f256k, f640k and g are not in the default --layouts; name them.
// Prefixes (--prefixes, tokens): 1k, 8k and 32k; pages = tokens / page size.
//
// Methods, all on one non-blocking stream, timed with CUDA events around the
// enqueue (host enqueue time counts where it is the bottleneck, as for the
// per-chunk loop; batch descriptor arrays are built before the start event):
//   contiguous    one cudaMemcpyAsync of the same bytes, GPU pool start <->
//                 arena start: the link's ceiling.
//   memcpy_loop   one cudaMemcpyAsync per page per tensor.
//   memcpy_batch  one cudaMemcpyBatchAsync of every chunk (CUDA 12.8+),
//                 stream-ordered source access.
//   memcpy_2d     one cudaMemcpy2DAsync per page and run of equally sized,
//                 equally spaced tensors (a bank's chunks of one page on
//                 layouts a-d and g; one line per page on f).
//   kvtier        TransferEngine::Evict / Rehydrate on the staged path (the
//                 engine's default): a gather kernel of --staging_ctas CTAs
//                 fills an HBM staging buffer, the copy engine moves it to
//                 the host rows, double-buffered (the reverse to
//                 rehydrate); snapshots go through the copy engine per
//                 segment. Run at the default gather grid
//                 (client::kDefaultStagingCtas) at every prefix and at every
//                 --staging_ctas count at --sweep_prefix. sms = the gather's
//                 CTAs, which hold their SMs only for a short burst per
//                 slice. --kvtier_variants adds staged runs with other
//                 engine options (name:key=value;...; keys staging_mib,
//                 staging_ctas, first_kib, edge_ctas, prio_default,
//                 ce_share, path=auto|staged|direct|copy_engine),
//                 reported as method "kvtier[name]". path=auto is what an
//                 engine gets by default: the copy-engine path (no kernel,
//                 one copy per contiguous run) on block-first pools whose
//                 pages are runs of >= 256 KiB, else staged.
//   kvtier_direct the engine's direct path (TransferOptions::path kDirect,
//                 the one CUDA graph capture uses): the copy kernel reads and
//                 writes host rows over UVA, slices of <= 128 pages, at its
//                 default grid (kernels::kDefaultMaxCtas) at every prefix
//                 and at every --ctas count at --sweep_prefix. Its CTAs are
//                 spread one per SM for the whole transfer, so sms = ctas.
// Directions: evict (GPU -> host), rehydrate (host -> GPU), and both at once
// (evict on one stream while rehydrating other pages/rows on another;
// direction "both", bytes = both directions together, time = until both end).
//
// Interference (transfer_bench_interference.cc): per --loads, a load runs on
// its own default-priority stream of the primary context: "gemm", cuBLAS
// bf16 GEMMs (--gemm_n cubed) back to back, which hold every SM; "decode", a
// decode-step proxy replayed from a CUDA graph (32 layers of Llama-3-8B's
// projections at batch 64 plus a 1 GiB HBM read). For each layout of
// --gemm_layouts, direction and configuration (the frontier's knobs: copy
// engines only -- contiguous, memcpy_batch, memcpy_2d, kvtier's copy-engine
// path --, kvtier's staged path at 2 and 8 CTAs and at the default stream
// priority, kvtier's default, the direct kernel at 8 and 16 CTAs), a host
// thread keeps two transfers in flight on another stream during
// --gemm_rounds timed windows of the load, each between two windows without
// it (beside the GEMM, --judged_rounds for the contiguous copy and kvtier's
// default, the pair item 1's bound compares); slowdown_pct is the median of
// (time with / mean of the windows on either side - 1) x 100, with the
// transfer's own GB/s under that load. cuBLAS is dlopen()ed (libcublas.so.13,
// --cublas_lib to point at one); without it the part is skipped with a note.
//
// Statistics: each configuration runs one warm-up, then up to --repeats
// timed repeats, stopping early once it has --min_repeats and has spent
// --max_config_seconds; "repeats" in each record says how many it got.
// gbps_p50 is bytes over the median time; gbps_p99 is bytes over the 99th
// percentile time (the slow tail; with fewer than 100 repeats, the slowest).
// Before timing, each layout's methods are checked against each other byte
// for byte on a few pages ("verify" in the JSON).
//
// Runtime on the H200 (2026-11-30): the default run took 226 s (a 20 GiB pool
// and a 4 GiB arena, set up in 3 s; layouts a-c 44-49 s each, d 26 s, e 19 s,
// both directions 15 s, GEMM 20 s); --quick (the 8k prefix, <= 30 repeats,
// 0.4 s per configuration, 100-GEMM windows) with six --kvtier_variants on
// layouts a, b, d, e took 72 s. Configurations that hit
// --max_config_seconds (32k prefixes, the per-chunk loop) get fewer than 100
// repeats; raise it (and the run time) for a fuller p99 there.
//
// The code: this file holds the flags, Bench::Setup (and its steps) and main;
// transfer_bench.h lists the other transfer_bench_*.cc files and what each
// holds.
//
// Thread-safety: a single-threaded program except for the GEMM section's
// transfer thread, which shares only the TransferEngine (thread-safe) and
// atomics with the main thread.

#include "bench/transfer_bench.h"

#include <cuda_runtime_api.h>
#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/transfer_engine.h"
#include "client/transfer_plan.h"
#include "kernels/page_copy.h"

ABSL_FLAG(double, pool_gib, 20, "GPU pool size in GiB (random pages over it)");
ABSL_FLAG(std::string, prefixes, "1024,8192,32768", "Prefix lengths, tokens");
ABSL_FLAG(std::string, layouts, "a,b,c,d,e",
          "Layouts to run (see the file comment)");
ABSL_FLAG(std::string, methods,
          "contiguous,memcpy_loop,memcpy_batch,memcpy_2d,kvtier,kvtier_direct",
          "Methods to run");
ABSL_FLAG(std::string, ctas, "8,16",
          "kvtier_direct grid sizes swept at --sweep_prefix (the default "
          "grid is always run at every prefix)");
ABSL_FLAG(std::string, staging_ctas, "2,4,8",
          "kvtier (staged) gather / scatter grid sizes swept at "
          "--sweep_prefix (the default is always run at every prefix)");
ABSL_FLAG(std::string, kvtier_variants, "",
          "Extra staged configurations at --sweep_prefix, ','-separated "
          "name:key=value;key=value (keys: staging_mib, staging_ctas, "
          "first_kib, edge_ctas, prio_default=0|1, ce_share (percent), "
          "path=auto|staged|direct|copy_engine)");
ABSL_FLAG(double, deadline_s, 0,
          "Stop starting measurements after this many seconds and print what "
          "was measured (0: no deadline)");
ABSL_FLAG(uint32_t, sweep_prefix, 8192,
          "Prefix (tokens) of the CTA sweep, both-directions and GEMM parts");
ABSL_FLAG(uint32_t, snapshots, 8, "Snapshots per transfer for layout e");
ABSL_FLAG(int32_t, repeats, 100, "Timed repeats per configuration (at most)");
ABSL_FLAG(int32_t, min_repeats, 5,
          "Repeats a configuration always gets, whatever the time cap");
ABSL_FLAG(double, max_config_seconds, 1.5,
          "Stop repeating a configuration after this long (0: no cap)");
ABSL_FLAG(bool, bidirectional, true, "Measure both directions at once");
ABSL_FLAG(std::string, bidirectional_layouts, "a,d",
          "Layouts of the both-directions part");
ABSL_FLAG(bool, gemm, true,
          "Run the interference part: transfers beside --loads");
ABSL_FLAG(std::string, loads, "gemm,decode",
          "Loads of the interference part: gemm (a loop of --gemm_n^3 bf16 "
          "GEMMs), decode (a decode-step proxy graph)");
ABSL_FLAG(int32_t, gemm_n, 8192,
          "GEMM size (n x n x n, bf16, fp32 accumulate)");
ABSL_FLAG(int32_t, gemm_iters, 200, "GEMMs per timed window");
ABSL_FLAG(int32_t, decode_steps, 60, "Decode-proxy steps per timed window");
ABSL_FLAG(int32_t, gemm_rounds, 3,
          "Windows with a transfer per configuration of the interference "
          "part, each between two windows without (slowdown: their median)");
ABSL_FLAG(int32_t, judged_rounds, 0,
          "Rounds beside the GEMM (whose windows are the noisy ones) of the "
          "two configurations issue 16's item 1 compares -- the contiguous "
          "copy and kvtier's default (path=auto) (0: --gemm_rounds)");
ABSL_FLAG(std::string, gemm_layouts, "a",
          "Layouts the interference part transfers ('all': every selected "
          "one)");
ABSL_FLAG(std::string, cublas_lib, "",
          "Path of libcublas.so to dlopen (default: search the usual places)");
ABSL_FLAG(bool, quick, false,
          "About a minute: 8k prefix only, <= 30 repeats, 0.4 s per "
          "configuration, 50-GEMM and 25-step windows");
ABSL_FLAG(bool, verify, true, "Cross-check the methods' bytes first");
ABSL_FLAG(bool, huge_pages, false,
          "Back the host arena with 2 MiB huge pages (MAP_HUGETLB), as banks "
          "on hugetlbfs are; fails unless vm.nr_hugepages has room");
ABSL_FLAG(uint32_t, row_run, 1,
          "Host rows are drawn in runs of this many consecutive rows (1: each "
          "row at random, as a fragmented bank hands them out); GPU pages "
          "stay random");
ABSL_FLAG(std::string, row_run_lengths, "",
          "Host rows are drawn in runs whose lengths follow this file's "
          "\"length count\" lines (python/bench/row_runs.py --lengths-out: "
          "the runs kvtierd's allocator handed out under churn); excludes "
          "--row_run above 1");
ABSL_FLAG(uint64_t, seed, 1, "Random seed");

namespace kvtier::bench {

namespace {
// --row_run_lengths's runs, loaded once by LoadHostRowRuns (main thread,
// before any Picker is made).
std::optional<RunLengths>& HostRowRuns() {
  static std::optional<RunLengths> runs;
  return runs;
}
}  // namespace

absl::Status LoadHostRowRuns() {
  const std::string path = absl::GetFlag(FLAGS_row_run_lengths);
  if (path.empty()) return absl::OkStatus();
  if (absl::GetFlag(FLAGS_row_run) > 1) {
    return absl::InvalidArgumentError(
        "--row_run and --row_run_lengths both say how host rows are drawn: "
        "give one");
  }
  absl::StatusOr<RunLengths> runs = LoadRunLengths(path);
  if (!runs.ok()) {
    return absl::Status(
        runs.status().code(),
        absl::StrCat("--row_run_lengths: ", runs.status().message()));
  }
  HostRowRuns() = *std::move(runs);
  return absl::OkStatus();
}

std::unique_ptr<Picker> HostRowPicker(uint64_t rows, uint64_t seed) {
  if (HostRowRuns().has_value()) {
    return std::make_unique<Picker>(rows, seed, *HostRowRuns());
  }
  return std::make_unique<Picker>(rows, seed, absl::GetFlag(FLAGS_row_run));
}

double HostRowMeanRun() {
  return HostRowRuns().has_value()
             ? MeanRun(*HostRowRuns())
             : std::max<uint32_t>(absl::GetFlag(FLAGS_row_run), 1);
}

void Bench::Fail(const absl::Status& st, absl::string_view where) {
  errors_.push_back(absl::StrCat(std::string(where), ": ", st.ToString()));
  Progress("ERROR %s: %s", std::string(where), st.ToString());
  // A sticky error (a faulting copy) poisons the context for good.
  if (cudaDeviceSynchronize() != cudaSuccess) {
    cudaError_t err = cudaGetLastError();
    if (cudaDeviceSynchronize() != cudaSuccess) {
      dead_ = true;
      errors_.push_back(absl::StrCat("CUDA context unusable after ",
                                     std::string(where), ": ",
                                     cudaGetErrorString(err)));
    }
  }
}

bool Bench::Stop() {
  if (dead_) return true;
  const double deadline = absl::GetFlag(FLAGS_deadline_s);
  if (deadline > 0 && Elapsed() > deadline) {
    if (!out_of_time_) {
      out_of_time_ = true;
      Notes().push_back(absl::StrFormat(
          "--deadline_s %.0f reached: the measurements after it were skipped",
          deadline));
      Progress("deadline reached, skipping the rest");
    }
    return true;
  }
  return false;
}

absl::Status Bench::Setup() {
  BENCH_RETURN_IF_ERROR(ReadFlags());
  BENCH_RETURN_IF_ERROR(InitCuda());
  absl::StatusOr<std::vector<uint64_t>> rows = SelectLayouts();
  if (!rows.ok()) return rows.status();
  BENCH_RETURN_IF_ERROR(AllocatePoolAndArena());
  BENCH_RETURN_IF_ERROR(FillPool());
  return BindLayouts(*rows);
}

absl::Status Bench::ReadFlags() {
  policy_.repeats = absl::GetFlag(FLAGS_repeats);
  policy_.min_repeats = absl::GetFlag(FLAGS_min_repeats);
  policy_.max_seconds = absl::GetFlag(FLAGS_max_config_seconds);
  prefixes_ = SplitUints(absl::GetFlag(FLAGS_prefixes));
  layout_keys_ = SplitList(absl::GetFlag(FLAGS_layouts));
  methods_ = SplitList(absl::GetFlag(FLAGS_methods));
  ctas_ = SplitUints(absl::GetFlag(FLAGS_ctas));
  staging_ctas_ = SplitUints(absl::GetFlag(FLAGS_staging_ctas));
  {
    absl::StatusOr<std::vector<Config>> v =
        ParseVariants(absl::GetFlag(FLAGS_kvtier_variants));
    if (!v.ok()) return v.status();
    variants_ = *std::move(v);
  }
  sweep_prefix_ = absl::GetFlag(FLAGS_sweep_prefix);
  snapshots_ = std::max<uint32_t>(1, absl::GetFlag(FLAGS_snapshots));
  gemm_n_ = absl::GetFlag(FLAGS_gemm_n);
  gemm_iters_ = std::max(1, absl::GetFlag(FLAGS_gemm_iters));
  decode_steps_ = std::max(1, absl::GetFlag(FLAGS_decode_steps));
  gemm_rounds_ = std::max(1, absl::GetFlag(FLAGS_gemm_rounds));
  judged_rounds_ = absl::GetFlag(FLAGS_judged_rounds) > 0
                       ? absl::GetFlag(FLAGS_judged_rounds)
                       : gemm_rounds_;
  quick_ = absl::GetFlag(FLAGS_quick);
  if (quick_) {
    prefixes_ = {sweep_prefix_};
    policy_.repeats = std::min(policy_.repeats, 30);
    policy_.max_seconds =
        policy_.max_seconds > 0 ? std::min(policy_.max_seconds, 0.4) : 0.4;
    gemm_iters_ = std::min(gemm_iters_, 50);
    decode_steps_ = std::min(decode_steps_, 25);
  }
  policy_.min_repeats =
      std::max(1, std::min(policy_.min_repeats, policy_.repeats));
  const uint32_t default_ctas = kernels::kDefaultMaxCtas;
  if (std::find(ctas_.begin(), ctas_.end(), default_ctas) == ctas_.end()) {
    ctas_.push_back(default_ctas);
  }
  std::sort(ctas_.begin(), ctas_.end());
  for (uint32_t& c : ctas_) c = std::min(c, kernels::kMaxCtasLimit);
  if (std::find(staging_ctas_.begin(), staging_ctas_.end(),
                client::kDefaultStagingCtas) == staging_ctas_.end()) {
    staging_ctas_.push_back(client::kDefaultStagingCtas);
  }
  std::sort(staging_ctas_.begin(), staging_ctas_.end());
  for (uint32_t& c : staging_ctas_) c = std::min(c, kernels::kMaxCtasLimit);
  rng_.seed(absl::GetFlag(FLAGS_seed));
  if (absl::Status s = LoadHostRowRuns(); !s.ok()) return s;
  date_ =
      absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::Now(), absl::UTCTimeZone());
  return absl::OkStatus();
}

absl::Status Bench::InitCuda() {
  int devices = 0;
  BENCH_RETURN_IF_ERROR(
      Cuda(cudaGetDeviceCount(&devices), "cudaGetDeviceCount"));
  if (devices == 0) return absl::FailedPreconditionError("no CUDA device");
  BENCH_RETURN_IF_ERROR(Cuda(cudaSetDevice(0), "cudaSetDevice"));
  BENCH_RETURN_IF_ERROR(Cuda(cudaFree(nullptr), "CUDA init"));
  BENCH_RETURN_IF_ERROR(
      Cuda(cudaGetDeviceProperties(&prop_, 0), "cudaGetDeviceProperties"));
  BENCH_RETURN_IF_ERROR(Cuda(
      cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "stream"));
  BENCH_RETURN_IF_ERROR(Cuda(
      cudaStreamCreateWithFlags(&stream2_, cudaStreamNonBlocking), "stream"));
  BENCH_RETURN_IF_ERROR(
      Cuda(cudaStreamCreateWithFlags(&gemm_stream_, cudaStreamNonBlocking),
           "stream"));
  return ev_.Create();
}

absl::StatusOr<std::vector<uint64_t>> Bench::SelectLayouts() {
  const uint32_t max_prefix = std::max(
      *std::max_element(prefixes_.begin(), prefixes_.end()), sweep_prefix_);
  pool_bytes_ =
      static_cast<uint64_t>(absl::GetFlag(FLAGS_pool_gib) * kGiB) / kMiB * kMiB;
  for (const LayoutDef& d : AllLayouts()) {
    if (Contains(layout_keys_, d.key)) defs_.push_back(d);
  }
  if (defs_.empty()) return absl::InvalidArgumentError("no layouts selected");
  std::vector<uint64_t> rows(defs_.size());
  arena_bytes_ = 512 * kMiB;  // at least the fill's staging
  for (size_t i = 0; i < defs_.size(); ++i) {
    const LayoutDef& d = defs_[i];
    if (d.snapshot()) {
      rows[i] = std::max<uint64_t>(16, 3 * snapshots_);
    } else {
      rows[i] =
          std::max<uint64_t>({max_prefix / d.tokens_per_page,
                              2 * (sweep_prefix_ / d.tokens_per_page), 128});
    }
    absl::StatusOr<Bound> dry =
        Bind(d, 4096, pool_bytes_, nullptr, 0, ~0ull, rows[i]);
    if (!dry.ok()) return dry.status();
    arena_bytes_ = std::max(arena_bytes_, RoundUp(dry->arena_used, 2 * kMiB));
  }
  return rows;
}

absl::Status Bench::AllocatePoolAndArena() {
  Progress("GPU %s, %d SMs; pool %.1f GiB, host arena %.2f GiB", prop_.name,
           prop_.multiProcessorCount, double(pool_bytes_) / kGiB,
           double(arena_bytes_) / kGiB);
  void* pool = nullptr;
  BENCH_RETURN_IF_ERROR(Cuda(cudaMalloc(&pool, pool_bytes_),
                             absl::StrCat("cudaMalloc ", pool_bytes_)));
  pool_ = static_cast<uint8_t*>(pool);
  // Shared anonymous memory: shmem pages, like a /dev/shm bank, or with
  // --huge_pages 2 MiB huge pages, like a bank on hugetlbfs (the daemon's
  // choice wherever a 2 MiB mount has room).
  const bool huge = absl::GetFlag(FLAGS_huge_pages);
  void* arena =
      mmap(nullptr, arena_bytes_, PROT_READ | PROT_WRITE,
           MAP_SHARED | MAP_ANONYMOUS | MAP_POPULATE | (huge ? MAP_HUGETLB : 0),
           -1, 0);
  if (arena == MAP_FAILED) {
    return absl::ErrnoToStatus(
        errno,
        absl::StrCat("mmap ", arena_bytes_, " bytes",
                     huge ? " of 2 MiB huge pages (--huge_pages; reserve "
                            "them with vm.nr_hugepages)"
                          : ""));
  }
  arena_ = static_cast<uint8_t*>(arena);
  BENCH_RETURN_IF_ERROR(
      Cuda(cudaHostRegister(arena_, arena_bytes_,
                            cudaHostRegisterMapped | cudaHostRegisterPortable),
           "cudaHostRegister arena"));
  void* dev = nullptr;
  BENCH_RETURN_IF_ERROR(
      Cuda(cudaHostGetDevicePointer(&dev, arena_, 0), "device pointer"));
  arena_dev_ = reinterpret_cast<uint64_t>(dev);
  Progress("pool allocated, arena mapped and registered");
  return absl::OkStatus();
}

absl::Status Bench::BindLayouts(const std::vector<uint64_t>& rows) {
  for (size_t i = 0; i < defs_.size(); ++i) {
    absl::StatusOr<Bound> b =
        Bind(defs_[i], reinterpret_cast<uint64_t>(pool_), pool_bytes_, arena_,
             arena_dev_, arena_bytes_, rows[i]);
    if (!b.ok()) return b.status();
    bounds_.push_back(*std::move(b));
  }
  for (Bound& b : bounds_) {
    gpu_pickers_.push_back(std::make_unique<Picker>(b.gpu_items, rng_()));
    row_pickers_.push_back(HostRowPicker(b.host_rows, rng_()));
  }
  return absl::OkStatus();
}

// Fills the pool with varied bytes (not zeros) through a pinned staging area
// at the arena's start: 256 MiB of random bytes, stamped per block.
absl::Status Bench::FillPool() {
  const uint64_t block = 256 * kMiB;
  uint64_t x = absl::GetFlag(FLAGS_seed) * 0x9e3779b97f4a7c15ull + 1;
  for (uint64_t i = 0; i + 8 <= block; i += 8) {
    uint64_t z = (x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    std::memcpy(arena_ + i, &z, 8);
  }
  for (uint64_t off = 0, b = 0; off < pool_bytes_; off += block, ++b) {
    for (uint64_t i = 0; i < block; i += 4096) std::memcpy(arena_ + i, &b, 8);
    BENCH_RETURN_IF_ERROR(
        Cuda(cudaMemcpy(pool_ + off, arena_, std::min(block, pool_bytes_ - off),
                        cudaMemcpyHostToDevice),
             "fill pool"));
  }
  Progress("pool filled");
  return absl::OkStatus();
}

int Main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  Bench bench;
  absl::Status st = bench.Setup();
  if (!st.ok()) {
    Progress("setup failed: %s", st.ToString());
    std::printf("{\"benchmark\": \"transfer_bench\", \"error\": %s}\n",
                JsonString(st.ToString()).c_str());
    return 1;
  }
  bench.Run();
  std::fputs(bench.Json().c_str(), stdout);
  std::fflush(stdout);
  return 0;
}

}  // namespace kvtier::bench

int main(int argc, char** argv) { return kvtier::bench::Main(argc, argv); }
