// kvtier_fence_client: an engine-like process for the fence test
// (tests/fence_test.cc) whose copies are really queued: it moves pages with
// the reference transfer backend on a kvtier::ReferenceStream that it holds
// until told to go on (SIGUSR1), so the copies land whenever the test says,
// across daemon restarts. Namespaces use tests/test_pattern.h's layout with
// CAPACITY page rows; a prefix of seed S is the hash chain of
// TestTokens(S, PAGES * 16), and page i of bank b holds FillPattern(.., S,
// i, b). INSTANCE is 32 hex digits: the client instance (fence protocol).
//
//   write  SOCKET NS CAPACITY PAGES SEED INSTANCE THEN
//       reserves PAGES rows, queues the copy of SEED's pages into them on
//       the held stream, then THEN: "commit" queues CommitAfter, "abort"
//       AbortAfter, "drop" destroys the reservation (queued copies: its rows
//       stay fenced until this process exits). Prints "ROWS r,r,..." and
//       "QUEUED"; on SIGUSR1 resumes the stream, waits for it and prints
//       "LANDED <commit status code or -1>"; then sleeps until killed.
//   hold   SOCKET NS CAPACITY PAGES SEED INSTANCE
//       pinned lookup of SEED's prefix: prints "ROWS ..." and "PINNED
//       <matched>"; on SIGUSR1 releases the lease and prints "RELEASED";
//       then sleeps until killed.
//   read   SOCKET NS CAPACITY PAGES SEED INSTANCE ROWS
//       queues the copy of rows ROWS (r,r,...) into its pool on the held
//       stream and prints "QUEUED"; on SIGUSR1 resumes, waits and prints
//       "READ intact=<0|1>" (whether the pages hold SEED's bytes); then
//       sleeps until killed.
//   put    SOCKET NS CAPACITY PAGES SEED
//       reserves, writes and commits SEED's prefix, prints "COMMITTED
//       ROWS r,r,...", and exits.
//
// Exit codes: 0 done, 1 a check failed, 2 usage, 3 could not connect/attach.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/transfer_engine.h"
#include "kvtier/client.h"
#include "kvtier/reference_stream.h"
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
  std::fprintf(stderr, "kvtier_fence_client: %s: %s\n", what.c_str(),
               s.ToString().c_str());
  return 3;
}

// SIGUSR1 is blocked in every thread (main blocks it before libkvtier
// starts any) and taken here.
void AwaitGo() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGUSR1);
  int sig = 0;
  while (sigwait(&set, &sig) != 0 || sig != SIGUSR1) {
  }
}

void SleepForever() {
  for (;;) pause();
}

// The engine's "GPU" pool in host memory: page p of bank b at
// pool[b] + p * stride, as the reference backend reads it.
struct Pool {
  std::vector<std::vector<uint8_t>> banks;
  std::vector<uint64_t> strides;
  kvtier::GpuPoolDescriptor descriptor;

  Pool(const kvtier::Namespace& ns, uint32_t pages) {
    descriptor.num_pages = pages;
    for (const auto& bank : ns.page_banks()) {
      const uint64_t stride = (bank.row_bytes + 15) & ~uint64_t{15};
      banks.emplace_back(stride * pages + 16);
      strides.push_back(stride);
      uint8_t* base = banks.back().data();
      base += (16 - reinterpret_cast<uintptr_t>(base) % 16) % 16;
      descriptor.banks.push_back(
          {bank.name,
           {{reinterpret_cast<uint64_t>(base), stride, bank.row_bytes}}});
    }
  }
  uint8_t* Page(size_t bank, uint32_t page) {
    return reinterpret_cast<uint8_t*>(descriptor.banks[bank].tensors[0].base) +
           uint64_t{page} * strides[bank];
  }
};

struct Engine {
  std::unique_ptr<kvtier::Client> client;
  std::unique_ptr<kvtier::Namespace> ns;
  uint32_t pages = 0;
  std::string Hashes(uint64_t seed) const {
    return ns->hasher().HashChain(TestTokens(seed, pages * 16));
  }
};

absl::Status Open(const std::string& socket, const std::string& ns,
                  uint64_t capacity, uint32_t pages,
                  const std::string& instance, Engine* e) {
  auto client = kvtier::Client::Connect({.socket = socket,
                                         .client_name = "fence-client",
                                         .timeout = absl::Seconds(10),
                                         .instance_id = instance});
  if (!client.ok()) return client.status();
  auto o = TestAttachOptions(ns);
  o.capacity.page_rows = capacity;
  auto attached = (*client)->Attach(o);
  if (!attached.ok()) return attached.status();
  e->client = *std::move(client);
  e->ns = *std::move(attached);
  e->pages = pages;
  return absl::OkStatus();
}

std::string Rows(absl::Span<const uint32_t> rows) {
  return absl::StrJoin(rows, ",");
}

}  // namespace

