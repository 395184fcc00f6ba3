// index_bench's background part (issue 27, item 5): in-process lookup
// latency of a large namespace while its journal is checkpointed and while
// its evictions spill to the cluster tier, beside the lookups of another
// namespace of the same TierCore.
//
// Each TierCore keeps its journals in a fresh folder under
// BackgroundOptions::state_parent (a disk folder: the JSON names its
// filesystem) and its banks under /dev/shm. A few lookup threads look up
// chains of the large namespace, each alternating an unpinned lookup and a
// pinned lookup followed by the Release of its lease, and one more thread
// (or as many as asked) does the same in the other namespace; a writer
// thread, when the phase has one, Reserve+Commits new chains into the large
// namespace at a steady rate. The phases:
//  - journal: "quiet" (no writer) and "commits" (the writer, the default
//    compaction threshold: no checkpoint expected) on one core; then, on
//    a core whose compaction threshold is tiny, a few checkpoints alone
//    (one Reserve+Commit each, nothing else running), "quiet", and
//    "checkpoints": every Reserve and Commit asks for a checkpoint and the
//    checkpointer (daemon/checkpointer.h) runs them back to back. They are
//    counted at the checkpointer's "checkpoint:writing" hook (its encode,
//    under the namespace's lock, is over) and at its log line (finished,
//    after the lock was taken again to append and rename).
//  - spill: a ClusterTier on a real Redis Cluster (tests/redis_cluster_
//    fixture.h; only when redis-server is installed), the large namespace
//    full, so that every Reserve evicts and the eviction observer copies
//    the evicted pages' rows into values under the namespace's lock:
//    "quiet", then "spills" (the writer, paced so that the spill queue
//    never overflows).
// Lookups slower than stall_us are stalls: the JSON gives their count, the
// share of the threads' time they took, and that time split by what ran
// meanwhile (a checkpoint's lock wait and encode, its write and finish, a
// Reserve or Commit of the writer, none of these).
//
// Never asserts on time: it reports.
//
// Thread-safety: RunBackground is called from the main thread (the Redis
// fixture's nodes die with the thread that started them); it starts and
// joins its own threads.
#ifndef KVTIER_BENCH_INDEX_BENCH_BACKGROUND_H_
#define KVTIER_BENCH_INDEX_BENCH_BACKGROUND_H_

#include <cstdint>
#include <string>

namespace kvtier::bench {

struct BackgroundOptions {
  uint32_t lookup_pages = 1536;  // Hashes per lookup (a chain's length).
  // Chains looked up, at random (in the large namespace at most a quarter
  // of its chains: the writer evicts the others).
  uint32_t prefixes = 64;
  double seconds = 3.0;         // Measured time per phase.
  uint64_t pages = 393216;      // Committed pages of the large namespace.
  uint32_t lookup_threads = 2;  // On the large namespace.
  uint32_t other_threads = 1;   // On the other namespace.
  uint32_t writer_pages = 64;   // Pages per Reserve+Commit of the writer.
  double writer_per_s = 200;    // Reserve+Commits per second (0: no pause).
  // The checkpoint phase's threshold (JournalOptions::min_compact_bytes;
  // compact_factor is 0 there).
  uint64_t min_compact_bytes = 1;
  std::string state_parent = "/var/tmp";  // Where the journal folders go.
  // The spill phase's large namespace: its page rows (all committed before
  // the phase) and the bytes of its one bank's row.
  uint64_t spill_pages = 32768;
  uint32_t spill_row_bytes = 16384;
  int redis_masters = 3;
  // Lookups slower than this are "stalls", each checked against the
  // checkpoints' encode and finish instants.
  double stall_us = 1000;
  std::string note;  // Free text for the JSON (the machine, say).
};

// Runs the phases and returns the "background" JSON object: "journal" and
// "spill" ("spill": null with "spill_skipped" giving the reason when Redis
// is not installed or the cluster would not start). A part that could not
// be set up is reported as {"error": "..."}.
std::string RunBackground(const BackgroundOptions& options);

}  // namespace kvtier::bench

#endif  // KVTIER_BENCH_INDEX_BENCH_BACKGROUND_H_
