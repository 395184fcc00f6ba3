// Tests of peer credentials (SO_PEERCRED and SO_PEERGROUPS on real sockets,
// with forked children that change their groups when root) and of
// NamespaceAcl parsing and matching.
#include "daemon/peer_credentials.h"

#include <grp.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvtier::daemon {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(PeerCredentialsTest, ReadsTheKernelsRecordOfTheOtherEnd) {
  int fds[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  auto peer = ReadPeerCredentials(fds[0]);
  ASSERT_TRUE(peer.ok()) << peer.status();
  EXPECT_TRUE(peer->verified);
  EXPECT_EQ(peer->pid, getpid());
  EXPECT_EQ(peer->uid, getuid());
  EXPECT_EQ(peer->gid, getgid());
  std::vector<gid_t> groups(getgroups(0, nullptr));
  ASSERT_EQ(getgroups(static_cast<int>(groups.size()), groups.data()),
            static_cast<int>(groups.size()));
  std::sort(groups.begin(), groups.end());
  groups.erase(std::unique(groups.begin(), groups.end()), groups.end());
  std::vector<gid_t> got = peer->groups;
  got.erase(std::unique(got.begin(), got.end()), got.end());
  EXPECT_EQ(got, groups);
  auto direct = ReadPeerGroups(fds[0]);
  if (!absl::IsUnimplemented(direct.status())) {  // Linux >= 4.13.
    ASSERT_TRUE(direct.ok()) << direct.status();
    EXPECT_EQ(*direct, peer->groups);
  }
  close(fds[0]);
  close(fds[1]);
}

// More groups than ReadPeerGroups' first guess: the ERANGE path.
TEST(PeerCredentialsTest, ReadsManyGroups) {
  if (getuid() != 0) GTEST_SKIP() << "needs root (setgroups)";
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    std::vector<gid_t> many;
    for (gid_t g = 50000; g < 50040; ++g) many.push_back(g);
    if (setgroups(many.size(), many.data()) != 0) _exit(1);
    int fds[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0) _exit(2);
    auto groups = ReadPeerGroups(fds[0]);
    if (absl::IsUnimplemented(groups.status())) _exit(0);
    _exit(groups.ok() && *groups == many ? 0 : 3);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

// The groups are the kernel's record at connect(2), not what the peer holds
// by the time the daemon looks (the /proc/<pid>/status race: a pid reused, or
// groups dropped or gained after connecting).
TEST(PeerCredentialsTest, GroupsAreThoseAtConnect) {
  if (getuid() != 0) GTEST_SKIP() << "needs root (setgroups)";
  {
    int probe[2];
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, probe), 0);
    const bool unsupported =
        absl::IsUnimplemented(ReadPeerGroups(probe[0]).status());
    close(probe[0]);
    close(probe[1]);
    if (unsupported) GTEST_SKIP() << "kernel without SO_PEERGROUPS";
  }
  const std::string path =
      absl::StrCat(::testing::TempDir(), "/peer_groups.", getpid(), ".sock");
  unlink(path.c_str());
  const int listener = socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(listener, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  ASSERT_LT(path.size(), sizeof(addr.sun_path));
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  ASSERT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)),
            0);
  ASSERT_EQ(listen(listener, 1), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    const gid_t at_connect[] = {51001, 51002};
    const gid_t after[] = {51003};
    const int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    if (fd < 0 || setgroups(2, at_connect) != 0 ||
        connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        setgroups(1, after) != 0 || write(fd, "x", 1) != 1) {
      _exit(1);
    }
    char c;
    (void)!read(fd, &c, 1);  // Until the parent has looked.
    _exit(0);
  }
  const int conn = accept(listener, nullptr, nullptr);
  ASSERT_GE(conn, 0);
  char c;
  ASSERT_EQ(read(conn, &c, 1), 1);  // The child has changed its groups.
  auto peer = ReadPeerCredentials(conn);
  ASSERT_TRUE(peer.ok()) << peer.status();
  EXPECT_EQ(peer->pid, child);
  EXPECT_THAT(peer->groups, ElementsAre(51001u, 51002u));
  EXPECT_TRUE(peer->InGroup(51001));
  EXPECT_FALSE(peer->InGroup(51003));
  close(conn);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  close(listener);
  unlink(path.c_str());
}

