// transfer_bench's measurements: Bench::Run and what it runs, in order:
// the byte-for-byte cross-check of every method (Verify), the main matrix of
// layouts x prefixes x directions x configurations and the CTA sweep
// (MeasureOne), both directions at once (MeasureBoth), then the GEMM part
// (transfer_bench_gemm.cc). Engines are created on first use and shared by
// the configurations with the same options.
//
// Thread-safety: runs on the main thread only.

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/transfer_bench.h"
#include "client/transfer_engine.h"
#include "client/transfer_plan.h"
#include "kernels/page_copy.h"

namespace kvtier::bench {

absl::StatusOr<TransferEngine*> Bench::Engine(
    const Bound& b, const client::TransferOptions& options) {
  const std::string key = absl::StrCat(b.def->key, "/", OptionsKey(options));
  for (auto& [k, e] : engines_) {
    if (k == key) return e.get();
  }
  // One engine at a time, as in an engine process (one per GPU pool): the
  // earlier ones' streams (4-6 each) would otherwise pile up past the
  // device's hardware queues (CUDA_DEVICE_MAX_CONNECTIONS, 8 by default),
  // where unrelated streams can alias and wait on each other.
  engines_.clear();
  absl::StatusOr<std::unique_ptr<TransferEngine>> e = TransferEngine::Create(
      client::Backend::kCuda, b.pool, b.banks, b.snapshot_bank, options);
  if (!e.ok()) return e.status();
  if (options.path == client::TransferPath::kAuto) {
    // What an engine gets by default, per layout: say which path it is.
    const client::TransferPath p = (*e)->path();
    std::string note =
        absl::StrCat("layout ", b.def->key, ": path=auto takes the ",
                     p == client::TransferPath::kCopyEngine ? "copy-engine"
                     : p == client::TransferPath::kStaged   ? "staged"
                                                            : "direct",
                     " path (", (*e)->plan().page_runs(), " copies per page)");
    if (std::find(Notes().begin(), Notes().end(), note) == Notes().end()) {
      Notes().push_back(std::move(note));
    }
  } else if ((*e)->path() != options.path) {
    return absl::InternalError(
        absl::StrCat("engine took path ", static_cast<int>((*e)->path()),
                     ", asked for ", static_cast<int>(options.path)));
  }
  engines_.emplace_back(key, *std::move(e));
  return engines_.back().second.get();
}

std::vector<Config> Bench::Configs(bool sweep) const {
  std::vector<Config> out;
  for (Method m :
       {Method::kContiguous, Method::kLoop, Method::kBatch, Method::kCopy2D}) {
    if (Contains(methods_, MethodName(m))) out.push_back(Baseline(m));
  }
  if (Contains(methods_, MethodName(Method::kKvtier))) {
    if (sweep) {
      for (uint32_t c : staging_ctas_) out.push_back(Staged(c));
      for (const Config& v : variants_) out.push_back(v);
    } else {
      out.push_back(Staged(client::kDefaultStagingCtas));
    }
  }
  if (Contains(methods_, MethodName(Method::kKvtierDirect))) {
    if (sweep) {
      for (uint32_t c : ctas_) out.push_back(Direct(c));
    } else {
      out.push_back(Direct(kernels::kDefaultMaxCtas));
    }
  }
  return out;
}

size_t IndexOf(const std::vector<Bound>& v, const Bound& b) {
  return static_cast<size_t>(&b - v.data());
}

void Bench::Fresh(Transfer* t, size_t n) {
  const size_t i = IndexOf(bounds_, *t->b);
  std::vector<Items> sets(1);
  PickItems(*gpu_pickers_[i], *row_pickers_[i], n, &sets);
  t->items = std::move(sets[0]);
  BuildChunks(t);
}

absl::Status Bench::MeasureOne(const Bound& b, const Config& c, Dir dir,
                               uint32_t prefix_tokens, size_t n) {
  Transfer t;
  t.b = &b;
  t.dir = dir;
  t.method = c.method;
  t.pool = reinterpret_cast<uint64_t>(pool_);
  t.arena_dev = arena_dev_;
  if (IsKvtier(c.method)) {
    absl::StatusOr<TransferEngine*> e = Engine(b, c.options);
    if (!e.ok()) return e.status();
    t.engine = *e;
  }
  absl::StatusOr<std::vector<double>> ms = TimeRepeats(
      [&] {
        Fresh(&t, n);
        return absl::OkStatus();
      },
      [&](cudaStream_t s) { return Enqueue(t, s); }, stream_, ev_, policy_);
  if (!ms.ok()) return ms.status();
  Record r;
  r.method = c.Name();
  r.layout = b.def;
  r.prefix_tokens = prefix_tokens;
  r.items = n;
  r.direction = DirName(dir);
  r.bytes = n * b.item_bytes;
  r.ctas = c.ctas;
  r.sms = r.ctas;
  r.default_grid = c.default_grid;
  r.st = Summarize(*std::move(ms));
  Report(r);
  records_.push_back(r);
  return absl::OkStatus();
}

// Evicts n items on stream_ while rehydrating n other items (other GPU
// pages, other rows) on stream2_, both released by one event.
absl::Status Bench::MeasureBoth(const Bound& b, const Config& c,
                                uint32_t prefix_tokens, size_t n) {
  Transfer out, in;
  for (Transfer* t : {&out, &in}) {
    t->b = &b;
    t->method = c.method;
    t->pool = reinterpret_cast<uint64_t>(pool_);
    t->arena_dev = arena_dev_;
  }
  out.dir = Dir::kEvict;
  in.dir = Dir::kRehydrate;
  in.contiguous_offset = n * b.item_bytes;
  if (IsKvtier(c.method)) {
    absl::StatusOr<TransferEngine*> e = Engine(b, c.options);
    if (!e.ok()) return e.status();
    out.engine = in.engine = *e;
  }
  const size_t bi = IndexOf(bounds_, b);
  std::vector<double> both, t_out, t_in;
  Clock::time_point first;
  for (int i = -1; i < policy_.repeats; ++i) {
    if (i == 0) first = Clock::now();
    std::vector<Items> sets(2);
    PickItems(*gpu_pickers_[bi], *row_pickers_[bi], n, &sets);
    out.items = std::move(sets[0]);
    in.items = std::move(sets[1]);
    BuildChunks(&out);
    BuildChunks(&in);
    BENCH_RETURN_IF_ERROR(Cuda(cudaEventRecord(ev_.start, stream_), "record"));
    BENCH_RETURN_IF_ERROR(
        Cuda(cudaStreamWaitEvent(stream2_, ev_.start, 0), "wait"));
    BENCH_RETURN_IF_ERROR(Enqueue(out, stream_));
    BENCH_RETURN_IF_ERROR(Enqueue(in, stream2_));
    BENCH_RETURN_IF_ERROR(Cuda(cudaEventRecord(ev_.stop, stream_), "record"));
    BENCH_RETURN_IF_ERROR(Cuda(cudaEventRecord(ev_.stop2, stream2_), "record"));
    BENCH_RETURN_IF_ERROR(Cuda(cudaEventSynchronize(ev_.stop), "evict"));
    BENCH_RETURN_IF_ERROR(Cuda(cudaEventSynchronize(ev_.stop2), "rehydrate"));
    float a = 0, c = 0;
    BENCH_RETURN_IF_ERROR(
        Cuda(cudaEventElapsedTime(&a, ev_.start, ev_.stop), "elapsed"));
    BENCH_RETURN_IF_ERROR(
        Cuda(cudaEventElapsedTime(&c, ev_.start, ev_.stop2), "elapsed"));
    if (i < 0) continue;
    t_out.push_back(a);
    t_in.push_back(c);
    both.push_back(std::max(a, c));
    const double spent =
        std::chrono::duration<double>(Clock::now() - first).count();
    if (static_cast<int>(both.size()) >= policy_.min_repeats &&
        policy_.max_seconds > 0 && spent > policy_.max_seconds) {
      break;
    }
  }
  Record r;
  r.method = c.Name();
  r.layout = b.def;
  r.prefix_tokens = prefix_tokens;
  r.items = n;
  r.direction = "both";
  r.bytes = 2 * n * b.item_bytes;
  r.ctas = c.ctas;
  r.sms = 2 * r.ctas;  // one grid per direction
  r.default_grid = c.default_grid;
  r.st = Summarize(both);
  r.evict_gbps_p50 = Gbps(n * b.item_bytes, Summarize(t_out).ms_p50);
  r.rehydrate_gbps_p50 = Gbps(n * b.item_bytes, Summarize(t_in).ms_p50);
  Report(r);
  records_.push_back(r);
  return absl::OkStatus();
}

// Moves the same few items with the loop, the batch and each kvtier
// configuration (staged, direct, every variant) into different rows
// (pre-filled with different bytes) and compares the rows; then rehydrates
// with each kvtier configuration and evicts the result again with the loop.
std::string Bench::Verify(const Bound& b) {
  const size_t n =
      b.def->snapshot() ? std::min<size_t>(4, b.host_rows / 3) : 32;
  const size_t bi = IndexOf(bounds_, b);
  std::vector<Items> sets(3);
  PickItems(*gpu_pickers_[bi], *row_pickers_[bi], n, &sets);
  std::vector<Config> kvtier = {Staged(client::kDefaultStagingCtas),
                                Direct(kernels::kDefaultMaxCtas)};
  for (const Config& v : variants_) kvtier.push_back(v);
  auto fill_rows = [&](const std::vector<uint32_t>& rows, uint8_t v) {
    for (size_t k = 0; k < b.bank_host.size(); ++k) {
      for (uint32_t r : rows) {
        std::memset(b.bank_host[k] + r * b.bank_stride[k], v,
                    b.bank_row_bytes[k]);
      }
    }
  };
  auto compare = [&](const std::vector<uint32_t>& x,
                     const std::vector<uint32_t>& y) -> std::string {
    for (size_t k = 0; k < b.bank_host.size(); ++k) {
      for (size_t i = 0; i < x.size(); ++i) {
        const uint8_t* p = b.bank_host[k] + x[i] * b.bank_stride[k];
        const uint8_t* q = b.bank_host[k] + y[i] * b.bank_stride[k];
        if (std::memcmp(p, q, b.bank_row_bytes[k]) != 0) {
          size_t off = 0;
          while (p[off] == q[off]) ++off;
          return absl::StrCat("bank ", k, " item ", i, " differs at byte ",
                              off);
        }
      }
    }
    return "";
  };
  auto run = [&](const Config& c, Dir dir, const Items& items) -> absl::Status {
    Transfer t;
    t.b = &b;
    t.dir = dir;
    t.method = c.method;
    if (IsKvtier(c.method)) {
      absl::StatusOr<TransferEngine*> e = Engine(b, c.options);
      if (!e.ok()) return e.status();
      t.engine = *e;
    }
    t.items = items;
    BuildChunks(&t);
    BENCH_RETURN_IF_ERROR(Enqueue(t, stream_));
    return Cuda(cudaStreamSynchronize(stream_), "verify copy");
  };
  // Same GPU items, three row sets.
  Items loop = sets[0], batch = sets[0], kv = sets[0];
  batch.rows = sets[1].rows;
  kv.rows = sets[2].rows;
  fill_rows(loop.rows, 0x11);
  fill_rows(batch.rows, 0x22);
  absl::Status st = run(Baseline(Method::kLoop), Dir::kEvict, loop);
  if (st.ok()) st = run(Baseline(Method::kBatch), Dir::kEvict, batch);
  if (!st.ok()) return st.ToString();
  std::string diff = compare(loop.rows, batch.rows);
  if (!diff.empty()) return "memcpy_batch evict vs memcpy_loop: " + diff;
  fill_rows(batch.rows, 0x55);
  st = run(Baseline(Method::kCopy2D), Dir::kEvict, batch);
  if (!st.ok()) return st.ToString();
  diff = compare(loop.rows, batch.rows);
  if (!diff.empty()) return "memcpy_2d evict vs memcpy_loop: " + diff;
  for (const Config& c : kvtier) {
    fill_rows(kv.rows, 0x33);
    st = run(c, Dir::kEvict, kv);
    if (!st.ok()) return c.Name() + ": " + st.ToString();
    diff = compare(loop.rows, kv.rows);
    if (!diff.empty()) return c.Name() + " evict vs memcpy_loop: " + diff;
    // kvtier rehydrates loop.rows into other GPU items; the loop evicts
    // them into batch.rows; those must equal loop.rows.
    Items back;
    back.gpu = sets[1].gpu;
    back.rows = loop.rows;
    st = run(c, Dir::kRehydrate, back);
    fill_rows(batch.rows, 0x44);
    back.rows = batch.rows;
    if (st.ok()) st = run(Baseline(Method::kLoop), Dir::kEvict, back);
    if (!st.ok()) return c.Name() + ": " + st.ToString();
    diff = compare(loop.rows, batch.rows);
    if (!diff.empty()) return c.Name() + " rehydrate round trip: " + diff;
  }
  return "ok";
}

void Bench::Run() {
  auto section = [&](const std::string& name, double since) {
    sections_.emplace_back(name, Elapsed() - since);
  };
  double t0 = Elapsed();
  if (absl::GetFlag(FLAGS_verify)) {
    for (const Bound& b : bounds_) {
      const std::string v = Verify(b);
      Progress("verify %s: %s", b.def->key, v);
      verify_.push_back(
          absl::StrCat(JsonString(b.def->key), ": ", JsonString(v)));
    }
  }
  section("verify", t0);

  // Main matrix, then the CTA sweep.
  for (const Bound& b : bounds_) {
    if (Stop()) break;
    t0 = Elapsed();
    std::vector<uint32_t> prefixes = prefixes_;
    if (b.def->snapshot()) prefixes = {0};
    for (uint32_t prefix : prefixes) {
      const size_t n = ItemsFor(b, prefix);
      if (n == 0 || n > b.gpu_items / 2 || n > b.host_rows) continue;
      const bool sweep = b.def->snapshot() || prefix == sweep_prefix_;
      for (Dir dir : {Dir::kEvict, Dir::kRehydrate}) {
        for (const Config& c : Configs(sweep)) {
          if (Stop()) break;
          absl::Status st = MeasureOne(b, c, dir, prefix, n);
          if (!st.ok()) {
            Fail(st, absl::StrCat(b.def->key, " ", prefix, " ", DirName(dir),
                                  " ", c.Name(), " ctas ", c.ctas));
          }
        }
      }
    }
    // If the sweep prefix is not among --prefixes, sweep it on its own.
    if (!b.def->snapshot() && std::find(prefixes.begin(), prefixes.end(),
                                        sweep_prefix_) == prefixes.end()) {
      const size_t n = ItemsFor(b, sweep_prefix_);
      for (Dir dir : {Dir::kEvict, Dir::kRehydrate}) {
        for (const Config& c : Configs(/*sweep=*/true)) {
          if (!IsKvtier(c.method)) continue;
          if (Stop() || n == 0 || n > b.gpu_items / 2) break;
          absl::Status st = MeasureOne(b, c, dir, sweep_prefix_, n);
          if (!st.ok()) Fail(st, absl::StrCat(b.def->key, " sweep"));
        }
      }
    }
    section(absl::StrCat("layout ", b.def->key), t0);
  }

  // Both directions at once.
  t0 = Elapsed();
  if (absl::GetFlag(FLAGS_bidirectional)) {
    const std::vector<std::string> keys =
        SplitList(absl::GetFlag(FLAGS_bidirectional_layouts));
    for (const Bound& b : bounds_) {
      if (Stop() || !Contains(keys, b.def->key) || b.def->snapshot()) continue;
      const size_t n = ItemsFor(b, sweep_prefix_);
      if (n == 0 || 2 * n > b.host_rows || 2 * n > b.gpu_items) continue;
      for (const Config& c : Configs(/*sweep=*/true)) {
        // One host thread cannot feed two per-chunk loops.
        if (c.method == Method::kLoop || Stop()) continue;
        absl::Status st = MeasureBoth(b, c, sweep_prefix_, n);
        if (!st.ok()) {
          Fail(st, absl::StrCat(b.def->key, " both ", c.Name(), " ", c.ctas));
        }
      }
    }
  }
  section("both directions", t0);

  t0 = Elapsed();
  if (absl::GetFlag(FLAGS_gemm) && !Stop()) {
    absl::Status st = Interference();
    if (!st.ok()) {
      Fail(st, "interference");
      interference_json_ =
          absl::StrFormat("{\"error\": %s}", JsonString(st.ToString()));
    }
  }
  section("interference", t0);
}

}  // namespace kvtier::bench
