// MetricsExporter: kvtierd's Prometheus metrics.
#include "daemon/metrics.h"

#include <array>
#include <atomic>
#include <exception>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "daemon/cluster_tier.h"
#include "daemon/kv_event_types.h"
#include "daemon/tier_core.h"
#include "prometheus/collectable.h"
#include "prometheus/exposer.h"
#include "prometheus/metric_family.h"
#include "prometheus/text_serializer.h"
#include "spdlog/spdlog.h"

namespace kvtier::daemon {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

constexpr const char* kOpNames[kTimedOps] = {"lookup", "commit", "attach"};
constexpr const char* kTransportNames[kTransports] = {"grpc", "engine"};

// A latency histogram that request threads update with relaxed atomics: no
// lock on the lookup path. Buckets are stored per bucket (not cumulative);
// Collect accumulates them.
class AtomicHistogram {
 public:
  void Observe(double seconds) {
    int b = 0;
    while (b < MetricsExporter::kBuckets &&
           seconds > MetricsExporter::kRequestBuckets[b]) {
      ++b;
    }
    buckets_[b].fetch_add(1, std::memory_order_relaxed);
    const double ns = seconds * 1e9;
    sum_ns_.fetch_add(ns > 0 ? static_cast<uint64_t>(ns) : 0,
                      std::memory_order_relaxed);
  }
  uint64_t count() const {
    uint64_t n = 0;
    for (const auto& b : buckets_) n += b.load(std::memory_order_relaxed);
    return n;
  }
  ClientMetric::Histogram Snapshot() const {
    ClientMetric::Histogram h;
    uint64_t cumulative = 0;
    for (int b = 0; b <= MetricsExporter::kBuckets; ++b) {
      cumulative += buckets_[b].load(std::memory_order_relaxed);
      ClientMetric::Bucket bucket;
      bucket.cumulative_count = cumulative;
      bucket.upper_bound = b < MetricsExporter::kBuckets
                               ? MetricsExporter::kRequestBuckets[b]
                               : std::numeric_limits<double>::infinity();
      h.bucket.push_back(bucket);
    }
    h.sample_count = cumulative;
    h.sample_sum = sum_ns_.load(std::memory_order_relaxed) / 1e9;
    return h;
  }

 private:
  // The last bucket is +Inf.
  std::array<std::atomic<uint64_t>, MetricsExporter::kBuckets + 1> buckets_{};
  std::atomic<uint64_t> sum_ns_{0};
};

ClientMetric::Label L(std::string name, std::string value) {
  return ClientMetric::Label{std::move(name), std::move(value)};
}

// Builds one family; Add appends a sample with its labels.
class Family {
 public:
  Family(std::string name, std::string help, MetricType type) {
    f_.name = std::move(name);
    f_.help = std::move(help);
    f_.type = type;
  }
  ClientMetric& Add(std::vector<ClientMetric::Label> labels) {
    ClientMetric& m = f_.metric.emplace_back();
    m.label = std::move(labels);
    return m;
  }
  void Value(std::vector<ClientMetric::Label> labels, double v) {
    ClientMetric& m = Add(std::move(labels));
    switch (f_.type) {
      case MetricType::Counter:
        m.counter.value = v;
        break;
      case MetricType::Gauge:
        m.gauge.value = v;
        break;
      default:
        m.untyped.value = v;
        break;
    }
  }
  MetricFamily Take() { return std::move(f_); }

