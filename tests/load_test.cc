// Load (issue 5, item 3): 16 kvtier_load_client processes run a random mix
// of pinned and unpinned lookups, reserve/commit, reserve/abort, held
// reservations, held leases, releases and reconnects against one real
// kvtierd whose bank is ten times smaller than the working set, for
// KVTIER_LOAD_SECONDS (default 60). Then:
//   - every client exited 0: no wrong byte served, no unexpected error;
//   - the daemon is alive, Verify is ok, every row is free or committed and
//     no reservation, lease or session is left;
//   - the daemon's resident memory (VmRSS) is flat: no sample after the
//     warm-up exceeds the warm-up sample by more than the slack;
//   - the daemon stops cleanly on SIGTERM (under ASan that includes
//     LeakSanitizer's report at exit).
// It prints one "LOAD ..." line with the figures.
//
// Thread-safety: single-threaded test.
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "kvtier/v1/tier.grpc.pb.h"
#include "tests/daemon_process.h"

#if defined(__SANITIZE_ADDRESS__)
#define KVTIER_UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KVTIER_UNDER_ASAN 1
#endif
#if __has_feature(thread_sanitizer)
#define KVTIER_UNDER_TSAN 1
#endif
#endif

namespace kvtier::testing {
namespace {

const std::string kLoadClient =
    ResolveProgram(KVTIER_LOAD_CLIENT_PATH, "tests/kvtier_load_client");

constexpr int kClients = 16;
constexpr uint64_t kBankRows = 256;
constexpr uint32_t kPrefixes = 160;
constexpr uint32_t kPagesPerPrefix = 16;  // 2,560 pages: 10x the bank.

// The pid of the process serving unix socket `path`, from SO_PEERCRED.
pid_t ServerPid(const std::string& path) {
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  pid_t pid = -1;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    ucred cred{};
    socklen_t len = sizeof(cred);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0) {
      pid = cred.pid;
    }
  }
  close(fd);
  return pid;
}

// A field of /proc/<pid>/status in KiB ("VmRSS", "RssAnon"); -1 if absent.
int64_t StatusKib(pid_t pid, const std::string& field) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) != 0) continue;
    std::vector<std::string> parts =
        absl::StrSplit(line, ' ', absl::SkipEmpty());
    int64_t kib = -1;
    if (parts.size() >= 2 && absl::SimpleAtoi(parts[1], &kib)) return kib;
  }
  return -1;
}

// Adds the k=v counters of an "OPS ..." line to `sum`.
bool AddCounters(const std::string& output,
                 std::map<std::string, uint64_t>* sum) {
  const size_t at = output.find("OPS ");
  if (at == std::string::npos) return false;
  const std::string line =
      output.substr(at + 4, output.find('\n', at) - at - 4);
  for (absl::string_view kv : absl::StrSplit(line, ' ', absl::SkipEmpty())) {
    std::pair<std::string, std::string> p = absl::StrSplit(kv, '=');
    uint64_t v = 0;
    if (!absl::SimpleAtoi(p.second, &v)) return false;
    (*sum)[p.first] += v;
  }
  return true;
}

double LoadSeconds() {
  const char* env = std::getenv("KVTIER_LOAD_SECONDS");
  double s = 0;
  if (env != nullptr && absl::SimpleAtod(env, &s) && s > 0) return s;
  return 60;
}

