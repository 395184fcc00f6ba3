// index_bench: the daemon's index and API, in-process and over the socket.
//
// Measures, for a 24k-token prefix (1,536 hashes at 16 tokens per page):
// - in-process: TierCore::Lookup p50/p99 (validation, index, response
//   building; no transport), Reserve+Commit pages per second, and index
//   memory per page at 1M pages (PrefixIndex::MemoryBytes and the process's
//   RSS growth); the in-process commit runs without a journal;
// - over the engine socket (common/fast_lookup.h), against a real kvtierd it
//   starts, with 1 and 8 concurrent clients (each its own Client): the
//   headline, a pinned lookup and the Release of its lease (what an engine
//   does before it copies rows out; each part's figures too), and beside it
//   the unpinned lookup, each
//   as libkvtier's binary lookup frame and as a protobuf Lookup call; then
//   Reserve+Commit pages per second and latency, with the journal off, on
//   (fsync off) and on with fsync, the journal on a disk folder (/var/tmp)
//   whose filesystem the JSON names;
// - with --background (or --background_only): lookup latency while a
//   large namespace's journal is checkpointed and while its evictions
//   spill to a cluster tier (bench/index_bench_background.h).
// Prints one JSON object. Never asserts on time: it reports.
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "bench/index_bench_background.h"
#include "bench/index_bench_util.h"
#include "client/client.h"
#include "daemon/prefix_index.h"
#include "daemon/tier_core.h"
#include "spdlog/sinks/stdout_color_sinks.h"
#include "spdlog/spdlog.h"
#include "tests/daemon_process.h"

ABSL_FLAG(uint32_t, pages, 1536, "Hashes per lookup (24k tokens at 16/page)");
ABSL_FLAG(double, seconds, 3.0, "Measurement time per configuration");
ABSL_FLAG(std::string, clients, "1,8", "Concurrent socket clients to try");
ABSL_FLAG(uint64_t, memory_pages, 1000000, "Pages for the memory figure");
ABSL_FLAG(uint32_t, prefixes, 64, "Distinct cached prefixes looked up");
ABSL_FLAG(bool, socket, true, "Run the over-the-socket part");
ABSL_FLAG(uint32_t, journal_commits, 512,
          "Reserve+Commit calls per journal setting (none, on, fsync)");
ABSL_FLAG(bool, background, false,
          "Add the background part: lookups during checkpoints and spills");
ABSL_FLAG(bool, background_only, false,
          "Run the background part alone (the others print null)");
ABSL_FLAG(uint64_t, bg_pages, 393216,
          "Background: committed pages of the large namespace");
ABSL_FLAG(uint32_t, bg_lookup_threads, 2,
          "Background: lookup threads on the large namespace");
ABSL_FLAG(uint32_t, bg_other_threads, 1,
          "Background: lookup threads on the other namespace");
ABSL_FLAG(uint32_t, bg_writer_pages, 64,
          "Background: pages per Reserve+Commit of the writer thread");
ABSL_FLAG(double, bg_writer_per_s, 200,
          "Background: the writer's Reserve+Commits per second (0: no pause)");
ABSL_FLAG(uint64_t, bg_min_compact_bytes, 1,
          "Background: the checkpoint phase's compaction threshold");
ABSL_FLAG(std::string, bg_state_parent, "/var/tmp",
          "Background: the disk folder that holds the journal folders");
ABSL_FLAG(uint64_t, bg_spill_pages, 32768,
          "Background: page rows of the spill phase's large namespace");
ABSL_FLAG(uint32_t, bg_spill_row_bytes, 16384,
          "Background: bytes of a row of the spill phase's namespace");
ABSL_FLAG(int, bg_redis_masters, 3, "Background: Redis Cluster masters");
ABSL_FLAG(double, bg_stall_us, 1000,
          "Background: lookups slower than this are counted as stalls");
ABSL_FLAG(std::string, bg_note, "", "Background: free text for the JSON");

