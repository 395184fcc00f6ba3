// The spin kernel (kernels/spin_wait.h).
#include <string>

#include "kernels/spin_wait_launch.h"

namespace kvtier::kernels {
namespace {

__global__ void SpinUntilKernel(const volatile uint32_t* flag) {
  while (*flag == 0) {
#if __CUDA_ARCH__ >= 700
    __nanosleep(1000);
#endif
  }
}

}  // namespace

absl::Status LaunchSpinUntil(const uint32_t* device_flag, cudaStream_t stream) {
  SpinUntilKernel<<<1, 1, 0, stream>>>(device_flag);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) {
    return absl::InternalError(std::string("spin kernel launch: ") +
                               cudaGetErrorString(e));
  }
  return absl::OkStatus();
}

}  // namespace kvtier::kernels
