// TierCore's Fence RPC: a reconnected or restarted client reports the rows
// and leases its queued work may still touch, which become (or stay) fence
// holds; what its ended sessions left and it did not report is freed; and
// it releases the holds it no longer needs. All of it only in namespaces
// the session attached to, for its own instance (bound to its credentials:
// fence_registry.h); rows of the restart fence only for processes that held
// rows before the restart. Also the fence's counters.
// The holds themselves: tier_fence_holds.cc; the protocol:
// proto/kvtier/v1/tier.proto, "fence".
//
// Thread-safety: thread-safe (part of TierCore; lock order in tier_core.h).
#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/error_reason.h"
#include "daemon/tier_core.h"
#include "daemon/tier_request.h"

namespace kvtier::daemon {

absl::Status TierCore::ResolveFence(const v1::FenceRequest& req,
                                    FenceScope* scope) {
  scope->items.resize(req.report_size());
  absl::ReaderMutexLock lock(&mu_);
  auto session = sessions_.find(req.session_id());
  if (session == sessions_.end()) return SessionUnknownError(req.session_id());
  // The namespaces the session may act on: those it attached to, which the
  // ACL let it (checked at Attach; again here, as the check is cheap). A
  // report or release acts nowhere else (daemon/peer_credentials.h).
  const Caller caller{.operator_socket = false, .session_id = req.session_id()};
  for (const auto& [ns_id, rank] : session->second.attached) {
    auto ns = by_id_.find(ns_id);
    if (ns != by_id_.end() &&
        CheckRight(caller, session->second.peer, ns->second->name, "fence")
            .ok()) {
      scope->mine.push_back(ns->second);
    }
  }
  for (int i = 0; i < req.report_size(); ++i) {
    const v1::FenceItem& it = req.report(i);
    auto found = std::find_if(
        scope->mine.begin(), scope->mine.end(),
        [&](const auto& ns) { return ns->name == it.namespace_(); });
    if (found == scope->mine.end()) {
      // Not attached (nor, then, validated), or kept but not open: this
      // session cannot fence what its process holds there, so it is not
      // done reporting: the restart fence keeps waiting for it until it
      // exits. A namespace that is gone has nothing left to fence.
      if (by_name_.contains(it.namespace_()) ||
          unrecoverable_.contains(it.namespace_())) {
        scope->unresolved = true;
      }
      continue;
    }
    if (absl::Status s = (*found)->CheckFenceItem(
            it, absl::StrCat("report[", i, "]"), &scope->items[i].lease_key);
        !s.ok()) {
      return s;
    }
    scope->items[i].ns = *found;
  }
  return absl::OkStatus();
}

absl::Status TierCore::Fence(const v1::FenceRequest& req,
                             v1::FenceResponse* resp) {
  if (absl::Status s = CheckApiVersion(req.api_version()); !s.ok()) return s;
  InstanceKey instance;
  HolderKey process;
  if (!fence_->SessionOwner(req.session_id(), &instance, &process)) {
    return SessionUnknownError(req.session_id());
  }
  // Validate everything first.
  FenceScope scope;
  if (absl::Status s = ResolveFence(req, &scope); !s.ok()) return s;
  std::vector<FenceScope::Item>& items = scope.items;
  std::vector<std::shared_ptr<Namespace>>& mine = scope.mine;
  const bool unresolved = scope.unresolved;
  // Releases, of holds in those namespaces only (elsewhere a hold id is
  // unknown to the session). A hold of another instance refuses the whole
  // request before anything is released.
  for (int i = 0; i < req.release_size(); ++i) {
    for (auto& ns : mine) {
      absl::MutexLock lock(&ns->mu);
      auto h = ns->holds.find(req.release(i));
      if (h == ns->holds.end()) continue;
      if (h->second.instance != instance) {
        return absl::PermissionDeniedError(absl::StrCat(
            "release[", i, "]: the hold belongs to another client instance"));
      }
      break;
    }
  }
  uint32_t released = 0;
  for (uint64_t hold : req.release()) {
    for (auto& ns : mine) {
      absl::MutexLock lock(&ns->mu);
      auto h = ns->holds.find(hold);
      if (h == ns->holds.end() || h->second.instance != instance) continue;
      ReleaseHoldLocked(*ns, hold);
      ++released;
      break;
    }
  }
  released_confirmed_.fetch_add(released);
  resp->set_released(released);
  // Reports: match each item to a hold this process's ended sessions left,
  // else, for a process that held rows before the restart, keep the
  // restart fence's rows (or pages) it names under a hold.
  absl::flat_hash_set<uint64_t> kept;
  for (int i = 0; i < req.report_size(); ++i) {
    const v1::FenceItem& it = req.report(i);
    uint64_t hold = 0;
    if (items[i].ns != nullptr) {
      Namespace& ns = *items[i].ns;
      const uint32_t rank = ns.StorageRank(it.tp_rank());
      const bool restart_holder =
          fence_->RestartHolder(req.session_id(), ns.name);
      absl::MutexLock lock(&ns.mu);
      hold =
          ns.MatchHold(instance, process, rank, it, items[i].lease_key, kept);
      if (hold == 0 && restart_holder) {
        hold =
            ns.HoldRestartRows(instance, process, rank, it, items[i].lease_key);
        if (hold != 0) live_holds_.fetch_add(1);
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
    for (auto& ns : mine) {
      absl::MutexLock lock(&ns->mu);
      const std::vector<uint64_t> drop =
          ns->UnreportedHolds(instance, process, kept);
      for (uint64_t id : drop) ReleaseHoldLocked(*ns, id);
      freed += drop.size();
    }
    released_confirmed_.fetch_add(freed);
    // Done in the namespaces it may act on (a holder an older daemon
    // recorded everywhere: done unless it named one it cannot act on).
    std::vector<std::string> names;
    for (const auto& ns : mine) names.push_back(ns->name);
    fence_->ReportComplete(req.session_id(), names, unresolved);
    SweepFences();
  }
  return absl::OkStatus();
}

TierCore::FenceCounters TierCore::GetFenceCounters() {
  FenceCounters c;
  const std::vector<std::shared_ptr<Namespace>> all = Namespaces();
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