namespace kvtier::bench {
namespace {

using Clock = std::chrono::steady_clock;
using client::AttachOptions;
using client::Client;
using client::Namespace;

struct Percentiles {
  double p50_us = 0, p99_us = 0, mean_us = 0;
  size_t ops = 0;
};

Percentiles Summarize(std::vector<double> us) {
  Percentiles p;
  if (us.empty()) return p;
  std::sort(us.begin(), us.end());
  p.ops = us.size();
  p.p50_us = us[us.size() / 2];
  p.p99_us = us[std::min(us.size() - 1, us.size() * 99 / 100)];
  double sum = 0;
  for (double v : us) sum += v;
  p.mean_us = sum / us.size();
  return p;
}

std::string Json(const Percentiles& p) {
  return absl::StrFormat(
      R"({"p50_us": %.1f, "p99_us": %.1f, "mean_us": %.1f, "ops": %d})",
      p.p50_us, p.p99_us, p.mean_us, p.ops);
}

uint64_t RssBytes() {
  std::ifstream f("/proc/self/statm");
  uint64_t size = 0, rss = 0;
  f >> size >> rss;
  return rss * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
}

std::string Machine() {
  utsname u{};
  uname(&u);
  std::string model = "unknown";
  std::ifstream cpu("/proc/cpuinfo");
  for (std::string line; std::getline(cpu, line);) {
    if (line.rfind("model name", 0) == 0) {
      model = std::string(
          absl::StripAsciiWhitespace(line.substr(line.find(':') + 1)));
      break;
    }
  }
  return absl::StrFormat(R"({"host": "%s", "cpus": %d, "cpu": "%s"})",
                         u.nodename, std::thread::hardware_concurrency(),
                         model);
}

v1::Layout BenchLayout() {
  v1::Layout l;
  l.set_model("index-bench");
  l.set_tokens_per_page(16);
  l.set_num_layers(1);
  auto* b = l.add_page_banks();
  b->set_name("kv");
  b->set_row_bytes(16);  // The index is measured, not the banks.
  return l;
}

// Index memory per page at `pages` pages, in 1,536-page chains.
std::string MemoryFigure(uint64_t pages) {
  daemon::IndexConfig c;
  c.page_rows = pages;
  const uint64_t rss0 = RssBytes();
  auto index = daemon::PrefixIndex::Create(c);
  if (!index.ok()) return "null";
  const uint32_t chain = 1536;
  std::vector<daemon::HashKey> keys(chain);
  std::mt19937_64 rng(1);
  uint64_t done = 0;
  while (done < pages) {
    const uint32_t n =
        static_cast<uint32_t>(std::min<uint64_t>(chain, pages - done));
    keys.resize(n);
    for (auto& k : keys) {
      for (size_t i = 0; i < 32; i += 8) {
        const uint64_t v = rng();
        std::memcpy(&k.bytes[i], &v, 8);
      }
    }
    auto rows = (*index)->AllocatePageRows(0, n);
    if (!rows.ok()) return "null";
    auto r = (*index)->Commit(0, nullptr, keys, *rows, {});
    if (!r.ok()) return "null";
    done += n;
  }
  const uint64_t rss1 = RssBytes();
  return absl::StrFormat(
      R"({"pages": %d, "index_bytes_per_page": %.1f, "rss_bytes_per_page": %.1f})",
      pages, static_cast<double>((*index)->MemoryBytes()) / pages,
      static_cast<double>(rss1 - rss0) / pages);
}

std::string InProcess(uint32_t pages, double seconds, uint32_t prefixes) {
  char tmpl[] = "/dev/shm/kvtier-bench-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return "null";
  daemon::TierOptions o;
  o.segments.shm_dir = tmpl;
  o.segments.huge_pages = shm::HugePagePolicy::kOff;
  o.namespace_budget_bytes = 1ull << 34;
  daemon::TierCore core(o);
  v1::Hello hello;
  auto session = core.OpenSession(hello, {});
  v1::AttachRequest attach;
  attach.set_session_id(*session);
  attach.set_namespace_("bench");
  *attach.mutable_layout() = BenchLayout();
  const uint64_t rows = uint64_t{pages} * (prefixes + 700);
  attach.mutable_capacity()->set_page_rows(rows);
  v1::AttachResponse ar;
  if (!core.Attach(attach, &ar).ok()) return "null";

  // Commit throughput: fill with `prefixes` chains, then more until ~1M.
  std::vector<std::string> chains;
  const uint64_t target_pages = rows - pages;
  uint64_t committed = 0;
  const auto c0 = Clock::now();
  for (uint64_t i = 0; committed + pages <= target_pages; ++i) {
    v1::ReserveRequest rq;
    rq.set_session_id(*session);
    rq.set_namespace_id(ar.namespace_id());
    rq.set_pages(pages);
    v1::ReserveResponse rr;
    if (!core.Reserve(rq, &rr).ok()) break;
    v1::CommitRequest cq;
    cq.set_session_id(*session);
    cq.set_namespace_id(ar.namespace_id());
    cq.set_reservation_id(rr.reservation_id());
    std::string h = RandomHashes(pages, i + 1);
    cq.set_hashes(h);
    v1::CommitResponse cr;
    if (!core.Commit(cq, &cr).ok()) break;
    committed += cr.committed_pages();
    if (chains.size() < prefixes) chains.push_back(std::move(h));
  }
  const double commit_s =
      std::chrono::duration<double>(Clock::now() - c0).count();

  std::vector<double> lat;
  std::mt19937 rng(7);
  const auto end = Clock::now() + std::chrono::duration<double>(seconds);
  v1::LookupRequest lq;
  lq.set_session_id(*session);
  lq.set_namespace_id(ar.namespace_id());
  while (Clock::now() < end) {
    lq.set_hashes(chains[rng() % chains.size()]);
    v1::LookupResponse lr;
    const auto t0 = Clock::now();
    (void)core.Lookup(lq, &lr);
    lat.push_back(
        std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    if (lr.matched_pages() != pages) return "null";
  }
  std::filesystem::remove_all(tmpl);
  return absl::StrFormat(
      R"({"lookup": %s, "commit": {"pages": %d, "seconds": %.3f, "pages_per_s": %.0f, "batch_pages": %d}, "index_pages": %d})",
      Json(Summarize(lat)), committed, commit_s, committed / commit_s, pages,
      committed);
}

AttachOptions BenchAttach(uint32_t pages, uint32_t prefixes) {
  AttachOptions ao;
  ao.name = "bench";
  ao.layout.model = "index-bench";
  ao.layout.tokens_per_page = 16;
  ao.layout.num_layers = 1;
  ao.layout.page_banks = {{"kv", 16, ""}};
  ao.capacity.page_rows = uint64_t{pages} * (prefixes + 200);
  return ao;
}

// Reserve+Commit of `count` prefixes of `pages` pages through a Client:
// pages per second and each Reserve+Commit's latency. Fills *chains with
// the first `keep` prefixes' hashes.
std::string CommitRun(Namespace& ns, uint32_t pages, uint32_t count,
                      size_t keep, std::vector<std::string>* chains) {
  uint64_t committed = 0;
  std::vector<double> lat;
  const auto c0 = Clock::now();
  for (uint32_t i = 0; i < count; ++i) {
    std::string h = RandomHashes(pages, 1000 + i);
    const auto t0 = Clock::now();
    auto r = ns.Reserve(pages);
    if (!r.ok()) break;
    auto c = r->Commit("", h);
    if (!c.ok()) break;
    lat.push_back(
        std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    committed += c->committed_pages;
    if (chains != nullptr && chains->size() < keep) {
      chains->push_back(std::move(h));
    }
  }
  const double commit_s =
      std::chrono::duration<double>(Clock::now() - c0).count();
  return absl::StrFormat(
      R"({"pages": %d, "seconds": %.3f, "pages_per_s": %.0f, "batch_pages": %d, "reserve_commit": %s})",
      committed, commit_s, committed / commit_s, pages, Json(Summarize(lat)));
}

// Lookups of `chains` by `n` clients at once for `seconds`, as binary
// frames or as Lookup calls (`frames`), pinned with the lease released right
// after (what an engine does before it copies rows out: the headline) or
// unpinned.
std::string LookupRun(const std::string& socket, const AttachOptions& ao,
                      const std::vector<std::string>& chains, uint32_t pages,
                      double seconds, int n, bool frames, bool pinned) {
  std::vector<std::unique_ptr<Client>> clients;
  std::vector<std::unique_ptr<Namespace>> spaces;
  for (int i = 0; i < n; ++i) {
    auto c = Client::Connect({.socket = socket, .fast_lookup = frames});
    if (!c.ok() || (*c)->fast_lookup_active() != frames) return "null";
    auto s = (*c)->Attach(ao);
    if (!s.ok()) return "null";
    clients.push_back(*std::move(c));
    spaces.push_back(*std::move(s));
  }
  // Per client: the whole (lookup and, pinned, its release), and each part.
  std::vector<std::vector<double>> lat(n), look(n), rel(n);
  std::atomic<bool> measuring{false}, stop{false};
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      std::mt19937 rng(i);
      while (!stop.load()) {
        const auto t0 = Clock::now();
        auto l = spaces[i]->Lookup(chains[rng() % chains.size()], pinned);
        const auto t1 = Clock::now();
        if (!l.ok() || l->matched_pages() != pages) std::abort();
        if (pinned && (!l->pinned() || !l->Release().ok())) {
          std::abort();
        }
        const auto t2 = Clock::now();
        using Us = std::chrono::duration<double, std::micro>;
        if (measuring.load()) {
          lat[i].push_back(Us(t2 - t0).count());
          look[i].push_back(Us(t1 - t0).count());
          if (pinned) rel[i].push_back(Us(t2 - t1).count());
        }
      }
    });
  }
  absl::SleepFor(absl::Milliseconds(500));  // Warm-up.
  measuring = true;
  const auto m0 = Clock::now();
  absl::SleepFor(absl::Seconds(seconds));
  measuring = false;
  const double took = std::chrono::duration<double>(Clock::now() - m0).count();
  stop = true;
  for (auto& t : threads) t.join();
  auto merged = [](const std::vector<std::vector<double>>& per) {
    std::vector<double> all;
    for (auto& v : per) all.insert(all.end(), v.begin(), v.end());
    return Summarize(std::move(all));
  };
  const Percentiles p = merged(lat);
  std::string parts;
  if (pinned) {
    parts = absl::StrFormat(R"(, "lookup": %s, "release": %s)",
                            Json(merged(look)), Json(merged(rel)));
  }
  return absl::StrFormat(
      R"({"transport": "%s", "clients": %d, "p50_us": %.1f, "p99_us": %.1f, "mean_us": %.1f, "ops_per_s": %.0f%s})",
      frames ? "lookup_frame" : "lookup_call", n, p.p50_us, p.p99_us, p.mean_us,
      p.ops / took, parts);
}

// Commit through a daemon whose journal is `journal` ("none", "on" or
// "fsync", the last two under a disk folder when one exists).
std::string JournalCommit(const std::string& journal, uint32_t pages,
                          uint32_t count, uint32_t prefixes) {
  std::vector<std::string> flags = {"--namespace_budget_bytes=17179869184"};
  std::string dir;
  if (journal == "none") {
    flags.push_back("--state_dir=none");
  } else {
    char tmpl[] = "/var/tmp/kvtier-index-bench-XXXXXX";
    if (mkdtemp(tmpl) == nullptr) return "null";
    dir = tmpl;
    flags.push_back("--state_dir=" + dir);
    flags.push_back(journal == "fsync" ? "--journal_fsync=true"
                                       : "--journal_fsync=false");
  }
  std::string out = "null";
  {
    testing::DaemonProcess daemon;
    if (daemon.Start(flags).ok()) {
      auto c = Client::Connect({.socket = daemon.socket()});
      if (c.ok()) {
        auto ns = (*c)->Attach(BenchAttach(pages, prefixes));
        if (ns.ok()) {
          out = absl::StrFormat(
              R"({"journal": "%s", "medium": "%s", "commit": %s})", journal,
              dir.empty() ? "none" : FsType(dir),
              CommitRun(**ns, pages, count, 0, nullptr));
        }
      }
    }
  }
  if (!dir.empty()) std::filesystem::remove_all(dir);
  return out;
}

std::string OverSocket(uint32_t pages, double seconds, uint32_t prefixes,
                       const std::vector<int>& client_counts) {
  testing::DaemonProcess daemon;
  if (!daemon.Start({"--namespace_budget_bytes=17179869184"}).ok()) {
    return "null";
  }
  const AttachOptions ao = BenchAttach(pages, prefixes);
  auto writer = Client::Connect({.socket = daemon.socket()});
  if (!writer.ok()) return "null";
  auto ns = (*writer)->Attach(ao);
  if (!ns.ok()) return "null";
  std::vector<std::string> chains;
  const std::string commit =
      CommitRun(**ns, pages, prefixes + 100, prefixes, &chains);
  if (chains.empty()) return "null";

  std::vector<std::string> pinned, unpinned;
  for (bool frames : {true, false}) {
    for (int n : client_counts) {
      pinned.push_back(LookupRun(daemon.socket(), ao, chains, pages, seconds, n,
                                 frames, /*pinned=*/true));
      unpinned.push_back(LookupRun(daemon.socket(), ao, chains, pages, seconds,
                                   n, frames, /*pinned=*/false));
    }
  }
  std::vector<std::string> journals;
  for (const char* j : {"none", "on", "fsync"}) {
    journals.push_back(JournalCommit(
        j, pages, absl::GetFlag(FLAGS_journal_commits), prefixes));
  }
  return absl::StrFormat(
      R"({"pinned_lookup_release": [%s],
  "unpinned_lookup": [%s],
  "commit": %s,
  "commit_by_journal": [%s]})",
      absl::StrJoin(pinned, ", "), absl::StrJoin(unpinned, ", "), commit,
      absl::StrJoin(journals, ", "));
}

