// Tests of libkvtier's C++ API against a real kvtierd, host-only (no GPU
// needed): attach maps the banks, RAII leases and reservations, deferred
// commits, a reference-backend round trip through the shared banks, and the
// cluster tier's remote lookup and prefetch against a daemon without one.
#include "client/client.h"

#include <cstdlib>
#include <cstring>
#include <random>

#include "client/transfer_engine.h"
#include "common/error_reason.h"
#include "common/grpc_status.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "kvtier/v1/tier.grpc.pb.h"
#include "tests/daemon_process.h"

namespace kvtier::client {
namespace {

AttachOptions Options(const std::string& name, uint64_t rows = 64) {
  AttachOptions o;
  o.name = name;
  o.layout.model = "client-test";
  o.layout.tokens_per_page = 16;
  o.layout.num_layers = 2;
  // kv: K and V of one layer, 2 KiB each; scale: an odd 100 bytes.
  o.layout.page_banks = {{"kv", 4096, "bf16"}, {"scale", 100, "fp32"}};
  o.capacity.page_rows = rows;
  return o;
}

std::vector<int32_t> Tokens(size_t n, int32_t salt) {
  std::vector<int32_t> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = static_cast<int32_t>(i * 13 + salt);
  return t;
}

class ClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(daemon_.Start().ok());
    auto c = Client::Connect({.socket = daemon_.socket(), .client_name = "t"});
    ASSERT_TRUE(c.ok()) << c.status();
    client_ = *std::move(c);
  }
  testing::DaemonProcess daemon_;
  std::unique_ptr<Client> client_;
};

TEST_F(ClientTest, ConnectFailsClearlyWithoutDaemon) {
  auto c = Client::Connect({.socket = daemon_.dir() + "/none.sock",
                            .timeout = absl::Milliseconds(300)});
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(c.status().message()),
              ::testing::HasSubstr("none.sock"));
}

TEST_F(ClientTest, AttachWithoutGpuMapsBanksHostOnly) {
  AttachOptions o = Options("attach");
  o.register_with_cuda = false;  // Host-only on any machine, GPU or not.
  auto ns = client_->Attach(o);
  ASSERT_TRUE(ns.ok()) << ns.status();
  EXPECT_TRUE((*ns)->created());
  EXPECT_NE(client_->session_id(), 0u);
  ASSERT_EQ((*ns)->page_banks().size(), 2u);
  EXPECT_EQ((*ns)->snapshot_bank(), nullptr);
  for (const auto& b : (*ns)->page_banks()) {
    EXPECT_FALSE(b.cuda_registered);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b.base) % 16, 0u);
    EXPECT_EQ(b.row_stride % 16, 0u);
    EXPECT_EQ(b.rows, 64u);
    // The mapping is writable and shared.
    std::memset(b.base + 3 * b.row_stride, 0x5a, b.row_bytes);
  }
  EXPECT_EQ((*ns)->page_banks()[1].row_bytes, 100u);
  EXPECT_FALSE((*ns)->cuda_registered());
  EXPECT_EQ((*ns)->hasher().hash_bytes(), 32u);
}

TEST_F(ClientTest, LeaseAndReservationAreRaii) {
  auto ns = client_->Attach(Options("raii", 8));
  ASSERT_TRUE(ns.ok());
  const std::string hashes = (*ns)->hasher().HashChain(Tokens(8 * 16, 1));
  {
    auto r = (*ns)->Reserve(8);
    ASSERT_TRUE(r.ok());
    // Destroyed without commit: aborted, the rows come back.
  }
  auto r = (*ns)->Reserve(8);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->Commit("", hashes).ok());
  EXPECT_EQ(r->Commit("", hashes).status().code(),
            absl::StatusCode::kFailedPrecondition);
  {
    auto lease = (*ns)->Lookup(hashes, /*pin=*/true);
    ASSERT_TRUE(lease.ok());
    EXPECT_TRUE(lease->pinned());
    EXPECT_EQ(lease->matched_pages(), 8u);
    // Every row is pinned: nothing can be evicted for a new reservation.
    EXPECT_EQ((*ns)->Reserve(1).status().code(),
              absl::StatusCode::kResourceExhausted);
  }
  // The lease's destructor released the pin: eviction makes room.
  auto one = (*ns)->Reserve(1);
  EXPECT_TRUE(one.ok()) << one.status();
}

