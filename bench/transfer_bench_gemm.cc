// transfer_bench's GEMM interference part: cuBLAS, dlopen()ed at run time
// (libcublas.so.13, or --cublas_lib; the GPU-host bundle cannot carry the
// library, so without it the part is skipped with a note), and Bench::Gemm,
// which times a bf16 GEMM loop on its own stream alone and while each
// transfer configuration keeps another stream busy, and records the
// slowdown and the transfer's GB/s under that load.
//
// Thread-safety: Bench::Gemm runs on the main thread and starts one transfer
// thread per configuration, which shares only the TransferEngine
// (thread-safe), atomics and variables the main thread reads after joining
// it.

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "bench/transfer_bench.h"

namespace kvtier::bench {

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
    // pip's nvidia-cublas wheels (e.g. beside PyTorch): the active venv
    // ($VIRTUAL_ENV), then the system's site-packages.
    std::vector<std::string> roots;
    if (const char* venv = std::getenv("VIRTUAL_ENV"); venv && *venv) {
      roots.push_back(absl::StrCat(venv, "/lib"));
    }
    roots.push_back("/usr/local/lib");
    roots.push_back("/usr/lib");
    for (const std::string& root : roots) {
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

}  // namespace kvtier::bench
