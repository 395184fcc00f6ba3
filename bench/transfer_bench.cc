// transfer_bench: GB/s of moving KV pages and recurrent-state snapshots
// between a GPU pool and page-first host rows, kvtier's copy kernel side by
// side with the usual ways, on one GPU. Prints one JSON object on stdout and a
// progress line per measurement on stderr.
//
// Setup: a GPU pool of --pool_gib (default 20 GiB, filled with varied bytes),
// carved per layout into tensor-major tensors (per layer K and V each a
// [pages][bytes] array, as engines keep them); one host arena
// (MAP_SHARED | MAP_ANONYMOUS, populated, cudaHostRegister'd Mapped |
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
//                 staging_ctas), reported as method "kvtier[name]".
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
// GEMM interference: a cuBLAS bf16 GEMM (--gemm_n cubed) in a loop on its own
// stream, timed alone and while one transfer method keeps another stream
// busy (a host thread keeps two transfers in flight); slowdown_pct =
// (time with / time alone - 1) x 100, "alone" being the mean of the windows
// just before and after, with the transfer's own GB/s under that load. cuBLAS
// is dlopen()ed (libcublas.so.13, --cublas_lib to point at one); without it the
// GEMM part is skipped with a note.
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
// Thread-safety: a single-threaded program except for the GEMM section's
// transfer thread, which shares only the TransferEngine (thread-safe) and
// atomics with the main thread.

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <sys/mman.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/pool.h"
#include "client/transfer_engine.h"
#include "client/transfer_plan.h"
#include "kernels/page_copy.h"

ABSL_FLAG(double, pool_gib, 20, "GPU pool size in GiB (random pages over it)");
ABSL_FLAG(std::string, prefixes, "1024,8192,32768", "Prefix lengths, tokens");
ABSL_FLAG(std::string, layouts, "a,b,c,d,e",
          "Layouts to run (see the file comment)");
ABSL_FLAG(std::string, methods,
          "contiguous,memcpy_loop,memcpy_batch,kvtier,kvtier_direct",
          "Methods to run");
ABSL_FLAG(std::string, ctas, "8,16",
          "kvtier_direct grid sizes swept at --sweep_prefix (the default "
          "grid is always run at every prefix)");
ABSL_FLAG(std::string, staging_ctas, "2,4,8",
          "kvtier (staged) gather / scatter grid sizes swept at "
          "--sweep_prefix (the default is always run at every prefix)");
ABSL_FLAG(std::string, kvtier_variants, "",
          "Extra staged configurations at --sweep_prefix, ','-separated "
          "name:key=value;key=value (keys: staging_mib, staging_ctas)");
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
ABSL_FLAG(bool, gemm, true, "Measure the slowdown of a concurrent GEMM");
ABSL_FLAG(int32_t, gemm_n, 8192,
          "GEMM size (n x n x n, bf16, fp32 accumulate)");
ABSL_FLAG(int32_t, gemm_iters, 200, "GEMMs per timed window");
ABSL_FLAG(std::string, gemm_layout, "a", "Layout the GEMM part transfers");
ABSL_FLAG(std::string, cublas_lib, "",
          "Path of libcublas.so to dlopen (default: search the usual places)");
ABSL_FLAG(bool, quick, false,
          "About a minute: 8k prefix only, <= 30 repeats, 0.4 s per "
          "configuration, 100-GEMM windows");
ABSL_FLAG(bool, verify, true, "Cross-check the methods' bytes first");
ABSL_FLAG(uint64_t, seed, 1, "Random seed");

