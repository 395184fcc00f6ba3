// ClusterBridge (daemon/cluster_bridge.h): spills, write-through, the
// continuation a remote Lookup reports, and the prefetch jobs.
//
// Thread-safety: thread-safe (lock order in tier_core.h: a namespace's mu,
// then its prefetch_mu; jobs_mu_ a leaf).
#include "daemon/cluster_bridge.h"

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "daemon/cluster_value.h"
#include "daemon/prefetch_job.h"
#include "spdlog/spdlog.h"

namespace kvtier::daemon {

ClusterBridge::ClusterBridge(ClusterTier* cluster,
                             std::function<void(const char*)> hook)
    : cluster_(cluster), hook_(std::move(hook)) {}

ClusterBridge::~ClusterBridge() { Shutdown(); }

void ClusterBridge::Shutdown() {
  absl::MutexLock lock(&jobs_mu_);
  closing_ = true;
  jobs_mu_.Await(absl::Condition(
      +[](int64_t* jobs) { return *jobs == 0; }, &jobs_));
}

bool ClusterBridge::Closing() {
  absl::MutexLock lock(&jobs_mu_);
  return closing_;
}

void ClusterBridge::OnEvicting(const TierNamespace& ns,
                               const PrefixIndex::Eviction& e) {
  // With write-through every committed page was written when committed; an
  // incomplete page is no page a lookup could use, and a snapshot evicted
  // alone leaves its page here.
  if (cluster_->options().write_through || !e.complete || !e.page) return;
  std::vector<SpilledRank> ranks;
  for (uint32_t r = 0; r < ns.stored_ranks; ++r) {
    ranks.push_back(
        {r, e.node.page_rows[r],
         e.node.snapshot_rows.empty() ? kNoRow : e.node.snapshot_rows[r]});
  }
  SpillPage(ns, *e.node.key, e.node.parent_key, ranks, {}, ranks.size());
}

void ClusterBridge::OnCommitted(const TierNamespace& ns,
                                const TierCommit& commit) {
  // A prefetched page came from the cluster tier.
  if (!cluster_->options().write_through ||
      commit.origin == TierCommit::Origin::kPrefetch) {
    return;
  }
  const absl::Span<const HashKey> keys = commit.keys;
  // A placement the index deduplicated gave its row back.
  absl::flat_hash_map<std::string, uint32_t> snapshot_of;
  for (const auto& p : commit.snapshots) {
    if (std::find(commit.result->freed_snapshot_rows.begin(),
                  commit.result->freed_snapshot_rows.end(),
                  p.row) == commit.result->freed_snapshot_rows.end()) {
      snapshot_of[KeyString(p.hash, ns.hash_bytes)] = p.row;
    }
  }
  const uint32_t per_page = ns.layout.tokens_per_page();
  const bool tokens = commit.token_ids.size() == keys.size() * per_page;
  size_t completed = 0;  // Into commit.result->completed (ascending).
  for (size_t i = 0; i < keys.size(); ++i) {
    while (completed < commit.result->completed.size() &&
           commit.result->completed[completed] < i) {
      ++completed;
    }
    const uint32_t node = ns.index->NodeOf(keys[i]);
    // Only the pages this commit placed (a deduplicated one was there
    // before, and was written then).
    if (ns.index->PageRowOf(node, commit.rank) != commit.rows[i]) continue;
    auto s = snapshot_of.find(KeyString(keys[i], ns.hash_bytes));
    const SpilledRank r{commit.rank, commit.rows[i],
                        s == snapshot_of.end() ? kNoRow : s->second};
    // The rank whose commit completed the page announces it once its value
    // is written (the other ranks' values went with their own commits).
    const bool completes = completed < commit.result->completed.size() &&
                           commit.result->completed[completed] == i;
    SpillPage(ns, keys[i], i > 0 ? &keys[i - 1] : commit.parent, {&r, 1},
              tokens ? commit.token_ids.subspan(i * per_page, per_page)
                     : absl::Span<const uint32_t>(),
              completes ? 1 : 0);
  }
}

void ClusterBridge::SpillPage(const TierNamespace& ns, const HashKey& key,
                              const HashKey* parent,
                              absl::Span<const SpilledRank> ranks,
                              absl::Span<const uint32_t> token_ids,
                              uint32_t announce_values) {
  ClusterTier* cluster = cluster_;
  std::vector<std::pair<std::string, std::string>> values;
  for (const SpilledRank& r : ranks) {
    if (r.page_row == kNoRow) continue;
    const ClusterValueShape shape = ClusterShapeOf(ns, key, r.rank);
    const bool snapshot = r.snapshot_row != kNoRow && ns.hybrid();
    if (!cluster->ClaimSpill(ClusterValueBytes(shape, snapshot))) continue;
    std::string value = BeginClusterValue(shape, snapshot);
    const size_t banks = ns.layout.page_banks_size();
    for (size_t b = 0; b < banks; ++b) {
      value.append(reinterpret_cast<const char*>(
                       ns.segments[r.rank][b]->row(r.page_row)),
                   shape.bank_bytes[b]);
    }
    if (snapshot) {
      value.append(reinterpret_cast<const char*>(
                       ns.segments[r.rank][banks]->row(r.snapshot_row)),
                   shape.snapshot_bytes);
    }
    values.emplace_back(ClusterKeyName(shape.digest), std::move(value));
  }
  ClusterTier::PageEvent event;
  event.topic = ns.name;
  event.values = announce_values;  // 0: never announced.
  event.stored.block_hashes = {KeyString(key, ns.hash_bytes)};
  if (parent != nullptr) {
    event.stored.parent_block_hash = KeyString(*parent, ns.hash_bytes);
  }
  event.stored.token_ids.assign(token_ids.begin(), token_ids.end());
  event.stored.block_size = ns.layout.tokens_per_page();
  event.stored.medium = kMediumStorage;
  cluster->SpillPage(std::move(event), std::move(values));
}

uint32_t ClusterBridge::PrefetchingPages(TierNamespace& ns,
                                         absl::Span<const HashKey> keys,
                                         uint32_t from) {
  absl::MutexLock lock(&ns.prefetch_mu);
  if (ns.prefetching.empty()) return 0;
  uint32_t n = 0;
  while (from + n < keys.size() &&
         ns.prefetching.contains(KeyString(keys[from + n], ns.hash_bytes))) {
    ++n;
  }
  return n;
}

uint32_t ClusterBridge::RemotePages(const TierNamespace& ns,
                                    absl::Span<const HashKey> keys,
                                    uint32_t from) {
  if (from >= keys.size()) return 0;
  return cluster_->Probe(
      static_cast<uint32_t>(keys.size() - from), ns.stored_ranks,
      [&](uint32_t page, uint32_t rank) {
        return ClusterKeyName(ClusterDigestOf(ns, keys[from + page], rank));
      });
}

void ClusterBridge::Continuation(TierNamespace& ns,
                                 absl::Span<const HashKey> keys, uint32_t from,
                                 v1::LookupResponse* resp) {
  const uint32_t prefetching = PrefetchingPages(ns, keys, from);
  resp->set_prefetching_pages(prefetching);
  if (prefetching == 0) resp->set_remote_pages(RemotePages(ns, keys, from));
}

absl::Status ClusterBridge::Prefetch(const std::shared_ptr<TierNamespace>& ns,
                                     std::vector<HashKey> keys, uint32_t local,
                                     v1::PrefetchResponse* resp) {
  if (uint32_t p = PrefetchingPages(*ns, keys, local); p > 0) {
    resp->set_prefetching_pages(p);
    return absl::OkStatus();
  }
  const uint32_t remote = RemotePages(*ns, keys, local);
  if (remote == 0) return absl::OkStatus();
  const uint32_t to = local + remote;
  {
    // Claim the pages; another Prefetch of them meanwhile brings them in.
    absl::MutexLock lock(&ns->prefetch_mu);
    if (ns->prefetching.contains(KeyString(keys[local], ns->hash_bytes))) {
      resp->set_prefetching_pages(1);
      return absl::OkStatus();
    }
    for (uint32_t i = local; i < to; ++i) {
      ns->prefetching.insert(KeyString(keys[i], ns->hash_bytes));
    }
  }
  auto unclaim = [&ns, &keys, local, to] {
    absl::MutexLock lock(&ns->prefetch_mu);
    for (uint32_t i = local; i < to; ++i) {
      ns->prefetching.erase(KeyString(keys[i], ns->hash_bytes));
    }
  };
  {
    absl::MutexLock lock(&jobs_mu_);
    if (closing_) {
      unclaim();
      return absl::UnavailableError("prefetch: the daemon is shutting down");
    }
    ++jobs_;
  }
  keys.resize(to);
  auto job = std::make_shared<PrefetchJob>(
      ns, cluster_, keys, local, to, [this] { return Closing(); }, hook_);
  auto run = [this, job] {
    job->Run();
    absl::MutexLock lock(&jobs_mu_);
    --jobs_;
  };
  if (!cluster_->Submit(std::move(run))) {
    unclaim();
    absl::MutexLock lock(&jobs_mu_);
    --jobs_;
    return absl::ResourceExhaustedError(
        absl::StrCat("prefetch: ", cluster_->options().max_queued_jobs,
                     " prefetches wait already; ask again later"));
  }
  resp->set_remote_pages(remote);
  return absl::OkStatus();
}

void ClusterBridge::FillStatus(v1::ClusterTierStatus* out) const {
  const ClusterTier* cluster = cluster_;
  out->set_enabled(true);
  out->set_write_through(cluster->options().write_through);
  const RedisCluster::State st = cluster->RedisState();
  for (const RedisCluster::NodeState& n : st.nodes) {
    v1::ClusterTierStatus::Node* node = out->add_nodes();
    node->set_address(n.address);
    node->set_master(n.master);
    node->set_up(n.up);
    node->set_slots(n.slots);
    node->set_last_error(n.last_error);
  }
  out->set_covered_slots(st.covered_slots);
  const ClusterCounters c = cluster->Counters();
  out->set_probes(c.probes);
  out->set_probe_hit_pages(c.probe_hit_pages);
  out->set_spilled_values(c.spilled_pages);
  out->set_spilled_bytes(c.spilled_bytes);
  out->set_spills_dropped(c.spills_dropped);
  out->set_spills_failed(c.spills_failed);
  out->set_fetched_values(c.fetched_values);
  out->set_fetched_bytes(c.fetched_bytes);
  out->set_rejected_values(c.rejected_values);
  out->set_prefetches(c.prefetches);
  out->set_prefetched_pages(c.prefetched_pages);
  out->set_prefetches_cut(c.prefetches_cut);
  out->set_spill_queue_bytes(c.spill_queue_bytes);
}

}  // namespace kvtier::daemon
