// The sparse-attention offload kernels: mirror store, ensure plan, ensure
// copy, and the ensure state's initialisation.
//
// Design: the mirror store is a warp per (entry, segment) unit over a fixed
// grid; the entry count is read on the device, so the launch has the same
// shape every step. The ensure plan is a single CTA of 1024 threads: its work
// (a few passes over the selection and the P slots) is small next to the
// copies, and one CTA makes every ordering decision deterministic without
// inter-CTA synchronisation, so the GPU agrees with the reference bit for
// bit. Victims are found by an 8-pass radix select of the M-th smallest
// (stamp, slot) key, then compacted in slot order with a block scan. The
// ensure copy walks the page copy's chunk plan (ResolveEnsureChunk) over the
// device-side copy list with a fixed grid. Parameters travel as
// __grid_constant__ values; nothing is allocated after AllocateEnsureState.
//
// Thread-safety: the launchers may be called from any thread.

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "kernels/sparse_offload.h"
#include "kernels/sparse_offload_launch.h"
#include "kernels/warp_copy.cuh"

namespace kvtier::kernels {
namespace {

using warp_copy::CopyChunk;

constexpr uint32_t kPlanThreads = 1024;

absl::Status LaunchError(const char* what) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    return absl::InternalError(
        absl::StrCat(what, " launch failed: ", cudaGetErrorName(err), ": ",
                     cudaGetErrorString(err)));
  }
  return absl::OkStatus();
}

// ------------------------------------------------------------------ mirror --

__global__ void __launch_bounds__(kThreadsPerCta)
    MirrorStoreKernel(const __grid_constant__ MirrorStoreParams p) {
  const MirrorStoreHeader& h = p.header;
  const uint32_t lane = threadIdx.x & 31;
  const uint64_t warp =
      (static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const uint64_t num_warps =
      (static_cast<uint64_t>(gridDim.x) * blockDim.x) >> 5;
  if (h.revoked != nullptr && *h.revoked != 0) return;  // Session ended.
  uint32_t count = *h.count;
  if (count > h.max_entries) count = h.max_entries;
  const uint64_t units = static_cast<uint64_t>(count) * h.num_segments;
  for (uint64_t u = warp; u < units; u += num_warps) {
    const uint32_t i = static_cast<uint32_t>(u / h.num_segments);
    const uint32_t s = static_cast<uint32_t>(u % h.num_segments);
    const MirrorEntry e = h.entries[i];
    if (e.logical < 0) continue;
    if (static_cast<uint32_t>(e.logical) >= h.num_logical || e.slot < 0 ||
        static_cast<uint32_t>(e.slot) >= h.num_slots || e.token < 0 ||
        static_cast<uint32_t>(e.token) >= h.tokens_per_page) {
      if (s == 0 && lane == 0) atomicAdd(h.drops, 1ull);
      continue;
    }
    const MirrorSegment& seg = p.segments[s];
    const uint64_t row = h.mirror_rows[e.logical];
    const uint64_t off =
        seg.per_page ? 0 : static_cast<uint64_t>(e.token) * seg.bytes_per_token;
    CopyChunk(reinterpret_cast<const uint8_t*>(
                  seg.pool_base +
                  static_cast<uint64_t>(e.slot) * seg.pool_page_stride + off),
              reinterpret_cast<uint8_t*>(seg.bank_base +
                                         row * seg.bank_row_stride + off),
              seg.bytes_per_token, lane);
  }
}

// ------------------------------------------------------------------ ensure --

__global__ void ResetEnsureKernel(EnsureState s) {
  const uint64_t tid =
      static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t i = tid; i < s.num_slots; i += stride) {
    s.slot_logical[i] = -1;
    s.slot_stamp[i] = 0;
  }
  for (uint64_t i = tid; i < s.num_logical; i += stride) {
    s.logical_slot[i] = -1;
    s.claim[i] = 0;
  }
  if (tid == 0) {
    *s.step = 0;
    *s.drops = 0;
    *s.copy_count = 0;
  }
}

