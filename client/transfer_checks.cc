// TransferEngine's one-time CUDA checks and error mapping
// (client/transfer_cuda.h).
//
// Thread-safety: stateless functions, safe from any thread.
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/pool.h"
#include "client/transfer_cuda.h"
#include "client/transfer_plan.h"

namespace kvtier::client::transfer_internal {

#if KVTIER_HAVE_CUDA

absl::Status CudaError(const std::string& what, cudaError_t err) {
  return absl::InternalError(absl::StrCat(
      what, " failed: ", cudaGetErrorName(err), ": ", cudaGetErrorString(err)));
}

namespace {

// Returns OK if the device can use [address, address + bytes) directly: device
// memory of `device` (want_host false), or host memory registered as mapped
// whose device pointer is `address` (want_host true). Checks the first and
// last byte.
absl::Status CheckRange(const std::string& what, uint64_t address,
                        uint64_t bytes, int device, bool want_host) {
  for (uint64_t a : {address, address + bytes - 1}) {
    cudaPointerAttributes attr{};
    const cudaError_t err =
        cudaPointerGetAttributes(&attr, reinterpret_cast<const void*>(a));
    if (err != cudaSuccess) {
      cudaGetLastError();  // not sticky; keep it from the engine's next check
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: cudaPointerGetAttributes(0x%x) failed: %s", what,
                          a, cudaGetErrorString(err)));
    }
    if (want_host) {
      if (attr.type != cudaMemoryTypeHost ||
          reinterpret_cast<uint64_t>(attr.devicePointer) != a) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "%s: 0x%x is not host memory registered with CUDA as mapped "
            "(cudaHostRegister with cudaHostRegisterMapped), given by its "
            "device pointer (cudaHostGetDevicePointer)",
            what, a));
      }
    } else if ((attr.type != cudaMemoryTypeDevice &&
                attr.type != cudaMemoryTypeManaged) ||
               attr.device != device) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: 0x%x is not memory of CUDA device %d", what, a, device));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckCudaPlan(const TransferPlan& plan) {
  const GpuPoolDescriptor& pool = plan.pool();
  for (size_t i = 0; i < pool.banks.size(); ++i) {
    for (size_t j = 0; j < pool.banks[i].tensors.size(); ++j) {
      const PoolTensor& t = pool.banks[i].tensors[j];
      if (absl::Status s = CheckRange(
              absl::StrCat("banks[", i, "].tensors[", j, "]"), t.base,
              (pool.num_pages - 1) * t.page_stride + t.bytes_per_page,
              pool.device, /*want_host=*/false);
          !s.ok()) {
        return s;
      }
    }
  }
  for (size_t k = 0; k < pool.snapshot.size(); ++k) {
    const PoolTensor& t = pool.snapshot[k];
    if (absl::Status s = CheckRange(
            absl::StrCat("snapshot[", k, "]"), t.base,
            (pool.num_snapshot_slots - 1) * t.page_stride + t.bytes_per_page,
            pool.device, /*want_host=*/false);
        !s.ok()) {
      return s;
    }
  }
  auto check_bank = [&](const std::string& what, const HostBankView& v) {
    return CheckRange(what, v.base, (v.rows - 1) * v.row_stride + v.row_bytes,
                      pool.device, /*want_host=*/true);
  };
  for (const NamedHostBank& b : plan.page_banks()) {
    if (absl::Status s =
            check_bank(absl::StrCat("page bank '", b.first, "'"), b.second);
        !s.ok()) {
      return s;
    }
  }
  if (plan.snapshot_bank()) {
    return check_bank("snapshot bank", *plan.snapshot_bank());
  }
  return absl::OkStatus();
}

#endif  // KVTIER_HAVE_CUDA

// Returns OK if the CUDA backend can run on `device`.
absl::Status CheckCudaAvailable(int device) {
#if KVTIER_HAVE_CUDA
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    cudaGetLastError();
    return absl::FailedPreconditionError(absl::StrCat(
        "CUDA backend: no CUDA device is present (cudaGetDeviceCount: ",
        err == cudaSuccess ? "0 devices" : cudaGetErrorString(err), ")"));
  }
  if (device < 0 || device >= count) {
    return absl::InvalidArgumentError(
        absl::StrCat("device ", device, " is not a CUDA device ordinal (",
                     count, " devices)"));
  }
  return absl::OkStatus();
#else
  (void)device;
  return absl::FailedPreconditionError(
      "CUDA backend: libkvtier was built without CUDA (KVTIER_HAVE_CUDA=0)");
#endif
}

}  // namespace kvtier::client::transfer_internal
