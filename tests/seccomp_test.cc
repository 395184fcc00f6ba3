// seccomp_test: the unit's system call filter as CI enforces it without
// systemd (issue 14). deploy/kvtierd.service names exactly @system-service
// plus deploy/seccomp/kvtierd-extra.syscalls, the checked-in expansion of
// @system-service is what systemd prints, and seccomp_exec -- the launcher
// the _seccomp suites start kvtierd through -- really refuses what the
// lists leave out, so a suite that passes under it passed under a filter.
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "client/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/daemon_process.h"

namespace kvtier::testing {
namespace {

using client::Client;
using ::testing::ContainsRegex;
using ::testing::HasSubstr;
using ::testing::Not;

const std::string kSource = KVTIER_SOURCE_DIR;
const std::string kLists = kSource + "/deploy/seccomp";
const std::string kExec =
    ResolveProgram(KVTIER_SECCOMP_EXEC_PATH, "tests/seccomp_exec");
const std::string kProbe =
    ResolveProgram(KVTIER_SECCOMP_PROBE_PATH, "tests/seccomp_probe");

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The names of a .syscalls file (comments and blank lines dropped).
std::set<std::string> Names(const std::string& path) {
  std::set<std::string> names;
  for (absl::string_view line : absl::StrSplit(ReadFile(path), '\n')) {
    line = line.substr(0, line.find('#'));
    line = absl::StripAsciiWhitespace(line);
    if (!line.empty()) names.emplace(line);
  }
  return names;
}

// The values of every `key=` line of the unit, in order.
std::vector<std::string> UnitValues(const std::string& key) {
  std::vector<std::string> values;
  for (absl::string_view line :
       absl::StrSplit(ReadFile(kSource + "/deploy/kvtierd.service"), '\n')) {
    if (absl::ConsumePrefix(&line, key + "=")) values.emplace_back(line);
  }
  return values;
}

std::set<std::string> Words(const std::string& s, const char* seps) {
  std::set<std::string> out;
  for (absl::string_view w :
       absl::StrSplit(s, absl::ByAnyChar(seps), absl::SkipEmpty())) {
    out.emplace(w);
  }
  return out;
}

const std::vector<std::string> kProbes = {"mincore", "mseal", "netlink", "unix",
                                          "wx"};

std::vector<std::string> ProbeCommand(std::vector<std::string> launcher) {
  launcher.push_back(kProbe);
  launcher.insert(launcher.end(), kProbes.begin(), kProbes.end());
  return launcher;
}

// Sets kSeccompEnv for one scope.
class SeccompEnv {
 public:
  explicit SeccompEnv(const std::string& dir) {
    setenv(kSeccompEnv, dir.c_str(), 1);
  }
  ~SeccompEnv() { unsetenv(kSeccompEnv); }
};

TEST(SeccompUnitTest, FilterIsSystemServicePlusTheExtraList) {
  const std::vector<std::string> filter = UnitValues("SystemCallFilter");
  ASSERT_FALSE(filter.empty()) << "the unit sets no SystemCallFilter=";
  EXPECT_EQ(filter[0], "@system-service");
  std::set<std::string> extra;
  for (size_t i = 1; i < filter.size(); ++i) {
    EXPECT_THAT(filter[i], Not(HasSubstr("~"))) << "a deny line";
    EXPECT_THAT(filter[i], Not(HasSubstr("@"))) << "a group beyond the first";
    for (const std::string& w : Words(filter[i], " \t")) extra.insert(w);
  }
  EXPECT_EQ(extra, Names(kLists + "/kvtierd-extra.syscalls"))
      << "the unit's SystemCallFilter= lines after @system-service must list "
         "deploy/seccomp/kvtierd-extra.syscalls exactly";
  EXPECT_EQ(UnitValues("SystemCallErrorNumber"),
            std::vector<std::string>{"EPERM"});
  EXPECT_EQ(UnitValues("SystemCallArchitectures"),
            std::vector<std::string>{"native"});
}

TEST(SeccompUnitTest, SuitesEmulateTheUnitsOtherFilters) {
  const std::vector<std::string> families =
      UnitValues("RestrictAddressFamilies");
  ASSERT_EQ(families.size(), 1u);
  EXPECT_EQ(Words(families[0], " \t"), Words(kUnitAddressFamilies, ","));
  EXPECT_EQ(UnitValues("MemoryDenyWriteExecute"),
            std::vector<std::string>{"yes"});
  EXPECT_EQ(UnitValues("NoNewPrivileges"), std::vector<std::string>{"yes"});
}

TEST(SeccompUnitTest, SystemServiceListIsWhatSystemdPrints) {
  if (std::system("systemd-analyze --version >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "no systemd-analyze (Debian package systemd)";
  }
  char tmpl[] = "/tmp/kvtier-seccomp-lists-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  Ran r =
      RunProgram({"/bin/sh", "-c",
                  kLists + "/update.sh " + dir + " >/dev/null 2>&1; echo $?"});
  ASSERT_EQ(r.out, "0\n");
  for (const char* f : {"/system-service.syscalls", "/known.syscalls"}) {
    const std::string shipped = ReadFile(kLists + f);
    const std::string now = ReadFile(dir + f);
    const std::vector<std::string> lines = absl::StrSplit(now, '\n');
    ASSERT_GT(lines.size(), 3u);
    const std::string& version_line = lines[3];  // "... from systemd N (...)."
    if (shipped.find(version_line) == std::string::npos) {
      std::filesystem::remove_all(dir);
      GTEST_SKIP() << "this host's systemd differs from the lists' ("
                   << version_line << "): run deploy/seccomp/update.sh";
    }
    EXPECT_EQ(shipped, now) << f << " is not what update.sh writes";
  }
  std::filesystem::remove_all(dir);
}

TEST(SeccompExecTest, ProbesSucceedWithoutTheFilter) {
  // Else the refusals below could be the host's, not the filter's.
  Ran r = RunProgram(ProbeCommand({}));
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("mincore=ok\n"));
  EXPECT_THAT(r.out, HasSubstr("netlink=ok\n"));
  EXPECT_THAT(r.out, HasSubstr("unix=ok\n"));
  EXPECT_THAT(r.out, HasSubstr("wx=ok\n"));
  // mseal: ok from Linux 6.10, ENOSYS before; either way not EPERM.
  EXPECT_THAT(r.out, Not(HasSubstr("mseal=EPERM")));
}

TEST(SeccompExecTest, TheSuitesLauncherRefusesWhatTheUnitRefuses) {
  // The preconditions: the probes' calls are outside the lists.
  const std::set<std::string> allowed =
      Names(kLists + "/system-service.syscalls");
  ASSERT_EQ(allowed.count("mincore"), 0u);
  ASSERT_EQ(Names(kLists + "/kvtierd-extra.syscalls").count("mincore"), 0u);
  ASSERT_EQ(Names(kLists + "/known.syscalls").count("mseal"), 0u);
  ASSERT_EQ(allowed.count("socket"), 1u);
  ASSERT_EQ(allowed.count("mmap"), 1u);

  SeccompEnv env(kLists);
  std::vector<std::string> argv = DaemonCommand({kProbe});
  ASSERT_EQ(argv[0], kExec);
  argv.insert(argv.end(), kProbes.begin(), kProbes.end());
  Ran r = RunProgram(argv);
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("mincore=EPERM\n"));  // SystemCallErrorNumber=
  EXPECT_THAT(r.out, HasSubstr("mseal=ENOSYS\n"));   // newer than @known
  EXPECT_THAT(r.out, HasSubstr("netlink=EAFNOSUPPORT\n"));
  EXPECT_THAT(r.out, HasSubstr("unix=ok\n"));
  EXPECT_THAT(r.out, HasSubstr("wx=EPERM\n"));  // MemoryDenyWriteExecute=
}

TEST(SeccompExecTest, WithoutKnownEveryRefusalIsTheErrno) {
  Ran r = RunProgram(ProbeCommand(
      {kExec, "--allow=" + kLists + "/system-service.syscalls", "--"}));
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("mincore=EPERM\n"));
  EXPECT_THAT(r.out, HasSubstr("mseal=EPERM\n"));
  EXPECT_THAT(r.out, HasSubstr("netlink=ok\n"));  // No --address_families.
  EXPECT_THAT(r.out, HasSubstr("wx=ok\n"));       // No --deny_write_execute.
}

