// Unit tests of TierCore's rights (tier_access.cc) as the engine socket's
// introspection and drop requests meet them: under a --namespace_acl, a
// session sees, lists and drops only the namespaces it may attach to;
// operators, everything.
#include <unistd.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "daemon/tier_core.h"
#include "daemon/tier_core_test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvtier::daemon {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr uid_t kTeamUid = 1001;

v1::Layout SmallLayout() {
  v1::Layout l;
  l.set_model("test-model");
  l.set_tokens_per_page(16);
  l.set_num_layers(1);
  auto* kv = l.add_page_banks();
  kv->set_name("kv");
  kv->set_row_bytes(256);
  return l;
}

class TierAccessTest : public TierCoreTest {
 protected:
  void Configure(TierOptions* o) override {
    o->default_namespace_bytes = 1 << 16;
    auto acl = NamespaceAcl::Parse("team_*=uid:1001");
    ASSERT_TRUE(acl.ok()) << acl.status();
    o->namespace_acl = *acl;
  }
  void SetUp() override {
    TierCoreTest::SetUp();
    v1::Capacity capacity;
    capacity.set_page_rows(8);
    for (const char* name : {"open", "team_a"}) {
      ASSERT_TRUE(core_->CreateNamespace(name, SmallLayout(), capacity).ok());
    }
  }

  // A session, its peer credentials bound to `uid` (none: unbound).
  uint64_t Session(std::optional<uid_t> uid) {
    auto id = core_->OpenSession(v1::Hello(), PeerInfo{});
    EXPECT_TRUE(id.ok()) << id.status();
    if (uid.has_value()) {
      PeerInfo peer;
      peer.pid = getpid();
      peer.uid = *uid;
      peer.gid = *uid;
      peer.verified = true;
      EXPECT_TRUE(core_->BindPeerCredentials(*id, peer).ok());
    }
    return *id;
  }

  // The namespaces Stats and ListNamespaces show `caller`, which agree.
  std::vector<std::string> Seen(const Caller& caller) {
    v1::StatsResponse stats;
    EXPECT_TRUE(core_->Stats(v1::StatsRequest(), &stats, caller).ok());
    std::vector<std::string> names;
    for (const auto& ns : stats.namespaces()) names.push_back(ns.name());
    v1::ListNamespacesResponse list;
    EXPECT_TRUE(
        core_->ListNamespaces(v1::ListNamespacesRequest(), &list, caller).ok());
    std::vector<std::string> listed;
    for (const auto& ns : list.namespaces()) listed.push_back(ns.name());
    EXPECT_EQ(names, listed);
    return names;
  }

  static Caller Engine(uint64_t session) { return Caller{false, session}; }
};

TEST_F(TierAccessTest, OperatorsSeeEveryNamespace) {
  EXPECT_THAT(Seen(Caller{}), ElementsAre("open", "team_a"));
}

TEST_F(TierAccessTest, EnginesSeeOnlyWhatTheyMayAttachTo) {
  EXPECT_THAT(Seen(Engine(Session(kTeamUid))), ElementsAre("open", "team_a"));
  EXPECT_THAT(Seen(Engine(Session(kTeamUid + 1))), ElementsAre("open"));
  EXPECT_THAT(Seen(Engine(Session(std::nullopt))), ElementsAre("open"));
  EXPECT_THAT(Seen(Engine(0)), ElementsAre("open"));  // No session at all.
}

TEST_F(TierAccessTest, TheRequestsSessionStandsInForTheCallers) {
  const uint64_t team = Session(kTeamUid);
  v1::StatsRequest req;
  req.set_session_id(team);
  v1::StatsResponse stats;
  ASSERT_TRUE(core_->Stats(req, &stats, Engine(0)).ok());
  EXPECT_EQ(stats.namespaces_size(), 2);
}

TEST_F(TierAccessTest, AnUnknownSessionSeesNothing) {
  const uint64_t gone = Session(kTeamUid);
  core_->CloseSession(gone);
  EXPECT_TRUE(Seen(Engine(gone)).empty());
  v1::StatsResponse stats;
  ASSERT_TRUE(core_->Stats(v1::StatsRequest(), &stats, Engine(gone)).ok());
  EXPECT_EQ(stats.sessions(), 0u);
}

TEST_F(TierAccessTest, ListPrefixesAndDropNeedTheRight) {
  const uint64_t other = Session(kTeamUid + 1);
  v1::ListPrefixesRequest list;
  list.set_namespace_("team_a");
  v1::ListPrefixesResponse prefixes;
  absl::Status s = core_->ListPrefixes(list, &prefixes, Engine(other));
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(s.message(), HasSubstr("uid 1002 (gid 1002) lacks the right to "
                                     "list namespace 'team_a'"));
  EXPECT_TRUE(
      core_->ListPrefixes(list, &prefixes, Engine(Session(kTeamUid))).ok());

  v1::DropRequest drop;
  drop.set_namespace_("team_a");
  v1::DropResponse dropped;
  s = core_->Drop(drop, &dropped, Engine(other));
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(s.message(), HasSubstr("right to drop"));
  s = core_->Drop(drop, &dropped, Engine(Session(std::nullopt)));
  EXPECT_THAT(s.message(), HasSubstr("a session without bound credentials"));
  EXPECT_THAT(Seen(Caller{}), ElementsAre("open", "team_a"));
  EXPECT_EQ(core_->CheckNamespaceRight(Engine(12345), "open", "list").code(),
            absl::StatusCode::kNotFound);
}

TEST_F(TierAccessTest, VerifyIsForOperators) {
  v1::VerifyResponse resp;
  EXPECT_EQ(core_->Verify(v1::VerifyRequest(), &resp, Engine(Session(kTeamUid)))
                .code(),
            absl::StatusCode::kPermissionDenied);
  ASSERT_TRUE(core_->Verify(v1::VerifyRequest(), &resp, Caller{}).ok());
  EXPECT_TRUE(resp.ok());
  EXPECT_EQ(resp.namespaces_checked(), 2u);
}

}  // namespace
}  // namespace kvtier::daemon
