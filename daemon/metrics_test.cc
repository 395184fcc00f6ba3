// Tests of MetricsExporter and the latency hook: the exported values follow
// the core's state (pages, bytes, rows, evictions, sessions), the histograms
// count what the hook observed, and the HTTP endpoint serves the same text.
#include "daemon/metrics.h"

#include <stdlib.h>

#include <chrono>
#include <filesystem>
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/kv_event_types.h"
#include "daemon/tier_core.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/metrics_scrape.h"

namespace kvtier::daemon {
namespace {

using ::kvtier::testing::HttpGet;
using ::kvtier::testing::ParseMetrics;
using ::testing::HasSubstr;

constexpr uint32_t kHashBytes = 32;  // SHA-256 namespaces.

std::string RandomHashes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string out(n * kHashBytes, '\0');
  for (auto& c : out) c = static_cast<char>(rng());
  return out;
}

std::string HashAt(const std::string& packed, size_t i) {
  return packed.substr(i * kHashBytes, kHashBytes);
}

// Page rows of 1024 + 100 bytes, snapshot rows of 4096.
v1::Layout HybridLayout() {
  v1::Layout l;
  l.set_model("metrics-test");
  l.set_tokens_per_page(16);
  l.set_num_layers(2);
  auto* kv = l.add_page_banks();
  kv->set_name("kv");
  kv->set_row_bytes(1024);
  auto* sc = l.add_page_banks();
  sc->set_name("scale");
  sc->set_row_bytes(100);
  l.set_snapshot_row_bytes(4096);
  return l;
}

class MetricsExporterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/dev/shm/kvtier-metrics-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    TierOptions o;
    o.segments.shm_dir = dir_;
    o.segments.huge_pages = shm::HugePagePolicy::kOff;
    core_ = std::make_unique<TierCore>(o);
    exporter_ = std::make_unique<MetricsExporter>(core_.get());
  }
  void TearDown() override {
    exporter_.reset();
    core_.reset();
    std::filesystem::remove_all(dir_);
  }

  // The value of sample `key` in a fresh Render(); fails the test when absent.
  double Sample(const std::string& key) {
    const auto samples = ParseMetrics(exporter_->Render());
    auto it = samples.find(key);
    EXPECT_NE(it, samples.end()) << "no sample " << key;
    return it == samples.end() ? -1 : it->second;
  }

  std::string dir_;
  std::unique_ptr<TierCore> core_;
  std::unique_ptr<MetricsExporter> exporter_;
};

