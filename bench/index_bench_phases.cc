// The harness of index_bench's background part (index_bench_phases.h).
//
// Thread-safety: see index_bench_phases.h.
#include "bench/index_bench_phases.h"

#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <random>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/index_bench_util.h"
#include "spdlog/sinks/stdout_color_sinks.h"
#include "spdlog/spdlog.h"

namespace kvtier::bench {

void CheckpointProbe::Encoded() {
  const Clock::time_point now = Clock::now();
  std::lock_guard<std::mutex> lock(mutex_);
  encoded_.push_back(now);
}

std::vector<Clock::time_point> CheckpointProbe::encoded() {
  std::lock_guard<std::mutex> lock(mutex_);
  return encoded_;
}

std::vector<CheckpointProbe::Finish> CheckpointProbe::finished() {
  std::lock_guard<std::mutex> lock(mutex_);
  return finished_;
}

void CheckpointProbe::sink_it_(const spdlog::details::log_msg& msg) {
  // base_sink holds mutex_ here.
  const Clock::time_point now = Clock::now();
  const std::string text(msg.payload.data(), msg.payload.size());
  const size_t at = text.find("journal checkpoint ");
  if (at == std::string::npos) return;
  unsigned long long before = 0, after = 0;
  char took[64] = {};
  if (std::sscanf(text.c_str() + at,
                  "journal checkpoint %llu -> %llu bytes in %63s", &before,
                  &after, took) != 3) {
    return;
  }
  absl::Duration d;
  if (!absl::ParseDuration(took, &d)) d = absl::ZeroDuration();
  finished_.push_back({now, after, absl::ToChronoNanoseconds(d)});
}

ProbeLogger::ProbeLogger(std::shared_ptr<CheckpointProbe> probe)
    : previous_(spdlog::default_logger()) {
  auto err = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
  err->set_level(spdlog::level::warn);
  probe->set_level(spdlog::level::info);
  auto logger = std::make_shared<spdlog::logger>(
      "index_bench_background", spdlog::sinks_init_list{err, probe});
  logger->set_level(spdlog::level::info);
  spdlog::set_default_logger(std::move(logger));
}

ProbeLogger::~ProbeLogger() { spdlog::set_default_logger(previous_); }

absl::StatusOr<std::unique_ptr<BenchCore>> BenchCore::Create(
    const std::string& state_parent, const daemon::JournalOptions& journal,
    daemon::ClusterTier* cluster, CheckpointProbe* probe) {
  std::unique_ptr<BenchCore> b(new BenchCore());
  std::string shm = "/dev/shm/kvtier-index-bench-bg-XXXXXX";
  std::string state = state_parent + "/kvtier-index-bench-bg-XXXXXX";
  if (mkdtemp(shm.data()) == nullptr) {
    return absl::InternalError(absl::StrCat("mkdtemp ", shm, " failed"));
  }
  b->shm_ = shm;
  if (mkdtemp(state.data()) == nullptr) {
    return absl::InternalError(absl::StrCat("mkdtemp ", state, " failed"));
  }
  b->state_ = state;
  daemon::TierOptions o;
  o.segments.shm_dir = shm;
  o.segments.huge_pages = shm::HugePagePolicy::kOff;
  o.state_dir = state;
  o.journal = journal;
  o.cluster = cluster;
  b->core_ = std::make_unique<daemon::TierCore>(o);
  // Before any request, as SetTestHook requires.
  b->core_->SetTestHook([probe](const char* point) {
    if (std::strcmp(point, "checkpoint:writing") == 0) probe->Encoded();
  });
  if (auto report = b->core_->Recover(); !report.ok()) return report.status();
  return b;
}

BenchCore::~BenchCore() {
  core_.reset();
  std::error_code ec;
  if (!shm_.empty()) std::filesystem::remove_all(shm_, ec);
  if (!state_.empty()) std::filesystem::remove_all(state_, ec);
}

absl::StatusOr<Session> BenchCore::Attach(const std::string& name,
                                          uint32_t row_bytes,
                                          uint64_t page_rows) {
  v1::Hello hello;
  hello.set_client_name("index_bench");
  auto session = core_->OpenSession(hello, {});
  if (!session.ok()) return session.status();
  v1::AttachRequest req;
  req.set_session_id(*session);
  req.set_namespace_(name);
  v1::Layout* l = req.mutable_layout();
  l->set_model("index-bench-background");
  l->set_tokens_per_page(16);
  l->set_num_layers(1);
  auto* bank = l->add_page_banks();
  bank->set_name("kv");
  bank->set_row_bytes(row_bytes);
  req.mutable_capacity()->set_page_rows(page_rows);
  v1::AttachResponse resp;
  if (absl::Status s = core_->Attach(req, &resp); !s.ok()) return s;
  return Session{*session, resp.namespace_id()};
}

absl::Status BenchCore::Commit(const Session& s, const std::string& hashes) {
  v1::ReserveRequest rq;
  rq.set_session_id(s.session);
  rq.set_namespace_id(s.ns);
  rq.set_pages(static_cast<uint32_t>(hashes.size() / 32));
  v1::ReserveResponse rr;
  if (absl::Status st = core_->Reserve(rq, &rr); !st.ok()) return st;
  v1::CommitRequest cq;
  cq.set_session_id(s.session);
  cq.set_namespace_id(s.ns);
  cq.set_reservation_id(rr.reservation_id());
  cq.set_hashes(hashes);
  v1::CommitResponse cr;
  return core_->Commit(cq, &cr);
}

absl::Status Fill(BenchCore& core, const Session& s, uint64_t pages,
                  uint32_t chain_pages, size_t keep, uint64_t seed,
                  std::vector<std::string>* chains) {
  std::deque<std::string> kept;
  for (uint64_t done = 0; done < pages; ++seed) {
    const uint64_t n = std::min<uint64_t>(chain_pages, pages - done);
    std::string h = RandomHashes(n, seed);
    if (absl::Status st = core.Commit(s, h); !st.ok()) return st;
    // The last full chains: the first ones are the least recently used.
    if (keep > 0 && n == chain_pages) {
      if (kept.size() == keep) kept.pop_front();
      kept.push_back(std::move(h));
    }
    done += n;
  }
  for (std::string& h : kept) chains->push_back(std::move(h));
  return absl::OkStatus();
}

namespace {

using Us = std::chrono::duration<double, std::micro>;

// One lookup thread's loop (see LookupTarget).
void LookupLoop(daemon::TierCore& core, const LookupTarget& target,
                const Session& s, uint64_t seed, double stall_us,
                const std::atomic<bool>& measuring,
                const std::atomic<bool>& stop, LookupSamples* out,
                std::string* error) {
  std::mt19937_64 rng(seed);
  daemon::TierCore::LookupOutcome got;
  bool pin = false;
  while (!stop.load(std::memory_order_relaxed)) {
    const std::string& h = target.chains[rng() % target.chains.size()];
    pin = !pin;
    const Clock::time_point t0 = Clock::now();
    absl::Status st = core.LookupHashes(s.session, s.ns, h, pin, &got);
    if (st.ok() && pin && got.lease_id != 0) {
      v1::ReleaseRequest rq;
      rq.set_session_id(s.session);
      rq.set_namespace_id(s.ns);
      rq.set_lease_id(got.lease_id);
      v1::ReleaseResponse rr;
      st = core.Release(rq, &rr);
    }
    const Clock::time_point t1 = Clock::now();
    if (!measuring.load(std::memory_order_relaxed)) continue;
    if (!st.ok()) {
      if (out->errors++ == 0) *error = st.ToString();
      continue;
    }
    const double us = Us(t1 - t0).count();
    (pin ? out->pinned_release_us : out->unpinned_us).push_back(us);
    ++out->lookups;
    if (got.matched_pages == target.pages) ++out->full_matches;
    if (us > stall_us) out->stalls.emplace_back(t0, t1);
  }
}

void Merge(LookupSamples&& from, LookupSamples* into) {
  auto append = [](std::vector<double>& a, std::vector<double>& b) {
    a.insert(a.end(), b.begin(), b.end());
  };
  append(into->unpinned_us, from.unpinned_us);
  append(into->pinned_release_us, from.pinned_release_us);
  into->stalls.insert(into->stalls.end(), from.stalls.begin(),
                      from.stalls.end());
  into->lookups += from.lookups;
  into->full_matches += from.full_matches;
  into->errors += from.errors;
}

}  // namespace

PhaseRun RunPhase(BenchCore& core, const std::vector<LookupTarget>& targets,
                  const PhaseSpec& spec) {
  struct PerThread {
    size_t target = 0;
    LookupSamples samples;
    std::string error;
  };
  std::vector<PerThread> per;
  for (size_t t = 0; t < targets.size(); ++t) {
    for (size_t i = 0; i < targets[t].sessions.size(); ++i) {
      per.push_back({t, {}, {}});
    }
  }
  std::atomic<bool> measuring{false}, stop{false};
  std::vector<std::thread> threads;
  size_t k = 0;
  for (size_t t = 0; t < targets.size(); ++t) {
    for (const Session& s : targets[t].sessions) {
      PerThread* p = &per[k++];
      threads.emplace_back([&, p, s, t, seed = k] {
        LookupLoop(core.core(), targets[t], s, seed, spec.stall_us, measuring,
                   stop, &p->samples, &p->error);
      });
    }
  }
  PhaseRun run;
  std::string write_error;
  std::thread writer;
  if (spec.write) {
    writer = std::thread([&] {
      const auto period = std::chrono::duration_cast<Clock::duration>(
          std::chrono::duration<double>(
              spec.writes_per_s > 0 ? 1.0 / spec.writes_per_s : 0.0));
      Clock::time_point next = Clock::now();
      while (!stop.load(std::memory_order_relaxed)) {
        // On time or late: never a burst to catch up.
        next = std::max(next + period, Clock::now());
        std::this_thread::sleep_until(next);
        if (spec.pace) spec.pace();
        if (stop.load(std::memory_order_relaxed)) break;
        const Clock::time_point t0 = Clock::now();
        absl::Status st = spec.write();
        const Clock::time_point t1 = Clock::now();
        const double us = Us(t1 - t0).count();
        if (!measuring.load(std::memory_order_relaxed)) continue;
        if (!st.ok()) {
          if (run.write_errors++ == 0) write_error = st.ToString();
          continue;
        }
        run.write_us.push_back(us);
        run.write_spans.push_back({t0, t1});
        ++run.writes;
      }
    });
  }
  absl::SleepFor(absl::Milliseconds(500));  // Warm-up.
  if (spec.on_start) spec.on_start();
  run.from = Clock::now();
  measuring = true;
  absl::SleepFor(absl::Seconds(spec.seconds));
  measuring = false;
  run.to = Clock::now();
  if (spec.on_end) spec.on_end();
  stop = true;
  for (auto& th : threads) th.join();
  if (writer.joinable()) writer.join();
  run.targets.resize(targets.size());
  for (PerThread& p : per) {
    if (run.first_error.empty() && !p.error.empty()) run.first_error = p.error;
    Merge(std::move(p.samples), &run.targets[p.target]);
  }
  if (run.first_error.empty()) run.first_error = write_error;
  return run;
}

}  // namespace kvtier::bench
