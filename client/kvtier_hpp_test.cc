// Tests of the public C++ layer (kvtier/kvtier.hpp) as an engine uses it:
// built as C++17 with only the public include folder on the include path,
// linked only against libkvtier.so (and gtest), against a real kvtierd this
// test starts itself (kvtier_hpp_test_daemon.h). The device pools and mirrors
// are kvtier_hpp_device_test.cc's.
#include <chrono>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "kvtier/kvtier.hpp"
// Beside this file, found without the project root on the include path.
#include "kvtier_hpp_test_daemon.h"

namespace {

using kvtier_hpp_test::Daemon;

class KvtierHppTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(daemon_.WaitUntilListening());
    kvtier::ConnectOptions co;
    co.socket = daemon_.socket();
    co.client_name = "hpp-test";
    auto c = kvtier::Client::Connect(co);
    ASSERT_TRUE(c.ok()) << c.status().message();
    client_.emplace(*std::move(c));
  }
  kvtier::AttachOptions Options(const std::string& name, uint64_t rows = 32) {
    kvtier::AttachOptions o;
    o.name = name;
    o.layout.model = "hpp";
    o.layout.tokens_per_page = 4;
    o.layout.num_layers = 1;
    o.layout.page_banks = {{"kv", 1024, "fp8_e4m3"}, {"scale", 64, "fp32"}};
    o.page_rows = rows;
    return o;
  }
  static std::vector<int32_t> Tokens(size_t n, int32_t salt) {
    std::vector<int32_t> t(n);
    for (size_t i = 0; i < n; ++i) t[i] = static_cast<int32_t>(i * 7 + salt);
    return t;
  }
  static uint8_t* Row(const kvtier::BankInfo& b, uint32_t row) {
    return static_cast<uint8_t*>(b.base) + row * b.row_stride;
  }

  Daemon daemon_;
  std::optional<kvtier::Client> client_;
};

TEST(KvtierHppStatusTest, StatusAndResultAreValues) {
  kvtier::Status ok;
  EXPECT_TRUE(ok.ok());
  EXPECT_EQ(ok.code(), kvtier::StatusCode::kOk);
  kvtier::Result<int> v(7);
  ASSERT_TRUE(v.ok());
  EXPECT_TRUE(v.status().ok());
  EXPECT_EQ(*v, 7);
  kvtier::Result<int> e(
      kvtier::Status(kvtier::StatusCode::kNotFound, "nothing"));
  EXPECT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), kvtier::StatusCode::kNotFound);
  EXPECT_EQ(e.status().message(), "nothing");
  // A Result cannot be made from an OK status without a value.
  kvtier::Result<int> bad{kvtier::Status()};
  EXPECT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), kvtier::StatusCode::kUnknown);
}

TEST_F(KvtierHppTest, ConnectFailureIsAStatusNamingTheSocket) {
  kvtier::ConnectOptions co;
  co.socket = daemon_.dir() + "/none.sock";
  co.timeout_ms = 300;
  auto c = kvtier::Client::Connect(co);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), kvtier::StatusCode::kUnavailable);
  EXPECT_NE(c.status().message().find("none.sock"), std::string::npos)
      << c.status().message();
  co.instance_id = "short";
  EXPECT_EQ(kvtier::Client::Connect(co).status().code(),
            kvtier::StatusCode::kInvalidArgument);
}

