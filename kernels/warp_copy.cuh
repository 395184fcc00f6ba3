// The warp-wide byte copy every copy kernel uses: 32 lanes move a range with
// the widest access the source's and destination's relative alignment allows
// (16-byte vectors, else 4-byte words, else bytes), with streaming (evict-
// first) loads and stores so a transfer does not flush the engine's L2.
// Only kernels/*.cu include it.
//
// Thread-safety: device functions of their arguments.
#ifndef KVTIER_KERNELS_WARP_COPY_CUH_
#define KVTIER_KERNELS_WARP_COPY_CUH_

#include <cstdint>

namespace kvtier::kernels::warp_copy {

// Vectors (or words) each lane keeps in flight per iteration.
inline constexpr uint32_t kUnroll = 4;

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

}  // namespace kvtier::kernels::warp_copy

#endif  // KVTIER_KERNELS_WARP_COPY_CUH_
