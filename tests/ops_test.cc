// Operations end to end, against a real kvtierd:
// - kvtierctl's status, prefixes, namespaces, stats, verify, watch and drop
//   against a daemon filled by real client processes: the tables (printed in
//   the test log), --json that python3's json module parses, the exit codes;
// - the Prometheus endpoint scraped over loopback HTTP: counters, bytes,
//   rows, sessions and both transports' latency histograms move with lookups
//   and commits;
// - systemd's notify protocol: with NOTIFY_SOCKET set the daemon sends
//   READY=1 once it serves (health is SERVING by then), WATCHDOG=1 at half of
//   WATCHDOG_USEC, STOPPING=1 on SIGTERM;
// - the shipped flag file runs, and SIGTERM keeps the segments for the next
//   daemon.
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "tests/daemon_process.h"
#include "tests/metrics_scrape.h"
#include "tests/test_pattern.h"

namespace kvtier::testing {
namespace {

using client::Client;
using ::testing::ContainsRegex;
using ::testing::HasSubstr;
using ::testing::Not;

const std::string kDaemon =
    ResolveProgram(KVTIER_KVTIERD_PATH, "daemon/kvtierd");
const std::string kCtl = ResolveProgram(KVTIER_KVTIERCTL_PATH, "cli/kvtierctl");
const std::string kClient =
    ResolveProgram(KVTIER_TEST_CLIENT_PATH, "tests/kvtier_test_client");

Ran RunCtl(const DaemonProcess& d, std::vector<std::string> args) {
  args.insert(args.begin(), {kCtl, "--socket=" + d.socket()});
  return RunProgram(args);
}

// Commits `pages` pages of prompt `seed` into `ns` from a separate process.
void Write(const DaemonProcess& d, const std::string& ns, uint32_t pages,
           uint64_t seed) {
  Ran r = RunProgram({kClient, "write", d.socket(), ns, absl::StrCat(pages),
                      absl::StrCat(seed)});
  ASSERT_EQ(r.rc, 0) << r.out;
}

TEST(KvtierctlTest, ReadsADaemonFilledByClients) {
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.Start({"--metrics_address="}).ok());
  // Three prompts of 24, 12 and 4 pages (16 tokens each) in "llama".
  Write(daemon, "llama", 24, 1);
  Write(daemon, "llama", 12, 2);
  Write(daemon, "llama", 4, 3);
  // Reading the 12-page prompt back makes it the most recently used.
  Ran read =
      RunProgram({kClient, "verify", daemon.socket(), "llama", "12", "2"});
  ASSERT_EQ(read.rc, 0) << read.out;

  Ran status = RunCtl(daemon, {"status"});
  std::printf("$ kvtierctl status\n%s\n", status.out.c_str());
  EXPECT_EQ(status.rc, 0);
  // (A client's session may close a moment after its process exits.)
  EXPECT_THAT(status.out, ContainsRegex("^kvtierd [0-9.]+, up [0-9]+s, [0-9] "
                                        "sessions?, 1 namespace, "));
  // 40 pages of 64 used in each per-page bank.
  // Columns: rank, row size, rows, used, reserved, fenced, free, use %.
  EXPECT_THAT(status.out, ContainsRegex("llama +kv +0 +4.0 KiB +64 +40 +0 +0 "
                                        "+24 +62.5% +256.0 KiB +4 KiB pages"));
  EXPECT_THAT(status.out,
              ContainsRegex("llama +scale +0 +100 B +64 +40 +0 +0 +24 +62.5%"));
  // The namespace: model, 16 tokens per page, 40 pages, 3 prefixes; the
  // verify read 12 hit pages.
  EXPECT_THAT(status.out,
              ContainsRegex("llama +kvtier-test +16 +1 +40 +0 +3 +163.9 "
                            "KiB +[0-9] +12 +0 +100.0%"));

  Ran prefixes = RunCtl(daemon, {"prefixes", "llama"});
  std::printf("$ kvtierctl prefixes llama\n%s\n", prefixes.out.c_str());
  EXPECT_EQ(prefixes.rc, 0);
  EXPECT_THAT(prefixes.out, HasSubstr("prefixes of 'llama': 3 in all, showing "
                                      "3, largest first"));
  std::vector<std::string> lines = absl::StrSplit(prefixes.out, '\n');
  ASSERT_GE(lines.size(), 6u) << prefixes.out;
  EXPECT_THAT(lines[2], ContainsRegex("^PREFIX +TOKENS +PAGES +SNAPSHOTS +SIZE "
                                      "+PINS +LAST USE$"));
  // 24 pages x (4096 + 100) bytes = 98.3 KiB.
  EXPECT_THAT(lines[3], ContainsRegex("^[0-9a-f]{16}… +384 +24 +0 +98.3 KiB "
                                      "+0 +[0-9]+s ago$"));
  EXPECT_THAT(lines[4], ContainsRegex(" 192 +12 +0 +49.2 KiB +0 "));
  EXPECT_THAT(lines[5], ContainsRegex(" 64 +4 +0 +16.4 KiB +0 "));