TEST_F(MetricsExporterTest, ExportsTheCoresStateAtScrapeTime) {
  EXPECT_EQ(Sample("kvtier_sessions"), 0);
  EXPECT_EQ(Sample("kvtier_namespaces"), 0);

  v1::Hello hello;
  hello.set_client_name("engine");
  auto session = core_->OpenSession(hello, PeerInfo{});
  ASSERT_TRUE(session.ok());
  v1::AttachRequest attach;
  attach.set_session_id(*session);
  attach.set_namespace_("hy");
  *attach.mutable_layout() = HybridLayout();
  attach.mutable_capacity()->set_page_rows(8);
  attach.mutable_capacity()->set_snapshot_rows(4);
  v1::AttachResponse attached;
  ASSERT_TRUE(core_->Attach(attach, &attached).ok());
  EXPECT_EQ(Sample("kvtier_sessions"), 1);
  EXPECT_EQ(Sample("kvtier_namespaces"), 1);
  EXPECT_EQ(Sample("kvtier_bank_rows{namespace=\"hy\",bank=\"kv\",rank=\"0\","
                   "state=\"free\"}"),
            8);

  // Three pages with a snapshot after the second one.
  v1::ReserveRequest reserve;
  reserve.set_session_id(*session);
  reserve.set_namespace_id(attached.namespace_id());
  reserve.set_pages(3);
  reserve.set_snapshots(1);
  v1::ReserveResponse reserved;
  ASSERT_TRUE(core_->Reserve(reserve, &reserved).ok());
  EXPECT_EQ(Sample("kvtier_bank_rows{namespace=\"hy\",bank=\"kv\",rank=\"0\","
                   "state=\"reserved\"}"),
            3);
  EXPECT_EQ(Sample("kvtier_reservations{namespace=\"hy\"}"), 1);
  // A fenced abort of a second reservation: its rows show as fenced.
  v1::ReserveRequest second = reserve;
  second.set_pages(2);
  second.set_snapshots(0);
  v1::ReserveResponse second_rows;
  ASSERT_TRUE(core_->Reserve(second, &second_rows).ok());
  v1::AbortRequest abort;
  abort.set_session_id(*session);
  abort.set_namespace_id(attached.namespace_id());
  abort.set_reservation_id(second_rows.reservation_id());
  abort.set_fenced(true);
  v1::AbortResponse aborted;
  ASSERT_TRUE(core_->Abort(abort, &aborted).ok());
  EXPECT_EQ(Sample("kvtier_bank_rows{namespace=\"hy\",bank=\"kv\",rank=\"0\","
                   "state=\"fenced\"}"),
            2);
  EXPECT_EQ(Sample("kvtier_fence_holds{namespace=\"hy\"}"), 1);
  EXPECT_EQ(Sample("kvtier_client_instances"), 1);
  v1::FenceRequest release;
  release.set_session_id(*session);
  release.add_release(aborted.fence_hold());
  v1::FenceResponse released;
  ASSERT_TRUE(core_->Fence(release, &released).ok());
  EXPECT_EQ(Sample("kvtier_fence_holds{namespace=\"hy\"}"), 0);
  EXPECT_EQ(Sample("kvtier_fence_holds_released_total{why=\"confirmed\"}"), 1);
  const std::string hashes = RandomHashes(3, 1);
  v1::CommitRequest commit;
  commit.set_session_id(*session);
  commit.set_namespace_id(attached.namespace_id());
  commit.set_reservation_id(reserved.reservation_id());
  commit.set_hashes(hashes);
  auto* snap = commit.add_snapshots();
  snap->set_index(0);
  snap->set_hash(HashAt(hashes, 1));
  v1::CommitResponse committed;
  ASSERT_TRUE(core_->Commit(commit, &committed).ok());

  // The three pages and two unknown ones: the run matches 3, the snapshot
  // makes 2 usable (hits), 3 miss.
  v1::LookupRequest lookup;
  lookup.set_session_id(*session);
  lookup.set_namespace_id(attached.namespace_id());
  lookup.set_hashes(hashes + RandomHashes(2, 2));
  v1::LookupResponse found;
  ASSERT_TRUE(core_->Lookup(lookup, &found).ok());
  ASSERT_EQ(found.usable_pages(), 2u);
  ASSERT_TRUE(found.has_snapshot());

  const auto m = ParseMetrics(exporter_->Render());
  auto at = [&](const std::string& key) {
    auto it = m.find(key);
    EXPECT_NE(it, m.end()) << "no sample " << key;
    return it == m.end() ? -1 : it->second;
  };
  EXPECT_EQ(at("kvtier_lookups_total{namespace=\"hy\"}"), 1);
  EXPECT_EQ(at("kvtier_lookup_pages_total{namespace=\"hy\",result=\"hit\"}"),
            2);
  EXPECT_EQ(at("kvtier_lookup_pages_total{namespace=\"hy\",result=\"miss\"}"),
            3);
  EXPECT_EQ(at("kvtier_committed_pages_total{namespace=\"hy\"}"), 3);
  EXPECT_EQ(at("kvtier_committed_snapshots_total{namespace=\"hy\"}"), 1);
  // In: 3 pages x (1024 + 100) + 1 snapshot x 4096; out: 2 pages + 1.
  EXPECT_EQ(at("kvtier_bytes_total{namespace=\"hy\",direction=\"in\"}"),
            3 * 1124 + 4096);
  EXPECT_EQ(at("kvtier_bytes_total{namespace=\"hy\",direction=\"out\"}"),
            2 * 1124 + 4096);
  EXPECT_EQ(at("kvtier_bank_rows{namespace=\"hy\",bank=\"kv\",rank=\"0\","
               "state=\"used\"}"),
            3);
  EXPECT_EQ(at("kvtier_bank_rows{namespace=\"hy\",bank=\"scale\",rank=\"0\","
               "state=\"free\"}"),
            5);
  EXPECT_EQ(at("kvtier_bank_rows{namespace=\"hy\",bank=\"snapshot\","
               "rank=\"0\",state=\"used\"}"),
            1);
  EXPECT_EQ(at("kvtier_bank_row_bytes{namespace=\"hy\",bank=\"scale\","
               "rank=\"0\"}"),
            100);
  EXPECT_EQ(at("kvtier_index_pages{namespace=\"hy\"}"), 3);
  EXPECT_EQ(at("kvtier_index_snapshots{namespace=\"hy\"}"), 1);
  EXPECT_EQ(at("kvtier_index_prefixes{namespace=\"hy\"}"), 1);
  EXPECT_EQ(at("kvtier_namespace_sessions{namespace=\"hy\"}"), 1);
  EXPECT_EQ(at("kvtier_evictions_total{namespace=\"hy\",cause=\"drop\"}"), 0);

  // Dropping the last page counts as an eviction by drop.
  v1::DropRequest drop;
  drop.set_namespace_("hy");
  drop.set_hash(HashAt(hashes, 2));
  v1::DropResponse dropped;
  ASSERT_TRUE(core_->Drop(drop, &dropped).ok());
  EXPECT_EQ(Sample("kvtier_evictions_total{namespace=\"hy\",cause=\"drop\"}"),
            1);
  EXPECT_EQ(Sample("kvtier_index_pages{namespace=\"hy\"}"), 2);

  // Filling the 8-row bank twice over evicts pages LRU.
  for (int round = 0; round < 2; ++round) {
    reserve.set_pages(8);
    reserve.set_snapshots(0);
    ASSERT_TRUE(core_->Reserve(reserve, &reserved).ok());
    commit.set_reservation_id(reserved.reservation_id());
    commit.set_hashes(RandomHashes(8, 10 + round));
    commit.clear_snapshots();
    ASSERT_TRUE(core_->Commit(commit, &committed).ok());
  }
  EXPECT_GE(Sample("kvtier_evictions_total{namespace=\"hy\","
                   "cause=\"page_lru\"}"),
            8);

  core_->CloseSession(*session);
  EXPECT_EQ(Sample("kvtier_sessions"), 0);
}

