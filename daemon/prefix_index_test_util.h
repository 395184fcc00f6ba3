// Helpers shared by PrefixIndex's test files (daemon/prefix_index*_test.cc):
// deterministic keys and chains, configs, a commit-in-one-call Put, and
// printable dumps of everything observable about an index, so that a test
// can assert that a refused call changed nothing.
//
// Thread-safety: single-threaded test code; the functions keep no state.
#ifndef KVTIER_DAEMON_PREFIX_INDEX_TEST_UTIL_H_
#define KVTIER_DAEMON_PREFIX_INDEX_TEST_UTIL_H_

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "daemon/prefix_index.h"

namespace kvtier::daemon::index_testing {

using CommitResult = PrefixIndex::CommitResult;
using LookupResult = PrefixIndex::LookupResult;

// A 64-bit mixer (splitmix64's finaliser).
uint64_t Mix(uint64_t x);

// A distinct pseudo-random key per (chain, page).
HashKey Key(uint64_t chain, uint64_t page);

// Pages [from, from + n) of a chain.
std::vector<HashKey> Chain(uint64_t chain, size_t n, size_t from = 0);

// `a` followed by `b`.
std::vector<HashKey> Concat(std::vector<HashKey> a,
                            const std::vector<HashKey>& b);

// 32-byte hashes, 16 tokens per page, and the rest as given.
IndexConfig Config(uint64_t page_rows, uint64_t snapshot_rows = 0,
                   uint32_t tp_size = 1, bool replicated = false,
                   uint32_t max_replay_tokens = 0);

// PrefixIndex::Create(c), failing the test (and returning null) on error.
std::unique_ptr<PrefixIndex> Make(const IndexConfig& c);

// Every field of `u` on one line.
std::string Describe(const PrefixIndex::Usage& u);

// Allocates rows for `hashes` (and snapshots after the pages at `snap_at`)
// and commits them for `rank`; checks the invariants after.
CommitResult Put(PrefixIndex& index, uint32_t rank, const HashKey* parent,
                 const std::vector<HashKey>& hashes,
                 const std::vector<size_t>& snap_at = {});

// The rows a full lookup of `hashes` returns.
std::vector<uint32_t> RowsOf(PrefixIndex& index,
                             const std::vector<HashKey>& hashes,
                             uint32_t rank = 0);

// Everything observable about the index, changing nothing: usage, invariants,
// both prefix listings, every node, and Find (Lookup without its touch) of
// each of `chains` for each rank below `ranks`.
std::string Dump(const PrefixIndex& index,
                 const std::vector<std::vector<HashKey>>& chains,
                 uint32_t ranks = 1);

// Whether `status` is RESOURCE_EXHAUSTED with `text` in its message.
bool ExhaustedWith(const absl::Status& status, const std::string& text);

// Microseconds per call of `fn`: the best of 7 batches of `iters` calls
// (the machine may be shared; the best batch is the least disturbed).
template <typename Fn>
double BestMicros(int iters, Fn fn) {
  double best = 1e300;
  for (int batch = 0; batch < 7; ++batch) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) fn(i);
    const double us = std::chrono::duration<double, std::micro>(
                          std::chrono::steady_clock::now() - t0)
                          .count() /
                      iters;
    best = std::min(best, us);
  }
  return best;
}

}  // namespace kvtier::daemon::index_testing

#endif  // KVTIER_DAEMON_PREFIX_INDEX_TEST_UTIL_H_
