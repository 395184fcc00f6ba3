// Tests of TierCore: every RPC's semantics and its bad input, called directly
// (no transport). Each bad-input case asserts the code, a message naming the
// field, and that the daemon's state did not change.
#include "daemon/tier_core.h"

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <random>

#include "absl/strings/str_cat.h"
#include "daemon/tier_core_test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvtier::daemon {
namespace {

using ::testing::HasSubstr;

TEST_F(TierCoreTest, AttachCreatesBanksThenOpensThem) {
  const uint64_t s = Open();
  v1::AttachResponse a = Attach(s, "ns", AttentionLayout());
  EXPECT_TRUE(a.created());
  ASSERT_EQ(a.segments_size(), 2);
  EXPECT_EQ(a.segments(0).bank(), "kv");
  EXPECT_EQ(a.segments(1).bank(), "scale");
  EXPECT_EQ(a.segments(1).row_stride() % 16, 0u);
  EXPECT_GE(a.segments(1).row_stride(), 100u);
  EXPECT_EQ(a.page_rows(), 64u);
  EXPECT_EQ(a.hash_bytes(), 32u);
  EXPECT_EQ(a.hash_seed().size(), 32u);
  EXPECT_TRUE(std::filesystem::exists(a.segments(0).path()));

  const uint64_t s2 = Open();
  v1::AttachResponse b = Attach(s2, "ns", AttentionLayout());
  EXPECT_FALSE(b.created());
  EXPECT_EQ(b.namespace_id(), a.namespace_id());
  EXPECT_EQ(b.hash_seed(), a.hash_seed());
  EXPECT_TRUE(core_->CheckInvariants().ok());
}

TEST_F(TierCoreTest, LayoutMismatchIsAnErrorAndChangesNothing) {
  const uint64_t s = Open();
  Attach(s, "ns", AttentionLayout());
  const std::string before = State();
  v1::AttachRequest req;
  req.set_session_id(s);
  req.set_namespace_("ns");
  *req.mutable_layout() = AttentionLayout();
  req.mutable_layout()->set_tokens_per_page(32);
  v1::AttachResponse resp;
  absl::Status st = core_->Attach(req, &resp);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(st.message()), HasSubstr("tokens_per_page"));
  EXPECT_EQ(State(), before);
}

TEST_F(TierCoreTest, ReserveCommitLookupRoundTrip) {
  const uint64_t s = Open();
  v1::AttachResponse a = Attach(s, "ns", AttentionLayout());
  const std::string hashes = RandomHashes(10, 32, 1);
  auto r = Reserve(s, a.namespace_id(), 10);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->page_rows_size(), 10);
  // Not visible before commit.
  EXPECT_EQ(Lookup(s, a.namespace_id(), hashes).matched_pages(), 0u);
  ASSERT_TRUE(
      Commit(s, a.namespace_id(), r->reservation_id(), "", hashes).ok());
  v1::LookupResponse l = Lookup(s, a.namespace_id(), hashes);
  EXPECT_EQ(l.matched_pages(), 10u);
  EXPECT_EQ(l.usable_pages(), 10u);
  ASSERT_EQ(l.rows_size(), 10);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(l.rows(i), r->page_rows(i));
  // A longer query matches the stored prefix only.
  const std::string longer = hashes + RandomHashes(5, 32, 2);
  EXPECT_EQ(Lookup(s, a.namespace_id(), longer).matched_pages(), 10u);
  // A divergent query matches up to the divergence.
  std::string diverged = hashes;
  diverged[4 * 32] ^= 1;
  EXPECT_EQ(Lookup(s, a.namespace_id(), diverged).matched_pages(), 4u);
  EXPECT_TRUE(core_->CheckInvariants().ok());
}

