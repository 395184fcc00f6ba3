// Device pool and device-tier index; see device_pool.h. The CUDA driver is
// reached only through dlopen/dlsym, so kvtierd carries no link-time CUDA
// dependency and maps no CUDA library unless a pool is requested.
#include "daemon/device_pool.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace kvtier::daemon {

uint64_t DeviceRowStride(uint64_t row_bytes) {
  return (row_bytes + 255) / 256 * 256;
}

// The handful of driver entry points the pool needs, with the driver's ABI
// spelled out here (cuda.h is not needed to build the daemon).
struct DevicePool::Driver {
  using CUresult = int;
  struct IpcHandle {
    char reserved[64];
  };
  void* lib = nullptr;
  CUresult (*cuInit)(unsigned) = nullptr;
  CUresult (*cuDeviceGetCount)(int*) = nullptr;
  CUresult (*cuDeviceGet)(int*, int) = nullptr;
  CUresult (*cuDeviceGetPCIBusId)(char*, int, int) = nullptr;
  CUresult (*cuDevicePrimaryCtxRetain)(void**, int) = nullptr;
  CUresult (*cuDevicePrimaryCtxRelease)(int) = nullptr;
  CUresult (*cuCtxSetCurrent)(void*) = nullptr;
  CUresult (*cuMemAlloc)(unsigned long long*, size_t) = nullptr;
  CUresult (*cuMemFree)(unsigned long long) = nullptr;
  CUresult (*cuMemsetD8)(unsigned long long, unsigned char, size_t) = nullptr;
  CUresult (*cuIpcGetMemHandle)(IpcHandle*, unsigned long long) = nullptr;
  CUresult (*cuGetErrorString)(CUresult, const char**) = nullptr;

  ~Driver() {
    if (lib != nullptr) dlclose(lib);
  }
  std::string Error(CUresult r) const {
    const char* s = nullptr;
    if (cuGetErrorString != nullptr) cuGetErrorString(r, &s);
    return absl::StrCat("CUDA driver error ", r,
                        s ? absl::StrCat(" (", s, ")") : std::string());
  }
};

namespace {

template <typename F>
bool Sym(void* lib, const char* name, F* out) {
  *out = reinterpret_cast<F>(dlsym(lib, name));
  return *out != nullptr;
}

}  // namespace

