// The GPU-side handles of libkvtier's C++ layer (kvtier/kvtier.hpp, which
// includes this file), over the C ABI's device pools and mirrors:
//
// - DevicePool (kvt_device_pool_*): a daemon device pool (kvtierd
//   --device_pool_bytes: daemon-owned GPU memory of snapshot slots) opened
//   over CUDA IPC on the current device; Namespace::OpenDevicePool makes one.
//   A pool is valid only for the daemon session that reported it: once
//   Namespace::device_pools_valid() turns false (the daemon stopped or
//   restarted) every call on it answers UNAVAILABLE; attach again.
// - Mirror (kvt_mirror_*): the sparse-attention write-through mirror: L
//   logical pages in session-private rows (a reservation, invisible to
//   lookups), a graph-capturable store kernel from the engine's pool into
//   them, and a device-side LRU (Ensure) that makes P pool pages a cache over
//   them; Adopt commits mirrored pages into the prefix index.
//   Namespace::CreateMirror makes one. When the session ends (the daemon
//   restarted) the mirror is revoked: its store, in captured graphs too,
//   writes nothing more; a new mirror is needed.
//
// The device-snapshot variants of lookup, reserve and commit are Namespace
// (LookupWithDevice, ReserveWithDevice), Lease and Reservation methods. The
// semantics of every call are those of the C function it wraps
// (kvtier/kvtier.h). REQUIRES: the Namespace outlives its DevicePools and
// Mirrors.
//
// Thread-safety: as the C ABI: a DevicePool may be used from many threads;
// a Mirror by one thread and one stream at a time. DevicePoolInfo and
// MirrorOptions are plain values.
#ifndef KVTIER_KVTIER_DEVICE_HPP_
#define KVTIER_KVTIER_DEVICE_HPP_

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "kvtier/kvtier.h"
#include "kvtier/kvtier_lease.hpp"
#include "kvtier/kvtier_status.hpp"
#include "kvtier/kvtier_transfer.hpp"

namespace kvtier {

// A device pool as the daemon reported it (kvt_device_pool_info). The views
// are valid while the Namespace (for Namespace::device_pool) or the
// DevicePool (for DevicePool::Describe) is open.
struct DevicePoolInfo {
  int32_t device_ordinal = 0;   // In the daemon's CUDA numbering.
  std::string_view pci_bus_id;  // Match GPUs by this.
  std::string_view ipc_handle;  // A cudaIpcMemHandle_t; empty when withheld.
  uint64_t rows = 0;            // Snapshot slots.
  uint64_t row_bytes = 0;       // Usable bytes of one slot.
  uint64_t row_stride = 0;      // Bytes from slot s to s + 1.
  // The pool does not serve this namespace (kvtierd
  // --device_pool_namespaces) and cannot be opened; listed so that indices
  // stay the daemon's.
  bool withheld = false;
};

namespace internal {

inline DevicePoolInfo ToDevicePoolInfo(const kvt_device_pool_info& p) {
  DevicePoolInfo out;
  out.device_ordinal = p.device_ordinal;
  if (p.pci_bus_id != nullptr) out.pci_bus_id = p.pci_bus_id;
  if (p.ipc_handle != nullptr) {
    out.ipc_handle = std::string_view(
        reinterpret_cast<const char*>(p.ipc_handle), p.ipc_handle_len);
  }
  out.rows = p.rows;
  out.row_bytes = p.row_bytes;
  out.row_stride = p.row_stride;
  out.withheld = p.withheld != 0;
  return out;
}

}  // namespace internal

// A daemon device pool opened on the current CUDA device (the pool's GPU).
// The destructor closes the IPC mapping: REQUIRES no queued copy uses the
// pool's memory by then.
class DevicePool {
 public:
  // The opened pool's description.
  Result<DevicePoolInfo> Describe() const {
    kvt_device_pool_info p{};
    const kvt_status s = kvt_device_pool_describe(h_.get(), &p);
    if (s != KVT_OK) return Status::FromC(s);
    return internal::ToDevicePoolInfo(p);
  }
  // OK while the exporting daemon session is open; UNAVAILABLE after.
  Status Check() const {
    return Status::FromC(kvt_device_pool_check(h_.get()));
  }
  // Device address of slot `row` (slot s starts at the base + s *
  // row_stride). INVALID_ARGUMENT naming row; UNAVAILABLE as Check.
  Result<void*> Slot(uint32_t row) const {
    void* p = nullptr;
    const kvt_status s = kvt_device_pool_slot(h_.get(), row, &p);
    if (s != KVT_OK) return Status::FromC(s);
    return p;
  }
  // Queues a copy of `bytes` (<= row_bytes) from device memory `src` into
  // slot `row` on `stream` (a cudaStream_t; null: the default stream).
  Status Save(uint32_t row, const void* src, size_t bytes, void* stream) const {
    return Status::FromC(
        kvt_device_pool_save(h_.get(), row, src, bytes, stream));
  }
  // Queues the restore of `lease`'s snapshot into device memory `dst`: from
  // the pool's slot when lease.has_device_snapshot(), else from the host
  // snapshot bank (over UVA). FAILED_PRECONDITION when the lease holds no
  // snapshot.
  Status Restore(const Lease& lease, void* dst, size_t bytes,
                 void* stream) const {
    return Status::FromC(
        kvt_device_pool_restore(h_.get(), lease.h_.get(), dst, bytes, stream));
  }