TEST_F(ClientTest, CommitAfterWithoutStreamCommits) {
  auto ns = client_->Attach(Options("after"));
  ASSERT_TRUE(ns.ok());
  const std::string hashes = (*ns)->hasher().HashChain(Tokens(5 * 16, 2));
  auto r = (*ns)->Reserve(5);
  ASSERT_TRUE(r.ok());
  auto done = r->CommitAfter(nullptr, "", hashes);
  auto result = done.get();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->committed_pages, 5u);
  auto lease = (*ns)->Lookup(hashes, /*pin=*/false);
  ASSERT_TRUE(lease.ok());
  EXPECT_EQ(lease->matched_pages(), 5u);
  EXPECT_FALSE(lease->pinned());
}

TEST_F(ClientTest, ReferenceTransferRoundTripsThroughBanks) {
  auto ns = client_->Attach(Options("xfer", 128));
  ASSERT_TRUE(ns.ok());
  // Two host "pools" of 200 pages: K, V (2 KiB each) and scales (100 B).
  constexpr uint64_t kPages = 200;
  auto alloc = [](uint64_t bytes) {
    return std::unique_ptr<uint8_t, decltype(&std::free)>(
        static_cast<uint8_t*>(std::aligned_alloc(64, bytes)), &std::free);
  };
  auto k = alloc(kPages * 2048), v = alloc(kPages * 2048),
       s = alloc(kPages * 112);
  auto k2 = alloc(kPages * 2048), v2 = alloc(kPages * 2048),
       s2 = alloc(kPages * 112);
  std::mt19937 rng(3);
  for (auto* p : {k.get(), v.get()}) {
    for (uint64_t i = 0; i < kPages * 2048; ++i) p[i] = rng();
  }
  for (uint64_t i = 0; i < kPages * 112; ++i) s.get()[i] = rng();
  auto pool = [&](uint8_t* kk, uint8_t* vv, uint8_t* ss) {
    GpuPoolDescriptor d;
    d.num_pages = kPages;
    d.banks = {{"kv",
                {{reinterpret_cast<uint64_t>(kk), 2048, 2048},
                 {reinterpret_cast<uint64_t>(vv), 2048, 2048}}},
               {"scale", {{reinterpret_cast<uint64_t>(ss), 112, 100}}}};
    return d;
  };
  auto src = (*ns)->CreateTransferEngine(Backend::kReference,
                                         pool(k.get(), v.get(), s.get()));
  ASSERT_TRUE(src.ok()) << src.status();
  auto dst = (*ns)->CreateTransferEngine(Backend::kReference,
                                         pool(k2.get(), v2.get(), s2.get()));
  ASSERT_TRUE(dst.ok()) << dst.status();

  const uint32_t n = 100;
  std::vector<uint32_t> pages(n), back(n);
  for (uint32_t i = 0; i < n; ++i) {
    pages[i] = (i * 37 + 11) % kPages;
    back[i] = (i * 53 + 5) % kPages;
  }
  std::sort(back.begin(), back.end());
  back.erase(std::unique(back.begin(), back.end()), back.end());
  ASSERT_EQ(back.size(), n);
  const std::string hashes = (*ns)->hasher().HashChain(Tokens(n * 16, 3));
  auto r = (*ns)->Reserve(n);
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE((*src)->Evict(pages, r->page_rows(), nullptr).ok());
  ASSERT_TRUE(r->Commit("", hashes).ok());

  auto lease = (*ns)->Lookup(hashes, /*pin=*/true);
  ASSERT_TRUE(lease.ok());
  ASSERT_EQ(lease->usable_pages(), n);
  ASSERT_TRUE((*dst)->Rehydrate(back, lease->rows(), nullptr).ok());
  for (uint32_t i = 0; i < n; ++i) {
    EXPECT_EQ(
        std::memcmp(k2.get() + back[i] * 2048, k.get() + pages[i] * 2048, 2048),
        0);
    EXPECT_EQ(
        std::memcmp(v2.get() + back[i] * 2048, v.get() + pages[i] * 2048, 2048),
        0);
    EXPECT_EQ(
        std::memcmp(s2.get() + back[i] * 112, s.get() + pages[i] * 112, 100),
        0);
  }
}

