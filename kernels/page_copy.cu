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
#include "kernels/warp_copy.cuh"

namespace kvtier::kernels {
namespace {

using warp_copy::CopyChunk;

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