// Exclusive prefix of `flag` over the block in thread order; *total gets the
// block's sum. All kPlanThreads threads call it.
__device__ __forceinline__ uint32_t BlockExclusiveScan(bool flag,
                                                       uint32_t* warp_sums,
                                                       uint32_t* total) {
  const uint32_t lane = threadIdx.x & 31;
  const uint32_t warp = threadIdx.x >> 5;
  const uint32_t ballot = __ballot_sync(0xFFFFFFFFu, flag);
  const uint32_t prefix = __popc(ballot & ((1u << lane) - 1u));
  if (lane == 0) warp_sums[warp] = __popc(ballot);
  __syncthreads();
  if (warp == 0) {
    uint32_t v = warp_sums[lane];
#pragma unroll
    for (uint32_t d = 1; d < 32; d <<= 1) {
      const uint32_t up = __shfl_up_sync(0xFFFFFFFFu, v, d);
      if (lane >= d) v += up;
    }
    warp_sums[lane] = v;  // inclusive
  }
  __syncthreads();
  const uint32_t offset = warp == 0 ? 0 : warp_sums[warp - 1];
  *total = warp_sums[31];
  __syncthreads();  // warp_sums is reused by the next call
  return offset + prefix;
}

__device__ __forceinline__ bool ValidLogical(int32_t l, uint32_t num_logical) {
  return l >= 0 && static_cast<uint32_t>(l) < num_logical;
}

// The plan kernel's steps (EnsurePlanKernel), each run by all kPlanThreads
// threads of the one CTA (this one is `tid`) and ending where the kernel
// needs a barrier. `n` is the state's max_entries.

// The key (step << 32 | ~entry) of entry i's claim in step `step`.
__device__ __forceinline__ unsigned long long ClaimKey(uint32_t step,
                                                       uint32_t i) {
  return (static_cast<unsigned long long>(step) << 32) | (0xFFFFFFFFull - i);
}

// 2: counts malformed entries as drops, claims the first occurrence of each
// selected page (claim[l] ends as the largest key: the lowest entry), and
// stamps the slots of the pages that hit.
__device__ __forceinline__ void ClaimAndStampHits(const EnsurePlanParams& p,
                                                  uint32_t tid, uint32_t n,
                                                  uint32_t step) {
  const EnsureState& s = p.state;
  for (uint32_t i = tid; i < n; i += kPlanThreads) {
    const int32_t l = p.selected[i];
    if (l == -1) continue;
    if (!ValidLogical(l, s.num_logical)) {
      atomicAdd(s.drops, 1ull);
      continue;
    }
    atomicMax(&s.claim[l], ClaimKey(step, i));
    const int32_t slot = s.logical_slot[l];
    if (slot >= 0) s.slot_stamp[slot] = step;
  }
  __syncthreads();
}

// 3: compacts the first occurrences of missing pages into miss_logical, in
// entry order; returns how many.
__device__ __forceinline__ uint32_t CompactMisses(const EnsurePlanParams& p,
                                                  uint32_t tid, uint32_t n,
                                                  uint32_t step,
                                                  uint32_t* warp_sums) {
  const EnsureState& s = p.state;
  uint32_t misses = 0;
  for (uint32_t base = 0; base < n; base += kPlanThreads) {
    const uint32_t i = base + tid;
    int32_t l = -1;
    bool flag = false;
    if (i < n) {
      l = p.selected[i];
      flag = ValidLogical(l, s.num_logical) &&
             s.claim[l] == ClaimKey(step, i) && s.logical_slot[l] < 0;
    }
    uint32_t total = 0;
    const uint32_t pos = BlockExclusiveScan(flag, warp_sums, &total);
    if (flag) s.miss_logical[misses + pos] = l;
    misses += total;
  }
  return misses;
}

// Returns the candidates for eviction: slots not used this step.
// REQUIRES: *sh_avail is 0.
__device__ __forceinline__ uint32_t CountCandidates(const EnsureState& s,
                                                    uint32_t tid, uint32_t step,
                                                    uint32_t* sh_avail) {
  uint32_t local = 0;
  for (uint32_t slot = tid; slot < s.num_slots; slot += kPlanThreads) {
    if (s.slot_stamp[slot] != step) ++local;
  }
  atomicAdd(sh_avail, local);
  __syncthreads();
  return *sh_avail;
}

