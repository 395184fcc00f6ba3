// transfer_bench's loads: cuBLAS, dlopen()ed at run time (libcublas.so.13,
// or --cublas_lib; the GPU-host bundle cannot carry the library, so without
// it the interference part is skipped with a note), and the two loads the
// interference part (transfer_bench_interference.cc) runs beside transfers:
// a loop of large bf16 GEMMs that holds every SM, and a decode-step proxy
// replayed from a CUDA graph.
//
// Thread-safety: a Load is used by one thread (the main thread).

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
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
    cb.set_workspace = reinterpret_cast<Cublas::SetWorkspaceFn>(
        dlsym(lib, "cublasSetWorkspace_v2"));
    if (cb.create && cb.destroy && cb.set_stream && cb.gemm) return cb;
    dlclose(lib);
    absl::StrAppend(&tried, " ", c, "(symbols missing)");
  }
  return absl::NotFoundError(absl::StrCat("no usable libcublas; tried", tried));
}

namespace {

// Fills `bytes` of device memory at `dst` with random bf16 in [-1, 1) (the
// top half of a float's bits) through `scratch` (pinned host memory of at
// least `bytes`).
absl::Status FillBf16(void* dst, uint64_t bytes, uint8_t* scratch,
                      uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  auto* h = reinterpret_cast<uint16_t*>(scratch);
  for (uint64_t i = 0; i < bytes / 2; ++i) {
    const float f = u(rng);
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    h[i] = static_cast<uint16_t>(bits >> 16);
  }
  return Cuda(cudaMemcpy(dst, scratch, bytes, cudaMemcpyHostToDevice), "fill");
}

// Device buffers freed together.
class DeviceBuffers {
 public:
  DeviceBuffers() = default;
  DeviceBuffers(const DeviceBuffers&) = delete;
  DeviceBuffers& operator=(const DeviceBuffers&) = delete;
  ~DeviceBuffers() {
    for (void* p : ptrs_) cudaFree(p);
  }
  absl::StatusOr<void*> Alloc(uint64_t bytes) {
    void* p = nullptr;
    BENCH_RETURN_IF_ERROR(
        Cuda(cudaMalloc(&p, bytes), absl::StrCat("cudaMalloc ", bytes)));
    ptrs_.push_back(p);
    return p;
  }

 private:
  std::vector<void*> ptrs_;
};

// Times `enqueue_window` on `stream` with two events; ms per unit.
absl::StatusOr<double> TimeWindow(cudaStream_t stream, cudaEvent_t e0,
                                  cudaEvent_t e1, int units,
                                  const std::function<absl::Status()>& one) {
  BENCH_RETURN_IF_ERROR(Cuda(cudaEventRecord(e0, stream), "record"));
  for (int i = 0; i < units; ++i) BENCH_RETURN_IF_ERROR(one());
  BENCH_RETURN_IF_ERROR(Cuda(cudaEventRecord(e1, stream), "record"));
  BENCH_RETURN_IF_ERROR(Cuda(cudaEventSynchronize(e1), "load window"));
  float ms = 0;
  BENCH_RETURN_IF_ERROR(Cuda(cudaEventElapsedTime(&ms, e0, e1), "elapsed"));
  return ms / units;
}

// Common parts of both loads: the cuBLAS handle on the load's stream, its
// fixed workspace, the buffers and the window's events.
class CublasLoad : public Load {
 public:
  CublasLoad(const Cublas& cb, cudaStream_t stream, int per_window)
      : cb_(cb), stream_(stream), per_window_(per_window) {}
  ~CublasLoad() override {
    if (stream_ != nullptr) cudaStreamSynchronize(stream_);
    if (handle_ != nullptr) cb_.destroy(handle_);
    for (cudaEvent_t e : {e0_, e1_}) {
      if (e != nullptr) cudaEventDestroy(e);
    }
  }

  absl::Status Init() {
    BENCH_RETURN_IF_ERROR(Cuda(cudaEventCreate(&e0_), "event"));
    BENCH_RETURN_IF_ERROR(Cuda(cudaEventCreate(&e1_), "event"));
    if (cb_.create(&handle_) != CUBLAS_STATUS_SUCCESS) {
      handle_ = nullptr;
      return absl::InternalError("cublasCreate failed");
    }
    cb_.set_stream(handle_, stream_);
    if (cb_.set_workspace != nullptr) {
      constexpr uint64_t kWorkspace = 64 * kMiB;
      absl::StatusOr<void*> ws = buffers_.Alloc(kWorkspace);
      if (!ws.ok()) return ws.status();
      if (cb_.set_workspace(handle_, *ws, kWorkspace) !=
          CUBLAS_STATUS_SUCCESS) {
        return absl::InternalError("cublasSetWorkspace failed");
      }
    }
    return absl::OkStatus();
  }

