// TierNamespace's side of the Fence RPC (daemon/tier_fence.cc): checking a
// reported item against the namespace, matching it to a hold its process's
// ended sessions left, keeping what the restart fence holds for a process
// from before the restart, and finding what a complete report left out.
//
// Thread-safety: as annotated in tier_namespace.h.
#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "daemon/tier_namespace.h"

namespace kvtier::daemon {

absl::Status TierNamespace::CheckFenceItem(const v1::FenceItem& it,
                                           const std::string& field,
                                           HashKey* lease_key) const {
  if (it.tp_rank() >= layout.tp_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".tp_rank: ", it.tp_rank(),
                     " but the namespace has tp_size ", layout.tp_size()));
  }
  for (uint32_t row : it.page_rows()) {
    if (row >= page_rows) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".page_rows: row ", row, " is out of range"));
    }
  }
  for (uint32_t row : it.snapshot_rows()) {
    if (row >= snapshot_rows) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".snapshot_rows: row ", row, " is out of range"));
    }
  }
  if (!it.lease_hash().empty()) {
    if (it.lease_hash().size() != hash_bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".lease_hash: must be ", hash_bytes,
                       " bytes, got ", it.lease_hash().size()));
    }
    lease_key->bytes.fill(0);
    std::memcpy(lease_key->bytes.data(), it.lease_hash().data(), hash_bytes);
  }
  return absl::OkStatus();
}

uint64_t TierNamespace::MatchHold(const InstanceKey& instance,
                                  const HolderKey& process, uint32_t rank,
                                  const v1::FenceItem& it,
                                  const HashKey& lease_key,
                                  const absl::flat_hash_set<uint64_t>& kept) {
  const bool is_lease = !it.lease_hash().empty();
  for (auto& [id, h] : holds) {
    if (h.instance != instance || !(h.origin == process) || kept.contains(id)) {
      continue;
    }
    const bool shared =
        !h.restart_page_rows.empty() || !h.restart_snapshot_rows.empty();
    const std::vector<uint32_t>& pages =
        shared ? h.restart_page_rows : h.page_rows;
    const std::vector<uint32_t>& snaps =
        shared ? h.restart_snapshot_rows : h.snapshot_rows;
    const bool match =
        is_lease
            ? h.pin_node != kNoNode && index->NodeHasKey(h.pin_node, lease_key)
            : h.pin_node == kNoNode && h.rank == rank &&
                  std::equal(pages.begin(), pages.end(), it.page_rows().begin(),
                             it.page_rows().end()) &&
                  std::equal(snaps.begin(), snaps.end(),
                             it.snapshot_rows().begin(),
                             it.snapshot_rows().end());
    if (match) {
      h.kind = FenceHold::Kind::kReported;
      return id;
    }
  }
  return 0;
}

uint64_t TierNamespace::HoldRestartRows(const InstanceKey& instance,
                                        const HolderKey& process, uint32_t rank,
                                        const v1::FenceItem& it,
                                        const HashKey& lease_key) {
  if (!restart_fence || restart_fence->lifted) return 0;
  FenceHold h;
  h.kind = FenceHold::Kind::kReported;
  h.instance = instance;
  h.origin = process;
  h.rank = rank;
  h.since = absl::Now();
  if (!it.lease_hash().empty()) {
    const uint32_t node = index->NodeOf(lease_key);
    if (node != kNoNode &&
        index->PageRowOf(node, rank) ==
            (it.page_rows().empty() ? kNoRow : *it.page_rows().rbegin())) {
      index->Pin(node);
      h.pin_node = node;
      h.pin_pages = static_cast<uint32_t>(it.page_rows_size());
    }
  } else {
    // The item's rows that the restart fence keeps, in the item's order.
    // They stay the fence's: the hold only keeps them past its lift
    // (FenceHold::restart_page_rows), so another process from before the
    // restart that reports them too frees nothing.
    auto name = [](const std::vector<uint32_t>& pool,
                   const google::protobuf::RepeatedField<uint32_t>& want,
                   std::vector<uint32_t>* out) {
      absl::flat_hash_set<uint32_t> wanted(want.begin(), want.end());
      absl::flat_hash_set<uint32_t> fenced;
      for (uint32_t r : pool) {
        if (wanted.contains(r)) fenced.insert(r);
      }
      for (uint32_t r : want) {
        if (fenced.erase(r) > 0) out->push_back(r);
      }
    };
    name(restart_fence->page_rows[rank], it.page_rows(), &h.restart_page_rows);
    name(restart_fence->snapshot_rows[rank], it.snapshot_rows(),
         &h.restart_snapshot_rows);
  }
  if (h.pin_node == kNoNode && h.restart_page_rows.empty() &&
      h.restart_snapshot_rows.empty()) {
    return 0;
  }
  const uint64_t hold = NewHoldId();
  holds[hold] = std::move(h);
  return hold;
}

std::vector<uint64_t> TierNamespace::UnreportedHolds(
    const InstanceKey& instance, const HolderKey& process,
    const absl::flat_hash_set<uint64_t>& kept) const {
  std::vector<uint64_t> out;
  for (const auto& [id, h] : holds) {
    // The client re-reports everything it still holds: an earlier
    // session's hold (reported before or not) that this report left out is
    // not held. Abandoned reservations are kept until exit.
    if (h.kind != FenceHold::Kind::kAbandoned && h.instance == instance &&
        h.origin == process && !kept.contains(id)) {
      out.push_back(id);
    }
  }
  return out;
}

}  // namespace kvtier::daemon
