// TransferEngine: runs TransferPlan slices on the CUDA kernel or on the
// memcpy reference. The CUDA parts compile only when KVTIER_HAVE_CUDA.
//
// Thread-safety: see transfer_engine.h.

#include "client/transfer_engine.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/types/span.h"
#include "client/transfer_plan.h"
#include "kernels/page_copy.h"
#include "kvtier/pool.h"

#if KVTIER_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "kernels/page_copy_launch.h"
#endif

namespace kvtier::client {
namespace {

using kernels::CopyDirection;
using kernels::PageCopyParams;

#if KVTIER_HAVE_CUDA

absl::Status CudaError(const std::string& what, cudaError_t err) {
  return absl::InternalError(absl::StrCat(
      what, " failed: ", cudaGetErrorName(err), ": ", cudaGetErrorString(err)));
}

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

}  // namespace

absl::StatusOr<std::unique_ptr<TransferEngine>> TransferEngine::Create(
    Backend backend, const GpuPoolDescriptor& pool,
    std::vector<NamedHostBank> page_banks,
    std::optional<HostBankView> snapshot_bank, const TransferOptions& options) {
  if (backend == Backend::kCuda) {
    if (absl::Status s = CheckCudaAvailable(pool.device); !s.ok()) return s;
  } else if (backend != Backend::kReference) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown backend ", static_cast<int>(backend)));
  }
  absl::StatusOr<TransferPlan> plan =
      TransferPlan::Create(pool, page_banks, snapshot_bank, options);
  if (!plan.ok()) return plan.status();
#if KVTIER_HAVE_CUDA
  if (backend == Backend::kCuda) {
    if (absl::Status s =
            OnDevice(pool.device, [&] { return CheckCudaPlan(*plan); });
        !s.ok()) {
      return s;
    }
  }
#endif
  return std::unique_ptr<TransferEngine>(
      new TransferEngine(backend, *std::move(plan)));
}

absl::Status TransferEngine::Evict(absl::Span<const uint32_t> gpu_pages,
                                   absl::Span<const uint32_t> rows,
                                   void* stream) {
  return CopyPages(CopyDirection::kToHost, gpu_pages, rows, stream);
}

absl::Status TransferEngine::Rehydrate(absl::Span<const uint32_t> gpu_pages,
                                       absl::Span<const uint32_t> rows,
                                       void* stream) {
  return CopyPages(CopyDirection::kFromHost, gpu_pages, rows, stream);
}

absl::Status TransferEngine::SaveSnapshot(uint32_t slot, uint32_t row,
                                          void* stream) {
  return CopySnapshot(CopyDirection::kToHost, slot, row, stream);
}

absl::Status TransferEngine::RestoreSnapshot(uint32_t slot, uint32_t row,
                                             void* stream) {
  return CopySnapshot(CopyDirection::kFromHost, slot, row, stream);
}

absl::Status TransferEngine::CopyPages(CopyDirection direction,
                                       absl::Span<const uint32_t> gpu_pages,
                                       absl::Span<const uint32_t> rows,
                                       void* stream) {
  if (absl::Status s = plan_.CheckPages(direction, gpu_pages, rows); !s.ok()) {
    return s;
  }
  const size_t slices = TransferPlan::NumSlices(gpu_pages.size());
  if (slices == 0) return absl::OkStatus();
  // ~31 KiB on the stack: the kernel's parameter block, rebuilt per slice.
  PageCopyParams params;
  for (size_t k = 0; k < slices; ++k) {
    plan_.FillPageSlice(direction, gpu_pages, rows, k, &params);
    if (absl::Status s = Run(params, stream); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("slice ", k, " of ", slices,
                                                 ": ", s.message()));
    }
  }
  return absl::OkStatus();
}

absl::Status TransferEngine::CopySnapshot(CopyDirection direction,
                                          uint32_t slot, uint32_t row,
                                          void* stream) {
  if (absl::Status s = plan_.CheckSnapshot(slot, row); !s.ok()) return s;
  PageCopyParams params;
  plan_.FillSnapshot(direction, slot, row, &params);
  return Run(params, stream);
}

absl::Status TransferEngine::Run(const PageCopyParams& params, void* stream) {
  absl::Status status;
  if (backend_ == Backend::kReference) {
    status = kernels::RunPageCopyReference(params);
  } else {
#if KVTIER_HAVE_CUDA
    status = OnDevice(plan_.pool().device, [&] {
      return kernels::LaunchPageCopy(params, static_cast<cudaStream_t>(stream));
    });
#else
    status = absl::FailedPreconditionError("built without CUDA");
#endif
  }
  if (status.ok()) slices_launched_.fetch_add(1, std::memory_order_relaxed);
  return status;
}

}  // namespace kvtier::client
