// Tests of TierCore's fence (tier_fence.cc, tier_fence_holds.cc,
// fence_registry.h) and of the races and caps around it, called directly:
// holds left by sessions that end while their process lives, by aborts with
// queued work, the Fence RPC
// (reports, releases, bad input), process death through a real child, an
// RPC whose session closes between Resolve and the namespace lock (forced
// through the test hook), and the per-session caps. Who may report and
// release (attachment, ACL, instance bound to credentials):
// tier_fence_access_test.cc; the fixture: tier_fence_test_util.h.
#include <unistd.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "daemon/tier_core.h"
#include "daemon/tier_fence_test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvtier::daemon {
namespace {

using ::testing::HasSubstr;
using testing::kInstance;
using testing::kOther;
using testing::RandomHashes;
using testing::Sleeper;
using testing::TierFenceTest;

TEST_F(TierFenceTest, ASessionEndingWhileItsProcessLivesLeavesHolds) {
  Sleeper engine;
  const uint64_t s = Open(kInstance, engine.pid());
  const uint64_t ns = Attach(s);
  auto r = Reserve(s, ns, 4);
  ASSERT_TRUE(r.ok()) << r.status();
  core_->CloseSession(s);
  v1::NamespaceInfo n = Info();
  EXPECT_EQ(n.fence_holds(), 1u);
  EXPECT_EQ(n.fenced_page_rows(), 4u);
  EXPECT_EQ(n.banks(0).fenced_rows(), 4u);
  EXPECT_EQ(Free(n), 12u);
  ExpectInvariants();
  // Nothing frees it while the process lives...
  EXPECT_EQ(core_->SweepFences(), 0u);
  EXPECT_EQ(Info().fence_holds(), 1u);
  // ...and its death does.
  engine.Kill();
  EXPECT_EQ(core_->SweepFences(), 1u);
  EXPECT_EQ(Info().fence_holds(), 0u);
  EXPECT_EQ(Free(Info()), 16u);
  ExpectInvariants();
}

// A client without the protocol (an older libkvtier: no instance id, no
// fence version) never reports: what it held stays fenced until it exits,
// and no other session can release it.
TEST_F(TierFenceTest, AClientWithoutTheProtocolStaysFencedUntilItExits) {
  Sleeper engine;
  v1::Hello hello;
  hello.set_client_name("old-libkvtier");
  auto s = core_->OpenSession(hello, PeerInfo{});
  ASSERT_TRUE(s.ok());
  PeerInfo p;
  p.pid = engine.pid();
  p.uid = getuid();
  p.gid = getgid();
  p.verified = true;
  ASSERT_TRUE(core_->BindPeerCredentials(*s, p).ok());
  const uint64_t ns = Attach(*s);
  ASSERT_TRUE(Reserve(*s, ns, 4).ok());
  core_->CloseSession(*s);
  EXPECT_EQ(Info().fenced_page_rows(), 4u);
  // Another session of the same process reports: not the old client's
  // instance, so nothing of it is freed.
  const uint64_t other = Open(kInstance, engine.pid());
  Attach(other);
  v1::FenceRequest report;
  report.set_session_id(other);
  report.set_report_complete(true);
  v1::FenceResponse resp;
  ASSERT_TRUE(core_->Fence(report, &resp).ok());
  EXPECT_EQ(core_->SweepFences(), 0u);
  EXPECT_EQ(Info().fenced_page_rows(), 4u);
  engine.Kill();
  core_->CloseSession(other);
  EXPECT_EQ(core_->SweepFences(), 1u);
  EXPECT_EQ(Info().fenced_page_rows(), 0u);
  ExpectInvariants();
}

// Two connections of one process and instance (vLLM's scheduler and
// worker in one process): each reports for itself, so one's report never
// frees what the other's ended session left.
TEST_F(TierFenceTest, EachConnectionReportsForItself) {
  Sleeper engine;
  auto open = [&](uint64_t connection) {
    v1::Hello hello;
    hello.set_instance_id(kInstance);
    hello.set_fence_version(1);
    hello.set_connection_id(connection);
    auto id = core_->OpenSession(hello, PeerInfo{});
    EXPECT_TRUE(id.ok());
    PeerInfo p;
    p.pid = engine.pid();
    p.uid = getuid();
    p.gid = getgid();
    p.verified = true;
    EXPECT_TRUE(core_->BindPeerCredentials(*id, p).ok());
    return *id;
  };
  const uint64_t scheduler = open(1), worker = open(2);
  const uint64_t ns = Attach(scheduler);
  Attach(worker);
  ASSERT_TRUE(Reserve(scheduler, ns, 2).ok());
  ASSERT_TRUE(Reserve(worker, ns, 3).ok());
  core_->CloseSession(scheduler);
  core_->CloseSession(worker);
  EXPECT_EQ(Info().fence_holds(), 2u);
  // The scheduler reconnects and holds nothing: only its hold goes.
  const uint64_t again = open(1);
  Attach(again);
  v1::FenceRequest report;
  report.set_session_id(again);
  report.set_report_complete(true);
  v1::FenceResponse resp;
  ASSERT_TRUE(core_->Fence(report, &resp).ok());
  EXPECT_EQ(Info().fence_holds(), 1u);
  EXPECT_EQ(Info().fenced_page_rows(), 3u);
  ExpectInvariants();
}

// A lease's rows may be read by another process of the instance: the
// scheduler's session ending (even with its process gone) keeps them while
// the worker's process lives.
TEST_F(TierFenceTest, AnInstancesOtherProcessKeepsTheFence) {
  Sleeper scheduler_proc, worker_proc;
  const uint64_t scheduler = Open(kInstance, scheduler_proc.pid());
  const uint64_t worker = Open(kInstance, worker_proc.pid());
  const uint64_t ns = Attach(scheduler);
  Attach(worker);
  const std::string hashes = RandomHashes(4, 9);
  auto put = Reserve(scheduler, ns, 4);
  ASSERT_TRUE(put.ok());
  ASSERT_TRUE(Commit(scheduler, ns, put->reservation_id(), hashes).ok());
  ASSERT_TRUE(Lookup(scheduler, ns, hashes, /*pin=*/true).ok());
  scheduler_proc.Kill();
  core_->CloseSession(scheduler);
  EXPECT_EQ(Info().fence_holds(), 1u);
  EXPECT_EQ(core_->SweepFences(), 0u);
  EXPECT_EQ(Reserve(worker, ns, 16).status().code(),
            absl::StatusCode::kResourceExhausted);
  worker_proc.Kill();
  core_->CloseSession(worker);
  EXPECT_EQ(core_->SweepFences(), 1u);
  EXPECT_EQ(Info().fence_holds(), 0u);
  ExpectInvariants();
}

TEST_F(TierFenceTest, AQuiescentGoodbyeFreesAtOnce) {
  Sleeper engine;
  const uint64_t s = Open(kInstance, engine.pid());
  const uint64_t ns = Attach(s);
  ASSERT_TRUE(Reserve(s, ns, 4).ok());
  core_->SessionGoodbye(s, /*quiescent=*/true);
  core_->CloseSession(s);
  EXPECT_EQ(Info().fence_holds(), 0u);
  EXPECT_EQ(Free(Info()), 16u);
}

TEST_F(TierFenceTest, AnUnseenPidIsHeldForThePolicysTime) {
  options_.fence.unseen_pid_hold = absl::Milliseconds(50);
  Start();
  const uint64_t s = Open(kInstance);  // No credentials: pid unseen.
  const uint64_t ns = Attach(s);
  ASSERT_TRUE(Reserve(s, ns, 4).ok());
  v1::StatsResponse stats;
  ASSERT_TRUE(core_->Stats({}, &stats).ok());
  EXPECT_EQ(stats.unseen_pid_processes(), 1u);
  core_->CloseSession(s);
  EXPECT_EQ(core_->SweepFences(), 0u);
  EXPECT_EQ(Info().fence_holds(), 1u);
  absl::SleepFor(absl::Milliseconds(60));
  EXPECT_EQ(core_->SweepFences(), 1u);
  EXPECT_EQ(Free(Info()), 16u);
}

TEST_F(TierFenceTest, AFencedAbortIsReleasedOnlyByItsInstance) {
  Sleeper engine;
  const uint64_t s = Open(kInstance, engine.pid());
  const uint64_t ns = Attach(s);
  auto r = Reserve(s, ns, 4);
  ASSERT_TRUE(r.ok());
  v1::AbortRequest abort;
  abort.set_session_id(s);
  abort.set_namespace_id(ns);
  abort.set_reservation_id(r->reservation_id());
  abort.set_fenced(true);
  v1::AbortResponse aborted;
  ASSERT_TRUE(core_->Abort(abort, &aborted).ok());
  ASSERT_NE(aborted.fence_hold(), 0u);
  EXPECT_EQ(Info().reservations(), 0u);
  EXPECT_EQ(Info().fenced_page_rows(), 4u);
  ExpectInvariants();
  // Another instance (attached to the namespace: elsewhere the hold is
  // unknown to it) may not release it; nothing changes.
  const uint64_t thief = Open(kOther, engine.pid());
  Attach(thief);
  v1::FenceRequest steal;
  steal.set_session_id(thief);
  steal.add_release(aborted.fence_hold());
  v1::FenceResponse resp;
  absl::Status denied = core_->Fence(steal, &resp);
  EXPECT_EQ(denied.code(), absl::StatusCode::kPermissionDenied) << denied;
  EXPECT_EQ(Info().fenced_page_rows(), 4u);
  // Its own instance may, from any of its sessions attached there.
  const uint64_t sibling = Open(kInstance, engine.pid());
  Attach(sibling);
  v1::FenceRequest release;
  release.set_session_id(sibling);
  release.add_release(aborted.fence_hold());
  ASSERT_TRUE(core_->Fence(release, &resp).ok());
  EXPECT_EQ(resp.released(), 1u);
  EXPECT_EQ(Info().fenced_page_rows(), 0u);
  EXPECT_EQ(Free(Info()), 16u);
  ExpectInvariants();
}

TEST_F(TierFenceTest, AReportKeepsWhatIsHeldAndFreesTheRest) {
  Sleeper engine;
  const uint64_t s = Open(kInstance, engine.pid());
  const uint64_t ns = Attach(s);
  auto kept = Reserve(s, ns, 3);
  auto gone = Reserve(s, ns, 2);
  ASSERT_TRUE(kept.ok() && gone.ok());
  const std::string hashes = RandomHashes(4, 1);
  auto put = Reserve(s, ns, 4);
  ASSERT_TRUE(put.ok());
  ASSERT_TRUE(Commit(s, ns, put->reservation_id(), hashes).ok());
  auto lease = Lookup(s, ns, hashes, /*pin=*/true);
  ASSERT_TRUE(lease.ok());
  core_->CloseSession(s);  // The stream broke; the process lives.
  EXPECT_EQ(Info().fence_holds(), 3u);
  // The process reconnects and reports the first reservation and the
  // lease, not the second reservation.
  const uint64_t again = Open(kInstance, engine.pid());
  Attach(again);
  v1::FenceRequest report;
  report.set_session_id(again);
  report.set_report_complete(true);
  v1::FenceItem* r1 = report.add_report();
  r1->set_namespace_("ns");
  r1->mutable_page_rows()->Assign(kept->page_rows().begin(),
                                  kept->page_rows().end());
  v1::FenceItem* l = report.add_report();
  l->set_namespace_("ns");
  l->mutable_page_rows()->Assign(lease->rows().begin(), lease->rows().end());
  l->set_lease_hash(hashes.substr(3 * 32, 32));
  v1::FenceResponse resp;
  ASSERT_TRUE(core_->Fence(report, &resp).ok());
  ASSERT_EQ(resp.holds_size(), 2);
  EXPECT_NE(resp.holds(0), 0u);
  EXPECT_NE(resp.holds(1), 0u);
  v1::NamespaceInfo n = Info();
  EXPECT_EQ(n.fence_holds(), 2u);
  EXPECT_EQ(n.fenced_page_rows(), 3u);
  ExpectInvariants();
  // The pinned prefix stays while its hold does.
  auto all = Reserve(again, ns, 16 - 3);
  EXPECT_EQ(all.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(all.status().message(), HasSubstr("fence holds"));
  v1::FenceRequest release;
  release.set_session_id(again);
  release.add_release(resp.holds(0));
  release.add_release(resp.holds(1));
  ASSERT_TRUE(core_->Fence(release, &resp).ok());
  EXPECT_EQ(resp.released(), 2u);
  EXPECT_TRUE(Reserve(again, ns, 16 - 3).ok());
  ExpectInvariants();
}

TEST_F(TierFenceTest, AMalformedReportChangesNothing) {
  Sleeper engine;
  const uint64_t s = Open(kInstance, engine.pid());
  Attach(s);
  const v1::NamespaceInfo before = Info();
  v1::FenceResponse resp;
  auto expect_invalid = [&](v1::FenceRequest req, const char* field) {
    req.set_session_id(s);
    req.set_report_complete(true);
    absl::Status st = core_->Fence(req, &resp);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_THAT(st.message(), HasSubstr(field));
    EXPECT_EQ(Info().SerializeAsString(), before.SerializeAsString());
  };
  v1::FenceRequest bad_rank;
  bad_rank.add_report()->set_namespace_("ns");
  bad_rank.mutable_report(0)->set_tp_rank(3);
  expect_invalid(bad_rank, "report[0].tp_rank");
  v1::FenceRequest bad_row;
  bad_row.add_report()->set_namespace_("ns");
  bad_row.add_report()->set_namespace_("ns");
  bad_row.mutable_report(1)->add_page_rows(16);
  expect_invalid(bad_row, "report[1].page_rows");
  v1::FenceRequest bad_hash;
  bad_hash.add_report()->set_namespace_("ns");
  bad_hash.mutable_report(0)->set_lease_hash("short");
  expect_invalid(bad_hash, "report[0].lease_hash");
  v1::FenceRequest unknown;
  unknown.set_session_id(12345);
  EXPECT_EQ(core_->Fence(unknown, &resp).code(), absl::StatusCode::kNotFound);
  v1::Hello bad_hello;
  bad_hello.set_instance_id("short");
  auto refused = core_->OpenSession(bad_hello, PeerInfo{});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(), HasSubstr("hello.instance_id"));
}

// Item 2: an RPC in flight when its session closes leaves nothing behind.
// The hook closes the session exactly between Resolve and the namespace
// lock, the window a real race would have to hit.
TEST_F(TierFenceTest, AReserveRacingItsSessionsCloseLeavesNoReservation) {
  const uint64_t s = Open(kInstance);
  const uint64_t ns = Attach(s);
  bool closed = false;
  core_->SetTestHook([&](const char* point) {
    if (!closed && std::string(point) == "reserve:resolved") {
      closed = true;
      core_->SessionGoodbye(s, true);
      core_->CloseSession(s);
    }
  });
  auto r = Reserve(s, ns, 4);
  EXPECT_TRUE(closed);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound) << r.status();
  EXPECT_EQ(Info().reservations(), 0u);
  EXPECT_EQ(Free(Info()), 16u);
  ExpectInvariants();
}