TEST(LoadTest, SixteenClientsOnABankTenTimesTooSmall) {
  const double seconds = LoadSeconds();
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.Start().ok());
  const pid_t pid = ServerPid(daemon.socket() + ".lookup");
  ASSERT_GT(pid, 0);

  const absl::Time start = absl::Now();
  std::vector<Child> clients;
  for (int i = 0; i < kClients; ++i) {
    auto c = Child::Spawn(
        {kLoadClient, daemon.socket(), "load", absl::StrCat(seconds),
         absl::StrCat(i + 1), absl::StrCat(kPrefixes),
         absl::StrCat(kPagesPerPrefix), absl::StrCat(kBankRows)});
    ASSERT_TRUE(c.ok()) << c.status();
    clients.push_back(*std::move(c));
  }
  // Warm-up: the bank fills, every client has connected and churned.
  const absl::Duration warm_up = absl::Seconds(std::max(2.0, seconds / 4));
  absl::SleepFor(warm_up - (absl::Now() - start));
  const int64_t warm_rss = StatusKib(pid, "VmRSS");
  const int64_t warm_anon = StatusKib(pid, "RssAnon");
  ASSERT_GT(warm_rss, 0) << "daemon died during warm-up";
  int64_t peak_rss = warm_rss;
  while (absl::Now() - start < absl::Seconds(seconds)) {
    absl::SleepFor(absl::Milliseconds(500));
    peak_rss = std::max(peak_rss, StatusKib(pid, "VmRSS"));
  }

  std::map<std::string, uint64_t> sum;
  for (auto& c : clients) {
    auto rc = c.Wait(absl::Seconds(120));
    ASSERT_TRUE(rc.ok()) << rc.status();
    EXPECT_EQ(*rc, 0) << "load client failed: " << c.output();
    EXPECT_TRUE(AddCounters(c.output(), &sum)) << c.output();
  }
  const int64_t end_rss = StatusKib(pid, "VmRSS");
  const int64_t end_anon = StatusKib(pid, "RssAnon");
  ASSERT_GT(end_rss, 0) << "daemon died under load";
  peak_rss = std::max(peak_rss, end_rss);

  // Nothing left behind.
  // An operator's checks: the operator socket (Verify, every namespace).
  auto channel = grpc::CreateChannel("unix:" + daemon.admin_socket(),
                                     grpc::InsecureChannelCredentials());
  auto stub = v1::TierService::NewStub(channel);
  {
    grpc::ClientContext ctx;
    v1::VerifyResponse verify;
    ASSERT_TRUE(stub->Verify(&ctx, v1::VerifyRequest(), &verify).ok());
    EXPECT_TRUE(verify.ok()) << verify.violation();
  }
  v1::StatsResponse stats;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub->Stats(&ctx, v1::StatsRequest(), &stats).ok());
  }
  EXPECT_EQ(stats.sessions(), 0u);
  ASSERT_EQ(stats.namespaces_size(), 1);
  const v1::NamespaceInfo& ns = stats.namespaces(0);
  EXPECT_EQ(ns.leases(), 0u);
  EXPECT_EQ(ns.reservations(), 0u);
  EXPECT_EQ(ns.sessions(), 0u);
  for (const auto& bank : ns.banks()) {
    EXPECT_EQ(bank.rows(), kBankRows);
    EXPECT_EQ(bank.reserved_rows(), 0u) << bank.bank();
    EXPECT_EQ(bank.used_rows() + bank.free_rows(), bank.rows()) << bank.bank();
    EXPECT_EQ(bank.used_rows(), ns.pages()) << bank.bank();
  }
  EXPECT_GT(ns.evicted_pages(), 0u) << "the bank never filled up";

  std::printf(
      "LOAD clients=%d seconds=%.0f bank_rows=%llu working_set_pages=%u "
      "ops=%llu lookups=%llu pinned=%llu reserves=%llu commits=%llu "
      "committed_pages=%llu aborts=%llu releases=%llu exhausted=%llu "
      "reconnects=%llu checked_pages=%llu wrong_pages=%llu evicted_pages=%llu "
      "rss_warm_kib=%lld rss_end_kib=%lld rss_peak_kib=%lld "
      "anon_warm_kib=%lld anon_end_kib=%lld\n",
      kClients, seconds, static_cast<unsigned long long>(kBankRows),
      kPrefixes * kPagesPerPrefix, static_cast<unsigned long long>(sum["ops"]),
      static_cast<unsigned long long>(sum["lookups"]),
      static_cast<unsigned long long>(sum["pinned"]),
      static_cast<unsigned long long>(sum["reserves"]),
      static_cast<unsigned long long>(sum["commits"]),
      static_cast<unsigned long long>(sum["committed_pages"]),
      static_cast<unsigned long long>(sum["aborts"]),
      static_cast<unsigned long long>(sum["releases"]),
      static_cast<unsigned long long>(sum["exhausted"]),
      static_cast<unsigned long long>(sum["reconnects"]),
      static_cast<unsigned long long>(sum["checked_pages"]),
      static_cast<unsigned long long>(sum["wrong_pages"]),
      static_cast<unsigned long long>(ns.evicted_pages()),
      static_cast<long long>(warm_rss), static_cast<long long>(end_rss),
      static_cast<long long>(peak_rss), static_cast<long long>(warm_anon),
      static_cast<long long>(end_anon));
  EXPECT_EQ(sum["wrong_pages"], 0u);
  EXPECT_EQ(sum["unexpected"], 0u);
  EXPECT_GT(sum["commits"], 0u);
  EXPECT_GT(sum["checked_pages"], 0u);

#ifdef KVTIER_UNDER_ASAN
  // ASan's quarantine holds freed memory back, so RSS is no measure here;
  // LeakSanitizer at the daemon's exit (Stop below) is the leak check.
  std::printf("RSS check skipped under ASan; LeakSanitizer checks at exit\n");
#elif defined(KVTIER_UNDER_TSAN)
  // TSan's shadow memory and access history grow with every page the daemon
  // touches, so RSS is no measure here (the plain and ASan builds check it).
  std::printf("RSS check skipped under TSan\n");
#else
  // Flat: the index is bounded by the bank and sessions come and go, so
  // after the warm-up memory may only wobble (allocator caches, gRPC
  // buffers, thread stacks of reconnecting sessions): 8 MiB plus 10 %.
  const int64_t slack = 8 * 1024 + warm_rss / 10;
  EXPECT_LE(peak_rss, warm_rss + slack) << "daemon RSS grew from " << warm_rss
                                        << " KiB to " << peak_rss << " KiB";
  EXPECT_LE(end_rss, warm_rss + slack);
#endif
  EXPECT_TRUE(daemon.Stop().ok()) << "kvtierd did not stop cleanly";
}

}  // namespace
}  // namespace kvtier::testing
