// Sparse-attention offload: the write-through mirror and the device-side
// ensure (an LRU of P physical GPU slots over L logical pages).
//
// Mirror store: after the engine's store_kv has written (and, for fp8 pools,
// quantised) a token into the GPU pool, MirrorStore copies the same token's
// bytes of every pool tensor (K/V codes, fp32 scales, ...) from the pool to
// the session's mirror rows over UVA. The pool is the source of truth: the
// mirror never sees pre-quantisation values. Input: a fixed-size array of
// MirrorEntry (padded with logical = -1) and a count, both in device memory.
//
// Ensure: input the selected logical pages of a batch, a fixed-size int32
// array padded with -1. The plan kernel (one CTA) marks resident pages used,
// picks victims among the slots not selected this step, rebinds them, writes
// the copy list and the logical->physical translated table; the copy kernel
// then moves every missed page (all tensors of all banks) from the mirror in
// one launch. A slot is always clean (write-through), so eviction is a
// rebind. State lives in device memory allocated once (EnsureState).
//
// Exact semantics of one ensure step (the GPU and the reference agree on
// them bit for bit):
//  1. step = ++*state.step.
//  2. Each entry i of `selected`, in order: -1 is padding; a value outside
//     [0, L) is dropped (drops += 1, translated[i] = -1); a resident page
//     marks its slot used this step (stamp = step).
//  3. Misses: the distinct valid non-resident pages, in order of first
//     occurrence. Candidates: slots whose stamp != step. If there are more
//     misses than candidates, the later misses are dropped (drops += excess).
//  4. Victims: the M candidates with the smallest (stamp, slot) keys, taken
//     in ascending slot order; the k-th miss goes to the k-th victim. An
//     empty slot has stamp 0 and logical -1.
//  5. copy_slot[k], copy_row[k] = victim, mirror_rows[miss]; *copy_count = M.
//  6. translated[i] = logical_slot[selected[i]] (or -1).
// EnsureConfig refuses max_batch * max_selected > num_slots up front, which
// guarantees step 3 never drops a valid miss.
//
// This header is plain C++ (no CUDA types): the reference implementations
// and the planners include it in builds without CUDA. The launchers are in
// kernels/sparse_offload_launch.h.
//
// Thread-safety: everything here is a pure function of its arguments, except
// the reference runners, which write the memory their params point to.

#ifndef KVTIER_KERNELS_SPARSE_OFFLOAD_H_
#define KVTIER_KERNELS_SPARSE_OFFLOAD_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "kernels/page_copy.h"

