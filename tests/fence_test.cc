// The fence (issue 13) with real processes, real signals and copies that
// are really queued: kvtier_fence_client moves pages with the reference
// backend on a held kvtier::client::ReferenceStream, so its writes into
// reserved rows (and its reads of leased rows) land when the test says — after
// kvtierd was SIGKILLed and restarted, after its session ended, after it
// aborted. Whatever happens, no other engine is handed those rows while the
// copies may still run, and what another engine commits reads back as it
// wrote it. Each scenario prints one "FENCE {json}" line with its figures:
// rows fenced, and how long after the holder confirmed (or died) they were
// free again. No test asserts a time. With real users (FenceUsersTest,
// root only): another user presenting the victim's instance id, by hand,
// neither frees the victim's rows nor gets them handed to anyone.
//
// Built twice: fence_test, whose engines queue on the reference backend
// (a ReferenceStream held by a spin), and, with CUDA, tests/gpu's
// fence_gpu_test (KVTIER_FENCE_CUDA), whose engines queue real CUDA copies
// behind a spin kernel that waits for the test; it skips without a GPU.
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/daemon_probe.h"
#include "tests/daemon_process.h"
#include "tests/test_pattern.h"
#include "tests/test_users.h"

#ifdef KVTIER_FENCE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace kvtier::testing {
namespace {

using client::Client;
using client::Namespace;
using client::Reservation;
using ::testing::HasSubstr;

const std::string kFenceClient =
    ResolveProgram(KVTIER_FENCE_CLIENT_PATH, "tests/kvtier_fence_client");
constexpr char kNs[] = "fence";
// Instance ids (hex) of engines A and H/R (one instance, two processes).
constexpr char kEngineA[] = "a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0";
constexpr char kEngineX[] = "5c5c5c5c5c5c5c5c5c5c5c5c5c5c5c5c";

// The rows of the last "<tag>r,r,..." line in `output`.
std::vector<uint32_t> RowsOf(const std::string& output, absl::string_view tag) {
  std::vector<uint32_t> rows;
  for (absl::string_view line : absl::StrSplit(output, '\n')) {
    if (!absl::ConsumePrefix(&line, tag)) continue;
    rows.clear();
    for (absl::string_view r : absl::StrSplit(line, ',')) {
      uint32_t row = 0;
      if (absl::SimpleAtoi(r, &row)) rows.push_back(row);
    }
  }
  return rows;
}

bool Disjoint(absl::Span<const uint32_t> a, absl::Span<const uint32_t> b) {
  std::set<uint32_t> s(a.begin(), a.end());
  for (uint32_t r : b) {
    if (s.contains(r)) return false;
  }
  return true;
}

class FenceTest : public ::testing::Test {
 protected:
  void SetUp() override {
#ifdef KVTIER_FENCE_CUDA
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
      GTEST_SKIP() << "no CUDA device";
    }
    setenv("KVTIER_FENCE_BACKEND", "cuda", 1);
#endif
    ASSERT_TRUE(daemon_.Start(flags_).ok());
    probe_ = std::make_unique<DaemonProbe>(daemon_.socket());
  }

  void Restart() {
    daemon_.Kill();
    ASSERT_TRUE(daemon_.Start(flags_).ok());
    probe_ = std::make_unique<DaemonProbe>(daemon_.socket());
  }

  Child Spawn(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {kFenceClient};
    argv.insert(argv.end(), args.begin(), args.end());
    auto child = Child::Spawn(argv);
    EXPECT_TRUE(child.ok()) << child.status();
    return *std::move(child);
  }
  // `mode` with the socket, namespace and sizes filled in.
  std::vector<std::string> Args(const std::string& mode, uint64_t capacity,
                                uint32_t pages, uint64_t seed) {
    return {mode,
            daemon_.socket(),
            kNs,
            absl::StrCat(capacity),
            absl::StrCat(pages),
            absl::StrCat(seed)};
  }

