// TierCore's fence holds: rows and leases that a live process may still
// touch, kept from every Reserve until the holder confirms (tier_fence.cc)
// or its instance is gone (SweepFences); the restart fence over what a
// journal restored, whose rows that reports named outlive its lift until
// no hold names them; and the sweeper that frees holds of gone instances
// (see tier_core.h and proto/kvtier/v1/tier.proto, "fence").
//
// Thread-safety: thread-safe (part of TierCore; lock order in tier_core.h);
// the *Locked functions run under the namespace's lock, as annotated.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "daemon/tier_core.h"
#include "spdlog/spdlog.h"

namespace kvtier::daemon {
namespace {

// After the restart fence of ns lifted: frees its rows that no hold names
// any more (FenceHold::restart_page_rows). Returns true when none is left.
bool TrimLiftedRestartFence(TierNamespace& ns)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns.mu) {
  TierNamespace::RestartFence& f = *ns.restart_fence;
  std::vector<absl::flat_hash_set<uint32_t>> pages(f.page_rows.size());
  std::vector<absl::flat_hash_set<uint32_t>> snaps(f.snapshot_rows.size());
  for (const auto& [id, h] : ns.holds) {
    if (h.rank >= pages.size()) continue;
    pages[h.rank].insert(h.restart_page_rows.begin(),
                         h.restart_page_rows.end());
    snaps[h.rank].insert(h.restart_snapshot_rows.begin(),
                         h.restart_snapshot_rows.end());
  }
  bool empty = true;
  auto trim = [&](std::vector<uint32_t>& rows,
                  const absl::flat_hash_set<uint32_t>& named, bool snapshot,
                  uint32_t rank) ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns.mu) {
    auto free_from = std::partition(rows.begin(), rows.end(), [&](uint32_t r) {
      return named.contains(r);
    });
    const std::vector<uint32_t> freed(free_from, rows.end());
    rows.erase(free_from, rows.end());
    if (snapshot) {
      (void)ns.index->FreeSnapshotRows(rank, freed);
    } else {
      (void)ns.index->FreePageRows(rank, freed);
    }
    empty = empty && rows.empty();
  };
  for (uint32_t rank = 0; rank < f.page_rows.size(); ++rank) {
    trim(f.page_rows[rank], pages[rank], false, rank);
    trim(f.snapshot_rows[rank], snaps[rank], true, rank);
  }
  return empty;
}

}  // namespace

uint64_t TierCore::HoldReservationLocked(Namespace& ns, uint64_t id,
                                         Namespace::FenceHold::Kind kind,
                                         const InstanceKey& instance,
                                         const HolderKey& origin) {
  auto it = ns.reservations.find(id);
  if (it == ns.reservations.end()) return 0;
  Namespace::Reservation& r = it->second;
  ns.Charge(r.session, -1, -Namespace::Rows(r));
  Namespace::FenceHold h;
  h.kind = kind;
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
  const uint64_t hold = ns.NewHoldId();
  ns.holds[hold] = std::move(h);
  live_holds_.fetch_add(1);
  return hold;
}

uint64_t TierCore::HoldLeaseLocked(Namespace& ns, uint64_t id,
                                   const InstanceKey& instance,
                                   const HolderKey& origin) {
  absl::MutexLock leases(&ns.lease_mu);
  auto it = ns.leases.find(id);
  if (it == ns.leases.end()) return 0;
  ns.ChargeLease(it->second.session, -1);
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
  const uint64_t hold = ns.NewHoldId();
  ns.holds[hold] = std::move(h);
  live_holds_.fetch_add(1);
  return hold;
}

