// DeviceTiers: TierCore's device tier. One DeviceSnapshotTier (the index of
// a device pool's snapshot slots, daemon/device_pool.h) per device pool
// kvtierd exports, which namespaces each pool serves
// (--device_pool_namespaces), and the key a namespace's snapshot has there.
// Reserve, Commit, Abort, Lookup and Release of TierCore act on the host
// banks and, through this, on the slots the same request names.
//
// Calls with no slot (an empty list, lease 0, count 0) do nothing, whatever
// the pool: a request that names a pool but no slots is never checked
// against the pools.
//
// Thread-safety: thread-safe. The pools are fixed at construction; each
// DeviceSnapshotTier locks itself, after any Namespace::mu (a leaf).
#ifndef KVTIER_DAEMON_TIER_DEVICE_H_
#define KVTIER_DAEMON_TIER_DEVICE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "daemon/device_pool.h"
#include "daemon/prefix_index.h"
#include "kvtier/v1/tier.pb.h"

namespace kvtier::daemon {

class DeviceTiers {
 public:
  // `pools` as exported (daemon/device_pool.h); `namespaces`: the patterns
  // of the namespaces they serve (as in --namespace_acl: a name, or a
  // prefix and '*'; empty: every namespace).
  DeviceTiers(std::vector<DevicePoolExport> pools,
              std::vector<std::string> namespaces);
  DeviceTiers(const DeviceTiers&) = delete;
  DeviceTiers& operator=(const DeviceTiers&) = delete;

  // Number of device pools.
  size_t size() const { return tiers_.size(); }
  // True when pool `pool` exists and serves namespace `name`.
  bool Serves(uint32_t pool, absl::string_view name) const;
  // Adds every pool to an Attach's response for namespace `name`: its
  // ordinal and bus id, and, where it serves `name`, its IPC handle and
  // shape (a pool's handle maps all of its GPU memory); elsewhere withheld.
  void DescribePools(absl::string_view name, v1::AttachResponse* resp) const;

  // A snapshot's key in a pool: namespace id, rank and hash, so namespaces
  // share a pool's slots without ever matching each other.
  static std::string Key(uint64_t namespace_id, uint32_t rank,
                         const HashKey& hash, uint32_t hash_bytes);

  // Reserve's checks of `count` slots of pool `pool` for snapshots of
  // `snapshot_row_bytes` (0: the namespace has none) in namespace `name`:
  // INVALID_ARGUMENT naming device_pool or device_snapshots, or
  // PERMISSION_DENIED naming device_pool. OK when count is 0.
  absl::Status CheckReserve(uint32_t pool, uint32_t count,
                            absl::string_view name,
                            uint64_t snapshot_row_bytes) const;
  // Reserves `count` slots of pool `pool`: all of them, or none and the
  // pool's refusal. REQUIRES: CheckReserve was OK.
  absl::StatusOr<std::vector<uint32_t>> Reserve(uint32_t pool, uint32_t count);
  // Makes each (row, key) of `commits` visible, and returns the rows[i] of
  // `rows` whose placed[i] is false. REQUIRES: placed.size() == rows.size();
  // the rows are reserved slots of `pool`.
  void Commit(uint32_t pool,
              const std::vector<std::pair<uint32_t, std::string>>& commits,
              const std::vector<uint32_t>& rows,
              const std::vector<bool>& placed);
  // Returns reserved slots `rows` of pool `pool`.
  void Abort(uint32_t pool, const std::vector<uint32_t>& rows);
  // Ends pin `lease` of pool `pool` (0: none).
  void Release(uint32_t pool, uint64_t lease);
  // The committed slot of `key` in pool `pool`, touched and, with `pin`,
  // pinned until Release. REQUIRES: pool < size().
  std::optional<DeviceSnapshotTier::Hit> Lookup(uint32_t pool,
                                                const std::string& key,
                                                bool pin);

 private:
  const std::vector<DevicePoolExport> pools_;
  const std::vector<std::string> namespaces_;
  // pools_ order; the vector is immutable after construction.
  std::vector<std::unique_ptr<DeviceSnapshotTier>> tiers_;
};

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_TIER_DEVICE_H_