  // This process as engine B: a fresh instance.
  void ConnectB(uint64_t capacity) {
    auto c = Client::Connect({.socket = daemon_.socket(), .client_name = "B"});
    ASSERT_TRUE(c.ok()) << c.status();
    b_ = *std::move(c);
    auto o = TestAttachOptions(kNs);
    o.capacity.page_rows = capacity;
    auto ns = b_->Attach(o);
    ASSERT_TRUE(ns.ok()) << ns.status();
    ns_ = *std::move(ns);
  }
  std::string Hashes(uint64_t seed, uint32_t pages) {
    return ns_->hasher().HashChain(TestTokens(seed, pages * 16));
  }
  // B writes seed's pattern into `r` and commits it as seed's prefix.
  void WriteAndCommit(Reservation& r, uint64_t seed) {
    for (uint32_t i = 0; i < r.page_rows().size(); ++i) {
      for (size_t b = 0; b < ns_->page_banks().size(); ++b) {
        const auto& bank = ns_->page_banks()[b];
        FillPattern(bank.base + uint64_t{r.page_rows()[i]} * bank.row_stride,
                    bank.row_bytes, seed, i, b);
      }
    }
    auto c = r.Commit("", Hashes(seed, r.page_rows().size()));
    ASSERT_TRUE(c.ok()) << c.status();
  }
  // B's lookup of seed's prefix: its rows, and whether every byte is B's.
  std::vector<uint32_t> ReadBack(uint64_t seed, uint32_t pages, bool* intact) {
    auto lease = ns_->Lookup(Hashes(seed, pages), /*pin=*/true);
    EXPECT_TRUE(lease.ok()) << lease.status();
    *intact = lease.ok() && lease->matched_pages() == pages;
    if (!*intact) return {};
    for (uint32_t i = 0; i < pages; ++i) {
      for (size_t b = 0; b < ns_->page_banks().size(); ++b) {
        const auto& bank = ns_->page_banks()[b];
        *intact = *intact &&
                  CheckPattern(
                      bank.base + uint64_t{lease->rows()[i]} * bank.row_stride,
                      bank.row_bytes, seed, i, b);
      }
    }
    return {lease->rows().begin(), lease->rows().end()};
  }

  v1::NamespaceInfo Info() {
    auto stats = probe_->Stats();
    EXPECT_TRUE(stats.ok()) << stats.status();
    if (stats.ok()) {
      for (const auto& n : stats->namespaces()) {
        if (n.name() == kNs) return n;
      }
    }
    return {};
  }
  // Polls until `done(info)`; returns how long it took (or fails the test
  // after 30 s).
  template <typename F>
  absl::Duration WaitFor(const char* what, F done) {
    const absl::Time start = absl::Now();
    while (absl::Now() - start < absl::Seconds(30)) {
      if (done(Info())) return absl::Now() - start;
      absl::SleepFor(absl::Milliseconds(2));
    }
    ADD_FAILURE() << "timed out waiting for " << what << ": "
                  << Info().ShortDebugString();
    return absl::Seconds(30);
  }
  static uint64_t Fenced(const v1::NamespaceInfo& n) {
    uint64_t f = 0;
    for (const auto& b : n.banks()) {
      if (b.bank() == "kv") f += b.fenced_rows();
    }
    return f;
  }
  void ExpectVerified() {
    auto v = probe_->Verify();
    ASSERT_TRUE(v.ok()) << v.status();
    EXPECT_TRUE(v->ok()) << v->violation();
  }
  static void Report(const std::string& json) {
#ifdef KVTIER_FENCE_CUDA
    std::printf("FENCE cuda %s\n", json.c_str());
    std::fflush(stdout);
    return;
#endif
    std::printf("FENCE %s\n", json.c_str());
    std::fflush(stdout);
  }

  std::vector<std::string> flags_ = {"--fence_sweep_ms=10"};
  DaemonProcess daemon_;
  std::unique_ptr<DaemonProbe> probe_;
  std::unique_ptr<Client> b_;
  std::unique_ptr<Namespace> ns_;
};

