// TierCore's introspection: Stats (also the systemd watchdog's probe),
// ListNamespaces, ListPrefixes, the metrics' Counters, and Verify with the
// invariants it checks. What an engine-socket caller sees is limited to
// its rights (tier_access.cc).
//
// Thread-safety: thread-safe (part of TierCore; lock order in tier_core.h).
// Each takes mu_ briefly to list the namespaces, then one namespace's lock
// at a time.
#include <algorithm>
#include <string>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "daemon/tier_core.h"
#include "daemon/tier_request.h"

namespace kvtier::daemon {

void TierCore::FillNamespaceInfo(Namespace& ns, v1::NamespaceInfo* info) {
  // Shared: Stats (the watchdog's probe) reads beside the namespace's
  // lookups, which hold it shared too, and waits only for a writer.
  absl::ReaderMutexLock lock(&ns.mu);
  PrefixIndex::Usage u = ns.index->GetUsage();
  info->set_namespace_id(ns.id);
  info->set_name(ns.name);
  *info->mutable_layout() = ns.layout;
  info->set_pages(u.nodes);
  info->set_snapshots(u.snapshots);
  info->set_prefixes(u.leaves);
  info->set_sessions(ns.sessions.size());
  info->set_lookups(ns.lookups.load());
  info->set_hit_pages(ns.hit_pages.load());
  info->set_miss_pages(ns.miss_pages.load());
  info->set_committed_pages(ns.committed_pages);
  info->set_evicted_pages(u.evicted_pages);
  info->set_evicted_snapshots(u.evicted_snapshots);
  info->set_max_replay_tokens(ns.max_replay_tokens);
  {
    absl::MutexLock leases(&ns.lease_mu);
    info->set_leases(ns.leases.size());
  }
  info->set_reservations(ns.reservations.size());
  {
    uint64_t pages = 0, snaps = 0;
    for (const auto& [id, h] : ns.holds) {
      pages += h.page_rows.size();
      snaps += h.snapshot_rows.size();
    }
    if (ns.restart_fence) {
      for (const auto& r : ns.restart_fence->page_rows) pages += r.size();
      for (const auto& r : ns.restart_fence->snapshot_rows) snaps += r.size();
      info->set_restart_fence_processes(
          static_cast<uint32_t>(fence_->RestartWaiting(ns.name)));
    }
    info->set_fenced_page_rows(pages);
    info->set_fenced_snapshot_rows(snaps);
    info->set_fence_holds(static_cast<uint32_t>(ns.holds.size()));
  }
  absl::flat_hash_map<uint32_t, uint64_t> reserved_pages, reserved_snaps;
  for (const auto& [id, r] : ns.reservations) {
    reserved_pages[r.rank] += r.page_rows.size();
    reserved_snaps[r.rank] += r.snapshot_rows.size();
  }
  absl::flat_hash_map<uint32_t, uint64_t> fenced_pages, fenced_snaps;
  for (const auto& [id, h] : ns.holds) {
    fenced_pages[h.rank] += h.page_rows.size();
    fenced_snaps[h.rank] += h.snapshot_rows.size();
  }
  if (ns.restart_fence) {
    for (uint32_t r = 0; r < ns.stored_ranks; ++r) {
      fenced_pages[r] += ns.restart_fence->page_rows[r].size();
      fenced_snaps[r] += ns.restart_fence->snapshot_rows[r].size();
    }
  }
  for (uint32_t rank = 0; rank < ns.stored_ranks; ++rank) {
    for (size_t i = 0; i < ns.segment_info[rank].size(); ++i) {
      const v1::Segment& seg = ns.segment_info[rank][i];
      v1::BankUsage* b = info->add_banks();
      const bool snap = seg.bank() == "snapshot";
      const uint64_t free_rows =
          snap ? u.free_snapshot_rows[rank] : u.free_page_rows[rank];
      const uint64_t reserved =
          snap ? reserved_snaps[rank] : reserved_pages[rank];
      b->set_bank(seg.bank());
      b->set_rank(rank);
      b->set_rows(seg.rows());
      b->set_free_rows(free_rows);
      const uint64_t fenced = snap ? fenced_snaps[rank] : fenced_pages[rank];
      b->set_reserved_rows(reserved);
      b->set_fenced_rows(fenced);
      b->set_used_rows(seg.rows() - free_rows - reserved - fenced);
      b->set_row_bytes(seg.row_bytes());
      b->set_path(seg.path());
      b->set_huge_pages(seg.huge_pages());
      absl::StatusOr<int> node = ns.segments[rank][i]->NumaNode();
      b->set_numa_node(node.ok() ? *node : -1);
    }
  }
}

absl::Status TierCore::Stats(const v1::StatsRequest& req,
                             v1::StatsResponse* resp, const Caller& caller) {
  if (absl::Status s = CheckApiVersion(req.api_version()); !s.ok()) return s;
  const Caller who = caller.WithSession(req.session_id());
  std::vector<std::shared_ptr<Namespace>> all;
  absl::StatusOr<PeerInfo> peer = PeerInfo{};  // An engine's, read once.
  {
    absl::ReaderMutexLock lock(&mu_);
    resp->set_sessions(sessions_.size());
    for (const auto& [name, ns] : by_name_) all.push_back(ns);
    if (!who.operator_socket) peer = CallerPeerLocked(who);
  }
  // An engine sees only the namespaces it may attach to (an unknown
  // session: none).
  auto may_list = [&](absl::string_view name) {
    return who.operator_socket ||
           (peer.ok() && CheckRight(who, *peer, name, "list").ok());
  };
  std::erase_if(all, [&](const std::shared_ptr<Namespace>& ns) {
    return !may_list(ns->name);
  });
  std::sort(all.begin(), all.end(),
            [](const auto& a, const auto& b) { return a->name < b->name; });
  resp->set_version(KVTIER_VERSION);
  resp->set_uptime_seconds(absl::ToInt64Seconds(absl::Now() - started_));
  resp->set_instances(static_cast<uint32_t>(fence_->instances()));
  for (const Unrecoverable& u : UnrecoverableNamespaces()) {
    if (!may_list(u.name)) continue;
    v1::UnrecoverableNamespace* out = resp->add_unrecoverable();
    out->set_name(u.name);
    out->set_reason(u.reason);
    out->set_corrupt(u.corrupt);
    out->set_since_unix_ms(absl::ToUnixMillis(u.since));
  }
  resp->set_unseen_pid_processes(
      static_cast<uint32_t>(fence_->unseen_pid_processes()));
  for (auto& ns : all) FillNamespaceInfo(*ns, resp->add_namespaces());
  // Where the node's pages go is the operator's business.
  if (caller.operator_socket && cluster_ != nullptr) {
    cluster_->FillStatus(resp->mutable_cluster());
  }
  return absl::OkStatus();
}

absl::Status TierCore::ListNamespaces(const v1::ListNamespacesRequest& req,
                                      v1::ListNamespacesResponse* resp,
                                      const Caller& caller) {
  v1::StatsRequest stats_req;
  stats_req.set_session_id(req.session_id());
  v1::StatsResponse stats;
  if (absl::Status s = Stats(stats_req, &stats, caller); !s.ok()) return s;
  if (absl::Status s = CheckApiVersion(req.api_version()); !s.ok()) return s;
  resp->mutable_namespaces()->Swap(stats.mutable_namespaces());
  return absl::OkStatus();
}

absl::Status TierCore::ListPrefixes(const v1::ListPrefixesRequest& req,
                                    v1::ListPrefixesResponse* resp,
                                    const Caller& caller) {
  if (absl::Status s = CheckApiVersion(req.api_version()); !s.ok()) return s;
  if (absl::Status s = ValidateNamespaceName(req.namespace_()); !s.ok()) {
    return s;
  }
  // Which prompts are cached is the namespace's secret: testing a guessed
  // prompt's hash needs the right to list.
  if (absl::Status s = CheckNamespaceRight(caller.WithSession(req.session_id()),
                                           req.namespace_(), "list");
      !s.ok()) {
    return s;
  }
  if (!v1::ListPrefixesRequest::Order_IsValid(req.order())) {
    return absl::InvalidArgumentError(
        absl::StrCat("order: unknown value ", static_cast<int>(req.order())));
  }
  if (req.limit() > 10000) {
    return absl::InvalidArgumentError(
        absl::StrCat("limit: at most 10000, got ", req.limit()));
  }
  std::shared_ptr<Namespace> ns;
  {
    absl::ReaderMutexLock lock(&mu_);
    auto it = by_name_.find(req.namespace_());
    if (it == by_name_.end()) {
      return absl::NotFoundError(
          absl::StrCat("namespace: no namespace '", req.namespace_(), "'"));
    }
    ns = it->second;
  }
  const size_t limit = req.limit() == 0 ? 100 : req.limit();
  absl::MutexLock lock(&ns->mu);
  ns->ApplyPendingTouches();  // "Recent first" must count every lookup.
  uint64_t total = 0;
  auto prefixes = ns->index->ListPrefixes(
      req.order() == v1::ListPrefixesRequest::ORDER_RECENT, limit, &total);
  resp->set_total_prefixes(total);
  for (const auto& p : prefixes) {
    v1::PrefixInfo* info = resp->add_prefixes();
    info->set_leaf_hash(std::string(
        reinterpret_cast<const char*>(p.leaf.bytes.data()), ns->hash_bytes));
    info->set_pages(p.pages);
    info->set_tokens(uint64_t{p.pages} * ns->layout.tokens_per_page());
    info->set_snapshots(p.snapshots);
    info->set_last_use_unix_ms(p.last_use_unix_ms);
    info->set_pins(p.pins);
  }
  return absl::OkStatus();
}

std::vector<TierCore::NamespaceCounters> TierCore::Counters() {
  std::vector<std::shared_ptr<Namespace>> all = Namespaces();
  std::sort(all.begin(), all.end(),
            [](const auto& a, const auto& b) { return a->name < b->name; });
  std::vector<NamespaceCounters> out;
  out.reserve(all.size());
  for (auto& ns : all) {
    absl::MutexLock lock(&ns->mu);
    NamespaceCounters& c = out.emplace_back();
    c.name = ns->name;
    c.committed_snapshots = ns->committed_snapshots;
    c.snapshot_hits = ns->snapshot_hits.load();
    c.dropped_pages = ns->dropped_pages;
    c.dropped_snapshots = ns->dropped_snapshots;
    const PrefixIndex::Usage usage = ns->index->GetUsage();
    c.spacing_violations = usage.spacing_violations;
    c.evicted_incomplete_pages = usage.evicted_incomplete_pages;
  }
  return out;
}

absl::Status TierCore::Verify(const v1::VerifyRequest& req,
                              v1::VerifyResponse* resp, const Caller& caller) {
  if (absl::Status s = CheckApiVersion(req.api_version()); !s.ok()) return s;
  if (!caller.operator_socket) {
    return absl::PermissionDeniedError(
        "Verify is an operator RPC: it locks every namespace in turn. Use "
        "the operator socket (<socket>.admin, --admin_group), as kvtierctl "
        "verify does");
  }
  // One at a time: a caller cannot multiply the locking by asking often.
  if (!verify_mu_.TryLock()) {
    return absl::ResourceExhaustedError(
        "Verify: another Verify is running; try again when it has finished");
  }
  absl::Status s;
  {
    {
      absl::ReaderMutexLock lock(&mu_);
      resp->set_namespaces_checked(by_name_.size());
    }
    s = CheckInvariants(/*pace=*/true);
  }
  verify_mu_.Unlock();
  resp->set_ok(s.ok());
  if (!s.ok()) resp->set_violation(std::string(s.message()));
  return absl::OkStatus();
}

absl::Status TierCore::CheckInvariants(bool pace) {
  std::vector<std::shared_ptr<Namespace>> all;
  absl::flat_hash_map<uint64_t, bool> live;
  {
    absl::ReaderMutexLock lock(&mu_);
    for (const auto& [name, ns] : by_name_) all.push_back(ns);
    for (const auto& [id, s] : sessions_) live[id] = true;
  }
  for (auto& ns : all) {
    // Paced (Verify): after each namespace, as long a pause as its check
    // held the lock, so lookups get at least half of the time.
    const absl::Time held_from = absl::Now();
    absl::Cleanup pause = [&] {
      if (pace) absl::SleepFor(absl::Now() - held_from);
    };
    absl::MutexLock lock(&ns->mu);
    if (absl::Status s = ns->index->CheckInvariants(); !s.ok()) {
      return absl::InternalError(
          absl::StrCat("namespace '", ns->name, "': ", s.message()));
    }
    PrefixIndex::Usage u = ns->index->GetUsage();
    // Every pin is a lease's, a fence hold's or the restart fence's.
    uint64_t pins = 0;
    {
      absl::MutexLock leases(&ns->lease_mu);
      pins += ns->leases.size();
    }
    for (const auto& [id, h] : ns->holds) pins += h.pin_node != kNoNode;
    if (ns->restart_fence) pins += ns->restart_fence->pinned_nodes.size();
    pins += ns->prefetch_pins;
    if (u.pins != pins) {
      return absl::InternalError(
          absl::StrCat("namespace '", ns->name, "': the index holds ", u.pins,
                       " pins, leases and fences ", pins));
    }
    for (uint32_t rank = 0; rank < ns->stored_ranks; ++rank) {
      uint64_t reserved_pages = 0, reserved_snaps = 0;
      for (const auto& [id, r] : ns->reservations) {
        if (r.rank != rank) continue;
        reserved_pages += r.page_rows.size();
        reserved_snaps += r.snapshot_rows.size();
      }
      for (const auto& [id, h] : ns->holds) {
        if (h.rank != rank) continue;
        reserved_pages += h.page_rows.size();
        reserved_snaps += h.snapshot_rows.size();
      }
      if (ns->restart_fence) {
        reserved_pages += ns->restart_fence->page_rows[rank].size();
        reserved_snaps += ns->restart_fence->snapshot_rows[rank].size();
      }
      if (rank < ns->prefetch_page_rows.size()) {  // Prefetches in flight.
        reserved_pages += ns->prefetch_page_rows[rank];
        reserved_snaps += ns->prefetch_snapshot_rows[rank];
      }
      if (u.allocated_page_rows[rank] != reserved_pages) {
        return absl::InternalError(
            absl::StrCat("namespace '", ns->name, "' rank ", rank,
                         ": index holds ", u.allocated_page_rows[rank],
                         " allocated uncommitted page rows, reservations and "
                         "fences hold ",
                         reserved_pages));
      }
      if (u.allocated_snapshot_rows[rank] != reserved_snaps) {
        return absl::InternalError(absl::StrCat(
            "namespace '", ns->name, "' rank ", rank, ": index holds ",
            u.allocated_snapshot_rows[rank],
            " allocated uncommitted snapshot rows, reservations and fences "
            "hold ",
            reserved_snaps));
      }
    }
    for (const auto& [id, r] : ns->reservations) {
      if (!live.contains(r.session)) {
        return absl::InternalError(
            absl::StrCat("namespace '", ns->name, "': reservation ", id,
                         " belongs to closed session ", r.session));
      }
    }
    absl::MutexLock leases(&ns->lease_mu);
    for (const auto& [id, l] : ns->leases) {
      if (!live.contains(l.session)) {
        return absl::InternalError(
            absl::StrCat("namespace '", ns->name, "': lease ", id,
                         " belongs to closed session ", l.session));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace kvtier::daemon