TEST_F(TierCoreTest, ChildCommitNeedsItsParent) {
  const uint64_t s = Open();
  v1::AttachResponse a = Attach(s, "ns", AttentionLayout());
  const std::string hashes = RandomHashes(6, 32, 3);
  auto r1 = Reserve(s, a.namespace_id(), 3);
  ASSERT_TRUE(r1.ok());
  ASSERT_TRUE(Commit(s, a.namespace_id(), r1->reservation_id(), "",
                     hashes.substr(0, 96))
                  .ok());
  auto r2 = Reserve(s, a.namespace_id(), 3);
  ASSERT_TRUE(r2.ok());
  const std::string before = State();
  absl::Status missing = Commit(s, a.namespace_id(), r2->reservation_id(),
                                RandomHashes(1, 32, 99), hashes.substr(96));
  EXPECT_EQ(missing.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(State(), before);
  ASSERT_TRUE(Commit(s, a.namespace_id(), r2->reservation_id(),
                     HashAt(hashes, 2, 32), hashes.substr(96))
                  .ok());
  EXPECT_EQ(Lookup(s, a.namespace_id(), hashes).matched_pages(), 6u);
}

TEST_F(TierCoreTest, DuplicateCommitDeduplicates) {
  const uint64_t s = Open();
  v1::AttachResponse a = Attach(s, "ns", AttentionLayout());
  const std::string hashes = RandomHashes(4, 32, 4);
  for (int round = 0; round < 2; ++round) {
    auto r = Reserve(s, a.namespace_id(), 4);
    ASSERT_TRUE(r.ok());
    v1::CommitRequest req;
    req.set_session_id(s);
    req.set_namespace_id(a.namespace_id());
    req.set_reservation_id(r->reservation_id());
    req.set_hashes(hashes);
    v1::CommitResponse resp;
    ASSERT_TRUE(core_->Commit(req, &resp).ok());
    EXPECT_EQ(resp.committed_pages(), round == 0 ? 4u : 0u);
    EXPECT_EQ(resp.deduplicated_pages(), round == 0 ? 0u : 4u);
  }
  v1::StatsResponse stats;
  ASSERT_TRUE(core_->Stats({}, &stats).ok());
  EXPECT_EQ(stats.namespaces(0).banks(0).used_rows(), 4u);
  EXPECT_EQ(stats.namespaces(0).banks(0).free_rows(), 60u);
  EXPECT_TRUE(core_->CheckInvariants().ok());
}

TEST_F(TierCoreTest, SessionCloseReturnsReservationsAndPins) {
  const uint64_t owner = Open();
  v1::AttachResponse a = Attach(owner, "ns", AttentionLayout(), 0, 16);
  const std::string hashes = RandomHashes(8, 32, 5);
  auto r = Reserve(owner, a.namespace_id(), 8);
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(
      Commit(owner, a.namespace_id(), r->reservation_id(), "", hashes).ok());
  const uint64_t engine = Open();
  Attach(engine, "ns", AttentionLayout());
  v1::LookupResponse pinned = Lookup(engine, a.namespace_id(), hashes, true);
  EXPECT_NE(pinned.lease_id(), 0u);
  auto held = Reserve(engine, a.namespace_id(), 8);
  ASSERT_TRUE(held.ok());
  // Everything is pinned or reserved: no room.
  auto full = Reserve(owner, a.namespace_id(), 1);
  EXPECT_EQ(full.status().code(), absl::StatusCode::kResourceExhausted);
  // A clean close (Goodbye{quiescent}): nothing of it is queued anywhere.
  core_->SessionGoodbye(engine, /*quiescent=*/true);
  core_->CloseSession(engine);
  EXPECT_TRUE(core_->CheckInvariants().ok());
  // The engine's reservation came back, and its pin no longer blocks
  // eviction; committed pages stay.
  EXPECT_EQ(Lookup(owner, a.namespace_id(), hashes).matched_pages(), 8u);
  auto again = Reserve(owner, a.namespace_id(), 8);
  ASSERT_TRUE(again.ok()) << again.status();
  auto evicting = Reserve(owner, a.namespace_id(), 1);
  EXPECT_TRUE(evicting.ok()) << evicting.status();
  EXPECT_EQ(Lookup(owner, a.namespace_id(), hashes).matched_pages(), 7u);
}

TEST_F(TierCoreTest, UnpinnedLookupsRefreshRecencyBeforeEviction) {
  const uint64_t s = Open();
  v1::AttachResponse a = Attach(s, "lru", AttentionLayout(), 0, 8);
  const std::string older = RandomHashes(4, 32, 40);
  const std::string newer = RandomHashes(4, 32, 41);
  for (const std::string* h : {&older, &newer}) {
    auto r = Reserve(s, a.namespace_id(), 4);
    ASSERT_TRUE(r.ok());
    ASSERT_TRUE(Commit(s, a.namespace_id(), r->reservation_id(), "", *h).ok());
  }
  // An unpinned lookup (shared lock, queued recency) makes `older` the most
  // recently used; the next eviction must take `newer`'s leaf instead.
  EXPECT_EQ(Lookup(s, a.namespace_id(), older, /*pin=*/false).matched_pages(),
            4u);
  auto r = Reserve(s, a.namespace_id(), 1);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(Lookup(s, a.namespace_id(), older).matched_pages(), 4u);
  EXPECT_EQ(Lookup(s, a.namespace_id(), newer).matched_pages(), 3u);
  v1::StatsResponse stats;
  ASSERT_TRUE(core_->Stats({}, &stats).ok());
  EXPECT_EQ(stats.namespaces(0).lookups(), 3u);
  EXPECT_TRUE(core_->CheckInvariants().ok());
}

TEST_F(TierCoreTest, HybridLookupStopsAtDeepestSnapshot) {
  const uint64_t s = Open();
  v1::AttachResponse a = Attach(s, "hy", HybridLayout(), 0, 64, 8);
  ASSERT_EQ(a.segments_size(), 3);
  EXPECT_EQ(a.segments(2).bank(), "snapshot");
  const std::string hashes = RandomHashes(12, 32, 6);
  auto r = Reserve(s, a.namespace_id(), 12, 2);
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(Commit(s, a.namespace_id(), r->reservation_id(), "", hashes,
                     {{0, HashAt(hashes, 3, 32)}, {1, HashAt(hashes, 7, 32)}})
                  .ok());
  v1::LookupResponse l = Lookup(s, a.namespace_id(), hashes);
  EXPECT_EQ(l.matched_pages(), 12u);
  EXPECT_EQ(l.usable_pages(), 8u);
  EXPECT_TRUE(l.has_snapshot());
  EXPECT_EQ(l.snapshot_row(), r->snapshot_rows(1));
  EXPECT_EQ(l.rows_size(), 8);
  v1::LookupResponse shorter =
      Lookup(s, a.namespace_id(), hashes.substr(0, 6 * 32));
  EXPECT_EQ(shorter.usable_pages(), 4u);
  EXPECT_EQ(shorter.snapshot_row(), r->snapshot_rows(0));
}

TEST_F(TierCoreTest, TensorParallelGroupMatchesWhatEveryRankHas) {
  v1::Layout l = AttentionLayout();
  l.set_tp_size(2);
  const uint64_t r0 = Open("rank0"), r1 = Open("rank1");
  v1::AttachResponse a0 = Attach(r0, "tp", l, 0);
  v1::AttachResponse a1 = Attach(r1, "tp", l, 1);
  EXPECT_NE(a0.segments(0).path(), a1.segments(0).path());
  const std::string hashes = RandomHashes(6, 32, 7);
  auto res0 = Reserve(r0, a0.namespace_id(), 6);
  ASSERT_TRUE(res0.ok());
  ASSERT_TRUE(
      Commit(r0, a0.namespace_id(), res0->reservation_id(), "", hashes).ok());
  EXPECT_EQ(Lookup(r0, a0.namespace_id(), hashes).matched_pages(), 0u);
  auto res1 = Reserve(r1, a1.namespace_id(), 4);
  ASSERT_TRUE(res1.ok());
  ASSERT_TRUE(Commit(r1, a1.namespace_id(), res1->reservation_id(), "",
                     hashes.substr(0, 4 * 32))
                  .ok());
  EXPECT_EQ(Lookup(r0, a0.namespace_id(), hashes).matched_pages(), 4u);
  v1::LookupResponse l1 = Lookup(r1, a1.namespace_id(), hashes);
  EXPECT_EQ(l1.matched_pages(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(l1.rows(i), res1->page_rows(i));
  EXPECT_TRUE(core_->CheckInvariants().ok());
}

TEST_F(TierCoreTest, ReplicatedGroupStoresOneCopy) {
  v1::Layout l = AttentionLayout();
  l.set_tp_size(4);
  l.set_replicated(true);
  const uint64_t r0 = Open(), r3 = Open();
  v1::AttachResponse a0 = Attach(r0, "mla", l, 0);
  v1::AttachResponse a3 = Attach(r3, "mla", l, 3);
  EXPECT_EQ(a0.segments(0).path(), a3.segments(0).path());
  const std::string hashes = RandomHashes(5, 32, 8);
  auto res = Reserve(r0, a0.namespace_id(), 5);
  ASSERT_TRUE(res.ok());
  ASSERT_TRUE(
      Commit(r0, a0.namespace_id(), res->reservation_id(), "", hashes).ok());
  EXPECT_EQ(Lookup(r3, a3.namespace_id(), hashes).matched_pages(), 5u);
  v1::StatsResponse stats;
  ASSERT_TRUE(core_->Stats({}, &stats).ok());
  EXPECT_EQ(stats.namespaces(0).banks_size(), 2);  // kv + scale, once.
}

TEST_F(TierCoreTest, NamespacesAreIsolated) {
  const uint64_t s = Open();
  v1::AttachResponse a = Attach(s, "a", AttentionLayout());
  v1::AttachResponse b = Attach(s, "b", AttentionLayout());
  EXPECT_NE(a.hash_seed(), b.hash_seed());
  const std::string hashes = RandomHashes(3, 32, 9);
  auto r = Reserve(s, a.namespace_id(), 3);
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(
      Commit(s, a.namespace_id(), r->reservation_id(), "", hashes).ok());
  EXPECT_EQ(Lookup(s, a.namespace_id(), hashes).matched_pages(), 3u);
  EXPECT_EQ(Lookup(s, b.namespace_id(), hashes).matched_pages(), 0u);
}

TEST_F(TierCoreTest, DropRemovesNamespaceAndSegments) {
  const uint64_t s = Open();
  v1::AttachResponse a = Attach(s, "ns", AttentionLayout());
  v1::DropRequest req;
  req.set_namespace_("ns");
  v1::DropResponse resp;
  EXPECT_EQ(core_->Drop(req, &resp).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(std::filesystem::exists(a.segments(0).path()));
  req.set_force(true);
  ASSERT_TRUE(core_->Drop(req, &resp).ok());
  EXPECT_FALSE(std::filesystem::exists(a.segments(0).path()));
  v1::StatsResponse stats;
  ASSERT_TRUE(core_->Stats({}, &stats).ok());
  EXPECT_EQ(stats.namespaces_size(), 0);
  EXPECT_TRUE(core_->CheckInvariants().ok());
}

TEST_F(TierCoreTest, VerifyReportsHealthyState) {
  const uint64_t s = Open();
  v1::AttachResponse a = Attach(s, "ns", AttentionLayout());
  auto r = Reserve(s, a.namespace_id(), 3);
  ASSERT_TRUE(r.ok());
  v1::VerifyResponse resp;
  ASSERT_TRUE(core_->Verify({}, &resp).ok());
  EXPECT_TRUE(resp.ok()) << resp.violation();
  EXPECT_EQ(resp.namespaces_checked(), 1u);
  v1::VerifyRequest bad;
  bad.set_api_version(5);
  EXPECT_EQ(core_->Verify(bad, &resp).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(TierCoreTest, ListPrefixesReportsLeaves) {
  const uint64_t s = Open();
  v1::AttachResponse a = Attach(s, "ns", AttentionLayout());
  const std::string x = RandomHashes(5, 32, 10), y = RandomHashes(2, 32, 11);
  for (const std::string* h : {&x, &y}) {
    auto r = Reserve(s, a.namespace_id(), h->size() / 32);
    ASSERT_TRUE(r.ok());
    ASSERT_TRUE(Commit(s, a.namespace_id(), r->reservation_id(), "", *h).ok());
  }
  v1::ListPrefixesRequest req;
  req.set_namespace_("ns");
  v1::ListPrefixesResponse resp;
  ASSERT_TRUE(core_->ListPrefixes(req, &resp).ok());
  EXPECT_EQ(resp.total_prefixes(), 2u);
  ASSERT_EQ(resp.prefixes_size(), 2);
  EXPECT_EQ(resp.prefixes(0).pages(), 5u);
  EXPECT_EQ(resp.prefixes(0).tokens(), 80u);
  EXPECT_EQ(resp.prefixes(0).leaf_hash(), HashAt(x, 4, 32));
}

// ------------------------------------------------------------ bad input --

class TierCoreBadInputTest : public TierCoreTest {
 protected:
  void SetUp() override {
    TierCoreTest::SetUp();
    session_ = Open();
    other_ = Open("other");
    attach_ = Attach(session_, "ns", HybridLayout(), 0, 32, 4);
    Attach(other_, "ns", HybridLayout());
    hashes_ = RandomHashes(4, 32, 12);
    auto r = Reserve(session_, ns(), 4, 1);
    ASSERT_TRUE(r.ok());
    ASSERT_TRUE(Commit(session_, ns(), r->reservation_id(), "", hashes_,
                       {{0, HashAt(hashes_, 3, 32)}})
                    .ok());
    auto open = Reserve(session_, ns(), 2, 1);
    ASSERT_TRUE(open.ok());
    reservation_ = open->reservation_id();
    lease_ = Lookup(session_, ns(), hashes_, true).lease_id();
    ASSERT_NE(lease_, 0u);
  }
  uint64_t ns() const { return attach_.namespace_id(); }

  // Runs `call`, expects `code` and `field` in the message, and an unchanged
  // state.
  template <typename F>
  void ExpectRejected(F call, absl::StatusCode code, const std::string& field) {
    const std::string before = State();
    absl::Status s = call();
    EXPECT_EQ(s.code(), code) << field << ": " << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(field));
    EXPECT_EQ(State(), before) << field;
    EXPECT_TRUE(core_->CheckInvariants().ok());
  }

  uint64_t session_ = 0, other_ = 0, reservation_ = 0, lease_ = 0;
  v1::AttachResponse attach_;
  std::string hashes_;
};

TEST_F(TierCoreBadInputTest, Attach) {
  auto attach = [&](auto mutate) {
    return [&, mutate] {
      v1::AttachRequest req;
      req.set_session_id(session_);
      req.set_namespace_("fresh");
      *req.mutable_layout() = AttentionLayout();
      mutate(req);
      v1::AttachResponse resp;
      return core_->Attach(req, &resp);
    };
  };
  ExpectRejected(attach([](auto& r) { r.set_session_id(12345); }),
                 absl::StatusCode::kNotFound, "session_id");
  ExpectRejected(attach([](auto& r) { r.set_namespace_("a/b"); }),
                 absl::StatusCode::kInvalidArgument, "namespace");
  ExpectRejected(attach([](auto& r) { r.set_namespace_(""); }),
                 absl::StatusCode::kInvalidArgument, "namespace");
  ExpectRejected(
      attach([](auto& r) { r.mutable_layout()->set_tokens_per_page(0); }),
      absl::StatusCode::kInvalidArgument, "tokens_per_page");
  ExpectRejected(attach([](auto& r) { r.set_tp_rank(1); }),
                 absl::StatusCode::kInvalidArgument, "tp_rank");
  ExpectRejected(
      attach([](auto& r) { r.set_tenant_salt(std::string(65, 'x')); }),
      absl::StatusCode::kInvalidArgument, "tenant_salt");
  ExpectRejected(attach([](auto& r) { r.set_api_version(7); }),
                 absl::StatusCode::kFailedPrecondition, "api_version");
  ExpectRejected(
      attach([](auto& r) { r.mutable_capacity()->set_snapshot_rows(3); }),
      absl::StatusCode::kInvalidArgument, "capacity.snapshot_rows");
  ExpectRejected(
      attach([](auto& r) { r.mutable_capacity()->set_page_rows(1ull << 40); }),
      absl::StatusCode::kInvalidArgument, "capacity");
  ExpectRejected(
      attach([](auto& r) { r.mutable_capacity()->set_page_rows(1ull << 20); }),
      absl::StatusCode::kResourceExhausted, "budget");
}

TEST_F(TierCoreBadInputTest, Lookup) {
  auto lookup = [&](auto mutate) {
    return [&, mutate] {
      v1::LookupRequest req;
      req.set_session_id(session_);
      req.set_namespace_id(ns());
      req.set_hashes(hashes_);
      mutate(req);
      v1::LookupResponse resp;
      return core_->Lookup(req, &resp);
    };
  };
  ExpectRejected(lookup([](auto& r) { r.set_session_id(1); }),
                 absl::StatusCode::kNotFound, "session_id");
  ExpectRejected(lookup([](auto& r) { r.set_namespace_id(999999); }),
                 absl::StatusCode::kNotFound, "namespace_id");
  ExpectRejected(lookup([&](auto& r) { r.set_hashes(hashes_ + "x"); }),
                 absl::StatusCode::kInvalidArgument, "hashes");
  ExpectRejected(lookup([](auto& r) { r.set_api_version(2); }),
                 absl::StatusCode::kFailedPrecondition, "api_version");
  const uint64_t stranger = Open("stranger");
  ExpectRejected(lookup([&](auto& r) { r.set_session_id(stranger); }),
                 absl::StatusCode::kFailedPrecondition, "not attached");
}

TEST_F(TierCoreBadInputTest, Reserve) {
  auto reserve = [&](uint64_t session, uint32_t pages, uint32_t snaps) {
    return [=, this] { return Reserve(session, ns(), pages, snaps).status(); };
  };
  ExpectRejected(reserve(session_, 0, 0), absl::StatusCode::kInvalidArgument,
                 "pages");
  ExpectRejected(reserve(session_, 33, 0), absl::StatusCode::kInvalidArgument,
                 "pages");
  ExpectRejected(reserve(session_, 1, 5), absl::StatusCode::kInvalidArgument,
                 "snapshots");
  ExpectRejected(reserve(77, 1, 0), absl::StatusCode::kNotFound, "session_id");
}

TEST_F(TierCoreBadInputTest, Commit) {
  const std::string two = RandomHashes(2, 32, 13);
  auto commit = [&](auto mutate) {
    return [&, mutate] {
      v1::CommitRequest req;
      req.set_session_id(session_);
      req.set_namespace_id(ns());
      req.set_reservation_id(reservation_);
      req.set_hashes(two);
      mutate(req);
      v1::CommitResponse resp;
      return core_->Commit(req, &resp);
    };
  };
  ExpectRejected(commit([](auto& r) { r.set_reservation_id(424242); }),
                 absl::StatusCode::kNotFound, "reservation_id");
  ExpectRejected(commit([&](auto& r) { r.set_session_id(other_); }),
                 absl::StatusCode::kNotFound, "reservation_id");
  ExpectRejected(commit([&](auto& r) { r.set_hashes(two.substr(0, 32)); }),
                 absl::StatusCode::kInvalidArgument, "hashes");
  ExpectRejected(commit([&](auto& r) { r.set_hashes(two.substr(0, 40)); }),
                 absl::StatusCode::kInvalidArgument, "hashes");
  ExpectRejected(commit([](auto& r) { r.set_parent_hash("short"); }),
                 absl::StatusCode::kInvalidArgument, "parent_hash");
  ExpectRejected(
      commit([&](auto& r) { r.set_parent_hash(RandomHashes(1, 32, 14)); }),
      absl::StatusCode::kFailedPrecondition, "parent");
  ExpectRejected(commit([&](auto& r) {
                   auto* p = r.add_snapshots();
                   p->set_index(1);
                   p->set_hash(two.substr(0, 32));
                 }),
                 absl::StatusCode::kInvalidArgument, "snapshots[0].index");
  ExpectRejected(commit([&](auto& r) {
                   for (int i = 0; i < 2; ++i) {
                     auto* p = r.add_snapshots();
                     p->set_index(0);
                     p->set_hash(two.substr(0, 32));
                   }
                 }),
                 absl::StatusCode::kInvalidArgument, "snapshots[1].index");
  ExpectRejected(commit([&](auto& r) {
                   auto* p = r.add_snapshots();
                   p->set_index(0);
                   p->set_hash("x");
                 }),
                 absl::StatusCode::kInvalidArgument, "snapshots[0].hash");
  // The reservation is still usable after all of that.
  EXPECT_TRUE(commit([](auto&) {})().ok());
}

TEST_F(TierCoreBadInputTest, AbortAndRelease) {
  auto abort = [&](uint64_t session, uint64_t id) {
    return [=, this] {
      v1::AbortRequest req;
      req.set_session_id(session);
      req.set_namespace_id(ns());
      req.set_reservation_id(id);
      v1::AbortResponse resp;
      return core_->Abort(req, &resp);
    };
  };
  auto release = [&](uint64_t session, uint64_t id) {
    return [=, this] {
      v1::ReleaseRequest req;
      req.set_session_id(session);
      req.set_namespace_id(ns());
      req.set_lease_id(id);
      v1::ReleaseResponse resp;
      return core_->Release(req, &resp);
    };
  };
  ExpectRejected(abort(session_, 5555), absl::StatusCode::kNotFound,
                 "reservation_id");
  ExpectRejected(abort(other_, reservation_), absl::StatusCode::kNotFound,
                 "reservation_id");
  ExpectRejected(release(session_, 5555), absl::StatusCode::kNotFound,
                 "lease_id");
  ExpectRejected(release(other_, lease_), absl::StatusCode::kNotFound,
                 "lease_id");
  EXPECT_TRUE(abort(session_, reservation_)().ok());
  EXPECT_TRUE(release(session_, lease_)().ok());
  // Double abort and double release are errors that change nothing.
  ExpectRejected(abort(session_, reservation_), absl::StatusCode::kNotFound,
                 "reservation_id");
  ExpectRejected(release(session_, lease_), absl::StatusCode::kNotFound,
                 "lease_id");
}

TEST_F(TierCoreBadInputTest, DropAndListPrefixes) {
  auto drop = [&](auto mutate) {
    return [&, mutate] {
      v1::DropRequest req;
      req.set_namespace_("ns");
      mutate(req);
      v1::DropResponse resp;
      return core_->Drop(req, &resp);
    };
  };
  ExpectRejected(drop([](auto& r) { r.set_namespace_("nope"); }),
                 absl::StatusCode::kNotFound, "namespace");
  ExpectRejected(drop([](auto& r) { r.set_namespace_("../x"); }),
                 absl::StatusCode::kInvalidArgument, "namespace");
  ExpectRejected(drop([](auto&) {}), absl::StatusCode::kFailedPrecondition,
                 "attached sessions");
  ExpectRejected(drop([](auto& r) { r.set_hash("abc"); }),
                 absl::StatusCode::kInvalidArgument, "hash");
  ExpectRejected(drop([&](auto& r) { r.set_hash(HashAt(hashes_, 0, 32)); }),
                 absl::StatusCode::kFailedPrecondition, "pinned");
  auto list = [&](auto mutate) {
    return [&, mutate] {
      v1::ListPrefixesRequest req;
      req.set_namespace_("ns");
      mutate(req);
      v1::ListPrefixesResponse resp;
      return core_->ListPrefixes(req, &resp);
    };
  };
  ExpectRejected(list([](auto& r) { r.set_limit(10001); }),
                 absl::StatusCode::kInvalidArgument, "limit");
  ExpectRejected(list([](auto& r) {
                   r.set_order(static_cast<v1::ListPrefixesRequest::Order>(9));
                 }),
                 absl::StatusCode::kInvalidArgument, "order");
  ExpectRejected(list([](auto& r) { r.set_namespace_("nope"); }),
                 absl::StatusCode::kNotFound, "namespace");
  v1::StatsRequest stats;
  stats.set_api_version(3);
  v1::StatsResponse sresp;
  EXPECT_EQ(core_->Stats(stats, &sresp).code(),
            absl::StatusCode::kFailedPrecondition);
}

// ------------------------------------------------------------ isolation --

// Peer credentials, namespace ACLs and the per-uid budget
// (daemon/peer_credentials.h). Credentials here are handed to
// BindPeerCredentials directly, as the fast lookup server does with
// SO_PEERCRED; the real-socket path is tests/isolation_test.cc.
class TierCoreIsolationTest : public TierCoreTest {
 protected:
  static constexpr uint64_t kNamespaceBytes = 64 * (1024 + 112);

  void Configure(TierOptions* o) override {
    o->require_peer_credentials = true;
    auto acl = NamespaceAcl::Parse("team=uid:1001+gid:3000;lab.*=uid:1003");
    ASSERT_TRUE(acl.ok()) << acl.status();
    o->namespace_acl = *acl;
    o->uid_budget_bytes = 2 * kNamespaceBytes;
  }

  // A session whose peer is uid/gid (+ supplementary groups), bound.
  uint64_t OpenAs(uid_t uid, gid_t gid, std::vector<gid_t> groups = {}) {
    const uint64_t s = Open(absl::StrCat("uid-", uid));
    PeerInfo p;
    p.pid = 1000 + static_cast<pid_t>(uid);
    p.uid = uid;
    p.gid = gid;
    p.groups = std::move(groups);
    p.verified = true;
    EXPECT_TRUE(core_->BindPeerCredentials(s, p).ok());
    return s;
  }

  absl::Status TryAttach(uint64_t session, const std::string& ns,
                         const std::string& salt = "",
                         v1::AttachResponse* out = nullptr) {
    v1::AttachRequest req;
    req.set_session_id(session);
    req.set_namespace_(ns);
    *req.mutable_layout() = AttentionLayout();
    req.mutable_capacity()->set_page_rows(64);
    req.set_tenant_salt(salt);
    v1::AttachResponse resp;
    absl::Status s = core_->Attach(req, &resp);
    if (out != nullptr) *out = resp;
    return s;
  }
};

TEST_F(TierCoreIsolationTest, UnboundSessionCannotAttach) {
  const uint64_t s = Open();  // The gRPC adapter's view: pid claimed only.
  const std::string before = State();
  absl::Status st = TryAttach(s, "open");
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr("peer credentials"));
  EXPECT_EQ(State(), before) << "a refused attach created something";
  PeerInfo p;
  p.uid = 1001;
  p.verified = true;
  ASSERT_TRUE(core_->BindPeerCredentials(s, p).ok());
  EXPECT_TRUE(TryAttach(s, "open").ok());
}

TEST_F(TierCoreIsolationTest, BindingIsFinal) {
  const uint64_t s = OpenAs(1001, 1001);
  PeerInfo same;
  same.uid = 1001;
  same.gid = 1001;
  same.pid = 77;  // Another connection of the same user (a reconnect).
  same.verified = true;
  EXPECT_TRUE(core_->BindPeerCredentials(s, same).ok());
  PeerInfo thief = same;
  thief.uid = 1002;
  absl::Status st = core_->BindPeerCredentials(s, thief);
  EXPECT_EQ(st.code(), absl::StatusCode::kPermissionDenied) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr("session_id"));
  PeerInfo claimed = thief;
  claimed.verified = false;
  EXPECT_EQ(core_->BindPeerCredentials(s, claimed).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(core_->BindPeerCredentials(424242, same).code(),
            absl::StatusCode::kNotFound);
  // The session still acts as uid 1001: allowed into "team".
  EXPECT_TRUE(TryAttach(s, "team").ok());
}

TEST_F(TierCoreIsolationTest, AclAdmitsListedUidsAndGroupMembersOnly) {
  v1::AttachResponse team;
  ASSERT_TRUE(TryAttach(OpenAs(1001, 1001), "team", "", &team).ok());
  const uint64_t stranger = OpenAs(1002, 1002);
  const std::string before = State();
  absl::Status st = TryAttach(stranger, "team");
  EXPECT_EQ(st.code(), absl::StatusCode::kPermissionDenied) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr("namespace"));
  EXPECT_THAT(std::string(st.message()), HasSubstr("uid 1002"));
  // Nor may it create a governed namespace that does not exist yet.
  EXPECT_EQ(TryAttach(stranger, "lab.x").code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(State(), before);
  // Lookups need an attach: the stranger cannot reach the rows either way.
  v1::LookupRequest lookup;
  lookup.set_session_id(stranger);
  lookup.set_namespace_id(team.namespace_id());
  v1::LookupResponse lresp;
  EXPECT_EQ(core_->Lookup(lookup, &lresp).code(),
            absl::StatusCode::kFailedPrecondition);
  // A member of group 3000 (primary or supplementary) is admitted.
  EXPECT_TRUE(TryAttach(OpenAs(1004, 3000), "team").ok());
  EXPECT_TRUE(TryAttach(OpenAs(1005, 1005, {7, 3000}), "team").ok());
  EXPECT_TRUE(TryAttach(OpenAs(1003, 1003), "lab.x").ok());
  // Namespaces no entry governs are open to every bound session.
  EXPECT_TRUE(TryAttach(stranger, "shared").ok());
  EXPECT_TRUE(core_->CheckInvariants().ok());
}

TEST_F(TierCoreIsolationTest, AclGroupOwnsTheNamespacesSegments) {
  if (geteuid() != 0) GTEST_SKIP() << "chown to another group needs root";
  v1::AttachResponse team, shared;
  ASSERT_TRUE(TryAttach(OpenAs(1001, 1001), "team", "", &team).ok());
  ASSERT_TRUE(TryAttach(OpenAs(1001, 1001), "shared", "", &shared).ok());
  for (const auto& seg : team.segments()) {
    struct stat st;
    ASSERT_EQ(stat(seg.path().c_str(), &st), 0) << seg.path();
    EXPECT_EQ(st.st_gid, 3000u) << seg.path();
    EXPECT_EQ(st.st_mode & 0777, 0660u) << seg.path();
  }
  struct stat st;
  ASSERT_EQ(stat(shared.segments(0).path().c_str(), &st), 0);
  EXPECT_EQ(st.st_gid, getegid());
}

TEST_F(TierCoreIsolationTest, UidBudgetCapsWhatOneUserCreates) {
  const uint64_t a = OpenAs(1001, 1001);
  ASSERT_TRUE(TryAttach(a, "a1").ok());
  ASSERT_TRUE(TryAttach(a, "a2").ok());
  const std::string before = State();
  absl::Status st = TryAttach(a, "a3");
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr("--uid_budget_bytes"));
  EXPECT_EQ(State(), before);
  // Opening namespaces that exist costs nothing; other uids have their own.
  EXPECT_TRUE(TryAttach(a, "a1").ok());
  const uint64_t b = OpenAs(1002, 1002);
  EXPECT_TRUE(TryAttach(b, "b1").ok());
  EXPECT_TRUE(TryAttach(b, "a3").ok());
  EXPECT_TRUE(TryAttach(a, "a3").ok()) << "opening b's namespace is free";
  // Dropping a namespace refunds its creator.
  v1::DropRequest drop;
  drop.set_namespace_("a1");
  drop.set_force(true);
  v1::DropResponse dresp;
  ASSERT_TRUE(core_->Drop(drop, &dresp).ok());
  EXPECT_TRUE(TryAttach(a, "a4").ok());
}

TEST_F(TierCoreIsolationTest, TenantSaltsSeedDifferentChains) {
  const uint64_t s1 = OpenAs(1001, 1001), s2 = OpenAs(1002, 1002);
  v1::AttachResponse r1, r2, r3;
  ASSERT_TRUE(TryAttach(s1, "shared", "tenant-a", &r1).ok());
  ASSERT_TRUE(TryAttach(s2, "shared", "tenant-b", &r2).ok());
  ASSERT_TRUE(TryAttach(OpenAs(1003, 1003), "shared", "tenant-a", &r3).ok());
  EXPECT_EQ(r1.namespace_id(), r2.namespace_id());
  EXPECT_NE(r1.hash_seed(), r2.hash_seed());
  EXPECT_EQ(r1.hash_seed(), r3.hash_seed());
}

}  // namespace
}  // namespace kvtier::daemon