 private:
  MetricFamily f_;
};

// Sum of the per-page banks' row bytes: the bytes of one page of one rank.
uint64_t PageBytes(const v1::Layout& layout) {
  uint64_t b = 0;
  for (const auto& bank : layout.page_banks()) b += bank.row_bytes();
  return b;
}

// The cluster tier's families (kvtier_cluster_*; docs/cluster.md).
void CollectCluster(const ClusterTier& cluster,
                    std::vector<MetricFamily>* out) {
  const ClusterCounters c = cluster.Counters();
  auto d = [](uint64_t v) { return static_cast<double>(v); };
  Family lookups("kvtier_cluster_lookups_total",
                 "Remote lookups (probes of the cluster tier past the local "
                 "match), by result: hit (found at least one page) or miss",
                 MetricType::Counter);
  lookups.Value({L("result", "hit")}, d(c.probes - c.probe_misses));
  lookups.Value({L("result", "miss")}, d(c.probe_misses));
  out->push_back(lookups.Take());
  Family hit_pages("kvtier_cluster_hit_pages_total",
                   "Pages remote lookups found in the cluster tier",
                   MetricType::Counter);
  hit_pages.Value({}, d(c.probe_hit_pages));
  out->push_back(hit_pages.Take());
  Family values("kvtier_cluster_values_total",
                "Cluster-tier values (a page of one rank) by outcome: spilled "
                "(written), spill_dropped (the spill queue was full), "
                "spill_failed (the write failed), fetched, fetch_miss, "
                "fetch_error (node down or past the deadline), rejected "
                "(failed the MAC or layout check: never served)",
                MetricType::Counter);
  for (const auto& [outcome, v] :
       {std::pair<const char*, uint64_t>{"spilled", c.spilled_pages},
        {"spill_dropped", c.spills_dropped},
        {"spill_failed", c.spills_failed},
        {"fetched", c.fetched_values},
        {"fetch_miss", c.fetch_misses},
        {"fetch_error", c.fetch_errors},
        {"rejected", c.rejected_values}}) {
    values.Value({L("outcome", outcome)}, d(v));
  }
  out->push_back(values.Take());
  Family bytes("kvtier_cluster_bytes_total",
               "Bytes of values written to (out) and fetched from (in) the "
               "cluster tier",
               MetricType::Counter);
  bytes.Value({L("direction", "out")}, d(c.spilled_bytes));
  bytes.Value({L("direction", "in")}, d(c.fetched_bytes));
  out->push_back(bytes.Take());
  Family ops("kvtier_cluster_ops_total",
             "Round trips to the cluster tier: probe (a remote lookup), "
             "fetch (a prefetch slice's GETs)",
             MetricType::Counter);
  ops.Value({L("op", "probe")}, d(c.probes));
  ops.Value({L("op", "fetch")}, d(c.fetches));
  out->push_back(ops.Take());
  Family seconds("kvtier_cluster_op_seconds_total",
                 "Seconds spent in them (divide by kvtier_cluster_ops_total "
                 "for the mean latency)",
                 MetricType::Counter);
  seconds.Value({L("op", "probe")}, c.probe_seconds);
  seconds.Value({L("op", "fetch")}, c.fetch_seconds);
  out->push_back(seconds.Take());
  Family prefetches("kvtier_cluster_prefetches_total",
                    "Prefetches, by outcome: complete, cut (ended before the "
                    "last page: a miss, a refused value, no room), refused "
                    "(too many waiting)",
                    MetricType::Counter);
  prefetches.Value({L("outcome", "complete")},
                   d(c.prefetches - c.prefetches_cut));
  prefetches.Value({L("outcome", "cut")}, d(c.prefetches_cut));
  prefetches.Value({L("outcome", "refused")}, d(c.jobs_refused));
  out->push_back(prefetches.Take());
  Family prefetched("kvtier_cluster_prefetched_pages_total",
                    "Pages prefetches committed into the host tier",
                    MetricType::Counter);
  prefetched.Value({}, d(c.prefetched_pages));
  out->push_back(prefetched.Take());
  Family stages("kvtier_cluster_prefetch_stage_seconds_total",
                "Seconds prefetch jobs spent per stage: wait (for a slice's "
                "values), check (their MACs and layouts, and the copy of "
                "those that pass into their rows), commit (allocating rows "
                "and committing them, journal included)",
                MetricType::Counter);
  stages.Value({L("stage", "wait")}, c.prefetch_wait_seconds);
  stages.Value({L("stage", "check")}, c.prefetch_check_seconds);
  stages.Value({L("stage", "commit")}, c.prefetch_commit_seconds);
  out->push_back(stages.Take());
  Family queue("kvtier_cluster_spill_queue_bytes",
               "Bytes of values waiting to be written", MetricType::Gauge);
  queue.Value({}, d(c.spill_queue_bytes));
  out->push_back(queue.Take());
  const RedisCluster::State st = cluster.RedisState();
  Family nodes("kvtier_cluster_redis_nodes",
               "Redis Cluster nodes the daemon knows, by role and state",
               MetricType::Gauge);
  std::map<std::pair<std::string, std::string>, double> by;
  for (const auto& n : st.nodes) {
    ++by[{n.master ? "master" : "replica", n.up ? "up" : "down"}];
  }
  for (const auto& [k, v] : by) {
    nodes.Value({L("role", k.first), L("state", k.second)}, v);
  }
  out->push_back(nodes.Take());
  Family slots("kvtier_cluster_redis_covered_slots",
               "Hash slots (of 16384) with a master in the daemon's slot map",
               MetricType::Gauge);
  slots.Value({}, d(st.covered_slots));
  out->push_back(slots.Take());
}

// kvtierd as a whole: version, uptime, sessions, namespaces.
void CollectDaemon(const v1::StatsResponse& stats,
                   std::vector<MetricFamily>* out) {
  Family info("kvtier_build_info", "kvtierd's version (value 1)",
              MetricType::Gauge);
  info.Value({L("version", stats.version())}, 1);
  out->push_back(info.Take());
  Family uptime("kvtier_uptime_seconds", "Seconds since kvtierd started",
                MetricType::Gauge);
  uptime.Value({}, static_cast<double>(stats.uptime_seconds()));
  out->push_back(uptime.Take());
  Family sessions("kvtier_sessions", "Open engine sessions", MetricType::Gauge);
  sessions.Value({}, stats.sessions());
  out->push_back(sessions.Take());
  Family namespaces("kvtier_namespaces", "Namespaces held", MetricType::Gauge);
  namespaces.Value({}, stats.namespaces_size());
  out->push_back(namespaces.Take());
}

// Per namespace: lookups, commits, bytes, evictions, the index, sessions,
// leases, reservations, fence holds, bank rows.
void CollectNamespaces(
    const v1::StatsResponse& stats,
    std::map<std::string, TierCore::NamespaceCounters>& counters,
    std::vector<MetricFamily>* out) {
  Family lookups("kvtier_lookups_total", "Lookups answered",
                 MetricType::Counter);
  Family pages("kvtier_lookup_pages_total",
               "Pages asked for by lookups: result=hit (usable) or miss",
               MetricType::Counter);
  Family committed("kvtier_committed_pages_total",
                   "Pages made visible by commits (deduplicated ones not "
                   "counted)",
                   MetricType::Counter);
  Family committed_snaps("kvtier_committed_snapshots_total",
                         "Snapshots made visible by commits",
                         MetricType::Counter);
  Family bytes("kvtier_bytes_total",
               "Bytes of rows moved through the tier: direction=in "
               "(committed pages and snapshots x row bytes), out (pages and "
               "snapshots served to lookups x row bytes)",
               MetricType::Counter);
  Family evictions(
      "kvtier_evictions_total",
      "Rows given up, by cause: page_lru (pages evicted LRU to make room), "
      "snapshot (snapshots evicted; includes spacing_violation), "
      "spacing_violation (snapshots evicted against the spacing policy), "
      "incomplete_ranks (pages some TP/PP rank never committed, which no "
      "lookup can use, evicted first; included in page_lru), "
      "drop (pages removed by a prefix drop)",
      MetricType::Counter);
  Family index_pages("kvtier_index_pages", "Pages in the index",
                     MetricType::Gauge);
  Family index_snaps("kvtier_index_snapshots", "Index pages holding a snapshot",
                     MetricType::Gauge);
  Family index_prefixes("kvtier_index_prefixes", "Cached prefixes (leaves)",
                        MetricType::Gauge);
  Family ns_sessions("kvtier_namespace_sessions",
                     "Sessions attached to the namespace", MetricType::Gauge);
  Family leases("kvtier_leases", "Pinned lookups not yet released",
                MetricType::Gauge);
  Family reservations("kvtier_reservations",
                      "Reservations not yet committed or aborted",
                      MetricType::Gauge);
  Family rows("kvtier_bank_rows",
              "Rows of a bank by state: used (committed), reserved, fenced "
              "(kept for an engine that may still touch them), free",
              MetricType::Gauge);
  Family holds("kvtier_fence_holds",
               "Fence holds: rows kept for a live engine that may still "
               "write or read them (proto: Fence)",
               MetricType::Gauge);
  Family restart_waiting(
      "kvtier_restart_fence_processes",
      "Processes from before the last restart whose report (or exit) the "
      "restart fence still waits for",
      MetricType::Gauge);
  Family row_bytes("kvtier_bank_row_bytes", "Bytes of one row of the bank",
                   MetricType::Gauge);
  for (const v1::NamespaceInfo& ns : stats.namespaces()) {
    const std::string& name = ns.name();
    const TierCore::NamespaceCounters& c = counters[name];
    const double page_bytes = static_cast<double>(PageBytes(ns.layout()));
    const double snap_bytes =
        static_cast<double>(ns.layout().snapshot_row_bytes());
    lookups.Value({L("namespace", name)}, ns.lookups());
    pages.Value({L("namespace", name), L("result", "hit")}, ns.hit_pages());
    pages.Value({L("namespace", name), L("result", "miss")}, ns.miss_pages());
    committed.Value({L("namespace", name)}, ns.committed_pages());
    committed_snaps.Value({L("namespace", name)}, c.committed_snapshots);
    bytes.Value(
        {L("namespace", name), L("direction", "in")},
        ns.committed_pages() * page_bytes + c.committed_snapshots * snap_bytes);
    bytes.Value({L("namespace", name), L("direction", "out")},
                ns.hit_pages() * page_bytes + c.snapshot_hits * snap_bytes);
    evictions.Value({L("namespace", name), L("cause", "page_lru")},
                    ns.evicted_pages());
    evictions.Value({L("namespace", name), L("cause", "snapshot")},
                    ns.evicted_snapshots());
    evictions.Value({L("namespace", name), L("cause", "spacing_violation")},
                    c.spacing_violations);
    evictions.Value({L("namespace", name), L("cause", "incomplete_ranks")},
                    c.evicted_incomplete_pages);
    evictions.Value({L("namespace", name), L("cause", "drop")},
                    c.dropped_pages);
    index_pages.Value({L("namespace", name)}, ns.pages());
    index_snaps.Value({L("namespace", name)}, ns.snapshots());
    index_prefixes.Value({L("namespace", name)}, ns.prefixes());
    ns_sessions.Value({L("namespace", name)}, ns.sessions());
    leases.Value({L("namespace", name)}, ns.leases());
    reservations.Value({L("namespace", name)}, ns.reservations());
    holds.Value({L("namespace", name)}, ns.fence_holds());
    restart_waiting.Value({L("namespace", name)}, ns.restart_fence_processes());
    for (const v1::BankUsage& b : ns.banks()) {
      const std::string rank = absl::StrCat(b.rank());
      for (const auto& [state, n] :
           {std::pair<const char*, uint64_t>{"used", b.used_rows()},
            {"reserved", b.reserved_rows()},
            {"fenced", b.fenced_rows()},
            {"free", b.free_rows()}}) {
        rows.Value({L("namespace", name), L("bank", b.bank()), L("rank", rank),
                    L("state", state)},
                   n);
      }
      row_bytes.Value(
          {L("namespace", name), L("bank", b.bank()), L("rank", rank)},
          b.row_bytes());
    }
  }
  for (Family* f :
       {&lookups, &pages, &committed, &committed_snaps, &bytes, &evictions,
        &index_pages, &index_snaps, &index_prefixes, &ns_sessions, &leases,
        &reservations, &holds, &restart_waiting, &rows, &row_bytes}) {
    out->push_back(f->Take());
  }
}

// The fence across namespaces (tier_core.h, "fence"), and the namespaces
// recovery could not reopen.
void CollectFence(const TierCore::FenceCounters& fc,
                  const v1::StatsResponse& stats,
                  std::vector<MetricFamily>* out) {
  // The fence across namespaces (tier_core.h, "fence").
  Family instances("kvtier_client_instances",
                   "Client instances (engines) known to the fence",
                   MetricType::Gauge);
  instances.Value({}, fc.instances);
  out->push_back(instances.Take());
  Family unseen("kvtier_fence_unseen_pid_sessions",
                "Sessions holding rows whose pid kvtierd cannot see (another "
                "pid namespace): fenced by --unseen_pid_fence_s",
                MetricType::Gauge);
  unseen.Value({}, fc.unseen_pid_sessions);
  out->push_back(unseen.Take());
  Family freed("kvtier_fence_holds_released_total",
               "Fence holds freed, by why: confirmed (the holder said its "
               "work is done) or gone (every process of its instance exited)",
               MetricType::Counter);
  freed.Value({L("why", "confirmed")}, fc.released_confirmed);
  freed.Value({L("why", "gone")}, fc.released_gone);
  out->push_back(freed.Take());
  Family mismatches("kvtier_fence_report_mismatches_total",
                    "Items reported after a reconnection that matched "
                    "nothing to fence",
                    MetricType::Counter);
  mismatches.Value({}, fc.report_mismatches);
  out->push_back(mismatches.Take());
  Family unrecoverable("kvtier_namespaces_unrecoverable",
                       "Namespaces recovery kept but cannot serve: "
                       "corrupt=true needs an operator's drop",
                       MetricType::Gauge);
  uint32_t corrupt = 0;
  for (const auto& u : stats.unrecoverable()) corrupt += u.corrupt() ? 1 : 0;
  unrecoverable.Value({L("corrupt", "true")}, corrupt);
  unrecoverable.Value({L("corrupt", "false")},
                      stats.unrecoverable_size() - corrupt);
  out->push_back(unrecoverable.Take());
}

// The fast lookup socket under abuse (fast_lookup_server.h) and the gRPC
// socket's gate (grpc_gate.h).
void CollectSockets(std::vector<MetricFamily>* out) {
  Family fast_conns("kvtier_fast_lookup_connections",
                    "Fast lookup connections by state: pending (awaiting "
                    "their Hello) or served",
                    MetricType::Gauge);
  fast_conns.Value({L("state", "pending")},
                   static_cast<double>(internal::fast_lookup_connections[0]));
  fast_conns.Value({L("state", "served")},
                   static_cast<double>(internal::fast_lookup_connections[1]));
  out->push_back(fast_conns.Take());
  Family fast_closed(
      "kvtier_fast_lookup_connections_closed_total",
      "Fast lookup connections the daemon closed, by reason: before being "
      "served, hello_deadline, uid_cap (the uid's oldest pending one made "
      "room), pending_cap, served_cap, bad_hello, no_fds (out of file "
      "descriptors); served, idle (a call connection past its idle "
      "timeout), frame_deadline (a frame not whole in time)",
      MetricType::Counter);
  for (int r = 0; r < kFastLookupCloseReasons; ++r) {
    fast_closed.Value(
        {L("reason", kFastLookupCloseNames[r])},
        static_cast<double>(FastLookupClosed(static_cast<FastLookupClose>(r))));
  }
  out->push_back(fast_closed.Take());
  // The gRPC socket's gate (grpc_gate.h).
  Family grpc_conns("kvtier_grpc_connections",
                    "gRPC connections by state: waiting (for their HTTP/2 "
                    "preface) or served",
                    MetricType::Gauge);
  grpc_conns.Value({L("state", "waiting")},
                   static_cast<double>(internal::grpc_connections[0]));
  grpc_conns.Value({L("state", "served")},
                   static_cast<double>(internal::grpc_connections[1]));
  out->push_back(grpc_conns.Take());
  Family grpc_closed(
      "kvtier_grpc_connections_closed_total",
      "gRPC connections the daemon refused or closed before serving them, by "
      "reason: uid_cap (--grpc_max_connections_per_uid), cap "
      "(--grpc_max_connections), preface_deadline, bad_preface, no_fds",
      MetricType::Counter);
  for (int r = 0; r < kGrpcCloseReasons; ++r) {
    grpc_closed.Value(
        {L("reason", kGrpcCloseNames[r])},
        static_cast<double>(GrpcClosed(static_cast<GrpcClose>(r))));
  }
  out->push_back(grpc_closed.Take());
}

}  // namespace

