// Tests of kvtierctl's commands: the tables they render from the daemon's
// answers, and Ctl against a fake TierService (an in-process gRPC server on a
// unix socket) for arguments, JSON, exit codes, watch and drop by hash.
#include "cli/commands.h"

#include <stdio.h>
#include <stdlib.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"

namespace kvtier::cli {
namespace {

using ::testing::ContainsRegex;
using ::testing::HasSubstr;
using ::testing::Not;

v1::NamespaceInfo SampleNamespace() {
  v1::NamespaceInfo ns;
  ns.set_name("llama");
  ns.mutable_layout()->set_model("llama-3-8b");
  ns.mutable_layout()->set_tokens_per_page(16);
  ns.mutable_layout()->set_tp_size(2);
  auto* kv = ns.mutable_layout()->add_page_banks();
  kv->set_name("kv");
  kv->set_row_bytes(2 << 20);
  ns.mutable_layout()->set_snapshot_row_bytes(0);
  ns.set_pages(1200);
  ns.set_prefixes(3);
  ns.set_sessions(2);
  ns.set_lookups(40);
  ns.set_hit_pages(900);
  ns.set_miss_pages(100);
  ns.set_committed_pages(1500);
  ns.set_evicted_pages(300);
  for (uint32_t rank = 0; rank < 2; ++rank) {
    v1::BankUsage* b = ns.add_banks();
    b->set_bank("kv");
    b->set_rank(rank);
    b->set_rows(4096);
    b->set_used_rows(1200);
    b->set_reserved_rows(16);
    b->set_free_rows(4096 - 1216);
    b->set_row_bytes(2 << 20);
    b->set_path("/dev/hugepages/kvtier/kvtier.llama.kv.r" +
                std::to_string(rank));
    b->set_huge_pages(true);
    b->set_numa_node(rank == 0 ? -1 : 1);  // Rank 0 unbound, rank 1 on node 1.
  }
  return ns;
}

TEST(RenderTest, StatusShowsTheDaemonNamespacesAndBanks) {
  v1::StatsResponse stats;
  stats.set_version("0.1.0");
  stats.set_uptime_seconds(3 * 3600 + 120);
  stats.set_sessions(2);
  *stats.add_namespaces() = SampleNamespace();
  const std::string out = RenderStatus(stats);
  EXPECT_THAT(out, HasSubstr("kvtierd 0.1.0, up 3h 2m, 2 sessions, "
                             "1 namespace, 16.0 GiB of banks, 4.7 GiB cached "
                             "(29.3%)\n"));
  EXPECT_THAT(out, ContainsRegex("llama +llama-3-8b +16 +2 +1,200 +0 +3 "
                                 "+4.7 GiB +2 +900 +100 +90.0%"));
  EXPECT_THAT(out, ContainsRegex("llama +kv +1 +2.0 MiB +4,096 +1,200 +16 "
                                 "+0 +2,880 +29.3% +8.0 GiB +2 MiB pages +1 "
                                 "+/dev/hugepages/kvtier/kvtier.llama.kv.r1"));
  EXPECT_THAT(out, ContainsRegex("llama +kv +0 .* +2 MiB pages +- "
                                 "+/dev/hugepages/kvtier/kvtier.llama.kv.r0"));
  EXPECT_THAT(out, Not(HasSubstr("fenced:")));
}

TEST(RenderTest, StatusShowsTheFenceAndUnrecoverableNamespaces) {
  v1::StatsResponse stats;
  stats.set_version("0.1.0");
  v1::NamespaceInfo ns = SampleNamespace();
  ns.mutable_banks(0)->set_fenced_rows(64);
  ns.mutable_banks(0)->set_free_rows(4096 - 1216 - 64);
  ns.set_fence_holds(2);
  ns.set_restart_fence_processes(1);
  *stats.add_namespaces() = ns;
  v1::UnrecoverableNamespace* u = stats.add_unrecoverable();
  u->set_name("old");
  u->set_reason("journal x is corrupt");
  u->set_corrupt(true);
  const std::string out = RenderStatus(stats);
  EXPECT_THAT(out, HasSubstr("fenced: 64 rows in 2 holds; restart fence "
                             "waiting for 1 process from before the restart"));
  EXPECT_THAT(out, HasSubstr("UNRECOVERABLE namespace 'old': journal x is "
                             "corrupt (drop it: kvtierctl drop --force old)"));
  EXPECT_THAT(out, ContainsRegex("llama +kv +0 +2.0 MiB +4,096 +1,200 +16 "
                                 "+64 +2,816"));
}

TEST(RenderTest, StatusWithoutNamespacesIsOneLine) {
  v1::StatsResponse stats;
  stats.set_version("0.1.0");
  stats.set_sessions(1);
  EXPECT_EQ(RenderStatus(stats),
            "kvtierd 0.1.0, up 0s, 1 session, 0 namespaces, 0 B of banks, "
            "0 B cached (-)\n");
}

TEST(RenderTest, StatusShowsTheClusterTierAndItsRedisNodes) {
  v1::StatsResponse stats;
  stats.set_version("0.1.0");
  v1::ClusterTierStatus* c = stats.mutable_cluster();
  c->set_enabled(true);
  c->set_covered_slots(16384);
  c->set_spilled_values(1200);
  c->set_spilled_bytes(3ull << 30);
  c->set_spills_dropped(4);
  c->set_rejected_values(1);
  c->set_prefetches(3);
  c->set_prefetched_pages(96);
  for (int i = 0; i < 3; ++i) {
    v1::ClusterTierStatus::Node* n = c->add_nodes();
    n->set_address(absl::StrCat("10.0.0.", i + 1, ":6379"));
    n->set_master(true);
    n->set_up(i != 1);
    n->set_slots(i == 2 ? 5462 : 5461);
    if (i == 1) n->set_last_error("connect: Connection refused");
  }
  const std::string out = RenderStatus(stats);
  EXPECT_THAT(out, HasSubstr("cluster tier: 2 of 3 Redis masters up, 16,384 "
                             "of 16384 slots mapped, spill on eviction\n"));
  EXPECT_THAT(out, HasSubstr("written 1,200 values (3.0 GiB), dropped 4"));
  EXPECT_THAT(out, HasSubstr("prefetches 3 (96 pages, 0 cut short)"));
  EXPECT_THAT(out, HasSubstr("rejected 1\n"));
  EXPECT_THAT(out, ContainsRegex("10.0.0.2:6379 +master +DOWN +5,461 "
                                 "+connect: Connection refused"));
  EXPECT_THAT(out, ContainsRegex("10.0.0.3:6379 +master +up +5,462 +-"));
  // Without a cluster tier, nothing about it.
  stats.clear_cluster();
  EXPECT_THAT(RenderStatus(stats), Not(HasSubstr("cluster tier")));
}

TEST(RenderTest, PrefixesShowTokensPagesSizeAndLastUse) {
  v1::ListPrefixesResponse resp;
  resp.set_total_prefixes(7);
  v1::PrefixInfo* p = resp.add_prefixes();
  p->set_leaf_hash(std::string(32, '\xab'));
  p->set_pages(12);
  p->set_tokens(192);
  p->set_snapshots(1);
  p->set_pins(1);
  const absl::Time now = absl::FromUnixSeconds(1'800'000'000);
  p->set_last_use_unix_ms(absl::ToUnixMillis(now) - 65'000);
  const v1::NamespaceInfo info = SampleNamespace();
  const std::string out = RenderPrefixes("llama", resp, "recent", &info, now);
  EXPECT_THAT(out, HasSubstr("prefixes of 'llama': 7 in all, showing 1, most "
                             "recently used first"));
  // 12 pages x 2 MiB x 2 ranks.
  EXPECT_THAT(out, ContainsRegex("abababababababab… +192 +12 +1 +48.0 MiB +1 "
                                 "+1m 5s ago"));
  EXPECT_THAT(RenderPrefixes("llama", resp, "largest", nullptr, now),
              ContainsRegex("largest first(.|\n)*192 +12 +1 +- +1"));
  EXPECT_EQ(
      RenderPrefixes("x", v1::ListPrefixesResponse(), "largest", nullptr, now),
      "no prefixes cached in 'x'\n");
}

TEST(RenderTest, StatsAndVerify) {
  v1::StatsResponse stats;
  *stats.add_namespaces() = SampleNamespace();
  EXPECT_THAT(RenderStats(stats),
              ContainsRegex("llama +40 +900 +100 +90.0% +1,500 +300 +0 +2"));
  v1::VerifyResponse ok;
  ok.set_ok(true);
  ok.set_namespaces_checked(3);
  EXPECT_EQ(RenderVerify(ok),
            "ok: 3 namespaces checked, every invariant holds\n");
  v1::VerifyResponse bad;
  bad.set_violation("namespace 'x': row 3 is free and committed");
  bad.set_namespaces_checked(1);
  EXPECT_THAT(RenderVerify(bad),
              HasSubstr("VIOLATION: namespace 'x': row 3 is free and "
                        "committed"));
}

TEST(RenderTest, WatchFrameShowsRatesFromTheSecondFrame) {
  v1::StatsResponse first;
  *first.add_namespaces() = SampleNamespace();
  v1::StatsResponse second = first;
  auto* ns = second.mutable_namespaces(0);
  ns->set_lookups(ns->lookups() + 20);
  ns->set_hit_pages(ns->hit_pages() + 300);
  ns->set_miss_pages(ns->miss_pages() + 100);
  ns->set_committed_pages(ns->committed_pages() + 50);
  const absl::Time now = absl::Now();
  const std::string a =
      RenderWatchFrame(nullptr, first, absl::ZeroDuration(), now);
  EXPECT_THAT(a, HasSubstr("rates from the next frame on"));
  EXPECT_THAT(a, ContainsRegex("llama +2 +1,200 +4.7 GiB +29.3% +- +- +90.0%"));
  const std::string b =
      RenderWatchFrame(&first, second, absl::Seconds(10), now);
  // Over 10 s: 2 lookups/s, 30 hit pages/s, 75% hits, 5 commits/s, 0
  // evictions.
  EXPECT_THAT(b, ContainsRegex("llama +2 +1,200 +4.7 GiB +29.3% +2.0/s "
                               "+30.0/s +75.0% +5.0/s +0/s"));
  EXPECT_THAT(b, HasSubstr("over the last 10.0s"));
}

TEST(ParseHexTest, AcceptsHexAndNamesTheArgument) {
  auto v = ParseHex("00aBff");
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(*v, std::string("\x00\xab\xff", 3));
  EXPECT_THAT(ParseHex("abc").status().message(), HasSubstr("HASH"));
  EXPECT_THAT(ParseHex("zz").status().message(), HasSubstr("HASH"));
  EXPECT_FALSE(ParseHex("").ok());
}

TEST(ExitCodeTest, UnreachableOrDaemonError) {
  EXPECT_EQ(ExitCodeFor(grpc::Status(grpc::StatusCode::UNAVAILABLE, "")),
            kExitUnreachable);
  EXPECT_EQ(ExitCodeFor(grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "")),
            kExitUnreachable);
  EXPECT_EQ(ExitCodeFor(grpc::Status(grpc::StatusCode::NOT_FOUND, "")),
            kExitDaemonError);
  EXPECT_EQ(ExitCodeFor(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "")),
            kExitDaemonError);
}

// A TierService that answers from canned state and records drops.
class FakeTier final : public v1::TierService::Service {
 public:
  grpc::Status Stats(grpc::ServerContext*, const v1::StatsRequest*,
                     v1::StatsResponse* resp) override {
    absl::MutexLock lock(&mu_);
    ++stats_calls_;
    resp->set_version("9.9.9");
    *resp->add_namespaces() = SampleNamespace();
    resp->mutable_namespaces(0)->set_lookups(stats_calls_ * 10);
    return grpc::Status::OK;
  }
  grpc::Status ListNamespaces(grpc::ServerContext*,
                              const v1::ListNamespacesRequest*,
                              v1::ListNamespacesResponse* resp) override {
    *resp->add_namespaces() = SampleNamespace();
    return grpc::Status::OK;
  }
  grpc::Status ListPrefixes(grpc::ServerContext*,
                            const v1::ListPrefixesRequest* req,
                            v1::ListPrefixesResponse* resp) override {
    if (req->namespace_() != "llama") {
      return grpc::Status(
          grpc::StatusCode::NOT_FOUND,
          "namespace: no namespace '" + req->namespace_() + "'");
    }
    resp->set_total_prefixes(3);
    for (const char* lead : {"\xab\x01\x01", "\xab\x01\x02", "\xcd\x01\x01"}) {
      v1::PrefixInfo* p = resp->add_prefixes();
      p->set_leaf_hash(std::string(lead, 3) + std::string(29, '\x07'));
      p->set_pages(4);
      p->set_tokens(64);
    }
    return grpc::Status::OK;
  }
  grpc::Status Drop(grpc::ServerContext*, const v1::DropRequest* req,
                    v1::DropResponse* resp) override {
    absl::MutexLock lock(&mu_);
    if (req->namespace_() != "llama") {
      return grpc::Status(grpc::StatusCode::NOT_FOUND, "no namespace");
    }
    drops_.push_back(*req);
    resp->set_dropped_pages(4);
    return grpc::Status::OK;
  }
  grpc::Status Verify(grpc::ServerContext*, const v1::VerifyRequest*,
                      v1::VerifyResponse* resp) override {
    absl::MutexLock lock(&mu_);
    resp->set_ok(verify_ok_);
    resp->set_namespaces_checked(1);
    if (!verify_ok_) resp->set_violation("row 7 is free and committed");
    return grpc::Status::OK;
  }

