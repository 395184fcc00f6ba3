// kvtier_gpu_engine: an engine-like process with a real GPU KV pool, for the
// two-process GPU test.
//
//   kvtier_gpu_engine evict     SOCKET NAMESPACE PAGES SEED
//       cudaMalloc an fp8-style pool (32 layers x K,V codes, per-token fp32
//       scales, a snapshot slot), fill PAGES random GPU pages with a known
//       pattern, attach (banks registered with CUDA), reserve, evict with the
//       CUDA kernel on a stream, save a snapshot, commit behind the stream,
//       exit 0 ("EVICTED").
//   kvtier_gpu_engine rehydrate SOCKET NAMESPACE PAGES SEED
//       attach, look the prefix up (pinned), rehydrate it into OTHER pages of
//       a fresh zeroed pool and restore the snapshot into another slot, then
//       compare every byte with the pattern: exit 0 ("VERIFIED") or 1.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "client/client.h"
#include "client/transfer_engine.h"
#include "tests/test_pattern.h"

namespace {

constexpr uint32_t kLayers = 32;
constexpr uint64_t kCodeBytes =
    16 * 8 * 128;                         // 16 tokens x 8 heads x 128, fp8.
constexpr uint64_t kScaleBytes = 16 * 4;  // Per-token fp32 scale.
constexpr uint64_t kPoolPages = 512;
constexpr uint64_t kSnapState = 1 << 20;  // A recurrent state segment.
constexpr uint64_t kSnapConv = 3000;      // An odd-sized conv state.
constexpr uint64_t kSnapSlots = 8;

#define CUDA_OK(x)                                                 \
  do {                                                             \
    cudaError_t e = (x);                                           \
    if (e != cudaSuccess) {                                        \
      std::fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e)); \
      std::exit(1);                                                \
    }                                                              \
  } while (0)

int Die(const char* what, const absl::Status& s) {
  std::fprintf(stderr, "kvtier_gpu_engine: %s: %s\n", what,
               s.ToString().c_str());
  return 1;
}

kvtier::client::AttachOptions Options(const std::string& ns) {
  kvtier::client::AttachOptions o;
  o.name = ns;
  o.layout.model = "gpu-test-fp8";
  o.layout.tokens_per_page = 16;
  o.layout.num_layers = kLayers;
  o.layout.page_banks = {{"kv", kLayers * 2 * kCodeBytes, "fp8_e4m3"},
                         {"scale", kLayers * 2 * kScaleBytes, "fp32"}};
  o.layout.snapshot_row_bytes = kSnapState + kSnapConv;
  o.capacity.page_rows = 256;
  o.capacity.snapshot_rows = 4;
  return o;
}

// The GPU pool: one tensor per (layer, K|V) for codes and for scales, page-
// major inside each tensor; a snapshot pool of two segments per slot.
struct Pool {
  std::vector<uint8_t*> codes, scales;
  uint8_t* state = nullptr;
  uint8_t* conv = nullptr;

  Pool() {
    for (uint32_t t = 0; t < kLayers * 2; ++t) {
      uint8_t* c = nullptr;
      uint8_t* s = nullptr;
      CUDA_OK(
          cudaMalloc(reinterpret_cast<void**>(&c), kPoolPages * kCodeBytes));
      CUDA_OK(
          cudaMalloc(reinterpret_cast<void**>(&s), kPoolPages * kScaleBytes));
      CUDA_OK(cudaMemset(c, 0, kPoolPages * kCodeBytes));
      CUDA_OK(cudaMemset(s, 0, kPoolPages * kScaleBytes));
      codes.push_back(c);
      scales.push_back(s);
    }
    CUDA_OK(
        cudaMalloc(reinterpret_cast<void**>(&state), kSnapSlots * kSnapState));
    CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&conv), kSnapSlots * 3008));
    CUDA_OK(cudaMemset(state, 0, kSnapSlots * kSnapState));
    CUDA_OK(cudaMemset(conv, 0, kSnapSlots * 3008));
  }

  kvtier::client::GpuPoolDescriptor Descriptor() const {
    kvtier::client::GpuPoolDescriptor d;
    d.num_pages = kPoolPages;
    kvtier::client::BankPool kv{"kv", {}}, sc{"scale", {}};
    for (uint32_t t = 0; t < kLayers * 2; ++t) {
      kv.tensors.push_back(
          {reinterpret_cast<uint64_t>(codes[t]), kCodeBytes, kCodeBytes});
      sc.tensors.push_back(
          {reinterpret_cast<uint64_t>(scales[t]), kScaleBytes, kScaleBytes});
    }
    d.banks = {kv, sc};
    d.snapshot = {{reinterpret_cast<uint64_t>(state), kSnapState, kSnapState},
                  {reinterpret_cast<uint64_t>(conv), 3008, kSnapConv}};
    d.num_snapshot_slots = kSnapSlots;
    return d;
  }
};

std::vector<uint32_t> Pages(uint32_t n, uint64_t seed) {
  std::vector<uint32_t> all(kPoolPages);
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), std::mt19937_64(seed));
  all.resize(n);
  return all;
}