struct MetricsExporter::Impl : public prometheus::Collectable {
  explicit Impl(TierCore* c) : core(c) {}

  std::vector<MetricFamily> Collect() const override;
  void CollectLatency(std::vector<MetricFamily>* out) const;

  TierCore* const core;
  // [op][transport]
  AtomicHistogram latency[kTimedOps][kTransports];
  std::atomic<uint64_t> errors[kTimedOps][kTransports] = {};

  absl::Mutex mu;
  std::unique_ptr<prometheus::Exposer> exposer ABSL_GUARDED_BY(mu);
  int port ABSL_GUARDED_BY(mu) = 0;
};

std::vector<MetricFamily> MetricsExporter::Impl::Collect() const {
  std::vector<MetricFamily> out;
  v1::StatsResponse stats;
  if (absl::Status s = core->Stats(v1::StatsRequest(), &stats); !s.ok()) {
    SPDLOG_WARN("metrics: stats failed: {}", s.ToString());
  }
  std::map<std::string, TierCore::NamespaceCounters> counters;
  for (auto& c : core->Counters()) counters[c.name] = std::move(c);
  CollectDaemon(stats, &out);
  CollectNamespaces(stats, counters, &out);
  // KV events (daemon/kv_events.h), when the daemon publishes them.
  if (const KvEventSink* ev = core->kv_events(); ev != nullptr) {
    Family batches("kvtier_kv_event_batches_total",
                   "KV event batches for routers, by outcome: published, or "
                   "dropped (queue full or send failed; a subscriber can "
                   "replay only what was published)",
                   MetricType::Counter);
    batches.Value({L("outcome", "published")},
                  static_cast<double>(ev->published()));
    batches.Value({L("outcome", "dropped")},
                  static_cast<double>(ev->dropped()));
    out.push_back(batches.Take());
  }
  // The cluster tier (daemon/cluster_tier.h), when the daemon has one.
  if (const ClusterTier* cluster = core->cluster(); cluster != nullptr) {
    CollectCluster(*cluster, &out);
  }
  CollectFence(core->GetFenceCounters(), stats, &out);
  CollectLatency(&out);
  CollectSockets(&out);
  return out;
}