TEST_F(MetricsExporterTest, HistogramsCountWhatTheHookObserved) {
  exporter_->Observe(TimedOp::kLookup, Transport::kEngine, 30e-6, true);
  exporter_->Observe(TimedOp::kLookup, Transport::kEngine, 40e-6, true);
  exporter_->Observe(TimedOp::kLookup, Transport::kEngine, 2e-3, false);
  exporter_->Observe(TimedOp::kCommit, Transport::kGrpc, 0.5e-3, true);
  exporter_->Observe(TimedOp::kAttach, Transport::kGrpc, 1.5, true);
  exporter_->Observe(TimedOp::kAttach, Transport::kGrpc, 0.1, false);
  const std::string text = exporter_->Render();
  EXPECT_THAT(text,
              HasSubstr("# TYPE kvtier_request_duration_seconds histogram"));
  const auto m = ParseMetrics(text);
  auto at = [&](const std::string& key) {
    auto it = m.find(key);
    EXPECT_NE(it, m.end()) << "no sample " << key << " in\n" << text;
    return it == m.end() ? -1 : it->second;
  };
  const std::string fast = "op=\"lookup\",transport=\"engine\"";
  EXPECT_EQ(at("kvtier_request_duration_seconds_count{" + fast + "}"), 3);
  EXPECT_EQ(
      at("kvtier_request_duration_seconds_bucket{" + fast + ",le=\"5e-05\"}"),
      2);
  EXPECT_EQ(
      at("kvtier_request_duration_seconds_bucket{" + fast + ",le=\"0.0025\"}"),
      3);
  EXPECT_EQ(
      at("kvtier_request_duration_seconds_bucket{" + fast + ",le=\"+Inf\"}"),
      3);
  EXPECT_NEAR(at("kvtier_request_duration_seconds_sum{" + fast + "}"),
              30e-6 + 40e-6 + 2e-3, 1e-8);
  EXPECT_EQ(at("kvtier_request_errors_total{" + fast + "}"), 1);
  EXPECT_EQ(at("kvtier_request_duration_seconds_count{op=\"lookup\","
               "transport=\"grpc\"}"),
            0);
  EXPECT_EQ(at("kvtier_request_duration_seconds_count{op=\"commit\","
               "transport=\"grpc\"}"),
            1);
  EXPECT_EQ(at("kvtier_attaches_total"), 1);
}