namespace kvtier::bench {
namespace {

using client::HostBankView;
using client::NamedHostBank;
using client::TransferEngine;
using Clock = std::chrono::steady_clock;
using client::BankPool;
using client::GpuPoolDescriptor;
using client::PoolTensor;

constexpr uint64_t kKiB = 1024;
constexpr uint64_t kMiB = kKiB * kKiB;
constexpr uint64_t kGiB = kMiB * kKiB;

#define BENCH_RETURN_IF_ERROR(expr)    \
  do {                                 \
    absl::Status status_ = (expr);     \
    if (!status_.ok()) return status_; \
  } while (0)

absl::Status Cuda(cudaError_t err, absl::string_view what) {
  if (err == cudaSuccess) return absl::OkStatus();
  cudaGetLastError();
  return absl::InternalError(absl::StrCat(std::string(what), ": ",
                                          cudaGetErrorName(err), ": ",
                                          cudaGetErrorString(err)));
}

uint64_t RoundUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

const Clock::time_point kStart = Clock::now();
double Elapsed() {
  return std::chrono::duration<double>(Clock::now() - kStart).count();
}

template <typename... Args>
void Progress(const absl::FormatSpec<Args...>& fmt, const Args&... args) {
  std::fprintf(stderr, "[%7.1fs] %s\n", Elapsed(),
               absl::StrFormat(fmt, args...).c_str());
  std::fflush(stderr);
}

std::string JsonString(absl::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += absl::StrFormat("\\u%04x", static_cast<int>(c));
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

std::vector<std::string> SplitList(const std::string& s) {
  std::vector<std::string> out;
  for (absl::string_view p : absl::StrSplit(s, ',', absl::SkipEmpty())) {
    out.emplace_back(absl::StripAsciiWhitespace(p));
  }
  return out;
}

std::vector<uint32_t> SplitUints(const std::string& s) {
  std::vector<uint32_t> out;
  for (const std::string& p : SplitList(s)) {
    uint32_t v = 0;
    if (absl::SimpleAtoi(p, &v) && v > 0) out.push_back(v);
  }
  return out;
}

bool Contains(const std::vector<std::string>& v, absl::string_view s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

// ---------------------------------------------------------------------------
// Layouts.

struct BankDef {
  std::string name;
  std::vector<uint64_t> tensor_bytes;  // one page of each tensor, row order
};

struct LayoutDef {
  std::string key;   // "a".."e"
  std::string name;  // short, for tables
  std::string description;
  uint32_t tokens_per_page = 0;          // 0 for the snapshot layout
  std::vector<BankDef> banks;            // page banks (empty for snapshots)
  std::vector<uint64_t> snapshot_bytes;  // snapshot segments
  uint64_t chunk_bytes = 0;              // the main chunk size
  uint64_t side_chunk_bytes = 0;         // a side bank's chunk size, if any
  bool snapshot() const { return !snapshot_bytes.empty(); }
};

std::vector<LayoutDef> AllLayouts() {
  constexpr int kLayers = 32;
  auto kv_bank = [](uint64_t bytes) {
    BankDef b{"kv", {}};
    for (int i = 0; i < 2 * kLayers; ++i) b.tensor_bytes.push_back(bytes);
    return b;
  };
  std::vector<LayoutDef> out;
  {
    LayoutDef l;
    l.key = "a";
    l.name = "bf16_16tok";
    l.description =
        "bf16, 32 layers x K,V, 8 KV heads x 128, 16-token pages: 64 x 32 KiB";
    l.tokens_per_page = 16;
    l.banks = {kv_bank(32 * kKiB)};
    l.chunk_bytes = 32 * kKiB;
    out.push_back(l);
  }
  {
    LayoutDef l;
    l.key = "b";
    l.name = "fp8_16tok";
    l.description =
        "fp8, 32 layers x K,V, 8 KV heads x 128, 16-token pages: 64 x 16 KiB, "
        "plus per-token per-head fp32 scales: 64 x 512 B in bank 'scale'";
    l.tokens_per_page = 16;
    BankDef scale{"scale", {}};
    for (int i = 0; i < 2 * kLayers; ++i) scale.tensor_bytes.push_back(512);
    l.banks = {kv_bank(16 * kKiB), scale};
    l.chunk_bytes = 16 * kKiB;
    l.side_chunk_bytes = 512;
    out.push_back(l);
  }
  {
    LayoutDef l;
    l.key = "c";
    l.name = "bf16_64tok";
    l.description =
        "bf16, 32 layers x K,V, 8 KV heads x 128, 64-token pages: 64 x 128 KiB";
    l.tokens_per_page = 64;
    l.banks = {kv_bank(128 * kKiB)};
    l.chunk_bytes = 128 * kKiB;
    out.push_back(l);
  }
  {
    LayoutDef l;
    l.key = "d";
    l.name = "tp8_bf16_16tok";
    l.description =
        "TP shard: bf16, 32 layers x K,V, 1 KV head x 128, 16-token pages: "
        "64 x 4 KiB";
    l.tokens_per_page = 16;
    l.banks = {kv_bank(4 * kKiB)};
    l.chunk_bytes = 4 * kKiB;
    out.push_back(l);
  }
  {
    LayoutDef l;
    l.key = "e";
    l.name = "hybrid_snapshot";
    l.description =
        "hybrid snapshot: 36 recurrent layers x (32 x 128 x 128 fp32 state "
        "2 MiB + conv state 8192 x 3 bf16 48 KiB)";
    for (int i = 0; i < 36; ++i) {
      l.snapshot_bytes.push_back(2 * kMiB);
      l.snapshot_bytes.push_back(8192 * 3 * 2);
    }
    l.chunk_bytes = 2 * kMiB;
    l.side_chunk_bytes = 8192 * 3 * 2;
    out.push_back(l);
  }
  return out;
}

// One tensor (or snapshot segment) of a bound layout: where page (or slot)
// i's bytes are on the GPU and where row r's copy of them is on the host.
struct Tensor {
  uint64_t gpu_base = 0;
  uint64_t gpu_stride = 0;
  uint64_t host_base = 0;  // device pointer of row 0 + offset in the row
  uint64_t host_stride = 0;
  uint64_t bytes = 0;
};

// A layout placed on the GPU pool and the host arena.
struct Bound {
  const LayoutDef* def = nullptr;
  uint64_t gpu_items = 0;   // GPU pages (or snapshot slots)
  uint64_t host_rows = 0;   // rows of every bank
  uint64_t item_bytes = 0;  // payload of one page (or snapshot), all banks
  std::vector<Tensor> tensors;
  GpuPoolDescriptor pool;
  std::vector<NamedHostBank> banks;
  std::optional<HostBankView> snapshot_bank;
  // Host pointer of row 0, row bytes and row stride of each bank that
  // carries payload (the snapshot bank for layout e).
  std::vector<uint8_t*> bank_host;
  std::vector<uint64_t> bank_row_bytes;
  std::vector<uint64_t> bank_stride;
  uint64_t arena_used = 0;  // host bytes the banks span
};

// Places `def` on the GPU range [pool, pool + pool_bytes) and the host arena
// (host pointer arena_host, device pointer arena_dev, arena_bytes long) with
// `rows` rows per bank. GPU tensors are tensor-major (each its own
// [items][bytes] array, 256-byte aligned); host banks are page-first, each
// 2 MiB aligned, back to back. With null pointers it only does the
// arithmetic (arena_used says how much host memory the layout needs).
// INVALID_ARGUMENT if it does not fit.
absl::StatusOr<Bound> Bind(const LayoutDef& def, uint64_t pool,
                           uint64_t pool_bytes, uint8_t* arena_host,
                           uint64_t arena_dev, uint64_t arena_bytes,
                           uint64_t rows) {
  Bound b;
  b.def = &def;
  b.host_rows = rows;
  b.pool.device = 0;
  std::vector<uint64_t> sizes;
  if (def.snapshot()) {
    sizes = def.snapshot_bytes;
  } else {
    for (const BankDef& bank : def.banks) {
      for (uint64_t t : bank.tensor_bytes) sizes.push_back(t);
    }
  }
  uint64_t per_item = 0;
  for (uint64_t s : sizes) {
    per_item += RoundUp(s, 16);
    b.item_bytes += s;
  }
  // Alignment slack per tensor, and the snapshot engine's dummy page bank.
  const uint64_t reserve = sizes.size() * 256 + 4096;
  if (pool_bytes <= reserve + 2 * per_item) {
    return absl::InvalidArgumentError(
        absl::StrCat("layout ", def.key, ": the pool is too small"));
  }
  uint64_t items = (pool_bytes - reserve) / per_item;
  if (def.snapshot()) items = std::min<uint64_t>(items, 4096);
  items = std::min<uint64_t>(items, 0xffffffffu);
  b.gpu_items = items;

  uint64_t gpu_off = 0;
  std::vector<uint64_t> gpu_base(sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) {
    gpu_base[i] = pool + gpu_off;
    gpu_off = RoundUp(gpu_off + RoundUp(sizes[i], 16) * items, 256);
  }
  uint64_t host_off = 0;
  auto place_host = [&](uint64_t row_bytes, uint64_t n) {
    const uint64_t start = RoundUp(host_off, 2 * kMiB);
    host_off = start + RoundUp(row_bytes, 16) * n;
    return start;
  };

  if (def.snapshot()) {
    const uint64_t row_bytes = b.item_bytes;
    const uint64_t stride = RoundUp(row_bytes, 16);
    const uint64_t start = place_host(row_bytes, rows);
    uint64_t in_row = 0;
    for (size_t i = 0; i < sizes.size(); ++i) {
      b.tensors.push_back(Tensor{gpu_base[i], RoundUp(sizes[i], 16),
                                 arena_dev + start + in_row, stride, sizes[i]});
      b.pool.snapshot.push_back(
          PoolTensor{gpu_base[i], RoundUp(sizes[i], 16), sizes[i]});
      in_row += sizes[i];
    }
    b.pool.num_snapshot_slots = items;
    b.snapshot_bank = HostBankView{arena_dev + start, rows, row_bytes, stride};
    b.bank_host.push_back(arena_host ? arena_host + start : nullptr);
    b.bank_row_bytes.push_back(row_bytes);
    b.bank_stride.push_back(stride);
    // The page bank every engine needs: one 16-byte page, never copied.
    const uint64_t dummy_gpu = pool + RoundUp(gpu_off, 256);
    gpu_off = RoundUp(gpu_off, 256) + 16;
    const uint64_t dummy_host = place_host(16, 1);
    b.pool.num_pages = 1;
    b.pool.banks = {BankPool{"kv", {PoolTensor{dummy_gpu, 16, 16}}}};
    b.banks = {{"kv", HostBankView{arena_dev + dummy_host, 1, 16, 16}}};
  } else {
    size_t ti = 0;
    for (const BankDef& bank : def.banks) {
      uint64_t row_bytes = 0;
      for (uint64_t t : bank.tensor_bytes) row_bytes += t;
      const uint64_t stride = RoundUp(row_bytes, 16);
      const uint64_t start = place_host(row_bytes, rows);
      BankPool bp{bank.name, {}};
      uint64_t in_row = 0;
      for (uint64_t t : bank.tensor_bytes) {
        b.tensors.push_back(Tensor{gpu_base[ti], RoundUp(t, 16),
                                   arena_dev + start + in_row, stride, t});
        bp.tensors.push_back(PoolTensor{gpu_base[ti], RoundUp(t, 16), t});
        in_row += t;
        ++ti;
      }
      b.pool.banks.push_back(std::move(bp));
      b.banks.push_back({bank.name, HostBankView{arena_dev + start, rows,
                                                 row_bytes, stride}});
      b.bank_host.push_back(arena_host ? arena_host + start : nullptr);
      b.bank_row_bytes.push_back(row_bytes);
      b.bank_stride.push_back(stride);
    }
    b.pool.num_pages = items;
  }
  if (gpu_off > pool_bytes) {
    return absl::InternalError(
        absl::StrCat("layout ", def.key, ": pool arithmetic overflowed"));
  }
  b.arena_used = host_off;
  if (host_off > arena_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("layout ", def.key, ": needs ", host_off,
                     " host bytes, arena has ", arena_bytes));
  }
  return b;
}

// ---------------------------------------------------------------------------
// Transfers.

enum class Dir { kEvict, kRehydrate };
const char* DirName(Dir d) { return d == Dir::kEvict ? "evict" : "rehydrate"; }

enum class Method { kContiguous, kLoop, kBatch, kKvtier, kKvtierDirect };
const char* MethodName(Method m) {
  switch (m) {
    case Method::kContiguous:
      return "contiguous";
    case Method::kLoop:
      return "memcpy_loop";
    case Method::kBatch:
      return "memcpy_batch";
    case Method::kKvtier:
      return "kvtier";
    case Method::kKvtierDirect:
      return "kvtier_direct";
  }
  return "?";
}
bool IsKvtier(Method m) {
  return m == Method::kKvtier || m == Method::kKvtierDirect;
}

// One measured configuration: a method and, for kvtier's, the engine's
// options.
struct Config {
  Method method = Method::kContiguous;
  uint32_t ctas = 0;    // kernel CTAs (0: copy engines only)
  std::string variant;  // a --kvtier_variants name, or ""
  client::TransferOptions options;
  bool default_grid = false;
  std::string Name() const {
    return variant.empty()
               ? MethodName(method)
               : absl::StrCat(MethodName(method), "[", variant, "]");
  }
};

Config Baseline(Method m) {
  Config c;
  c.method = m;
  return c;
}

Config Staged(uint32_t ctas) {
  Config c;
  c.method = Method::kKvtier;
  c.ctas = ctas;
  c.options.path = client::TransferPath::kStaged;
  c.options.staging_ctas = ctas;
  c.default_grid = ctas == client::kDefaultStagingCtas;
  return c;
}

Config Direct(uint32_t ctas) {
  Config c;
  c.method = Method::kKvtierDirect;
  c.ctas = ctas;
  c.options.path = client::TransferPath::kDirect;
  c.options.max_ctas = ctas;
  c.default_grid = ctas == kernels::kDefaultMaxCtas;
  return c;
}

// Parses --kvtier_variants.
absl::StatusOr<std::vector<Config>> ParseVariants(const std::string& flag) {
  std::vector<Config> out;
  for (absl::string_view item : absl::StrSplit(flag, ',', absl::SkipEmpty())) {
    std::pair<std::string, std::string> nv =
        absl::StrSplit(item, absl::MaxSplits(':', 1));
    Config c = Staged(client::kDefaultStagingCtas);
    c.variant = nv.first;
    c.default_grid = false;
    for (absl::string_view kv :
         absl::StrSplit(nv.second, ';', absl::SkipEmpty())) {
      std::pair<std::string, std::string> p =
          absl::StrSplit(kv, absl::MaxSplits('=', 1));
      uint64_t v = 0;
      if (!absl::SimpleAtoi(p.second, &v)) {
        return absl::InvalidArgumentError(
            absl::StrCat("--kvtier_variants: bad value in '", kv, "'"));
      }
      if (p.first == "staging_mib") {
        c.options.staging_bytes = v << 20;
      } else if (p.first == "staging_ctas") {
        c.options.staging_ctas = static_cast<uint32_t>(v);
        c.ctas = static_cast<uint32_t>(v);
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat("--kvtier_variants: unknown key '", p.first, "'"));
      }
    }
    out.push_back(c);
  }
  return out;
}

// A key naming the engine options of `c` (engines are shared by configs with
// the same options).
std::string OptionsKey(const client::TransferOptions& o) {
  return absl::StrCat(static_cast<int>(o.path), "/", o.max_ctas, "/",
                      o.staging_bytes, "/", o.staging_ctas);
}

// Draws distinct values below n, a fresh random subset each call.
class Picker {
 public:
  Picker(uint64_t n, uint64_t seed) : perm_(n), rng_(seed) {
    for (uint64_t i = 0; i < n; ++i) perm_[i] = static_cast<uint32_t>(i);
  }
  // REQUIRES: k <= n.
  void Pick(size_t k, std::vector<uint32_t>* out) {
    const size_t n = perm_.size();
    for (size_t i = 0; i < k; ++i) {
      const size_t j = i + static_cast<size_t>(rng_() % (n - i));
      std::swap(perm_[i], perm_[j]);
    }
    out->assign(perm_.begin(), perm_.begin() + k);
  }