// Latency: the (op, transport) pairs that exist; attaches.
void MetricsExporter::Impl::CollectLatency(
    std::vector<MetricFamily>* out) const {
  static constexpr std::pair<TimedOp, Transport> kPairs[] = {
      {TimedOp::kLookup, Transport::kGrpc},
      {TimedOp::kLookup, Transport::kEngine},
      {TimedOp::kCommit, Transport::kGrpc},
      {TimedOp::kCommit, Transport::kEngine},
      {TimedOp::kAttach, Transport::kGrpc},
      {TimedOp::kAttach, Transport::kEngine}};
  Family duration("kvtier_request_duration_seconds",
                  "Time kvtierd took to answer a request, errors included, "
                  "by op (lookup, commit, attach) and transport (grpc; engine: "
                  "the engine socket, libkvtier's)",
                  MetricType::Histogram);
  Family errs("kvtier_request_errors_total",
              "Requests answered with an error, by op and transport",
              MetricType::Counter);
  Family attaches("kvtier_attaches_total", "Successful attaches",
                  MetricType::Counter);
  for (const auto& [op, transport] : kPairs) {
    const int o = static_cast<int>(op), t = static_cast<int>(transport);
    std::vector<ClientMetric::Label> labels = {
        L("op", kOpNames[o]), L("transport", kTransportNames[t])};
    duration.Add(labels).histogram = latency[o][t].Snapshot();
    errs.Value(labels, errors[o][t].load(std::memory_order_relaxed));
  }
  {
    // Both transports, each one's errors first: Observe counts the sample
    // before the error, so the count read second is never below the errors
    // read first.
    const int o = static_cast<int>(TimedOp::kAttach);
    uint64_t failed = 0, all = 0;
    for (int t = 0; t < kTransports; ++t) {
      failed += errors[o][t].load(std::memory_order_relaxed);
      all += latency[o][t].count();
    }
    attaches.Value({}, static_cast<double>(all - failed));
  }
  out->push_back(duration.Take());
  out->push_back(errs.Take());
  out->push_back(attaches.Take());
}

