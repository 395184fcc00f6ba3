// index_bench's background part: the phases and their JSON
// (index_bench_background.h); the harness is index_bench_phases.h.
//
// Thread-safety: see index_bench_background.h.
#include "bench/index_bench_background.h"

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "bench/index_bench_phases.h"
#include "bench/index_bench_util.h"
#include "daemon/cluster_tier.h"
#include "daemon/redis_cluster.h"
#include "tests/redis_cluster_fixture.h"

namespace kvtier::bench {
namespace {

constexpr uint32_t kOtherChains = 16;    // The other namespace's chains.
constexpr uint32_t kIndexRowBytes = 16;  // The index is measured, not banks.
constexpr uint64_t kSpillQueueBytes = 64ull << 20;
constexpr int kAloneCheckpoints = 5;

using Ms = std::chrono::duration<double, std::milli>;

// `s` as a JSON string (quotes and backslashes escaped, newlines spaces).
std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += (c == '\n') ? ' ' : c;
  }
  return out + "\"";
}

// {"error": "<s>"}: a part that could not be set up.
std::string ErrorJson(const absl::Status& s) {
  return absl::StrCat("{\"error\": ", JsonString(s.ToString()), "}");
}

// The two namespaces of a core and the sessions that use them.
struct Spaces {
  Session writer;                     // On the large namespace.
  std::vector<LookupTarget> targets;  // [0] large, [1] other.
};

// Creates namespace "large" (`pages` page rows of `row_bytes`, every one
// committed) and "other" (kOtherChains chains, full too), and attaches the
// lookup threads' sessions. The large namespace's targets are at most a
// quarter of its chains.
absl::Status SetUpSpaces(BenchCore& core, const BackgroundOptions& o,
                         uint64_t pages, uint32_t row_bytes, Spaces* out) {
  const uint64_t other_pages = uint64_t{o.lookup_pages} * kOtherChains;
  struct Want {
    const char* name;
    uint64_t pages;
    uint32_t row_bytes, threads;
    uint64_t seed;
  };
  const Want wants[2] = {
      {"large", pages, row_bytes, o.lookup_threads, 1},
      {"other", other_pages, kIndexRowBytes, o.other_threads, 1ull << 32}};
  for (const Want& w : wants) {
    auto filler = core.Attach(w.name, w.row_bytes, w.pages);
    if (!filler.ok()) return filler.status();
    LookupTarget t;
    t.pages = o.lookup_pages;
    // The writer evicts the least recently used chains of the large
    // namespace: at most a quarter of them are looked up, so that the
    // writer's own and the idle ones go first.
    size_t keep = o.prefixes;
    if (out->targets.empty()) {
      keep = std::min<uint64_t>(
          keep, std::max<uint64_t>(1, w.pages / o.lookup_pages / 4));
    }
    if (absl::Status s = Fill(core, *filler, w.pages, o.lookup_pages, keep,
                              w.seed, &t.chains);
        !s.ok()) {
      return s;
    }
    if (t.chains.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(w.name, ": fewer pages than one chain"));
    }
    for (uint32_t i = 0; i < w.threads; ++i) {
      auto s = core.Attach(w.name, w.row_bytes, w.pages);
      if (!s.ok()) return s.status();
      t.sessions.push_back(*s);
    }
    if (out->targets.empty()) out->writer = *filler;
    out->targets.push_back(std::move(t));
  }
  return absl::OkStatus();
}