 private:
  std::vector<uint32_t> perm_;
  std::mt19937_64 rng_;
};

struct Items {
  std::vector<uint32_t> gpu;   // GPU pages (snapshot slots)
  std::vector<uint32_t> rows;  // host rows
};

// Picks `sets` disjoint item sets of n items each.
void PickItems(Picker& gpu, Picker& rows, size_t n, std::vector<Items>* sets) {
  std::vector<uint32_t> g, r;
  gpu.Pick(n * sets->size(), &g);
  rows.Pick(n * sets->size(), &r);
  for (size_t s = 0; s < sets->size(); ++s) {
    (*sets)[s].gpu.assign(g.begin() + s * n, g.begin() + (s + 1) * n);
    (*sets)[s].rows.assign(r.begin() + s * n, r.begin() + (s + 1) * n);
  }
}

// One transfer ready to enqueue: everything host-side is built beforehand.
struct Transfer {
  const Bound* b = nullptr;
  Dir dir = Dir::kEvict;
  Method method = Method::kKvtier;
  TransferEngine* engine = nullptr;  // kKvtier
  Items items;
  // kLoop and kBatch: one entry per item per tensor.
  std::vector<void*> dst;
  std::vector<const void*> src;
  std::vector<size_t> size;
  // kContiguous: offset into both the pool and the arena.
  uint64_t contiguous_offset = 0;
  uint64_t pool = 0, arena_dev = 0;
  uint64_t bytes = 0;  // payload
};

void BuildChunks(Transfer* t) {
  const Bound& b = *t->b;
  const size_t n = t->items.gpu.size();
  t->bytes = n * b.item_bytes;
  if (t->method != Method::kLoop && t->method != Method::kBatch) return;
  const size_t count = n * b.tensors.size();
  t->dst.resize(count);
  t->src.resize(count);
  t->size.resize(count);
  size_t k = 0;
  for (size_t i = 0; i < n; ++i) {
    const uint64_t g = t->items.gpu[i];
    const uint64_t r = t->items.rows[i];
    for (const Tensor& ten : b.tensors) {
      const uint64_t gpu = ten.gpu_base + g * ten.gpu_stride;
      const uint64_t host = ten.host_base + r * ten.host_stride;
      const uint64_t to = t->dir == Dir::kEvict ? host : gpu;
      const uint64_t from = t->dir == Dir::kEvict ? gpu : host;
      t->dst[k] = reinterpret_cast<void*>(to);
      t->src[k] = reinterpret_cast<const void*>(from);
      t->size[k] = ten.bytes;
      ++k;
    }
  }
}

// Notes about a method that worked only in a degraded way (e.g. a batch
// split into several calls), reported once in the JSON.
std::vector<std::string>& Notes() {
  static std::vector<std::string> notes;
  return notes;
}

// Calls per cudaMemcpyBatchAsync, 0 = all in one; lowered if one call of
// everything is refused.
size_t g_batch_limit = 0;

absl::Status BatchCopy(Transfer& t, size_t begin, size_t n, cudaStream_t s) {
  cudaMemcpyAttributes attr{};
  attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
  size_t attr_index = 0;
  return Cuda(
      cudaMemcpyBatchAsync(t.dst.data() + begin, t.src.data() + begin,
                           t.size.data() + begin, n, &attr, &attr_index, 1, s),
      "cudaMemcpyBatchAsync");
}

absl::Status Enqueue(Transfer& t, cudaStream_t s) {
  switch (t.method) {
    case Method::kContiguous: {
      const uint64_t gpu = t.pool + t.contiguous_offset;
      const uint64_t host = t.arena_dev + t.contiguous_offset;
      void* dst = reinterpret_cast<void*>(t.dir == Dir::kEvict ? host : gpu);
      const void* src =
          reinterpret_cast<const void*>(t.dir == Dir::kEvict ? gpu : host);
      return Cuda(cudaMemcpyAsync(dst, src, t.bytes, cudaMemcpyDefault, s),
                  "cudaMemcpyAsync (contiguous)");
    }
    case Method::kLoop:
      for (size_t k = 0; k < t.dst.size(); ++k) {
        const cudaError_t err = cudaMemcpyAsync(t.dst[k], t.src[k], t.size[k],
                                                cudaMemcpyDefault, s);
        if (err != cudaSuccess) return Cuda(err, "cudaMemcpyAsync (loop)");
      }
      return absl::OkStatus();
    case Method::kBatch: {
      const size_t total = t.dst.size();
      if (g_batch_limit == 0) {
        absl::Status st = BatchCopy(t, 0, total, s);
        if (st.ok() || total <= 1024) return st;
        // Refused as a whole (a count limit?): retry in pieces, once noted.
        g_batch_limit = 8192;
        Notes().push_back(absl::StrCat("memcpy_batch: one call of ", total,
                                       " copies failed (", st.message(),
                                       "); batches are split into calls of <= ",
                                       g_batch_limit, " copies from here on"));
      }
      for (size_t i = 0; i < total; i += g_batch_limit) {
        BENCH_RETURN_IF_ERROR(
            BatchCopy(t, i, std::min(g_batch_limit, total - i), s));
      }
      return absl::OkStatus();
    }
    case Method::kKvtier:
    case Method::kKvtierDirect: {
      if (t.b->def->snapshot()) {
        for (size_t i = 0; i < t.items.gpu.size(); ++i) {
          BENCH_RETURN_IF_ERROR(
              t.dir == Dir::kEvict
                  ? t.engine->SaveSnapshot(t.items.gpu[i], t.items.rows[i], s)
                  : t.engine->RestoreSnapshot(t.items.gpu[i], t.items.rows[i],
                                              s));
        }
        return absl::OkStatus();
      }
      return t.dir == Dir::kEvict
                 ? t.engine->Evict(t.items.gpu, t.items.rows, s)
                 : t.engine->Rehydrate(t.items.gpu, t.items.rows, s);
    }
  }
  return absl::InternalError("unknown method");
}

// ---------------------------------------------------------------------------
// Timing.

struct Policy {
  int repeats = 100;
  int min_repeats = 5;
  double max_seconds = 1.5;
};

struct Stats {
  int repeats = 0;
  double ms_p50 = 0, ms_p99 = 0, ms_mean = 0, ms_min = 0;
};

Stats Summarize(std::vector<double> ms) {
  Stats s;
  if (ms.empty()) return s;
  std::sort(ms.begin(), ms.end());
  s.repeats = static_cast<int>(ms.size());
  s.ms_p50 = ms[(ms.size() - 1) / 2];
  const size_t p99 = (ms.size() * 99 + 99) / 100;  // ceil(0.99 n)
  s.ms_p99 = ms[std::min(ms.size(), std::max<size_t>(p99, 1)) - 1];
  s.ms_min = ms.front();
  double sum = 0;
  for (double v : ms) sum += v;
  s.ms_mean = sum / ms.size();
  return s;
}

double Gbps(uint64_t bytes, double ms) {
  return ms > 0 ? static_cast<double>(bytes) / 1e9 / (ms / 1e3) : 0;
}

struct Events {
  cudaEvent_t start = nullptr, stop = nullptr, stop2 = nullptr;
  absl::Status Create() {
    BENCH_RETURN_IF_ERROR(Cuda(cudaEventCreate(&start), "cudaEventCreate"));
    BENCH_RETURN_IF_ERROR(Cuda(cudaEventCreate(&stop), "cudaEventCreate"));
    return Cuda(cudaEventCreate(&stop2), "cudaEventCreate");
  }
};

// Runs prepare() then, timed with events on `s`, enqueue(): one warm-up and
// then repeats under `p`. Returns the times in ms.
absl::StatusOr<std::vector<double>> TimeRepeats(
    const std::function<absl::Status()>& prepare,
    const std::function<absl::Status(cudaStream_t)>& enqueue, cudaStream_t s,
    const Events& ev, const Policy& p) {
  std::vector<double> ms;
  Clock::time_point first;
  for (int i = -1; i < p.repeats; ++i) {
    if (i == 0) first = Clock::now();
    BENCH_RETURN_IF_ERROR(prepare());
    BENCH_RETURN_IF_ERROR(Cuda(cudaEventRecord(ev.start, s), "record"));
    BENCH_RETURN_IF_ERROR(enqueue(s));
    BENCH_RETURN_IF_ERROR(Cuda(cudaEventRecord(ev.stop, s), "record"));
    BENCH_RETURN_IF_ERROR(Cuda(cudaEventSynchronize(ev.stop), "transfer"));
    float t = 0;
    BENCH_RETURN_IF_ERROR(
        Cuda(cudaEventElapsedTime(&t, ev.start, ev.stop), "elapsed"));
    if (i < 0) continue;
    ms.push_back(t);
    const double spent =
        std::chrono::duration<double>(Clock::now() - first).count();
    if (static_cast<int>(ms.size()) >= p.min_repeats && p.max_seconds > 0 &&
        spent > p.max_seconds) {
      break;
    }
  }
  return ms;
}

// ---------------------------------------------------------------------------
// Results.

struct Record {
  std::string method;
  const LayoutDef* layout = nullptr;
  uint32_t prefix_tokens = 0;  // 0 for snapshots
  uint64_t items = 0;          // pages or snapshots (per direction)
  std::string direction;       // evict, rehydrate, both
  uint64_t bytes = 0;          // payload (both directions for "both")
  uint32_t ctas = 0;           // 0: copy engines only
  uint32_t sms = 0;
  bool default_grid = false;
  Stats st;
  // "both": each direction's own GB/s (its bytes over its own p50).
  double evict_gbps_p50 = 0, rehydrate_gbps_p50 = 0;
};

std::string RecordJson(const Record& r, double pct_of_contiguous) {
  std::string s = absl::StrFormat(
      "{\"method\": \"%s\", \"layout\": \"%s\", \"layout_name\": \"%s\", "
      "\"prefix_tokens\": %d, \"items\": %d, \"direction\": \"%s\", "
      "\"bytes\": %d, \"chunk_bytes\": %d, \"side_chunk_bytes\": %d, "
      "\"ctas\": %d, \"sms\": %d, \"default_grid\": %s, \"repeats\": %d, "
      "\"ms_p50\": %.4f, \"ms_p99\": %.4f, \"ms_mean\": %.4f, "
      "\"gbps_p50\": %.3f, \"gbps_p99\": %.3f, \"gbps_mean\": %.3f, "
      "\"gbps_max\": %.3f",
      r.method, r.layout->key, r.layout->name, r.prefix_tokens, r.items,
      r.direction, r.bytes, r.layout->chunk_bytes, r.layout->side_chunk_bytes,
      r.ctas, r.sms, r.default_grid ? "true" : "false", r.st.repeats,
      r.st.ms_p50, r.st.ms_p99, r.st.ms_mean, Gbps(r.bytes, r.st.ms_p50),
      Gbps(r.bytes, r.st.ms_p99), Gbps(r.bytes, r.st.ms_mean),
      Gbps(r.bytes, r.st.ms_min));
  if (pct_of_contiguous > 0) {
    absl::StrAppendFormat(&s, ", \"pct_of_contiguous_p50\": %.1f",
                          pct_of_contiguous);
  }
  if (r.direction == "both") {
    absl::StrAppendFormat(
        &s, ", \"evict_gbps_p50\": %.3f, \"rehydrate_gbps_p50\": %.3f",
        r.evict_gbps_p50, r.rehydrate_gbps_p50);
  }
  return s + "}";
}

void Report(const Record& r) {
  Progress(
      "%-5s %-15s %6u %-9s %-12s ctas=%-3u %8.2f GB/s p50 %8.2f p99 "
      "(%d reps)",
      r.layout->key, r.layout->name, r.prefix_tokens, r.direction, r.method,
      r.ctas, Gbps(r.bytes, r.st.ms_p50), Gbps(r.bytes, r.st.ms_p99),
      r.st.repeats);
}

// ---------------------------------------------------------------------------
// cuBLAS, loaded at run time.

struct Cublas {
  using CreateFn = cublasStatus_t (*)(cublasHandle_t*);
  using DestroyFn = cublasStatus_t (*)(cublasHandle_t);
  using SetStreamFn = cublasStatus_t (*)(cublasHandle_t, cudaStream_t);
  using GemmExFn = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t,
                                      cublasOperation_t, int, int, int,
                                      const void*, const void*, cudaDataType,
                                      int, const void*, cudaDataType, int,
                                      const void*, void*, cudaDataType, int,
                                      cublasComputeType_t, cublasGemmAlgo_t);
  std::string path;
  CreateFn create = nullptr;
  DestroyFn destroy = nullptr;
  SetStreamFn set_stream = nullptr;
  GemmExFn gemm = nullptr;
};

absl::StatusOr<Cublas> LoadCublas(const std::string& override_path) {
  std::vector<std::string> candidates;
  if (!override_path.empty()) {
    candidates.push_back(override_path);
  } else {
    candidates = {
        "libcublas.so.13",
        "/usr/local/cuda/lib64/libcublas.so.13",
        "/usr/local/cuda/targets/x86_64-linux/lib/libcublas.so.13",
        "libcublas.so.12",
        "/usr/local/cuda/lib64/libcublas.so.12",
        "libcublas.so",
    };
    // pip's nvidia-cublas wheels (e.g. beside PyTorch).
    for (const char* root :
         {"/opt/torch/.venv/lib", "/usr/local/lib", "/usr/lib"}) {
      for (const char* py :
           {"python3.10", "python3.11", "python3.12", "python3.13"}) {
        for (const char* sub : {"site-packages", "dist-packages"}) {
          for (const char* rel : {"nvidia/cu13/lib/libcublas.so.13",
                                  "nvidia/cublas/lib/libcublas.so.13",
                                  "nvidia/cublas/lib/libcublas.so.12"}) {
            candidates.push_back(
                absl::StrCat(root, "/", py, "/", sub, "/", rel));
          }
        }
      }
    }
  }
  std::string tried;
  for (const std::string& c : candidates) {
    void* lib = dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      if (tried.size() < 600) absl::StrAppend(&tried, " ", c);
      continue;
    }
    Cublas cb;
    cb.path = c;
    cb.create =
        reinterpret_cast<Cublas::CreateFn>(dlsym(lib, "cublasCreate_v2"));
    cb.destroy =
        reinterpret_cast<Cublas::DestroyFn>(dlsym(lib, "cublasDestroy_v2"));
    cb.set_stream =
        reinterpret_cast<Cublas::SetStreamFn>(dlsym(lib, "cublasSetStream_v2"));
    cb.gemm = reinterpret_cast<Cublas::GemmExFn>(dlsym(lib, "cublasGemmEx"));
    if (cb.create && cb.destroy && cb.set_stream && cb.gemm) return cb;
    dlclose(lib);
    absl::StrAppend(&tried, " ", c, "(symbols missing)");
  }
  return absl::NotFoundError(absl::StrCat("no usable libcublas; tried", tried));
}

