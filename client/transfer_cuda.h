// What TransferEngine's CUDA code shares (client/transfer_engine.cc,
// client/transfer_checks.cc): CUDA errors as absl::Status, running on a
// device, and the checks Create makes once. Internal to libkvtier.
//
// Thread-safety: stateless functions, safe from any thread.
#ifndef KVTIER_CLIENT_TRANSFER_CUDA_H_
#define KVTIER_CLIENT_TRANSFER_CUDA_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "client/transfer_plan.h"

#if KVTIER_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace kvtier::client::transfer_internal {

// Returns OK if the CUDA backend can run on `device`: FAILED_PRECONDITION
// without CUDA or a device, INVALID_ARGUMENT for a bad ordinal.
absl::Status CheckCudaAvailable(int device);

#if KVTIER_HAVE_CUDA

// INTERNAL naming `what` and the CUDA error.
absl::Status CudaError(const std::string& what, cudaError_t err);

// Runs `f` with `device` current and restores the caller's current device.
template <typename F>
absl::Status OnDevice(int device, F&& f) {
  int previous = 0;
  if (cudaError_t err = cudaGetDevice(&previous); err != cudaSuccess) {
    return CudaError("cudaGetDevice", err);
  }
  if (previous != device) {
    if (cudaError_t err = cudaSetDevice(device); err != cudaSuccess) {
      return CudaError(absl::StrCat("cudaSetDevice(", device, ")"), err);
    }
  }
  absl::Status status = f();
  if (previous != device) {
    if (cudaError_t err = cudaSetDevice(previous);
        err != cudaSuccess && status.ok()) {
      status = CudaError(absl::StrCat("cudaSetDevice(", previous, ")"), err);
    }
  }
  return status;
}

// Returns OK if every tensor of the plan's pool is memory of its device and
// every host bank is host memory registered as mapped and given by its
// device pointer (cudaPointerGetAttributes on each range's first and last
// byte); INVALID_ARGUMENT naming the first that is not. REQUIRES: the
// pool's device is current.
absl::Status CheckCudaPlan(const TransferPlan& plan);

#endif  // KVTIER_HAVE_CUDA

}  // namespace kvtier::client::transfer_internal

#endif  // KVTIER_CLIENT_TRANSFER_CUDA_H_
