// Daemon restart (issue 5, item 1) with real processes and real signals:
// kvtierd is SIGKILLed while engine processes commit and look up, and
// restarted. Every prefix whose commit was acknowledged is found again with
// identical bytes from a new process; rows reserved but not committed are
// free again; the engines, never restarted, reconnect by themselves (their
// lookups during the outage are misses, not errors) and go on committing; a
// namespace whose bank was deleted while the daemon was down serves none of
// its old prefixes, and an engine that lived through it has that bank
// remapped in place.
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/daemon_probe.h"
#include "tests/daemon_process.h"
#include "tests/test_pattern.h"

namespace kvtier::testing {
namespace {

using client::AttachOptions;
using client::Client;
using ::testing::HasSubstr;

const std::string kCrashClient =
    ResolveProgram(KVTIER_CRASH_CLIENT_PATH, "tests/kvtier_crash_client");
constexpr uint64_t kCapacity =
    16384;  // Rows: no acknowledged prefix is evicted.
constexpr uint32_t kPages = 8;

// The seeds of the "ACK <seed>" lines in a writer's output.
std::vector<uint64_t> Acked(const std::string& output) {
  std::vector<uint64_t> seeds;
  for (absl::string_view line : absl::StrSplit(output, '\n')) {
    uint64_t seed = 0;
    if (absl::ConsumePrefix(&line, "ACK ") && absl::SimpleAtoi(line, &seed)) {
      seeds.push_back(seed);
    }
  }
  return seeds;
}

// Reads the children's output for `d`, so that their pipes never fill.
void Pump(const std::vector<Child*>& children, absl::Duration d) {
  const absl::Time end = absl::Now() + d;
  do {
    for (Child* c : children)
      (void)c->WaitForLine("\x01", absl::Milliseconds(2));
  } while (absl::Now() < end);
}

// Pumps until `writer` acknowledged at least `n` commits in all.
absl::Status WaitForAcks(Child& writer, const std::vector<Child*>& all,
                         size_t n, absl::Duration limit) {
  const absl::Time end = absl::Now() + limit;
  while (Acked(writer.output()).size() < n) {
    if (absl::Now() > end) {
      return absl::DeadlineExceededError(absl::StrCat(
          "writer acknowledged ", Acked(writer.output()).size(),
          " commits, waited for ", n, "; output tail: ",
          writer.output().substr(writer.output().size() > 2000
                                     ? writer.output().size() - 2000
                                     : 0)));
    }
    Pump(all, absl::Milliseconds(20));
  }
  return absl::OkStatus();
}

absl::StatusOr<Child> SpawnWriter(const DaemonProcess& d, const std::string& ns,
                                  uint64_t first, const std::string& stop) {
  return Child::Spawn({kCrashClient, "write", d.socket(), ns,
                       absl::StrCat(kCapacity), absl::StrCat(kPages),
                       absl::StrCat(first), stop, "3"});
}

// Checks every byte of every prefix from a new process; returns its exit
// code (0: all verified) and output.
int VerifyFromNewProcess(const DaemonProcess& d, const std::string& ns,
                         const std::vector<uint64_t>& seeds,
                         std::string* output) {
  output->clear();
  for (size_t i = 0; i < seeds.size(); i += 256) {
    const std::vector<uint64_t> chunk(
        seeds.begin() + i, seeds.begin() + std::min(seeds.size(), i + 256));
    auto child = Child::Spawn({kCrashClient, "verify", d.socket(), ns,
                               absl::StrCat(kCapacity), absl::StrCat(kPages),
                               absl::StrJoin(chunk, ",")});
    if (!child.ok()) {
      *output = child.status().ToString();
      return -1;
    }
    auto rc = child->Wait(absl::Seconds(60));
    output->append(child->output());
    if (!rc.ok()) return -1;
    if (*rc != 0) return *rc;
  }
  return 0;
}

// Writes `n` prefixes into `ns` from a writer process that then exits.
absl::StatusOr<std::vector<uint64_t>> WritePrefixes(const DaemonProcess& d,
                                                    const std::string& ns,
                                                    uint64_t first, size_t n) {
  const std::string stop = absl::StrCat(d.dir(), "/stop.", ns, ".", first);
  auto w = SpawnWriter(d, ns, first, stop);
  if (!w.ok()) return w.status();
  if (absl::Status s = WaitForAcks(*w, {&*w}, n, absl::Seconds(30)); !s.ok()) {
    return s;
  }
  std::ofstream(stop).put('\n');
  auto rc = w->Wait(absl::Seconds(30));
  if (!rc.ok()) return rc.status();
  if (*rc != 0) {
    return absl::InternalError(
        absl::StrCat("writer exited ", *rc, ": ", w->output()));
  }
  return Acked(w->output());
}

TEST(RestartTest, DaemonKilledUnderLoadLosesNoAcknowledgedCommit) {
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.Start().ok());
  DaemonProbe probe(daemon.socket());
  const std::string stop = daemon.dir() + "/stop";
  // Seeds stay distinct modulo 50,000: TestTokens repeats with that period.
  auto w0 = SpawnWriter(daemon, "load", 10000, stop);
  auto w1 = SpawnWriter(daemon, "load", 30000, stop);
  ASSERT_TRUE(w0.ok() && w1.ok());
  // An engine that reserved 32 rows, wrote them and never commits: its
  // reservation dies with the daemon, though the engine lives on.
  auto holder = Child::Spawn({kCrashClient, "hold", daemon.socket(), "load",
                              absl::StrCat(kCapacity), "32", "7"});
  ASSERT_TRUE(holder.ok());
  const std::vector<Child*> all = {&*w0, &*w1, &*holder};
  ASSERT_TRUE(holder->WaitForLine("RESERVED", absl::Seconds(30)).ok())
      << holder->output();
  ASSERT_TRUE(WaitForAcks(*w0, all, 20, absl::Seconds(30)).ok());
  ASSERT_TRUE(WaitForAcks(*w1, all, 20, absl::Seconds(30)).ok());
  auto before = probe.Totals("load");
  ASSERT_TRUE(before.ok()) << before.status();
  EXPECT_GE(before->reserved, 2u * 32);  // kv and scale rows of the holder.