// The background part's options: the --bg_* flags, --prefixes, and the
// lookup's length and the time per phase given.
BackgroundOptions BackgroundFromFlags(uint32_t pages, double seconds) {
  BackgroundOptions b;
  b.lookup_pages = pages;
  b.prefixes = absl::GetFlag(FLAGS_prefixes);
  b.seconds = seconds;
  b.pages = absl::GetFlag(FLAGS_bg_pages);
  b.lookup_threads = absl::GetFlag(FLAGS_bg_lookup_threads);
  b.other_threads = absl::GetFlag(FLAGS_bg_other_threads);
  b.writer_pages = absl::GetFlag(FLAGS_bg_writer_pages);
  b.writer_per_s = absl::GetFlag(FLAGS_bg_writer_per_s);
  b.min_compact_bytes = absl::GetFlag(FLAGS_bg_min_compact_bytes);
  b.state_parent = absl::GetFlag(FLAGS_bg_state_parent);
  b.spill_pages = absl::GetFlag(FLAGS_bg_spill_pages);
  b.spill_row_bytes = absl::GetFlag(FLAGS_bg_spill_row_bytes);
  b.redis_masters = absl::GetFlag(FLAGS_bg_redis_masters);
  b.stall_us = absl::GetFlag(FLAGS_bg_stall_us);
  b.note = absl::GetFlag(FLAGS_bg_note);
  return b;
}