TEST(PeerCredentialsTest, NotASocketIsAnError) {
  int p[2];
  ASSERT_EQ(pipe(p), 0);
  EXPECT_EQ(ReadPeerCredentials(p[0]).status().code(),
            absl::StatusCode::kInternal);
  close(p[0]);
  close(p[1]);
}

TEST(PeerCredentialsTest, ResolvesNamesAndNumbers) {
  auto root = ResolveGroup("root", "--group");
  ASSERT_TRUE(root.ok()) << root.status();
  EXPECT_EQ(*root, 0u);
  EXPECT_EQ(*ResolveGroup("4242", "--group"), 4242u);
  auto missing = ResolveGroup("no-such-group-kvtier", "--group");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("--group"));
  EXPECT_EQ(*ResolveUser("root", "x"), 0u);
  EXPECT_EQ(ResolveUser("no-such-user-kvtier", "x").status().code(),
            absl::StatusCode::kNotFound);
}

TEST(NamespaceAclTest, ParsesEntriesInOrder) {
  auto acl = NamespaceAcl::Parse(
      "llama=uid:1001+gid:2000+user:root;team-a.*=group:root; *=uid:7");
  ASSERT_TRUE(acl.ok()) << acl.status();
  ASSERT_EQ(acl->entries().size(), 3u);
  EXPECT_EQ(acl->entries()[0].pattern, "llama");
  EXPECT_THAT(acl->entries()[0].uids, ElementsAre(1001u, 0u));
  EXPECT_THAT(acl->entries()[0].gids, ElementsAre(2000u));
  EXPECT_EQ(acl->entries()[0].segment_group(), 2000u);
  EXPECT_EQ(acl->entries()[1].pattern, "team-a.*");
  EXPECT_THAT(acl->entries()[1].gids, ElementsAre(0u));
  EXPECT_EQ(acl->entries()[2].pattern, "*");
  EXPECT_FALSE(acl->entries()[2].segment_group().has_value());

  EXPECT_EQ(acl->Find("llama")->pattern, "llama");
  EXPECT_EQ(acl->Find("team-a.x")->pattern, "team-a.*");
  EXPECT_EQ(acl->Find("team-a.")->pattern, "team-a.*");
  // Not a prefix match of "llama": exact names are exact.
  EXPECT_EQ(acl->Find("llama2")->pattern, "*");
  EXPECT_TRUE(NamespaceAcl::Parse("")->empty());
}

TEST(NamespaceAclTest, BadSpecsNameTheEntry) {
  for (const char* bad :
       {"llama", "llama=", "llama=uid", "llama=uid:x", "llama=gid:-1",
        "llama=team:1", "a/b=uid:1", "=uid:1", "llama=uid:1+",
        "x=user:no-such-user-kvtier", "x=group:no-such-group-kvtier"}) {
    auto acl = NamespaceAcl::Parse(bad);
    EXPECT_FALSE(acl.ok()) << bad;
    EXPECT_THAT(std::string(acl.status().message()),
                HasSubstr("--namespace_acl"))
        << bad;
  }
}

TEST(NamespaceAclTest, AllowsListedUidsAndGroupMembersOnlyWhenVerified) {
  auto acl = NamespaceAcl::Parse("ns=uid:1001+gid:2000");
  ASSERT_TRUE(acl.ok());
  const NamespaceAclEntry& e = *acl->Find("ns");
  PeerInfo p;
  p.verified = true;
  p.uid = 1001;
  p.gid = 1;
  EXPECT_TRUE(e.Allows(p));
  p.uid = 1002;
  EXPECT_FALSE(e.Allows(p));
  p.gid = 2000;  // Primary group.
  EXPECT_TRUE(e.Allows(p));
  p.gid = 1;
  p.groups = {5, 2000};  // Supplementary group.
  EXPECT_TRUE(e.Allows(p));
  p.verified = false;  // What a client claims counts for nothing.
  EXPECT_FALSE(e.Allows(p));
}

}  // namespace
}  // namespace kvtier::daemon