// The issue's scenario: A reserves 64 rows, its copy into them still
// queued; kvtierd is SIGKILLed and restarted while A is stalled (SIGSTOP:
// it cannot even reconnect yet); B reserves and commits; A's queued writes
// land. B never gets A's rows, and its prefix reads back as B wrote it.
TEST_F(FenceTest, QueuedWritesAcrossARestartNeverReachAnotherEnginesRows) {
  constexpr uint64_t kCapacity = 96;
  std::vector<std::string> args = Args("write", kCapacity, 64, 1);
  args.push_back(kEngineA);
  args.push_back("commit");
  Child a = Spawn(args);
  ASSERT_TRUE(a.WaitForLine("QUEUED", absl::Seconds(30)).ok()) << a.output();
  const std::vector<uint32_t> rows_a = RowsOf(a.output(), "ROWS ");
  ASSERT_EQ(rows_a.size(), 64u);
  a.Signal(SIGSTOP);
  Restart();
  ConnectB(kCapacity);
  // The restart fence keeps A's 64 rows while A has not reported.
  v1::NamespaceInfo info = Info();
  EXPECT_EQ(Fenced(info), 64u);
  EXPECT_EQ(info.restart_fence_processes(), 1u);
  auto r = ns_->Reserve(8);
  ASSERT_TRUE(r.ok()) << r.status();
  const std::vector<uint32_t> rows_b(r->page_rows().begin(),
                                     r->page_rows().end());
  EXPECT_TRUE(Disjoint(rows_a, rows_b));
  WriteAndCommit(*r, 2);
  // More than what is free or evictable: refused at once, naming the fence,
  // and nothing is evicted.
  auto too_many = ns_->Reserve(kCapacity - 64 + 1);
  ASSERT_EQ(too_many.status().code(), absl::StatusCode::kResourceExhausted)
      << too_many.status();
  EXPECT_THAT(too_many.status().message(), HasSubstr("restart fence"));
  // A wakes, reconnects and reports its reservation: a hold keeps the rows.
  a.Signal(SIGCONT);
  WaitFor("A's report", [](const v1::NamespaceInfo& n) {
    return n.restart_fence_processes() == 0 && n.fence_holds() == 1;
  });
  EXPECT_EQ(Fenced(Info()), 64u);
  // A's queued copy lands (into A's rows), its CommitAfter finds the
  // reservation void, and its hold is released.
  a.Signal(SIGUSR1);
  ASSERT_TRUE(a.WaitForLine(
                   absl::StrCat("LANDED ", static_cast<int>(
                                               absl::StatusCode::kUnavailable)),
                   absl::Seconds(30))
                  .ok())
      << a.output();
  const absl::Duration freed =
      WaitFor("A's rows", [](const v1::NamespaceInfo& n) {
        return Fenced(n) == 0 && n.fence_holds() == 0;
      });
  bool intact = false;
  EXPECT_EQ(ReadBack(2, 8, &intact), rows_b);
  EXPECT_TRUE(intact) << "B's prefix was overwritten";
  ExpectVerified();
  Report(absl::StrCat(R"({"scenario": "reserve-restart", "fenced_rows": 64, )",
                      R"("freed_after_confirm_ms": )",
                      absl::ToDoubleMilliseconds(freed),
                      R"(, "served_wrong_pages": )", intact ? 0 : 8, "}"));
}

// With no row free, B's reserve fails at once with a status naming the
// fence (never blocks); the rows come back when the stalled holder dies.
TEST_F(FenceTest, FullBankFailsAtOnceAndTheHoldersDeathFreesIt) {
  constexpr uint64_t kCapacity = 64;
  std::vector<std::string> args = Args("write", kCapacity, 64, 3);
  args.push_back(kEngineA);
  args.push_back("commit");
  Child a = Spawn(args);
  ASSERT_TRUE(a.WaitForLine("QUEUED", absl::Seconds(30)).ok()) << a.output();
  a.Signal(SIGSTOP);
  Restart();
  ConnectB(kCapacity);
  auto r = ns_->Reserve(8);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted)
      << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("fence"));
  EXPECT_THAT(r.status().message(), HasSubstr(absl::StrCat("pid ", a.pid())));
  const absl::Time killed = absl::Now();
  a.Signal(SIGKILL);
  WaitFor("the dead holder's rows",
          [](const v1::NamespaceInfo& n) { return Fenced(n) == 0; });
  const absl::Duration freed = absl::Now() - killed;
  auto again = ns_->Reserve(64);
  ASSERT_TRUE(again.ok()) << again.status();
  ExpectVerified();
  Report(absl::StrCat(R"({"scenario": "reserve-restart-holder-dies", )",
                      R"("fenced_rows": 64, "freed_after_death_ms": )",
                      absl::ToDoubleMilliseconds(freed), "}"));
}