// Waits (at most a minute) until every checkpoint started has finished
// and none came for 300 ms.
void Settle(CheckpointProbe& probe) {
  const Clock::time_point give_up = Clock::now() + std::chrono::minutes(1);
  while (Clock::now() < give_up) {
    const auto e = probe.encoded();
    const auto f = probe.finished();
    Clock::time_point last{};
    if (!e.empty()) last = std::max(last, e.back());
    if (!f.empty()) last = std::max(last, f.back().at);
    if (f.size() >= e.size() &&
        Clock::now() - last > std::chrono::milliseconds(300)) {
      return;
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
}

template <typename T, typename At>
size_t CountIn(const std::vector<T>& v, Clock::time_point from,
               Clock::time_point to, At at) {
  return std::count_if(v.begin(), v.end(), [&](const T& x) {
    return at(x) >= from && at(x) <= to;
  });
}

// {"p50_ms", "max_ms", "total_ms", "count"} of `ms`; {"count": 0} when
// empty.
std::string MsJson(std::vector<double> ms) {
  if (ms.empty()) return R"({"count": 0})";
  std::sort(ms.begin(), ms.end());
  double total = 0;
  for (double v : ms) total += v;
  return absl::StrFormat(
      R"({"p50_ms": %.2f, "max_ms": %.2f, "total_ms": %.1f, "count": %d})",
      ms[ms.size() / 2], ms.back(), total, ms.size());
}

// Splits finished checkpoint `f` at the end of its encode (in `encoded`):
// *encode from its start to that end (the wait for the lock and the encode
// under it), *write from there to its finish (the write, with no lock,
// then the wait for the lock and the finish under it). False when no
// encode ended within it.
bool SplitCheckpoint(const CheckpointProbe::Finish& f,
                     const std::vector<Clock::time_point>& encoded,
                     Span* encode, Span* write) {
  const Clock::time_point start = f.at - f.took;
  auto e = std::upper_bound(encoded.begin(), encoded.end(), f.at);
  if (e == encoded.begin() || *std::prev(e) < start) return false;
  *encode = {start, *std::prev(e)};
  *write = {*std::prev(e), f.at};
  return true;
}

// Every finished checkpoint's two spans (SplitCheckpoint), in order.
void CheckpointSpans(const std::vector<Clock::time_point>& encoded,
                     const std::vector<CheckpointProbe::Finish>& done,
                     std::vector<Span>* encodes, std::vector<Span>* writes) {
  for (const auto& f : done) {
    Span e, w;
    if (!SplitCheckpoint(f, encoded, &e, &w)) continue;
    encodes->push_back(e);
    writes->push_back(w);
  }
}

// The checkpoints of the window: encodes ended, finished, and each
// finished one's spans (SplitCheckpoint), in ms.
std::string CheckpointJson(const PhaseRun& run,
                           const std::vector<Clock::time_point>& encoded,
                           const std::vector<CheckpointProbe::Finish>& done) {
  const auto id = [](const Clock::time_point& t) { return t; };
  const auto at = [](const CheckpointProbe::Finish& f) { return f.at; };
  const size_t ended = CountIn(encoded, run.from, run.to, id);
  const size_t finished = CountIn(done, run.from, run.to, at);
  std::vector<double> encode_ms, write_ms;
  uint64_t bytes = 0;
  for (const auto& f : done) {
    if (f.at < run.from || f.at > run.to) continue;
    bytes = f.bytes;
    Span e, w;
    if (!SplitCheckpoint(f, encoded, &e, &w)) continue;
    encode_ms.push_back(Ms(e.to - e.from).count());
    write_ms.push_back(Ms(w.to - w.from).count());
  }
  const double secs = std::chrono::duration<double>(run.to - run.from).count();
  return absl::StrFormat(
      R"({"encodes_ended": %d, "finished": %d, "finished_per_s": %.1f, "journal_bytes": %d, "lock_wait_and_encode": %s, "write_and_finish": %s})",
      ended, finished, finished / secs, bytes, MsJson(encode_ms),
      MsJson(write_ms));
}

// Whether `t` lies in one of `spans` (in order, disjoint).
bool Within(const std::vector<Span>& spans, Clock::time_point t) {
  auto it = std::upper_bound(
      spans.begin(), spans.end(), t,
      [](Clock::time_point x, const Span& s) { return x < s.from; });
  return it != spans.begin() && t <= std::prev(it)->to;
}

// One namespace's lookups (by `threads` threads) and its stalls: their
// count, p50 and longest, their summed time and its share of the threads'
// time, and that time split, 0.1 ms by 0.1 ms, by what ran then (the
// first that applies): a checkpoint's lock wait and encode (`encodes`:
// the lock is held, or wanted, by the checkpointer), its write and finish
// (`writes`: no lock while it writes; the lock held to finish), a Reserve
// or Commit of the writer (`writer_ops`), none of these (the CPU taken by
// others, a flush of queued touches).
std::string TargetJson(const LookupSamples& l, size_t threads, double stall_us,
                       double seconds, const std::vector<Span>& encodes,
                       const std::vector<Span>& writes,
                       const std::vector<Span>& writer_ops) {
  constexpr auto kTick = std::chrono::microseconds(100);
  double during[4] = {0, 0, 0, 0};  // Encode, write+finish, writer, else.
  std::vector<double> stall_ms;
  for (const auto& [t0, t1] : l.stalls) {
    stall_ms.push_back(Ms(t1 - t0).count());
    for (Clock::time_point t = t0; t < t1; t += kTick) {
      const double ms = Ms(std::min<Clock::duration>(kTick, t1 - t)).count();
      const int kind = Within(encodes, t)      ? 0
                       : Within(writes, t)     ? 1
                       : Within(writer_ops, t) ? 2
                                               : 3;
      during[kind] += ms;
    }
  }
  std::sort(stall_ms.begin(), stall_ms.end());
  double stalled_ms = 0;
  for (double v : stall_ms) stalled_ms += v;
  return absl::StrFormat(
      R"({"unpinned": %s, "pinned_release": %s, "lookups": %d, "lookups_per_s": %.0f, "full_match_share": %.4f, "errors": %d,
      "stalls": {"over_us": %.0f, "count": %d, "p50_ms": %.2f, "max_ms": %.2f, "stalled_ms": %.1f, "stalled_share": %.3f,
        "during_encode_ms": %.1f, "during_write_and_finish_ms": %.1f, "during_writer_op_ms": %.1f, "elsewhen_ms": %.1f}})",
      TailJson(SummarizeTail(l.unpinned_us)),
      TailJson(SummarizeTail(l.pinned_release_us)), l.lookups,
      l.lookups / seconds,
      l.lookups ? static_cast<double>(l.full_matches) / l.lookups : 0.0,
      l.errors, stall_us, stall_ms.size(),
      stall_ms.empty() ? 0.0 : stall_ms[stall_ms.size() / 2],
      stall_ms.empty() ? 0.0 : stall_ms.back(), stalled_ms,
      stalled_ms / (seconds * 1000 * threads), during[0], during[1], during[2],
      during[3]);
}

