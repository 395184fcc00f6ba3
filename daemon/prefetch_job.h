// PrefetchJob: one prefetch from the cluster tier into the host tier (the
// Prefetch RPC's work, started by ClusterBridge on a ClusterTier job
// thread): pages [from, to) of a chain fetched, checked, copied into newly
// allocated rows and committed, slice by slice, each step a method.
//
// Per slice: (1) Fetch: every rank's value of its pages, with no lock, into
// an arena of the job's (the values are checked where the socket put
// them), up to prefetch_in_flight slices' GETs out at once, each slice on a
// thread and connections of its own; Arrived takes the leading pages whose
// every value arrived. (2) Allocate: under the namespace's lock, pin the
// chain's end (the page before the slice), allocate their rows (evicting as
// a Reserve would) and journal them as reserved, before anything is copied
// into them (journal.h: a restart must never give an evicted page back
// rows that now hold other bytes). (3) CheckAndCopy: with no lock, check
// each value (DecodeClusterValue) and copy the ones that pass into their
// rows: the rows are allocated-uncommitted and this job's alone, invisible
// to lookups and to every reservation; GiveBack returns the rows of pages
// past the leading ones whose every value passed, journaling their
// release. (4) Commit: under the lock, commit the kept pages for every rank
// and journal the commit, then move the pin to the slice's last page. A
// dropped namespace (its index cleared) or a core shutting down ends the
// job at its next step; so does anything that fails: what was committed
// stays, the rest is a miss.
//
// Thread-safety: a job is used by the one thread that runs it (it starts
// fetch threads of its own); it takes the namespace's locks as
// tier_core.h orders them.
#ifndef KVTIER_DAEMON_PREFETCH_JOB_H_
#define KVTIER_DAEMON_PREFETCH_JOB_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "daemon/cluster_tier.h"
#include "daemon/cluster_value.h"
#include "daemon/tier_namespace.h"
#include "daemon/tier_observer.h"

namespace kvtier::daemon {

// The digest naming page `key` of stored rank `rank` of ns in the cluster
// tier (its Redis key is ClusterKeyName of it), and the shape of its value.
ClusterDigest ClusterDigestOf(const TierNamespace& ns, const HashKey& key,
                              uint32_t rank);
ClusterValueShape ClusterShapeOf(const TierNamespace& ns, const HashKey& key,
                                 uint32_t rank);

class PrefetchJob {
 public:
  // Brings pages [from, to) of `keys` into `ns` (REQUIRES: from < to <=
  // keys.size(), the pages claimed in ns->prefetching; the job unclaims
  // them). `closing` says the core shuts down; `hook` is the core's test
  // hook ("prefetch:copied").
  PrefetchJob(std::shared_ptr<TierNamespace> ns, ClusterTier* cluster,
              std::vector<HashKey> keys, uint32_t from, uint32_t to,
              std::function<bool()> closing,
              std::function<void(const char*)> hook);
  ~PrefetchJob();
  PrefetchJob(const PrefetchJob&) = delete;
  PrefetchJob& operator=(const PrefetchJob&) = delete;

  // Runs the job to its end and counts it in the cluster tier.
  void Run();

 private:
  // One slice: its GETs, then the rows it was given.
  struct Slice {
    uint32_t at = 0, n = 0;
    // What each value must be (its key's digest among it), page by page.
    std::vector<ClusterValueShape> shapes;
    // Declared before `values`, so destroyed after the fetch that fills
    // it has finished (a future of std::async waits when destroyed).
    std::unique_ptr<ValueArena> arena;
    std::future<std::vector<absl::StatusOr<absl::string_view>>> values;
    std::vector<absl::StatusOr<absl::string_view>> fetched;
    // Per rank: its rows, its snapshot rows, and the page of each snapshot.
    std::vector<std::vector<uint32_t>> page_rows, snap_rows, snap_pages;
  };

  // Sends the GETs of the slice at `at`.
  Slice Fetch(uint32_t at);
  // Waits for the slice's values; returns the leading pages whose every
  // rank's value arrived, and notes which carry a snapshot (read off their
  // sizes: unverified, it only sizes the allocation).
  uint32_t Arrived(Slice& slice);
  // Pins the chain's end, allocates the rows of the slice's first `avail`
  // pages and journals them as reserved. False: the job ends.
  bool Allocate(Slice& slice, uint32_t avail);
  // Checks each value and copies those that pass into their rows; returns
  // the leading pages whose every rank passed.
  uint32_t CheckAndCopy(Slice& slice, uint32_t avail);
  // Gives back (journaled) the rows of the pages from `good` on.
  void GiveBack(Slice& slice, uint32_t good);
  // Commits the slice's first `good` pages for every rank, journaled, and
  // moves the pin to the last. False: the job ends.
  bool Commit(Slice& slice, uint32_t good);
  // Unpins, unclaims what was not brought in, counts the job.
  void Finish();

  const std::shared_ptr<TierNamespace> ns_;
  ClusterTier* const cluster_;
  const std::vector<HashKey> keys_;
  const uint32_t from_, to_;
  const std::function<bool()> closing_;
  const std::function<void(const char*)> hook_;
  const uint32_t ranks_;
  const size_t banks_;
  uint64_t page_bytes_ = 0;       // A page's values, every rank.
  uint64_t max_value_bytes_ = 0;  // A larger value is refused unread.
  uint32_t slice_pages_ = 1;

  uint32_t pos_;            // The next page to bring in.
  uint32_t fetch_at_;       // The next page to fetch.
  uint64_t committed_ = 0;  // Pages brought in.
  bool cut_ = false;        // Ended before `to_`.
  uint32_t pin_ = kNoNode;  // Our pin on the chain's end, once taken.
  // Slices whose GETs are out, in chain order; the front one is pos_'s.
  std::deque<Slice> inflight_;
  // Arenas of finished slices, reused (one per slice in flight).
  std::vector<std::unique_ptr<ValueArena>> spare_arenas_;
  ClusterTier::PrefetchStages stages_;
};

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_PREFETCH_JOB_H_
