// Files the daemon can trust (issue 14, item 1) against real other users.
//
// A local user who can write the folder kvtierd keeps banks or journals in
// could pre-create a namespace's banks under their predictable names (then
// read every tenant's KV and write poisoned KV) or plant journals that a
// restart replays. kvtierd refuses, at start, every bank, journal or socket
// folder that is not a real folder of its own uid writable by nobody else,
// and never adopts a file it did not make. Here the attacker is a user the
// test creates (useradd): root bypasses file modes, so a root attacker
// would prove nothing. Each case starts a real kvtierd and checks that it
// exits with an error naming what it found, and that the attacker's files
// are left exactly as they were (nothing adopted, nothing replayed).
//
// Thread-safety: single-threaded test; every user switch happens in a
// forked child (tests/test_users.h).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/daemon_process.h"
#include "tests/test_users.h"

namespace kvtier::testing {
namespace {

using ::testing::HasSubstr;

// Runs kvtierd with `flags` until it exits (it must, within 30 s); returns
// its exit code and what it printed on stdout and stderr.
Outcome RunDaemon(const std::vector<std::string>& flags) {
  std::vector<std::string> argv = {
      "/bin/sh",
      "-c",
      "exec \"$0\" \"$@\" 2>&1",
      ResolveProgram(KVTIER_KVTIERD_PATH, "daemon/kvtierd"),
      "--huge_pages=off",
      "--metrics_address=",
      "--log_level=info"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  const Ran r = RunProgram(argv, absl::Seconds(30));
  return Outcome{r.rc, r.out};
}

std::string ReadFile(const std::string& path) {
  std::string out;
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "<unreadable>";
  char buf[4096];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) out.append(buf, n);
  close(fd);
  return out;
}

class SquatTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const std::string why = CannotCreateUsers(); !why.empty()) {
      if (UsersRequired()) FAIL() << why << " (KVTIER_REQUIRE_USERS=1)";
      GTEST_SKIP() << why;
    }
    auto m = EnsureUser("kvtier-sq-mallory", "");
    ASSERT_TRUE(m.ok()) << m.status();
    mallory_ = *m;
    // A world-writable, sticky playground like /dev/shm or /tmp, where the
    // attacker can make folders before the daemon does.
    char tmpl[] = "/dev/shm/kvtier-squat-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    root_ = tmpl;
    ASSERT_EQ(chmod(root_.c_str(), 01777), 0);
    // The daemon's own socket folder, which it trusts.
    run_ = root_ + "/run";
    ASSERT_EQ(mkdir(run_.c_str(), 0750), 0);
  }
  void TearDown() override {
    if (!root_.empty()) {
      std::system(absl::StrCat("rm -rf '", root_, "'").c_str());
    }
  }

  // As mallory: makes folder `dir` (mode 0777) holding `file` with
  // `content`. Returns the child's exit code (0: done).
  int PlantAsMallory(const std::string& dir, const std::string& file,
                     const std::string& content) {
    Outcome o = RunAs(&mallory_, [&](std::string* out) {
      if (mkdir(dir.c_str(), 0777) != 0 || chmod(dir.c_str(), 0777) != 0) {
        *out += "mkdir failed";
        return 1;
      }
      const std::string path = dir + "/" + file;
      const int fd = open(path.c_str(), O_CREAT | O_WRONLY | O_EXCL, 0666);
      if (fd < 0) return 2;
      const bool ok = write(fd, content.data(), content.size()) ==
                      static_cast<ssize_t>(content.size());
      fchmod(fd, 0666);
      close(fd);
      return ok ? 0 : 3;
    });
    EXPECT_EQ(o.code, 0) << o.output;
    return o.code;
  }

  std::string Socket() const { return run_ + "/kvtierd.sock"; }

  User mallory_;
  std::string root_, run_;
};