TEST(SeccompExecTest, KillActionKillsTheProcess) {
  Ran r = RunProgram({kExec, "--action=kill",
                      "--allow=" + kLists + "/system-service.syscalls", "--",
                      kProbe, "unix", "mincore"});
  EXPECT_EQ(r.rc, 128 + SIGSYS) << r.out;
  EXPECT_THAT(r.out, Not(HasSubstr("mincore=")));
}

TEST(SeccompExecTest, UnknownNamesAreSkippedWithAWarning) {
  char tmpl[] = "/tmp/kvtier-seccomp-list-XXXXXX";
  const int fd = mkstemp(tmpl);
  ASSERT_GE(fd, 0);
  const std::string list = "no_such_call\nmincore  # allowed here\n";
  ASSERT_EQ(write(fd, list.data(), list.size()),
            static_cast<ssize_t>(list.size()));
  close(fd);
  Ran r =
      RunProgram({"/bin/sh", "-c",
                  "exec \"$0\" --allow=\"$1\" --allow=\"$2\" -- \"$3\" mincore "
                  "2>&1",
                  kExec, kLists + "/system-service.syscalls", tmpl, kProbe});
  unlink(tmpl);
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("mincore=ok\n"));
  EXPECT_THAT(r.out, ContainsRegex("warning: .*no_such_call"));
}

TEST(SeccompExecTest, BadUsageExits125) {
  EXPECT_EQ(RunProgram({kExec, "--", kProbe}).rc, 125);  // No --allow.
  EXPECT_EQ(RunProgram({kExec, "--allow=/nonexistent", "--", kProbe}).rc, 125);
  EXPECT_EQ(RunProgram({kExec, "--allow=" + kLists + "/system-service.syscalls",
                        "--action=maybe", "--", kProbe})
                .rc,
            125);
  EXPECT_EQ(RunProgram({kExec, "--allow=" + kLists + "/system-service.syscalls",
                        "--", "/nonexistent/program"})
                .rc,
            127);
}

TEST(SeccompDaemonTest, DaemonServesUnderTheFilterAndTheCheckCanFail) {
  SeccompEnv env(kLists);
  // This process is not under the filter: the check says so.
  EXPECT_FALSE(CheckDaemonFiltered(getpid()).ok());
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.Start({"--metrics_address=127.0.0.1:0"}).ok());
  auto client = Client::Connect({.socket = daemon.socket()});
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_TRUE(daemon.Stop().ok());  // SIGTERM drains and exits 0.
}

}  // namespace
}  // namespace kvtier::testing