// Records every observation.
class RecordingSink : public LatencySink {
 public:
  void Observe(TimedOp op, Transport transport, double seconds,
               bool ok) override {
    ops.push_back(op);
    transports.push_back(transport);
    durations.push_back(seconds);
    oks.push_back(ok);
  }
  std::vector<TimedOp> ops;
  std::vector<Transport> transports;
  std::vector<double> durations;
  std::vector<bool> oks;
};

TEST(OpTimerTest, RecordsOnceIntoTheInstalledSink) {
  static_assert(TimedOpOf("Lookup") == TimedOp::kLookup);
  static_assert(TimedOpOf("Commit") == TimedOp::kCommit);
  static_assert(TimedOpOf("Attach") == TimedOp::kAttach);
  static_assert(TimedOpOf("Stats") == TimedOp::kNone);
  static_assert(TimedOpOf("Lookups") == TimedOp::kNone);

  RecordingSink sink;
  {
    OpTimer untimed(TimedOp::kCommit, Transport::kGrpc);  // No sink yet.
    SetLatencySink(&sink);
    untimed.Done(true);
  }
  EXPECT_TRUE(sink.ops.empty());
  // The recorded duration runs from construction to the first Done, in
  // seconds: at least the sleep in between (steady_clock is monotonic), at
  // most the interval measured around the timer.
  constexpr std::chrono::milliseconds kSlept(20);
  std::chrono::duration<double> outer;
  {
    const auto before = std::chrono::steady_clock::now();
    OpTimer timer(TimedOp::kLookup, Transport::kEngine);
    std::this_thread::sleep_for(kSlept);
    timer.Done(false);
    outer = std::chrono::steady_clock::now() - before;
    timer.Done(true);  // Only the first call records.
    OpTimer not_timed(TimedOp::kNone, Transport::kGrpc);
    not_timed.Done(true);
    OpTimer never_done(TimedOp::kCommit, Transport::kGrpc);
  }
  SetLatencySink(nullptr);
  OpTimer after(TimedOp::kAttach, Transport::kGrpc);
  after.Done(true);
  ASSERT_EQ(sink.ops.size(), 1u);
  EXPECT_EQ(sink.ops[0], TimedOp::kLookup);
  EXPECT_EQ(sink.transports[0], Transport::kEngine);
  EXPECT_GE(sink.durations[0], std::chrono::duration<double>(kSlept).count());
  EXPECT_LE(sink.durations[0], outer.count());
  EXPECT_FALSE(sink.oks[0]);
}

