// The page copy kernel and its launcher.
//
// Design: one launch copies a slice of up to kMaxCopyItems pages across every
// segment (tensor) of the segment table. The work is cut into units of one
// chunk (<= kChunkBytes) of one segment of one item, ordered item-major, and
// the grid's warps stride over the units. A warp copies its chunk with 16-byte
// vector accesses when source and destination agree modulo 16 (a byte head
// aligns them, a byte tail finishes), with 4-byte words when they agree
// modulo 4, and byte by byte otherwise; odd sizes only ever cost a tail.
// Loads and stores use the streaming cache hints (.cs): every byte is touched
// once, so it should not evict the engine's working set from L2.
// The whole plan (indices and segment table, ~31 KiB) is the kernel's
// __grid_constant__ parameter: no device memory is read except the data, and
// nothing is allocated.
//
// Thread-safety: LaunchPageCopy may be called from any thread.

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/page_copy.h"
#include "kernels/page_copy_launch.h"

namespace kvtier::kernels {
namespace {

// Vectors (or words) each lane keeps in flight per iteration.
constexpr uint32_t kUnroll = 4;

// Copies `n` elements of type T; both pointers are T-aligned.
template <typename T>
__device__ __forceinline__ void CopyAligned(const T* __restrict__ src,
                                            T* __restrict__ dst, uint32_t n,
                                            uint32_t lane) {
  uint32_t i = lane;
  for (; i + (kUnroll - 1) * 32 < n; i += kUnroll * 32) {
    T v[kUnroll];
#pragma unroll
    for (uint32_t k = 0; k < kUnroll; ++k) v[k] = __ldcs(src + i + k * 32);
#pragma unroll
    for (uint32_t k = 0; k < kUnroll; ++k) __stcs(dst + i + k * 32, v[k]);
  }
  for (; i < n; i += 32) __stcs(dst + i, __ldcs(src + i));
}

// Copies `n` bytes of src to dst with the widest access their relative
// alignment allows. All 32 lanes of the warp call it with the same arguments.
__device__ __forceinline__ void CopyChunk(const uint8_t* src, uint8_t* dst,
                                          uint32_t n, uint32_t lane) {
  const uintptr_t s = reinterpret_cast<uintptr_t>(src);
  const uintptr_t d = reinterpret_cast<uintptr_t>(dst);
  uint32_t width = 1;
  if (((s ^ d) & 15) == 0) {
    width = 16;
  } else if (((s ^ d) & 3) == 0) {
    width = 4;
  }
  if (width == 1) {
    for (uint32_t i = lane; i < n; i += 32) dst[i] = src[i];
    return;
  }
  // Head: bytes until src (and therefore dst) is width-aligned.
  uint32_t head =
      static_cast<uint32_t>((width - (s & (width - 1))) & (width - 1));
  if (head > n) head = n;
  if (lane < head) dst[lane] = src[lane];
  src += head;
  dst += head;
  n -= head;
  const uint32_t body = n / width;
  if (width == 16) {
    CopyAligned(reinterpret_cast<const int4*>(src),
                reinterpret_cast<int4*>(dst), body, lane);
  } else {
    CopyAligned(reinterpret_cast<const unsigned int*>(src),
                reinterpret_cast<unsigned int*>(dst), body, lane);
  }
  const uint32_t done = body * width;
  if (lane < n - done) dst[done + lane] = src[done + lane];
}

__global__ void __launch_bounds__(kThreadsPerCta)
    PageCopyKernel(const __grid_constant__ PageCopyParams p) {
  const uint32_t lane = threadIdx.x & 31;
  const uint64_t warp =
      (static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const uint64_t num_warps =
      (static_cast<uint64_t>(gridDim.x) * blockDim.x) >> 5;
  const uint64_t units =
      static_cast<uint64_t>(p.header.num_items) * p.header.chunks_per_item;
  for (uint64_t u = warp; u < units; u += num_warps) {
    const PageCopyChunk c = ResolvePageCopyChunk(p, u);
    CopyChunk(reinterpret_cast<const uint8_t*>(c.src),
              reinterpret_cast<uint8_t*>(c.dst), c.bytes, lane);
  }
}

}  // namespace

absl::Status LaunchPageCopy(const PageCopyParams& p, cudaStream_t stream) {
  if (absl::Status s = CheckPageCopyParams(p); !s.ok()) return s;
  if (p.header.num_items == 0) return absl::OkStatus();
  PageCopyKernel<<<PageCopyGridSize(p), kThreadsPerCta, 0, stream>>>(p);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    return absl::InternalError(
        absl::StrCat("page copy launch failed: ", cudaGetErrorName(err), ": ",
                     cudaGetErrorString(err)));
  }
  return absl::OkStatus();
}

}  // namespace kvtier::kernels
