// StagedSocket without other users: the path stays absent until Publish,
// which sets the mode first and moves the listening socket whole; left
// folders are removed, other files refused, nothing is replaced. (Against a
// real group member racing kvtierd's start: tests/socket_birth_test.)
//
// Thread-safety: single-threaded test.
#include "daemon/socket_staging.h"

#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvtier::daemon {
namespace {

using ::testing::HasSubstr;

// A listening unix socket bound at `path`; -1 on failure.
int Listen(const std::string& path) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::listen(fd, 8) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

bool Connects(const std::string& path) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  const bool ok =
      ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  ::close(fd);
  return ok;
}

class SocketStagingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kvtier-staging-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  std::string dir_;
};

TEST_F(SocketStagingTest, PathAppearsOnlyFinishedAndKeepsListening) {
  const std::string path = dir_ + "/d.sock";
  auto staged = StagedSocket::Create(path, "--socket");
  ASSERT_TRUE(staged.ok()) << staged.status();
  EXPECT_EQ(staged->bind_path(), dir_ + "/.d.sock.new/s");
  struct stat st;
  ASSERT_EQ(lstat((dir_ + "/.d.sock.new").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  const int fd = Listen(staged->bind_path());
  ASSERT_GE(fd, 0);
  EXPECT_NE(lstat(path.c_str(), &st), 0) << "published before Publish";
  ASSERT_TRUE(staged->Publish(static_cast<gid_t>(-1), 0600).ok());
  ASSERT_EQ(lstat(path.c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_TRUE(Connects(path)) << "the listener moved with the file";
  EXPECT_NE(lstat((dir_ + "/.d.sock.new").c_str(), &st), 0);
  ::close(fd);
}

TEST_F(SocketStagingTest, UnpublishedSocketIsRemovedWithItsFolder) {
  {
    auto staged = StagedSocket::Create(dir_ + "/d.sock", "--socket");
    ASSERT_TRUE(staged.ok()) << staged.status();
    const int fd = Listen(staged->bind_path());
    ASSERT_GE(fd, 0);
    ::close(fd);
  }
  EXPECT_TRUE(std::filesystem::is_empty(dir_));
}

TEST_F(SocketStagingTest, AFolderLeftByAKilledDaemonIsReplaced) {
  const std::string left = dir_ + "/.d.sock.new";
  ASSERT_EQ(mkdir(left.c_str(), 0700), 0);
  const int fd = Listen(left + "/s");
  ASSERT_GE(fd, 0);
  ::close(fd);
  auto staged = StagedSocket::Create(dir_ + "/d.sock", "--socket");
  ASSERT_TRUE(staged.ok()) << staged.status();
  EXPECT_TRUE(std::filesystem::is_empty(left));
}

TEST_F(SocketStagingTest, SomethingElseInTheWayIsRefused) {
  const std::string left = dir_ + "/.d.sock.new";
  ASSERT_EQ(mkdir(left.c_str(), 0700), 0);
  ASSERT_EQ(mkdir((left + "/other").c_str(), 0700), 0);
  auto staged = StagedSocket::Create(dir_ + "/d.sock", "--admin_socket");
  ASSERT_FALSE(staged.ok());
  EXPECT_THAT(staged.status().message(), HasSubstr("--admin_socket"));
  EXPECT_TRUE(std::filesystem::exists(left + "/other"));
}

TEST_F(SocketStagingTest, NothingAtThePathIsReplaced) {
  const std::string path = dir_ + "/d.sock";
  const int other = Listen(path);
  ASSERT_GE(other, 0);
  auto staged = StagedSocket::Create(path, "--socket");
  ASSERT_TRUE(staged.ok()) << staged.status();
  const int fd = Listen(staged->bind_path());
  ASSERT_GE(fd, 0);
  const absl::Status s = staged->Publish(static_cast<gid_t>(-1), 0600);
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("File exists"));
  ::close(fd);
  ::close(other);
}

TEST_F(SocketStagingTest, APathTooLongToStageIsRefused) {
  // Fits a sockaddr_un itself, but not once staged (7 bytes longer).
  const std::string path = dir_ + "/" + std::string(103 - dir_.size(), 'x');
  ASSERT_LT(path.size(), sizeof(sockaddr_un::sun_path));
  auto staged = StagedSocket::Create(path, "--socket");
  ASSERT_FALSE(staged.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(staged.status()));
  EXPECT_TRUE(std::filesystem::is_empty(dir_));
}

}  // namespace
}  // namespace kvtier::daemon
