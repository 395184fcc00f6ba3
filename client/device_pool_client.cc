// DevicePoolHandle (see client/device_pool_client.h). Built against the CUDA
// runtime when KVTIER_HAVE_CUDA; without it Open reports "no device".
#include "client/device_pool_client.h"

#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

#if KVTIER_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace kvtier::client {

absl::StatusOr<std::unique_ptr<DevicePoolHandle>> DevicePoolHandle::Open(
    const Namespace& ns, uint32_t index) {
  if (index >= ns.device_pools().size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "index: ", index, " but the daemon reported ", ns.device_pools().size(),
        " device pools (kvtierd --device_pool_bytes)"));
  }
  if (!ns.device_pools_valid()) {
    return absl::UnavailableError(
        "device pool: the daemon session that exported it has ended; attach "
        "again");
  }
  const DevicePoolInfo& info = ns.device_pools()[index];
  if (info.withheld) {
    return absl::PermissionDeniedError(absl::StrCat(
        "device pool ", index,
        " does not serve this namespace: the daemon withheld its handle "
        "(kvtierd --device_pool_namespaces)"));
  }
#if KVTIER_HAVE_CUDA
  if (info.ipc_handle.size() != sizeof(cudaIpcMemHandle_t)) {
    return absl::DataLossError(absl::StrCat("device pool ", index,
                                            ": ipc_handle of ",
                                            info.ipc_handle.size(), " bytes"));
  }
  int device = -1;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();
    return absl::FailedPreconditionError("device pool: no CUDA device");
  }
  char bus[32] = {0};
  cudaDeviceGetPCIBusId(bus, sizeof(bus) - 1, device);
  if (!info.pci_bus_id.empty() &&
      absl::AsciiStrToLower(bus) != absl::AsciiStrToLower(info.pci_bus_id)) {
    return absl::FailedPreconditionError(
        absl::StrCat("device pool ", index, " lives on GPU ", info.pci_bus_id,
                     " but the current device ", device, " is ", bus));
  }
  cudaIpcMemHandle_t h;
  std::memcpy(&h, info.ipc_handle.data(), sizeof(h));
  void* base = nullptr;
  if (cudaError_t e =
          cudaIpcOpenMemHandle(&base, h, cudaIpcMemLazyEnablePeerAccess);
      e != cudaSuccess) {
    cudaGetLastError();
    return absl::UnavailableError(
        absl::StrCat("device pool ", index,
                     ": cudaIpcOpenMemHandle: ", cudaGetErrorString(e)));
  }
  return std::unique_ptr<DevicePoolHandle>(
      new DevicePoolHandle(ns, info, base));
#else
  (void)info;
  return absl::FailedPreconditionError(
      "device pool: libkvtier was built without CUDA");
#endif
}

DevicePoolHandle::~DevicePoolHandle() {
#if KVTIER_HAVE_CUDA
  if (base_ != nullptr && cudaIpcCloseMemHandle(base_) != cudaSuccess) {
    cudaGetLastError();
  }
#endif
}

absl::Status DevicePoolHandle::Check() const {
  if (!ns_.device_pools_valid()) {
    return absl::UnavailableError(
        "device pool: the daemon that owns it stopped or restarted (its GPU "
        "memory is gone); attach again");
  }
  return absl::OkStatus();
}

absl::StatusOr<void*> DevicePoolHandle::Slot(uint32_t row) const {
  if (row >= info_.rows) {
    return absl::InvalidArgumentError(absl::StrCat(
        "row: ", row, " is not below the pool's ", info_.rows, " slots"));
  }
  if (absl::Status s = Check(); !s.ok()) return s;
  return static_cast<void*>(base_ + row * info_.row_stride);
}

namespace {

absl::Status CopyAsync(void* dst, const void* src, size_t bytes, void* stream,
                       const char* what) {
#if KVTIER_HAVE_CUDA
  if (cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault,
                                      static_cast<cudaStream_t>(stream));
      e != cudaSuccess) {
    cudaGetLastError();
    return absl::InternalError(
        absl::StrCat(what, ": cudaMemcpyAsync: ", cudaGetErrorString(e)));
  }
  return absl::OkStatus();
#else
  (void)dst, (void)src, (void)bytes, (void)stream;
  return absl::FailedPreconditionError(
      absl::StrCat(what, ": libkvtier was built without CUDA"));
#endif
}

}  // namespace

absl::Status DevicePoolHandle::SaveSnapshot(uint32_t row, const void* src,
                                            size_t bytes, void* stream) const {
  if (bytes > info_.row_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("bytes: ", bytes, " exceed the slot's ", info_.row_bytes));
  }
  auto slot = Slot(row);
  if (!slot.ok()) return slot.status();
  return CopyAsync(*slot, src, bytes, stream, "SaveSnapshot");
}

absl::Status DevicePoolHandle::RestoreSnapshot(const Lease& lease, void* dst,
                                               size_t bytes,
                                               void* stream) const {
  if (!lease.has_snapshot()) {
    return absl::FailedPreconditionError(
        "RestoreSnapshot: the lease holds no snapshot");
  }
  if (lease.has_device_snapshot()) {
    if (bytes > info_.row_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "bytes: ", bytes, " exceed the slot's ", info_.row_bytes));
    }
    auto slot = Slot(lease.device_snapshot_row());
    if (!slot.ok()) return slot.status();
    return CopyAsync(dst, *slot, bytes, stream, "RestoreSnapshot (device)");
  }
  const BankMapping* bank = ns_.snapshot_bank();
  if (bank == nullptr || !bank->cuda_registered) {
    return absl::FailedPreconditionError(
        "RestoreSnapshot: no CUDA-registered host snapshot bank");
  }
  if (bytes > bank->row_bytes || lease.snapshot_row() >= bank->rows) {
    return absl::InvalidArgumentError(
        absl::StrCat("bytes: ", bytes, " or snapshot row ",
                     lease.snapshot_row(), " outside the host snapshot bank"));
  }
  return CopyAsync(dst, bank->base + lease.snapshot_row() * bank->row_stride,
                   bytes, stream, "RestoreSnapshot (host)");
}

}  // namespace kvtier::client
