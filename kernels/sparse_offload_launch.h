// CUDA launchers of the sparse-attention offload kernels (see
// kernels/sparse_offload.h for their parameter blocks and semantics) and the
// one-time allocation of the ensure state. Only builds with CUDA.
//
// Thread-safety: the launchers may be called from any thread; launches on
// one stream run in the order they were enqueued. One EnsureState must only
// be used by one stream at a time (its step is not reentrant).

#ifndef KVTIER_KERNELS_SPARSE_OFFLOAD_LAUNCH_H_
#define KVTIER_KERNELS_SPARSE_OFFLOAD_LAUNCH_H_

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/sparse_offload.h"

namespace kvtier::kernels {

// Enqueues the mirror store on `stream`: for each entry i < min(*count,
// max_entries) with logical >= 0, copies the token's bytes of every segment
// from the pool to the mirror row (UVA). Reads the count on the device: no
// host synchronisation, fixed grid, capturable in a CUDA graph.
// REQUIRES: the pool is device memory of the current device; the banks are
// mapped host memory given by their device pointers; the pointers in the
// header are device-accessible. Returns INVALID_ARGUMENT (launching nothing)
// if CheckMirrorStoreParams fails, INTERNAL if the launch fails.
absl::Status LaunchMirrorStore(const MirrorStoreParams& p, cudaStream_t stream);

// Allocates (cudaMalloc, once) and initialises on `stream` the state of an
// ensure over `c`. INVALID_ARGUMENT if CheckEnsureConfig fails,
// RESOURCE_EXHAUSTED if the allocation fails. The caller frees it with
// FreeEnsureState after the last launch that uses it has finished.
absl::StatusOr<EnsureState> AllocateEnsureState(const EnsureConfig& c,
                                                cudaStream_t stream);
// Re-initialises the state on `stream` (all slots empty). Capturable.
absl::Status ResetEnsureState(const EnsureState& s, cudaStream_t stream);
void FreeEnsureState(EnsureState& s);

// Enqueues one ensure plan step (one CTA of 1024 threads) on `stream`.
// Fixed shape, reads nothing back: capturable in a CUDA graph.
absl::Status LaunchEnsurePlan(const EnsurePlanParams& p, cudaStream_t stream);

// Enqueues the copy of the missed pages (a fixed grid of max_ctas CTAs that
// reads *copy_count on the device). Capturable.
absl::Status LaunchEnsureCopy(const EnsureCopyParams& p, cudaStream_t stream);

// Decode-step proxies for bench/ensure_bench (not part of the offload path).
// LaunchHbmReadProxy reads `bytes` (a multiple of 16) of device memory at
// `p` with 16-byte loads over `ctas` CTAs: a bandwidth-bound stand-in for an
// attention or weight read. LaunchTokenStoreProxy writes one token of
// `bytes_per_token` (a multiple of 16) per sequence into each of `tensors`
// pool tensors (tensor t at pool + t * tensor_bytes, sequence s in slot s of
// `page_bytes`), reading them from `src` (seqs x tensors x bytes_per_token):
// a stand-in for store_kv.
absl::Status LaunchHbmReadProxy(const void* p, uint64_t bytes, uint32_t* sink,
                                uint32_t ctas, cudaStream_t stream);
absl::Status LaunchTokenStoreProxy(const void* src, void* pool, uint32_t seqs,
                                   uint32_t tensors, uint64_t tensor_bytes,
                                   uint32_t page_bytes,
                                   uint32_t bytes_per_token, uint32_t token,
                                   uint32_t ctas, cudaStream_t stream);

}  // namespace kvtier::kernels

#endif  // KVTIER_KERNELS_SPARSE_OFFLOAD_LAUNCH_H_
