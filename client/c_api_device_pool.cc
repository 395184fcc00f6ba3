// The C ABI of the daemon's device pools (client/device_pool_client.h) and
// of the device-snapshot variants of lookup, reserve and commit
// (Namespace::LookupWithDevice, Reserve with device snapshots,
// Reservation::Commit with device placements). Argument checks, status codes
// and the last error as in c_api.cc.
//
// Thread-safety: kvt_device_pool_handle is thread-safe (DevicePoolHandle is
// immutable after Open); the namespace and reservation functions are as
// thread-safe as their handles (kvtier/kvtier.h).
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "client/c_api_internal.h"
#include "client/client.h"
#include "client/device_pool_client.h"
#include "kvtier/kvtier.h"

struct kvt_device_pool_handle {
  std::unique_ptr<kvtier::client::DevicePoolHandle> pool;
};

namespace {

using kvtier::capi::Bytes;
using kvtier::capi::Fill;
using kvtier::capi::Placements;
using kvtier::capi::Set;

void Fill(kvt_device_pool_info* out, const kvtier::client::DevicePoolInfo& p) {
  out->device_ordinal = p.device_ordinal;
  out->pci_bus_id = p.pci_bus_id.c_str();
  out->ipc_handle = reinterpret_cast<const uint8_t*>(p.ipc_handle.data());
  out->ipc_handle_len = p.ipc_handle.size();
  out->rows = p.rows;
  out->row_bytes = p.row_bytes;
  out->row_stride = p.row_stride;
  out->withheld = p.withheld;
}

}  // namespace