TEST_F(ClientTest, FastLookupPathMatchesGrpc) {
  EXPECT_TRUE(client_->fast_lookup_active());
  auto slow =
      Client::Connect({.socket = daemon_.socket(), .fast_lookup = false});
  ASSERT_TRUE(slow.ok());
  EXPECT_FALSE((*slow)->fast_lookup_active());
  auto fast_ns = client_->Attach(Options("fastpath"));
  auto slow_ns = (*slow)->Attach(Options("fastpath"));
  ASSERT_TRUE(fast_ns.ok() && slow_ns.ok());
  const std::string hashes = (*fast_ns)->hasher().HashChain(Tokens(9 * 16, 4));
  auto r = (*fast_ns)->Reserve(9);
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(r->Commit("", hashes).ok());
  std::string probe = hashes;
  probe[6 * 32] ^= 1;  // Diverges at page 6.
  for (const std::string* h :
       {&hashes, static_cast<const std::string*>(&probe)}) {
    auto a = (*fast_ns)->Lookup(*h, /*pin=*/true);
    auto b = (*slow_ns)->Lookup(*h, /*pin=*/true);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(a->matched_pages(), b->matched_pages());
    EXPECT_EQ(a->usable_pages(), h == &hashes ? 9u : 6u);
    EXPECT_EQ(std::vector<uint32_t>(a->rows().begin(), a->rows().end()),
              std::vector<uint32_t>(b->rows().begin(), b->rows().end()));
    EXPECT_TRUE(a->pinned());
    EXPECT_TRUE(a->Release().ok());
  }
  // Errors come back over the fast path with their code and field.
  auto bad = (*fast_ns)->Lookup(hashes.substr(0, 33));
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()),
              ::testing::HasSubstr("hashes"));
  EXPECT_TRUE(client_->fast_lookup_active());
}

TEST_F(ClientTest, DaemonDeathIsAMissNotACrash) {
  auto ns = client_->Attach(Options("death"));
  ASSERT_TRUE(ns.ok());
  EXPECT_TRUE(client_->session_alive());
  daemon_.Kill();
  const absl::Time start = absl::Now();
  while (client_->session_alive() && absl::Now() - start < absl::Seconds(5)) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_FALSE(client_->session_alive());
  // The engine recomputes: a lookup is a miss, writes are refused.
  auto lease = (*ns)->Lookup(std::string(32, 'x'));
  ASSERT_TRUE(lease.ok()) << lease.status();
  EXPECT_EQ(lease->matched_pages(), 0u);
  EXPECT_FALSE(lease->pinned());
  const absl::Status refused = (*ns)->Reserve(1).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable);
  // The client says why in a payload, not only in words.
  EXPECT_EQ(GetErrorReason(refused), ErrorReason::kDaemonUnreachable);
}

// The daemon marks "no such session" with a reason that crosses gRPC.
TEST_F(ClientTest, DaemonMarksAnUnknownSession) {
  auto channel = grpc::CreateChannel("unix:" + daemon_.socket(),
                                     grpc::InsecureChannelCredentials());
  auto stub = v1::TierService::NewStub(channel);
  v1::LookupRequest req;
  req.set_api_version(1);
  req.set_session_id(client_->session_id() + 1);
  req.set_namespace_id(1);
  v1::LookupResponse resp;
  grpc::ClientContext ctx;
  const absl::Status s = FromGrpcStatus(stub->Lookup(&ctx, req, &resp));
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(GetErrorReason(s), ErrorReason::kSessionUnknown);
}