  Ran recent =
      RunCtl(daemon, {"prefixes", "llama", "--order=recent", "--limit=1"});
  EXPECT_EQ(recent.rc, 0);
  EXPECT_THAT(recent.out, HasSubstr("3 in all, showing 1, most recently "
                                    "used first"));
  EXPECT_THAT(recent.out, ContainsRegex("… +192 +12 "));

  Ran namespaces = RunCtl(daemon, {"namespaces"});
  EXPECT_EQ(namespaces.rc, 0);
  EXPECT_THAT(namespaces.out, ContainsRegex("llama +kvtier-test +16 +1 +40"));
  Ran stats = RunCtl(daemon, {"stats"});
  EXPECT_EQ(stats.rc, 0);
  // One lookup of 12 pages, all hits; 40 pages committed.
  EXPECT_THAT(stats.out, ContainsRegex("llama +1 +12 +0 +100.0% +40 +0 +0 "));

  Ran verify = RunCtl(daemon, {"verify"});
  EXPECT_EQ(verify.rc, 0) << verify.out;
  EXPECT_THAT(verify.out,
              HasSubstr("ok: 1 namespace checked, every invariant holds"));

  // watch --count=2: two frames, the second with rates.
  Ran watch = RunCtl(daemon, {"watch", "--count=2", "--interval=0.2"});
  EXPECT_EQ(watch.rc, 0);
  EXPECT_THAT(watch.out, ContainsRegex("rates from the next frame on(.|\n)*"
                                       "llama +[0-9] +40 (.|\n)*llama +[0-9] "
                                       "+40 .*0/s"));
  EXPECT_THAT(watch.out, HasSubstr("over the last 0."));

  // Exit codes: a daemon error, usage errors, an unreachable daemon.
  EXPECT_EQ(RunCtl(daemon, {"prefixes", "nope"}).rc, 1);
  EXPECT_EQ(RunCtl(daemon, {"prefixes"}).rc, 2);
  EXPECT_EQ(RunCtl(daemon, {"--order=oldest", "prefixes", "llama"}).rc, 2);
  EXPECT_EQ(RunCtl(daemon, {"--no_such_flag", "status"}).rc, 2);
  EXPECT_EQ(RunProgram({kCtl, "--socket=" + daemon.dir() + "/none.sock",
                        "--timeout=1", "status"})
                .rc,
            3);
  Ran help = RunProgram({kCtl, "--help"});
  EXPECT_EQ(help.rc, 0);
  EXPECT_THAT(help.out, HasSubstr("4  verify found a violated invariant"));

  // --json parses with Python's json module, as a script would read it.
  Ran json = RunCtl(daemon, {"--json", "status"});
  ASSERT_EQ(json.rc, 0);
  const std::string json_path = daemon.dir() + "/status.json";
  std::ofstream(json_path) << json.out;
  Ran py = RunProgram(
      {"/usr/bin/python3", "-c",
       "import json, sys\n"
       "d = json.load(open(sys.argv[1]))\n"
       "ns = d['namespaces'][0]\n"
       "kv = [b for b in ns['banks'] if b['bank'] == 'kv'][0]\n"
       "print(ns['name'], ns['prefixes'], kv['used_rows'], kv['free_rows'])\n",
       json_path});
  EXPECT_EQ(py.rc, 0);
  // proto3 JSON writes 64-bit integers as strings.
  EXPECT_EQ(py.out, "llama 3 40 24\n");
  Ran json_prefixes = RunCtl(daemon, {"--json", "prefixes", "llama"});
  EXPECT_EQ(json_prefixes.rc, 0);
  EXPECT_THAT(json_prefixes.out, HasSubstr("\"pages\": 24"));