  int daemon_kills = 0;
  std::vector<double> restart_ms;
  for (int round = 0; round < 3; ++round) {
    Pump(all, absl::Milliseconds(150));  // Under load...
    const size_t acked0 = Acked(w0->output()).size();
    const size_t acked1 = Acked(w1->output()).size();
    daemon.Kill();  // ... SIGKILL.
    ++daemon_kills;
    Pump(all, absl::Milliseconds(300));  // The outage.
    const absl::Time start = absl::Now();
    ASSERT_TRUE(daemon.Start().ok());
    restart_ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - start));
    if (round == 0) {
      // The holder lives on, but its reservation is void: at most the two
      // writers' in-flight reservations (kv and scale rows) are held.
      auto after = probe.Totals("load");
      ASSERT_TRUE(after.ok()) << after.status();
      EXPECT_LE(after->reserved, 2u * 2 * kPages);
      auto v = probe.Verify();
      ASSERT_TRUE(v.ok()) << v.status();
      EXPECT_TRUE(v->ok()) << v->violation();
    }
    // The engines were never restarted: they reconnect and go on.
    ASSERT_TRUE(WaitForAcks(*w0, all, acked0 + 10, absl::Seconds(30)).ok())
        << "round " << round;
    ASSERT_TRUE(WaitForAcks(*w1, all, acked1 + 10, absl::Seconds(30)).ok())
        << "round " << round;
  }

  std::ofstream(stop).put('\n');
  for (Child* w : {&*w0, &*w1}) {
    auto rc = w->Wait(absl::Seconds(30));
    ASSERT_TRUE(rc.ok());
    EXPECT_EQ(*rc, 0) << w->output();
    EXPECT_THAT(w->output(), HasSubstr(" errors=0 corrupt=0 "));
    EXPECT_THAT(w->output(), HasSubstr(" sessions=4"));  // 1 + 3 restarts.
    EXPECT_THAT(w->output(), ::testing::Not(HasSubstr("LOOKUP_ERROR")));
  }
  holder->Signal(SIGKILL);
  ASSERT_TRUE(holder->Wait(absl::Seconds(10)).ok());
  // How soon is not asserted: the limit only stops a hung daemon.
  auto reclaimed = probe.WaitUntilNothingHeld("load", absl::Seconds(60));
  EXPECT_TRUE(reclaimed.ok()) << reclaimed.status();

  std::vector<uint64_t> acked = Acked(w0->output());
  const std::vector<uint64_t> acked1 = Acked(w1->output());
  acked.insert(acked.end(), acked1.begin(), acked1.end());
  // One more SIGKILL with nothing in flight, then every acknowledged prefix
  // from a process that never saw the old daemon.
  daemon.Kill();
  ++daemon_kills;
  ASSERT_TRUE(daemon.Start().ok());
  std::string out;
  const int verified = VerifyFromNewProcess(daemon, "load", acked, &out);
  EXPECT_EQ(verified, 0) << out;
  auto totals = probe.Totals("load");
  ASSERT_TRUE(totals.ok()) << totals.status();
  // A commit journaled just before a kill may never have been acknowledged:
  // it is there (and harmless) all the same.
  EXPECT_GE(totals->used, acked.size() * kPages * 2);  // kv + scale banks.
  EXPECT_EQ(totals->reserved, 0u);
  EXPECT_EQ(totals->free + totals->reserved + totals->used + totals->fenced,
            totals->rows);
  auto v = probe.Verify();
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_TRUE(v->ok()) << v->violation();
  std::printf(
      "daemon SIGKILLs survived: %d; acknowledged commits: %zu (%zu pages), "
      "%s; restart to serving (ms): %s\n",
      daemon_kills, acked.size(), acked.size() * kPages,
      verified == 0 ? "all recovered byte-identical" : "NOT ALL RECOVERED",
      absl::StrJoin(restart_ms, ", ", [](std::string* o, double ms) {
        absl::StrAppend(o, absl::StrFormat("%.0f", ms));
      }).c_str());
}