// A namespace dropped under an attached engine is an outage for it, told by
// the daemon's reason (over the fast path and over gRPC alike): lookups
// miss, reservations are UNAVAILABLE.
TEST_F(ClientTest, DroppedNamespaceIsAMissOnBothPaths) {
  auto fast_ns = client_->Attach(Options("dropped"));
  ASSERT_TRUE(fast_ns.ok()) << fast_ns.status();
  auto slow =
      Client::Connect({.socket = daemon_.socket(), .fast_lookup = false});
  ASSERT_TRUE(slow.ok()) << slow.status();
  auto slow_ns = (*slow)->Attach(Options("dropped"));
  ASSERT_TRUE(slow_ns.ok()) << slow_ns.status();
  ASSERT_TRUE(client_->fast_lookup_active());
  ASSERT_FALSE((*slow)->fast_lookup_active());
  auto dropped = client_->Drop("dropped", {}, /*force=*/true);
  ASSERT_TRUE(dropped.ok()) << dropped.status();
  const std::string hashes = (*fast_ns)->hasher().HashChain(Tokens(32, 9));
  for (Namespace* ns : {fast_ns->get(), slow_ns->get()}) {
    auto lease = ns->Lookup(hashes);
    ASSERT_TRUE(lease.ok()) << lease.status();
    EXPECT_EQ(lease->matched_pages(), 0u);
    EXPECT_FALSE(lease->pinned());
    EXPECT_EQ(ns->Reserve(1).status().code(), absl::StatusCode::kUnavailable);
  }
  EXPECT_TRUE(client_->fast_lookup_active());  // An answer, not a failure.
}

// Against a daemon without a cluster tier, a remote lookup is the local
// lookup (the same rows, pinned as asked) with nothing remote.
TEST_F(ClientTest, RemoteLookupWithoutAClusterTierIsTheLocalLookup) {
  auto ns = client_->Attach(Options("remote"));
  ASSERT_TRUE(ns.ok()) << ns.status();
  const std::string hashes = (*ns)->hasher().HashChain(Tokens(8 * 16, 5));
  auto r = (*ns)->Reserve(5);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->Commit("", hashes.substr(0, 5 * 32)).ok());

  auto local = (*ns)->Lookup(hashes, /*pin=*/false);
  ASSERT_TRUE(local.ok()) << local.status();
  auto remote = (*ns)->LookupRemote(hashes, /*pin=*/true);
  ASSERT_TRUE(remote.ok()) << remote.status();
  EXPECT_EQ(remote->matched_pages(), 5u);
  EXPECT_EQ(remote->usable_pages(), 5u);
  EXPECT_EQ(std::vector<uint32_t>(remote->rows().begin(), remote->rows().end()),
            std::vector<uint32_t>(local->rows().begin(), local->rows().end()));
  EXPECT_TRUE(remote->pinned());
  EXPECT_EQ(remote->remote_pages(), 0u);
  EXPECT_EQ(remote->prefetching_pages(), 0u);
  EXPECT_EQ(local->remote_pages(), 0u);
  // Moved, the lease keeps what the daemon answered.
  Lease moved = *std::move(remote);
  EXPECT_EQ(moved.matched_pages(), 5u);
  EXPECT_TRUE(moved.pinned());
  EXPECT_TRUE(moved.Release().ok());
  auto unpinned = (*ns)->LookupRemote(hashes, /*pin=*/false);
  ASSERT_TRUE(unpinned.ok()) << unpinned.status();
  EXPECT_FALSE(unpinned->pinned());
  EXPECT_EQ(unpinned->matched_pages(), 5u);
}

