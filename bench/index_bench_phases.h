// The harness of index_bench's background part
// (bench/index_bench_background.h): an in-process TierCore whose journals
// live on a disk folder, namespaces filled with random chains, lookup
// threads and a writer thread run for a measured window, and a probe that
// sees when the checkpointer (daemon/checkpointer.h) ends an encode and
// finishes a checkpoint.
//
// Thread-safety: BenchCore, Fill and RunPhase are driven by one thread,
// which RunPhase's own threads join before it returns. CheckpointProbe is
// thread-safe (the checkpointer's thread and spdlog call it).
#ifndef KVTIER_BENCH_INDEX_BENCH_PHASES_H_
#define KVTIER_BENCH_INDEX_BENCH_PHASES_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "daemon/journal.h"
#include "daemon/tier_core.h"
#include "spdlog/logger.h"
#include "spdlog/sinks/base_sink.h"

namespace kvtier::bench {

using Clock = std::chrono::steady_clock;

// What the checkpointer did, as instants: the end of each encode (its
// "checkpoint:writing" hook, called once it has let go of the namespace's
// lock) and each finish (its log line "journal checkpoint A -> B bytes in
// D", written while it holds the lock again, just before it lets go). It
// is a spdlog sink: the bench's logger (ProbeLogger) hands it every line,
// and it keeps only those.
class CheckpointProbe final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  struct Finish {
    Clock::time_point at;    // When the line was logged.
    uint64_t bytes = 0;      // B: the new journal's bytes.
    Clock::duration took{};  // D: from before the lock was first taken.
  };
  // Records an encode's end now (the TierCore's test hook calls it).
  void Encoded();
  // Every instant recorded so far, in order.
  std::vector<Clock::time_point> encoded();
  std::vector<Finish> finished();

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override;
  void flush_() override {}

 private:
  std::vector<Clock::time_point> encoded_;  // Guarded by mutex_ (base_sink).
  std::vector<Finish> finished_;            // Guarded by mutex_.
};

// While it lives, spdlog's default logger (the daemon core's) writes
// warnings and errors to stderr and hands info lines to `probe`; the
// logger that was the default before comes back when it goes.
class ProbeLogger {
 public:
  explicit ProbeLogger(std::shared_ptr<CheckpointProbe> probe);
  ~ProbeLogger();
  ProbeLogger(const ProbeLogger&) = delete;
  ProbeLogger& operator=(const ProbeLogger&) = delete;

 private:
  std::shared_ptr<spdlog::logger> previous_;
};

// An interval of time.
struct Span {
  Clock::time_point from, to;
};

// A session attached to a namespace.
struct Session {
  uint64_t session = 0;
  uint64_t ns = 0;
};

// A TierCore over a fresh /dev/shm folder with its journals in a fresh
// folder under a disk folder; both removed when it goes (after the core).
class BenchCore {
 public:
  // `cluster`: the cluster tier, or nullptr; it outlives the BenchCore.
  // `probe`: told of every encode's end (the core's test hook); it
  // outlives the BenchCore. INTERNAL when a folder cannot be made, or
  // Recover's error.
  static absl::StatusOr<std::unique_ptr<BenchCore>> Create(
      const std::string& state_parent, const daemon::JournalOptions& journal,
      daemon::ClusterTier* cluster, CheckpointProbe* probe);
  ~BenchCore();
  BenchCore(const BenchCore&) = delete;
  BenchCore& operator=(const BenchCore&) = delete;

  daemon::TierCore& core() { return *core_; }
  const std::string& state_dir() const { return state_; }

  // Opens a session and attaches it to namespace `name` (created with one
  // rank, one bank "kv" of `row_bytes`-byte rows and `page_rows` rows by
  // the first Attach).
  absl::StatusOr<Session> Attach(const std::string& name, uint32_t row_bytes,
                                 uint64_t page_rows);
  // Reserve+Commit of `hashes` (packed, a chain with no parent) in `s`.
  absl::Status Commit(const Session& s, const std::string& hashes);

 private:
  BenchCore() = default;

  std::string shm_, state_;
  std::unique_ptr<daemon::TierCore> core_;
};

// Commits chains of `chain_pages` pages (seeds `seed`, `seed` + 1, ...)
// into `s` until `pages` pages are committed, the last chain shorter;
// appends the last `keep` whole chains (the most recently used) to
// *chains.
absl::Status Fill(BenchCore& core, const Session& s, uint64_t pages,
                  uint32_t chain_pages, size_t keep, uint64_t seed,
                  std::vector<std::string>* chains);

// The lookups of one namespace during a phase: one thread per session,
// each looking up random chains of `chains`, alternating an unpinned
// lookup and a pinned one followed by the Release of its lease.
struct LookupTarget {
  std::vector<Session> sessions;
  std::vector<std::string> chains;
  uint32_t pages = 0;  // A chain's length: a full match.
};

// What a phase measured for one LookupTarget.
struct LookupSamples {
  std::vector<double> unpinned_us, pinned_release_us;
  // Lookups (either kind) slower than the phase's stall_us: start, end.
  std::vector<std::pair<Clock::time_point, Clock::time_point>> stalls;
  uint64_t lookups = 0, full_matches = 0, errors = 0;
};

struct PhaseSpec {
  double seconds = 3.0;  // The measured window.
  double stall_us = 1000;
  // One Reserve+Commit of the writer thread, timed (empty: no writer).
  std::function<absl::Status()> write;
  // Writes per second the writer starts at most (0: back to back): a
  // writer that never lets go of the namespace's lock would starve the
  // lookups by itself.
  double writes_per_s = 0;
  // Before each write, untimed (empty: none): more pacing.
  std::function<void()> pace;
  // At the measured window's start and end, on the calling thread.
  std::function<void()> on_start, on_end;
};

struct PhaseRun {
  Clock::time_point from, to;          // The measured window.
  std::vector<LookupSamples> targets;  // As the targets given.
  std::vector<double> write_us;
  std::vector<Span> write_spans;  // Each write's, in order.
  uint64_t writes = 0, write_errors = 0;
  std::string first_error;  // Of a lookup or a write, if any.
};

// Starts the targets' lookup threads and the writer, lets them run for a
// warm-up, measures for spec.seconds, then stops and joins them.
PhaseRun RunPhase(BenchCore& core, const std::vector<LookupTarget>& targets,
                  const PhaseSpec& spec);

}  // namespace kvtier::bench

#endif  // KVTIER_BENCH_INDEX_BENCH_PHASES_H_