// Expected bytes of logical page i in tensor t (codes: bank 0..63, scales:
// bank 64..127), and of the snapshot (banks 1000, 1001).
std::vector<uint8_t> Expected(uint64_t bytes, uint64_t seed, uint32_t page,
                              size_t tensor) {
  std::vector<uint8_t> v(bytes);
  kvtier::testing::FillPattern(v.data(), bytes, seed, page, tensor);
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: %s evict|rehydrate SOCKET NS PAGES SEED\n",
                 argv[0]);
    return 2;
  }
  const std::string mode = argv[1];
  const uint32_t n = static_cast<uint32_t>(std::strtoul(argv[4], nullptr, 10));
  const uint64_t seed = std::strtoull(argv[5], nullptr, 10);
  auto client = kvtier::client::Client::Connect(
      {.socket = argv[2], .client_name = "gpu-engine-" + mode});
  if (!client.ok()) return Die("connect", client.status());
  auto ns = (*client)->Attach(Options(argv[3]));
  if (!ns.ok()) return Die("attach", ns.status());
  if (!(*ns)->cuda_registered()) {
    return Die("attach", absl::FailedPreconditionError("banks not registered"));
  }
  const std::string hashes =
      (*ns)->hasher().HashChain(kvtier::testing::TestTokens(seed, n * 16));
  const std::string last = hashes.substr(hashes.size() - 32);
  Pool pool;
  auto engine = (*ns)->CreateTransferEngine(kvtier::client::Backend::kCuda,
                                            pool.Descriptor());
  if (!engine.ok()) return Die("transfer engine", engine.status());
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  if (mode == "evict") {
    const std::vector<uint32_t> pages = Pages(n, seed);
    for (uint32_t i = 0; i < n; ++i) {
      for (uint32_t t = 0; t < kLayers * 2; ++t) {
        auto c = Expected(kCodeBytes, seed, i, t);
        auto s = Expected(kScaleBytes, seed, i, 64 + t);
        CUDA_OK(cudaMemcpy(pool.codes[t] + pages[i] * kCodeBytes, c.data(),
                           kCodeBytes, cudaMemcpyHostToDevice));
        CUDA_OK(cudaMemcpy(pool.scales[t] + pages[i] * kScaleBytes, s.data(),
                           kScaleBytes, cudaMemcpyHostToDevice));
      }
    }
    auto st = Expected(kSnapState, seed, 0, 1000);
    auto cv = Expected(kSnapConv, seed, 0, 1001);
    CUDA_OK(cudaMemcpy(pool.state + 3 * kSnapState, st.data(), kSnapState,
                       cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(pool.conv + 3 * 3008, cv.data(), kSnapConv,
                       cudaMemcpyHostToDevice));
    auto res = (*ns)->Reserve(n, 1);
    if (!res.ok()) return Die("reserve", res.status());
    if (auto s = (*engine)->Evict(pages, res->page_rows(), stream); !s.ok()) {
      return Die("evict", s);
    }
    if (auto s = (*engine)->SaveSnapshot(3, res->snapshot_rows()[0], stream);
        !s.ok()) {
      return Die("save snapshot", s);
    }
    auto done = res->CommitAfter(stream, "", hashes, {{0, last}});
    auto result = done.get();  // The stream finished; the commit went out.
    if (!result.ok()) return Die("commit", result.status());
    std::printf("EVICTED %u pages in %lu slices\n", result->committed_pages,
                static_cast<unsigned long>((*engine)->slices_launched()));
    return 0;
  }

  if (mode == "rehydrate") {
    auto lease = (*ns)->Lookup(hashes, /*pin=*/true);
    if (!lease.ok()) return Die("lookup", lease.status());
    if (lease->usable_pages() != n || !lease->has_snapshot()) {
      std::fprintf(stderr, "usable %u of %u pages, snapshot %d\n",
                   lease->usable_pages(), n, lease->has_snapshot());
      return 1;
    }
    const std::vector<uint32_t> pages = Pages(n, seed + 99);
    if (auto s = (*engine)->Rehydrate(pages, lease->rows(), stream); !s.ok()) {
      return Die("rehydrate", s);
    }
    if (auto s = (*engine)->RestoreSnapshot(5, lease->snapshot_row(), stream);
        !s.ok()) {
      return Die("restore snapshot", s);
    }
    lease->ReleaseAfter(stream);
    CUDA_OK(cudaStreamSynchronize(stream));
    std::vector<uint8_t> got(kCodeBytes);
    uint64_t bad = 0;
    for (uint32_t i = 0; i < n; ++i) {
      for (uint32_t t = 0; t < kLayers * 2; ++t) {
        CUDA_OK(cudaMemcpy(got.data(), pool.codes[t] + pages[i] * kCodeBytes,
                           kCodeBytes, cudaMemcpyDeviceToHost));
        if (got != Expected(kCodeBytes, seed, i, t)) ++bad;
        std::vector<uint8_t> s(kScaleBytes);
        CUDA_OK(cudaMemcpy(s.data(), pool.scales[t] + pages[i] * kScaleBytes,
                           kScaleBytes, cudaMemcpyDeviceToHost));
        if (s != Expected(kScaleBytes, seed, i, 64 + t)) ++bad;
      }
    }
    std::vector<uint8_t> st(kSnapState), cv(kSnapConv);
    CUDA_OK(cudaMemcpy(st.data(), pool.state + 5 * kSnapState, kSnapState,
                       cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(cv.data(), pool.conv + 5 * 3008, kSnapConv,
                       cudaMemcpyDeviceToHost));
    if (st != Expected(kSnapState, seed, 0, 1000)) ++bad;
    if (cv != Expected(kSnapConv, seed, 0, 1001)) ++bad;
    if (bad != 0) {
      std::fprintf(stderr, "%lu tensors differ\n",
                   static_cast<unsigned long>(bad));
      return 1;
    }
    std::printf("VERIFIED %u pages x %u tensors + snapshot\n", n, kLayers * 4);
    return 0;
  }
  return 2;
}
