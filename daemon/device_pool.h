// Device pool: daemon-owned GPU memory that engines reach over CUDA IPC, and
// the small device-tier index of the snapshot rows it holds.
//
// Why the daemon owns it: an engine restart frees everything the engine
// allocated; memory the daemon allocates survives, so a restarted engine
// finds its hottest recurrent-state snapshots still in HBM and restores them
// device-to-device instead of across PCIe.
//
// CUDA context only when asked for. kvtierd does not link the CUDA runtime
// or driver at all: DevicePool::Create loads the driver (libcuda.so.1) with
// dlopen the first time a pool is requested (--device_pool_bytes > 0), and
// nothing else in the daemon touches CUDA. With the flag off no CUDA library
// is ever mapped into the daemon, which tests/device_pool_test.cc checks in
// /proc/<pid>/maps. Allocations are plain cuMemAlloc (IPC-exportable), one
// per GPU, exported with cuIpcGetMemHandle; a cuIpcMemHandle and a
// cudaIpcMemHandle_t are the same 64 bytes, so engines open it with
// cudaIpcOpenMemHandle.
//
// Index design (the choice the issue asks for): a separate small
// device-tier index per (namespace, GPU), keyed by the same block hashes as
// the host PrefixIndex, rather than a second snapshot row inside every
// PrefixIndex node. Reasons: the device tier holds a few dozen rows where the
// host tier holds millions of pages, so a flat hash map with its own LRU is
// both smaller and simpler than widening every node; its eviction is
// independent of the host tier's (device first: a device row is evicted
// under device pressure while the host copy of the same snapshot stays; the
// host tier's eviction never needs to look at device rows); and a device row
// is only served when the host index still holds the pages up to it, so a
// lookup's answer is min(host match, deepest device snapshot within it) —
// computed by the caller from the two indexes, each consistent on its own.
// Rows have the states free -> reserved -> committed (visible) -> free, like
// host rows; a committed row may be pinned by leases, and only unpinned
// committed rows are evicted.
//
// Thread-safety: DeviceSnapshotTier is thread-safe (one absl::Mutex).
// DevicePool is immutable after Create; its destructor frees the memory and
// must not run while a CUDA call of another thread uses it.
#ifndef KVTIER_DAEMON_DEVICE_POOL_H_
#define KVTIER_DAEMON_DEVICE_POOL_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"

namespace kvtier::daemon {

// What a client needs to open one GPU's pool; plain data (no CUDA types), so
// TierCore can hand it out in Attach without depending on CUDA.
struct DevicePoolExport {
  int device_ordinal = 0;   // CUDA ordinal in the daemon's device numbering.
  std::string pci_bus_id;   // "0000:3b:00.0": engines match GPUs by this.
  std::string ipc_handle;   // 64 bytes: a cudaIpcMemHandle_t.
  uint64_t rows = 0;        // Snapshot slots.
  uint64_t row_bytes = 0;   // Usable bytes per slot.
  uint64_t row_stride = 0;  // Bytes between slot starts (256-aligned).
};

struct DevicePoolOptions {
  // GPUs to allocate on (CUDA ordinals); empty: every visible GPU.
  std::vector<int> gpus;
  // Bytes per GPU. REQUIRES: > 0 and >= row_stride.
  uint64_t bytes_per_gpu = 0;
  // Bytes of one snapshot slot. REQUIRES: > 0.
  uint64_t row_bytes = 0;
  // Library to load; tests point it at a missing file.
  std::string driver_library = "libcuda.so.1";
};

// Rounds a slot up to the alignment the copy kernels want (256 bytes).
uint64_t DeviceRowStride(uint64_t row_bytes);

// One GPU allocation per GPU, owned by the daemon for its lifetime.
class DevicePool {
 public:
  // Loads the CUDA driver, retains each GPU's primary context, allocates
  // bytes_per_gpu there (zeroed) and exports it. Errors: INVALID_ARGUMENT
  // naming device_pool_bytes / device_pool_row_bytes / device_pool_gpus;
  // FAILED_PRECONDITION when the driver cannot be loaded or reports no GPU;
  // RESOURCE_EXHAUSTED when an allocation fails. On error nothing stays
  // allocated.
  static absl::StatusOr<std::unique_ptr<DevicePool>> Create(
      const DevicePoolOptions& options);
  ~DevicePool();  // Frees every allocation, releases the contexts.
  DevicePool(const DevicePool&) = delete;
  DevicePool& operator=(const DevicePool&) = delete;

  const std::vector<DevicePoolExport>& exports() const { return exports_; }

 private:
  struct Driver;
  struct Gpu {
    int ordinal = 0;
    int device = 0;
    void* context = nullptr;
    unsigned long long base = 0;  // CUdeviceptr.
  };
  DevicePool() = default;

  std::shared_ptr<Driver> driver_;
  std::vector<Gpu> gpus_;
  std::vector<DevicePoolExport> exports_;
};

// The device-tier index of one pool (one namespace on one GPU): which block
// hash's snapshot lives in which slot.
class DeviceSnapshotTier {
 public:
  // REQUIRES: rows > 0.
  explicit DeviceSnapshotTier(uint32_t rows);

  // Hands out a slot for the caller to fill: a free one, else the least
  // recently used unpinned committed one (evicted: its hash stops matching).
  // RESOURCE_EXHAUSTED when every slot is reserved or pinned.
  absl::StatusOr<uint32_t> Reserve();
  // Makes a reserved slot visible under `hash`. A hash already present
  // moves to the new slot and its old slot is freed (unless pinned, then
  // it stays until released and is freed then). INVALID_ARGUMENT naming
  // `row` when the slot is not reserved, or `hash` when empty.
  absl::Status Commit(uint32_t row, const std::string& hash);
  // Returns a reserved slot. INVALID_ARGUMENT naming `row` otherwise.
  absl::Status Abort(uint32_t row);

  struct Hit {
    uint32_t page = 0;      // Index into `hashes`: the snapshot after it.
    uint32_t row = 0;       // Slot holding it.
    uint64_t lease_id = 0;  // Non-zero when pinned.
  };
  // The deepest i < limit with a committed slot for hashes[i]; touches it
  // (LRU) and, with `pin`, pins it until Release(lease_id).
  std::optional<Hit> Lookup(absl::Span<const std::string> hashes,
                            uint32_t limit, bool pin);
  // Unpins. NOT_FOUND naming lease_id when unknown.
  absl::Status Release(uint64_t lease_id);

  struct Usage {
    uint32_t rows = 0, free = 0, reserved = 0, committed = 0, pinned = 0;
    uint64_t evictions = 0;
  };
  Usage usage();

 private:
  enum class State : uint8_t { kFree, kReserved, kCommitted, kOrphan };
  struct Row {
    State state = State::kFree;
    std::string hash;
    uint32_t pins = 0;
    uint64_t last_use = 0;
  };
  void FreeLocked(uint32_t row) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  std::vector<Row> rows_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, uint32_t> by_hash_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, uint32_t> leases_ ABSL_GUARDED_BY(mu_);
  std::vector<uint32_t> free_ ABSL_GUARDED_BY(mu_);
  uint64_t clock_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_lease_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t evictions_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_DEVICE_POOL_H_
