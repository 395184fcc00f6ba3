// DevicePoolHandle: an engine's view of one of the daemon's device pools
// (daemon-owned GPU memory of snapshot slots, kvtierd --device_pool_bytes),
// opened once with cudaIpcOpenMemHandle.
//
//   auto pool = kvtier::client::DevicePoolHandle::Open(*ns, 0);  // current GPU
//   auto res = ns->Reserve(0, 1, /*device_snapshots=*/1, /*device_pool=*/0);
//   pool->SaveSnapshot(res->device_snapshot_rows()[0], state, bytes, stream);
//   ... commit with device_snapshots placements ...
//   auto lease = ns->LookupWithDevice(hashes, 0);
//   pool->RestoreSnapshot(*lease, dst, bytes, stream);  // HBM or host tier
//
// RestoreSnapshot picks the source: the device slot when the lease has one
// (a device-to-device copy at HBM speed), else the host snapshot bank (over
// UVA); the engine's code is the same either way.
//
// The memory belongs to the daemon: it survives the engine, and an engine
// that restarts opens it again and finds what was committed. When the
// daemon's session ends (it stopped, died or restarted) its memory is gone:
// every call then answers UNAVAILABLE and never touches the old pointer.
// A daemon that dies while a copy is in flight is outside what this can
// catch (the copy may fault the engine's context), as with any peer GPU.
//
// Thread-safety: thread-safe after Open (immutable; CUDA calls are).
// Copies run on the caller's stream; nothing synchronises the device.
#ifndef KVTIER_CLIENT_DEVICE_POOL_CLIENT_H_
#define KVTIER_CLIENT_DEVICE_POOL_CLIENT_H_

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/client.h"

namespace kvtier::client {

class DevicePoolHandle {
 public:
  // Opens ns.device_pools()[index] on the current CUDA device, which must be
  // the pool's GPU (matched by PCI bus id). INVALID_ARGUMENT naming `index`;
  // FAILED_PRECONDITION without a device or on another GPU; UNAVAILABLE
  // when the session that exported it has ended. REQUIRES: `ns` outlives
  // the handle.
  static absl::StatusOr<std::unique_ptr<DevicePoolHandle>> Open(
      const Namespace& ns, uint32_t index);
  ~DevicePoolHandle();  // cudaIpcCloseMemHandle.
  DevicePoolHandle(const DevicePoolHandle&) = delete;
  DevicePoolHandle& operator=(const DevicePoolHandle&) = delete;

  const DevicePoolInfo& info() const { return info_; }
  // OK while the exporting daemon session is open; UNAVAILABLE after.
  absl::Status Check() const;
  // Device address of slot `row`. INVALID_ARGUMENT naming row; UNAVAILABLE
  // per Check.
  absl::StatusOr<void*> Slot(uint32_t row) const;
  // Queues a copy of `bytes` (<= row_bytes) from device memory `src` into
  // slot `row` on `stream` (cudaStream_t).
  absl::Status SaveSnapshot(uint32_t row, const void* src, size_t bytes,
                            void* stream) const;
  // Queues the restore of the lease's snapshot into device memory `dst`:
  // from this pool's slot when lease.has_device_snapshot(), else from the
  // host snapshot bank. FAILED_PRECONDITION when the lease has no snapshot.
  absl::Status RestoreSnapshot(const Lease& lease, void* dst, size_t bytes,
                               void* stream) const;

 private:
  DevicePoolHandle(const Namespace& ns, DevicePoolInfo info, void* base)
      : ns_(ns), info_(std::move(info)), base_(static_cast<uint8_t*>(base)) {}
  const Namespace& ns_;
  const DevicePoolInfo info_;
  uint8_t* const base_;
};

}  // namespace kvtier::client

#endif  // KVTIER_CLIENT_DEVICE_POOL_CLIENT_H_