TEST_F(SquatTest, ABankFolderAnotherUserMadeIsRefused) {
  const std::string shm = root_ + "/kvtier-banks";
  // Mallory got there first, with a bank under the demo namespace's name.
  const std::string planted = "kvtier.demo.kv.r0";
  ASSERT_EQ(PlantAsMallory(shm, planted, "poisoned KV"), 0);
  Outcome d = RunDaemon({"--socket=" + Socket(), "--shm_dir=" + shm,
                         "--demo_namespace=demo", "--state_dir=none"});
  EXPECT_NE(d.code, 0) << d.output;
  EXPECT_THAT(d.output, HasSubstr("--shm_dir"));
  EXPECT_THAT(d.output,
              HasSubstr(absl::StrCat("belongs to uid ", mallory_.uid)));
  EXPECT_EQ(ReadFile(shm + "/" + planted), "poisoned KV");
  struct stat st;
  ASSERT_EQ(lstat((shm + "/" + planted).c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, mallory_.uid) << "nothing adopted or changed";
}

TEST_F(SquatTest, AStateFolderAnotherUserMadeIsRefusedItsJournalsNotReplayed) {
  const std::string shm = root_ + "/banks";
  ASSERT_EQ(mkdir(shm.c_str(), 0750), 0);
  const std::string state = root_ + "/state";
  ASSERT_EQ(PlantAsMallory(state, "ns.demo.journal", "KVJ1 planted journal"),
            0);
  Outcome d = RunDaemon(
      {"--socket=" + Socket(), "--shm_dir=" + shm, "--state_dir=" + state});
  EXPECT_NE(d.code, 0) << d.output;
  EXPECT_THAT(d.output, HasSubstr("state_dir"));
  EXPECT_THAT(d.output,
              HasSubstr(absl::StrCat("belongs to uid ", mallory_.uid)));
  EXPECT_THAT(d.output, ::testing::Not(HasSubstr("recovered")));
  EXPECT_EQ(ReadFile(state + "/ns.demo.journal"), "KVJ1 planted journal");
}

TEST_F(SquatTest, SymlinkedFoldersAreRefused) {
  // Mallory's folder, reached through a symlink.
  const std::string target = root_ + "/mallory";
  ASSERT_EQ(PlantAsMallory(target, "x", "x"), 0);
  const std::string link = root_ + "/banks-link";
  Outcome made = RunAs(&mallory_, [&](std::string*) {
    return symlink(target.c_str(), link.c_str()) == 0 ? 0 : 1;
  });
  ASSERT_EQ(made.code, 0);
  Outcome shm = RunDaemon(
      {"--socket=" + Socket(), "--shm_dir=" + link, "--state_dir=none"});
  EXPECT_NE(shm.code, 0) << shm.output;
  EXPECT_THAT(shm.output, HasSubstr("is a symlink"));

  const std::string banks = root_ + "/banks";
  ASSERT_EQ(mkdir(banks.c_str(), 0750), 0);
  Outcome state = RunDaemon(
      {"--socket=" + Socket(), "--shm_dir=" + banks, "--state_dir=" + link});
  EXPECT_NE(state.code, 0) << state.output;
  EXPECT_THAT(state.output, HasSubstr("is a symlink"));
}

TEST_F(SquatTest, AWorldWritableBankFolderIsRefused) {
  // Like --shm_dir=/dev/shm itself: anyone may create files there.
  Outcome d = RunDaemon(
      {"--socket=" + Socket(), "--shm_dir=" + root_, "--state_dir=none"});
  EXPECT_NE(d.code, 0) << d.output;
  EXPECT_THAT(d.output, HasSubstr("writable by other users"));
  // And a socket folder of mallory's: clients could not trust it.
  const std::string sockdir = root_ + "/sock";
  ASSERT_EQ(PlantAsMallory(sockdir, "placeholder", ""), 0);
  const std::string banks = root_ + "/banks";
  ASSERT_EQ(mkdir(banks.c_str(), 0750), 0);
  Outcome s = RunDaemon({"--socket=" + sockdir + "/kvtierd.sock",
                         "--shm_dir=" + banks, "--state_dir=none"});
  EXPECT_NE(s.code, 0) << s.output;
  EXPECT_THAT(s.output, HasSubstr("--socket"));
}

}  // namespace
}  // namespace kvtier::testing