TEST_F(KvtierHppTest, AttachHashLookupReserveCommit) {
  EXPECT_NE(client_->session_id(), 0u);
  EXPECT_TRUE(client_->session_alive());
  auto ns = client_->Attach(Options("flow"));
  ASSERT_TRUE(ns.ok()) << ns.status().message();
  EXPECT_NE(ns->id(), 0u);
  ASSERT_EQ(ns->hash_bytes(), 32u);
  ASSERT_EQ(ns->num_page_banks(), 2u);
  auto kv = ns->page_bank(0);
  auto scale = ns->page_bank(1);
  ASSERT_TRUE(kv.ok() && scale.ok());
  EXPECT_EQ(kv->name, "kv");
  EXPECT_EQ(kv->row_bytes, 1024u);
  EXPECT_EQ(ns->page_bank(2).status().code(), kvtier::StatusCode::kOutOfRange);
  EXPECT_EQ(ns->snapshot_bank().status().code(), kvtier::StatusCode::kNotFound);

  const std::vector<int32_t> tokens = Tokens(6 * 4 + 3, 100);
  auto hashes = ns->HashTokens(tokens.data(), tokens.size());
  ASSERT_TRUE(hashes.ok()) << hashes.status().message();
  ASSERT_EQ(hashes->size(), 6u * 32);
  // A continuation from the third page's hash gives the same later hashes.
  auto tail = ns->HashTokens(tokens.data() + 12, 12, hashes->substr(64, 32));
  ASSERT_TRUE(tail.ok()) << tail.status().message();
  EXPECT_EQ(*tail, hashes->substr(96));

  auto miss = ns->Lookup(*hashes);
  ASSERT_TRUE(miss.ok()) << miss.status().message();
  EXPECT_EQ(miss->matched_pages(), 0u);
  EXPECT_TRUE(miss->rows().empty());
  EXPECT_EQ(ns->Lookup(hashes->substr(0, 33)).status().code(),
            kvtier::StatusCode::kInvalidArgument);

  auto r = ns->Reserve(6);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_NE(r->id(), 0u);
  ASSERT_EQ(r->page_rows().size(), 6u);
  const std::vector<uint32_t> rows(r->page_rows().begin(),
                                   r->page_rows().end());
  for (uint32_t i = 0; i < 6; ++i) {
    std::memset(Row(*kv, rows[i]), 0x10 + i, kv->row_bytes);
    std::memset(Row(*scale, rows[i]), 0x80 + i, scale->row_bytes);
  }
  auto done = r->Commit({}, *hashes);
  ASSERT_TRUE(done.ok()) << done.status().message();
  EXPECT_EQ(done->committed_pages, 6u);
  // Spent: a second commit is refused by the C layer, not a crash.
  EXPECT_FALSE(r->Commit({}, *hashes).ok());

  auto hit = ns->Lookup(*hashes);
  ASSERT_TRUE(hit.ok()) << hit.status().message();
  ASSERT_EQ(hit->matched_pages(), 6u);
  ASSERT_EQ(hit->usable_pages(), 6u);
  for (uint32_t i = 0; i < 6; ++i) {
    EXPECT_EQ(hit->rows()[i], rows[i]);
    EXPECT_EQ(Row(*scale, hit->rows()[i])[63], 0x80 + i);
  }
  kvtier::Lease moved = *std::move(hit);
  EXPECT_EQ(moved.matched_pages(), 6u);
  EXPECT_TRUE(moved.Release().ok());
  EXPECT_TRUE(moved.Release().ok());  // Empty now: nothing to release.

  // Deferred: no stream in a process without a GPU commits at once.
  const std::vector<int32_t> other = Tokens(8, 5000);
  auto other_hashes = ns->HashTokens(other.data(), other.size());
  ASSERT_TRUE(other_hashes.ok());
  auto r2 = ns->Reserve(2);
  ASSERT_TRUE(r2.ok()) << r2.status().message();
  auto pending = r2->CommitAfter(nullptr, {}, *other_hashes);
  ASSERT_TRUE(pending.ok()) << pending.status().message();
  auto waited = pending->Wait();
  ASSERT_TRUE(waited.ok()) << waited.status().message();
  EXPECT_EQ(waited->committed_pages, 2u);
  EXPECT_EQ(pending->Wait().status().code(),
            kvtier::StatusCode::kFailedPrecondition);
  auto other_hit = ns->Lookup(*other_hashes, /*pin=*/false);
  ASSERT_TRUE(other_hit.ok());
  EXPECT_EQ(other_hit->matched_pages(), 2u);

  auto aborted = ns->Reserve(3);
  ASSERT_TRUE(aborted.ok()) << aborted.status().message();
  EXPECT_TRUE(aborted->Abort().ok());
}

