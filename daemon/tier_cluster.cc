// TierCore's side of the cluster tier (daemon/cluster_tier.h): what the host
// tier evicts is spilled (or, with write-through, every commit written), a
// remote Lookup asks how far a chain continues in Redis, and Prefetch brings
// that continuation into the host tier.
//
// Nothing wrong is served: a prefetched page is committed only after its
// value passed its MAC, layout, key and rank checks (DecodeClusterValue),
// into rows allocated for it and invisible until the commit, which is
// journaled like any other; a value that fails is a miss and ends the
// prefetch there. A prefetch works in slices: fetch (no lock), allocate
// (namespace lock; may evict least recently used prefixes, never pinned
// ones), copy (no lock: the rows are the prefetch's alone), commit (lock).
// It pins the last page it committed (first, the local match's end), so
// its own chain is never what it evicts, and it stops cleanly when the
// namespace is dropped or the core shuts down.
//
// Thread-safety: thread-safe (part of TierCore; lock order in tier_core.h:
// a namespace's mu, then its prefetch_mu).
#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/cluster_tier.h"
#include "daemon/cluster_value.h"
#include "daemon/tier_core.h"
#include "daemon/tier_request.h"
#include "spdlog/spdlog.h"

namespace kvtier::daemon {
ClusterDigest TierCore::ClusterDigestOf(const Namespace& ns, const HashKey& key,
                                        uint32_t rank) {
  return ClusterKeyDigest(ns.name, ns.fingerprint,
                          KeyString(key, ns.hash_bytes), rank);
}

ClusterValueShape TierCore::ClusterShapeOf(const Namespace& ns,
                                           const HashKey& key, uint32_t rank) {
  ClusterValueShape s;
  s.fingerprint = ns.fingerprint;
  s.digest = ClusterDigestOf(ns, key, rank);
  s.rank = rank;
  for (const auto& bank : ns.layout.page_banks()) {
    s.bank_bytes.push_back(bank.row_bytes());
  }
  s.snapshot_bytes = ns.layout.snapshot_row_bytes();
  return s;
}

void TierCore::WatchEvictionsLocked(Namespace& ns) {
  ClusterTier* cluster = options_.cluster;
  ns.prefetch_page_rows.assign(ns.stored_ranks, 0);
  ns.prefetch_snapshot_rows.assign(ns.stored_ranks, 0);
  // With write-through every committed page was written when committed.
  if (cluster == nullptr || cluster->options().write_through) return;
  Namespace* n = &ns;  // The index, and so the observer, dies with ns.
  ns.index->SetEvictionObserver(
      [this, n](const PrefixIndex::NodeView& v) ABSL_NO_THREAD_SAFETY_ANALYSIS {
        // Eviction runs under n->mu, held exclusively.
        std::vector<SpilledRank> ranks;
        for (uint32_t r = 0; r < n->stored_ranks; ++r) {
          ranks.push_back(
              {r, v.page_rows[r],
               v.snapshot_rows.empty() ? kNoRow : v.snapshot_rows[r]});
        }
        SpillPageLocked(*n, *v.key, v.parent_key, ranks, {}, ranks.size());
      });
}

void TierCore::SpillPageLocked(Namespace& ns, const HashKey& key,
                               const HashKey* parent,
                               absl::Span<const SpilledRank> ranks,
                               absl::Span<const uint32_t> token_ids,
                               uint32_t announce_values) {
  ClusterTier* cluster = options_.cluster;
  if (cluster == nullptr) return;
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

void TierCore::WriteThroughLocked(
    Namespace& ns, uint32_t rank, const HashKey* parent,
    absl::Span<const HashKey> keys, absl::Span<const uint32_t> rows,
    absl::Span<const PrefixIndex::SnapshotPlacement> snaps,
    absl::Span<const uint32_t> token_ids,
    const PrefixIndex::CommitResult& result) {
  ClusterTier* cluster = options_.cluster;
  if (cluster == nullptr || !cluster->options().write_through) return;
  // A placement the index deduplicated gave its row back.
  absl::flat_hash_map<std::string, uint32_t> snapshot_of;
  for (const auto& p : snaps) {
    if (std::find(result.freed_snapshot_rows.begin(),
                  result.freed_snapshot_rows.end(),
                  p.row) == result.freed_snapshot_rows.end()) {
      snapshot_of[KeyString(p.hash, ns.hash_bytes)] = p.row;
    }
  }
  const uint32_t per_page = ns.layout.tokens_per_page();
  const bool tokens = token_ids.size() == keys.size() * per_page;
  size_t completed = 0;  // Into result.completed (ascending).
  for (size_t i = 0; i < keys.size(); ++i) {
    while (completed < result.completed.size() &&
           result.completed[completed] < i) {
      ++completed;
    }
    const uint32_t node = ns.index->NodeOf(keys[i]);
    // Only the pages this commit placed (a deduplicated one was there
    // before, and was written then).
    if (ns.index->PageRowOf(node, rank) != rows[i]) continue;
    auto s = snapshot_of.find(KeyString(keys[i], ns.hash_bytes));
    const SpilledRank r{rank, rows[i],
                        s == snapshot_of.end() ? kNoRow : s->second};
    // The rank whose commit completed the page announces it once its value
    // is written (the other ranks' values went with their own commits).
    const bool completes =
        completed < result.completed.size() && result.completed[completed] == i;
    SpillPageLocked(ns, keys[i], i > 0 ? &keys[i - 1] : parent, {&r, 1},
                    tokens ? token_ids.subspan(i * per_page, per_page)
                           : absl::Span<const uint32_t>(),
                    completes ? 1 : 0);
  }
}

uint32_t TierCore::PrefetchingPages(Namespace& ns,
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

uint32_t TierCore::RemotePages(const Namespace& ns,
                               absl::Span<const HashKey> keys, uint32_t from) {
  ClusterTier* cluster = options_.cluster;
  if (cluster == nullptr || from >= keys.size()) return 0;
  return cluster->Probe(
      static_cast<uint32_t>(keys.size() - from), ns.stored_ranks,
      [&](uint32_t page, uint32_t rank) {
        return ClusterKeyName(ClusterDigestOf(ns, keys[from + page], rank));
      });
}

void TierCore::FillClusterStatus(v1::ClusterTierStatus* out) const {
  const ClusterTier* cluster = options_.cluster;
  if (cluster == nullptr) return;
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

absl::Status TierCore::Prefetch(const v1::PrefetchRequest& req,
                                v1::PrefetchResponse* resp) {
  ClusterTier* cluster = options_.cluster;
  uint32_t rank = 0;
  auto ns_or =
      Resolve(req.api_version(), req.session_id(), req.namespace_id(), &rank);
  if (!ns_or.ok()) return ns_or.status();
  std::shared_ptr<Namespace> ns = *std::move(ns_or);
  std::vector<HashKey> keys;
  if (absl::Status s = ParseHashes(req.hashes(), ns->hash_bytes,
                                   kMaxLookupPages, "hashes", &keys);
      !s.ok()) {
    return s;
  }
  if (keys.empty()) return absl::InvalidArgumentError("hashes: none given");
  uint32_t local = 0;
  {
    absl::ReaderMutexLock lock(&ns->mu);
    local = ns->index->Find(keys, 0).matched_pages;
  }
  resp->set_local_pages(local);
  // Without a cluster tier nothing is remote: a miss, as for any chain no
  // tier holds.
  if (cluster == nullptr || local == keys.size()) return absl::OkStatus();
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
  auto unclaim = [ns, &keys, local, to] {
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
  auto job = [this, ns, keys, local, to] {
    RunPrefetch(ns, keys, local, to);
    absl::MutexLock lock(&jobs_mu_);
    --jobs_;
  };
  if (!cluster->Submit(std::move(job))) {
    unclaim();
    absl::MutexLock lock(&jobs_mu_);
    --jobs_;
    return absl::ResourceExhaustedError(
        absl::StrCat("prefetch: ", cluster->options().max_queued_jobs,
                     " prefetches wait already; ask again later"));
  }
  resp->set_remote_pages(remote);
  return absl::OkStatus();
}

}  // namespace kvtier::daemon