// A lease across a restart, holder and reader in different processes of
// one instance (vLLM's scheduler and worker): the worker's queued read of
// the leased rows lands after the restart and still reads the prefix's
// bytes, because nobody was handed those rows in between.
TEST_F(FenceTest, ALeaseReadAcrossARestartReadsThePrefix) {
  constexpr uint64_t kCapacity = 24;
  constexpr uint32_t kPages = 16;
  Child put = Spawn(Args("put", kCapacity, kPages, 5));
  ASSERT_TRUE(put.Wait(absl::Seconds(30)).ok());
  ASSERT_THAT(put.output(), HasSubstr("COMMITTED")) << put.output();
  const std::vector<uint32_t> rows_p = RowsOf(put.output(), "COMMITTED ROWS ");
  ASSERT_EQ(rows_p.size(), kPages);
  std::vector<std::string> hold = Args("hold", kCapacity, kPages, 5);
  hold.push_back(kEngineX);
  Child h = Spawn(hold);
  ASSERT_TRUE(
      h.WaitForLine(absl::StrCat("PINNED ", kPages), absl::Seconds(30)).ok())
      << h.output();
  EXPECT_EQ(RowsOf(h.output(), "ROWS "), rows_p);
  std::vector<std::string> read = Args("read", kCapacity, kPages, 5);
  read.push_back(kEngineX);
  read.push_back(absl::StrJoin(rows_p, ","));
  Child w = Spawn(read);
  ASSERT_TRUE(w.WaitForLine("QUEUED", absl::Seconds(30)).ok()) << w.output();
  Restart();
  // Both processes reconnect and report; the lease is a hold now.
  WaitFor("H and W's reports", [](const v1::NamespaceInfo& n) {
    return n.restart_fence_processes() == 0 && n.fence_holds() == 1;
  });
  ConnectB(kCapacity);
  // The prefix cannot be evicted for B: only the free rows are B's.
  auto all = ns_->Reserve(kPages);
  ASSERT_EQ(all.status().code(), absl::StatusCode::kResourceExhausted)
      << all.status();
  EXPECT_THAT(all.status().message(), HasSubstr("fence"));
  auto r = ns_->Reserve(kCapacity - kPages);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(Disjoint(rows_p, r->page_rows()));
  WriteAndCommit(*r, 6);
  w.Signal(SIGUSR1);
  ASSERT_TRUE(w.WaitForLine("READ intact=1", absl::Seconds(30)).ok())
      << w.output();
  // The scheduler releases the lease once the worker's copy is done.
  h.Signal(SIGUSR1);
  ASSERT_TRUE(h.WaitForLine("RELEASED", absl::Seconds(30)).ok()) << h.output();
  const absl::Duration freed =
      WaitFor("the lease's hold",
              [](const v1::NamespaceInfo& n) { return n.fence_holds() == 0; });
  bool intact = false;
  (void)ReadBack(6, kCapacity - kPages, &intact);
  EXPECT_TRUE(intact);
  ExpectVerified();
  Report(absl::StrCat(R"({"scenario": "lease-restart", "fenced_pages": )",
                      kPages, R"(, "freed_after_confirm_ms": )",
                      absl::ToDoubleMilliseconds(freed),
                      R"(, "served_wrong_pages": 0})"));
}

