// transfer_bench's interference part: each load (a loop of 8192^3 bf16
// GEMMs that holds every SM; a decode-step proxy replayed from a CUDA graph)
// runs on its own default-priority stream, and per layout, direction and
// configuration a transfer thread keeps two transfers in flight on another
// stream while the load's windows are timed. The windows alternate: alone,
// with, alone, with, ... (--gemm_rounds "with" windows per configuration,
// --judged_rounds beside the GEMM for the contiguous copy and kvtier's
// default, the pair item 1 compares; each compared with the mean of the
// "alone" windows on either side, the last "alone" shared with the next
// configuration), so slow drift of the load's own speed cancels;
// slowdown_pct is the median of the rounds'.
// The transfer's GB/s is its bytes over its time across the rounds.
//
// The configurations are the frontier's knobs: copy engines only (the
// contiguous copy, memcpy_batch with one descriptor per chunk, memcpy_2d with
// one 2D copy per page and bank, kvtier's copy-engine path), kvtier's
// staged path at 2 and 8 gather CTAs and at the default stream priority,
// kvtier's default (path=auto) and the direct kernel at 8 and 16 CTAs.
//
// Thread-safety: runs on the main thread and starts one transfer thread per
// round, which shares only the TransferEngine (thread-safe), atomics and
// variables the main thread reads after joining it.

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "bench/transfer_bench.h"

namespace kvtier::bench {
namespace {

// Background transfers on `stream` until Stop(): two in flight at a time.
class Background {
 public:
  Background(const Bound& b, const Config& cfg, Dir dir, TransferEngine* engine,
             size_t items, uint64_t pool, uint64_t arena_dev, uint64_t seed,
             cudaStream_t stream)
      : b_(b),
        gpu_pick_(b.gpu_items, seed),
        row_pick_(HostRowPicker(b.host_rows, seed + 1)),
        items_(items),
        stream_(stream) {
    t_.b = &b;
    t_.dir = dir;
    t_.method = cfg.method;
    t_.engine = engine;
    t_.pool = pool;
    t_.arena_dev = arena_dev;
  }

  // Starts the thread and returns once two transfers are enqueued.
  void Start() {
    thread_ = std::thread([this] { Loop(); });
    while (enqueued_.load() < 2) std::this_thread::yield();
  }
  // Stops after the transfers in flight; returns the thread's status.
  absl::Status Stop() {
    stop_.store(true);
    thread_.join();
    return status_;
  }
  uint64_t bytes() const { return bytes_; }
  double ms() const { return ms_; }

 private:
  void Loop() {
    cudaSetDevice(0);
    cudaEvent_t first, last, done[2];
    cudaEventCreate(&first);
    cudaEventCreate(&last);
    for (cudaEvent_t& e : done) {
      cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
    }
    cudaEventRecord(first, stream_);
    int i = 0;
    for (; !stop_.load(); ++i) {
      if (i >= 2) cudaEventSynchronize(done[i % 2]);
      std::vector<Items> sets(1);
      PickItems(gpu_pick_, *row_pick_, items_, &sets);
      t_.items = std::move(sets[0]);
      BuildChunks(&t_);
      absl::Status st = Enqueue(t_, stream_);
      if (!st.ok()) {
        status_ = st;
        break;
      }
      cudaEventRecord(done[i % 2], stream_);
      enqueued_.store(i + 1);
    }
    cudaEventRecord(last, stream_);
    cudaEventSynchronize(last);
    float ms = 0;
    cudaEventElapsedTime(&ms, first, last);
    ms_ = ms;
    bytes_ = static_cast<uint64_t>(i) * items_ * b_.item_bytes;
    cudaEventDestroy(first);
    cudaEventDestroy(last);
    for (cudaEvent_t& e : done) cudaEventDestroy(e);
    enqueued_.store(1 << 30);  // never leave the main thread waiting
  }