TEST(RestartTest, BankDeletedWhileDownIsNotServed) {
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.Start().ok());
  auto kept = WritePrefixes(daemon, "kept", 1, 12);
  ASSERT_TRUE(kept.ok()) << kept.status();
  auto lost = WritePrefixes(daemon, "lost", 1, 12);
  ASSERT_TRUE(lost.ok()) << lost.status();
  // An engine (this process) attached to "lost" lives through it all.
  auto client = Client::Connect({.socket = daemon.socket()});
  ASSERT_TRUE(client.ok()) << client.status();
  AttachOptions options = TestAttachOptions("lost");
  options.capacity.page_rows = kCapacity;
  auto ns = (*client)->Attach(options);
  ASSERT_TRUE(ns.ok()) << ns.status();
  uint8_t* const kv_base = (*ns)->page_banks()[0].base;
  const uint64_t session = (*client)->session_id();
  auto hashes = [&](uint64_t seed) {
    return (*ns)->hasher().HashChain(TestTokens(seed, kPages * 16));
  };
  ASSERT_EQ((*ns)->Lookup(hashes(lost->front()))->matched_pages(), kPages);

  daemon.Kill();
  ASSERT_TRUE(std::filesystem::remove(daemon.shm_dir() + "/kvtier.lost.kv.r0"));
  ASSERT_TRUE(daemon.Start().ok());
  std::string out;
  EXPECT_EQ(VerifyFromNewProcess(daemon, "kept", *kept, &out), 0) << out;
  // Not one page of "lost" is served: its bytes cannot be vouched for.
  EXPECT_EQ(VerifyFromNewProcess(daemon, "lost", {lost->front()}, &out), 1);
  EXPECT_THAT(out, HasSubstr("MISSING"));
  EXPECT_THAT(out, ::testing::Not(HasSubstr("CORRUPT")));
  DaemonProbe probe(daemon.socket());
  auto totals = probe.Totals("lost");
  ASSERT_TRUE(totals.ok()) << totals.status();
  EXPECT_EQ(totals->used, 0u);

  // The surviving engine re-attached by itself, with its kv bank remapped
  // in place onto the recreated segment (same address): what it writes
  // there now, a new process reads.
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while ((*client)->session_id() == session || !(*client)->session_alive()) {
    ASSERT_LT(absl::Now(), deadline) << "the client did not reconnect";
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ((*ns)->page_banks()[0].base, kv_base);
  EXPECT_EQ((*ns)->Lookup(hashes(lost->front()))->matched_pages(), 0u);
  const uint64_t seed = 777;
  auto r = (*ns)->Reserve(kPages);
  ASSERT_TRUE(r.ok()) << r.status();
  for (uint32_t i = 0; i < kPages; ++i) {
    for (size_t b = 0; b < (*ns)->page_banks().size(); ++b) {
      const auto& bank = (*ns)->page_banks()[b];
      FillPattern(bank.base + uint64_t{r->page_rows()[i]} * bank.row_stride,
                  bank.row_bytes, seed, i, b);
    }
  }
  ASSERT_TRUE(r->Commit("", hashes(seed)).ok());
  EXPECT_EQ(VerifyFromNewProcess(daemon, "lost", {seed}, &out), 0) << out;

  // And the namespace keeps what it gets from now on.
  auto again = WritePrefixes(daemon, "lost", 500, 3);
  ASSERT_TRUE(again.ok()) << again.status();
  daemon.Kill();
  ASSERT_TRUE(daemon.Start().ok());
  again->push_back(seed);
  EXPECT_EQ(VerifyFromNewProcess(daemon, "lost", *again, &out), 0) << out;
}

TEST(RestartTest, CleanStopAndStartKeepsEverythingToo) {
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.Start().ok());
  auto seeds = WritePrefixes(daemon, "calm", 1, 10);
  ASSERT_TRUE(seeds.ok()) << seeds.status();
  ASSERT_TRUE(daemon.Stop().ok());
  ASSERT_TRUE(daemon.Start().ok());
  std::string out;
  EXPECT_EQ(VerifyFromNewProcess(daemon, "calm", *seeds, &out), 0) << out;
}

}  // namespace
}  // namespace kvtier::testing