// Runs one phase and returns its JSON; `extra` (may be empty) adds fields
// once the phase is over.
std::string Phase(const std::string& name, const std::string& core_label,
                  BenchCore& core, const Spaces& s, const BackgroundOptions& o,
                  CheckpointProbe& probe, PhaseSpec spec,
                  const std::function<std::string()>& extra = {}) {
  spec.seconds = o.seconds;
  spec.stall_us = o.stall_us;
  const PhaseRun run = RunPhase(core, s.targets, spec);
  const double secs = std::chrono::duration<double>(run.to - run.from).count();
  const auto encoded = probe.encoded();
  const auto done = probe.finished();
  std::vector<Span> encodes, writes;
  CheckpointSpans(encoded, done, &encodes, &writes);
  std::string writer = "null";
  if (spec.write) {
    writer = absl::StrFormat(
        R"({"per_s_target": %.0f, "reserve_commits": %d, "pages": %d, "errors": %d, "reserve_commit": %s})",
        spec.writes_per_s, run.writes, run.writes * o.writer_pages,
        run.write_errors, TailJson(SummarizeTail(run.write_us)));
  }
  return absl::StrFormat(
      R"({"phase": "%s", "core": "%s", "seconds": %.2f, "chains_looked_up": [%d, %d],
      "large_namespace": %s,
      "other_namespace": %s,
      "writer": %s, "checkpoints": %s%s%s})",
      name, core_label, secs, s.targets[0].chains.size(),
      s.targets[1].chains.size(),
      TargetJson(run.targets[0], s.targets[0].sessions.size(), o.stall_us, secs,
                 encodes, writes, run.write_spans),
      TargetJson(run.targets[1], s.targets[1].sessions.size(), o.stall_us, secs,
                 encodes, writes, run.write_spans),
      writer, CheckpointJson(run, encoded, done),
      run.first_error.empty()
          ? ""
          : absl::StrCat(", \"first_error\": ", JsonString(run.first_error)),
      extra ? absl::StrCat(", ", extra()) : "");
}