  void set_verify_ok(bool ok) {
    absl::MutexLock lock(&mu_);
    verify_ok_ = ok;
  }
  std::vector<v1::DropRequest> drops() {
    absl::MutexLock lock(&mu_);
    return drops_;
  }

 private:
  absl::Mutex mu_;
  int stats_calls_ ABSL_GUARDED_BY(mu_) = 0;
  bool verify_ok_ ABSL_GUARDED_BY(mu_) = true;
  std::vector<v1::DropRequest> drops_ ABSL_GUARDED_BY(mu_);
};

class CtlTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kvtierctl-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    socket_ = dir_ + "/fake.sock";
    grpc::ServerBuilder builder;
    builder.AddListeningPort("unix:" + socket_,
                             grpc::InsecureServerCredentials());
    builder.RegisterService(&fake_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
  }
  void TearDown() override {
    server_->Shutdown();
    std::filesystem::remove_all(dir_);
  }

  // Runs `args` against the fake (or `socket`); output in out_, errors in
  // err_.
  int Run(std::vector<std::string> args, Options options = Options(),
          const std::string& socket = "") {
    options.socket = socket.empty() ? socket_ : socket;
    if (options.timeout == absl::Seconds(5))
      options.timeout = absl::Seconds(10);
    char* out_buf = nullptr;
    char* err_buf = nullptr;
    size_t out_len = 0, err_len = 0;
    FILE* out = open_memstream(&out_buf, &out_len);
    FILE* err = open_memstream(&err_buf, &err_len);
    auto channel = grpc::CreateChannel("unix:" + options.socket,
                                       grpc::InsecureChannelCredentials());
    int rc;
    {
      Ctl ctl(v1::TierService::NewStub(channel), options, out, err);
      rc = ctl.Run(args);
    }
    fclose(out);
    fclose(err);
    out_.assign(out_buf, out_len);
    err_.assign(err_buf, err_len);
    free(out_buf);
    free(err_buf);
    return rc;
  }

