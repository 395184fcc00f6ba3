// Tests of RemoveTempSegments and ParseTempSegmentName: which names match,
// and that only stale regular files of the owner are removed.
#include "shm/segment_cleanup.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "shm/segment.h"

namespace kvtier::shm {
namespace {

using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;

// A pid that is no live process: a child that has exited and been reaped.
pid_t DeadPid() {
  const pid_t pid = fork();
  if (pid == 0) _exit(0);
  int status = 0;
  waitpid(pid, &status, 0);
  return pid;
}

TEST(ParseTempSegmentNameTest, MatchesTheNamesCreateUses) {
  pid_t pid = 0;
  EXPECT_TRUE(ParseTempSegmentName(TempSegmentName("kvtier.big.kv.r0", 4242, 7),
                                   "kvtier", &pid));
  EXPECT_EQ(pid, 4242);
  EXPECT_TRUE(ParseTempSegmentName(
      TempSegmentName("kvtier.a.b.snapshot.r3", 1, 0), "kvtier", &pid));
  EXPECT_EQ(pid, 1);
}

TEST(ParseTempSegmentNameTest, RejectsOtherNames) {
  pid_t pid = 0;
  for (const std::string& name : {
           std::string("kvtier.big.kv.r0"),          // A final name.
           std::string(".kvtier.big.kv.r0"),         // No pid, counter, suffix.
           std::string(".kvtier.big.kv.r0.12.tmp"),  // No counter.
           std::string(".kvtier.big.kv.r0.x.3.tmp"),
           std::string(".kvtier.big.kv.r0.12.3x.tmp"),
           std::string(".kvtier..12.3.tmp"),  // Empty rest.
           std::string(".kvtier.12.3.tmp"),
           std::string("kvtier.big.kv.r0.12.3.tmp"),  // No leading dot.
           std::string(".kvtier.big.kv.r0.12.3.tmpx"),
           std::string(".kvtier.big.kv.r0.0.3.tmp"),     // pid 0.
           TempSegmentName("kvtierx.big.kv.r0", 12, 3),  // Other prefix.
           TempSegmentName("other.big.kv.r0", 12, 3),
           TempSegmentName("kvtier.b@d.kv.r0", 12, 3),
       }) {
    EXPECT_FALSE(ParseTempSegmentName(name, "kvtier", &pid)) << name;
  }
  EXPECT_FALSE(
      ParseTempSegmentName(TempSegmentName("kvtier.a.kv.r0", 12, 3), "", &pid));
}

class RemoveTempSegmentsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/dev/shm/kvtier-cleanup-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Path(const std::string& name) { return dir_ + "/" + name; }
  void Touch(const std::string& name) {
    const int fd = open(Path(name).c_str(), O_CREAT | O_WRONLY, 0600);
    ASSERT_GE(fd, 0) << name;
    ASSERT_EQ(ftruncate(fd, 8192), 0);
    close(fd);
  }
  bool Exists(const std::string& name) {
    struct stat st;
    return lstat(Path(name).c_str(), &st) == 0;
  }

  std::string dir_;
};

TEST_F(RemoveTempSegmentsTest, RemovesStaleTemporariesOnly) {
  const pid_t dead = DeadPid();
  const std::string stale = TempSegmentName("kvtier.big.kv.r0", dead, 0);
  const std::string own = TempSegmentName("kvtier.big.kv.r1", getpid(), 5);
  const std::string live = TempSegmentName("kvtier.big.kv.r2", getppid(), 1);
  const std::string final_name = "kvtier.big.kv.r0";
  const std::string other = TempSegmentName("other.big.kv.r0", dead, 0);
  const std::string link = TempSegmentName("kvtier.big.kv.r3", dead, 0);
  const std::string folder = TempSegmentName("kvtier.big.kv.r4", dead, 0);
  for (const std::string& name : {stale, own, live, final_name, other}) {
    Touch(name);
  }
  Touch("target");
  ASSERT_EQ(symlink(Path("target").c_str(), Path(link).c_str()), 0);
  ASSERT_EQ(mkdir(Path(folder).c_str(), 0700), 0);

  auto result = RemoveTempSegments(dir_, "kvtier", geteuid(), getpid());
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_THAT(result->removed, UnorderedElementsAre(Path(stale), Path(own)));
  EXPECT_FALSE(Exists(stale));
  EXPECT_FALSE(Exists(own));
  // A live creator's, other names, a symlink (and its target), a folder.
  for (const std::string& name :
       {live, final_name, other, link, folder, std::string("target")}) {
    EXPECT_TRUE(Exists(name)) << name;
  }
  ASSERT_EQ(result->kept.size(), 3u);
  for (const auto& kept : result->kept) {
    if (kept.path == Path(live)) {
      EXPECT_THAT(kept.reason, HasSubstr("still runs"));
    } else {
      EXPECT_TRUE(kept.path == Path(link) || kept.path == Path(folder))
          << kept.path;
      EXPECT_THAT(kept.reason, HasSubstr("not a regular file"));
    }
  }
}

TEST_F(RemoveTempSegmentsTest, KeepsAnotherOwnersFiles) {
  const std::string stale = TempSegmentName("kvtier.big.kv.r0", DeadPid(), 0);
  Touch(stale);
  auto result = RemoveTempSegments(dir_, "kvtier", geteuid() + 1, -1);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_TRUE(result->removed.empty());
  ASSERT_EQ(result->kept.size(), 1u);
  EXPECT_THAT(result->kept[0].reason, HasSubstr("owned by uid"));
  EXPECT_TRUE(Exists(stale));
}

TEST_F(RemoveTempSegmentsTest, ThePidOfTheCallerIsLiveUnlessStale) {
  const std::string own = TempSegmentName("kvtier.big.kv.r0", getpid(), 0);
  Touch(own);
  auto kept = RemoveTempSegments(dir_, "kvtier", geteuid(), -1);
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_TRUE(kept->removed.empty());
  EXPECT_TRUE(Exists(own));
}

TEST_F(RemoveTempSegmentsTest, MissingFolderIsEmpty) {
  auto result =
      RemoveTempSegments(dir_ + "/absent", "kvtier", geteuid(), getpid());
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_TRUE(result->removed.empty());
  EXPECT_TRUE(result->kept.empty());
}

TEST_F(RemoveTempSegmentsTest, NotAFolderIsAnError) {
  Touch("plain");
  auto result = RemoveTempSegments(Path("plain"), "kvtier", geteuid(), -1);
  EXPECT_FALSE(result.ok());
  EXPECT_THAT(std::string(result.status().message()), HasSubstr("plain"));
}

}  // namespace
}  // namespace kvtier::shm
