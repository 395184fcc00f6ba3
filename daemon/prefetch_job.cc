// PrefetchJob (daemon/prefetch_job.h): a chain's continuation brought from
// the cluster tier into the host tier, slice by slice.
//
// Thread-safety: one thread runs a job (and the fetch threads it starts);
// locks as tier_core.h orders them.
#include "daemon/prefetch_job.h"

#include <algorithm>
#include <cstring>
#include <future>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "daemon/resp_reader.h"
#include "spdlog/spdlog.h"

namespace kvtier::daemon {
namespace {

// Runs fn(i) for every i in [0, n) on up to `threads` threads (the caller's
// among them), i spread round-robin; returns when every call returned.
template <typename Fn>
void ParallelFor(size_t n, size_t threads, const Fn& fn) {
  threads = std::max<size_t>(1, std::min(threads, n));
  auto run = [&](size_t begin) {
    for (size_t i = begin; i < n; i += threads) fn(i);
  };
  std::vector<std::future<void>> others;
  for (size_t t = 1; t < threads; ++t) {
    others.push_back(std::async(std::launch::async, run, t));
  }
  run(0);
  for (auto& f : others) f.get();
}

constexpr uint32_t kNoSlot = ~0u;

}  // namespace

ClusterDigest ClusterDigestOf(const TierNamespace& ns, const HashKey& key,
                              uint32_t rank) {
  return ClusterKeyDigest(ns.name, ns.fingerprint,
                          KeyString(key, ns.hash_bytes), rank);
}

ClusterValueShape ClusterShapeOf(const TierNamespace& ns, const HashKey& key,
                                 uint32_t rank) {
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

PrefetchJob::PrefetchJob(std::shared_ptr<TierNamespace> ns,
                         ClusterTier* cluster, std::vector<HashKey> keys,
                         uint32_t from, uint32_t to,
                         std::function<bool()> closing,
                         std::function<void(const char*)> hook)
    : ns_(std::move(ns)),
      cluster_(cluster),
      keys_(std::move(keys)),
      from_(from),
      to_(to),
      closing_(std::move(closing)),
      hook_(std::move(hook)),
      ranks_(ns_->stored_ranks),
      banks_(ns_->layout.page_banks_size()),
      pos_(from),
      fetch_at_(from) {
  for (uint32_t r = 0; r < ranks_; ++r) {
    const uint64_t value_bytes =
        ClusterValueBytes(ClusterShapeOf(*ns_, keys_[from_], r), true);
    page_bytes_ += value_bytes;
    max_value_bytes_ = std::max(max_value_bytes_, value_bytes);
  }
  const ClusterTierOptions& o = cluster_->options();
  slice_pages_ = static_cast<uint32_t>(std::max<uint64_t>(
      1, std::min<uint64_t>(
             o.prefetch_slice_pages,
             o.prefetch_slice_bytes / std::max<uint64_t>(1, page_bytes_))));
}

// A slice still out owns its arena, and its future (declared after the
// arena) waits for the fetch when destroyed, before the arena goes.
PrefetchJob::~PrefetchJob() = default;

void PrefetchJob::Run() {
  const size_t in_flight = cluster_->options().prefetch_in_flight;
  while (pos_ < to_) {
    if (closing_()) {
      cut_ = true;
      break;
    }
    // The next slices' GETs are out while this one is checked, copied and
    // committed (prefetch_in_flight slices in all, a thread each).
    while (inflight_.size() < in_flight && fetch_at_ < to_) {
      inflight_.push_back(Fetch(fetch_at_));
      fetch_at_ += inflight_.back().n;
    }
    Slice slice = std::move(inflight_.front());
    inflight_.pop_front();
    absl::Time t = absl::Now();
    auto lap = [&t](absl::Duration* stage) {
      const absl::Time now = absl::Now();
      *stage += now - t;
      t = now;
    };
    const uint32_t avail = Arrived(slice);
    lap(&stages_.wait);
    if (avail == 0 || !Allocate(slice, avail)) {
      cut_ = true;
      break;
    }
    lap(&stages_.commit);
    const uint32_t good = CheckAndCopy(slice, avail);
    spare_arenas_.push_back(std::move(slice.arena));
    lap(&stages_.check);
    if (good < avail) GiveBack(slice, good);
    if (good == 0 || !Commit(slice, good)) {
      cut_ = true;
      break;
    }
    lap(&stages_.commit);
    {
      absl::MutexLock lock(&ns_->prefetch_mu);
      for (uint32_t i = pos_; i < pos_ + good; ++i) {
        ns_->prefetching.erase(KeyString(keys_[i], ns_->hash_bytes));
      }
    }
    committed_ += good;
    pos_ += good;
    if (good < slice.n) {
      cut_ = true;
      break;
    }
  }
  Finish();
}

PrefetchJob::Slice PrefetchJob::Fetch(uint32_t at) {
  Slice f;
  f.at = at;
  f.n = std::min(slice_pages_, to_ - at);
  // Each slice's values are read straight into an arena (no copy but the
  // kernel's), reused from slice to slice.
  if (spare_arenas_.empty()) {
    f.arena = std::make_unique<ValueArena>();
  } else {
    f.arena = std::move(spare_arenas_.back());
    spare_arenas_.pop_back();
  }
  // Room for every value, each rounded up to the arena's alignment.
  f.arena->Reset(size_t{f.n} *
                 (page_bytes_ + size_t{ranks_} * ValueArena::kAlign));
  std::vector<std::string> names;
  names.reserve(size_t{f.n} * ranks_);
  f.shapes.reserve(size_t{f.n} * ranks_);
  for (uint32_t p = 0; p < f.n; ++p) {
    for (uint32_t r = 0; r < ranks_; ++r) {
      f.shapes.push_back(ClusterShapeOf(*ns_, keys_[at + p], r));
      names.push_back(ClusterKeyName(f.shapes.back().digest));
    }
  }
  f.values = std::async(
      std::launch::async,
      [cluster = cluster_, names = std::move(names), max = max_value_bytes_,
       arena = f.arena.get()] { return cluster->Fetch(names, max, arena); });
  return f;
}

uint32_t PrefetchJob::Arrived(Slice& slice) {
  slice.fetched = slice.values.get();
  // A miss or an error ends the slice there.
  uint32_t avail = 0;
  for (; avail < slice.n; ++avail) {
    bool all = true;
    for (uint32_t r = 0; r < ranks_ && all; ++r) {
      all = slice.fetched[size_t{avail} * ranks_ + r].ok();
    }
    if (!all) break;
  }
  slice.page_rows.assign(ranks_, {});
  slice.snap_rows.assign(ranks_, {});
  slice.snap_pages.assign(ranks_, {});
  for (uint32_t p = 0; p < avail; ++p) {
    for (uint32_t r = 0; r < ranks_; ++r) {
      const size_t i = size_t{p} * ranks_ + r;
      const ClusterValueShape& shape = slice.shapes[i];
      if (shape.snapshot_bytes > 0 &&
          slice.fetched[i]->size() ==
              ClusterValueBytes(shape, /*snapshot=*/true)) {
        slice.snap_pages[r].push_back(p);
      }
    }
  }
  return avail;
}

bool PrefetchJob::Allocate(Slice& slice, uint32_t avail) {
  // Rows are taken before the values are checked, so that each value is
  // copied while its check left it in cache; a page that then fails gives
  // its rows back (what the allocation evicted for it stays evicted:
  // values that fail are rare, and never served).
  TierNamespace& ns = *ns_;
  absl::MutexLock lock(&ns.mu);
  if (ns.dropped) {
    pin_ = kNoNode;  // Cleared with the index.
    return false;
  }
  if (pos_ > 0 && pin_ == kNoNode) {
    const uint32_t node = ns.index->NodeOf(keys_[pos_ - 1]);
    if (node == kNoNode) return false;  // The local match's end went.
    ns.index->Pin(node);
    ++ns.prefetch_pins;
    pin_ = node;
  }
  ns.ApplyPendingTouches();
  absl::Status failed;
  uint32_t r = 0;
  for (; r < ranks_; ++r) {
    auto rows = ns.index->AllocateRows(
        r, avail, static_cast<uint32_t>(slice.snap_pages[r].size()));
    if (!rows.ok()) {
      failed = rows.status();
      break;
    }
    slice.page_rows[r] = std::move(rows->page_rows);
    slice.snap_rows[r] = std::move(rows->snapshot_rows);
  }
  // The rows may be evicted pages' rows: their reservation is in the
  // journal before any byte is copied into them, so that a replay takes
  // them from their old owners. When this fails nothing was written into
  // them: freed unrecorded, they keep their old bytes.
  for (uint32_t q = 0; failed.ok() && ns.journal != nullptr && q < ranks_;
       ++q) {
    failed = ns.Journal(
        ns.journal->AppendReserve(q, slice.page_rows[q], slice.snap_rows[q]));
    if (!failed.ok()) r = ranks_;
  }
  if (!failed.ok()) {
    for (uint32_t q = 0; q < r; ++q) {
      (void)ns.index->FreePageRows(q, slice.page_rows[q]);
      (void)ns.index->FreeSnapshotRows(q, slice.snap_rows[q]);
    }
    ns.TellRemoved();
    SPDLOG_INFO("namespace '{}': prefetch stops after {} pages: {}", ns.name,
                committed_, failed.ToString());
    return false;
  }
  for (uint32_t q = 0; q < ranks_; ++q) {
    ns.prefetch_page_rows[q] += slice.page_rows[q].size();
    ns.prefetch_snapshot_rows[q] += slice.snap_rows[q].size();
  }
  ns.TellRemoved();  // What the allocation evicted.
  return true;
}

uint32_t PrefetchJob::CheckAndCopy(Slice& slice, uint32_t avail) {
  // In parallel, on CheckThreads() threads (the HMAC is the costliest step
  // per byte): the rows are this job's alone, invisible to lookups and
  // reservations until committed. The s-th snapshot row of rank r holds
  // the snapshot of page snap_pages[r][s].
  TierNamespace& ns = *ns_;
  std::vector<uint32_t> snap_slot(size_t{avail} * ranks_, kNoSlot);
  for (uint32_t r = 0; r < ranks_; ++r) {
    for (size_t s = 0; s < slice.snap_pages[r].size(); ++s) {
      snap_slot[size_t{slice.snap_pages[r][s]} * ranks_ + r] =
          static_cast<uint32_t>(s);
    }
  }
  std::vector<absl::Status> checked(size_t{avail} * ranks_);
  ParallelFor(size_t{avail} * ranks_, cluster_->CheckThreads(), [&](size_t i) {
    absl::StatusOr<DecodedClusterValue> d =
        DecodeClusterValue(cluster_->key(), *slice.fetched[i], slice.shapes[i]);
    if (!d.ok()) {
      checked[i] = d.status();
      return;
    }
    if (d->has_snapshot != (snap_slot[i] != kNoSlot)) {
      checked[i] = absl::DataLossError(
          "cluster value: snapshot flag does not match its size");
      return;
    }
    const uint32_t p = static_cast<uint32_t>(i / ranks_);
    const uint32_t r = static_cast<uint32_t>(i % ranks_);
    for (size_t b = 0; b < banks_; ++b) {
      std::memcpy(ns.segments[r][b]->row(slice.page_rows[r][p]),
                  d->banks[b].data(), d->banks[b].size());
    }
    if (d->has_snapshot) {
      std::memcpy(ns.segments[r][banks_]->row(slice.snap_rows[r][snap_slot[i]]),
                  d->snapshot.data(), d->snapshot.size());
    }
  });
  hook_("prefetch:copied");
  uint32_t good = 0;
  for (; good < avail; ++good) {
    bool bad = false;
    for (uint32_t r = 0; r < ranks_ && !bad; ++r) {
      const absl::Status& st = checked[size_t{good} * ranks_ + r];
      if (st.ok()) continue;
      bad = true;
      cluster_->CountRejected();
      SPDLOG_WARN(
          "namespace '{}': cluster value of page {} rank {} refused: {}",
          ns.name, pos_ + good, r, st.ToString());
    }
    if (bad) break;
  }
  return good;
}

void PrefetchJob::GiveBack(Slice& slice, uint32_t good) {
  // Their release is journaled (nothing writes them any more): a restart
  // neither fences them nor hands them back to what they held before.
  // Should the record fail, they stay outstanding in the journal: fenced,
  // never served.
  TierNamespace& ns = *ns_;
  absl::MutexLock lock(&ns.mu);
  for (uint32_t r = 0; r < ranks_; ++r) {
    const std::vector<uint32_t>& sp = slice.snap_pages[r];
    const size_t s = static_cast<size_t>(
        std::lower_bound(sp.begin(), sp.end(), good) - sp.begin());
    const absl::Span<const uint32_t> pages_back =
        absl::MakeConstSpan(slice.page_rows[r]).subspan(good);
    const absl::Span<const uint32_t> snaps_back =
        absl::MakeConstSpan(slice.snap_rows[r]).subspan(s);
    ns.prefetch_page_rows[r] -= pages_back.size();
    ns.prefetch_snapshot_rows[r] -= snaps_back.size();
    if (!ns.dropped) {
      (void)ns.index->FreePageRows(r, pages_back);
      (void)ns.index->FreeSnapshotRows(r, snaps_back);
      if (ns.journal != nullptr) {
        (void)ns.Journal(ns.journal->AppendRelease(r, pages_back, snaps_back));
      }
    }
    slice.page_rows[r].resize(good);
    slice.snap_rows[r].resize(s);
    slice.snap_pages[r].resize(s);
  }
}

bool PrefetchJob::Commit(Slice& slice, uint32_t good) {
  TierNamespace& ns = *ns_;
  const absl::Span<const HashKey> keys(keys_.data() + pos_, good);
  const HashKey* parent = pos_ > 0 ? &keys_[pos_ - 1] : nullptr;
  absl::MutexLock lock(&ns.mu);
  if (ns.dropped) {
    pin_ = kNoNode;
    return false;
  }
  bool failed = false;
  for (uint32_t r = 0; r < ranks_; ++r) {
    const std::vector<uint32_t>& rows = slice.page_rows[r];
    const std::vector<uint32_t>& snap_rows = slice.snap_rows[r];
    ns.prefetch_page_rows[r] -= rows.size();
    ns.prefetch_snapshot_rows[r] -= snap_rows.size();
    std::vector<PrefixIndex::SnapshotPlacement> placements;
    for (size_t s = 0; s < slice.snap_pages[r].size(); ++s) {
      placements.push_back({snap_rows[s], keys[slice.snap_pages[r][s]]});
    }
    auto result = failed ? absl::StatusOr<PrefixIndex::CommitResult>(
                               absl::AbortedError("an earlier rank failed"))
                         : ns.index->Commit(r, parent, keys, rows, placements);
    if (!result.ok()) {
      if (!failed) {
        SPDLOG_WARN("namespace '{}': prefetch commit: {}", ns.name,
                    result.status().ToString());
      }
      failed = true;
      (void)ns.index->FreePageRows(r, rows);
      (void)ns.index->FreeSnapshotRows(r, snap_rows);
      if (ns.journal != nullptr) {
        (void)ns.Journal(ns.journal->AppendRelease(r, rows, snap_rows));
      }
      continue;
    }
    TierCommit commit;
    commit.origin = TierCommit::Origin::kPrefetch;
    commit.rank = r;
    commit.parent = parent;
    commit.keys = keys;
    commit.rows = rows;
    commit.snapshots = placements;
    commit.result = &*result;
    ns.Committed(commit);
    if (ns.journal != nullptr) {
      (void)ns.Journal(ns.journal->AppendCommit(
          r, parent, keys, rows, placements, result->freed_page_rows,
          result->freed_snapshot_rows));
    }
  }
  if (failed) return false;
  const uint32_t node = ns.index->NodeOf(keys.back());
  if (node != kNoNode) {
    ns.index->Pin(node);
    ++ns.prefetch_pins;
  }
  if (pin_ != kNoNode) {
    (void)ns.index->Unpin(pin_);
    --ns.prefetch_pins;
  }
  pin_ = node;
  return true;
}

void PrefetchJob::Finish() {
  TierNamespace& ns = *ns_;
  {
    absl::MutexLock lock(&ns.mu);
    if (pin_ != kNoNode && !ns.dropped) {
      (void)ns.index->Unpin(pin_);
      --ns.prefetch_pins;
    }
    pin_ = kNoNode;
  }
  {
    absl::MutexLock lock(&ns.prefetch_mu);
    for (uint32_t i = pos_; i < to_; ++i) {
      ns.prefetching.erase(KeyString(keys_[i], ns.hash_bytes));
    }
  }
  inflight_.clear();  // Waits for the slices still out.
  cluster_->CountPrefetch(committed_, cut_);
  cluster_->CountPrefetchStages(stages_);
  SPDLOG_DEBUG("namespace '{}': prefetched {} of {} pages", ns.name, committed_,
               to_ - from_);
}

}  // namespace kvtier::daemon