  // Drop the 4-page prefix's last page by the start of its leaf hash (the
  // prefix then ends a page earlier), then the namespace.
  const std::string small_hash = lines[5].substr(0, 8);
  Ran drop = RunCtl(daemon, {"drop", "llama", small_hash});
  EXPECT_EQ(drop.rc, 0) << drop.out;
  EXPECT_THAT(drop.out, HasSubstr("dropped prefix " + small_hash));
  EXPECT_THAT(drop.out, HasSubstr(": 1 page, 0 snapshots"));
  EXPECT_THAT(RunCtl(daemon, {"prefixes", "llama"}).out,
              ContainsRegex("3 in all(.|\n)* 48 +3 "));
  Ran drop_all = RunCtl(daemon, {"drop", "llama", "--force"});
  EXPECT_EQ(drop_all.rc, 0) << drop_all.out;
  EXPECT_THAT(drop_all.out, HasSubstr("dropped namespace 'llama': 39 pages"));
  EXPECT_THAT(RunCtl(daemon, {"status"}).out, HasSubstr("0 namespaces"));
}

// Returns the sample `key` of a scrape, or -1 (and a failure) when absent.
double At(const std::map<std::string, double>& m, const std::string& key) {
  auto it = m.find(key);
  EXPECT_NE(it, m.end()) << "no sample " << key;
  return it == m.end() ? -1 : it->second;
}

TEST(MetricsEndpointTest, CountersMoveWithLookupsAndCommits) {
  const int port = FreeLoopbackPort();
  ASSERT_GT(port, 0);
  DaemonProcess daemon;
  ASSERT_TRUE(
      daemon.Start({absl::StrCat("--metrics_address=127.0.0.1:", port)}).ok());
  auto before = HttpGet(port, "/metrics");
  ASSERT_TRUE(before.ok()) << before.status();
  auto m0 = ParseMetrics(*before);
  EXPECT_EQ(At(m0, "kvtier_sessions"), 0);
  EXPECT_EQ(At(m0, "kvtier_namespaces"), 0);

  auto client = Client::Connect({.socket = daemon.socket()});
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE((*client)->fast_lookup_active());
  auto ns = (*client)->Attach(TestAttachOptions("m"));
  ASSERT_TRUE(ns.ok()) << ns.status();
  const std::string hashes = (*ns)->hasher().HashChain(TestTokens(5, 8 * 16));
  auto res = (*ns)->Reserve(8);
  ASSERT_TRUE(res.ok()) << res.status();
  ASSERT_TRUE(res->Commit("", hashes).ok());
  // Binary lookups (the client's default) and Lookup calls, hits and misses:
  // all on the engine socket.
  auto hit = (*ns)->Lookup(hashes, /*pin=*/false);
  ASSERT_TRUE(hit.ok()) << hit.status();
  EXPECT_EQ(hit->usable_pages(), 8u);
  const std::string other = (*ns)->hasher().HashChain(TestTokens(6, 3 * 16));
  ASSERT_TRUE((*ns)->Lookup(other, false).ok());
  auto call_client =
      Client::Connect({.socket = daemon.socket(), .fast_lookup = false});
  ASSERT_TRUE(call_client.ok());
  auto call_ns = (*call_client)->Attach(TestAttachOptions("m"));
  ASSERT_TRUE(call_ns.ok()) << call_ns.status();
  ASSERT_TRUE((*call_ns)->Lookup(hashes, false).ok());

  auto after = HttpGet(port, "/metrics");
  ASSERT_TRUE(after.ok()) << after.status();
  std::printf("scrape (excerpt):\n");
  for (absl::string_view line : absl::StrSplit(*after, '\n')) {
    if (absl::StrContains(line, "namespace=\"m\"") &&
        !absl::StrContains(line, "bank_row")) {
      std::printf("  %s\n", std::string(line).c_str());
    }
  }
  const auto m = ParseMetrics(*after);
  EXPECT_EQ(At(m, "kvtier_sessions"), 2);
  EXPECT_EQ(At(m, "kvtier_namespaces"), 1);
  EXPECT_EQ(At(m, "kvtier_namespace_sessions{namespace=\"m\"}"), 2);
  EXPECT_EQ(At(m, "kvtier_lookups_total{namespace=\"m\"}"), 3);
  EXPECT_EQ(At(m, "kvtier_lookup_pages_total{namespace=\"m\",result=\"hit\"}"),
            16);
  EXPECT_EQ(At(m, "kvtier_lookup_pages_total{namespace=\"m\",result=\"miss\"}"),
            3);
  EXPECT_EQ(At(m, "kvtier_committed_pages_total{namespace=\"m\"}"), 8);
  // Row bytes: 4096 (kv) + 100 (scale) per page.
  EXPECT_EQ(At(m, "kvtier_bytes_total{namespace=\"m\",direction=\"in\"}"),
            8 * 4196);
  EXPECT_EQ(At(m, "kvtier_bytes_total{namespace=\"m\",direction=\"out\"}"),
            16 * 4196);
  EXPECT_EQ(At(m,
               "kvtier_bank_rows{namespace=\"m\",bank=\"kv\",rank=\"0\","
               "state=\"used\"}"),
            8);
  EXPECT_EQ(At(m,
               "kvtier_bank_rows{namespace=\"m\",bank=\"kv\",rank=\"0\","
               "state=\"free\"}"),
            kTestPageRows - 8);
  EXPECT_EQ(At(m,
               "kvtier_request_duration_seconds_count{op=\"lookup\","
               "transport=\"engine\"}"),
            3);
  // libkvtier speaks no gRPC.
  EXPECT_EQ(At(m,
               "kvtier_request_duration_seconds_count{op=\"lookup\","
               "transport=\"grpc\"}"),
            0);
  EXPECT_EQ(At(m,
               "kvtier_request_duration_seconds_count{op=\"commit\","
               "transport=\"engine\"}"),
            1);
  EXPECT_GT(At(m,
               "kvtier_request_duration_seconds_sum{op=\"commit\","
               "transport=\"engine\"}"),
            0);
  EXPECT_EQ(At(m, "kvtier_attaches_total"), 2);
  EXPECT_EQ(At(m,
               "kvtier_request_errors_total{op=\"commit\","
               "transport=\"engine\"}"),
            0);

  // A commit the daemon refuses (its parent is not cached) counts as an
  // error.
  auto bad = (*ns)->Reserve(1);
  ASSERT_TRUE(bad.ok());
  const size_t hb = (*ns)->hasher().hash_bytes();
  EXPECT_FALSE(bad->Commit(other.substr(0, hb), hashes.substr(hb, hb)).ok());
  auto m2 = ParseMetrics(*HttpGet(port, "/metrics"));
  EXPECT_EQ(At(m2,
               "kvtier_request_errors_total{op=\"commit\","
               "transport=\"engine\"}"),
            1);
  EXPECT_EQ(At(m2,
               "kvtier_bank_rows{namespace=\"m\",bank=\"kv\",rank=\"0\","
               "state=\"reserved\"}"),
            1);
}

// A unix datagram socket standing in for systemd's notify socket.
class NotifySocket {
 public:
  explicit NotifySocket(const std::string& path) : path_(path) {
    fd_ = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
    bound_ = ::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  }
  ~NotifySocket() {
    ::close(fd_);
    ::unlink(path_.c_str());
  }
  bool bound() const { return bound_; }
  const std::string& path() const { return path_; }