TEST_F(MetricsExporterTest, ExportsTheFastLookupSocketsCounters) {
  const double before =
      Sample("kvtier_fast_lookup_connections_closed_total{reason=\"uid_cap\"}");
  CountFastLookupClose(FastLookupClose::kUidCap);
  CountFastLookupClose(FastLookupClose::kUidCap);
  EXPECT_EQ(Sample("kvtier_fast_lookup_connections_closed_total{reason="
                   "\"uid_cap\"}"),
            before + 2);
  for (const char* reason : kFastLookupCloseNames) {
    Sample(absl::StrCat("kvtier_fast_lookup_connections_closed_total{reason=\"",
                        reason, "\"}"));
  }
  const double pending =
      Sample("kvtier_fast_lookup_connections{state=\"pending\"}");
  AddFastLookupConnections(3, 1);
  EXPECT_EQ(Sample("kvtier_fast_lookup_connections{state=\"pending\"}"),
            pending + 3);
  AddFastLookupConnections(-3, -1);
}

// A sink that only counts.
class CountingSink : public KvEventSink {
 public:
  void Publish(std::string, std::vector<KvEvent>) override {}
  uint64_t published() const override { return 7; }
  uint64_t dropped() const override { return 2; }
};

TEST_F(MetricsExporterTest, ExportsTheKvEventCountsWhenThereIsASink) {
  EXPECT_EQ(ParseMetrics(exporter_->Render())
                .count("kvtier_kv_event_batches_total{outcome=\"published\"}"),
            0u);  // No sink: no family.
  CountingSink sink;
  exporter_.reset();
  core_.reset();
  TierOptions o;
  o.segments.shm_dir = dir_;
  o.segments.huge_pages = shm::HugePagePolicy::kOff;
  o.kv_events = &sink;
  core_ = std::make_unique<TierCore>(o);
  exporter_ = std::make_unique<MetricsExporter>(core_.get());
  EXPECT_EQ(Sample("kvtier_kv_event_batches_total{outcome=\"published\"}"), 7);
  EXPECT_EQ(Sample("kvtier_kv_event_batches_total{outcome=\"dropped\"}"), 2);
  exporter_.reset();
  core_.reset();  // Before `sink` goes.
}

TEST_F(MetricsExporterTest, ServesTheTextOverHttp) {
  EXPECT_EQ(exporter_->port(), 0);
  EXPECT_EQ(exporter_->Start("no-port").code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(exporter_->Start("127.0.0.1:99999").code(),
            absl::StatusCode::kInvalidArgument);
  absl::Status bad = exporter_->Start(":x");
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.message(), HasSubstr("--metrics_address"));

  ASSERT_TRUE(exporter_->Start("127.0.0.1:0").ok());
  const int port = exporter_->port();
  ASSERT_GT(port, 0);
  EXPECT_EQ(exporter_->Start("127.0.0.1:0").code(),
            absl::StatusCode::kFailedPrecondition);
  auto body = HttpGet(port, "/metrics");
  ASSERT_TRUE(body.ok()) << body.status();
  EXPECT_THAT(*body, HasSubstr("# TYPE kvtier_sessions gauge"));
  EXPECT_THAT(*body, HasSubstr("kvtier_build_info{version=\""));

  // A second exporter on the same port cannot bind: UNAVAILABLE, not a
  // crash.
  MetricsExporter other(core_.get());
  absl::Status taken = other.Start(absl::StrCat("127.0.0.1:", port));
  EXPECT_EQ(taken.code(), absl::StatusCode::kUnavailable) << taken;
  EXPECT_EQ(other.port(), 0);

  exporter_->Stop();
  EXPECT_EQ(exporter_->port(), 0);
  EXPECT_EQ(HttpGet(port, "/metrics").status().code(),
            absl::StatusCode::kUnavailable);
  exporter_->Stop();  // Idempotent.
}

}  // namespace
}  // namespace kvtier::daemon
