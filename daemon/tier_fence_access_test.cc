// Tests of who may act through TierCore's Fence RPC (tier_fence.cc,
// fence_registry.h), called directly with the credentials the kernel would
// report: a report or a release acts only in namespaces the session attached
// to (which the --namespace_acl let it), an instance is bound to the user
// (and pid namespace) of its processes, so another user presenting the same
// instance id gets an instance of its own, rows fenced across a restart go
// only to the processes that held rows before it, and nothing a client reads
// names another's instance, guesses a hold id or tells a bank's size.
// The same with real users and processes: tests/fence_test.cc.
#include <unistd.h>

#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "daemon/tier_core.h"
#include "daemon/tier_fence_test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvtier::daemon {
namespace {

using ::testing::HasSubstr;
using testing::kInstance;
using ::testing::Not;
using testing::Sleeper;
using testing::TierFenceTest;

// The victim's and another user's uids (only the daemon's record of them:
// no such users need to exist).
constexpr uid_t kVictimUid = 61001;
constexpr uid_t kOtherUid = 61002;

v1::FenceRequest ReportRows(const std::string& ns,
                            const std::vector<uint32_t>& rows, bool complete) {
  v1::FenceRequest req;
  v1::FenceItem* item = req.add_report();
  item->set_namespace_(ns);
  item->mutable_page_rows()->Assign(rows.begin(), rows.end());
  req.set_report_complete(complete);
  return req;
}

v1::FenceRequest Release(uint64_t hold) {
  v1::FenceRequest req;
  req.add_release(hold);
  return req;
}

bool Disjoint(const std::vector<uint32_t>& a,
              const google::protobuf::RepeatedField<uint32_t>& b) {
  const std::set<uint32_t> s(a.begin(), a.end());
  for (uint32_t r : b) {
    if (s.contains(r)) return false;
  }
  return true;
}

// Even a session of the hold's own instance and process cannot release it
// from a session that did not attach to its namespace.
TEST_F(TierFenceTest, AReleaseActsOnlyInNamespacesTheSessionAttachedTo) {
  Sleeper engine;
  const uint64_t s = Open(kInstance, engine.pid());
  const uint64_t ns = Attach(s);
  const uint64_t hold = FencedAbort(s, ns, 4);
  ASSERT_NE(hold, 0u);
  const uint64_t elsewhere = Open(kInstance, engine.pid());
  Attach(elsewhere, 16, "other");
  auto resp = Fence(elsewhere, Release(hold));
  ASSERT_TRUE(resp.ok()) << resp.status();
  EXPECT_EQ(resp->released(), 0u);
  EXPECT_EQ(Info().fenced_page_rows(), 4u);
  EXPECT_EQ(Free(Info()), 12u);
  // Attached, it may.
  Attach(elsewhere);
  resp = Fence(elsewhere, Release(hold));
  ASSERT_TRUE(resp.ok()) << resp.status();
  EXPECT_EQ(resp->released(), 1u);
  EXPECT_EQ(Free(Info()), 16u);
  ExpectInvariants();
}

// After a restart, the engine's own process, reconnected but attached to
// another namespace only, takes nothing out of the restart fence there, and
// a malformed item there is not validated against that namespace.
TEST_F(TierFenceTest, AReportActsOnlyInNamespacesTheSessionAttachedTo) {
  Sleeper engine;  // Forked first: it would inherit the state folder's lock.
  StartWithState();
  const uint64_t s = Open(kInstance, engine.pid());
  const uint64_t ns = Attach(s);
  auto r = Reserve(s, ns, 4);
  ASSERT_TRUE(r.ok()) << r.status();
  const std::vector<uint32_t> rows(r->page_rows().begin(),
                                   r->page_rows().end());
  Restart();
  EXPECT_EQ(Info().fenced_page_rows(), 4u);
  const uint64_t again = Open(kInstance, engine.pid());
  Attach(again, 16, "other");
  auto resp = Fence(again, ReportRows("ns", rows, /*complete=*/false));
  ASSERT_TRUE(resp.ok()) << resp.status();
  ASSERT_EQ(resp->holds_size(), 1);
  EXPECT_EQ(resp->holds(0), 0u);
  if (resp->holds(0) != 0) {
    ASSERT_TRUE(Fence(again, Release(resp->holds(0))).ok());
  }
  EXPECT_EQ(Info().fenced_page_rows(), 4u);
  EXPECT_EQ(Free(Info()), 12u);
  v1::FenceRequest odd;
  odd.add_report()->set_namespace_("ns");
  odd.mutable_report(0)->set_tp_rank(5);
  resp = Fence(again, odd);
  ASSERT_TRUE(resp.ok()) << resp.status();
  EXPECT_EQ(resp->holds(0), 0u);
  // Attached, it keeps its rows under a hold of its own.
  Attach(again);
  resp = Fence(again, ReportRows("ns", rows, /*complete=*/true));
  ASSERT_TRUE(resp.ok()) << resp.status();
  EXPECT_NE(resp->holds(0), 0u);
  EXPECT_EQ(Info().fenced_page_rows(), 4u);
  ExpectInvariants();
}

// A user the ACL keeps out of the namespace cannot attach, so neither its
// release (with the victim's instance id) nor its report acts there.
TEST_F(TierFenceTest, ASessionTheAclKeepsOutCannotFenceThere) {
  auto acl = NamespaceAcl::Parse(absl::StrCat("ns=uid:", kVictimUid));
  ASSERT_TRUE(acl.ok()) << acl.status();
  options_.namespace_acl = *acl;
  Start();
  Sleeper victim, thief;
  const uint64_t v = OpenAs(kInstance, Peer(victim.pid(), kVictimUid));
  const uint64_t ns = Attach(v);
  std::vector<uint32_t> rows;
  const uint64_t hold = FencedAbort(v, ns, 4, &rows);
  ASSERT_NE(hold, 0u);
  const uint64_t t = OpenAs(kInstance, Peer(thief.pid(), kOtherUid));
  EXPECT_EQ(TryAttach(t).status().code(), absl::StatusCode::kPermissionDenied);
  v1::FenceRequest both = ReportRows("ns", rows, /*complete=*/true);
  both.add_release(hold);
  auto resp = Fence(t, both);
  ASSERT_TRUE(resp.ok()) << resp.status();
  EXPECT_EQ(resp->released(), 0u);
  EXPECT_EQ(resp->holds(0), 0u);
  EXPECT_EQ(Info().fence_holds(), 1u);
  EXPECT_EQ(Info().fenced_page_rows(), 4u);
  ExpectInvariants();
}

// Instance ids are predictable (the vLLM connector derives one from
// engine_id): another user presenting the victim's gets an instance of its
// own. It cannot release the victim's hold, its report drops nothing of the
// victim's, and its open session does not keep the victim's instance alive.
TEST_F(TierFenceTest, AnotherUserPresentingTheSameInstanceIdGetsItsOwn) {
  Sleeper victim, thief;
  const uint64_t v = OpenAs(kInstance, Peer(victim.pid(), kVictimUid));
  const uint64_t ns = Attach(v);
  const uint64_t hold = FencedAbort(v, ns, 4);
  ASSERT_NE(hold, 0u);
  const uint64_t t = OpenAs(kInstance, Peer(thief.pid(), kOtherUid));
  Attach(t);
  auto resp = Fence(t, Release(hold));
  EXPECT_EQ(resp.status().code(), absl::StatusCode::kPermissionDenied)
      << resp.status();
  EXPECT_THAT(std::string(resp.status().message()),
              Not(HasSubstr(absl::BytesToHexString(kInstance))));
  v1::FenceRequest complete;
  complete.set_report_complete(true);
  ASSERT_TRUE(Fence(t, complete).ok());
  EXPECT_EQ(Info().fenced_page_rows(), 4u);
  // The victim's process is gone (and with it its session): its hold
  // goes, whoever else presents the id.
  victim.Kill();
  core_->CloseSession(v);
  EXPECT_EQ(core_->SweepFences(), 1u);
  EXPECT_EQ(Info().fenced_page_rows(), 0u);
  ExpectInvariants();
}

// The same user in another pid namespace (another container) is another
// instance too. Needs CAP_SYS_ADMIN for clone(CLONE_NEWPID).
TEST_F(TierFenceTest, TheSameUserInAnotherPidNamespaceGetsItsOwn) {
  if (geteuid() != 0) {
    const char* required = std::getenv("KVTIER_REQUIRE_USERS");
    if (required != nullptr && std::string(required) == "1") {
      FAIL() << "needs root for a pid namespace (KVTIER_REQUIRE_USERS=1)";
    }
    GTEST_SKIP() << "needs root for a pid namespace";
  }
  Sleeper victim;
  Sleeper contained(/*new_pid_namespace=*/true);
  ASSERT_GT(contained.pid(), 0) << "clone(CLONE_NEWPID) refused";
  const uint64_t v = Open(kInstance, victim.pid());
  const uint64_t ns = Attach(v);
  const uint64_t hold = FencedAbort(v, ns, 4);
  const uint64_t c = Open(kInstance, contained.pid());
  Attach(c);
  auto resp = Fence(c, Release(hold));
  EXPECT_EQ(resp.status().code(), absl::StatusCode::kPermissionDenied)
      << resp.status();
  EXPECT_EQ(Info().fenced_page_rows(), 4u);
  // A sibling in the victim's own namespace is the victim's instance.
  Sleeper sibling;
  const uint64_t same = Open(kInstance, sibling.pid());
  Attach(same);
  resp = Fence(same, Release(hold));
  ASSERT_TRUE(resp.ok()) << resp.status();
  EXPECT_EQ(resp->released(), 1u);
  ExpectInvariants();
}

// After a restart, another user's report of the victim's rows, even from
// a process that held rows in the namespace before the restart and
// presents the victim's instance id, never frees them: what it reported
// and released stays fenced until the victim reported and released it.
TEST_F(TierFenceTest, AnotherUserCannotFreeRowsOfTheRestartFence) {
  Sleeper victim, thief, newcomer;
  StartWithState();
  const uint64_t v = OpenAs(kInstance, Peer(victim.pid(), kVictimUid), 7);
  const uint64_t ns = Attach(v);
  auto r = Reserve(v, ns, 4);
  ASSERT_TRUE(r.ok()) << r.status();
  const std::vector<uint32_t> rows(r->page_rows().begin(),
                                   r->page_rows().end());
  Attach(OpenAs(kInstance, Peer(thief.pid(), kOtherUid), 9));
  Restart();
  ASSERT_EQ(Info().fenced_page_rows(), 4u);
  // The thief reconnects, reports the victim's rows, releases the hold.
  const uint64_t t = OpenAs(kInstance, Peer(thief.pid(), kOtherUid), 9);
  Attach(t);
  auto resp = Fence(t, ReportRows("ns", rows, /*complete=*/true));
  ASSERT_TRUE(resp.ok()) << resp.status();
  if (resp->holds(0) != 0) {
    auto released = Fence(t, Release(resp->holds(0)));
    ASSERT_TRUE(released.ok()) << released.status();
  }
  EXPECT_EQ(Info().fenced_page_rows(), 4u);
  EXPECT_EQ(Free(Info()), 12u);
  // A process of that user from after the restart gets nothing at all.
  const uint64_t n = OpenAs(kInstance, Peer(newcomer.pid(), kOtherUid), 9);
  Attach(n);
  resp = Fence(n, ReportRows("ns", rows, /*complete=*/true));
  ASSERT_TRUE(resp.ok()) << resp.status();
  EXPECT_EQ(resp->holds(0), 0u);
  // The victim's late writes reach only its rows: no one is handed them.
  auto all = Reserve(n, ns, 12);
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_TRUE(Disjoint(rows, all->page_rows()));
  EXPECT_EQ(Reserve(n, ns, 1).status().code(),
            absl::StatusCode::kResourceExhausted);
  // The victim reports them: they stay fenced after the restart fence
  // lifted, until it releases its hold.
  const uint64_t again = OpenAs(kInstance, Peer(victim.pid(), kVictimUid), 7);
  Attach(again);
  resp = Fence(again, ReportRows("ns", rows, /*complete=*/true));
  ASSERT_TRUE(resp.ok()) << resp.status();
  ASSERT_NE(resp->holds(0), 0u);
  core_->SweepFences();
  EXPECT_EQ(Info().restart_fence_processes(), 0u);
  EXPECT_EQ(Info().fenced_page_rows(), 4u);
  ExpectInvariants();
  auto released = Fence(again, Release(resp->holds(0)));
  ASSERT_TRUE(released.ok()) << released.status();
  EXPECT_EQ(released->released(), 1u);
  EXPECT_EQ(Info().fenced_page_rows(), 0u);
  EXPECT_EQ(Free(Info()), 4u);
  ExpectInvariants();
}

// What a refused allocation says about the restart fence names no
// instance id (an unseen engine's was printed in full).
TEST_F(TierFenceTest, ARefusalNamesNoInstanceId) {
  Sleeper other;
  StartWithState();
  const uint64_t unseen = Open(kInstance);  // No credentials: pid unseen.
  const uint64_t ns = Attach(unseen);
  ASSERT_TRUE(Reserve(unseen, ns, 4).ok());
  Restart();
  const uint64_t o = Open("", other.pid());
  Attach(o);
  auto refused = Reserve(o, ns, 16);
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted)
      << refused.status();
  EXPECT_THAT(refused.status().message(), HasSubstr("restart fence"));
  EXPECT_THAT(std::string(refused.status().message()),
              Not(HasSubstr(absl::BytesToHexString(kInstance))));
}

