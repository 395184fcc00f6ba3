// Picker (bench/picker.h): random items, alone or in runs.
//
// Thread-safety: as the header says.
#include "bench/picker.h"

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace kvtier::bench {

absl::StatusOr<RunLengths> LoadRunLengths(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return absl::ErrnoToStatus(errno, absl::StrCat("open ", path));
  }
  RunLengths out;
  uint64_t runs = 0;
  std::string line;
  for (int no = 1; std::getline(in, line); ++no) {
    if (line.empty()) continue;
    std::istringstream fields(line);
    uint64_t length = 0, count = 0;
    std::string rest;
    if (!(fields >> length >> count) || (fields >> rest) || length == 0 ||
        length > UINT32_MAX) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ":", no, ": \"", line,
                       "\" is not \"length count\" with a length of 1 or "
                       "more"));
    }
    out.emplace_back(static_cast<uint32_t>(length), count);
    runs += count;
  }
  if (runs == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(path,
                     ": no runs (row_runs.py --lengths-out writes "
                     "\"length count\" lines)"));
  }
  return out;
}

Picker::Picker(uint64_t n, uint64_t seed, uint32_t run)
    : n_(n),
      run_(std::max<uint32_t>(run, 1)),
      perm_((n + run_ - 1) / run_),
      mean_run_(run_),
      rng_(seed) {
  for (uint64_t i = 0; i < perm_.size(); ++i) {
    perm_[i] = static_cast<uint32_t>(i);
  }
}

double MeanRun(const RunLengths& lengths) {
  double runs = 0, rows = 0;
  for (const auto& [length, count] : lengths) {
    runs += static_cast<double>(count);
    rows += static_cast<double>(count) * length;
  }
  return rows / runs;
}

Picker::Picker(uint64_t n, uint64_t seed, const RunLengths& lengths)
    : n_(n), run_(0), mean_run_(MeanRun(lengths)), rng_(seed) {
  std::vector<double> weights;
  for (const auto& [length, count] : lengths) {
    length_values_.push_back(length);
    weights.push_back(static_cast<double>(count));
  }
  length_dist_ =
      std::discrete_distribution<size_t>(weights.begin(), weights.end());
}

void Picker::Cut() {
  runs_.clear();
  for (uint64_t at = 0; at < n_;) {
    const uint64_t length =
        std::min<uint64_t>(length_values_[length_dist_(rng_)], n_ - at);
    runs_.emplace_back(static_cast<uint32_t>(at),
                       static_cast<uint32_t>(length));
    at += length;
  }
}

void Picker::Pick(size_t k, std::vector<uint32_t>* out) {
  out->clear();
  if (run_ == 0) {  // Run lengths: a fresh cut, taken in random order.
    Cut();
    for (size_t i = 0; i < runs_.size() && out->size() < k; ++i) {
      const size_t j = i + static_cast<size_t>(rng_() % (runs_.size() - i));
      std::swap(runs_[i], runs_[j]);
      const auto [first, length] = runs_[i];
      for (uint32_t x = first; x < first + length && out->size() < k; ++x) {
        out->push_back(x);
      }
    }
    return;
  }
  const size_t blocks = perm_.size();
  for (size_t i = 0; i < blocks && out->size() < k; ++i) {
    const size_t j = i + static_cast<size_t>(rng_() % (blocks - i));
    std::swap(perm_[i], perm_[j]);
    const uint64_t first = uint64_t{perm_[i]} * run_;
    for (uint64_t x = first; x < first + run_ && x < n_ && out->size() < k;
         ++x) {
      out->push_back(static_cast<uint32_t>(x));
    }
  }
}

}  // namespace kvtier::bench
