// The few CUDA runtime calls libkvtier's host code makes.
#include "client/cuda_host.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

#if KVTIER_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace kvtier::client {

#if KVTIER_HAVE_CUDA

bool CudaDevicePresent() {
  static const bool present = [] {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      cudaGetLastError();  // Clear the sticky "no device" error.
      return false;
    }
    return n > 0;
  }();
  return present;
}

std::string CurrentDevicePciBusId() {
  if (!CudaDevicePresent()) return "";
  int device = 0;
  char id[32] = {};
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetPCIBusId(id, sizeof(id), device) != cudaSuccess) {
    cudaGetLastError();
    return "";
  }
  return id;
}

absl::Status RegisterHostRange(void* p, uint64_t bytes) {
  if (!CudaDevicePresent()) {
    return absl::FailedPreconditionError("no CUDA device present");
  }
  int device = 0;
  cudaGetDevice(&device);
  int same_address = 0;
  cudaDeviceGetAttribute(&same_address,
                         cudaDevAttrCanUseHostPointerForRegisteredMem, device);
  if (!same_address) {
    return absl::FailedPreconditionError(absl::StrCat(
        "device ", device,
        " cannot use host pointers for registered memory; "
        "kvtier needs UVA with identical host and device addresses"));
  }
  auto* base = static_cast<uint8_t*>(p);
  for (uint64_t off = 0; off < bytes; off += kMaxRegisterChunk) {
    const uint64_t n = std::min(kMaxRegisterChunk, bytes - off);
    cudaError_t err = cudaHostRegister(
        base + off, n, cudaHostRegisterMapped | cudaHostRegisterPortable);
    if (err != cudaSuccess) {
      cudaGetLastError();
      if (off > 0) UnregisterHostRange(p, off);
      return absl::InternalError(absl::StrCat("cudaHostRegister(", n,
                                              " bytes at offset ", off,
                                              "): ", cudaGetErrorString(err)));
    }
  }
  return absl::OkStatus();
}

void UnregisterHostRange(void* p, uint64_t bytes) {
  auto* base = static_cast<uint8_t*>(p);
  for (uint64_t off = 0; off < bytes; off += kMaxRegisterChunk) {
    if (cudaHostUnregister(base + off) != cudaSuccess) cudaGetLastError();
  }
}

absl::Status LaunchHostCallback(void* stream, void (*fn)(void*), void* arg) {
  if (!CudaDevicePresent()) {
    return absl::FailedPreconditionError("no CUDA device present");
  }
  cudaError_t err =
      cudaLaunchHostFunc(static_cast<cudaStream_t>(stream), fn, arg);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return absl::InternalError(
        absl::StrCat("cudaLaunchHostFunc: ", cudaGetErrorString(err)));
  }
  return absl::OkStatus();
}

#else  // !KVTIER_HAVE_CUDA

bool CudaDevicePresent() { return false; }

std::string CurrentDevicePciBusId() { return ""; }

absl::Status RegisterHostRange(void*, uint64_t) {
  return absl::FailedPreconditionError("libkvtier was built without CUDA");
}

void UnregisterHostRange(void*, uint64_t) {}

absl::Status LaunchHostCallback(void*, void (*)(void*), void*) {
  return absl::FailedPreconditionError("libkvtier was built without CUDA");
}

#endif  // KVTIER_HAVE_CUDA

}  // namespace kvtier::client
