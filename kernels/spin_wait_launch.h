// Launcher of the spin kernel (kernels/spin_wait.h). CUDA builds only:
// include it under `#if KVTIER_HAVE_CUDA`.
#ifndef KVTIER_KERNELS_SPIN_WAIT_LAUNCH_H_
#define KVTIER_KERNELS_SPIN_WAIT_LAUNCH_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"

namespace kvtier::kernels {

// Enqueues on `stream` a one-thread kernel that returns once *device_flag
// != 0 (a device pointer to mapped host memory, cudaHostAllocMapped).
// INTERNAL naming the CUDA error when the launch fails.
absl::Status LaunchSpinUntil(const uint32_t* device_flag, cudaStream_t stream);

}  // namespace kvtier::kernels

#endif  // KVTIER_KERNELS_SPIN_WAIT_LAUNCH_H_