// Against a daemon without a cluster tier, a prefetch reports the local
// match and starts nothing; a dropped namespace is an outage for the
// engine, as for lookups and reservations.
TEST_F(ClientTest, PrefetchWithoutAClusterTierStartsNothing) {
  auto ns = client_->Attach(Options("prefetch"));
  ASSERT_TRUE(ns.ok()) << ns.status();
  const std::string hashes = (*ns)->hasher().HashChain(Tokens(8 * 16, 9));
  auto r = (*ns)->Reserve(5);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->Commit("", hashes.substr(0, 5 * 32)).ok());
  auto p = (*ns)->Prefetch(hashes);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->local_pages, 5u);
  EXPECT_EQ(p->remote_pages, 0u);
  EXPECT_EQ(p->prefetching_pages, 0u);
  auto after = (*ns)->LookupRemote(hashes, /*pin=*/false);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->matched_pages(), 5u);
  EXPECT_EQ(after->prefetching_pages(), 0u);

  ASSERT_TRUE(client_->Drop("prefetch", {}, /*force=*/true).ok());
  auto lease = (*ns)->LookupRemote(hashes);
  ASSERT_TRUE(lease.ok()) << lease.status();
  EXPECT_EQ(lease->matched_pages(), 0u);
  const absl::Status dropped = (*ns)->Prefetch(hashes).status();
  EXPECT_EQ(dropped.code(), absl::StatusCode::kUnavailable) << dropped;
  EXPECT_EQ(GetErrorReason(dropped), ErrorReason::kDaemonUnreachable);
}

// Bad chains are refused naming the field, and change nothing.
TEST_F(ClientTest, RemoteLookupAndPrefetchRefuseABadChain) {
  auto ns = client_->Attach(Options("remote-bad"));
  ASSERT_TRUE(ns.ok()) << ns.status();
  const std::string hashes = (*ns)->hasher().HashChain(Tokens(3 * 16, 6));
  auto r = (*ns)->Reserve(3);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->Commit("", hashes).ok());
  for (const std::string& bad : {hashes.substr(0, 33), hashes + "x"}) {
    const absl::Status p = (*ns)->Prefetch(bad).status();
    EXPECT_EQ(p.code(), absl::StatusCode::kInvalidArgument) << p;
    EXPECT_THAT(std::string(p.message()), ::testing::HasSubstr("hashes"));
    const absl::Status l = (*ns)->LookupRemote(bad).status();
    EXPECT_EQ(l.code(), absl::StatusCode::kInvalidArgument) << l;
    EXPECT_THAT(std::string(l.message()), ::testing::HasSubstr("hashes"));
  }
  auto lease = (*ns)->Lookup(hashes, /*pin=*/false);
  ASSERT_TRUE(lease.ok()) << lease.status();
  EXPECT_EQ(lease->matched_pages(), 3u);
  // Nothing stayed pinned or reserved: the whole bank can be reserved.
  EXPECT_TRUE((*ns)->Reserve(64).ok());
}

// While the daemon is unreachable a remote lookup is a miss, like any
// lookup, and a prefetch answers the outage status.
TEST_F(ClientTest, DaemonDeathMakesRemoteLookupAMissAndPrefetchUnavailable) {
  auto ns = client_->Attach(Options("remote-death"));
  ASSERT_TRUE(ns.ok()) << ns.status();
  const std::string hashes = (*ns)->hasher().HashChain(Tokens(2 * 16, 7));
  auto r = (*ns)->Reserve(2);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->Commit("", hashes).ok());
  daemon_.Kill();
  const absl::Time start = absl::Now();
  while (client_->session_alive() && absl::Now() - start < absl::Seconds(5)) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_FALSE(client_->session_alive());
  auto lease = (*ns)->LookupRemote(hashes);
  ASSERT_TRUE(lease.ok()) << lease.status();
  EXPECT_EQ(lease->matched_pages(), 0u);
  EXPECT_EQ(lease->remote_pages(), 0u);
  EXPECT_FALSE(lease->pinned());
  const absl::Status p = (*ns)->Prefetch(hashes).status();
  EXPECT_EQ(p.code(), absl::StatusCode::kUnavailable) << p;
  EXPECT_EQ(GetErrorReason(p), ErrorReason::kDaemonUnreachable);
}

}  // namespace
}  // namespace kvtier::client
