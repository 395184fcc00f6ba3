// The TSan build's canary (issue 15): proves `make test-tsan` is live.
// tsan_canary (tests/tsan_canary_main.cc) races on purpose, and TSan must
// say so; the same program under an absl::Mutex must be clean, which holds
// only while it runs on the abseil built for TSan (scripts/tsan-abseil.sh);
// and linked against Debian's abseil the same Mutex reads as a race, so the
// clean run is not a TSan that sees nothing. The canary's report, written
// where `make test-tsan` collects every process's, fails tests/
// tsan_reports.py, the judge of that folder. Built and run only with
// KVTIER_SANITIZE=thread.
//
// Thread-safety: one test thread.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/daemon_process.h"

namespace kvtier::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr int kTsanExitCode = 66;
constexpr char kRace[] = "WARNING: ThreadSanitizer: data race";

class TsanCanaryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // The canary's reports go to its stdout, which RunProgram reads, not to
    // the folder of `make test-tsan` (which fails on any report there).
    setenv("TSAN_OPTIONS", Options("log_path=stdout").c_str(), 1);
  }

  // The canary's options: the suite's suppressions, a stop at its first
  // report, and `log`.
  static std::string Options(const std::string& log) {
    return absl::StrCat("suppressions=", KVTIER_TSAN_SUPPRESSIONS_PATH,
                        ":halt_on_error=1:exitcode=", kTsanExitCode, ":", log);
  }

  const std::string canary_ = KVTIER_TSAN_CANARY_PATH;
};

TEST_F(TsanCanaryTest, ReportsTheDataRace) {
  const Ran r = RunProgram({canary_, "race"});
  EXPECT_EQ(r.rc, kTsanExitCode) << r.out;
  EXPECT_THAT(r.out, HasSubstr(kRace));
  EXPECT_THAT(r.out, HasSubstr("RacyIncrement"));
}

TEST_F(TsanCanaryTest, SeesAbseilMutex) {
  const Ran r = RunProgram({canary_, "mutex"});
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_THAT(r.out, Not(HasSubstr("ThreadSanitizer")));
  EXPECT_THAT(r.out, HasSubstr("counter 2000"));
}

// The same program linked without the RPATH runs on Debian's abseil, whose
// Mutex TSan cannot see: the guarded counter reads as a race.
TEST_F(TsanCanaryTest, DebianAbseilMutexReadsAsARace) {
  const Ran r = RunProgram({KVTIER_TSAN_CANARY_DEBIAN_ABSEIL_PATH, "mutex"});
  EXPECT_EQ(r.rc, kTsanExitCode) << r.out;
  EXPECT_THAT(r.out, HasSubstr(kRace));
  EXPECT_THAT(r.out, HasSubstr("LockedIncrement"));
}

// The race, logged as every process of `make test-tsan` logs its reports,
// is one the judge of that folder fails on (it is the project's code).
TEST_F(TsanCanaryTest, TheReportJudgeFailsOnIt) {
  const std::string dir =
      ::testing::TempDir() + "tsan_canary_logs_" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const Ran r = RunProgram(
      {"/usr/bin/env",
       "TSAN_OPTIONS=" + Options(absl::StrCat("log_path=", dir, "/report")),
       canary_, "race"});
  EXPECT_EQ(r.rc, kTsanExitCode) << r.out;
  const Ran judged =
      RunProgram({"/usr/bin/env", "python3", KVTIER_TSAN_REPORTS_PATH, dir});
  EXPECT_EQ(judged.rc, 1) << judged.out;
  EXPECT_THAT(judged.out, HasSubstr(kRace));
  EXPECT_THAT(judged.out, HasSubstr("RacyIncrement"));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace kvtier::testing