// 4: radix-selects the m-th smallest (stamp << 32 | slot) key of the
// candidates, a byte per pass, and returns it. REQUIRES: 0 < m <= the
// candidates.
__device__ __forceinline__ unsigned long long SelectVictimThreshold(
    const EnsureState& s, uint32_t tid, uint32_t step, uint32_t m,
    uint32_t* hist, unsigned long long* sh_prefix, uint32_t* sh_k) {
  if (tid == 0) {
    *sh_prefix = 0;
    *sh_k = m;  // rank (1-based) still to find below the current prefix
  }
  __syncthreads();
  for (int digit = 7; digit >= 0; --digit) {
    for (uint32_t b = tid; b < 256; b += kPlanThreads) hist[b] = 0;
    __syncthreads();
    const unsigned long long prefix = *sh_prefix;
    const unsigned long long high_mask =
        digit == 7 ? 0ull : (~0ull << (8 * (digit + 1)));
    for (uint32_t slot = tid; slot < s.num_slots; slot += kPlanThreads) {
      const uint32_t stamp = s.slot_stamp[slot];
      if (stamp == step) continue;
      const unsigned long long key =
          (static_cast<unsigned long long>(stamp) << 32) | slot;
      if ((key & high_mask) != prefix) continue;
      atomicAdd(&hist[(key >> (8 * digit)) & 0xFF], 1u);
    }
    __syncthreads();
    if (tid == 0) {
      uint32_t k = *sh_k;
      uint32_t b = 0;
      for (; b < 256; ++b) {
        if (hist[b] >= k) break;
        k -= hist[b];
      }
      *sh_k = k;
      *sh_prefix = prefix | (static_cast<unsigned long long>(b) << (8 * digit));
    }
    __syncthreads();
  }
  return *sh_prefix;
}

// Compacts the victims (candidates whose key is at most `threshold`) into
// copy_slot, in slot order.
__device__ __forceinline__ void CompactVictims(const EnsureState& s,
                                               uint32_t tid, uint32_t step,
                                               unsigned long long threshold,
                                               uint32_t* warp_sums) {
  uint32_t placed = 0;
  for (uint32_t base = 0; base < s.num_slots; base += kPlanThreads) {
    const uint32_t slot = base + tid;
    bool flag = false;
    if (slot < s.num_slots) {
      const uint32_t stamp = s.slot_stamp[slot];
      flag = stamp != step && ((static_cast<unsigned long long>(stamp) << 32) |
                               slot) <= threshold;
    }
    uint32_t total = 0;
    const uint32_t pos = BlockExclusiveScan(flag, warp_sums, &total);
    if (flag) s.copy_slot[placed + pos] = slot;
    placed += total;
  }
  __syncthreads();
}

// 5: rebinds victim k's slot to missed page k, for k < m, and fills the
// copy list's rows. Old pages are not selected this step and new ones are
// not resident, so no two threads write the same logical_slot entry.
__device__ __forceinline__ void Rebind(const EnsurePlanParams& p, uint32_t tid,
                                       uint32_t step, uint32_t m) {
  const EnsureState& s = p.state;
  for (uint32_t k = tid; k < m; k += kPlanThreads) {
    const uint32_t slot = s.copy_slot[k];
    const int32_t l = s.miss_logical[k];
    const int32_t old = s.slot_logical[slot];
    if (old >= 0) s.logical_slot[old] = -1;
    s.slot_logical[slot] = l;
    s.slot_stamp[slot] = step;
    s.copy_row[k] = p.mirror_rows[l];
  }
  __syncthreads();
  for (uint32_t k = tid; k < m; k += kPlanThreads) {
    s.logical_slot[s.miss_logical[k]] = static_cast<int32_t>(s.copy_slot[k]);
  }
}