  // The C handle, for calls this header does not wrap. Owned by *this.
  kvt_device_pool_handle* c_handle() const { return h_.get(); }

 private:
  friend class Namespace;
  explicit DevicePool(kvt_device_pool_handle* h) : h_(h) {}
  internal::Handle<kvt_device_pool_handle, kvt_device_pool_close> h_;
};

// One stored token: the engine's logical page, the pool page ("slot") it
// sits in, the token's offset in the page; logical < 0: padding, skipped.
// The C struct itself, as store entries live in device memory the engine
// fills.
using MirrorEntry = kvt_mirror_entry;

struct MirrorOptions {
  uint32_t logical_pages = 0;  // L: rows reserved for the mirror; > 0.
  // P: pool pages the ensure manages, from 0; <= pool.num_pages.
  uint32_t gpu_slots = 0;
  uint32_t max_batch = 0;          // Sequences per Ensure.
  uint32_t max_selected = 0;       // Selected pages per sequence.
  uint32_t max_store_entries = 0;  // Entries per Store; > 0.
  uint32_t copy_ctas = 0;          // CTAs of the miss copy; 0: 32.
  uint32_t store_ctas = 0;         // CTAs of the mirror store; 0: 16.
  // kReference (tests without a GPU): the pool's "device addresses" are
  // host pointers and Store and Ensure run the kernels' references at once
  // (pass a null stream); no graph capture.
  Backend backend = Backend::kCuda;
};

// The write-through mirror. The destructor frees the device state and
// returns the rows: REQUIRES no launch that uses the mirror is pending
// (synchronise the stream first).
class Mirror {
 public:
  // Row of each logical page (index = logical page; size L).
  Span<uint32_t> rows() const {
    return {kvt_mirror_rows(h_.get()), kvt_mirror_num_rows(h_.get())};
  }
  // The id of the reservation holding the rows (names the mirror to the
  // daemon).
  uint64_t reservation_id() const {
    return kvt_mirror_reservation_id(h_.get());
  }

  // Enqueues the mirror store on `stream`: entries[0, min(*count,
  // max_store_entries)) (device pointers; host pointers for the reference)
  // go from the pool to the mirror rows. Graph-capturable.
  Status Store(const MirrorEntry* entries, const uint32_t* count,
               void* stream) {
    return Status::FromC(kvt_mirror_store(h_.get(), entries, count, stream));
  }
  // Enqueues one ensure step over `selected` (device, max_batch x
  // max_selected logical pages, -1 padded); writes the slots to `translated`
  // (device, same shape; -1 for padding and drops). Graph-capturable.
  Status Ensure(const int32_t* selected, int32_t* translated, void* stream) {
    return Status::FromC(
        kvt_mirror_ensure(h_.get(), selected, translated, stream));
  }
  // Counters (one uint64_t each, device memory; host memory for the
  // reference): entries the store dropped (malformed), entries the ensure
  // dropped (out-of-range pages). Valid while the Mirror is.
  const void* store_drops() const { return kvt_mirror_store_drops(h_.get()); }
  const void* ensure_drops() const { return kvt_mirror_ensure_drops(h_.get()); }
  // True once the session that reserved the rows ended: Store writes
  // nothing from then on.
  bool revoked() const { return kvt_mirror_revoked(h_.get()) != 0; }

  // Adopts mirrored pages into the prefix index: the daemon copies rows
  // rows()[logical_pages[i]] host-to-host into fresh rows and commits them
  // under `hashes` (one per page, hash_bytes each, packed) below `parent`.
  // The mirror keeps its rows. REQUIRES: the pages' stores have completed.
  // INVALID_ARGUMENT naming logical_pages[i] when not below L; UNAVAILABLE
  // when the mirror's session ended.
  Result<CommitResult> Adopt(Span<uint32_t> logical_pages,
                             std::string_view parent, std::string_view hashes) {
    size_t num_hashes = 0;
    if (Status s = internal::CountHashes(hashes, hash_bytes_, &num_hashes);
        !s.ok()) {
      return s;
    }
    kvt_commit_result r{};
    const kvt_status s =
        kvt_mirror_adopt(h_.get(), logical_pages.data(), logical_pages.size(),
                         internal::Bytes(parent), parent.size(),
                         internal::Bytes(hashes), num_hashes, &r);
    if (s != KVT_OK) return Status::FromC(s);
    return internal::ToCommitResult(r);
  }

  // The C handle, for calls this header does not wrap. Owned by *this.
  kvt_mirror* c_handle() const { return h_.get(); }

 private:
  friend class Namespace;
  Mirror(kvt_mirror* h, uint32_t hash_bytes) : h_(h), hash_bytes_(hash_bytes) {}
  internal::Handle<kvt_mirror, kvt_mirror_close> h_;
  uint32_t hash_bytes_ = 0;
};

}  // namespace kvtier

#endif  // KVTIER_KVTIER_DEVICE_HPP_
