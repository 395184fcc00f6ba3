// Picker: the random GPU pages and host rows transfer_bench's transfers
// use. Host rows are drawn each at random (a fragmented bank), in aligned
// runs of a fixed length (--row_run), or in runs whose lengths follow a
// distribution measured from the daemon's own allocator
// (python/bench/row_runs.py --lengths-out, --row_run_lengths).
//
// Thread-safety: a Picker is used by one thread at a time.
#ifndef KVTIER_BENCH_PICKER_H_
#define KVTIER_BENCH_PICKER_H_

#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace kvtier::bench {

// (run length, how many runs of that length were seen).
using RunLengths = std::vector<std::pair<uint32_t, uint64_t>>;

// Reads "length count" lines (row_runs.py --lengths-out). INVALID_ARGUMENT
// naming the line for anything else (a zero length, no runs at all);
// NOT_FOUND / the errno's code when the file cannot be read.
absl::StatusOr<RunLengths> LoadRunLengths(const std::string& path);

// The run-weighted mean length of `lengths`. REQUIRES: some count is not 0.
double MeanRun(const RunLengths& lengths);

// Draws distinct values below n, a fresh random subset each call.
class Picker {
 public:
  // Items 0..n-1, drawn in runs of `run` consecutive items (aligned blocks
  // of `run`, in random order; the last block of n may be short): run 1
  // draws each item at random.
  Picker(uint64_t n, uint64_t seed, uint32_t run = 1);
  // Items 0..n-1 cut into consecutive runs whose lengths are drawn from
  // `lengths` (weighted by count: run-weighted, as observed), a fresh cut
  // each Pick, the runs in random order. REQUIRES: some count is not 0 (as
  // LoadRunLengths guarantees).
  Picker(uint64_t n, uint64_t seed, const RunLengths& lengths);

  // k distinct items. REQUIRES: k <= n - (run - 1) (a short last block can
  // leave the draw short of items otherwise); k <= n with run lengths.
  void Pick(size_t k, std::vector<uint32_t>* out);

  // The mean length of the runs a Pick hands out, before cutting to k (for
  // the JSON): `run`, or the distribution's run-weighted mean.
  double mean_run() const { return mean_run_; }

 private:
  void Cut();  // New runs_ from lengths_.

  uint64_t n_;
  uint32_t run_;
  std::vector<uint32_t> perm_;  // block indices (fixed runs)
  std::vector<std::pair<uint32_t, uint32_t>> runs_;  // (first, length)
  std::vector<uint32_t> length_values_;
  std::discrete_distribution<size_t> length_dist_;
  double mean_run_ = 1;
  std::mt19937_64 rng_;
};

}  // namespace kvtier::bench

#endif  // KVTIER_BENCH_PICKER_H_