// AbortAfter with queued work: the rows stay reserved until the copy
// lands, then come back.
TEST_F(FenceTest, AbortAfterReturnsTheRowsOnlyOnceTheCopiesLanded) {
  constexpr uint64_t kCapacity = 72;
  std::vector<std::string> args = Args("write", kCapacity, 64, 7);
  args.push_back(kEngineA);
  args.push_back("abort");
  Child a = Spawn(args);
  ASSERT_TRUE(a.WaitForLine("QUEUED", absl::Seconds(30)).ok()) << a.output();
  const std::vector<uint32_t> rows_a = RowsOf(a.output(), "ROWS ");
  ConnectB(kCapacity);
  auto r = ns_->Reserve(8);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(Disjoint(rows_a, r->page_rows()));
  EXPECT_EQ(ns_->Reserve(1).status().code(),
            absl::StatusCode::kResourceExhausted);
  a.Signal(SIGUSR1);
  ASSERT_TRUE(a.WaitForLine("LANDED -1", absl::Seconds(30)).ok()) << a.output();
  const absl::Duration freed =
      WaitFor("A's rows", [](const v1::NamespaceInfo& n) {
        return n.reservations() == 1;  // B's only.
      });
  auto rest = ns_->Reserve(64);
  ASSERT_TRUE(rest.ok()) << rest.status();
  ExpectVerified();
  Report(absl::StrCat(R"({"scenario": "abort-after", "fenced_rows": 64, )",
                      R"("freed_after_confirm_ms": )",
                      absl::ToDoubleMilliseconds(freed), "}"));
}

// A reservation destroyed while its copy is queued: its rows stay fenced,
// even after the copy landed (the library cannot know), until the process
// exits.
TEST_F(FenceTest, ADroppedReservationStaysFencedUntilItsProcessExits) {
  constexpr uint64_t kCapacity = 72;
  std::vector<std::string> args = Args("write", kCapacity, 64, 9);
  args.push_back(kEngineA);
  args.push_back("drop");
  Child a = Spawn(args);
  ASSERT_TRUE(a.WaitForLine("QUEUED", absl::Seconds(30)).ok()) << a.output();
  WaitFor("the abandoned reservation's hold", [](const v1::NamespaceInfo& n) {
    return n.fence_holds() == 1 && Fenced(n) == 64;
  });
  ConnectB(kCapacity);
  EXPECT_EQ(ns_->Reserve(9).status().code(),
            absl::StatusCode::kResourceExhausted);
  a.Signal(SIGUSR1);
  ASSERT_TRUE(a.WaitForLine("LANDED -1", absl::Seconds(30)).ok()) << a.output();
  EXPECT_EQ(Fenced(Info()), 64u);
  const absl::Time killed = absl::Now();
  a.Signal(SIGTERM);
  WaitFor("the exited process's rows",
          [](const v1::NamespaceInfo& n) { return Fenced(n) == 0; });
  const absl::Duration freed = absl::Now() - killed;
  auto all = ns_->Reserve(kCapacity);
  ASSERT_TRUE(all.ok()) << all.status();
  ExpectVerified();
  Report(absl::StrCat(R"({"scenario": "dropped-reservation", )",
                      R"("fenced_rows": 64, "freed_after_exit_ms": )",
                      absl::ToDoubleMilliseconds(freed), "}"));
}

#ifndef KVTIER_FENCE_CUDA  // With CUDA: tests/gpu/mirror_fence_gpu_test.
// A mirror whose session ended: its store, queued before kvtierd was
// SIGKILLed and restarted, runs after and writes nothing (the store reads
// the mirror's revocation flag), and the daemon keeps the mirror's rows
// fenced until the process exits. (On a GPU, with a captured graph:
// tests/gpu/mirror_fence_gpu_test.)
TEST_F(FenceTest, AMirrorWhoseSessionEndedStoresNothing) {
  constexpr uint64_t kCapacity = 24;
  constexpr uint32_t kPages = 8;
  std::vector<std::string> args = Args("mirror", kCapacity, kPages, 11);
  args.push_back(kEngineA);
  Child m = Spawn(args);
  ASSERT_TRUE(m.WaitForLine("QUEUED", absl::Seconds(30)).ok()) << m.output();
  const std::vector<uint32_t> rows_m = RowsOf(m.output(), "ROWS ");
  ASSERT_EQ(rows_m.size(), kPages);
  Restart();
  WaitFor("the mirror's report", [](const v1::NamespaceInfo& n) {
    return n.restart_fence_processes() == 0 && n.fence_holds() == 1;
  });
  EXPECT_EQ(Fenced(Info()), kPages);
  m.Signal(SIGUSR1);
  ASSERT_TRUE(
      m.WaitForLine("STORED revoked=1 unchanged=1", absl::Seconds(30)).ok())
      << m.output();
  ConnectB(kCapacity);
  auto r = ns_->Reserve(kCapacity - kPages);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(Disjoint(rows_m, r->page_rows()));
  ASSERT_TRUE(r->Abort().ok());
  const absl::Time killed = absl::Now();
  m.Signal(SIGKILL);
  WaitFor("the mirror's rows",
          [](const v1::NamespaceInfo& n) { return Fenced(n) == 0; });
  const absl::Duration freed = absl::Now() - killed;
  ExpectVerified();
  Report(absl::StrCat(
      R"({"scenario": "mirror-session-ended", )", R"("fenced_rows": )", kPages,
      R"(, "freed_after_death_ms": )", absl::ToDoubleMilliseconds(freed),
      R"(, "rows_changed_by_the_late_store": 0})"));
}

