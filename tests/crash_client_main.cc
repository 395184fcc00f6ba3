// kvtier_crash_client: an engine-like process for the restart and crash
// tests (tests/restart_test.cc, tests/crash_test.cc). Every namespace it
// attaches uses tests/test_pattern.h's layout with CAPACITY page rows; a
// prefix of seed S is the hash chain of TestTokens(S, PAGES * 16), and page
// i of bank b holds FillPattern(.., S, i, b).
//
//   write  SOCKET NS CAPACITY PAGES FIRST STOP_FILE [PAUSE_MS]
//       commits prefixes FIRST, FIRST+1, ... until STOP_FILE exists,
//       printing "ACK <seed>" once a commit is acknowledged. After each
//       commit it looks up a random acknowledged prefix (pinned) and checks
//       the bytes of what matched. While the daemon is down, reserve and
//       commit fail (retried after PAUSE_MS) and lookups must be misses.
//       Ends with "DONE acked=A lookups=L hits=H misses=M errors=E
//       corrupt=C sessions=N" (N: distinct session ids seen).
//   verify SOCKET NS CAPACITY PAGES SEED[,SEED...]
//       looks every prefix up (pinned) and checks every byte; prints
//       "VERIFIED <n>" and exits 0, or names the first missing or corrupt
//       prefix and exits 1.
//   hold   SOCKET NS CAPACITY PAGES SEED
//       reserves PAGES rows, writes the pattern into them and prints
//       "RESERVED", then sleeps (never commits) until killed.
//   crash  MODE SOCKET NS CAPACITY PAGES SEED
//       one engine step, then death by SIGKILL:
//         after-reserve  reserve, print "STEP", sleep until killed;
//         mid-write      reserve, write half the rows, print "STEP", keep
//                        writing until killed;
//         after-lookup   pinned lookup of SEED's prefix, print "STEP
//                        matched=<n>", sleep until killed;
//         during-commit  reserve, write, queue the commit on libkvtier's
//                        worker, then SIGKILL itself after a pseudo-random
//                        0-2 ms: before, during or after the daemon applies
//                        it;
//         random         reserve / write / commit / lookup of SEED, SEED+1,
//                        ... and SIGKILL itself at a pseudo-random point of
//                        a pseudo-random step ("ACK <seed>" when acknowledged).
//
// Exit codes: 0 done, 1 a check failed, 2 usage, 3 could not connect/attach.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "tests/test_pattern.h"