MetricsExporter::MetricsExporter(TierCore* core)
    : impl_(std::make_shared<Impl>(core)) {}

MetricsExporter::~MetricsExporter() { Stop(); }

absl::Status MetricsExporter::Start(const std::string& address) {
  // host:port with a numeric port; [v6]:port is accepted as civetweb takes it.
  const size_t colon = address.rfind(':');
  int port = -1;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(address.substr(colon + 1), &port) || port < 0 ||
      port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--metrics_address: '", address,
        "' is not host:port (e.g. 127.0.0.1:9464; port 0 picks one)"));
  }
  absl::MutexLock lock(&impl_->mu);
  if (impl_->exposer != nullptr) {
    return absl::FailedPreconditionError("metrics: already serving");
  }
  // prometheus-cpp reports bind failures by throwing: catch at this edge.
  try {
    auto exposer = std::make_unique<prometheus::Exposer>(address, 2);
    exposer->RegisterCollectable(impl_);
    const std::vector<int> ports = exposer->GetListeningPorts();
    impl_->port = ports.empty() ? port : ports.front();
    impl_->exposer = std::move(exposer);
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat(
        "--metrics_address: cannot serve on ", address, ": ", e.what()));
  }
  return absl::OkStatus();
}

int MetricsExporter::port() const {
  absl::MutexLock lock(&impl_->mu);
  return impl_->exposer != nullptr ? impl_->port : 0;
}

void MetricsExporter::Stop() {
  std::unique_ptr<prometheus::Exposer> exposer;
  {
    absl::MutexLock lock(&impl_->mu);
    exposer = std::move(impl_->exposer);
    impl_->port = 0;
  }
  // Destroying the exposer joins its threads, which may be inside Collect.
  exposer.reset();
}

std::string MetricsExporter::Render() const {
  return prometheus::TextSerializer().Serialize(impl_->Collect());
}

void MetricsExporter::Observe(TimedOp op, Transport transport, double seconds,
                              bool ok) {
  const int o = static_cast<int>(op), t = static_cast<int>(transport);
  if (o >= kTimedOps || t >= kTransports) return;
  impl_->latency[o][t].Observe(seconds);
  if (!ok) impl_->errors[o][t].fetch_add(1, std::memory_order_relaxed);
}

}  // namespace kvtier::daemon