  std::string dir_, socket_;
  FakeTier fake_;
  std::unique_ptr<grpc::Server> server_;
  std::string out_, err_;
};

TEST_F(CtlTest, StatusAsTableAndAsJson) {
  EXPECT_EQ(Run({"status"}), kExitOk) << err_;
  EXPECT_THAT(out_, HasSubstr("kvtierd 9.9.9"));
  EXPECT_THAT(out_, HasSubstr("ROW SIZE"));
  Options json;
  json.json = true;
  EXPECT_EQ(Run({"status"}, json), kExitOk) << err_;
  v1::StatsResponse parsed;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(out_, &parsed).ok())
      << out_;
  EXPECT_EQ(parsed.version(), "9.9.9");
  EXPECT_EQ(parsed.namespaces(0).banks_size(), 2);
  EXPECT_THAT(out_, HasSubstr("\"used_rows\": \"1200\""));
}

TEST_F(CtlTest, UsageErrorsExitTwo) {
  EXPECT_EQ(Run({}), kExitUsage);
  EXPECT_EQ(Run({"frobnicate"}), kExitUsage);
  EXPECT_THAT(err_, HasSubstr("unknown command 'frobnicate'"));
  EXPECT_EQ(Run({"prefixes"}), kExitUsage);
  EXPECT_THAT(err_, HasSubstr("prefixes: name one namespace"));
  EXPECT_EQ(Run({"status", "extra"}), kExitUsage);
  EXPECT_EQ(Run({"drop", "a", "b", "c"}), kExitUsage);
  Options bad_order;
  bad_order.order = "oldest";
  EXPECT_EQ(Run({"prefixes", "llama"}, bad_order), kExitUsage);
  EXPECT_THAT(err_, HasSubstr("--order"));
  Options bad_limit;
  bad_limit.limit = 20000;
  EXPECT_EQ(Run({"prefixes", "llama"}, bad_limit), kExitUsage);
  Options bad_interval;
  bad_interval.interval = absl::ZeroDuration();
  EXPECT_EQ(Run({"watch"}, bad_interval), kExitUsage);
  EXPECT_TRUE(fake_.drops().empty());
}

