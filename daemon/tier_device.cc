// DeviceTiers: TierCore's device tier (tier_device.h).
//
// Thread-safety: thread-safe (each DeviceSnapshotTier locks itself).
#include "daemon/tier_device.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "daemon/peer_credentials.h"

namespace kvtier::daemon {

DeviceTiers::DeviceTiers(std::vector<DevicePoolExport> pools,
                         std::vector<std::string> namespaces)
    : pools_(std::move(pools)), namespaces_(std::move(namespaces)) {
  for (const DevicePoolExport& e : pools_) {
    tiers_.push_back(std::make_unique<DeviceSnapshotTier>(
        static_cast<uint32_t>(std::min<uint64_t>(e.rows, UINT32_MAX))));
  }
}

bool DeviceTiers::Serves(uint32_t pool, absl::string_view name) const {
  if (pool >= pools_.size()) return false;
  if (namespaces_.empty()) return true;
  for (const std::string& pattern : namespaces_) {
    NamespaceAclEntry entry;
    entry.pattern = pattern;
    if (entry.Matches(name)) return true;
  }
  return false;
}

void DeviceTiers::DescribePools(absl::string_view name,
                                v1::AttachResponse* resp) const {
  for (uint32_t i = 0; i < pools_.size(); ++i) {
    const DevicePoolExport& e = pools_[i];
    v1::DevicePool* p = resp->add_device_pools();
    p->set_device_ordinal(e.device_ordinal);
    p->set_pci_bus_id(e.pci_bus_id);
    // --device_pool_namespaces.
    if (!Serves(i, name)) {
      p->set_withheld(true);
      continue;
    }
    p->set_ipc_handle(e.ipc_handle);
    p->set_rows(e.rows);
    p->set_row_bytes(e.row_bytes);
    p->set_row_stride(e.row_stride);
    p->set_kind("snapshot");
  }
}

std::string DeviceTiers::Key(uint64_t namespace_id, uint32_t rank,
                             const HashKey& hash, uint32_t hash_bytes) {
  std::string key(sizeof(namespace_id) + sizeof(rank) + hash_bytes, '\0');
  std::memcpy(key.data(), &namespace_id, sizeof(namespace_id));
  std::memcpy(key.data() + sizeof(namespace_id), &rank, sizeof(rank));
  std::memcpy(key.data() + sizeof(namespace_id) + sizeof(rank),
              hash.bytes.data(), hash_bytes);
  return key;
}

absl::Status DeviceTiers::CheckReserve(uint32_t pool, uint32_t count,
                                       absl::string_view name,
                                       uint64_t snapshot_row_bytes) const {
  if (count == 0) return absl::OkStatus();
  if (pool >= tiers_.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "device_pool: ", pool, " but the daemon has ", tiers_.size(),
        " device pools (kvtierd --device_pool_bytes)"));
  }
  if (!Serves(pool, name)) {
    return absl::PermissionDeniedError(
        absl::StrCat("device_pool: pool ", pool, " does not serve namespace '",
                     name, "' (kvtierd --device_pool_namespaces)"));
  }
  const DevicePoolExport& e = pools_[pool];
  if (snapshot_row_bytes == 0 || snapshot_row_bytes > e.row_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "device_snapshots: the namespace's snapshots (", snapshot_row_bytes,
        " bytes) do not fit the device pool's slots (", e.row_bytes,
        " bytes)"));
  }
  if (count > e.rows) {
    return absl::InvalidArgumentError(
        absl::StrCat("device_snapshots: ", count, " exceeds the device pool's ",
                     e.rows, " slots"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<uint32_t>> DeviceTiers::Reserve(uint32_t pool,
                                                           uint32_t count) {
  std::vector<uint32_t> rows;
  for (uint32_t i = 0; i < count; ++i) {
    auto d = tiers_[pool]->Reserve();
    if (!d.ok()) {
      Abort(pool, rows);
      return d.status();
    }
    rows.push_back(*d);
  }
  return rows;
}

void DeviceTiers::Commit(
    uint32_t pool, const std::vector<std::pair<uint32_t, std::string>>& commits,
    const std::vector<uint32_t>& rows, const std::vector<bool>& placed) {
  for (const auto& [row, key] : commits) {
    (void)tiers_[pool]->Commit(row, key);
  }
  for (size_t i = 0; i < placed.size(); ++i) {
    if (!placed[i]) (void)tiers_[pool]->Abort(rows[i]);
  }
}

void DeviceTiers::Abort(uint32_t pool, const std::vector<uint32_t>& rows) {
  for (uint32_t row : rows) (void)tiers_[pool]->Abort(row);
}

void DeviceTiers::Release(uint32_t pool, uint64_t lease) {
  if (lease != 0) (void)tiers_[pool]->Release(lease);
}

std::optional<DeviceSnapshotTier::Hit> DeviceTiers::Lookup(
    uint32_t pool, const std::string& key, bool pin) {
  return tiers_[pool]->Lookup(absl::MakeConstSpan(&key, 1), 1, pin);
}

}  // namespace kvtier::daemon