  // C (m x n) = A (m x k) B (k x n), column-major bf16, fp32 accumulate.
  absl::Status Gemm(int m, int n, int k, const void* a, const void* b,
                    void* c) {
    const float alpha = 1.f, beta = 0.f;
    const cublasStatus_t s =
        cb_.gemm(handle_, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &alpha, a,
                 CUDA_R_16BF, m, b, CUDA_R_16BF, k, &beta, c, CUDA_R_16BF, m,
                 CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (s != CUBLAS_STATUS_SUCCESS) {
      return absl::InternalError(
          absl::StrCat("cublasGemmEx: status ", static_cast<int>(s)));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<double> Window() override {
    return TimeWindow(stream_, e0_, e1_, per_window_, [this] { return One(); });
  }

 protected:
  virtual absl::Status One() = 0;

  const Cublas cb_;
  const cudaStream_t stream_;
  const int per_window_;
  cublasHandle_t handle_ = nullptr;
  cudaEvent_t e0_ = nullptr, e1_ = nullptr;
  DeviceBuffers buffers_;
};

class GemmLoad : public CublasLoad {
 public:
  GemmLoad(const Cublas& cb, cudaStream_t stream, int n, int per_window)
      : CublasLoad(cb, stream, per_window), n_(n) {}

  absl::Status Setup(uint8_t* scratch) {
    BENCH_RETURN_IF_ERROR(Init());
    const uint64_t bytes = static_cast<uint64_t>(n_) * n_ * 2;
    for (void** m : {&a_, &b_, &c_}) {
      absl::StatusOr<void*> p = buffers_.Alloc(bytes);
      if (!p.ok()) return p.status();
      *m = *p;
    }
    BENCH_RETURN_IF_ERROR(FillBf16(a_, bytes, scratch, 7));
    BENCH_RETURN_IF_ERROR(FillBf16(b_, bytes, scratch, 8));
    BENCH_RETURN_IF_ERROR(Cuda(cudaMemset(c_, 0, bytes), "memset C"));
    for (int i = 0; i < 20; ++i) BENCH_RETURN_IF_ERROR(One());
    return Cuda(cudaStreamSynchronize(stream_), "GEMM warm-up");
  }

  std::string Name() const override { return "gemm"; }
  std::string DescribeJson() const override {
    return absl::StrFormat(
        "\"m\": %d, \"n\": %d, \"k\": %d, \"dtype\": \"bf16\", "
        "\"compute\": \"fp32\", \"units_per_window\": %d, \"unit\": "
        "\"one GEMM\", \"cublas\": %s",
        n_, n_, n_, per_window_, JsonString(cb_.path));
  }

 protected:
  absl::Status One() override { return Gemm(n_, n_, n_, a_, b_, c_); }

 private:
  const int n_;
  void *a_ = nullptr, *b_ = nullptr, *c_ = nullptr;
};

class DecodeLoad : public CublasLoad {
 public:
  static constexpr int kLayers = 32, kBatch = 64, kHidden = 4096, kQkv = 6144,
                       kFfn = 14336;
  // The "attention" read: a kKvRows x kKvCols bf16 matrix (1 GiB).
  static constexpr int kKvRows = 65536, kKvCols = 8192;

  using CublasLoad::CublasLoad;
  ~DecodeLoad() override {
    if (exec_ != nullptr) cudaGraphExecDestroy(exec_);
    if (graph_ != nullptr) cudaGraphDestroy(graph_);
  }

  absl::Status Setup() {
    BENCH_RETURN_IF_ERROR(Init());
    struct W {
      void** p;
      uint64_t elems;
    };
    const uint64_t act = static_cast<uint64_t>(kBatch) * 2 * kFfn;
    for (W w : {W{&qkv_, uint64_t{kQkv} * kHidden},
                W{&o_, uint64_t{kHidden} * kHidden},
                W{&gate_up_, uint64_t{2} * kFfn * kHidden},
                W{&down_, uint64_t{kHidden} * kFfn},
                W{&kv_, uint64_t{kKvRows} * kKvCols}, W{&x_, act}, W{&y_, act},
                W{&kv_out_, uint64_t{kKvRows} * kBatch}}) {
      absl::StatusOr<void*> p = buffers_.Alloc(w.elems * 2);
      if (!p.ok()) return p.status();
      // Varied bytes: zeros would let the memory system compress them.
      BENCH_RETURN_IF_ERROR(Cuda(cudaMemset(*p, 0x3c, w.elems * 2), "memset"));
      *w.p = *p;
    }
    // Capture one step.
    BENCH_RETURN_IF_ERROR(
        Cuda(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal),
             "cudaStreamBeginCapture"));
    absl::Status st = Step();
    cudaGraph_t graph = nullptr;
    const cudaError_t end = cudaStreamEndCapture(stream_, &graph);
    graph_ = graph;
    BENCH_RETURN_IF_ERROR(st);
    BENCH_RETURN_IF_ERROR(Cuda(end, "cudaStreamEndCapture"));
    BENCH_RETURN_IF_ERROR(
        Cuda(cudaGraphInstantiate(&exec_, graph_, 0), "cudaGraphInstantiate"));
    for (int i = 0; i < 5; ++i) BENCH_RETURN_IF_ERROR(One());
    return Cuda(cudaStreamSynchronize(stream_), "decode warm-up");
  }

  std::string Name() const override { return "decode"; }
  std::string DescribeJson() const override {
    return absl::StrFormat(
        "\"unit\": \"one decode step (a CUDA graph)\", "
        "\"units_per_window\": %d, \"layers\": %d, \"batch\": %d, "
        "\"gemms_per_layer\": \"qkv %dx%d, o %dx%d, gate_up %dx%d, down "
        "%dx%d (out x in, bf16)\", \"hbm_read_bytes\": %d, "
        "\"weight_bytes_per_step\": %d, \"cublas\": %s",
        per_window_, kLayers, kBatch, kQkv, kHidden, kHidden, kHidden, 2 * kFfn,
        kHidden, kHidden, kFfn, static_cast<int64_t>(kKvRows) * kKvCols * 2,
        static_cast<int64_t>(kLayers) * 2 *
            (int64_t{kQkv} * kHidden + int64_t{kHidden} * kHidden +
             int64_t{2} * kFfn * kHidden + int64_t{kHidden} * kFfn),
        JsonString(cb_.path));
  }

 protected:
  absl::Status One() override {
    return Cuda(cudaGraphLaunch(exec_, stream_), "cudaGraphLaunch");
  }

 private:
  // One step: every layer's projections (one set of weights, re-read from
  // HBM each layer: 436 MB do not fit the L2), then the KV read.
  absl::Status Step() {
    for (int l = 0; l < kLayers; ++l) {
      BENCH_RETURN_IF_ERROR(Gemm(kQkv, kBatch, kHidden, qkv_, x_, y_));
      BENCH_RETURN_IF_ERROR(Gemm(kHidden, kBatch, kHidden, o_, y_, x_));
      BENCH_RETURN_IF_ERROR(Gemm(2 * kFfn, kBatch, kHidden, gate_up_, x_, y_));
      BENCH_RETURN_IF_ERROR(Gemm(kHidden, kBatch, kFfn, down_, y_, x_));
    }
    return Gemm(kKvRows, kBatch, kKvCols, kv_, x_, kv_out_);
  }

  void *qkv_ = nullptr, *o_ = nullptr, *gate_up_ = nullptr, *down_ = nullptr;
  void *kv_ = nullptr, *x_ = nullptr, *y_ = nullptr, *kv_out_ = nullptr;
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Load>> MakeGemmLoad(const Cublas& cb,
                                                   cudaStream_t stream, int n,
                                                   int per_window,
                                                   uint8_t* host_scratch) {
  auto load = std::make_unique<GemmLoad>(cb, stream, n, per_window);
  BENCH_RETURN_IF_ERROR(load->Setup(host_scratch));
  return load;
}

absl::StatusOr<std::unique_ptr<Load>> MakeDecodeLoad(const Cublas& cb,
                                                     cudaStream_t stream,
                                                     int per_window) {
  auto load = std::make_unique<DecodeLoad>(cb, stream, per_window);
  BENCH_RETURN_IF_ERROR(load->Setup());
  return load;
}

}  // namespace kvtier::bench