int main(int argc, char** argv) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  if (argc < 7) {
    std::fprintf(stderr,
                 "usage: kvtier_fence_client MODE SOCKET NS CAPACITY PAGES "
                 "SEED [INSTANCE ...]\n");
    return 2;
  }
  const std::string mode = argv[1];
  uint64_t capacity = 0, seed = 0;
  uint32_t pages = 0;
  if (!absl::SimpleAtoi(argv[4], &capacity) ||
      !absl::SimpleAtoi(argv[5], &pages) || !absl::SimpleAtoi(argv[6], &seed)) {
    std::fprintf(stderr, "kvtier_fence_client: bad number\n");
    return 2;
  }
  std::string instance;
  if (argc > 7 && std::strlen(argv[7]) == 32) {
    instance = absl::HexStringToBytes(argv[7]);
  }
  Engine e;
  if (absl::Status s = Open(argv[2], argv[3], capacity, pages, instance, &e);
      !s.ok()) {
    return Die("open", s);
  }
  Pool pool(*e.ns, pages);
  auto engine = e.ns->CreateTransferEngine(kvtier::client::Backend::kReference,
                                           pool.descriptor);
  if (!engine.ok()) return Die("transfer engine", engine.status());
  std::vector<uint32_t> gpu_pages(pages);
  for (uint32_t i = 0; i < pages; ++i) gpu_pages[i] = i;

  if (mode == "put") {
    auto r = e.ns->Reserve(pages);
    if (!r.ok()) return Die("reserve", r.status());
    for (uint32_t i = 0; i < pages; ++i) {
      for (size_t b = 0; b < pool.banks.size(); ++b) {
        FillPattern(pool.Page(b, i), e.ns->page_banks()[b].row_bytes, seed, i,
                    b);
      }
    }
    const std::vector<uint32_t> rows(r->page_rows().begin(),
                                     r->page_rows().end());
    if (absl::Status s = (*engine)->Evict(gpu_pages, rows, nullptr); !s.ok()) {
      return Die("evict", s);
    }
    auto c = r->Commit("", e.Hashes(seed));
    if (!c.ok()) return Die("commit", c.status());
    Say(absl::StrCat("COMMITTED ROWS ", Rows(rows)));
    return 0;
  }

  kvtier::ReferenceStream stream;
  stream.Hold();
  if (mode == "write" && argc == 9) {
    const std::string then = argv[8];
    auto r = e.ns->Reserve(pages);
    if (!r.ok()) return Die("reserve", r.status());
    for (uint32_t i = 0; i < pages; ++i) {
      for (size_t b = 0; b < pool.banks.size(); ++b) {
        FillPattern(pool.Page(b, i), e.ns->page_banks()[b].row_bytes, seed, i,
                    b);
      }
    }
    const std::vector<uint32_t> rows(r->page_rows().begin(),
                                     r->page_rows().end());
    if (absl::Status s = (*engine)->Evict(gpu_pages, rows, stream.handle());
        !s.ok()) {
      return Die("evict", s);
    }
    std::future<absl::StatusOr<kvtier::CommitResult>> committed;
    if (then == "commit") {
      committed = r->CommitAfter(stream.handle(), "", e.Hashes(seed));
    } else if (then == "abort") {
      r->AbortAfter(stream.handle());
    } else if (then == "drop") {
      *r = kvtier::Reservation();  // Destroyed with the copy queued.
    } else {
      std::fprintf(stderr, "kvtier_fence_client: THEN: %s\n", then.c_str());
      return 2;
    }
    Say(absl::StrCat("ROWS ", Rows(rows)));
    Say("QUEUED");
    AwaitGo();
    stream.Resume();
    stream.Synchronize();
    int code = -1;
    if (committed.valid()) {
      auto result = committed.get();
      code = static_cast<int>(result.status().code());
    }
    Say(absl::StrCat("LANDED ", code));
    SleepForever();
  }
  if (mode == "hold") {
    auto lease = e.ns->Lookup(e.Hashes(seed), /*pin=*/true);
    if (!lease.ok()) return Die("lookup", lease.status());
    Say(absl::StrCat("ROWS ", Rows(lease->rows())));
    Say(absl::StrCat("PINNED ", lease->matched_pages()));
    AwaitGo();
    (void)lease->Release();
    Say("RELEASED");
    SleepForever();
  }
  if (mode == "read" && argc == 9) {
    std::vector<uint32_t> rows;
    for (absl::string_view r : absl::StrSplit(argv[8], ',')) {
      uint32_t row = 0;
      if (!absl::SimpleAtoi(r, &row)) return 2;
      rows.push_back(row);
    }
    if (rows.size() != pages) return 2;
    if (absl::Status s = (*engine)->Rehydrate(gpu_pages, rows, stream.handle());
        !s.ok()) {
      return Die("rehydrate", s);
    }
    Say("QUEUED");
    AwaitGo();
    stream.Resume();
    stream.Synchronize();
    bool intact = true;
    for (uint32_t i = 0; i < pages; ++i) {
      for (size_t b = 0; b < pool.banks.size(); ++b) {
        intact =
            intact && CheckPattern(pool.Page(b, i),
                                   e.ns->page_banks()[b].row_bytes, seed, i, b);
      }
    }
    Say(absl::StrCat("READ intact=", intact ? 1 : 0));
    SleepForever();
  }
  std::fprintf(stderr, "kvtier_fence_client: unknown mode %s\n", mode.c_str());
  return 2;
}
