// Page copy: the one kernel shape behind eviction (GPU pool -> host rows),
// rehydration (host rows -> GPU pool) and snapshot save/restore. A launch
// copies up to kMaxCopyItems (gpu index, host index) pairs; for each pair it
// copies every segment of the segment table, segment s of item i moving
// `bytes` bytes between
//   gpu_base  + gpu_index[i]  * gpu_stride   and
//   host_base + host_index[i] * host_stride.
// Everything the kernel needs travels by value in PageCopyParams (a
// __grid_constant__ kernel parameter), so a launch allocates nothing, reads no
// device-side tables, and can be captured in a CUDA graph.
//
// This header is plain C++ (no CUDA types): the reference implementation and
// the planner include it in builds without CUDA. The CUDA launcher is declared
// in kernels/page_copy_launch.h.
//
// Thread-safety: everything here is a pure function of its arguments.

#ifndef KVTIER_KERNELS_PAGE_COPY_H_
#define KVTIER_KERNELS_PAGE_COPY_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"

#if defined(__CUDACC__)
#define KVTIER_HOST_DEVICE __host__ __device__
#else
#define KVTIER_HOST_DEVICE
#endif

namespace kvtier::kernels {

// Most (gpu index, host index) pairs one launch copies: the planner's slice.
inline constexpr uint32_t kMaxCopyItems = 128;

// Largest kernel parameter block CUDA 12.1+ accepts on Volta and newer.
inline constexpr size_t kMaxKernelParamBytes = 32764;

// A segment is split into chunks of at most this many bytes; a chunk is the
// unit of work of one warp. Chunk boundaries keep a segment's alignment, so a
// chunk takes the vector path whenever its segment does.
inline constexpr uint32_t kChunkBytes = 16384;

// Default and largest grid. The copy is bound by PCIe, not by SMs: a small
// grid leaves the engine its SMs.
inline constexpr uint32_t kDefaultMaxCtas = 16;
inline constexpr uint32_t kMaxCtasLimit = 1024;

// Threads per CTA of the copy kernel (16 warps).
inline constexpr uint32_t kThreadsPerCta = 512;

enum class CopyDirection : uint32_t {
  kToHost = 0,    // gather: GPU pages -> host rows (evict, save snapshot)
  kFromHost = 1,  // scatter: host rows -> GPU pages (rehydrate, restore)
};

// One tensor of the pool, paired with where its bytes sit in a host row.
// Addresses are integers so the table is trivially copyable into the
// kernel's parameter space.
struct PageCopySegment {
  uint64_t gpu_base = 0;     // address of this tensor's page (or slot) 0
  uint64_t gpu_stride = 0;   // bytes between consecutive pages
  uint64_t host_base = 0;    // address of row 0 of the bank + offset in row
  uint64_t host_stride = 0;  // bytes between consecutive rows of the bank
  uint32_t bytes = 0;        // bytes per page; > 0
  uint32_t chunk_begin = 0;  // chunks of the item's earlier segments
};
static_assert(sizeof(PageCopySegment) == 40);

struct PageCopyHeader {
  uint32_t num_items = 0;     // <= kMaxCopyItems; 0 launches nothing
  uint32_t num_segments = 0;  // in [1, kMaxCopySegments]
  CopyDirection direction = CopyDirection::kToHost;
  uint32_t max_ctas = kDefaultMaxCtas;  // in [1, kMaxCtasLimit]
  uint32_t chunks_per_item = 0;  // sum over segments of ceil(bytes/kChunkBytes)
  uint32_t reserved = 0;
};

// Segments that fit beside the header and the item indices within
// kMaxKernelParamBytes, rounded down to a multiple of 64: 768. This caps the
// tensors of one pool (all page banks together) and of one snapshot.
inline constexpr uint32_t kMaxCopySegments =
    static_cast<uint32_t>((kMaxKernelParamBytes - sizeof(PageCopyHeader) -
                           2 * sizeof(uint32_t) * kMaxCopyItems) /
                          sizeof(PageCopySegment) / 64 * 64);
static_assert(kMaxCopySegments == 768);

struct PageCopyParams {
  PageCopyHeader header;
  uint32_t gpu_index[kMaxCopyItems] = {};   // page id or snapshot slot
  uint32_t host_index[kMaxCopyItems] = {};  // host row
  PageCopySegment segments[kMaxCopySegments];
};
static_assert(sizeof(PageCopyParams) <= kMaxKernelParamBytes,
              "PageCopyParams must fit in one kernel parameter block");
// Returns OK if `p` is well formed: counts in range, chunk_begin consistent
// with the segment sizes, chunks_per_item their total. Does not look at the
// addresses. Both the launcher and the reference call it.
absl::Status CheckPageCopyParams(const PageCopyParams& p);

// Number of CTAs a launch of `p` uses: enough warps for every chunk, capped
// at header.max_ctas, at least 1. REQUIRES: CheckPageCopyParams(p).ok().
uint32_t PageCopyGridSize(const PageCopyParams& p);

// The bytes one unit of work (one chunk of one segment of one item) moves.
struct PageCopyChunk {
  uint64_t src = 0;
  uint64_t dst = 0;
  uint32_t bytes = 0;
};

// Resolves work unit `unit` (in [0, num_items * chunks_per_item)), ordered
// item-major so consecutive units touch consecutive bytes of a host row.
// Shared by the kernel and the reference so both walk the same plan.
// REQUIRES: CheckPageCopyParams(p).ok().
KVTIER_HOST_DEVICE inline PageCopyChunk ResolvePageCopyChunk(
    const PageCopyParams& p, uint64_t unit) {
  const uint32_t item = static_cast<uint32_t>(unit / p.header.chunks_per_item);
  const uint32_t chunk = static_cast<uint32_t>(unit % p.header.chunks_per_item);
  // Last segment whose chunk_begin <= chunk (chunk_begin strictly increases).
  uint32_t lo = 0;
  uint32_t hi = p.header.num_segments;
  while (hi - lo > 1) {
    const uint32_t mid = lo + (hi - lo) / 2;
    if (p.segments[mid].chunk_begin <= chunk) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  const PageCopySegment& s = p.segments[lo];
  const uint64_t offset =
      static_cast<uint64_t>(chunk - s.chunk_begin) * kChunkBytes;
  const uint64_t left = s.bytes - offset;
  const uint64_t gpu = s.gpu_base +
                       static_cast<uint64_t>(p.gpu_index[item]) * s.gpu_stride +
                       offset;
  const uint64_t host =
      s.host_base + static_cast<uint64_t>(p.host_index[item]) * s.host_stride +
      offset;
  PageCopyChunk c;
  c.bytes = static_cast<uint32_t>(left < kChunkBytes ? left : kChunkBytes);
  if (p.header.direction == CopyDirection::kToHost) {
    c.src = gpu;
    c.dst = host;
  } else {
    c.src = host;
    c.dst = gpu;
  }
  return c;
}

// Reference implementation: performs the copy `p` describes with memcpy on
// the calling thread, walking the same chunks as the kernel. Every address
// must be an ordinary host pointer. Returns INVALID_ARGUMENT (copying
// nothing) if CheckPageCopyParams fails.
absl::Status RunPageCopyReference(const PageCopyParams& p);

}  // namespace kvtier::kernels

#endif  // KVTIER_KERNELS_PAGE_COPY_H_