// The control: the same queued store while its session lives writes.
TEST_F(FenceTest, AMirrorWhoseSessionLivesStores) {
  std::vector<std::string> args = Args("mirror", 24, 8, 11);
  args.push_back(kEngineA);
  Child m = Spawn(args);
  ASSERT_TRUE(m.WaitForLine("QUEUED", absl::Seconds(30)).ok()) << m.output();
  m.Signal(SIGUSR1);
  ASSERT_TRUE(
      m.WaitForLine("STORED revoked=0 unchanged=0", absl::Seconds(30)).ok())
      << m.output();
}
#endif  // KVTIER_FENCE_CUDA

#ifndef KVTIER_FENCE_CUDA  // Who may fence does not depend on the backend.
// Two users of the daemon's group: the victim V and another, T. kvtierd
// runs with --group; the clients become their user (--as).
class FenceUsersTest : public FenceTest {
 protected:
  void SetUp() override {
    if (const std::string why = CannotCreateUsers(); !why.empty()) {
      if (UsersRequired()) FAIL() << why << " (KVTIER_REQUIRE_USERS=1)";
      GTEST_SKIP() << why;
    }
    ASSERT_TRUE(EnsureGroup(kGroup).ok());
    auto v = EnsureUser("kvtier-fence-v", kGroup);
    auto t = EnsureUser("kvtier-fence-t", kGroup);
    ASSERT_TRUE(v.ok() && t.ok()) << v.status() << t.status();
    flags_.push_back(absl::StrCat("--group=", kGroup));
    FenceTest::SetUp();
    // Only the files' own modes guard them: the folders are open to all.
    ASSERT_EQ(chmod(daemon_.dir().c_str(), 0755), 0);
    ASSERT_EQ(chmod(daemon_.shm_dir().c_str(), 0755), 0);
  }
  // `args` run as user `name`.
  static std::vector<std::string> As(const std::string& name,
                                     std::vector<std::string> args) {
    args.insert(args.begin(), "--as=" + name);
    return args;
  }
  // B takes every free row and commits seed's pattern into them.
  std::vector<uint32_t> TakeTheRest(uint64_t seed) {
    const uint64_t free = Info().banks(0).free_rows();
    auto r = ns_->Reserve(free);
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return {};
    WriteAndCommit(*r, seed);
    return {r->page_rows().begin(), r->page_rows().end()};
  }
  static constexpr char kGroup[] = "kvtier-fence";
};