// Destroying a Reservation or PendingCommit handle frees what it held.
TEST_F(KvtierHppTest, DestructorsGiveRowsBack) {
  auto ns = client_->Attach(Options("raii", 8));
  ASSERT_TRUE(ns.ok()) << ns.status().message();
  for (int round = 0; round < 3; ++round) {
    auto r = ns->Reserve(8);  // Every row: a leak fails the next round.
    ASSERT_TRUE(r.ok()) << "round " << round << ": " << r.status().message();
  }
  auto a = ns->Reserve(4);
  auto b = ns->Reserve(4);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(ns->Reserve(1).status().code(),
            kvtier::StatusCode::kResourceExhausted);
  *a = *std::move(b);  // Drops a's four rows.
  EXPECT_EQ(a->page_rows().size(), 4u);
  EXPECT_TRUE(ns->Reserve(4).ok());
  {
    const std::vector<int32_t> t = Tokens(4, 1);
    auto h = ns->HashTokens(t.data(), t.size());
    ASSERT_TRUE(h.ok());
    auto r = ns->Reserve(1);
    ASSERT_TRUE(r.ok());
    auto p = r->CommitAfter(nullptr, {}, *h);
    ASSERT_TRUE(p.ok());
  }  // Never waited for: the handle is freed and the commit still happens.
  const std::vector<int32_t> t = Tokens(4, 1);
  auto h = ns->HashTokens(t.data(), t.size());
  ASSERT_TRUE(h.ok());
  for (int i = 0; i < 500; ++i) {
    auto l = ns->Lookup(*h, /*pin=*/false);
    ASSERT_TRUE(l.ok());
    if (l->matched_pages() == 1) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ADD_FAILURE() << "the unwaited commit never became visible";
}

// Evict from and rehydrate into a host "GPU pool" (the reference backend).
TEST_F(KvtierHppTest, TransferRoundTripsThroughTheBanks) {
  auto ns = client_->Attach(Options("transfer"));
  ASSERT_TRUE(ns.ok()) << ns.status().message();
  std::vector<uint8_t> kvpool(8 * 1024), scpool(8 * 64);
  for (size_t i = 0; i < kvpool.size(); ++i) kvpool[i] = uint8_t(i * 31 + 1);
  for (size_t i = 0; i < scpool.size(); ++i) scpool[i] = uint8_t(i * 17 + 3);
  kvtier::Pool pool;
  pool.num_pages = 8;
  pool.banks = {
      {"kv", {{reinterpret_cast<uint64_t>(kvpool.data()), 1024, 1024}}},
      {"scale", {{reinterpret_cast<uint64_t>(scpool.data()), 64, 64}}}};
  auto t = ns->CreateTransfer(kvtier::Backend::kReference, pool);
  ASSERT_TRUE(t.ok()) << t.status().message();

  auto r = ns->Reserve(3);
  ASSERT_TRUE(r.ok()) << r.status().message();
  const uint32_t from[3] = {5, 0, 7};
  ASSERT_TRUE(t->Evict(from, r->page_rows().data(), 3, nullptr).ok());
  const std::vector<int32_t> tokens = Tokens(12, 9);
  auto hashes = ns->HashTokens(tokens.data(), tokens.size());
  ASSERT_TRUE(hashes.ok());
  ASSERT_TRUE(r->Commit({}, *hashes).ok());

  auto lease = ns->Lookup(*hashes);
  ASSERT_TRUE(lease.ok());
  ASSERT_EQ(lease->usable_pages(), 3u);
  const std::vector<uint8_t> kv_before = kvpool, sc_before = scpool;
  std::fill(kvpool.begin(), kvpool.end(), 0);
  std::fill(scpool.begin(), scpool.end(), 0);
  const uint32_t to[3] = {1, 2, 3};
  ASSERT_TRUE(t->Rehydrate(to, lease->rows().data(), 3, nullptr).ok());
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(
        0, std::memcmp(&kvpool[to[i] * 1024], &kv_before[from[i] * 1024], 1024))
        << "page " << i;
    EXPECT_EQ(0, std::memcmp(&scpool[to[i] * 64], &sc_before[from[i] * 64], 64))
        << "page " << i;
  }
  const uint32_t bad[1] = {8};
  EXPECT_EQ(t->Evict(bad, lease->rows().data(), 1, nullptr).code(),
            kvtier::StatusCode::kInvalidArgument);
  // No snapshot bank: snapshot copies are refused with a status.
  EXPECT_FALSE(t->SaveSnapshot(0, 0, nullptr).ok());
  EXPECT_TRUE(lease->Release().ok());
}

