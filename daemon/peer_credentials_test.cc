// Tests of peer credentials (SO_PEERCRED on a real socket pair) and of
// NamespaceAcl parsing and matching.
#include "daemon/peer_credentials.h"

#include <sys/socket.h>
#include <unistd.h>

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
  EXPECT_EQ(peer->groups.size(), groups.size());
  close(fds[0]);
  close(fds[1]);
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