// V's copy into its 64 rows is queued when kvtierd restarts; T, which
// attached before the restart too, reconnects presenting V's instance id,
// reports V's rows and releases what it was answered and every small hold
// id. V's rows stay fenced, B is handed none of them, and V's late writes
// leave B's prefix as B wrote it.
TEST_F(FenceUsersTest, AnotherUsersFenceAcrossARestartFreesNoneOfTheRows) {
  constexpr uint64_t kCapacity = 96;
  std::vector<std::string> write = Args("write", kCapacity, 64, 1);
  write.push_back(kEngineA);
  write.push_back("commit");
  Child a = Spawn(As("kvtier-fence-v", write));
  ASSERT_TRUE(a.WaitForLine("QUEUED", absl::Seconds(30)).ok()) << a.output();
  const std::vector<uint32_t> rows_a = RowsOf(a.output(), "ROWS ");
  ASSERT_EQ(rows_a.size(), 64u);
  std::vector<std::string> steal = Args("fence", kCapacity, 64, 1);
  steal.push_back(kEngineA);
  steal.push_back(absl::StrJoin(rows_a, ","));
  Child t = Spawn(As("kvtier-fence-t", steal));
  ASSERT_TRUE(t.WaitForLine("ATTACHED", absl::Seconds(30)).ok()) << t.output();
  a.Signal(SIGSTOP);
  Restart();
  t.Signal(SIGUSR1);
  ASSERT_TRUE(t.WaitForLine("DONE", absl::Seconds(30)).ok()) << t.output();
  EXPECT_EQ(Fenced(Info()), 64u) << t.output();
  ConnectB(kCapacity);
  const std::vector<uint32_t> rows_b = TakeTheRest(2);
  EXPECT_TRUE(Disjoint(rows_a, rows_b));
  a.Signal(SIGCONT);
  WaitFor("V's report", [](const v1::NamespaceInfo& n) {
    return n.restart_fence_processes() == 0 && n.fence_holds() == 1;
  });
  a.Signal(SIGUSR1);
  ASSERT_TRUE(a.WaitForLine(
                   absl::StrCat("LANDED ", static_cast<int>(
                                               absl::StatusCode::kUnavailable)),
                   absl::Seconds(30))
                  .ok())
      << a.output();
  WaitFor("V's rows", [](const v1::NamespaceInfo& n) {
    return Fenced(n) == 0 && n.fence_holds() == 0;
  });
  bool intact = false;
  EXPECT_EQ(ReadBack(2, rows_b.size(), &intact), rows_b);
  EXPECT_TRUE(intact) << "V's late writes reached B's rows";
  ExpectVerified();
}

// Without a restart: V dropped a reservation with its copy queued (a hold
// until V exits). T, presenting V's instance id, releases every small hold
// id: V's hold stays, and B is handed none of V's rows.
TEST_F(FenceUsersTest, AnotherUsersReleaseFreesNoHoldOfTheVictim) {
  constexpr uint64_t kCapacity = 72;
  std::vector<std::string> write = Args("write", kCapacity, 64, 9);
  write.push_back(kEngineA);
  write.push_back("drop");
  Child a = Spawn(As("kvtier-fence-v", write));
  ASSERT_TRUE(a.WaitForLine("QUEUED", absl::Seconds(30)).ok()) << a.output();
  const std::vector<uint32_t> rows_a = RowsOf(a.output(), "ROWS ");
  WaitFor("the abandoned reservation's hold", [](const v1::NamespaceInfo& n) {
    return n.fence_holds() == 1 && Fenced(n) == 64;
  });
  std::vector<std::string> steal = Args("fence", kCapacity, 64, 9);
  steal.push_back(kEngineA);
  steal.push_back(absl::StrJoin(rows_a, ","));
  Child t = Spawn(As("kvtier-fence-t", steal));
  ASSERT_TRUE(t.WaitForLine("ATTACHED", absl::Seconds(30)).ok()) << t.output();
  t.Signal(SIGUSR1);
  ASSERT_TRUE(t.WaitForLine("DONE", absl::Seconds(30)).ok()) << t.output();
  EXPECT_THAT(t.output(), HasSubstr("released=0"));
  EXPECT_EQ(Info().fence_holds(), 1u);
  EXPECT_EQ(Fenced(Info()), 64u);
  ConnectB(kCapacity);
  const std::vector<uint32_t> rows_b = TakeTheRest(10);
  EXPECT_TRUE(Disjoint(rows_a, rows_b));
  a.Signal(SIGUSR1);
  ASSERT_TRUE(a.WaitForLine("LANDED -1", absl::Seconds(30)).ok()) << a.output();
  bool intact = false;
  EXPECT_EQ(ReadBack(10, rows_b.size(), &intact), rows_b);
  EXPECT_TRUE(intact) << "V's late writes reached B's rows";
  a.Signal(SIGKILL);
  WaitFor("the exited process's rows",
          [](const v1::NamespaceInfo& n) { return Fenced(n) == 0; });
  ExpectVerified();
}
#endif  // KVTIER_FENCE_CUDA

}  // namespace
}  // namespace kvtier::testing