TEST_F(CtlTest, DaemonErrorsExitOneAndUnreachableExitsThree) {
  EXPECT_EQ(Run({"prefixes", "nope"}), kExitDaemonError);
  EXPECT_THAT(err_, HasSubstr("no namespace 'nope'"));
  Options quick;
  quick.timeout = absl::Seconds(1);
  EXPECT_EQ(Run({"status"}, quick, dir_ + "/nobody.sock"), kExitUnreachable);
  EXPECT_THAT(err_,
              HasSubstr("cannot reach kvtierd at " + dir_ + "/nobody.sock"));
}

TEST_F(CtlTest, VerifyExitsFourOnAViolation) {
  EXPECT_EQ(Run({"verify"}), kExitOk);
  EXPECT_THAT(out_, HasSubstr("every invariant holds"));
  fake_.set_verify_ok(false);
  EXPECT_EQ(Run({"verify"}), kExitViolation);
  EXPECT_THAT(out_, HasSubstr("VIOLATION: row 7 is free and committed"));
  Options json;
  json.json = true;
  EXPECT_EQ(Run({"verify"}, json), kExitViolation);
  EXPECT_THAT(out_, HasSubstr("\"ok\": false"));
}

TEST_F(CtlTest, DropResolvesAUniqueHashPrefix) {
  EXPECT_EQ(Run({"drop", "llama", "ab"}), kExitUsage);  // Too short.
  EXPECT_EQ(Run({"drop", "llama", "abzz"}), kExitUsage);
  EXPECT_THAT(err_, HasSubstr("not a hex digit"));
  EXPECT_EQ(Run({"drop", "llama", "ab01"}), kExitUsage);  // Two match.
  EXPECT_THAT(err_, HasSubstr("starts 2 prefixes"));
  EXPECT_EQ(Run({"drop", "llama", "eeee"}), kExitDaemonError);  // None.
  EXPECT_TRUE(fake_.drops().empty());

  EXPECT_EQ(Run({"drop", "llama", "AB0102"}), kExitOk) << err_;
  ASSERT_EQ(fake_.drops().size(), 1u);
  EXPECT_EQ(fake_.drops()[0].hash(),
            std::string("\xab\x01\x02", 3) + std::string(29, '\x07'));
  EXPECT_THAT(out_, HasSubstr("dropped prefix ab01020707070707… of 'llama': "
                              "4 pages, 0 snapshots"));

  Options force;
  force.force = true;
  EXPECT_EQ(Run({"drop", "llama"}, force), kExitOk);
  ASSERT_EQ(fake_.drops().size(), 2u);
  EXPECT_TRUE(fake_.drops()[1].force());
  EXPECT_TRUE(fake_.drops()[1].hash().empty());
  EXPECT_THAT(out_, HasSubstr("dropped namespace 'llama'"));
}