  // Receives messages until one has the field `field` (e.g. "READY=1") or
  // `timeout` passes; returns whether it came. Every message is kept.
  bool WaitFor(const std::string& field, absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    while (absl::Now() < deadline) {
      timeval tv{0, 100 * 1000};
      ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
      char buf[4096];
      const ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
      if (n <= 0) continue;
      messages_.emplace_back(buf, static_cast<size_t>(n));
      for (absl::string_view f : absl::StrSplit(messages_.back(), '\n')) {
        if (f == field) return true;
      }
    }
    return false;
  }
  const std::vector<std::string>& messages() const { return messages_; }

 private:
  std::string path_;
  int fd_ = -1;
  bool bound_ = false;
  std::vector<std::string> messages_;
};

// A kvtierd started as systemd would: NOTIFY_SOCKET (and WATCHDOG_USEC)
// in its environment, in a folder of its own.
class NotifiedDaemonTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/dev/shm/kvtier-ops-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    std::filesystem::create_directories(dir_ + "/shm");
    notify_ = std::make_unique<NotifySocket>(dir_ + "/notify");
    ASSERT_TRUE(notify_->bound());
  }
  void TearDown() override {
    daemon_.reset();
    notify_.reset();
    std::filesystem::remove_all(dir_);
  }

  // Starts kvtierd through env(1) (which execs it: same pid, as systemd's
  // MAINPID) with `env` and `flags` after the test folder's own.
  void Start(const std::vector<std::string>& env,
             const std::vector<std::string>& flags) {
    std::vector<std::string> argv = {"/usr/bin/env",
                                     "NOTIFY_SOCKET=" + notify_->path()};
    argv.insert(argv.end(), env.begin(), env.end());
    std::vector<std::string> daemon = {kDaemon};
    daemon.insert(daemon.end(), flags.begin(), flags.end());
    // After a flag file: its --shm_dir and --state_dir are the host's.
    for (const std::string& f :
         {"--socket=" + socket(), "--shm_dir=" + dir_ + "/shm",
          "--state_dir=" + dir_ + "/state", std::string("--huge_pages=off"),
          std::string("--log_level=warn")}) {
      daemon.push_back(f);
    }
    for (std::string& a : DaemonCommand(std::move(daemon))) {
      argv.push_back(std::move(a));
    }
    auto child = Child::Spawn(argv);
    ASSERT_TRUE(child.ok()) << child.status();
    daemon_ = std::make_unique<Child>(*std::move(child));
  }

  std::string socket() const { return dir_ + "/kvtierd.sock"; }

  grpc::health::v1::HealthCheckResponse::ServingStatus Health() {
    auto channel = grpc::CreateChannel("unix:" + socket(),
                                       grpc::InsecureChannelCredentials());
    auto stub = grpc::health::v1::Health::NewStub(channel);
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    grpc::health::v1::HealthCheckResponse resp;
    grpc::Status s =
        stub->Check(&ctx, grpc::health::v1::HealthCheckRequest(), &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return resp.status();
  }

  std::string dir_;
  std::unique_ptr<NotifySocket> notify_;
  std::unique_ptr<Child> daemon_;
};

