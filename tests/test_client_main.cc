// kvtier_test_client: a real engine-like process for multi-process tests.
//
//   kvtier_test_client write  SOCKET NAMESPACE PAGES SEED
//       attach, hash SEED's tokens, reserve PAGES rows, write a known pattern
//       into every bank's rows, commit, exit 0 ("COMMITTED").
//   kvtier_test_client verify SOCKET NAMESPACE PAGES SEED
//       attach, look the same hashes up (pinned), check matched == PAGES and
//       that every byte equals the pattern, exit 0 ("VERIFIED") else 1.
//   kvtier_test_client hold   SOCKET NAMESPACE PAGES SEED
//       like write, then pin the prefix with a lookup and reserve every
//       remaining row, print "READY" and sleep until killed.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "client/client.h"
#include "tests/test_pattern.h"

namespace {

int Die(const std::string& what, const absl::Status& s) {
  std::fprintf(stderr, "kvtier_test_client: %s: %s\n", what.c_str(),
               s.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: %s write|verify|hold SOCKET NS PAGES SEED\n",
                 argv[0]);
    return 2;
  }
  const std::string mode = argv[1];
  const uint32_t pages =
      static_cast<uint32_t>(std::strtoul(argv[4], nullptr, 10));
  const uint64_t seed = std::strtoull(argv[5], nullptr, 10);
  auto client = kvtier::client::Client::Connect(
      {.socket = argv[2], .client_name = "test-client-" + mode});
  if (!client.ok()) return Die("connect", client.status());
  auto ns = (*client)->Attach(kvtier::testing::TestAttachOptions(argv[3]));
  if (!ns.ok()) return Die("attach", ns.status());
  const std::string hashes =
      (*ns)->hasher().HashChain(kvtier::testing::TestTokens(seed, pages * 16));
  if (hashes.size() != pages * (*ns)->hasher().hash_bytes()) {
    return Die("hash", absl::InternalError("wrong hash count"));
  }

  if (mode == "write" || mode == "hold") {
    auto res = (*ns)->Reserve(pages);
    if (!res.ok()) return Die("reserve", res.status());
    for (uint32_t i = 0; i < pages; ++i) {
      for (size_t b = 0; b < (*ns)->page_banks().size(); ++b) {
        const auto& bank = (*ns)->page_banks()[b];
        kvtier::testing::FillPattern(
            bank.base + uint64_t{res->page_rows()[i]} * bank.row_stride,
            bank.row_bytes, seed, i, b);
      }
    }
    auto committed = res->Commit("", hashes);
    if (!committed.ok()) return Die("commit", committed.status());
    std::printf("COMMITTED %u\n", committed->committed_pages);
    std::fflush(stdout);
    if (mode == "write") return 0;
    auto lease = (*ns)->Lookup(hashes, /*pin=*/true);
    if (!lease.ok()) return Die("lookup", lease.status());
    const uint64_t rest = (*ns)->page_banks()[0].rows - pages;
    auto held = (*ns)->Reserve(static_cast<uint32_t>(rest));
    if (!held.ok()) return Die("reserve rest", held.status());
    std::printf("READY\n");
    std::fflush(stdout);
    for (;;) pause();
  }

  if (mode == "verify") {
    auto lease = (*ns)->Lookup(hashes, /*pin=*/true);
    if (!lease.ok()) return Die("lookup", lease.status());
    if (lease->matched_pages() != pages) {
      std::fprintf(stderr, "matched %u of %u pages\n", lease->matched_pages(),
                   pages);
      return 1;
    }
    for (uint32_t i = 0; i < pages; ++i) {
      for (size_t b = 0; b < (*ns)->page_banks().size(); ++b) {
        const auto& bank = (*ns)->page_banks()[b];
        const uint8_t* row =
            bank.base + uint64_t{lease->rows()[i]} * bank.row_stride;
        if (!kvtier::testing::CheckPattern(row, bank.row_bytes, seed, i, b)) {
          std::fprintf(stderr, "page %u bank %s differs\n", i,
                       bank.name.c_str());
          return 1;
        }
      }
    }
    std::printf("VERIFIED %u\n", pages);
    return 0;
  }
  std::fprintf(stderr, "unknown mode %s\n", mode.c_str());
  return 2;
}