// 6: translates every selected entry to its slot (-1 for malformed ones).
__device__ __forceinline__ void Translate(const EnsurePlanParams& p,
                                          uint32_t tid, uint32_t n) {
  const EnsureState& s = p.state;
  for (uint32_t i = tid; i < n; i += kPlanThreads) {
    const int32_t l = p.selected[i];
    p.translated[i] = ValidLogical(l, s.num_logical) ? s.logical_slot[l] : -1;
  }
}

__global__ void __launch_bounds__(kPlanThreads)
    EnsurePlanKernel(const __grid_constant__ EnsurePlanParams p) {
  const EnsureState& s = p.state;
  __shared__ uint32_t warp_sums[32];
  __shared__ uint32_t hist[256];
  __shared__ uint32_t sh_step;
  __shared__ uint32_t sh_avail;
  __shared__ unsigned long long sh_prefix;
  __shared__ uint32_t sh_k;
  const uint32_t tid = threadIdx.x;
  const uint32_t n = s.max_entries;
  if (tid == 0) {
    sh_step = *s.step + 1;
    *s.step = sh_step;
    sh_avail = 0;
  }
  __syncthreads();
  const uint32_t step = sh_step;
  ClaimAndStampHits(p, tid, n, step);
  const uint32_t misses = CompactMisses(p, tid, n, step, warp_sums);
  const uint32_t avail = CountCandidates(s, tid, step, &sh_avail);
  uint32_t m = misses;
  if (m > avail) {
    if (tid == 0)
      atomicAdd(s.drops, static_cast<unsigned long long>(m - avail));
    m = avail;
  }
  if (m > 0) {
    const unsigned long long threshold =
        SelectVictimThreshold(s, tid, step, m, hist, &sh_prefix, &sh_k);
    CompactVictims(s, tid, step, threshold, warp_sums);
    Rebind(p, tid, step, m);
  }
  if (tid == 0) *s.copy_count = m;
  __syncthreads();
  Translate(p, tid, n);
}

__global__ void __launch_bounds__(kThreadsPerCta)
    EnsureCopyKernel(const __grid_constant__ EnsureCopyParams p) {
  const EnsureCopyHeader& h = p.header;
  const uint32_t lane = threadIdx.x & 31;
  const uint64_t warp =
      (static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const uint64_t num_warps =
      (static_cast<uint64_t>(gridDim.x) * blockDim.x) >> 5;
  uint32_t count = *h.copy_count;
  if (count > h.max_items) count = h.max_items;
  const uint64_t units = static_cast<uint64_t>(count) * h.chunks_per_item;
  for (uint64_t u = warp; u < units; u += num_warps) {
    const uint32_t item = static_cast<uint32_t>(u / h.chunks_per_item);
    const uint32_t chunk = static_cast<uint32_t>(u % h.chunks_per_item);
    const PageCopyChunk c = ResolveEnsureChunk(
        p.segments, h.num_segments, h.copy_slot[item], h.copy_row[item], chunk);
    CopyChunk(reinterpret_cast<const uint8_t*>(c.src),
              reinterpret_cast<uint8_t*>(c.dst), c.bytes, lane);
  }
}

// ------------------------------------------------------- bench proxies --

__global__ void HbmReadKernel(const int4* __restrict__ p, uint64_t n,
                              uint32_t* sink) {
  uint32_t acc = 0;
  for (uint64_t i = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x; i < n;
       i += uint64_t{gridDim.x} * blockDim.x) {
    const int4 v = __ldcs(p + i);
    acc ^= static_cast<uint32_t>(v.x ^ v.y ^ v.z ^ v.w);
  }
  if (acc == 0x9E3779B9u) *sink = acc;  // keeps the loads alive
}

__global__ void TokenStoreKernel(const int4* __restrict__ src, uint8_t* pool,
                                 uint32_t seqs, uint32_t tensors,
                                 uint64_t tensor_bytes, uint32_t page_bytes,
                                 uint32_t bpt, uint32_t token) {
  const uint32_t vecs = bpt / 16;
  const uint64_t total = uint64_t{seqs} * tensors * vecs;
  for (uint64_t i = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x; i < total;
       i += uint64_t{gridDim.x} * blockDim.x) {
    const uint64_t v = i % vecs;
    const uint64_t t = (i / vecs) % tensors;
    const uint64_t s = i / vecs / tensors;
    int4* dst =
        reinterpret_cast<int4*>(pool + t * tensor_bytes + s * page_bytes +
                                uint64_t{token} * bpt) +
        v;
    *dst = src[i];
  }
}

}  // namespace