absl::StatusOr<std::unique_ptr<DevicePool>> DevicePool::Create(
    const DevicePoolOptions& o) {
  if (o.row_bytes == 0) {
    return absl::InvalidArgumentError("device_pool_row_bytes must be > 0");
  }
  const uint64_t stride = DeviceRowStride(o.row_bytes);
  if (o.bytes_per_gpu < stride) {
    return absl::InvalidArgumentError(
        absl::StrCat("device_pool_bytes (", o.bytes_per_gpu,
                     ") must hold at least one slot of ", stride, " bytes"));
  }
  for (int g : o.gpus) {
    if (g < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("device_pool_gpus: negative ordinal ", g));
    }
  }
  auto d = std::make_shared<Driver>();
  d->lib = dlopen(o.driver_library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (d->lib == nullptr) {
    const char* e = dlerror();
    return absl::FailedPreconditionError(absl::StrCat(
        "device_pool_bytes > 0 needs the CUDA driver: cannot load ",
        o.driver_library, ": ", e ? e : "unknown error"));
  }
  if (!Sym(d->lib, "cuInit", &d->cuInit) ||
      !Sym(d->lib, "cuDeviceGetCount", &d->cuDeviceGetCount) ||
      !Sym(d->lib, "cuDeviceGet", &d->cuDeviceGet) ||
      !Sym(d->lib, "cuDeviceGetPCIBusId", &d->cuDeviceGetPCIBusId) ||
      !Sym(d->lib, "cuDevicePrimaryCtxRetain", &d->cuDevicePrimaryCtxRetain) ||
      !Sym(d->lib, "cuDevicePrimaryCtxRelease_v2",
           &d->cuDevicePrimaryCtxRelease) ||
      !Sym(d->lib, "cuCtxSetCurrent", &d->cuCtxSetCurrent) ||
      !Sym(d->lib, "cuMemAlloc_v2", &d->cuMemAlloc) ||
      !Sym(d->lib, "cuMemFree_v2", &d->cuMemFree) ||
      !Sym(d->lib, "cuMemsetD8_v2", &d->cuMemsetD8) ||
      !Sym(d->lib, "cuIpcGetMemHandle", &d->cuIpcGetMemHandle) ||
      !Sym(d->lib, "cuGetErrorString", &d->cuGetErrorString)) {
    return absl::FailedPreconditionError(
        absl::StrCat(o.driver_library,
                     " lacks a CUDA driver entry point the device pool "
                     "needs (driver too old?)"));
  }
  if (int r = d->cuInit(0); r != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("device_pool_bytes > 0: cuInit failed: ", d->Error(r)));
  }
  int count = 0;
  if (int r = d->cuDeviceGetCount(&count); r != 0 || count == 0) {
    return absl::FailedPreconditionError(
        "device_pool_bytes > 0 but the CUDA driver reports no GPU");
  }
  std::vector<int> gpus = o.gpus;
  if (gpus.empty()) {
    for (int i = 0; i < count; ++i) gpus.push_back(i);
  }
  for (int g : gpus) {
    if (g >= count) {
      return absl::InvalidArgumentError(absl::StrCat(
          "device_pool_gpus: ordinal ", g, " but only ", count, " GPU(s)"));
    }
  }

  std::unique_ptr<DevicePool> pool(new DevicePool());
  pool->driver_ = d;
  for (int g : gpus) {
    Gpu gpu;
    gpu.ordinal = g;
    if (int r = d->cuDeviceGet(&gpu.device, g); r != 0) {
      return absl::InternalError(
          absl::StrCat("cuDeviceGet(", g, "): ", d->Error(r)));
    }
    if (int r = d->cuDevicePrimaryCtxRetain(&gpu.context, gpu.device); r != 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("GPU ", g, ": context: ", d->Error(r)));
    }
    pool->gpus_.push_back(gpu);  // From here the destructor releases it.
    Gpu& mine = pool->gpus_.back();
    d->cuCtxSetCurrent(mine.context);
    if (int r = d->cuMemAlloc(&mine.base, o.bytes_per_gpu); r != 0) {
      mine.base = 0;
      return absl::ResourceExhaustedError(
          absl::StrCat("device_pool_bytes: cannot allocate ", o.bytes_per_gpu,
                       " bytes on GPU ", g, ": ", d->Error(r)));
    }
    if (int r = d->cuMemsetD8(mine.base, 0, o.bytes_per_gpu); r != 0) {
      return absl::InternalError(
          absl::StrCat("GPU ", g, ": zeroing the pool: ", d->Error(r)));
    }
    Driver::IpcHandle h;
    if (int r = d->cuIpcGetMemHandle(&h, mine.base); r != 0) {
      return absl::InternalError(
          absl::StrCat("GPU ", g, ": cuIpcGetMemHandle: ", d->Error(r)));
    }
    char bus[32] = {0};
    d->cuDeviceGetPCIBusId(bus, sizeof(bus) - 1, gpu.device);
    DevicePoolExport e;
    e.device_ordinal = g;
    e.pci_bus_id = bus;
    e.ipc_handle.assign(h.reserved, sizeof(h.reserved));
    e.row_bytes = o.row_bytes;
    e.row_stride = stride;
    e.rows = o.bytes_per_gpu / stride;
    pool->exports_.push_back(std::move(e));
  }
  d->cuCtxSetCurrent(nullptr);
  return pool;
}

DevicePool::~DevicePool() {
  if (driver_ == nullptr) return;
  for (Gpu& g : gpus_) {
    driver_->cuCtxSetCurrent(g.context);
    if (g.base != 0) driver_->cuMemFree(g.base);
    driver_->cuCtxSetCurrent(nullptr);
    driver_->cuDevicePrimaryCtxRelease(g.device);
  }
}

// ------------------------------------------------------ DeviceSnapshotTier --

DeviceSnapshotTier::DeviceSnapshotTier(uint32_t rows) : rows_(rows) {
  free_.reserve(rows);
  for (uint32_t r = rows; r > 0; --r) free_.push_back(r - 1);
}

void DeviceSnapshotTier::FreeLocked(uint32_t row) {
  Row& r = rows_[row];
  r = Row();
  free_.push_back(row);
}