void TierCore::ReleaseHoldLocked(Namespace& ns, uint64_t id) {
  auto it = ns.holds.find(id);
  if (it == ns.holds.end()) return;
  Namespace::FenceHold& h = it->second;
  // Rows it names of the restart fence stay the fence's (trimmed below).
  const bool named_restart_rows =
      !h.restart_page_rows.empty() || !h.restart_snapshot_rows.empty();
  (void)ns.index->FreePageRows(h.rank, h.page_rows);
  (void)ns.index->FreeSnapshotRows(h.rank, h.snapshot_rows);
  devices_.Abort(h.device_pool, h.device_rows);
  // A pin keeps its node alive (no eviction, no DropSubtree; Clear drops
  // the holds with it), so the id is still the pinned node.
  if (h.pin_node != kNoNode) (void)ns.index->Unpin(h.pin_node);
  devices_.Release(h.device_pool, h.device_lease);
  SPDLOG_DEBUG("namespace '{}': fence hold {} freed after {}", ns.name, id,
               absl::FormatDuration(absl::Now() - h.since));
  ns.holds.erase(it);
  live_holds_.fetch_sub(1);
  if (named_restart_rows && ns.restart_fence && ns.restart_fence->lifted &&
      TrimLiftedRestartFence(ns)) {
    ns.restart_fence.reset();
    restart_fences_.fetch_sub(1);
  }
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
  PrefixIndex& index = *ns.index;  // The lambdas run under ns.mu too.
  auto claim = [&](bool snapshot, uint32_t rank,
                   const std::vector<uint32_t>& rows,
                   std::vector<uint32_t>* claimed) {
    auto one = [&](absl::Span<const uint32_t> r) {
      return snapshot ? index.ClaimSnapshotRows(rank, r)
                      : index.ClaimPageRows(rank, r);
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
      ns.name, claimed, f.pinned_pages, fence_->RestartWaiting(ns.name));
  ns.restart_fence = std::move(f);
  restart_fences_.fetch_add(1);
}

void TierCore::LiftRestartFenceLocked(Namespace& ns) {
  if (!ns.restart_fence || ns.restart_fence->lifted) return;
  Namespace::RestartFence& f = *ns.restart_fence;
  for (uint32_t node : f.pinned_nodes) (void)ns.index->Unpin(node);
  f.pinned_nodes.clear();
  f.pinned_pages = 0;
  f.lifted = true;
  SPDLOG_INFO("namespace '{}': restart fence lifted after {}", ns.name,
              absl::FormatDuration(absl::Now() - f.since));
  restart_fences_lifted_.fetch_add(1);
  // Its rows go, but for those the holds of reports still name.
  if (TrimLiftedRestartFence(ns)) {
    ns.restart_fence.reset();
    restart_fences_.fetch_sub(1);
  }
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
    if (ns.restart_fence->lifted) {
      absl::StrAppend(&why, "; ", claimed,
                      " rows reserved before the daemon restarted stay "
                      "fenced under the holds of the reports that named them");
    } else {
      // Pids only: an instance id is a client's own (fence_registry.h).
      const std::vector<std::string> who =
          fence_->RestartWaitingNames(ns.name, 4);
      absl::StrAppend(&why, "; the restart fence keeps ", claimed,
                      " rows reserved and ", ns.restart_fence->pinned_pages,
                      " pages committed before the daemon restarted, until ",
                      fence_->RestartWaiting(ns.name),
                      " processes that held rows then report or exit (",
                      absl::StrJoin(who, ", "), ")");
    }
  }
  return absl::ResourceExhaustedError(absl::StrCat(
      refused.message(), "; fenced: ", why,
      " (rows a live engine may still write or read are handed to nobody)"));
}

size_t TierCore::SweepFences() {
  const bool changed = fence_->Poll();
  // Which instances are gone is asked with mu_ released (a process check
  // may read /proc); a gone instance stays gone for the slots it held: its
  // processes have exited.
  std::vector<InstanceKey> orphaned;
  {
    absl::ReaderMutexLock lock(&mu_);
    for (const OrphanedDevice& o : orphaned_device_) {
      // A session still open at the drop settles its own (CloseSession).
      if (o.session == 0) orphaned.push_back(o.instance);
    }
  }
  absl::flat_hash_set<InstanceKey> gone_instances;
  for (const InstanceKey& i : orphaned) {
    if (fence_->InstanceGone(i)) gone_instances.insert(i);
  }
  if (!gone_instances.empty()) {
    absl::MutexLock lock(&mu_);
    for (auto it = orphaned_device_.begin(); it != orphaned_device_.end();) {
      if (it->session != 0 || !gone_instances.contains(it->instance)) {
        ++it;
        continue;
      }
      devices_.Abort(it->pool, it->rows);
      devices_.Release(it->pool, it->lease);
      it = orphaned_device_.erase(it);
    }
  }
  if (live_holds_.load() == 0 && restart_fences_.load() == 0) return 0;
  (void)changed;
  const std::vector<std::shared_ptr<Namespace>> all = Namespaces();
  size_t freed = 0;
  for (auto& ns : all) {
    absl::MutexLock lock(&ns->mu);
    std::vector<uint64_t> gone;
    for (const auto& [id, h] : ns->holds) {
      if (fence_->InstanceGone(h.instance)) gone.push_back(id);
    }
    for (uint64_t id : gone) ReleaseHoldLocked(*ns, id);
    freed += gone.size();
    // Each namespace's fence waits only for its own holders.
    if (ns->restart_fence && !ns->restart_fence->lifted &&
        fence_->RestartWaiting(ns->name) == 0) {
      LiftRestartFenceLocked(*ns);
    }
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

}  // namespace kvtier::daemon