absl::Status LaunchHbmReadProxy(const void* p, uint64_t bytes, uint32_t* sink,
                                uint32_t ctas, cudaStream_t stream) {
  if (bytes % 16 != 0 || ctas == 0) {
    return absl::InvalidArgumentError(
        "read proxy: bytes must be a multiple of 16 and ctas > 0");
  }
  HbmReadKernel<<<ctas, 512, 0, stream>>>(static_cast<const int4*>(p),
                                          bytes / 16, sink);
  return LaunchError("read proxy");
}

absl::Status LaunchTokenStoreProxy(const void* src, void* pool, uint32_t seqs,
                                   uint32_t tensors, uint64_t tensor_bytes,
                                   uint32_t page_bytes,
                                   uint32_t bytes_per_token, uint32_t token,
                                   uint32_t ctas, cudaStream_t stream) {
  if (bytes_per_token % 16 != 0 || ctas == 0) {
    return absl::InvalidArgumentError(
        "store proxy: bytes_per_token must be a multiple of 16 and ctas > 0");
  }
  TokenStoreKernel<<<ctas, 256, 0, stream>>>(
      static_cast<const int4*>(src), static_cast<uint8_t*>(pool), seqs, tensors,
      tensor_bytes, page_bytes, bytes_per_token, token);
  return LaunchError("store proxy");
}

absl::Status LaunchMirrorStore(const MirrorStoreParams& p,
                               cudaStream_t stream) {
  if (absl::Status s = CheckMirrorStoreParams(p); !s.ok()) return s;
  MirrorStoreKernel<<<MirrorStoreGridSize(p), kThreadsPerCta, 0, stream>>>(p);
  return LaunchError("mirror store");
}

absl::StatusOr<EnsureState> AllocateEnsureState(const EnsureConfig& c,
                                                cudaStream_t stream) {
  if (absl::Status s = CheckEnsureConfig(c); !s.ok()) return s;
  void* memory = nullptr;
  const size_t bytes = EnsureStateBytes(c);
  if (cudaError_t err = cudaMalloc(&memory, bytes); err != cudaSuccess) {
    cudaGetLastError();
    return absl::ResourceExhaustedError(
        absl::StrCat("ensure: cudaMalloc of ", bytes,
                     " bytes of state failed: ", cudaGetErrorString(err)));
  }
  EnsureState s = LayOutEnsureState(c, memory);
  if (absl::Status st = ResetEnsureState(s, stream); !st.ok()) {
    cudaFree(memory);
    return st;
  }
  return s;
}

absl::Status ResetEnsureState(const EnsureState& s, cudaStream_t stream) {
  ResetEnsureKernel<<<64, 256, 0, stream>>>(s);
  return LaunchError("ensure reset");
}

void FreeEnsureState(EnsureState& s) {
  // The claim array is the first of the allocation (LayOutEnsureState).
  if (s.claim != nullptr) cudaFree(s.claim);
  s = EnsureState();
}

absl::Status LaunchEnsurePlan(const EnsurePlanParams& p, cudaStream_t stream) {
  if (absl::Status s = CheckEnsurePlanParams(p); !s.ok()) return s;
  EnsurePlanKernel<<<1, kPlanThreads, 0, stream>>>(p);
  return LaunchError("ensure plan");
}

absl::Status LaunchEnsureCopy(const EnsureCopyParams& p, cudaStream_t stream) {
  if (absl::Status s = CheckEnsureCopyParams(p); !s.ok()) return s;
  EnsureCopyKernel<<<p.header.max_ctas, kThreadsPerCta, 0, stream>>>(p);
  return LaunchError("ensure copy");
}

}  // namespace kvtier::kernels