#pragma GCC visibility push(default)
extern "C" {

uint32_t kvt_num_device_pools(const kvt_namespace* ns) {
  return ns == nullptr ? 0
                       : static_cast<uint32_t>(ns->ns->device_pools().size());
}

int32_t kvt_device_pools_valid(const kvt_namespace* ns) {
  return ns != nullptr && ns->ns->device_pools_valid();
}

kvt_status kvt_device_pool(const kvt_namespace* ns, uint32_t index,
                           kvt_device_pool_info* out) {
  KVT_REQUIRE(ns != nullptr, "ns: NULL");
  KVT_REQUIRE(out != nullptr, "out: NULL");
  const auto& pools = ns->ns->device_pools();
  if (index >= pools.size()) {
    return Set(absl::OutOfRangeError(
        absl::StrCat("index: ", index, " is not below ", pools.size(),
                     " device pools (kvtierd --device_pool_bytes)")));
  }
  Fill(out, pools[index]);
  return Set(absl::OkStatus());
}

kvt_status kvt_device_pool_open(const kvt_namespace* ns, uint32_t index,
                                kvt_device_pool_handle** out) {
  KVT_REQUIRE(ns != nullptr, "ns: NULL");
  KVT_REQUIRE(out != nullptr, "out: NULL");
  auto pool = kvtier::client::DevicePoolHandle::Open(*ns->ns, index);
  if (!pool.ok()) return Set(pool.status());
  *out = new kvt_device_pool_handle{*std::move(pool)};
  return Set(absl::OkStatus());
}

void kvt_device_pool_close(kvt_device_pool_handle* pool) { delete pool; }

kvt_status kvt_device_pool_describe(const kvt_device_pool_handle* pool,
                                    kvt_device_pool_info* out) {
  KVT_REQUIRE(pool != nullptr, "pool: NULL");
  KVT_REQUIRE(out != nullptr, "out: NULL");
  Fill(out, pool->pool->info());
  return Set(absl::OkStatus());
}

kvt_status kvt_device_pool_check(const kvt_device_pool_handle* pool) {
  KVT_REQUIRE(pool != nullptr, "pool: NULL");
  return Set(pool->pool->Check());
}

kvt_status kvt_device_pool_slot(const kvt_device_pool_handle* pool,
                                uint32_t row, void** out) {
  KVT_REQUIRE(pool != nullptr, "pool: NULL");
  KVT_REQUIRE(out != nullptr, "out: NULL");
  auto slot = pool->pool->Slot(row);
  if (!slot.ok()) return Set(slot.status());
  *out = *slot;
  return Set(absl::OkStatus());
}

kvt_status kvt_device_pool_save(const kvt_device_pool_handle* pool,
                                uint32_t row, const void* src, size_t bytes,
                                void* stream) {
  KVT_REQUIRE(pool != nullptr, "pool: NULL");
  KVT_REQUIRE(src != nullptr || bytes == 0, "src: NULL");
  return Set(pool->pool->SaveSnapshot(row, src, bytes, stream));
}

kvt_status kvt_device_pool_restore(const kvt_device_pool_handle* pool,
                                   const kvt_lease* lease, void* dst,
                                   size_t bytes, void* stream) {
  KVT_REQUIRE(pool != nullptr, "pool: NULL");
  KVT_REQUIRE(lease != nullptr, "lease: NULL");
  KVT_REQUIRE(dst != nullptr || bytes == 0, "dst: NULL");
  return Set(pool->pool->RestoreSnapshot(lease->lease, dst, bytes, stream));
}

kvt_status kvt_lookup_with_device(kvt_namespace* ns, const uint8_t* hashes,
                                  size_t num_hashes, uint32_t device_pool,
                                  int32_t pin, kvt_lease** out) {
  KVT_REQUIRE(ns != nullptr, "ns: NULL");
  KVT_REQUIRE(out != nullptr, "out: NULL");
  KVT_REQUIRE(hashes != nullptr || num_hashes == 0, "hashes: NULL");
  auto lease = ns->ns->LookupWithDevice(
      Bytes(hashes, num_hashes * ns->ns->hasher().hash_bytes()), device_pool,
      pin != 0);
  if (!lease.ok()) return Set(lease.status());
  *out = new kvt_lease{*std::move(lease)};
  return Set(absl::OkStatus());
}

int32_t kvt_lease_has_device_snapshot(const kvt_lease* l) {
  return l != nullptr && l->lease.has_device_snapshot();
}

uint32_t kvt_lease_device_snapshot_row(const kvt_lease* l) {
  return l == nullptr ? 0 : l->lease.device_snapshot_row();
}

kvt_status kvt_reserve_with_device(kvt_namespace* ns, uint32_t pages,
                                   uint32_t snapshots,
                                   uint32_t device_snapshots,
                                   uint32_t device_pool,
                                   kvt_reservation** out) {
  KVT_REQUIRE(ns != nullptr, "ns: NULL");
  KVT_REQUIRE(out != nullptr, "out: NULL");
  auto r = ns->ns->Reserve(pages, snapshots, device_snapshots, device_pool);
  if (!r.ok()) return Set(r.status());
  *out = new kvt_reservation{*std::move(r)};
  return Set(absl::OkStatus());
}

uint32_t kvt_reservation_num_device_snapshot_rows(const kvt_reservation* r) {
  return r == nullptr ? 0 : r->reservation.device_snapshot_rows().size();
}

const uint32_t* kvt_reservation_device_snapshot_rows(const kvt_reservation* r) {
  return r == nullptr ? nullptr : r->reservation.device_snapshot_rows().data();
}

kvt_status kvt_commit_with_device(kvt_reservation* r, const uint8_t* parent,
                                  size_t parent_len, const uint8_t* hashes,
                                  size_t num_hashes,
                                  const kvt_snapshot_placement* snaps,
                                  size_t num_snaps,
                                  const kvt_snapshot_placement* device_snaps,
                                  size_t num_device_snaps,
                                  kvt_commit_result* result) {
  KVT_REQUIRE(r != nullptr, "reservation: NULL");
  KVT_REQUIRE(hashes != nullptr || num_hashes == 0, "hashes: NULL");
  const uint32_t hash_bytes = r->reservation.hash_bytes();
  auto placements = Placements(snaps, num_snaps, hash_bytes, "snaps");
  if (!placements.ok()) return Set(placements.status());
  auto device =
      Placements(device_snaps, num_device_snaps, hash_bytes, "device_snaps");
  if (!device.ok()) return Set(device.status());
  auto c = r->reservation.Commit(Bytes(parent, parent_len),
                                 Bytes(hashes, num_hashes * hash_bytes),
                                 *placements, *device);
  if (!c.ok()) return Set(c.status());
  Fill(result, *c);
  delete r;
  return Set(absl::OkStatus());
}

}  // extern "C"
#pragma GCC visibility pop