TEST_F(NotifiedDaemonTest, ReadyOnceServingWatchdogPingsStoppingOnSigterm) {
  Start({"WATCHDOG_USEC=200000"}, {"--metrics_address="});
  ASSERT_TRUE(notify_->WaitFor("READY=1", absl::Seconds(30)))
      << "no READY=1; messages: " << notify_->messages().size();
  EXPECT_TRUE(CheckDaemonFiltered(daemon_->pid()).ok());
  // READY=1 comes only once the socket serves and health says SERVING.
  EXPECT_EQ(Health(), grpc::health::v1::HealthCheckResponse::SERVING);
  EXPECT_THAT(notify_->messages().back(),
              HasSubstr("STATUS=serving on unix:" + socket()));
  // 0.2 s watchdog: pings every 0.1 s; two within a few seconds.
  ASSERT_TRUE(notify_->WaitFor("WATCHDOG=1", absl::Seconds(10)));
  ASSERT_TRUE(notify_->WaitFor("WATCHDOG=1", absl::Seconds(10)));

  daemon_->Signal(SIGTERM);
  EXPECT_TRUE(notify_->WaitFor("STOPPING=1", absl::Seconds(10)));
  auto rc = daemon_->Wait(absl::Seconds(20));
  ASSERT_TRUE(rc.ok()) << rc.status();
  EXPECT_EQ(*rc, 0);
  std::printf("notify messages: %zu, first: %s\n", notify_->messages().size(),
              notify_->messages().front().c_str());
}

TEST_F(NotifiedDaemonTest, ShippedFlagFileRunsAndSigtermKeepsTheSegments) {
  const std::string flags =
      std::string(KVTIER_SOURCE_DIR) + "/deploy/kvtierd.flags";
  // The test folder's socket and shm dir come after the flag file: they win.
  Start({}, {"--flagfile=" + flags, "--metrics_address=127.0.0.1:0"});
  ASSERT_TRUE(notify_->WaitFor("READY=1", absl::Seconds(30)));
  EXPECT_TRUE(CheckDaemonFiltered(daemon_->pid()).ok());
  EXPECT_THAT(notify_->messages().back(),
              ContainsRegex("metrics on http://127.0.0.1:[1-9][0-9]*/metrics"));
  Ran w = RunProgram({kClient, "write", socket(), "keep", "8", "4"});
  ASSERT_EQ(w.rc, 0) << w.out;
  const std::string kv = dir_ + "/shm/kvtier.keep.kv.r0";
  ASSERT_TRUE(std::filesystem::exists(kv));

  daemon_->Signal(SIGTERM);
  EXPECT_TRUE(notify_->WaitFor("STOPPING=1", absl::Seconds(10)));
  auto rc = daemon_->Wait(absl::Seconds(20));
  ASSERT_TRUE(rc.ok());
  EXPECT_EQ(*rc, 0);
  EXPECT_TRUE(std::filesystem::exists(kv)) << "SIGTERM must keep segments";
  EXPECT_FALSE(std::filesystem::exists(socket()));

  // The next daemon reopens the same bank instead of creating one.
  Start({}, {"--flagfile=" + flags, "--metrics_address="});
  ASSERT_TRUE(notify_->WaitFor("READY=1", absl::Seconds(30)));
  auto client = Client::Connect({.socket = socket()});
  ASSERT_TRUE(client.ok()) << client.status();
  auto ns = (*client)->Attach(TestAttachOptions("keep"));
  ASSERT_TRUE(ns.ok()) << ns.status();
  EXPECT_FALSE((*ns)->created());
  EXPECT_EQ((*ns)->page_banks()[0].path, kv);
}

}  // namespace
}  // namespace kvtier::testing