// Checkpoints of the large namespace alone: `n` times one Reserve+Commit
// with nothing else running, then its checkpoint waited for; their split
// (SplitCheckpoint), uncontended.
std::string AloneCheckpoints(BenchCore& core, const Spaces& s, uint32_t pages,
                             CheckpointProbe& probe, int n) {
  std::vector<double> encode_ms, write_ms;
  for (int i = 0; i < n; ++i) {
    const size_t before = probe.finished().size();
    if (absl::Status st =
            core.Commit(s.writer, RandomHashes(pages, (1ull << 56) + i));
        !st.ok()) {
      return ErrorJson(st);
    }
    // The request reaches the checkpointer a moment later.
    const Clock::time_point give_up = Clock::now() + std::chrono::seconds(10);
    while (probe.finished().size() == before && Clock::now() < give_up) {
      absl::SleepFor(absl::Milliseconds(1));
    }
    Settle(probe);
    const auto done = probe.finished();
    Span e, w;
    if (done.size() > before &&
        SplitCheckpoint(done.back(), probe.encoded(), &e, &w)) {
      encode_ms.push_back(Ms(e.to - e.from).count());
      write_ms.push_back(Ms(w.to - w.from).count());
    }
  }
  return absl::StrFormat(
      R"({"lock_wait_and_encode": %s, "write_and_finish": %s})",
      MsJson(encode_ms), MsJson(write_ms));
}

// The writer's Reserve+Commit of a new chain into the large namespace.
std::function<absl::Status()> Writer(BenchCore& core, const Spaces& s,
                                     uint32_t pages) {
  auto seed = std::make_shared<std::atomic<uint64_t>>(1ull << 48);
  return [&core, session = s.writer, pages, seed] {
    return core.Commit(session, RandomHashes(pages, seed->fetch_add(1)));
  };
}

std::string JournalPart(const BackgroundOptions& o, CheckpointProbe& probe) {
  std::vector<std::string> phases;
  std::string setup;
  for (bool tiny : {false, true}) {
    daemon::JournalOptions j;
    if (tiny) {
      j.min_compact_bytes = o.min_compact_bytes;
      j.compact_factor = 0;
    }
    auto core = BenchCore::Create(o.state_parent, j, nullptr, &probe);
    if (!core.ok()) return ErrorJson(core.status());
    Spaces s;
    const Clock::time_point t0 = Clock::now();
    if (absl::Status st = SetUpSpaces(**core, o, o.pages, kIndexRowBytes, &s);
        !st.ok()) {
      return ErrorJson(st);
    }
    const double fill_s =
        std::chrono::duration<double>(Clock::now() - t0).count();
    Settle(probe);
    std::error_code ec;
    const auto bytes = std::filesystem::file_size(
        daemon::JournalPath((*core)->state_dir(), "large"), ec);
    const std::string label = tiny ? "tiny_threshold" : "default_threshold";
    absl::StrAppendFormat(
        &setup, R"(%s"%s": {"fill_seconds": %.2f, "journal_bytes": %d%s})",
        setup.empty() ? "" : ", ", label, fill_s, ec ? 0 : bytes,
        tiny ? absl::StrCat(", \"checkpoints_alone\": ",
                            AloneCheckpoints(**core, s, o.writer_pages, probe,
                                             kAloneCheckpoints))
             : "");
    phases.push_back(Phase("quiet", label, **core, s, o, probe, {}));
    PhaseSpec busy;
    busy.write = Writer(**core, s, o.writer_pages);
    busy.writes_per_s = o.writer_per_s;
    phases.push_back(Phase(tiny ? "checkpoints" : "commits", label, **core, s,
                           o, probe, busy));
  }
  return absl::StrFormat(
      R"({"medium": "%s", "large_pages": %d, "other_pages": %d, "row_bytes": %d,
    "min_compact_bytes_tiny": %d, "compact_factor_tiny": 0,
    "setup": {%s},
    "phases": [%s]})",
      FsType(o.state_parent), o.pages, uint64_t{o.lookup_pages} * kOtherChains,
      kIndexRowBytes, o.min_compact_bytes, setup,
      absl::StrJoin(phases, ",\n    "));
}