TEST_F(TierFenceTest, APinnedLookupRacingItsSessionsCloseLeavesNoPin) {
  const uint64_t writer = Open();
  const uint64_t ns = Attach(writer);
  const std::string hashes = RandomHashes(4, 2);
  auto put = Reserve(writer, ns, 4);
  ASSERT_TRUE(put.ok());
  ASSERT_TRUE(Commit(writer, ns, put->reservation_id(), hashes).ok());
  const uint64_t s = Open(kInstance);
  Attach(s);
  bool closed = false;
  core_->SetTestHook([&](const char* point) {
    if (!closed && std::string(point) == "lookup:resolved") {
      closed = true;
      core_->SessionGoodbye(s, true);
      core_->CloseSession(s);
    }
  });
  auto l = Lookup(s, ns, hashes, /*pin=*/true);
  EXPECT_TRUE(closed);
  EXPECT_EQ(l.status().code(), absl::StatusCode::kNotFound) << l.status();
  EXPECT_EQ(Info().leases(), 0u);
  ExpectInvariants();
  // Nothing pins the prefix: the whole bank can be reserved.
  EXPECT_TRUE(Reserve(writer, ns, 16).ok());
}

TEST_F(TierFenceTest, PerSessionCapsRefuseBeforeAnythingChanges) {
  options_.max_session_reservations = 2;
  options_.max_session_leases = 1;
  options_.max_session_reserved_rows = 6;
  Start();
  const uint64_t s = Open();
  const uint64_t ns = Attach(s);
  auto first = Reserve(s, ns, 2);
  ASSERT_TRUE(first.ok());
  auto rows = Reserve(s, ns, 5);
  EXPECT_EQ(rows.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(rows.status().message(),
              HasSubstr("--max_session_reserved_rows"));
  ASSERT_TRUE(Reserve(s, ns, 2).ok());
  auto count = Reserve(s, ns, 1);
  EXPECT_EQ(count.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(count.status().message(),
              HasSubstr("--max_session_reservations"));
  EXPECT_EQ(Info().reservations(), 2u);
  EXPECT_EQ(Free(Info()), 12u);
  // Another session is not charged for this one's.
  const uint64_t other = Open();
  Attach(other);
  ASSERT_TRUE(Reserve(other, ns, 1).ok());
  // Leases.
  const std::string hashes = RandomHashes(2, 3);
  ASSERT_TRUE(Commit(s, ns, first->reservation_id(), hashes).ok());
  ASSERT_TRUE(Lookup(s, ns, hashes, true).ok());
  auto second = Lookup(s, ns, hashes, true);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(second.status().message(), HasSubstr("--max_session_leases"));
  EXPECT_EQ(Info().leases(), 1u);
  // Committing gave the reservation's count back.
  EXPECT_TRUE(Reserve(s, ns, 1).ok());
  ExpectInvariants();
}

}  // namespace
}  // namespace kvtier::daemon