namespace {

using kvtier::testing::CheckPattern;
using kvtier::testing::FillPattern;
using kvtier::testing::TestAttachOptions;
using kvtier::testing::TestTokens;

void Say(const std::string& line) {
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

int Die(const std::string& what, const absl::Status& s) {
  std::fprintf(stderr, "kvtier_crash_client: %s: %s\n", what.c_str(),
               s.ToString().c_str());
  return 3;
}

void SleepForever() {
  for (;;) pause();
}

void KillSelf() {
  std::fflush(stdout);
  raise(SIGKILL);
}

struct Engine {
  std::unique_ptr<kvtier::client::Client> client;
  std::unique_ptr<kvtier::client::Namespace> ns;
  uint32_t pages = 0;

  std::string Hashes(uint64_t seed) const {
    return ns->hasher().HashChain(TestTokens(seed, pages * 16));
  }
  void Write(const kvtier::client::Reservation& r, uint64_t seed, uint32_t from,
             uint32_t to) const {
    for (uint32_t i = from; i < to; ++i) {
      for (size_t b = 0; b < ns->page_banks().size(); ++b) {
        const auto& bank = ns->page_banks()[b];
        FillPattern(bank.base + uint64_t{r.page_rows()[i]} * bank.row_stride,
                    bank.row_bytes, seed, i, b);
      }
    }
  }
  // Pages [0, n) of the lease hold seed's bytes.
  bool Check(const kvtier::client::Lease& lease, uint64_t seed, uint32_t n,
             std::string* where) const {
    for (uint32_t i = 0; i < n; ++i) {
      for (size_t b = 0; b < ns->page_banks().size(); ++b) {
        const auto& bank = ns->page_banks()[b];
        const uint8_t* row =
            bank.base + uint64_t{lease.rows()[i]} * bank.row_stride;
        if (!CheckPattern(row, bank.row_bytes, seed, i, b)) {
          *where =
              absl::StrCat("seed ", seed, " page ", i, " bank ", bank.name);
          return false;
        }
      }
    }
    return true;
  }
};

// Connects (retrying for a while: the daemon may be restarting) and
// attaches.
absl::Status Open(const std::string& socket, const std::string& ns,
                  uint64_t capacity, uint32_t pages, Engine* e) {
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  absl::Status last;
  while (absl::Now() < deadline) {
    auto client =
        kvtier::client::Client::Connect({.socket = socket,
                                         .client_name = "crash-client",
                                         .timeout = absl::Seconds(2)});
    if (!client.ok()) {
      last = client.status();
      absl::SleepFor(absl::Milliseconds(50));
      continue;
    }
    kvtier::client::AttachOptions o = TestAttachOptions(ns);
    o.capacity.page_rows = capacity;
    auto attached = (*client)->Attach(o);
    if (!attached.ok()) {
      last = attached.status();
      absl::SleepFor(absl::Milliseconds(50));
      continue;
    }
    e->client = *std::move(client);
    e->ns = *std::move(attached);
    e->pages = pages;
    return absl::OkStatus();
  }
  return last;
}

int Write(Engine& e, uint64_t first, const std::string& stop_file,
          int pause_ms) {
  std::mt19937_64 rng(first);
  std::vector<uint64_t> acked;
  std::set<uint64_t> sessions;
  uint64_t lookups = 0, hits = 0, misses = 0, errors = 0, corrupt = 0;
  uint64_t seed = first, failures = 0;
  // Failures are reported once per outage, not once per retry.
  auto failed = [&](const std::string& what, const absl::Status& s) {
    if (failures++ == 0) Say(absl::StrCat(what, " ", s.ToString()));
  };
  while (access(stop_file.c_str(), F_OK) != 0) {
    sessions.insert(e.client->session_id());
    const std::string hashes = e.Hashes(seed);
    auto r = e.ns->Reserve(e.pages);
    if (r.ok()) {
      e.Write(*r, seed, 0, e.pages);
      auto c = r->Commit("", hashes);
      if (c.ok()) {
        if (failures > 0) Say(absl::StrCat("RECOVERED after ", failures));
        failures = 0;
        Say(absl::StrCat("ACK ", seed));
        acked.push_back(seed);
        ++seed;
      } else {
        failed(absl::StrCat("COMMIT_FAIL ", seed), c.status());
      }
    } else {
      failed("RESERVE_FAIL", r.status());
    }
    if (!acked.empty()) {
      const uint64_t probe = acked[rng() % acked.size()];
      auto lease = e.ns->Lookup(e.Hashes(probe), /*pin=*/true);
      ++lookups;
      if (!lease.ok()) {
        ++errors;
        Say(absl::StrCat("LOOKUP_ERROR ", lease.status().ToString()));
      } else if (lease->matched_pages() == 0) {
        ++misses;
      } else {
        ++hits;
        std::string where;
        if (lease->matched_pages() != e.pages ||
            !e.Check(*lease, probe, lease->matched_pages(), &where)) {
          ++corrupt;
          Say(absl::StrCat("CORRUPT matched ", lease->matched_pages(), " ",
                           where));
        }
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(pause_ms));
  }
  Say(absl::StrCat("DONE acked=", acked.size(), " lookups=", lookups,
                   " hits=", hits, " misses=", misses, " errors=", errors,
                   " corrupt=", corrupt, " sessions=", sessions.size()));
  return errors == 0 && corrupt == 0 ? 0 : 1;
}

int Verify(Engine& e, const std::string& seeds) {
  uint64_t n = 0;
  for (absl::string_view part : absl::StrSplit(seeds, ',', absl::SkipEmpty())) {
    uint64_t seed = 0;
    if (!absl::SimpleAtoi(part, &seed)) {
      std::fprintf(stderr, "bad seed '%s'\n", std::string(part).c_str());
      return 2;
    }
    auto lease = e.ns->Lookup(e.Hashes(seed), /*pin=*/true);
    if (!lease.ok()) return Die("lookup", lease.status());
    if (lease->matched_pages() != e.pages) {
      Say(absl::StrCat("MISSING ", seed, " matched ", lease->matched_pages()));
      return 1;
    }
    std::string where;
    if (!e.Check(*lease, seed, e.pages, &where)) {
      Say(absl::StrCat("CORRUPT ", where));
      return 1;
    }
    ++n;
  }
  Say(absl::StrCat("VERIFIED ", n));
  return 0;
}

int Crash(Engine& e, const std::string& mode, uint64_t seed) {
  // Pseudo-random but reproducible per seed.
  std::mt19937_64 rng(seed * 2654435761u + 17);
  if (mode == "after-reserve") {
    auto r = e.ns->Reserve(e.pages);
    if (!r.ok()) return Die("reserve", r.status());
    Say("STEP");
    SleepForever();
  }
  if (mode == "mid-write") {
    auto r = e.ns->Reserve(e.pages);
    if (!r.ok()) return Die("reserve", r.status());
    e.Write(*r, seed, 0, e.pages / 2);
    Say("STEP");
    for (;;) e.Write(*r, seed, e.pages / 2, e.pages);
  }
  if (mode == "after-lookup") {
    auto lease = e.ns->Lookup(e.Hashes(seed), /*pin=*/true);
    if (!lease.ok()) return Die("lookup", lease.status());
    Say(absl::StrCat("STEP matched=", lease->matched_pages()));
    SleepForever();
  }
  if (mode == "during-commit") {
    auto r = e.ns->Reserve(e.pages);
    if (!r.ok()) return Die("reserve", r.status());
    e.Write(*r, seed, 0, e.pages);
    Say("STEP");
    auto done = r->CommitAfter(nullptr, "", e.Hashes(seed));
    const auto wait = std::chrono::microseconds(rng() % 2000);
    const auto until = std::chrono::steady_clock::now() + wait;
    while (std::chrono::steady_clock::now() < until) {
    }
    KillSelf();
  }
  if (mode == "random") {
    // Step k of the loop dies at phase p: 0 after reserve, 1 mid-write,
    // 2 after queuing the commit, 3 holding a pinned lookup.
    const uint64_t die_step = rng() % 4;
    const int die_phase = static_cast<int>(rng() % 4);
    for (uint64_t k = 0;; ++k) {
      const uint64_t s = seed + k;
      const bool die = k == die_step;
      auto r = e.ns->Reserve(e.pages);
      if (!r.ok()) return Die("reserve", r.status());
      if (die && die_phase == 0) KillSelf();
      e.Write(*r, s, 0, e.pages / 2);
      if (die && die_phase == 1) KillSelf();
      e.Write(*r, s, e.pages / 2, e.pages);
      if (die && die_phase == 2) {
        auto done = r->CommitAfter(nullptr, "", e.Hashes(s));
        std::this_thread::sleep_for(std::chrono::microseconds(rng() % 1500));
        KillSelf();
      }
      auto c = r->Commit("", e.Hashes(s));
      if (!c.ok()) return Die("commit", c.status());
      Say(absl::StrCat("ACK ", s));
      auto lease = e.ns->Lookup(e.Hashes(s), /*pin=*/true);
      if (!lease.ok()) return Die("lookup", lease.status());
      if (die) KillSelf();
    }
  }
  std::fprintf(stderr, "unknown crash mode %s\n", mode.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> a(argv + 1, argv + argc);
  auto usage = [&] {
    std::fprintf(stderr,
                 "usage: %s write SOCKET NS CAPACITY PAGES FIRST STOP_FILE "
                 "[PAUSE_MS]\n"
                 "       %s verify SOCKET NS CAPACITY PAGES SEED[,SEED...]\n"
                 "       %s hold SOCKET NS CAPACITY PAGES SEED\n"
                 "       %s crash MODE SOCKET NS CAPACITY PAGES SEED\n",
                 argv[0], argv[0], argv[0], argv[0]);
    return 2;
  };
  if (a.empty()) return usage();
  const std::string cmd = a[0];
  std::string mode;
  if (cmd == "crash") {
    if (a.size() != 7) return usage();
    mode = a[1];
    a.erase(a.begin() + 1);
  }
  if (a.size() < 6) return usage();
  uint64_t capacity = 0, pages = 0;
  if (!absl::SimpleAtoi(a[3], &capacity) || !absl::SimpleAtoi(a[4], &pages) ||
      pages == 0 || pages > capacity) {
    return usage();
  }
  Engine e;
  if (absl::Status s =
          Open(a[1], a[2], capacity, static_cast<uint32_t>(pages), &e);
      !s.ok()) {
    return Die("connect and attach", s);
  }
  if (cmd == "verify") return Verify(e, a[5]);
  uint64_t seed = 0;
  if (!absl::SimpleAtoi(a[5], &seed)) return usage();
  if (cmd == "write") {
    if (a.size() < 7) return usage();
    int pause_ms = 2;
    if (a.size() > 7 && !absl::SimpleAtoi(a[7], &pause_ms)) return usage();
    return Write(e, seed, a[6], pause_ms);
  }
  if (cmd == "hold") {
    auto r = e.ns->Reserve(e.pages);
    if (!r.ok()) return Die("reserve", r.status());
    e.Write(*r, seed, 0, e.pages);
    Say("RESERVED");
    SleepForever();
  }
  if (cmd == "crash") return Crash(e, mode, seed);
  return usage();
}