std::string SpillPart(const BackgroundOptions& o, CheckpointProbe& probe,
                      std::string* skipped) {
  if (absl::Status s = testing::RedisClusterFixture::Available(); !s.ok()) {
    *skipped = absl::StrCat("no Redis: ", s.ToString());
    return "null";
  }
  testing::RedisClusterConfig rc;
  rc.masters = o.redis_masters;
  rc.maxmemory = "512mb";
  testing::RedisClusterFixture redis(rc);
  if (absl::Status s = redis.Start(); !s.ok()) {
    *skipped = absl::StrCat("the Redis Cluster did not start: ", s.ToString());
    return "null";
  }
  daemon::ClusterTierOptions co;
  auto seeds = daemon::ParseRedisSeeds(redis.Seeds());
  if (!seeds.ok()) return ErrorJson(seeds.status());
  co.redis.seeds = *seeds;
  co.redis.user = redis.user();
  co.redis.password = redis.password();
  co.spill_queue_bytes = kSpillQueueBytes;
  auto key = daemon::ClusterKey::FromSecret(std::string(40, 'K'));
  if (!key.ok()) return ErrorJson(key.status());
  auto cluster = daemon::ClusterTier::Create(co, *std::move(key));
  if (!cluster.ok()) return ErrorJson(cluster.status());
  daemon::ClusterTier& tier = **cluster;
  std::vector<std::string> phases;
  uint64_t fill_values = 0;
  {
    auto core = BenchCore::Create(o.state_parent, daemon::JournalOptions{},
                                  &tier, &probe);
    if (!core.ok()) return ErrorJson(core.status());
    Spaces s;
    if (absl::Status st =
            SetUpSpaces(**core, o, o.spill_pages, o.spill_row_bytes, &s);
        !st.ok()) {
      return ErrorJson(st);
    }
    fill_values = tier.Counters().spilled_pages;
    phases.push_back(Phase("quiet", "cluster_tier", **core, s, o, probe, {}));
    PhaseSpec busy;
    busy.write = Writer(**core, s, o.writer_pages);
    busy.writes_per_s = o.writer_per_s;
    // Spills wait in a bounded queue and are dropped past it: keep it
    // under half full, so that every eviction is copied and spilled.
    busy.pace = [&tier] {
      const Clock::time_point give_up = Clock::now() + std::chrono::seconds(2);
      while (tier.Counters().spill_queue_bytes > kSpillQueueBytes / 2 &&
             Clock::now() < give_up) {
        absl::SleepFor(absl::Microseconds(100));
      }
    };
    daemon::ClusterCounters c0, c1;
    busy.on_start = [&] { c0 = tier.Counters(); };
    busy.on_end = [&] { c1 = tier.Counters(); };
    phases.push_back(
        Phase("spills", "cluster_tier", **core, s, o, probe, busy, [&] {
          const double secs = o.seconds;
          return absl::StrFormat(
              R"("spill": {"values": %d, "bytes": %d, "mb_per_s": %.1f, "dropped": %d, "failed": %d})",
              c1.spilled_pages - c0.spilled_pages,
              c1.spilled_bytes - c0.spilled_bytes,
              (c1.spilled_bytes - c0.spilled_bytes) / 1e6 / secs,
              c1.spills_dropped - c0.spills_dropped,
              c1.spills_failed - c0.spills_failed);
        }));
  }  // The core before its cluster tier, as kvtierd does.
  cluster->reset();
  return absl::StrFormat(
      R"({"redis_masters": %d, "large_pages": %d, "row_bytes": %d, "spill_queue_bytes": %d,
    "values_spilled_while_filling": %d,
    "phases": [%s]})",
      o.redis_masters, o.spill_pages, o.spill_row_bytes, kSpillQueueBytes,
      fill_values, absl::StrJoin(phases, ",\n    "));
}

}  // namespace

std::string RunBackground(const BackgroundOptions& o) {
  auto probe = std::make_shared<CheckpointProbe>();
  ProbeLogger logger(probe);
  const std::string journal = JournalPart(o, *probe);
  std::string skipped;
  const std::string spill = SpillPart(o, *probe, &skipped);
  return absl::StrFormat(
      R"({"note": %s, "lookup_pages": %d, "prefixes": %d, "seconds_per_phase": %.1f,
  "lookup_threads": %d, "other_threads": %d, "writer_pages": %d, "writer_per_s": %.0f,
  "lookup": "each lookup thread alternates an unpinned lookup and a pinned lookup + Release, in-process: TierCore::LookupHashes",
  "journal": %s,
  "spill": %s%s
})",
      JsonString(o.note), o.lookup_pages, o.prefixes, o.seconds,
      o.lookup_threads, o.other_threads, o.writer_pages, o.writer_per_s,
      journal, spill,
      skipped.empty()
          ? ""
          : absl::StrCat(", \"spill_skipped\": ", JsonString(skipped)));
}

}  // namespace kvtier::bench