// The cluster tier's calls against a daemon without one: a remote lookup
// is the local one with nothing remote; a chain that is not whole hashes is
// refused before any call; an unreachable daemon makes the lookup a miss
// and the prefetch UNAVAILABLE.
TEST_F(KvtierHppTest, RemoteLookupWithoutAClusterTier) {
  auto ns = client_->Attach(Options("remote"));
  ASSERT_TRUE(ns.ok()) << ns.status().message();
  const std::vector<int32_t> tokens = Tokens(4 * 4, 300);
  auto hashes = ns->HashTokens(tokens.data(), tokens.size());
  ASSERT_TRUE(hashes.ok()) << hashes.status().message();
  auto r = ns->Reserve(2);
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_TRUE(r->Commit({}, hashes->substr(0, 64)).ok());

  auto lease = ns->LookupRemote(*hashes);
  ASSERT_TRUE(lease.ok()) << lease.status().message();
  EXPECT_EQ(lease->matched_pages(), 2u);
  EXPECT_EQ(lease->rows().size(), 2u);
  EXPECT_EQ(lease->remote_pages(), 0u);
  EXPECT_EQ(lease->prefetching_pages(), 0u);
  EXPECT_TRUE(lease->Release().ok());
  EXPECT_EQ(ns->Prefetch(hashes->substr(0, 33)).status().code(),
            kvtier::StatusCode::kInvalidArgument);
  EXPECT_EQ(ns->LookupRemote(hashes->substr(0, 33)).status().code(),
            kvtier::StatusCode::kInvalidArgument);

  daemon_.Kill();
  for (int i = 0; i < 500 && client_->session_alive(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_FALSE(client_->session_alive());
  auto miss = ns->LookupRemote(*hashes);
  ASSERT_TRUE(miss.ok()) << miss.status().message();
  EXPECT_EQ(miss->matched_pages(), 0u);
  EXPECT_EQ(ns->Prefetch(*hashes).status().code(),
            kvtier::StatusCode::kUnavailable);
}

// Without a cluster tier a prefetch reports the local match and starts
// nothing.
TEST_F(KvtierHppTest, PrefetchWithoutAClusterTierStartsNothing) {
  auto ns = client_->Attach(Options("prefetch"));
  ASSERT_TRUE(ns.ok()) << ns.status().message();
  const std::vector<int32_t> tokens = Tokens(4 * 4, 400);
  auto hashes = ns->HashTokens(tokens.data(), tokens.size());
  ASSERT_TRUE(hashes.ok()) << hashes.status().message();
  auto r = ns->Reserve(2);
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_TRUE(r->Commit({}, hashes->substr(0, 64)).ok());
  auto p = ns->Prefetch(*hashes);
  ASSERT_TRUE(p.ok()) << p.status().message();
  EXPECT_EQ(p->local_pages, 2u);
  EXPECT_EQ(p->remote_pages, 0u);
  EXPECT_EQ(p->prefetching_pages, 0u);
}

}  // namespace
