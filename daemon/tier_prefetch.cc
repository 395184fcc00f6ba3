// TierCore's prefetch job (tier_cluster.cc starts it): pages of a chain
// fetched from the cluster tier, checked, copied into newly allocated rows
// and committed, slice by slice.
//
// Per slice: (1) fetch every rank's value of its pages, with no lock, into
// an arena of the job's (the values are checked where the socket put
// them), up to prefetch_in_flight slices' GETs out at once, each slice on a
// thread and connections of its own, and take the leading pages whose
// every value arrived; (2) under the namespace's lock, pin the chain's end
// (the page before the slice), allocate their rows (evicting as a Reserve
// would) and journal them as reserved, before anything is copied into
// them (journal.h: a restart must never give an evicted page back rows
// that now hold other bytes); (3) with no lock, check each value
// (DecodeClusterValue) and copy the ones that pass into their rows: the
// rows are allocated-uncommitted and this job's alone, invisible to
// lookups and to every reservation; keep the leading pages whose every
// value passed and give the other rows back, journaling their release;
// (4) under the lock, commit the kept pages for every rank and journal the
// commit, then move the pin to the slice's last page. A dropped namespace (its
// index cleared) or a core shutting down ends the job at its next step; so
// does anything that fails: what was committed stays, the rest is a miss.
//
// Thread-safety: runs on a ClusterTier job thread; takes the namespace's
// locks as tier_core.h orders them.
#include <algorithm>
#include <cstring>
#include <deque>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "daemon/cluster_tier.h"
#include "daemon/cluster_value.h"
#include "daemon/resp_reader.h"
#include "daemon/tier_core.h"
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

}  // namespace

