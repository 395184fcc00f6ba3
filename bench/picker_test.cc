// Tests of transfer_bench's Picker: distinct items in every mode, runs of
// the asked lengths, and LoadRunLengths' errors.
//
// Thread-safety: single-threaded tests.
#include "bench/picker.h"

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace kvtier::bench {
namespace {

// Lengths of the maximal runs of consecutive ascending items.
std::vector<uint32_t> RunsOf(const std::vector<uint32_t>& v) {
  std::vector<uint32_t> out;
  for (size_t i = 0; i < v.size(); ++i) {
    if (i > 0 && v[i] == v[i - 1] + 1) {
      ++out.back();
    } else {
      out.push_back(1);
    }
  }
  return out;
}

void ExpectDistinctBelow(const std::vector<uint32_t>& v, size_t k, uint64_t n) {
  ASSERT_EQ(v.size(), k);
  EXPECT_EQ(std::set<uint32_t>(v.begin(), v.end()).size(), k);
  EXPECT_LT(*std::max_element(v.begin(), v.end()), n);
}

TEST(PickerTest, FixedRunsAreAlignedBlocks) {
  Picker p(1024, 3, 8);
  EXPECT_EQ(p.mean_run(), 8);
  std::vector<uint32_t> v;
  p.Pick(512, &v);
  ExpectDistinctBelow(v, 512, 1024);
  for (size_t i = 0; i < v.size(); i += 8) {
    EXPECT_EQ(v[i] % 8, 0u);
    for (size_t j = 1; j < 8; ++j) EXPECT_EQ(v[i + j], v[i] + j);
  }
  Picker random(1024, 3);
  random.Pick(512, &v);
  ExpectDistinctBelow(v, 512, 1024);
  // Random rows seldom follow each other: far fewer runs of 8 than above.
  const std::vector<uint32_t> runs = RunsOf(v);
  EXPECT_GT(runs.size(), 300u);
}

TEST(PickerTest, RunLengthsFollowTheDistribution) {
  // Runs of 4 and of 16, as many of each: the run-weighted mean is 10.
  Picker p(4096, 5, RunLengths{{4, 100}, {16, 100}});
  EXPECT_DOUBLE_EQ(p.mean_run(), 10.0);
  std::map<uint32_t, int> seen;
  std::vector<uint32_t> v;
  for (int i = 0; i < 20; ++i) {
    p.Pick(1024, &v);
    ExpectDistinctBelow(v, 1024, 4096);
    // Two runs drawn next to each other merge now and then, and the cut
    // ends the last; every other run is 4 or 16 long.
    const std::vector<uint32_t> runs = RunsOf(v);
    for (size_t r = 0; r + 1 < runs.size(); ++r) ++seen[runs[r]];
  }
  const int total = [&] {
    int t = 0;
    for (const auto& [len, count] : seen) t += count;
    return t;
  }();
  EXPECT_GT(seen[4] + seen[16], total * 9 / 10);
  EXPECT_GT(seen[4], total / 4);
  EXPECT_GT(seen[16], total / 4);
}

TEST(PickerTest, RunLengthsCanTakeEveryItem) {
  Picker p(100, 9, RunLengths{{7, 1}});
  std::vector<uint32_t> v;
  p.Pick(100, &v);
  ExpectDistinctBelow(v, 100, 100);
}

std::string WriteFile(const std::string& text) {
  std::string path =
      ::testing::TempDir() + "/picker_test_lengths_" + std::to_string(getpid());
  std::ofstream(path) << text;
  return path;
}

TEST(PickerTest, LoadRunLengths) {
  absl::StatusOr<RunLengths> ok = LoadRunLengths(WriteFile("1 5\n8 2\n\n"));
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(*ok, (RunLengths{{1, 5}, {8, 2}}));

  absl::StatusOr<RunLengths> zero = LoadRunLengths(WriteFile("1 5\n0 2\n"));
  EXPECT_EQ(zero.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(zero.status().message().find(":2: \"0 2\""), std::string::npos)
      << zero.status();
  EXPECT_EQ(LoadRunLengths(WriteFile("3 4 5\n")).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LoadRunLengths(WriteFile("x 4\n")).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LoadRunLengths(WriteFile("3 0\n")).status().code(),
            absl::StatusCode::kInvalidArgument);  // No runs at all.
  EXPECT_EQ(LoadRunLengths("/nonexistent/lengths").status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace kvtier::bench