// ---------------------------------------------------------------------------
// Machine description.

std::string ReadFirstLine(const std::string& path) {
  std::ifstream f(path);
  std::string line;
  std::getline(f, line);
  return std::string(absl::StripAsciiWhitespace(line));
}

// The kernel module's version from /proc/driver/nvidia/version, whose first
// line reads "NVRM version: NVIDIA UNIX [Open ]Kernel Module [for x86_64]
// 580.159.04  Release Build ...": the first word after "Module" that starts
// with a digit.
std::string DriverVersion() {
  const std::string line = ReadFirstLine("/proc/driver/nvidia/version");
  const size_t at = line.find("Module");
  if (at == std::string::npos) return "unknown";
  for (absl::string_view w :
       absl::StrSplit(line.substr(at), ' ', absl::SkipEmpty())) {
    if (absl::ascii_isdigit(w[0]) && w.find('.') != absl::string_view::npos) {
      return std::string(w);
    }
  }
  return "unknown";
}

std::string MachineJson(const cudaDeviceProp& prop) {
  int driver_api = 0, runtime = 0;
  cudaDriverGetVersion(&driver_api);
  cudaRuntimeGetVersion(&runtime);
  const std::string driver = DriverVersion();
  const std::string bus = absl::StrFormat("%04x:%02x:%02x.0", prop.pciDomainID,
                                          prop.pciBusID, prop.pciDeviceID);
  const std::string sys = "/sys/bus/pci/devices/" + bus + "/";
  const std::string link =
      absl::StrCat(ReadFirstLine(sys + "current_link_speed"), " x",
                   ReadFirstLine(sys + "current_link_width"));
  const std::string numa = ReadFirstLine(sys + "numa_node");
  utsname u{};
  uname(&u);
  std::string cpu = "unknown";
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.rfind("model name", 0) == 0) {
      cpu = std::string(
          absl::StripAsciiWhitespace(line.substr(line.find(':') + 1)));
      break;
    }
  }
  return absl::StrFormat(
      "{\"gpu\": %s, \"sms\": %d, \"gpu_memory_gib\": %.1f, \"driver\": %s, "
      "\"cuda_driver_api\": %d, \"cuda_runtime\": %d, \"pci_bus\": %s, "
      "\"pcie_link\": %s, \"gpu_numa_node\": %s, \"host\": %s, \"cpu\": %s, "
      "\"cpus\": %d, \"kernel\": %s, \"async_engines\": %d}",
      JsonString(prop.name), prop.multiProcessorCount,
      static_cast<double>(prop.totalGlobalMem) / kGiB, JsonString(driver),
      driver_api, runtime, JsonString(bus), JsonString(link), JsonString(numa),
      JsonString(u.nodename), JsonString(cpu),
      std::thread::hardware_concurrency(), JsonString(u.release),
      prop.asyncEngineCount);
}