TEST_F(CtlTest, WatchStopsAfterCountFrames) {
  Options watch;
  watch.count = 3;
  watch.interval = absl::Milliseconds(50);
  EXPECT_EQ(Run({"watch"}, watch), kExitOk) << err_;
  // Three frames: the first without rates, the others with them.
  size_t frames = 0;
  for (size_t at = 0;
       (at = out_.find("kvtierd 9.9.9", at)) != std::string::npos; ++at) {
    ++frames;
  }
  EXPECT_EQ(frames, 3u) << out_;
  EXPECT_THAT(out_, HasSubstr("rates from the next frame on"));
  EXPECT_THAT(out_, HasSubstr("per second and HIT % over the last"));
  EXPECT_THAT(out_, Not(HasSubstr("\x1b[2J")));

  watch.redraw = true;
  watch.count = 2;
  EXPECT_EQ(Run({"watch"}, watch), kExitOk);
  EXPECT_EQ(out_.rfind("\x1b[H\x1b[2J", 0), 0u);

  Options json;
  json.json = true;
  json.count = 2;
  json.interval = absl::Milliseconds(10);
  EXPECT_EQ(Run({"watch"}, json), kExitOk);
  // One JSON object per line.
  std::vector<std::string> lines =
      absl::StrSplit(out_, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 2u) << out_;
  for (const auto& line : lines) {
    v1::StatsResponse parsed;
    EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(line, &parsed).ok())
        << line;
  }
}

}  // namespace
}  // namespace kvtier::cli