void TierCore::RunPrefetch(const std::shared_ptr<Namespace>& nsp,
                           const std::vector<HashKey>& keys, uint32_t from,
                           uint32_t to) {
  Namespace& ns = *nsp;
  ClusterTier* cluster = options_.cluster;
  const uint32_t ranks = ns.stored_ranks;
  const size_t banks = ns.layout.page_banks_size();
  uint64_t page_bytes = 0;
  uint64_t max_value_bytes = 0;  // A larger value is refused unread.
  for (uint32_t r = 0; r < ranks; ++r) {
    const uint64_t value_bytes =
        ClusterValueBytes(ClusterShapeOf(ns, keys[from], r), true);
    page_bytes += value_bytes;
    max_value_bytes = std::max(max_value_bytes, value_bytes);
  }
  const uint32_t slice_pages = static_cast<uint32_t>(std::max<uint64_t>(
      1, std::min<uint64_t>(cluster->options().prefetch_slice_pages,
                            cluster->options().prefetch_slice_bytes /
                                std::max<uint64_t>(1, page_bytes))));
  uint32_t pos = from;
  uint64_t committed = 0;
  bool cut = false;
  uint32_t pin = kNoNode;  // Our pin on the chain's end, once taken.
  auto closing = [this] {
    absl::MutexLock lock(&jobs_mu_);
    return closing_;
  };
  // The next slices' GETs are out while this one is checked, copied and
  // committed (prefetch_in_flight slices in all, a thread each); values are
  // checked and copied into their rows on CheckThreads() threads (the HMAC
  // is the costliest step per byte).
  // Each slice's values are read straight into an arena (no copy but the
  // kernel's), one per slice in flight, reused from slice to slice.
  struct Pending {
    uint32_t at = 0, n = 0;
    // What each value must be (its key's digest among it), page by page.
    std::vector<ClusterValueShape> shapes;
    // Declared before `values`, so destroyed after the fetch that fills
    // it has finished (a future of std::async waits when destroyed).
    std::unique_ptr<ValueArena> arena;
    std::future<std::vector<absl::StatusOr<absl::string_view>>> values;
  };
  std::vector<std::unique_ptr<ValueArena>> spare_arenas;
  auto start_fetch = [&](uint32_t at) {
    Pending f;
    f.at = at;
    f.n = std::min(slice_pages, to - at);
    if (spare_arenas.empty()) {
      f.arena = std::make_unique<ValueArena>();
    } else {
      f.arena = std::move(spare_arenas.back());
      spare_arenas.pop_back();
    }
    // Room for every value, each rounded up to the arena's alignment.
    f.arena->Reset(size_t{f.n} *
                   (page_bytes + size_t{ranks} * ValueArena::kAlign));
    std::vector<std::string> names;
    names.reserve(size_t{f.n} * ranks);
    f.shapes.reserve(size_t{f.n} * ranks);
    for (uint32_t p = 0; p < f.n; ++p) {
      for (uint32_t r = 0; r < ranks; ++r) {
        f.shapes.push_back(ClusterShapeOf(ns, keys[at + p], r));
        names.push_back(ClusterKeyName(f.shapes.back().digest));
      }
    }
    f.values = std::async(
        std::launch::async, [cluster, names = std::move(names), max_value_bytes,
                             arena = f.arena.get()] {
          return cluster->Fetch(names, max_value_bytes, arena);
        });
    return f;
  };
  const size_t in_flight = cluster->options().prefetch_in_flight;
  const size_t check_threads = cluster->CheckThreads();
  ClusterTier::PrefetchStages stages;
  // Slices whose GETs are out, in chain order; the front one is `pos`'s.
  std::deque<Pending> inflight;
  uint32_t fetch_at = pos;
  while (pos < to) {
    if (closing()) {
      cut = true;
      break;
    }
    while (inflight.size() < in_flight && fetch_at < to) {
      inflight.push_back(start_fetch(fetch_at));
      fetch_at += inflight.back().n;
    }
    Pending current = std::move(inflight.front());
    inflight.pop_front();
    const uint32_t n = current.n;
    absl::Time t = absl::Now();
    auto lap = [&t](absl::Duration* stage) {
      const absl::Time now = absl::Now();
      *stage += now - t;
      t = now;
    };
    const std::vector<absl::StatusOr<absl::string_view>> fetched =
        current.values.get();
    lap(&stages.wait);
    // (1) The leading pages whose every rank's value arrived (a miss or an
    // error ends the slice there). Which of them carry a snapshot is read
    // off their sizes: unverified, it only sizes the allocation; the check
    // below decides.
    uint32_t avail = 0;
    for (; avail < n; ++avail) {
      bool all = true;
      for (uint32_t r = 0; r < ranks && all; ++r) {
        all = fetched[size_t{avail} * ranks + r].ok();
      }
      if (!all) break;
    }
    if (avail == 0) {
      cut = true;
      break;
    }
    std::vector<std::vector<uint32_t>> page_rows(ranks), snap_rows(ranks);
    std::vector<std::vector<uint32_t>> snap_pages(ranks);  // Page of each.
    for (uint32_t p = 0; p < avail; ++p) {
      for (uint32_t r = 0; r < ranks; ++r) {
        const ClusterValueShape& shape = current.shapes[size_t{p} * ranks + r];
        if (shape.snapshot_bytes > 0 &&
            fetched[size_t{p} * ranks + r]->size() ==
                ClusterValueBytes(shape, /*snapshot=*/true)) {
          snap_pages[r].push_back(p);
        }
      }
    }
    // (2) Pin the chain's end, allocate and journal the reservation. Rows
    // are taken before the values are checked, so that each value is copied
    // while its check left it in cache; a page that then fails gives its
    // rows back (what the allocation evicted for it stays evicted: values
    // that fail are rare, and never served).
    HashKey parent;
    const bool has_parent = pos > 0;
    if (has_parent) parent = keys[pos - 1];
    {
      absl::MutexLock lock(&ns.mu);
      if (ns.dropped) {
        pin = kNoNode;  // Cleared with the index.
        cut = true;
        break;
      }
      if (has_parent && pin == kNoNode) {
        const uint32_t node = ns.index->NodeOf(parent);
        if (node == kNoNode) {  // The local match's end went meanwhile.
          cut = true;
          break;
        }
        ns.index->Pin(node);
        ++ns.prefetch_pins;
        pin = node;
      }
      ns.ApplyPendingTouches();
      absl::Status failed;
      uint32_t r = 0;
      for (; r < ranks; ++r) {
        auto rows = ns.index->AllocateRows(
            r, avail, static_cast<uint32_t>(snap_pages[r].size()));
        if (!rows.ok()) {
          failed = rows.status();
          break;
        }
        page_rows[r] = std::move(rows->page_rows);
        snap_rows[r] = std::move(rows->snapshot_rows);
      }
      // The rows may be evicted pages' rows: their reservation is in the
      // journal before any byte is copied into them, so that a replay takes
      // them from their old owners. When this fails nothing was written
      // into them: freed unrecorded, they keep their old bytes.
      for (uint32_t q = 0; failed.ok() && ns.journal != nullptr && q < ranks;
           ++q) {
        failed = ns.Journal(
            ns.journal->AppendReserve(q, page_rows[q], snap_rows[q]));
        if (!failed.ok()) r = ranks;
      }
      if (!failed.ok()) {
        for (uint32_t q = 0; q < r; ++q) {
          (void)ns.index->FreePageRows(q, page_rows[q]);
          (void)ns.index->FreeSnapshotRows(q, snap_rows[q]);
        }
        PublishRemoved(ns);
        SPDLOG_INFO("namespace '{}': prefetch stops after {} pages: {}",
                    ns.name, committed, failed.ToString());
        cut = true;
        break;
      }
      for (uint32_t q = 0; q < ranks; ++q) {
        ns.prefetch_page_rows[q] += page_rows[q].size();
        ns.prefetch_snapshot_rows[q] += snap_rows[q].size();
      }
      PublishRemoved(ns);  // What the allocation evicted.
    }
    lap(&stages.commit);
    // (3) Check each value and, if it passes, copy it into its rows at once,
    // in parallel: the rows are this job's alone, invisible to lookups and
    // reservations until committed. The s-th snapshot row of rank r holds
    // the snapshot of page snap_pages[r][s].
    constexpr uint32_t kNoSlot = ~0u;
    std::vector<uint32_t> snap_slot(size_t{avail} * ranks, kNoSlot);
    for (uint32_t r = 0; r < ranks; ++r) {
      for (size_t s = 0; s < snap_pages[r].size(); ++s) {
        snap_slot[size_t{snap_pages[r][s]} * ranks + r] =
            static_cast<uint32_t>(s);
      }
    }
    std::vector<absl::Status> checked(size_t{avail} * ranks);
    ParallelFor(size_t{avail} * ranks, check_threads, [&](size_t i) {
      absl::StatusOr<DecodedClusterValue> d =
          DecodeClusterValue(cluster->key(), *fetched[i], current.shapes[i]);
      if (!d.ok()) {
        checked[i] = d.status();
        return;
      }
      if (d->has_snapshot != (snap_slot[i] != kNoSlot)) {
        checked[i] = absl::DataLossError(
            "cluster value: snapshot flag does not match its size");
        return;
      }
      const uint32_t p = static_cast<uint32_t>(i / ranks);
      const uint32_t r = static_cast<uint32_t>(i % ranks);
      for (size_t b = 0; b < banks; ++b) {
        std::memcpy(ns.segments[r][b]->row(page_rows[r][p]), d->banks[b].data(),
                    d->banks[b].size());
      }
      if (d->has_snapshot) {
        std::memcpy(ns.segments[r][banks]->row(snap_rows[r][snap_slot[i]]),
                    d->snapshot.data(), d->snapshot.size());
      }
    });
    Hook("prefetch:copied");
    // The leading pages whose every rank passed.
    uint32_t good = 0;
    for (; good < avail; ++good) {
      bool bad = false;
      for (uint32_t r = 0; r < ranks && !bad; ++r) {
        const absl::Status& st = checked[size_t{good} * ranks + r];
        if (st.ok()) continue;
        bad = true;
        cluster->CountRejected();
        SPDLOG_WARN(
            "namespace '{}': cluster value of page {} rank {} "
            "refused: {}",
            ns.name, pos + good, r, st.ToString());
      }
      if (bad) break;
    }
    spare_arenas.push_back(std::move(current.arena));
    lap(&stages.check);
    // Rows of the pages past the last good one go back, their release
    // journaled (nothing writes them any more): a restart neither fences
    // them nor hands them back to what they held before. Should the record
    // fail, they stay outstanding in the journal: fenced, never served.
    if (good < avail) {
      absl::MutexLock lock(&ns.mu);
      for (uint32_t r = 0; r < ranks; ++r) {
        const size_t s = static_cast<size_t>(
            std::lower_bound(snap_pages[r].begin(), snap_pages[r].end(), good) -
            snap_pages[r].begin());
        const absl::Span<const uint32_t> pages_back =
            absl::MakeConstSpan(page_rows[r]).subspan(good);
        const absl::Span<const uint32_t> snaps_back =
            absl::MakeConstSpan(snap_rows[r]).subspan(s);
        ns.prefetch_page_rows[r] -= pages_back.size();
        ns.prefetch_snapshot_rows[r] -= snaps_back.size();
        if (!ns.dropped) {
          (void)ns.index->FreePageRows(r, pages_back);
          (void)ns.index->FreeSnapshotRows(r, snaps_back);
          if (ns.journal != nullptr) {
            (void)ns.Journal(
                ns.journal->AppendRelease(r, pages_back, snaps_back));
          }
        }
        page_rows[r].resize(good);
        snap_rows[r].resize(s);
        snap_pages[r].resize(s);
      }
    }
    if (good == 0) {
      cut = true;
      break;
    }
    // (4) Commit every rank, journal, move the pin.
    const absl::Span<const HashKey> slice_keys(keys.data() + pos, good);
    {
      absl::MutexLock lock(&ns.mu);
      if (ns.dropped) {
        pin = kNoNode;
        cut = true;
        break;
      }
      bool failed = false;
      for (uint32_t r = 0; r < ranks; ++r) {
        ns.prefetch_page_rows[r] -= page_rows[r].size();
        ns.prefetch_snapshot_rows[r] -= snap_rows[r].size();
        std::vector<PrefixIndex::SnapshotPlacement> placements;
        for (size_t s = 0; s < snap_pages[r].size(); ++s) {
          placements.push_back({snap_rows[r][s], slice_keys[snap_pages[r][s]]});
        }
        auto result =
            failed ? absl::StatusOr<PrefixIndex::CommitResult>(
                         absl::AbortedError("an earlier rank failed"))
                   : ns.index->Commit(r, has_parent ? &parent : nullptr,
                                      slice_keys, page_rows[r], placements);
        if (!result.ok()) {
          if (!failed) {
            SPDLOG_WARN("namespace '{}': prefetch commit: {}", ns.name,
                        result.status().ToString());
          }
          failed = true;
          (void)ns.index->FreePageRows(r, page_rows[r]);
          (void)ns.index->FreeSnapshotRows(r, snap_rows[r]);
          if (ns.journal != nullptr) {
            (void)ns.Journal(
                ns.journal->AppendRelease(r, page_rows[r], snap_rows[r]));
          }
          continue;
        }
        PublishStored(ns, has_parent ? &parent : nullptr, slice_keys,
                      result->completed, {});
        if (ns.journal != nullptr) {
          (void)ns.Journal(ns.journal->AppendCommit(
              r, has_parent ? &parent : nullptr, slice_keys, page_rows[r],
              placements, result->freed_page_rows,
              result->freed_snapshot_rows));
        }
        ns.committed_pages += result->committed_pages;
        ns.committed_snapshots += result->committed_snapshots;
      }
      if (failed) {
        cut = true;
        break;
      }
      const uint32_t node = ns.index->NodeOf(slice_keys.back());
      if (node != kNoNode) {
        ns.index->Pin(node);
        ++ns.prefetch_pins;
      }
      if (pin != kNoNode) {
        (void)ns.index->Unpin(pin);
        --ns.prefetch_pins;
      }
      pin = node;
    }
    lap(&stages.commit);
    {
      absl::MutexLock lock(&ns.prefetch_mu);
      for (const HashKey& k : slice_keys) {
        ns.prefetching.erase(KeyString(k, ns.hash_bytes));
      }
    }
    committed += good;
    pos += good;
    if (good < n) {
      cut = true;
      break;
    }
  }
  {
    absl::MutexLock lock(&ns.mu);
    if (pin != kNoNode && !ns.dropped) {
      (void)ns.index->Unpin(pin);
      --ns.prefetch_pins;
    }
  }
  {
    absl::MutexLock lock(&ns.prefetch_mu);
    for (uint32_t i = pos; i < to; ++i) {
      ns.prefetching.erase(KeyString(keys[i], ns.hash_bytes));
    }
  }
  // Slices still out are waited for (their futures' destructors) before
  // their arenas go.
  inflight.clear();
  cluster->CountPrefetch(committed, cut);
  cluster->CountPrefetchStages(stages);
  SPDLOG_DEBUG("namespace '{}': prefetched {} of {} pages", ns.name, committed,
               to - from);
}

}  // namespace kvtier::daemon