// ---------------------------------------------------------------------------
// The benchmark.

class Bench {
 public:
  absl::Status Setup();
  void Run();
  std::string Json() const;

 private:
  // Engine for `b` with `options`, created on first use.
  absl::StatusOr<TransferEngine*> Engine(
      const Bound& b, const client::TransferOptions& options);
  // The configurations of the selected methods: each baseline once, kvtier
  // and kvtier_direct at their default grids, and with `sweep` every swept
  // grid and variant as well.
  std::vector<Config> Configs(bool sweep) const;
  // Prepares `t` (method, dir, b set) with fresh random items.
  void Fresh(Transfer* t, size_t n);
  absl::Status MeasureOne(const Bound& b, const Config& c, Dir dir,
                          uint32_t prefix_tokens, size_t n);
  absl::Status MeasureBoth(const Bound& b, const Config& c,
                           uint32_t prefix_tokens, size_t n);
  std::string Verify(const Bound& b);
  absl::Status Gemm();
  absl::Status FillPool();
  void Fail(const absl::Status& st, absl::string_view where);
  // True once the context is unusable or --deadline_s has passed (noted in
  // the JSON once): no further measurement starts.
  bool Stop();
  size_t ItemsFor(const Bound& b, uint32_t prefix_tokens) const {
    return b.def->snapshot() ? snapshots_
                             : prefix_tokens / b.def->tokens_per_page;
  }

  // Configuration, fixed after Setup.
  Policy policy_;
  std::vector<uint32_t> prefixes_;
  std::vector<std::string> layout_keys_, methods_;
  std::vector<uint32_t> ctas_;          // kvtier_direct sweep
  std::vector<uint32_t> staging_ctas_;  // kvtier (staged) sweep
  std::vector<Config> variants_;
  uint32_t sweep_prefix_ = 8192;
  uint32_t snapshots_ = 8;
  bool quick_ = false;
  int gemm_n_ = 8192, gemm_iters_ = 200;

  cudaDeviceProp prop_{};
  std::string date_;
  uint64_t pool_bytes_ = 0;
  uint8_t* pool_ = nullptr;
  uint64_t arena_bytes_ = 0;
  uint8_t* arena_ = nullptr;
  uint64_t arena_dev_ = 0;
  cudaStream_t stream_ = nullptr, stream2_ = nullptr, gemm_stream_ = nullptr;
  Events ev_;
  std::vector<LayoutDef> defs_;
  std::vector<Bound> bounds_;
  std::vector<std::pair<std::string, std::unique_ptr<TransferEngine>>> engines_;
  std::mt19937_64 rng_;
  std::vector<std::unique_ptr<Picker>> gpu_pickers_, row_pickers_;

