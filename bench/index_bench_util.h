// Helpers that index_bench's parts share (bench/index_bench.cc,
// bench/index_bench_background.cc): random chains of hashes, the medium of
// a folder, and latency summaries printed as JSON.
//
// Thread-safety: plain functions of their arguments; thread-safe.
#ifndef KVTIER_BENCH_INDEX_BENCH_UTIL_H_
#define KVTIER_BENCH_INDEX_BENCH_UTIL_H_

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"

namespace kvtier::bench {

// Returns `n` random 32-byte hashes, packed, from `seed` (one seed, one
// chain: the same seed gives the same chain).
inline std::string RandomHashes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string out(n * 32, '\0');
  for (size_t i = 0; i < out.size(); i += 8) {
    const uint64_t v = rng();
    std::memcpy(&out[i], &v, 8);
  }
  return out;
}

// Returns the filesystem type of `path` (the journal's medium: fsync on
// tmpfs costs nothing), from the longest mount point that prefixes it;
// "unknown" when none does.
inline std::string FsType(const std::string& path) {
  std::ifstream mounts("/proc/mounts");
  std::string best_dir, best_type = "unknown";
  for (std::string line; std::getline(mounts, line);) {
    std::vector<std::string> f = absl::StrSplit(line, ' ');
    if (f.size() < 3) continue;
    if (path.rfind(f[1], 0) == 0 && f[1].size() >= best_dir.size()) {
      best_dir = f[1];
      best_type = f[2];
    }
  }
  return best_type;
}

// Latencies in microseconds, summarized with their tail: p50, p99, max.
struct Tail {
  double p50_us = 0, p99_us = 0, max_us = 0, mean_us = 0;
  size_t ops = 0;
};

// Returns the summary of `us` (all zero when it is empty).
inline Tail SummarizeTail(std::vector<double> us) {
  Tail t;
  if (us.empty()) return t;
  std::sort(us.begin(), us.end());
  t.ops = us.size();
  t.p50_us = us[us.size() / 2];
  t.p99_us = us[std::min(us.size() - 1, us.size() * 99 / 100)];
  t.max_us = us.back();
  double sum = 0;
  for (double v : us) sum += v;
  t.mean_us = sum / us.size();
  return t;
}

// Returns `t` as a JSON object.
inline std::string TailJson(const Tail& t) {
  return absl::StrFormat(
      R"({"p50_us": %.1f, "p99_us": %.1f, "max_us": %.1f, "mean_us": %.1f, "ops": %d})",
      t.p50_us, t.p99_us, t.max_us, t.mean_us, t.ops);
}

}  // namespace kvtier::bench

#endif  // KVTIER_BENCH_INDEX_BENCH_UTIL_H_
