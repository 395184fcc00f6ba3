// CUDA launcher of the page copy kernel (see kernels/page_copy.h for the
// parameter block). Only builds with CUDA (KVTIER_HAVE_CUDA).
//
// Thread-safety: LaunchPageCopy may be called from any thread; launches on
// one stream run in the order they were enqueued.

#ifndef KVTIER_KERNELS_PAGE_COPY_LAUNCH_H_
#define KVTIER_KERNELS_PAGE_COPY_LAUNCH_H_

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "kernels/page_copy.h"

namespace kvtier::kernels {

// Enqueues one page copy kernel on `stream` (on the current device) and
// returns without waiting for it. The kernel reads and writes GPU memory and
// mapped host memory directly (UVA), 16 bytes at a time where the source, the
// destination and their offsets allow, and allocates nothing: the launch may
// be captured in a CUDA graph. Uses PageCopyGridSize(p) CTAs of
// kThreadsPerCta threads and no shared memory.
//
// REQUIRES: every gpu address is device memory of the current device; every
// host address is host memory mapped for the device (cudaHostRegister with
// cudaHostRegisterMapped), given as its device pointer; the destinations of
// one launch do not overlap one another or a source.
// Returns INVALID_ARGUMENT (launching nothing) if CheckPageCopyParams fails,
// OK without launching if num_items is 0, INTERNAL with CUDA's message if
// cudaGetLastError reports an error after the launch.
absl::Status LaunchPageCopy(const PageCopyParams& p, cudaStream_t stream);

}  // namespace kvtier::kernels

#endif  // KVTIER_KERNELS_PAGE_COPY_LAUNCH_H_
