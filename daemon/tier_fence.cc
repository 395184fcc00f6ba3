// TierCore's fence: holds of rows that a live process may still touch, and
// the restart fence (see tier_core.h and proto/kvtier/v1/tier.proto).
#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/error_reason.h"
#include "daemon/tier_core.h"
#include "daemon/tier_namespace.h"
#include "spdlog/spdlog.h"

namespace kvtier::daemon {

uint64_t TierCore::HoldReservationLocked(Namespace& ns, uint64_t id, int kind,
                                         const InstanceKey& instance,
                                         const HolderKey& origin) {
  auto it = ns.reservations.find(id);
  if (it == ns.reservations.end()) return 0;
  Namespace::Reservation& r = it->second;
  ns.Charge(r.session, -1, 0, -Namespace::Rows(r));
  Namespace::FenceHold h;
  h.kind = static_cast<Namespace::FenceHold::Kind>(kind);
  h.instance = instance;
  h.origin = origin;
  h.rank = r.rank;
  h.page_rows = std::move(r.page_rows);
  h.snapshot_rows = std::move(r.snapshot_rows);
  h.device_pool = r.device_pool;
  h.device_rows = std::move(r.device_rows);
  h.since = absl::Now();
  ns.reserved_page_rows -= h.page_rows.size();
  ns.reserved_snapshot_rows -= h.snapshot_rows.size();
  ns.reservations.erase(it);
  const uint64_t hold = next_id_.fetch_add(1);
  ns.holds[hold] = std::move(h);
  live_holds_.fetch_add(1);
  return hold;
}

uint64_t TierCore::HoldLeaseLocked(Namespace& ns, uint64_t id,
                                   const InstanceKey& instance,
                                   const HolderKey& origin) {
  auto it = ns.leases.find(id);
  if (it == ns.leases.end()) return 0;
  ns.Charge(it->second.session, 0, -1, 0);
  Namespace::FenceHold h;
  h.kind = Namespace::FenceHold::Kind::kSessionEnded;
  h.instance = instance;
  h.origin = origin;
  h.pin_node = it->second.node;
  h.pin_pages = it->second.pages;
  h.device_pool = it->second.device_pool;
  h.device_lease = it->second.device_lease;
  h.since = absl::Now();
  ns.leases.erase(it);
  const uint64_t hold = next_id_.fetch_add(1);
  ns.holds[hold] = std::move(h);
  live_holds_.fetch_add(1);
  return hold;
}

void TierCore::ReleaseHoldLocked(Namespace& ns, uint64_t id) {
  auto it = ns.holds.find(id);
  if (it == ns.holds.end()) return;
  Namespace::FenceHold& h = it->second;
  (void)ns.index->FreePageRows(h.rank, h.page_rows);
  (void)ns.index->FreeSnapshotRows(h.rank, h.snapshot_rows);
  AbortDeviceRows(h.device_pool, h.device_rows);
  // A pin keeps its node alive (no eviction, no DropSubtree; Clear drops
  // the holds with it), so the id is still the pinned node.
  if (h.pin_node != kNoNode) (void)ns.index->Unpin(h.pin_node);
  if (h.device_lease != 0) {
    (void)device_tiers_[h.device_pool]->Release(h.device_lease);
  }
  SPDLOG_DEBUG("namespace '{}': fence hold {} freed after {}", ns.name, id,
               absl::FormatDuration(absl::Now() - h.since));
  ns.holds.erase(it);
  live_holds_.fetch_sub(1);
}

void TierCore::InstallRestartFenceLocked(Namespace& ns,
                                         const JournalContents& contents,
                                         bool emptied) {
  Namespace::RestartFence f;
  f.since = absl::Now();
  f.page_rows.resize(ns.stored_ranks);
  f.snapshot_rows.resize(ns.stored_ranks);
  // Rows reserved before the restart and never committed: an engine may
  // still be writing them. They are free in the restored index; claim them.
  auto claim = [&](bool snapshot, uint32_t rank,
                   const std::vector<uint32_t>& rows,
                   std::vector<uint32_t>* claimed) {
    auto one = [&](absl::Span<const uint32_t> r) {
      return snapshot ? ns.index->ClaimSnapshotRows(rank, r)
                      : ns.index->ClaimPageRows(rank, r);
    };
    if (one(rows).ok()) {
      *claimed = rows;
      return;
    }
    for (uint32_t row : rows) {  // Some are not free: claim one by one.
      if (one(absl::MakeConstSpan(&row, 1)).ok()) claimed->push_back(row);
    }
  };
  for (uint32_t rank = 0; rank < ns.stored_ranks; ++rank) {
    std::vector<uint32_t> pages, snaps;
    if (rank < contents.outstanding_page_rows.size()) {
      pages = contents.outstanding_page_rows[rank];
    }
    if (ns.hybrid() && rank < contents.outstanding_snapshot_rows.size()) {
      snaps = contents.outstanding_snapshot_rows[rank];
    }
    // Reopened empty (a segment recreated): the engines' mappings were
    // remapped onto the new segment, so their queued copies into (and out
    // of) the journaled rows reach it too. Keep those rows as well; after a
    // corrupt record, what follows it is unknown: keep every row.
    if (emptied && contents.corrupt) {
      pages.clear();
      snaps.clear();
      for (uint32_t r = 0; r < ns.page_rows; ++r) pages.push_back(r);
      if (ns.hybrid()) {
        for (uint32_t r = 0; r < ns.snapshot_rows; ++r) snaps.push_back(r);
      }
    } else if (emptied && contents.ranks == ns.stored_ranks) {
      for (size_t i = 0; i < contents.keys.size(); ++i) {
        const size_t at = i * contents.ranks + rank;
        if (at < contents.page_rows.size() &&
            contents.page_rows[at] != kNoRow) {
          pages.push_back(contents.page_rows[at]);
        }
        if (ns.hybrid() && at < contents.snapshot_rows.size() &&
            contents.snapshot_rows[at] != kNoRow) {
          snaps.push_back(contents.snapshot_rows[at]);
        }
      }
    }
    claim(false, rank, pages, &f.page_rows[rank]);
    if (ns.hybrid()) claim(true, rank, snaps, &f.snapshot_rows[rank]);
  }
  // Every restored row may be under a lease from before: pin the leaves
  // (which keeps their ancestors) and every node holding a snapshot (a pin
  // keeps only its own node's snapshot).
  absl::flat_hash_set<uint32_t> has_child;
  std::vector<std::pair<uint32_t, bool>> nodes;  // id, holds a snapshot
  ns.index->ForEachNode([&](const PrefixIndex::NodeView& v) {
    if (v.parent != kNoNode) has_child.insert(v.parent);
    bool snap = false;
    for (uint32_t r : v.snapshot_rows) snap = snap || r != kNoRow;
    nodes.emplace_back(v.id, snap);
  });
  for (const auto& [id, snap] : nodes) {
    if (snap || !has_child.contains(id)) {
      ns.index->Pin(id);
      f.pinned_nodes.push_back(id);
    }
  }
  f.pinned_pages = nodes.size();
  uint64_t claimed = 0;
  for (const auto& r : f.page_rows) claimed += r.size();
  SPDLOG_INFO(
      "namespace '{}': restart fence up: {} reserved rows and {} restored "
      "pages kept until {} processes from before the restart report or exit",
      ns.name, claimed, f.pinned_pages, fence_->restart_waiting());
  ns.restart_fence = std::move(f);
  restart_fences_.fetch_add(1);
}

void TierCore::LiftRestartFenceLocked(Namespace& ns) {
  if (!ns.restart_fence) return;
  Namespace::RestartFence& f = *ns.restart_fence;
  for (uint32_t rank = 0; rank < f.page_rows.size(); ++rank) {
    (void)ns.index->FreePageRows(rank, f.page_rows[rank]);
    (void)ns.index->FreeSnapshotRows(rank, f.snapshot_rows[rank]);
  }
  for (uint32_t node : f.pinned_nodes) (void)ns.index->Unpin(node);
  SPDLOG_INFO("namespace '{}': restart fence lifted after {}", ns.name,
              absl::FormatDuration(absl::Now() - f.since));
  ns.restart_fence.reset();
  restart_fences_.fetch_sub(1);
  restart_fences_lifted_.fetch_add(1);
}

absl::Status TierCore::ExplainFenceLocked(Namespace& ns, absl::Status refused) {
  if (refused.code() != absl::StatusCode::kResourceExhausted ||
      (ns.holds.empty() && !ns.restart_fence)) {
    return refused;
  }
  uint64_t rows = 0, pinned = 0;
  for (const auto& [id, h] : ns.holds) {
    rows += h.page_rows.size();
    pinned += h.pin_pages;
  }
  std::string why =
      absl::StrCat(ns.holds.size(), " fence holds keep ", rows,
                   " reserved rows and ", pinned, " leased pages");
  if (ns.restart_fence) {
    uint64_t claimed = 0;
    for (const auto& r : ns.restart_fence->page_rows) claimed += r.size();
    const std::vector<std::string> who = fence_->RestartWaitingNames(4);
    absl::StrAppend(&why, "; the restart fence keeps ", claimed,
                    " rows reserved and ", ns.restart_fence->pinned_pages,
                    " pages committed before the daemon restarted, until ",
                    fence_->restart_waiting(),
                    " processes that held rows then report or exit (",
                    absl::StrJoin(who, ", "), ")");
  }
  return absl::ResourceExhaustedError(absl::StrCat(
      refused.message(), "; fenced: ", why,
      " (rows a live engine may still write or read are handed to nobody)"));
}

void TierCore::SessionGoodbye(uint64_t session_id, bool quiescent) {
  if (quiescent) fence_->MarkQuiescent(session_id);
}

size_t TierCore::SweepFences() {
  const bool changed = fence_->Poll();
  {
    absl::MutexLock lock(&mu_);
    for (auto it = orphaned_device_.begin(); it != orphaned_device_.end();) {
      if (!fence_->InstanceGone(it->instance)) {
        ++it;
        continue;
      }
      AbortDeviceRows(it->pool, it->rows);
      if (it->lease != 0) (void)device_tiers_[it->pool]->Release(it->lease);
      it = orphaned_device_.erase(it);
    }
  }
  if (live_holds_.load() == 0 && restart_fences_.load() == 0) return 0;
  (void)changed;
  std::vector<std::shared_ptr<Namespace>> all;
  {
    absl::ReaderMutexLock lock(&mu_);
    for (const auto& [name, ns] : by_name_) all.push_back(ns);
  }
  const bool lift = fence_->restart_waiting() == 0;
  size_t freed = 0;
  for (auto& ns : all) {
    absl::MutexLock lock(&ns->mu);
    std::vector<uint64_t> gone;
    for (const auto& [id, h] : ns->holds) {
      if (fence_->InstanceGone(h.instance)) gone.push_back(id);
    }
    for (uint64_t id : gone) ReleaseHoldLocked(*ns, id);
    freed += gone.size();
    if (lift) LiftRestartFenceLocked(*ns);
  }
  released_gone_.fetch_add(freed);
  return freed;
}

void TierCore::StartFenceSweeper(absl::Duration period) {
  sweeper_ = std::thread([this, period] {
    absl::Time retry = absl::Now() + absl::Seconds(10);
    for (;;) {
      {
        absl::MutexLock lock(&sweeper_mu_);
        if (sweeper_mu_.AwaitWithTimeout(absl::Condition(&sweeper_stop_),
                                         period)) {
          return;
        }
      }
      SweepFences();
      if (absl::Now() >= retry) {  // Unrecoverable namespaces, now and then.
        retry = absl::Now() + absl::Seconds(10);
        RetryUnrecoverable();
      }
    }
  });
}

absl::Status TierCore::Fence(const v1::FenceRequest& req,
                             v1::FenceResponse* resp) {
  if (absl::Status s = CheckApiVersion(req.api_version()); !s.ok()) return s;
  InstanceKey instance;
  HolderKey process;
  if (!SessionOpen(req.session_id()) ||
      !fence_->SessionOwner(req.session_id(), &instance, &process)) {
    return SessionUnknownError(req.session_id());
  }
  // Validate everything first.
  struct Item {
    std::shared_ptr<Namespace> ns;  // Null: the namespace is gone.
    HashKey lease_key;
  };
  std::vector<Item> items(req.report_size());
  bool unresolved = false;
  {
    absl::ReaderMutexLock lock(&mu_);
    for (int i = 0; i < req.report_size(); ++i) {
      const v1::FenceItem& it = req.report(i);
      const std::string field = absl::StrCat("report[", i, "]");
      auto found = by_name_.find(it.namespace_());
      if (found == by_name_.end()) {
        // Kept but not open (unrecoverable): this connection's rows there
        // cannot be fenced now, so it is not done reporting — the restart
        // fence keeps waiting for it until it exits.
        if (unrecoverable_.contains(it.namespace_())) unresolved = true;
        continue;
      }
      Namespace& ns = *found->second;
      if (it.tp_rank() >= ns.layout.tp_size()) {
        return absl::InvalidArgumentError(absl::StrCat(
            field, ".tp_rank: ", it.tp_rank(),
            " but the namespace has tp_size ", ns.layout.tp_size()));
      }
      for (uint32_t row : it.page_rows()) {
        if (row >= ns.page_rows) {
          return absl::InvalidArgumentError(
              absl::StrCat(field, ".page_rows: row ", row, " of a bank of ",
                           ns.page_rows, " rows"));
        }
      }
      for (uint32_t row : it.snapshot_rows()) {
        if (row >= ns.snapshot_rows) {
          return absl::InvalidArgumentError(absl::StrCat(
              field, ".snapshot_rows: row ", row, " of a snapshot bank of ",
              ns.snapshot_rows, " rows"));
        }
      }
      if (!it.lease_hash().empty()) {
        if (it.lease_hash().size() != ns.hash_bytes) {
          return absl::InvalidArgumentError(
              absl::StrCat(field, ".lease_hash: must be ", ns.hash_bytes,
                           " bytes, got ", it.lease_hash().size()));
        }
        items[i].lease_key.bytes.fill(0);
        std::memcpy(items[i].lease_key.bytes.data(), it.lease_hash().data(),
                    ns.hash_bytes);
      }
      items[i].ns = found->second;
    }
  }
  // Releases.
  std::vector<std::shared_ptr<Namespace>> all;
  {
    absl::ReaderMutexLock lock(&mu_);
    for (const auto& [name, ns] : by_name_) all.push_back(ns);
  }
  uint32_t released = 0;
  for (uint64_t hold : req.release()) {
    for (auto& ns : all) {
      absl::MutexLock lock(&ns->mu);
      auto h = ns->holds.find(hold);
      if (h == ns->holds.end()) continue;
      if (h->second.instance != instance) {
        return absl::PermissionDeniedError(absl::StrCat(
            "release: hold ", hold, " belongs to another client instance"));
      }
      ReleaseHoldLocked(*ns, hold);
      ++released;
      break;
    }
  }
  released_confirmed_.fetch_add(released);
  resp->set_released(released);
  // Reports: match each item to a hold this process's ended sessions left,
  // else take its rows out of the restart fence.
  absl::flat_hash_set<uint64_t> kept;
  for (int i = 0; i < req.report_size(); ++i) {
    const v1::FenceItem& it = req.report(i);
    uint64_t hold = 0;
    if (items[i].ns != nullptr) {
      Namespace& ns = *items[i].ns;
      const uint32_t rank = ns.StorageRank(it.tp_rank());
      absl::MutexLock lock(&ns.mu);
      const bool is_lease = !it.lease_hash().empty();
      for (auto& [id, h] : ns.holds) {
        if (h.instance != instance || !(h.origin == process) ||
            kept.contains(id)) {
          continue;
        }
        const bool match =
            is_lease
                ? h.pin_node != kNoNode &&
                      ns.index->NodeHasKey(h.pin_node, items[i].lease_key)
                : h.pin_node == kNoNode && h.rank == rank &&
                      std::equal(h.page_rows.begin(), h.page_rows.end(),
                                 it.page_rows().begin(),
                                 it.page_rows().end()) &&
                      std::equal(h.snapshot_rows.begin(), h.snapshot_rows.end(),
                                 it.snapshot_rows().begin(),
                                 it.snapshot_rows().end());
        if (match) {
          hold = id;
          h.kind = Namespace::FenceHold::Kind::kReported;
          break;
        }
      }
      if (hold == 0 && ns.restart_fence) {
        Namespace::FenceHold h;
        h.kind = Namespace::FenceHold::Kind::kReported;
        h.instance = instance;
        h.origin = process;
        h.rank = rank;
        h.since = absl::Now();
        if (is_lease) {
          const uint32_t node = ns.index->NodeOf(items[i].lease_key);
          if (node != kNoNode &&
              ns.index->PageRowOf(node, rank) ==
                  (it.page_rows().empty() ? kNoRow
                                          : *it.page_rows().rbegin())) {
            ns.index->Pin(node);
            h.pin_node = node;
            h.pin_pages = static_cast<uint32_t>(it.page_rows_size());
          }
        } else {
          // Move the item's rows from the restart fence into the hold.
          auto take = [&](std::vector<uint32_t>& pool,
                          const google::protobuf::RepeatedField<uint32_t>& want,
                          std::vector<uint32_t>* out) {
            absl::flat_hash_set<uint32_t> w(want.begin(), want.end());
            auto keep =
                std::partition(pool.begin(), pool.end(),
                               [&](uint32_t r) { return !w.contains(r); });
            out->assign(keep, pool.end());
            pool.erase(keep, pool.end());
          };
          take(ns.restart_fence->page_rows[rank], it.page_rows(), &h.page_rows);
          take(ns.restart_fence->snapshot_rows[rank], it.snapshot_rows(),
               &h.snapshot_rows);
        }
        if (h.pin_node != kNoNode || !h.page_rows.empty() ||
            !h.snapshot_rows.empty()) {
          hold = next_id_.fetch_add(1);
          ns.holds[hold] = std::move(h);
          live_holds_.fetch_add(1);
        }
      }
    }
    if (hold == 0) report_mismatches_.fetch_add(1);
    if (hold != 0) kept.insert(hold);
    resp->add_holds(hold);
  }
  if (req.report_complete()) {
    // What this process's ended sessions left and it did not report, it
    // does not hold: free it.
    size_t freed = 0;
    for (auto& ns : all) {
      absl::MutexLock lock(&ns->mu);
      std::vector<uint64_t> drop;
      for (const auto& [id, h] : ns->holds) {
        // The client re-reports everything it still holds: an earlier
        // session's hold (reported before or not) that this report left
        // out is not held. Abandoned reservations are kept until exit.
        if (h.kind != Namespace::FenceHold::Kind::kAbandoned &&
            h.instance == instance && h.origin == process &&
            !kept.contains(id)) {
          drop.push_back(id);
        }
      }
      for (uint64_t id : drop) ReleaseHoldLocked(*ns, id);
      freed += drop.size();
    }
    released_confirmed_.fetch_add(freed);
    if (!unresolved) fence_->ReportComplete(req.session_id());
    SweepFences();
  }
  return absl::OkStatus();
}

TierCore::FenceCounters TierCore::GetFenceCounters() {
  FenceCounters c;
  std::vector<std::shared_ptr<Namespace>> all;
  {
    absl::ReaderMutexLock lock(&mu_);
    for (const auto& [name, ns] : by_name_) all.push_back(ns);
  }
  for (auto& ns : all) {
    absl::MutexLock lock(&ns->mu);
    c.holds += ns->holds.size();
    for (const auto& [id, h] : ns->holds) {
      c.fenced_page_rows += h.page_rows.size();
      c.fenced_snapshot_rows += h.snapshot_rows.size();
      c.pinned_pages += h.pin_pages;
    }
    if (ns->restart_fence) {
      for (const auto& r : ns->restart_fence->page_rows) {
        c.fenced_page_rows += r.size();
      }
      for (const auto& r : ns->restart_fence->snapshot_rows) {
        c.fenced_snapshot_rows += r.size();
      }
      c.pinned_pages += ns->restart_fence->pinned_pages;
    }
  }
  c.restart_waiting = static_cast<uint32_t>(fence_->restart_waiting());
  c.instances = static_cast<uint32_t>(fence_->instances());
  c.unseen_pid_sessions = static_cast<uint32_t>(fence_->unseen_pid_processes());
  c.released_confirmed = released_confirmed_.load();
  c.released_gone = released_gone_.load();
  c.restart_fences_lifted = restart_fences_lifted_.load();
  c.report_mismatches = report_mismatches_.load();
  return c;
}

}  // namespace kvtier::daemon