int Main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  // stdout carries the JSON alone; the in-process daemon core logs to stderr.
  spdlog::set_default_logger(spdlog::stderr_color_mt("index_bench"));
  spdlog::set_level(spdlog::level::warn);
  const uint32_t pages = absl::GetFlag(FLAGS_pages);
  const double seconds = absl::GetFlag(FLAGS_seconds);
  std::vector<int> counts;
  for (absl::string_view s :
       absl::StrSplit(absl::GetFlag(FLAGS_clients), ',', absl::SkipEmpty())) {
    int v = 0;
    if (absl::SimpleAtoi(s, &v) && v > 0) counts.push_back(v);
  }
  const bool only = absl::GetFlag(FLAGS_background_only);
  const std::string memory =
      only ? "null" : MemoryFigure(absl::GetFlag(FLAGS_memory_pages));
  const std::string in_process =
      only ? "null" : InProcess(pages, seconds, absl::GetFlag(FLAGS_prefixes));
  const std::string socket =
      absl::GetFlag(FLAGS_socket) && !only
          ? OverSocket(pages, seconds, absl::GetFlag(FLAGS_prefixes), counts)
          : "null";
  std::string background = "null";
  if (only || absl::GetFlag(FLAGS_background)) {
    background = RunBackground(BackgroundFromFlags(pages, seconds));
  }
  std::printf(
      "{\"benchmark\": \"index_bench\", \"date\": \"%s\", \"machine\": %s, "
      "\"lookup_pages\": %u,\n \"memory\": %s,\n \"in_process\": %s,\n "
      "\"socket\": %s,\n \"background\": %s}\n",
      absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::Now(), absl::UTCTimeZone())
          .c_str(),
      Machine().c_str(), pages, memory.c_str(), in_process.c_str(),
      socket.c_str(), background.c_str());
  return 0;
}

}  // namespace
}  // namespace kvtier::bench

int main(int argc, char** argv) { return kvtier::bench::Main(argc, argv); }