  // Results.
  std::vector<Record> records_;
  std::vector<std::string> verify_;  // JSON members
  std::string gemm_json_ = "null";
  std::vector<std::string> errors_;
  std::vector<std::pair<std::string, double>> sections_;
  bool dead_ = false;         // the CUDA context is unusable
  bool out_of_time_ = false;  // --deadline_s passed
};

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
  gemm_iters_ = absl::GetFlag(FLAGS_gemm_iters);
  quick_ = absl::GetFlag(FLAGS_quick);
  if (quick_) {
    prefixes_ = {sweep_prefix_};
    policy_.repeats = std::min(policy_.repeats, 30);
    policy_.max_seconds =
        policy_.max_seconds > 0 ? std::min(policy_.max_seconds, 0.4) : 0.4;
    gemm_iters_ = std::min(gemm_iters_, 100);
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
  date_ =
      absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::Now(), absl::UTCTimeZone());

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
  BENCH_RETURN_IF_ERROR(ev_.Create());

  // Layouts and the host memory they need.
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

  Progress("GPU %s, %d SMs; pool %.1f GiB, host arena %.2f GiB", prop_.name,
           prop_.multiProcessorCount, double(pool_bytes_) / kGiB,
           double(arena_bytes_) / kGiB);
  void* pool = nullptr;
  BENCH_RETURN_IF_ERROR(Cuda(cudaMalloc(&pool, pool_bytes_),
                             absl::StrCat("cudaMalloc ", pool_bytes_)));
  pool_ = static_cast<uint8_t*>(pool);
  // Shared anonymous memory: shmem pages, like a /dev/shm bank.
  void* arena = mmap(nullptr, arena_bytes_, PROT_READ | PROT_WRITE,
                     MAP_SHARED | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (arena == MAP_FAILED) {
    return absl::ErrnoToStatus(errno, absl::StrCat("mmap ", arena_bytes_));
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
  BENCH_RETURN_IF_ERROR(FillPool());

  for (size_t i = 0; i < defs_.size(); ++i) {
    absl::StatusOr<Bound> b =
        Bind(defs_[i], reinterpret_cast<uint64_t>(pool_), pool_bytes_, arena_,
             arena_dev_, arena_bytes_, rows[i]);
    if (!b.ok()) return b.status();
    bounds_.push_back(*std::move(b));
  }
  for (Bound& b : bounds_) {
    gpu_pickers_.push_back(std::make_unique<Picker>(b.gpu_items, rng_()));
    row_pickers_.push_back(std::make_unique<Picker>(b.host_rows, rng_()));
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

absl::StatusOr<TransferEngine*> Bench::Engine(
    const Bound& b, const client::TransferOptions& options) {
  const std::string key = absl::StrCat(b.def->key, "/", OptionsKey(options));
  for (auto& [k, e] : engines_) {
    if (k == key) return e.get();
  }
  absl::StatusOr<std::unique_ptr<TransferEngine>> e = TransferEngine::Create(
      client::Backend::kCuda, b.pool, b.banks, b.snapshot_bank, options);
  if (!e.ok()) return e.status();
  if ((*e)->path() != options.path) {
    return absl::InternalError(
        absl::StrCat("engine took path ", static_cast<int>((*e)->path()),
                     ", asked for ", static_cast<int>(options.path)));
  }
  engines_.emplace_back(key, *std::move(e));
  return engines_.back().second.get();
}

std::vector<Config> Bench::Configs(bool sweep) const {
  std::vector<Config> out;
  for (Method m : {Method::kContiguous, Method::kLoop, Method::kBatch}) {
    if (Contains(methods_, MethodName(m))) out.push_back(Baseline(m));
  }
  if (Contains(methods_, MethodName(Method::kKvtier))) {
    if (sweep) {
      for (uint32_t c : staging_ctas_) out.push_back(Staged(c));
      for (const Config& v : variants_) out.push_back(v);
    } else {
      out.push_back(Staged(client::kDefaultStagingCtas));
    }
  }
  if (Contains(methods_, MethodName(Method::kKvtierDirect))) {
    if (sweep) {
      for (uint32_t c : ctas_) out.push_back(Direct(c));
    } else {
      out.push_back(Direct(kernels::kDefaultMaxCtas));
    }
  }
  return out;
}

size_t IndexOf(const std::vector<Bound>& v, const Bound& b) {
  return static_cast<size_t>(&b - v.data());
}

void Bench::Fresh(Transfer* t, size_t n) {
  const size_t i = IndexOf(bounds_, *t->b);
  std::vector<Items> sets(1);
  PickItems(*gpu_pickers_[i], *row_pickers_[i], n, &sets);
  t->items = std::move(sets[0]);
  BuildChunks(t);
}

absl::Status Bench::MeasureOne(const Bound& b, const Config& c, Dir dir,
                               uint32_t prefix_tokens, size_t n) {
  Transfer t;
  t.b = &b;
  t.dir = dir;
  t.method = c.method;
  t.pool = reinterpret_cast<uint64_t>(pool_);
  t.arena_dev = arena_dev_;
  if (IsKvtier(c.method)) {
    absl::StatusOr<TransferEngine*> e = Engine(b, c.options);
    if (!e.ok()) return e.status();
    t.engine = *e;
  }
  absl::StatusOr<std::vector<double>> ms = TimeRepeats(
      [&] {
        Fresh(&t, n);
        return absl::OkStatus();
      },
      [&](cudaStream_t s) { return Enqueue(t, s); }, stream_, ev_, policy_);
  if (!ms.ok()) return ms.status();
  Record r;
  r.method = c.Name();
  r.layout = b.def;
  r.prefix_tokens = prefix_tokens;
  r.items = n;
  r.direction = DirName(dir);
  r.bytes = n * b.item_bytes;
  r.ctas = c.ctas;
  r.sms = r.ctas;
  r.default_grid = c.default_grid;
  r.st = Summarize(*std::move(ms));
  Report(r);
  records_.push_back(r);
  return absl::OkStatus();
}

// Evicts n items on stream_ while rehydrating n other items (other GPU
// pages, other rows) on stream2_, both released by one event.
absl::Status Bench::MeasureBoth(const Bound& b, const Config& c,
                                uint32_t prefix_tokens, size_t n) {
  Transfer out, in;
  for (Transfer* t : {&out, &in}) {
    t->b = &b;
    t->method = c.method;
    t->pool = reinterpret_cast<uint64_t>(pool_);
    t->arena_dev = arena_dev_;
  }
  out.dir = Dir::kEvict;
  in.dir = Dir::kRehydrate;
  in.contiguous_offset = n * b.item_bytes;
  if (IsKvtier(c.method)) {
    absl::StatusOr<TransferEngine*> e = Engine(b, c.options);
    if (!e.ok()) return e.status();
    out.engine = in.engine = *e;
  }
  const size_t bi = IndexOf(bounds_, b);
  std::vector<double> both, t_out, t_in;
  Clock::time_point first;
  for (int i = -1; i < policy_.repeats; ++i) {
    if (i == 0) first = Clock::now();
    std::vector<Items> sets(2);
    PickItems(*gpu_pickers_[bi], *row_pickers_[bi], n, &sets);
    out.items = std::move(sets[0]);
    in.items = std::move(sets[1]);
    BuildChunks(&out);
    BuildChunks(&in);
    BENCH_RETURN_IF_ERROR(Cuda(cudaEventRecord(ev_.start, stream_), "record"));
    BENCH_RETURN_IF_ERROR(
        Cuda(cudaStreamWaitEvent(stream2_, ev_.start, 0), "wait"));
    BENCH_RETURN_IF_ERROR(Enqueue(out, stream_));
    BENCH_RETURN_IF_ERROR(Enqueue(in, stream2_));
    BENCH_RETURN_IF_ERROR(Cuda(cudaEventRecord(ev_.stop, stream_), "record"));
    BENCH_RETURN_IF_ERROR(Cuda(cudaEventRecord(ev_.stop2, stream2_), "record"));
    BENCH_RETURN_IF_ERROR(Cuda(cudaEventSynchronize(ev_.stop), "evict"));
    BENCH_RETURN_IF_ERROR(Cuda(cudaEventSynchronize(ev_.stop2), "rehydrate"));
    float a = 0, c = 0;
    BENCH_RETURN_IF_ERROR(
        Cuda(cudaEventElapsedTime(&a, ev_.start, ev_.stop), "elapsed"));
    BENCH_RETURN_IF_ERROR(
        Cuda(cudaEventElapsedTime(&c, ev_.start, ev_.stop2), "elapsed"));
    if (i < 0) continue;
    t_out.push_back(a);
    t_in.push_back(c);
    both.push_back(std::max(a, c));
    const double spent =
        std::chrono::duration<double>(Clock::now() - first).count();
    if (static_cast<int>(both.size()) >= policy_.min_repeats &&
        policy_.max_seconds > 0 && spent > policy_.max_seconds) {
      break;
    }
  }
  Record r;
  r.method = c.Name();
  r.layout = b.def;
  r.prefix_tokens = prefix_tokens;
  r.items = n;
  r.direction = "both";
  r.bytes = 2 * n * b.item_bytes;
  r.ctas = c.ctas;
  r.sms = 2 * r.ctas;  // one grid per direction
  r.default_grid = c.default_grid;
  r.st = Summarize(both);
  r.evict_gbps_p50 = Gbps(n * b.item_bytes, Summarize(t_out).ms_p50);
  r.rehydrate_gbps_p50 = Gbps(n * b.item_bytes, Summarize(t_in).ms_p50);
  Report(r);
  records_.push_back(r);
  return absl::OkStatus();
}

// Moves the same few items with the loop, the batch and each kvtier
// configuration (staged, direct, every variant) into different rows
// (pre-filled with different bytes) and compares the rows; then rehydrates
// with each kvtier configuration and evicts the result again with the loop.
std::string Bench::Verify(const Bound& b) {
  const size_t n =
      b.def->snapshot() ? std::min<size_t>(4, b.host_rows / 3) : 32;
  const size_t bi = IndexOf(bounds_, b);
  std::vector<Items> sets(3);
  PickItems(*gpu_pickers_[bi], *row_pickers_[bi], n, &sets);
  std::vector<Config> kvtier = {Staged(client::kDefaultStagingCtas),
                                Direct(kernels::kDefaultMaxCtas)};
  for (const Config& v : variants_) kvtier.push_back(v);
  auto fill_rows = [&](const std::vector<uint32_t>& rows, uint8_t v) {
    for (size_t k = 0; k < b.bank_host.size(); ++k) {
      for (uint32_t r : rows) {
        std::memset(b.bank_host[k] + r * b.bank_stride[k], v,
                    b.bank_row_bytes[k]);
      }
    }
  };
  auto compare = [&](const std::vector<uint32_t>& x,
                     const std::vector<uint32_t>& y) -> std::string {
    for (size_t k = 0; k < b.bank_host.size(); ++k) {
      for (size_t i = 0; i < x.size(); ++i) {
        const uint8_t* p = b.bank_host[k] + x[i] * b.bank_stride[k];
        const uint8_t* q = b.bank_host[k] + y[i] * b.bank_stride[k];
        if (std::memcmp(p, q, b.bank_row_bytes[k]) != 0) {
          size_t off = 0;
          while (p[off] == q[off]) ++off;
          return absl::StrCat("bank ", k, " item ", i, " differs at byte ",
                              off);
        }
      }
    }
    return "";
  };
  auto run = [&](const Config& c, Dir dir, const Items& items) -> absl::Status {
    Transfer t;
    t.b = &b;
    t.dir = dir;
    t.method = c.method;
    if (IsKvtier(c.method)) {
      absl::StatusOr<TransferEngine*> e = Engine(b, c.options);
      if (!e.ok()) return e.status();
      t.engine = *e;
    }
    t.items = items;
    BuildChunks(&t);
    BENCH_RETURN_IF_ERROR(Enqueue(t, stream_));
    return Cuda(cudaStreamSynchronize(stream_), "verify copy");
  };
  // Same GPU items, three row sets.
  Items loop = sets[0], batch = sets[0], kv = sets[0];
  batch.rows = sets[1].rows;
  kv.rows = sets[2].rows;
  fill_rows(loop.rows, 0x11);
  fill_rows(batch.rows, 0x22);
  absl::Status st = run(Baseline(Method::kLoop), Dir::kEvict, loop);
  if (st.ok()) st = run(Baseline(Method::kBatch), Dir::kEvict, batch);
  if (!st.ok()) return st.ToString();
  std::string diff = compare(loop.rows, batch.rows);
  if (!diff.empty()) return "memcpy_batch evict vs memcpy_loop: " + diff;
  for (const Config& c : kvtier) {
    fill_rows(kv.rows, 0x33);
    st = run(c, Dir::kEvict, kv);
    if (!st.ok()) return c.Name() + ": " + st.ToString();
    diff = compare(loop.rows, kv.rows);
    if (!diff.empty()) return c.Name() + " evict vs memcpy_loop: " + diff;
    // kvtier rehydrates loop.rows into other GPU items; the loop evicts
    // them into batch.rows; those must equal loop.rows.
    Items back;
    back.gpu = sets[1].gpu;
    back.rows = loop.rows;
    st = run(c, Dir::kRehydrate, back);
    fill_rows(batch.rows, 0x44);
    back.rows = batch.rows;
    if (st.ok()) st = run(Baseline(Method::kLoop), Dir::kEvict, back);
    if (!st.ok()) return c.Name() + ": " + st.ToString();
    diff = compare(loop.rows, batch.rows);
    if (!diff.empty()) return c.Name() + " rehydrate round trip: " + diff;
  }
  return "ok";
}

absl::Status Bench::Gemm() {
  const std::string layout_key = absl::GetFlag(FLAGS_gemm_layout);
  const Bound* b = nullptr;
  for (const Bound& x : bounds_) {
    if (x.def->key == layout_key) b = &x;
  }
  if (b == nullptr) {
    gemm_json_ =
        absl::StrFormat("{\"skipped\": %s}",
                        JsonString("layout " + layout_key + " not selected"));
    return absl::OkStatus();
  }
  absl::StatusOr<Cublas> cb = LoadCublas(absl::GetFlag(FLAGS_cublas_lib));
  if (!cb.ok()) {
    gemm_json_ = absl::StrFormat("{\"skipped\": %s}",
                                 JsonString(cb.status().ToString()));
    Progress("GEMM skipped: %s", cb.status().ToString());
    return absl::OkStatus();
  }
  const int n = gemm_n_;
  const uint64_t elems = static_cast<uint64_t>(n) * n;
  const uint64_t bytes = elems * 2;
  if (bytes > arena_bytes_) {
    return absl::InvalidArgumentError("GEMM operands exceed the staging arena");
  }
  void *a = nullptr, *bm = nullptr, *c = nullptr;
  BENCH_RETURN_IF_ERROR(Cuda(cudaMalloc(&a, bytes), "cudaMalloc A"));
  BENCH_RETURN_IF_ERROR(Cuda(cudaMalloc(&bm, bytes), "cudaMalloc B"));
  BENCH_RETURN_IF_ERROR(Cuda(cudaMalloc(&c, bytes), "cudaMalloc C"));
  // Random bf16 in [-1, 1): the top half of a float's bits.
  {
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    auto* staging = reinterpret_cast<uint16_t*>(arena_);
    for (void* m : {a, bm}) {
      for (uint64_t i = 0; i < elems; ++i) {
        const float f = u(rng);
        uint32_t bits;
        std::memcpy(&bits, &f, 4);
        staging[i] = static_cast<uint16_t>(bits >> 16);
      }
      BENCH_RETURN_IF_ERROR(
          Cuda(cudaMemcpy(m, staging, bytes, cudaMemcpyHostToDevice), "fill"));
    }
    BENCH_RETURN_IF_ERROR(Cuda(cudaMemset(c, 0, bytes), "memset C"));
  }
  cublasHandle_t handle = nullptr;
  if (cb->create(&handle) != CUBLAS_STATUS_SUCCESS) {
    return absl::InternalError("cublasCreate failed");
  }
  cb->set_stream(handle, gemm_stream_);
  const float alpha = 1.f, beta = 0.f;
  auto gemm = [&]() -> absl::Status {
    const cublasStatus_t s =
        cb->gemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, a,
                 CUDA_R_16BF, n, bm, CUDA_R_16BF, n, &beta, c, CUDA_R_16BF, n,
                 CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (s != CUBLAS_STATUS_SUCCESS) {
      return absl::InternalError(
          absl::StrCat("cublasGemmEx: status ", static_cast<int>(s)));
    }
    return absl::OkStatus();
  };
  cudaEvent_t g0, g1;
  BENCH_RETURN_IF_ERROR(Cuda(cudaEventCreate(&g0), "event"));
  BENCH_RETURN_IF_ERROR(Cuda(cudaEventCreate(&g1), "event"));
  // ms per GEMM over one window of gemm_iters_ GEMMs.
  auto window = [&]() -> absl::StatusOr<double> {
    BENCH_RETURN_IF_ERROR(Cuda(cudaEventRecord(g0, gemm_stream_), "record"));
    for (int i = 0; i < gemm_iters_; ++i) BENCH_RETURN_IF_ERROR(gemm());
    BENCH_RETURN_IF_ERROR(Cuda(cudaEventRecord(g1, gemm_stream_), "record"));
    BENCH_RETURN_IF_ERROR(Cuda(cudaEventSynchronize(g1), "gemm"));
    float ms = 0;
    BENCH_RETURN_IF_ERROR(Cuda(cudaEventElapsedTime(&ms, g0, g1), "elapsed"));
    return ms / gemm_iters_;
  };
  for (int i = 0; i < 20; ++i) BENCH_RETURN_IF_ERROR(gemm());
  BENCH_RETURN_IF_ERROR(Cuda(cudaStreamSynchronize(gemm_stream_), "warm-up"));
  absl::StatusOr<double> base = window();
  if (!base.ok()) return base.status();
  Progress("GEMM %d^3 bf16 alone: %.3f ms (%.0f TFLOP/s), cuBLAS %s", n, *base,
           2.0 * n * n * n / (*base / 1e3) / 1e12, cb->path);

  const size_t items = ItemsFor(*b, sweep_prefix_);
  std::vector<std::string> runs;
  const std::vector<Config> configs = Configs(/*sweep=*/true);
  for (Dir dir : {Dir::kEvict, Dir::kRehydrate}) {
    for (const Config& cfg : configs) {
      if (Stop()) break;
      absl::StatusOr<double> alone = window();
      if (!alone.ok()) return alone.status();
      TransferEngine* engine = nullptr;
      if (IsKvtier(cfg.method)) {
        absl::StatusOr<TransferEngine*> e = Engine(*b, cfg.options);
        if (!e.ok()) return e.status();
        engine = *e;
      }
      // The background transfer: two in flight at all times until stopped.
      std::atomic<bool> stop{false};
      std::atomic<int> enqueued{0};
      absl::Status bg_status;
      double bg_ms = 0;
      uint64_t bg_bytes = 0;
      Picker gpu_pick(b->gpu_items, rng_()), row_pick(b->host_rows, rng_());
      std::thread bg([&] {
        cudaSetDevice(0);
        cudaEvent_t first, last, done[2];
        cudaEventCreate(&first);
        cudaEventCreate(&last);
        for (cudaEvent_t& e : done) {
          cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
        }
        Transfer t;
        t.b = b;
        t.dir = dir;
        t.method = cfg.method;
        t.engine = engine;
        t.pool = reinterpret_cast<uint64_t>(pool_);
        t.arena_dev = arena_dev_;
        cudaEventRecord(first, stream_);
        int i = 0;
        for (; !stop.load(); ++i) {
          if (i >= 2) cudaEventSynchronize(done[i % 2]);
          std::vector<Items> sets(1);
          PickItems(gpu_pick, row_pick, items, &sets);
          t.items = std::move(sets[0]);
          BuildChunks(&t);
          absl::Status st = Enqueue(t, stream_);
          if (!st.ok()) {
            bg_status = st;
            break;
          }
          cudaEventRecord(done[i % 2], stream_);
          enqueued.store(i + 1);
        }
        cudaEventRecord(last, stream_);
        cudaEventSynchronize(last);
        float ms = 0;
        cudaEventElapsedTime(&ms, first, last);
        bg_ms = ms;
        bg_bytes = static_cast<uint64_t>(i) * items * b->item_bytes;
        cudaEventDestroy(first);
        cudaEventDestroy(last);
        for (cudaEvent_t& e : done) cudaEventDestroy(e);
        enqueued.store(1 << 30);  // never leave the main thread waiting
      });
      while (enqueued.load() < 2) std::this_thread::yield();
      absl::StatusOr<double> with = window();
      stop.store(true);
      bg.join();
      if (!with.ok()) return with.status();
      if (!bg_status.ok()) return bg_status;
      // The GEMM's own time drifts by a few percent between windows: the
      // baseline is the mean of the windows just before and just after.
      absl::StatusOr<double> after = window();
      if (!after.ok()) return after.status();
      const double base_ms = (*alone + *after) / 2;
      const double slowdown = (*with / base_ms - 1) * 100;
      const double gbps = Gbps(bg_bytes, bg_ms);
      Progress(
          "GEMM beside %-9s %-12s ctas=%-3u: %.3f -> %.3f ms (%+.1f%%), "
          "transfer %.1f GB/s",
          DirName(dir), cfg.Name(), cfg.ctas, base_ms, *with, slowdown, gbps);
      runs.push_back(absl::StrFormat(
          "{\"method\": \"%s\", \"direction\": \"%s\", \"layout\": \"%s\", "
          "\"prefix_tokens\": %d, \"ctas\": %d, \"sms\": %d, "
          "\"default_grid\": %s, "
          "\"gemm_ms_alone\": %.4f, \"gemm_ms_alone_before\": %.4f, "
          "\"gemm_ms_alone_after\": %.4f, \"gemm_ms_with\": %.4f, "
          "\"slowdown_pct\": %.2f, \"transfer_gbps\": %.3f}",
          cfg.Name(), DirName(dir), b->def->key, sweep_prefix_, cfg.ctas,
          cfg.ctas, cfg.default_grid ? "true" : "false", base_ms, *alone,
          *after, *with, slowdown, gbps));
    }
  }
  cb->destroy(handle);
  cudaEventDestroy(g0);
  cudaEventDestroy(g1);
  cudaFree(a);
  cudaFree(bm);
  cudaFree(c);
  gemm_json_ = absl::StrFormat(
      "{\"m\": %d, \"n\": %d, \"k\": %d, \"dtype\": \"bf16\", "
      "\"compute\": \"fp32\", \"gemms_per_window\": %d, \"cublas\": %s, "
      "\"gemm_ms_alone\": %.4f, \"tflops_alone\": %.1f, \"runs\": [\n  %s]}",
      n, n, n, gemm_iters_, JsonString(cb->path), *base,
      2.0 * n * n * n / (*base / 1e3) / 1e12, absl::StrJoin(runs, ",\n  "));
  return absl::OkStatus();
}

void Bench::Run() {
  auto section = [&](const std::string& name, double since) {
    sections_.emplace_back(name, Elapsed() - since);
  };
  double t0 = Elapsed();
  if (absl::GetFlag(FLAGS_verify)) {
    for (const Bound& b : bounds_) {
      const std::string v = Verify(b);
      Progress("verify %s: %s", b.def->key, v);
      verify_.push_back(
          absl::StrCat(JsonString(b.def->key), ": ", JsonString(v)));
    }
  }
  section("verify", t0);

  // Main matrix, then the CTA sweep.
  for (const Bound& b : bounds_) {
    if (Stop()) break;
    t0 = Elapsed();
    std::vector<uint32_t> prefixes = prefixes_;
    if (b.def->snapshot()) prefixes = {0};
    for (uint32_t prefix : prefixes) {
      const size_t n = ItemsFor(b, prefix);
      if (n == 0 || n > b.gpu_items / 2 || n > b.host_rows) continue;
      const bool sweep = b.def->snapshot() || prefix == sweep_prefix_;
      for (Dir dir : {Dir::kEvict, Dir::kRehydrate}) {
        for (const Config& c : Configs(sweep)) {
          if (Stop()) break;
          absl::Status st = MeasureOne(b, c, dir, prefix, n);
          if (!st.ok()) {
            Fail(st, absl::StrCat(b.def->key, " ", prefix, " ", DirName(dir),
                                  " ", c.Name(), " ctas ", c.ctas));
          }
        }
      }
    }
    // If the sweep prefix is not among --prefixes, sweep it on its own.
    if (!b.def->snapshot() && std::find(prefixes.begin(), prefixes.end(),
                                        sweep_prefix_) == prefixes.end()) {
      const size_t n = ItemsFor(b, sweep_prefix_);
      for (Dir dir : {Dir::kEvict, Dir::kRehydrate}) {
        for (const Config& c : Configs(/*sweep=*/true)) {
          if (!IsKvtier(c.method)) continue;
          if (Stop() || n == 0 || n > b.gpu_items / 2) break;
          absl::Status st = MeasureOne(b, c, dir, sweep_prefix_, n);
          if (!st.ok()) Fail(st, absl::StrCat(b.def->key, " sweep"));
        }
      }
    }
    section(absl::StrCat("layout ", b.def->key), t0);
  }

  // Both directions at once.
  t0 = Elapsed();
  if (absl::GetFlag(FLAGS_bidirectional)) {
    const std::vector<std::string> keys =
        SplitList(absl::GetFlag(FLAGS_bidirectional_layouts));
    for (const Bound& b : bounds_) {
      if (Stop() || !Contains(keys, b.def->key) || b.def->snapshot()) continue;
      const size_t n = ItemsFor(b, sweep_prefix_);
      if (n == 0 || 2 * n > b.host_rows || 2 * n > b.gpu_items) continue;
      for (const Config& c : Configs(/*sweep=*/true)) {
        // One host thread cannot feed two per-chunk loops.
        if (c.method == Method::kLoop || Stop()) continue;
        absl::Status st = MeasureBoth(b, c, sweep_prefix_, n);
        if (!st.ok()) {
          Fail(st, absl::StrCat(b.def->key, " both ", c.Name(), " ", c.ctas));
        }
      }
    }
  }
  section("both directions", t0);

  t0 = Elapsed();
  if (absl::GetFlag(FLAGS_gemm) && !Stop()) {
    absl::Status st = Gemm();
    if (!st.ok()) {
      Fail(st, "gemm");
      gemm_json_ =
          absl::StrFormat("{\"error\": %s}", JsonString(st.ToString()));
    }
  }
  section("gemm", t0);
}

std::string Bench::Json() const {
  std::string out = absl::StrFormat(
      "{\"benchmark\": \"transfer_bench\", \"date\": \"%s\",\n"
      " \"machine\": %s,\n",
      date_, MachineJson(prop_));
  absl::StrAppendFormat(
      &out,
      " \"config\": {\"pool_gib\": %.2f, \"arena_gib\": %.2f, \"quick\": %s, "
      "\"repeats\": %d, \"min_repeats\": %d, \"max_config_seconds\": %.2f, "
      "\"prefixes\": [%s], \"sweep_prefix\": %d, \"ctas\": [%s], "
      "\"default_ctas\": %d, \"staging_ctas\": [%s], "
      "\"default_staging_ctas\": %d, \"staging_bytes\": %d, "
      "\"kvtier_variants\": %s, "
      "\"snapshots\": %d, \"slice_pages\": %d, "
      "\"gbps\": \"1e9 bytes/s of payload\", \"host_memory\": "
      "\"MAP_SHARED|MAP_ANONYMOUS, populated, cudaHostRegister "
      "Mapped|Portable\"},\n",
      double(pool_bytes_) / kGiB, double(arena_bytes_) / kGiB,
      quick_ ? "true" : "false", policy_.repeats, policy_.min_repeats,
      policy_.max_seconds, absl::StrJoin(prefixes_, ", "), sweep_prefix_,
      absl::StrJoin(ctas_, ", "), kernels::kDefaultMaxCtas,
      absl::StrJoin(staging_ctas_, ", "), client::kDefaultStagingCtas,
      client::kDefaultStagingBytes,
      JsonString(absl::GetFlag(FLAGS_kvtier_variants)), snapshots_,
      client::kMaxSlicePages);
  std::vector<std::string> layouts;
  for (const Bound& b : bounds_) {
    std::vector<std::string> banks;
    if (b.def->snapshot()) {
      banks.push_back(absl::StrFormat(
          "{\"name\": \"snapshot\", \"row_bytes\": %d, \"segments\": %d}",
          b.item_bytes, b.tensors.size()));
    } else {
      for (size_t k = 0; k < b.banks.size(); ++k) {
        banks.push_back(absl::StrFormat(
            "{\"name\": \"%s\", \"row_bytes\": %d, \"tensors\": %d}",
            b.banks[k].first, b.bank_row_bytes[k],
            b.def->banks[k].tensor_bytes.size()));
      }
    }
    layouts.push_back(absl::StrFormat(
        "{\"key\": \"%s\", \"name\": \"%s\", \"description\": %s, "
        "\"tokens_per_page\": %d, \"item_bytes\": %d, \"chunk_bytes\": %d, "
        "\"side_chunk_bytes\": %d, \"chunks_per_item\": %d, "
        "\"gpu_items\": %d, \"host_rows\": %d, \"banks\": [%s]}",
        b.def->key, b.def->name, JsonString(b.def->description),
        b.def->tokens_per_page, b.item_bytes, b.def->chunk_bytes,
        b.def->side_chunk_bytes, b.tensors.size(), b.gpu_items, b.host_rows,
        absl::StrJoin(banks, ", ")));
  }
  absl::StrAppend(&out, " \"layouts\": [\n  ", absl::StrJoin(layouts, ",\n  "),
                  "],\n");
  absl::StrAppend(&out, " \"verify\": {", absl::StrJoin(verify_, ", "), "},\n");
  std::vector<std::string> ms;
  for (const Record& r : records_) {
    double pct = 0;
    if (r.method != "contiguous") {
      for (const Record& c : records_) {
        if (c.method == "contiguous" && c.layout == r.layout &&
            c.prefix_tokens == r.prefix_tokens && c.direction == r.direction &&
            c.st.ms_p50 > 0) {
          pct = 100.0 * Gbps(r.bytes, r.st.ms_p50) / Gbps(c.bytes, c.st.ms_p50);
        }
      }
    }
    ms.push_back(RecordJson(r, pct));
  }
  absl::StrAppend(&out, " \"measurements\": [\n  ", absl::StrJoin(ms, ",\n  "),
                  "],\n");
  absl::StrAppend(&out,
                  " \"bidirectional_note\": \"memcpy_loop is not run "
                  "both ways: one host thread enqueues both streams\",\n");
  absl::StrAppend(&out, " \"gemm\": ", gemm_json_, ",\n");
  std::vector<std::string> secs;
  for (const auto& [name, s] : sections_) {
    secs.push_back(absl::StrFormat("%s: %.1f", JsonString(name), s));
  }
  std::vector<std::string> notes;
  for (const std::string& n : Notes()) notes.push_back(JsonString(n));
  std::vector<std::string> errs;
  for (const std::string& e : errors_) errs.push_back(JsonString(e));
  absl::StrAppendFormat(
      &out,
      " \"section_seconds\": {%s},\n \"wall_seconds\": %.1f,\n"
      " \"notes\": [%s],\n \"errors\": [%s]}\n",
      absl::StrJoin(secs, ", "), Elapsed(), absl::StrJoin(notes, ", "),
      absl::StrJoin(errs, ", "));
  return out;
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

}  // namespace
}  // namespace kvtier::bench

int main(int argc, char** argv) { return kvtier::bench::Main(argc, argv); }
