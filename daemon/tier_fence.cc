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

absl::Status TierCore::Fence(const v1::FenceRequest& req,
                             v1::FenceResponse* resp) {
  if (absl::Status s = CheckApiVersion(req.api_version()); !s.ok()) return s;
  InstanceKey instance;
  HolderKey process;
  if (!fence_->SessionOwner(req.session_id(), &instance, &process)) {
    return SessionUnknownError(req.session_id());
  }
  // Validate everything first.
  struct Item {
    std::shared_ptr<Namespace> ns;  // Null: nothing here to fence.
    HashKey lease_key;
  };
  std::vector<Item> items(req.report_size());
  // The namespaces the session may act on: those it attached to, which the
  // ACL let it (checked at Attach; again here, as the check is cheap). A
  // report or release acts nowhere else (daemon/peer_credentials.h).
  std::vector<std::shared_ptr<Namespace>> mine;
  bool unresolved = false;
  {
    absl::ReaderMutexLock lock(&mu_);
    auto session = sessions_.find(req.session_id());
    if (session == sessions_.end()) {
      return SessionUnknownError(req.session_id());
    }
    const Caller caller{.operator_socket = false,
                        .session_id = req.session_id()};
    for (const auto& [ns_id, rank] : session->second.attached) {
      auto ns = by_id_.find(ns_id);
      if (ns != by_id_.end() &&
          CheckRight(caller, session->second.peer, ns->second->name, "fence")
              .ok()) {
        mine.push_back(ns->second);
      }
    }
    for (int i = 0; i < req.report_size(); ++i) {
      const v1::FenceItem& it = req.report(i);
      const std::string field = absl::StrCat("report[", i, "]");
      auto found = std::find_if(mine.begin(), mine.end(), [&](const auto& ns) {
        return ns->name == it.namespace_();
      });
      if (found == mine.end()) {
        // Not attached (nor, then, validated), or kept but not open: this
        // session cannot fence what its process holds there, so it is not
        // done reporting: the restart fence keeps waiting for it until it
        // exits. A namespace that is gone has nothing left to fence.
        if (by_name_.contains(it.namespace_()) ||
            unrecoverable_.contains(it.namespace_())) {
          unresolved = true;
        }
        continue;
      }
      Namespace& ns = **found;
      if (it.tp_rank() >= ns.layout.tp_size()) {
        return absl::InvalidArgumentError(absl::StrCat(
            field, ".tp_rank: ", it.tp_rank(),
            " but the namespace has tp_size ", ns.layout.tp_size()));
      }
      for (uint32_t row : it.page_rows()) {
        if (row >= ns.page_rows) {
          return absl::InvalidArgumentError(
              absl::StrCat(field, ".page_rows: row ", row, " is out of range"));
        }
      }
      for (uint32_t row : it.snapshot_rows()) {
        if (row >= ns.snapshot_rows) {
          return absl::InvalidArgumentError(absl::StrCat(
              field, ".snapshot_rows: row ", row, " is out of range"));
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
      items[i].ns = *found;
    }
  }
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
      const bool is_lease = !it.lease_hash().empty();
      for (auto& [id, h] : ns.holds) {
        if (h.instance != instance || !(h.origin == process) ||
            kept.contains(id)) {
          continue;
        }
        const bool shared =
            !h.restart_page_rows.empty() || !h.restart_snapshot_rows.empty();
        const std::vector<uint32_t>& pages =
            shared ? h.restart_page_rows : h.page_rows;
        const std::vector<uint32_t>& snaps =
            shared ? h.restart_snapshot_rows : h.snapshot_rows;
        const bool match =
            is_lease ? h.pin_node != kNoNode &&
                           ns.index->NodeHasKey(h.pin_node, items[i].lease_key)
                     : h.pin_node == kNoNode && h.rank == rank &&
                           std::equal(pages.begin(), pages.end(),
                                      it.page_rows().begin(),
                                      it.page_rows().end()) &&
                           std::equal(snaps.begin(), snaps.end(),
                                      it.snapshot_rows().begin(),
                                      it.snapshot_rows().end());
        if (match) {
          hold = id;
          h.kind = Namespace::FenceHold::Kind::kReported;
          break;
        }
      }
      if (hold == 0 && restart_holder && ns.restart_fence &&
          !ns.restart_fence->lifted) {
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
          // The item's rows that the restart fence keeps, in the item's
          // order. They stay the fence's: the hold only keeps them past its
          // lift (FenceHold::restart_page_rows), so another process from
          // before the restart that reports them too frees nothing.
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
          name(ns.restart_fence->page_rows[rank], it.page_rows(),
               &h.restart_page_rows);
          name(ns.restart_fence->snapshot_rows[rank], it.snapshot_rows(),
               &h.restart_snapshot_rows);
        }
        if (h.pin_node != kNoNode || !h.restart_page_rows.empty() ||
            !h.restart_snapshot_rows.empty()) {
          hold = ns.NewHoldId();
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
    for (auto& ns : mine) {
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
