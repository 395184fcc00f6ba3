// Tests of the trusted folders and files (shm/trusted_path.h). The owner
// checks need a file of another uid: root makes one with chown; as another
// user those cases are skipped (CI runs as root).
#include "shm/trusted_path.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvtier::shm {
namespace {

using ::testing::HasSubstr;

constexpr uid_t kOtherUid = 54321;

class TrustedPathTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kvtier-trusted-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::system(absl::StrCat("rm -rf '", dir_, "'").c_str());
  }
  std::string dir_;
};

TEST_F(TrustedPathTest, CreatesAMissingFolderWithItsModeWhateverTheUmask) {
  const mode_t old = umask(0);
  const std::string d = dir_ + "/banks";
  ASSERT_TRUE(EnsureTrustedDir(d, 0750, "--shm_dir").ok());
  umask(old);
  struct stat st;
  ASSERT_EQ(lstat(d.c_str(), &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0750u);
  EXPECT_EQ(st.st_uid, geteuid());
  // Found again: accepted as it is.
  EXPECT_TRUE(EnsureTrustedDir(d, 0700, "--shm_dir").ok());
  ASSERT_EQ(lstat(d.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0750u) << "an existing folder is not changed";
}

TEST_F(TrustedPathTest, RefusesSymlinksFilesAndWritableFolders) {
  const std::string target = dir_ + "/target";
  ASSERT_EQ(mkdir(target.c_str(), 0700), 0);
  const std::string link = dir_ + "/link";
  ASSERT_EQ(symlink(target.c_str(), link.c_str()), 0);
  absl::Status s = EnsureTrustedDir(link, 0750, "--shm_dir");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("is a symlink"));

  const std::string file = dir_ + "/file";
  close(open(file.c_str(), O_CREAT | O_WRONLY, 0600));
  s = EnsureTrustedDir(file, 0750, "--state_dir");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("not a folder"));

  const std::string shared = dir_ + "/shared";
  ASSERT_EQ(mkdir(shared.c_str(), 0700), 0);
  ASSERT_EQ(chmod(shared.c_str(), 01777), 0);
  s = EnsureTrustedDir(shared, 0750, "--shm_dir");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("mode 1777, writable by other users"));
  ASSERT_EQ(chmod(shared.c_str(), 0770), 0);
  EXPECT_FALSE(EnsureTrustedDir(shared, 0750, "--shm_dir").ok())
      << "group-writable: the group's members could squat";

  EXPECT_EQ(EnsureTrustedDir("relative/dir", 0750, "--shm_dir").code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      EnsureTrustedDir(dir_ + "/no/such/parent", 0750, "--shm_dir").code(),
      absl::StatusCode::kFailedPrecondition);
}

TEST_F(TrustedPathTest, RefusesAFolderOfAnotherUid) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to chown";
  const std::string d = dir_ + "/squatted";
  ASSERT_EQ(mkdir(d.c_str(), 0755), 0);
  ASSERT_EQ(chown(d.c_str(), kOtherUid, kOtherUid), 0);
  const absl::Status s = EnsureTrustedDir(d, 0750, "--state_dir");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(),
              HasSubstr(absl::StrCat("belongs to uid ", kOtherUid)));
}

TEST_F(TrustedPathTest, ChecksFilesOwnerModeAndType) {
  const std::string file = dir_ + "/seg";
  const int fd = open(file.c_str(), O_CREAT | O_RDWR, 0600);
  ASSERT_GE(fd, 0);
  struct stat st;
  ASSERT_EQ(fstat(fd, &st), 0);
  EXPECT_TRUE(CheckTrustedFile(st, file, geteuid(), "segment").ok());
  EXPECT_TRUE(CheckTrustedFile(st, file, kAnyOwner, "segment").ok());
  absl::Status s = CheckTrustedFile(st, file, geteuid() + 1, "segment");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("not to uid"));
  ASSERT_EQ(fchmod(fd, 0666), 0);
  ASSERT_EQ(fstat(fd, &st), 0);
  s = CheckTrustedFile(st, file, geteuid(), "segment");
  EXPECT_THAT(s.message(), HasSubstr("writable by every user"));
  close(fd);
  const std::string fifo = dir_ + "/fifo";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  ASSERT_EQ(lstat(fifo.c_str(), &st), 0);
  EXPECT_THAT(CheckTrustedFile(st, fifo, geteuid(), "segment").message(),
              HasSubstr("not a regular file"));
}

// Binds a unix socket at `path`; returns its fd.
int Listen(const std::string& path) {
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  return fd;
}

TEST_F(TrustedPathTest, DaemonSocketOwnerIsTheDaemonsUid) {
  const std::string d = dir_ + "/run";
  ASSERT_EQ(mkdir(d.c_str(), 0750), 0);
  const std::string sock = d + "/kvtierd.sock";
  EXPECT_EQ(CheckDaemonSocket(sock).status().code(),
            absl::StatusCode::kNotFound);
  const int fd = Listen(sock);
  auto uid = CheckDaemonSocket(sock);
  ASSERT_TRUE(uid.ok()) << uid.status();
  EXPECT_EQ(*uid, geteuid());

  // A folder others can write: anyone could have swapped the socket.
  ASSERT_EQ(chmod(d.c_str(), 0770), 0);
  auto writable = CheckDaemonSocket(sock);
  EXPECT_EQ(writable.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(writable.status().message(), HasSubstr("mode 0770"));
  ASSERT_EQ(chmod(d.c_str(), 0750), 0);

  // A symlink to the socket is not the socket.
  const std::string link = dir_ + "/link.sock";
  ASSERT_EQ(symlink(sock.c_str(), link.c_str()), 0);
  EXPECT_THAT(CheckDaemonSocket(link).status().message(), HasSubstr("symlink"));

  if (geteuid() == 0) {
    // Someone else's socket in their own folder straight under
    // world-writable /tmp: trusted only when it is this process's uid's or
    // root's, and it is neither.
    ASSERT_EQ(chown(d.c_str(), kOtherUid, kOtherUid), 0);
    ASSERT_EQ(chown(sock.c_str(), kOtherUid, kOtherUid), 0);
    const std::string tmp_dir = "/tmp/" + d.substr(d.rfind('/') + 1) + "-x";
    // Move the folder straight under /tmp (world-writable, sticky).
    ASSERT_EQ(rename(d.c_str(), tmp_dir.c_str()), 0);
    auto squat = CheckDaemonSocket(tmp_dir + "/kvtierd.sock");
    EXPECT_EQ(squat.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(squat.status().message(), HasSubstr("world-writable"));
    std::system(absl::StrCat("rm -rf '", tmp_dir, "'").c_str());
  }
  close(fd);
}

}  // namespace
}  // namespace kvtier::shm