absl::StatusOr<uint32_t> DeviceSnapshotTier::Reserve() {
  absl::MutexLock l(&mu_);
  if (free_.empty()) {
    // A few dozen slots: a scan is cheaper than keeping an LRU list.
    uint32_t victim = UINT32_MAX;
    for (uint32_t i = 0; i < rows_.size(); ++i) {
      const Row& r = rows_[i];
      if (r.state != State::kCommitted || r.pins != 0) continue;
      if (victim == UINT32_MAX || r.last_use < rows_[victim].last_use) {
        victim = i;
      }
    }
    if (victim == UINT32_MAX) {
      return absl::ResourceExhaustedError(
          "device snapshot tier: every slot is reserved or pinned");
    }
    by_hash_.erase(rows_[victim].hash);
    FreeLocked(victim);
    ++evictions_;
  }
  const uint32_t row = free_.back();
  free_.pop_back();
  rows_[row].state = State::kReserved;
  rows_[row].last_use = ++clock_;
  return row;
}

absl::Status DeviceSnapshotTier::Commit(uint32_t row, const std::string& hash) {
  absl::MutexLock l(&mu_);
  if (row >= rows_.size() || rows_[row].state != State::kReserved) {
    return absl::InvalidArgumentError(
        absl::StrCat("row ", row, " is not a reserved device slot"));
  }
  if (hash.empty()) return absl::InvalidArgumentError("hash is empty");
  auto it = by_hash_.find(hash);
  if (it != by_hash_.end()) {
    Row& old = rows_[it->second];
    if (old.pins == 0) {
      FreeLocked(it->second);
    } else {
      old.state = State::kOrphan;  // Freed by its last Release.
    }
    it->second = row;
  } else {
    by_hash_.emplace(hash, row);
  }
  Row& r = rows_[row];
  r.state = State::kCommitted;
  r.hash = hash;
  r.last_use = ++clock_;
  return absl::OkStatus();
}

absl::Status DeviceSnapshotTier::Abort(uint32_t row) {
  absl::MutexLock l(&mu_);
  if (row >= rows_.size() || rows_[row].state != State::kReserved) {
    return absl::InvalidArgumentError(
        absl::StrCat("row ", row, " is not a reserved device slot"));
  }
  FreeLocked(row);
  return absl::OkStatus();
}

std::optional<DeviceSnapshotTier::Hit> DeviceSnapshotTier::Lookup(
    absl::Span<const std::string> hashes, uint32_t limit, bool pin) {
  absl::MutexLock l(&mu_);
  const uint32_t n =
      static_cast<uint32_t>(std::min<size_t>(hashes.size(), limit));
  for (uint32_t i = n; i > 0; --i) {
    auto it = by_hash_.find(hashes[i - 1]);
    if (it == by_hash_.end()) continue;
    Row& r = rows_[it->second];
    r.last_use = ++clock_;
    Hit hit;
    hit.page = i - 1;
    hit.row = it->second;
    if (pin) {
      ++r.pins;
      hit.lease_id = next_lease_++;
      leases_.emplace(hit.lease_id, it->second);
    }
    return hit;
  }
  return std::nullopt;
}

absl::Status DeviceSnapshotTier::Release(uint64_t lease_id) {
  absl::MutexLock l(&mu_);
  auto it = leases_.find(lease_id);
  if (it == leases_.end()) {
    return absl::NotFoundError(
        absl::StrCat("lease_id ", lease_id, " is not a device lease"));
  }
  Row& r = rows_[it->second];
  --r.pins;
  if (r.pins == 0 && r.state == State::kOrphan) FreeLocked(it->second);
  leases_.erase(it);
  return absl::OkStatus();
}

DeviceSnapshotTier::Usage DeviceSnapshotTier::usage() {
  absl::MutexLock l(&mu_);
  Usage u;
  u.rows = static_cast<uint32_t>(rows_.size());
  for (const Row& r : rows_) {
    switch (r.state) {
      case State::kFree:
        ++u.free;
        break;
      case State::kReserved:
        ++u.reserved;
        break;
      case State::kCommitted:
      case State::kOrphan:
        ++u.committed;
        break;
    }
    if (r.pins != 0) ++u.pinned;
  }
  u.evictions = evictions_;
  return u;
}

}  // namespace kvtier::daemon