// Hold ids are capabilities: drawn at random, not counted.
TEST_F(TierFenceTest, HoldIdsAreNotSequential) {
  Sleeper engine;
  const uint64_t s = Open(kInstance, engine.pid());
  const uint64_t ns = Attach(s);
  std::vector<uint64_t> ids = {ns};
  for (int i = 0; i < 4; ++i) ids.push_back(FencedAbort(s, ns, 1));
  for (size_t i = 1; i < ids.size(); ++i) {
    ASSERT_NE(ids[i], 0u);
    for (size_t j = 0; j < i; ++j) {
      const uint64_t gap = ids[i] > ids[j] ? ids[i] - ids[j] : ids[j] - ids[i];
      EXPECT_GT(gap, uint64_t{1} << 20) << ids[i] << " near " << ids[j];
    }
  }
}

// A bad row is named, the bank's size is not.
TEST_F(TierFenceTest, ARowOutOfRangeIsRefusedWithoutTheBankSize) {
  Sleeper engine;
  const uint64_t s = Open(kInstance, engine.pid());
  Attach(s, 16);
  auto resp = Fence(s, ReportRows("ns", {40}, /*complete=*/true));
  EXPECT_EQ(resp.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(resp.status().message(), HasSubstr("report[0].page_rows"));
  EXPECT_THAT(std::string(resp.status().message()), Not(HasSubstr("16")));
  v1::FenceRequest snap;
  snap.add_report()->set_namespace_("ns");
  snap.mutable_report(0)->add_snapshot_rows(3);
  resp = Fence(s, snap);
  EXPECT_EQ(resp.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(resp.status().message(), HasSubstr("report[0].snapshot_rows"));
  EXPECT_THAT(std::string(resp.status().message()), Not(HasSubstr(" 0 rows")));
}

}  // namespace
}  // namespace kvtier::daemon