  const Bound& b_;
  Transfer t_;
  Picker gpu_pick_;
  std::unique_ptr<Picker> row_pick_;
  const size_t items_;
  const cudaStream_t stream_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<int> enqueued_{0};
  // Written by the thread, read after join.
  absl::Status status_;
  uint64_t bytes_ = 0;
  double ms_ = 0;
};

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

}  // namespace

std::vector<Config> Bench::InterferenceConfigs(const Bound& b) const {
  std::vector<Config> out;
  for (Method m : {Method::kContiguous, Method::kBatch, Method::kCopy2D}) {
    if (Contains(methods_, MethodName(m))) out.push_back(Baseline(m));
  }
  if (Contains(methods_, MethodName(Method::kKvtier))) {
    Config automatic = Staged(client::kDefaultStagingCtas);
    automatic.variant = "auto";
    automatic.options.path = client::TransferPath::kAuto;
    automatic.default_grid = false;
    out.push_back(automatic);
    for (uint32_t c : {2u, client::kDefaultStagingCtas}) {
      out.push_back(Staged(c));
    }
    Config low = Staged(client::kDefaultStagingCtas);
    low.variant = "prio_default";
    low.options.staging_priority = client::StagingPriority::kDefault;
    low.default_grid = false;
    out.push_back(low);
    if (!b.def->snapshot()) {  // snapshots take the copy engine anyway
      Config ce = Staged(0);
      ce.ctas = 0;
      ce.variant = "copy_engine";
      ce.options.staging_ctas = client::kDefaultStagingCtas;
      ce.options.path = client::TransferPath::kCopyEngine;
      ce.default_grid = false;
      out.push_back(ce);
    }
    for (const Config& v : variants_) out.push_back(v);
  }
  if (Contains(methods_, MethodName(Method::kKvtierDirect))) {
    for (uint32_t c : {8u, 16u}) out.push_back(Direct(c));
  }
  return out;
}

absl::Status Bench::InterferenceLayout(Load& load, const Bound& b,
                                       std::vector<std::string>* runs) {
  const size_t items = ItemsFor(b, sweep_prefix_);
  if (items == 0 || items > b.gpu_items || items > b.host_rows) {
    return absl::OkStatus();
  }
  absl::StatusOr<double> alone = load.Window();
  if (!alone.ok()) return alone.status();
  for (Dir dir : {Dir::kEvict, Dir::kRehydrate}) {
    for (const Config& cfg : InterferenceConfigs(b)) {
      if (Stop()) return absl::OkStatus();
      TransferEngine* engine = nullptr;
      if (IsKvtier(cfg.method)) {
        absl::StatusOr<TransferEngine*> e = Engine(b, cfg.options);
        if (!e.ok()) return e.status();
        engine = *e;
      }
      std::vector<double> slowdowns, with_ms, alone_ms = {*alone};
      uint64_t bytes = 0;
      double ms = 0;
      // The decode step's rounds agree to ~0.1 point; the GEMM's spread.
      const bool judged = load.Name() == "gemm" &&
                          (cfg.method == Method::kContiguous ||
                           (IsKvtier(cfg.method) && cfg.variant == "auto"));
      const int rounds = judged ? judged_rounds_ : gemm_rounds_;
      for (int r = 0; r < rounds; ++r) {
        Background bg(b, cfg, dir, engine, items,
                      reinterpret_cast<uint64_t>(pool_), arena_dev_, rng_(),
                      stream_);
        bg.Start();
        absl::StatusOr<double> with = load.Window();
        absl::Status st = bg.Stop();
        if (!with.ok()) return with.status();
        if (!st.ok()) return st;
        absl::StatusOr<double> after = load.Window();
        if (!after.ok()) return after.status();
        const double base = (*alone + *after) / 2;
        slowdowns.push_back((*with / base - 1) * 100);
        with_ms.push_back(*with);
        alone_ms.push_back(*after);
        bytes += bg.bytes();
        ms += bg.ms();
        alone = after;
      }
      const double slowdown = Median(slowdowns);
      const double gbps = Gbps(bytes, ms);
      Progress(
          "%-6s beside %-9s %-2s %-22s ctas=%-3u: %+.1f%% (rounds %s), "
          "transfer %.1f GB/s",
          load.Name(), DirName(dir), b.def->key, cfg.Name(), cfg.ctas, slowdown,
          absl::StrJoin(slowdowns, " ",
                        [](std::string* o, double v) {
                          absl::StrAppend(o, absl::StrFormat("%+.1f", v));
                        }),
          gbps);
      auto list = [](const std::vector<double>& v, int digits) {
        return absl::StrJoin(v, ", ", [digits](std::string* o, double x) {
          absl::StrAppend(o, absl::StrFormat("%.*f", digits, x));
        });
      };
      runs->push_back(absl::StrFormat(
          "{\"load\": \"%s\", \"method\": \"%s\", \"direction\": \"%s\", "
          "\"layout\": \"%s\", \"prefix_tokens\": %d, \"ctas\": %d, "
          "\"sms\": %d, \"default_grid\": %s, \"unit_ms_alone\": [%s], "
          "\"unit_ms_with\": [%s], \"slowdown_pct_rounds\": [%s], "
          "\"slowdown_pct\": %.2f, \"transfer_gbps\": %.3f}",
          load.Name(), cfg.Name(), DirName(dir), b.def->key, sweep_prefix_,
          cfg.ctas, cfg.ctas, cfg.default_grid ? "true" : "false",
          list(alone_ms, 4), list(with_ms, 4), list(slowdowns, 2), slowdown,
          gbps));
    }
  }
  return absl::OkStatus();
}

absl::Status Bench::Interference() {
  const std::vector<std::string> keys =
      SplitList(absl::GetFlag(FLAGS_gemm_layouts));
  absl::StatusOr<Cublas> cb = LoadCublas(absl::GetFlag(FLAGS_cublas_lib));
  if (!cb.ok()) {
    interference_json_ = absl::StrFormat("{\"skipped\": %s}",
                                         JsonString(cb.status().ToString()));
    Progress("interference skipped: %s", cb.status().ToString());
    return absl::OkStatus();
  }
  std::vector<std::string> loads_json, runs;
  for (const std::string& name : SplitList(absl::GetFlag(FLAGS_loads))) {
    if (Stop()) break;
    absl::StatusOr<std::unique_ptr<Load>> load =
        name == "gemm"
            ? MakeGemmLoad(*cb, gemm_stream_, gemm_n_, gemm_iters_, arena_)
        : name == "decode"
            ? MakeDecodeLoad(*cb, gemm_stream_, decode_steps_)
            : absl::StatusOr<std::unique_ptr<Load>>(absl::InvalidArgumentError(
                  absl::StrCat("--loads: '", name, "' is not gemm or decode")));
    if (!load.ok()) return load.status();
    absl::StatusOr<double> unit = (*load)->Window();
    if (!unit.ok()) return unit.status();
    Progress("%s alone: %.3f ms per unit", name, *unit);
    loads_json.push_back(
        absl::StrFormat("{\"name\": \"%s\", %s, "
                        "\"unit_ms_alone\": %.4f}",
                        name, (*load)->DescribeJson(), *unit));
    for (const Bound& b : bounds_) {
      if (Stop()) break;
      if (!Contains(keys, b.def->key) && !Contains(keys, "all")) continue;
      absl::Status st = InterferenceLayout(**load, b, &runs);
      if (!st.ok()) return st;
    }
  }
  interference_json_ = absl::StrFormat(
      "{\"rounds\": %d, \"judged_rounds\": %d, \"loads\": [%s], "
      "\"runs\": [\n  %s]}",
      gemm_rounds_, judged_rounds_, absl::StrJoin(loads_json, ", "),
      absl::StrJoin(runs, ",\n  "));
  return absl::OkStatus();
}

}  // namespace kvtier::bench