namespace kvtier::kernels {

// ------------------------------------------------------------------ mirror --

// Most pool tensors (over all banks) one mirror store covers.
inline constexpr uint32_t kMaxMirrorSegments = 512;

// One pool tensor and where its bytes sit in a mirror row. Token t of slot s
// is [pool_base + s * pool_page_stride + t * bytes_per_token,
// +bytes_per_token); in the mirror it is at bank_base + row * bank_row_stride +
// t * bytes_per_token (bank_base already includes the tensor's offset in a
// row).
struct MirrorSegment {
  uint64_t pool_base = 0;
  uint64_t pool_page_stride = 0;
  uint64_t bank_base = 0;
  uint64_t bank_row_stride = 0;
  uint32_t bytes_per_token = 0;  // > 0
  // 1: a per-page tensor (e.g. block scales not divisible by tokens): every
  // store of any token of the page copies its bytes_per_token bytes (the
  // whole page's) at offset 0. 0: token-major, token t at t*bytes_per_token.
  uint32_t per_page = 0;
};
static_assert(sizeof(MirrorSegment) == 40);

// One stored token: the engine's logical page, the GPU slot it sits in and
// the token's offset within the page. logical < 0: padding, skipped.
struct MirrorEntry {
  int32_t logical = -1;
  int32_t slot = -1;
  int32_t token = 0;
};
static_assert(sizeof(MirrorEntry) == 12);

struct MirrorStoreHeader {
  uint32_t num_segments = 0;            // in [1, kMaxMirrorSegments]
  uint32_t tokens_per_page = 0;         // > 0
  uint32_t max_entries = 0;             // size of the entries array; > 0
  uint32_t num_logical = 0;             // L: size of mirror_rows; > 0
  uint32_t num_slots = 0;               // P: slots of the pool; > 0
  uint32_t max_ctas = kDefaultMaxCtas;  // in [1, kMaxCtasLimit]
  // Device pointers (host pointers for the reference).
  const MirrorEntry* entries = nullptr;   // [max_entries]
  const uint32_t* count = nullptr;        // entries used this step (clamped)
  const uint32_t* mirror_rows = nullptr;  // [num_logical]: logical -> row
  unsigned long long* drops = nullptr;    // += 1 per malformed entry
  // Revocation (fence protocol): when set and non-zero, the store writes
  // nothing — the session that reserved the mirror rows has ended, and a
  // captured graph replayed later must not touch them. Device-visible
  // (mapped host memory, written by the host when the session ends).
  const volatile uint32_t* revoked = nullptr;
};

struct MirrorStoreParams {
  MirrorStoreHeader header;
  MirrorSegment segments[kMaxMirrorSegments];
};
static_assert(sizeof(MirrorStoreParams) <= kMaxKernelParamBytes);

// Returns OK if `p` is well formed (counts in range, pointers set, sizes
// non-zero); INVALID_ARGUMENT naming the field otherwise.
absl::Status CheckMirrorStoreParams(const MirrorStoreParams& p);

// CTAs a mirror store launch uses (one warp per entry x segment, capped).
uint32_t MirrorStoreGridSize(const MirrorStoreParams& p);

// Reference: the mirror store with memcpy (nothing at all once revoked).
// An entry with logical >= L,
// slot >= P, or token >= tokens_per_page (or slot/token < 0 with logical
// >= 0) is skipped and counted in *drops.
absl::Status RunMirrorStoreReference(const MirrorStoreParams& p);

// ------------------------------------------------------------------ ensure --

struct EnsureConfig {
  uint32_t num_slots = 0;     // P
  uint32_t num_logical = 0;   // L
  uint32_t max_batch = 0;     // sequences per step
  uint32_t max_selected = 0;  // selected pages per sequence
};

// OK if the configuration can never overflow: every field > 0, and
// max_batch * max_selected <= num_slots (else INVALID_ARGUMENT that says so).
absl::Status CheckEnsureConfig(const EnsureConfig& c);

// Ensure state: device arrays (host arrays for the reference), allocated
// once. `max_entries` = max_batch * max_selected.
struct EnsureState {
  uint32_t num_slots = 0;
  uint32_t num_logical = 0;
  uint32_t max_entries = 0;
  int32_t* slot_logical = nullptr;      // [P], -1 empty
  int32_t* logical_slot = nullptr;      // [L], -1 not resident
  uint32_t* slot_stamp = nullptr;       // [P], step of last use, 0 never
  unsigned long long* claim = nullptr;  // [L] scratch: step<<32 | ~entry
  uint32_t* step = nullptr;             // [1]
  unsigned long long* drops = nullptr;  // [1]
  int32_t* miss_logical = nullptr;      // [max_entries] scratch
  uint32_t* copy_slot = nullptr;        // [max_entries]
  uint32_t* copy_row = nullptr;         // [max_entries]
  uint32_t* copy_count = nullptr;       // [1]
};

// Bytes of the state arrays for `c`, and the initial values: slots empty,
// stamps 0, step 0, drops 0, claim 0.
size_t EnsureStateBytes(const EnsureConfig& c);

// Lays the arrays of `c` out in `memory` (EnsureStateBytes(c) bytes,
// 16-aligned). Does not initialise them.
EnsureState LayOutEnsureState(const EnsureConfig& c, void* memory);

// Initialises the arrays of a host-memory state (the reference's).
void ResetEnsureStateHost(const EnsureState& s);

struct EnsurePlanParams {
  EnsureState state;
  const int32_t* selected = nullptr;      // [max_entries], -1 padded
  int32_t* translated = nullptr;          // [max_entries]
  const uint32_t* mirror_rows = nullptr;  // [num_logical]
};

absl::Status CheckEnsurePlanParams(const EnsurePlanParams& p);

// Reference of the plan kernel: one ensure step over host memory.
absl::Status RunEnsurePlanReference(const EnsurePlanParams& p);

// The copy of the missed pages: item k moves every segment from host row
// copy_row[k] to GPU slot copy_slot[k], k < *copy_count.
struct EnsureCopyHeader {
  uint32_t num_segments = 0;     // in [1, kMaxEnsureSegments]
  uint32_t chunks_per_item = 0;  // as PageCopyHeader
  uint32_t max_ctas = kDefaultMaxCtas;
  uint32_t max_items = 0;  // state.max_entries
  const uint32_t* copy_slot = nullptr;
  const uint32_t* copy_row = nullptr;
  const uint32_t* copy_count = nullptr;
};

inline constexpr uint32_t kMaxEnsureSegments = 768;

struct EnsureCopyParams {
  EnsureCopyHeader header;
  // gpu_* describe the pool (slot = gpu index), host_* the mirror bank row.
  PageCopySegment segments[kMaxEnsureSegments];
};
static_assert(sizeof(EnsureCopyParams) <= kMaxKernelParamBytes);

absl::Status CheckEnsureCopyParams(const EnsureCopyParams& p);

// Reference of the copy kernel (memcpy over the same chunks).
absl::Status RunEnsureCopyReference(const EnsureCopyParams& p);

// Chunk `chunk` of an item of a segment table (the PageCopy chunk math with
// indices given explicitly), direction host -> GPU.
KVTIER_HOST_DEVICE inline PageCopyChunk ResolveEnsureChunk(
    const PageCopySegment* segments, uint32_t num_segments, uint64_t gpu_index,
    uint64_t host_index, uint32_t chunk) {
  uint32_t lo = 0;
  uint32_t hi = num_segments;
  while (hi - lo > 1) {
    const uint32_t mid = lo + (hi - lo) / 2;
    if (segments[mid].chunk_begin <= chunk) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  const PageCopySegment& s = segments[lo];
  const uint64_t offset =
      static_cast<uint64_t>(chunk - s.chunk_begin) * kChunkBytes;
  const uint64_t left = s.bytes - offset;
  PageCopyChunk c;
  c.bytes = static_cast<uint32_t>(left < kChunkBytes ? left : kChunkBytes);
  c.dst = s.gpu_base + gpu_index * s.gpu_stride + offset;
  c.src = s.host_base + host_index * s.host_stride + offset;
  return c;
}

}  // namespace kvtier::kernels

#endif  // KVTIER_KERNELS_SPARSE_OFFLOAD_H_
