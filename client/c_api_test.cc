// Tests of libkvtier's C ABI (linked against libkvtier.so itself): status
// codes and last-error messages for bad arguments, a whole
// attach/hash/reserve/commit/lookup/rehydrate flow through C calls, and the
// cluster tier's remote lookup and prefetch against a daemon without one.
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kvtier/kvtier.h"
#include "tests/daemon_process.h"

namespace {

using ::testing::HasSubstr;

class CApiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(daemon_.Start().ok());
    ASSERT_EQ(kvt_connect(daemon_.socket().c_str(), "c-test", 0, &client_),
              KVT_OK)
        << kvt_last_error();
    banks_[0] = {"kv", 1024, "fp8_e4m3"};
    banks_[1] = {"scale", 64, "fp32"};
    layout_.model = "c-api";
    layout_.tokens_per_page = 4;
    layout_.num_layers = 1;
    layout_.page_banks = banks_;
    layout_.num_page_banks = 2;
    options_.name = "cns";
    options_.layout = &layout_;
    options_.page_rows = 32;
  }
  void TearDown() override { kvt_client_close(client_); }

  kvtier::testing::DaemonProcess daemon_;
  kvt_client* client_ = nullptr;
  kvt_bank_layout banks_[2];
  kvt_layout layout_{};
  kvt_attach_options options_{};
};

TEST_F(CApiTest, BadArgumentsNameTheArgument) {
  kvt_client* c = nullptr;
  EXPECT_EQ(kvt_connect("/nonexistent/kvtier.sock", "x", 200, &c),
            KVT_UNAVAILABLE);
  EXPECT_THAT(kvt_last_error(), HasSubstr("/nonexistent/kvtier.sock"));
  EXPECT_EQ(c, nullptr);
  EXPECT_EQ(kvt_connect(nullptr, nullptr, 0, nullptr), KVT_INVALID_ARGUMENT);
  EXPECT_THAT(kvt_last_error(), HasSubstr("out"));

  kvt_namespace* ns = nullptr;
  EXPECT_EQ(kvt_attach(client_, nullptr, &ns), KVT_INVALID_ARGUMENT);
  kvt_attach_options o = options_;
  o.name = nullptr;
  EXPECT_EQ(kvt_attach(client_, &o, &ns), KVT_INVALID_ARGUMENT);
  EXPECT_THAT(kvt_last_error(), HasSubstr("options.name"));
  kvt_layout l = layout_;
  l.tokens_per_page = 0;
  o = options_;
  o.layout = &l;
  EXPECT_EQ(kvt_attach(client_, &o, &ns), KVT_INVALID_ARGUMENT);
  EXPECT_THAT(kvt_last_error(), HasSubstr("tokens_per_page"));
  l = layout_;
  l.hash_kind = 7;
  EXPECT_EQ(kvt_attach(client_, &o, &ns), KVT_INVALID_ARGUMENT);
  EXPECT_THAT(kvt_last_error(), HasSubstr("hash_kind"));
  EXPECT_EQ(ns, nullptr);

  ASSERT_EQ(kvt_attach(client_, &options_, &ns), KVT_OK) << kvt_last_error();
  kvt_bank_info info;
  EXPECT_EQ(kvt_page_bank(ns, 2, &info), KVT_OUT_OF_RANGE);
  EXPECT_EQ(kvt_snapshot_bank(ns, &info), KVT_NOT_FOUND);
  kvt_lease* lease = nullptr;
  EXPECT_EQ(kvt_lookup(ns, nullptr, 3, 1, &lease), KVT_INVALID_ARGUMENT);
  EXPECT_THAT(kvt_last_error(), HasSubstr("hashes"));
  uint8_t small[8];
  size_t n = 0;
  const int32_t tokens[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  EXPECT_EQ(kvt_hash_tokens(ns, tokens, 8, nullptr, 0, nullptr, 0, small,
                            sizeof(small), &n),
            KVT_OUT_OF_RANGE);
  EXPECT_THAT(kvt_last_error(), HasSubstr("out_cap"));
  kvt_reservation* r = nullptr;
  EXPECT_EQ(kvt_reserve(ns, 0, 0, &r), KVT_INVALID_ARGUMENT);
  EXPECT_EQ(kvt_reserve(ns, 33, 0, &r), KVT_INVALID_ARGUMENT);
  EXPECT_THAT(kvt_last_error(), HasSubstr("pages"));
  // Token ids for the KV events: checked here, and their count by the
  // daemon at the commit (which then leaves the reservation open).
  const uint32_t ids[3] = {1, 2, 3};
  EXPECT_EQ(kvt_reservation_set_token_ids(nullptr, ids, 3),
            KVT_INVALID_ARGUMENT);
  ASSERT_EQ(kvt_reserve(ns, 2, 0, &r), KVT_OK) << kvt_last_error();
  EXPECT_EQ(kvt_reservation_set_token_ids(r, nullptr, 3), KVT_INVALID_ARGUMENT);
  EXPECT_THAT(kvt_last_error(), HasSubstr("token_ids"));
  ASSERT_EQ(kvt_reservation_set_token_ids(r, ids, 3), KVT_OK);
  uint8_t two[64];
  for (int i = 0; i < 64; ++i) two[i] = static_cast<uint8_t>(i + 1);
  kvt_commit_result cr;
  EXPECT_EQ(kvt_commit(r, nullptr, 0, two, 2, nullptr, 0, &cr),
            KVT_INVALID_ARGUMENT);
  EXPECT_THAT(kvt_last_error(),
              HasSubstr("token_ids: 3 token ids for 2 pages"));
  const uint32_t eight[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  ASSERT_EQ(kvt_reservation_set_token_ids(r, eight, 8), KVT_OK);
  EXPECT_EQ(kvt_commit(r, nullptr, 0, two, 2, nullptr, 0, &cr), KVT_OK)
      << kvt_last_error();
  EXPECT_EQ(cr.committed_pages, 2u);
  r = nullptr;
  kvt_pool pool{};
  kvt_transfer* t = nullptr;
  EXPECT_EQ(kvt_transfer_create(ns, 5, &pool, 0, &t), KVT_INVALID_ARGUMENT);
  EXPECT_THAT(kvt_last_error(), HasSubstr("backend"));
  pool.num_banks = 1;
  EXPECT_EQ(kvt_transfer_create(ns, KVT_BACKEND_REFERENCE, &pool, 0, &t),
            KVT_INVALID_ARGUMENT);
  EXPECT_THAT(kvt_last_error(), HasSubstr("pool.banks"));
  kvt_namespace_close(ns);
}

TEST_F(CApiTest, WholeFlowThroughTheCAbi) {
  kvt_namespace* ns = nullptr;
  ASSERT_EQ(kvt_attach(client_, &options_, &ns), KVT_OK) << kvt_last_error();
  ASSERT_EQ(kvt_hash_bytes(ns), 32u);
  ASSERT_EQ(kvt_num_page_banks(ns), 2u);
  std::vector<int32_t> tokens(6 * 4 + 3);  // 6 full pages and a partial one.
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = 100 + i;
  std::vector<uint8_t> hashes(7 * 32);
  size_t n = 0;
  ASSERT_EQ(kvt_hash_tokens(ns, tokens.data(), tokens.size(), nullptr, 0,
                            nullptr, 0, hashes.data(), hashes.size(), &n),
            KVT_OK);
  ASSERT_EQ(n, 6u);

  kvt_reservation* r = nullptr;
  ASSERT_EQ(kvt_reserve(ns, 6, 0, &r), KVT_OK) << kvt_last_error();
  ASSERT_EQ(kvt_reservation_num_page_rows(r), 6u);
  std::vector<uint32_t> rows(kvt_reservation_page_rows(r),
                             kvt_reservation_page_rows(r) + 6);
  kvt_bank_info kv, scale;
  ASSERT_EQ(kvt_page_bank(ns, 0, &kv), KVT_OK);
  ASSERT_EQ(kvt_page_bank(ns, 1, &scale), KVT_OK);
  EXPECT_STREQ(kv.name, "kv");
  for (uint32_t i = 0; i < 6; ++i) {
    std::memset(static_cast<uint8_t*>(kv.base) + rows[i] * kv.row_stride,
                0x10 + i, kv.row_bytes);
    std::memset(static_cast<uint8_t*>(scale.base) + rows[i] * scale.row_stride,
                0x80 + i, scale.row_bytes);
  }
  kvt_pending_commit* pending = nullptr;
  ASSERT_EQ(kvt_commit_after(r, nullptr, nullptr, 0, hashes.data(), 6, nullptr,
                             0, &pending),
            KVT_OK)
      << kvt_last_error();
  kvt_commit_result result{};
  ASSERT_EQ(kvt_pending_wait(pending, 0, &result), KVT_OK) << kvt_last_error();
  EXPECT_EQ(result.committed_pages, 6u);

  kvt_lease* lease = nullptr;
  ASSERT_EQ(kvt_lookup(ns, hashes.data(), 6, 1, &lease), KVT_OK);
  ASSERT_EQ(kvt_lease_matched_pages(lease), 6u);
  ASSERT_EQ(kvt_lease_usable_pages(lease), 6u);
  const uint32_t* got = kvt_lease_rows(lease);
  for (uint32_t i = 0; i < 6; ++i) {
    EXPECT_EQ(got[i], rows[i]);
    const uint8_t* s =
        static_cast<const uint8_t*>(scale.base) + got[i] * scale.row_stride;
    EXPECT_EQ(s[0], 0x80 + i);
    EXPECT_EQ(s[63], 0x80 + i);
  }

  // Rehydrate into a host "pool" through the reference backend.
  std::vector<uint8_t> kvpool(8 * 1024), scpool(8 * 64);
  kvt_pool_tensor kvt{reinterpret_cast<uint64_t>(kvpool.data()), 1024, 1024};
  kvt_pool_tensor sct{reinterpret_cast<uint64_t>(scpool.data()), 64, 64};
  kvt_bank_pool bp[2] = {{"kv", &kvt, 1}, {"scale", &sct, 1}};
  kvt_pool pool{};
  pool.num_pages = 8;
  pool.banks = bp;
  pool.num_banks = 2;
  kvt_transfer* t = nullptr;
  ASSERT_EQ(kvt_transfer_create(ns, KVT_BACKEND_REFERENCE, &pool, 0, &t),
            KVT_OK)
      << kvt_last_error();
  const uint32_t gpu_pages[6] = {7, 6, 5, 4, 3, 2};
  ASSERT_EQ(kvt_rehydrate(t, gpu_pages, got, 6, nullptr), KVT_OK)
      << kvt_last_error();
  for (uint32_t i = 0; i < 6; ++i) {
    EXPECT_EQ(kvpool[gpu_pages[i] * 1024 + 517], 0x10 + i);
    EXPECT_EQ(scpool[gpu_pages[i] * 64 + 9], 0x80 + i);
  }
  const uint32_t bad_page[1] = {8};
  EXPECT_EQ(kvt_evict(t, bad_page, got, 1, nullptr), KVT_INVALID_ARGUMENT);
  kvt_transfer_free(t);
  EXPECT_EQ(kvt_lease_release(lease, nullptr), KVT_OK);
  kvt_namespace_close(ns);
}

TEST_F(CApiTest, RemoteLookupWithoutAClusterTier) {
  kvt_namespace* ns = nullptr;
  ASSERT_EQ(kvt_attach(client_, &options_, &ns), KVT_OK) << kvt_last_error();
  std::vector<int32_t> tokens(5 * 4);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = 7 * i + 1;
  std::vector<uint8_t> hashes(5 * 32);
  size_t n = 0;
  ASSERT_EQ(kvt_hash_tokens(ns, tokens.data(), tokens.size(), nullptr, 0,
                            nullptr, 0, hashes.data(), hashes.size(), &n),
            KVT_OK);
  ASSERT_EQ(n, 5u);
  kvt_reservation* r = nullptr;
  ASSERT_EQ(kvt_reserve(ns, 3, 0, &r), KVT_OK) << kvt_last_error();
  ASSERT_EQ(kvt_commit(r, nullptr, 0, hashes.data(), 3, nullptr, 0, nullptr),
            KVT_OK)
      << kvt_last_error();

  // Bad arguments name the argument and change nothing.
  kvt_lease* lease = nullptr;
  EXPECT_EQ(kvt_lookup_remote(nullptr, hashes.data(), 5, 1, &lease),
            KVT_INVALID_ARGUMENT);
  EXPECT_THAT(kvt_last_error(), HasSubstr("ns"));
  EXPECT_EQ(kvt_lookup_remote(ns, nullptr, 5, 1, &lease), KVT_INVALID_ARGUMENT);
  EXPECT_THAT(kvt_last_error(), HasSubstr("hashes"));
  EXPECT_EQ(kvt_lookup_remote(ns, hashes.data(), 5, 1, nullptr),
            KVT_INVALID_ARGUMENT);
  EXPECT_THAT(kvt_last_error(), HasSubstr("out"));
  EXPECT_EQ(lease, nullptr);
  kvt_prefetch_result pr{99, 99, 99};
  EXPECT_EQ(kvt_prefetch(nullptr, hashes.data(), 5, &pr), KVT_INVALID_ARGUMENT);
  EXPECT_THAT(kvt_last_error(), HasSubstr("ns"));
  EXPECT_EQ(kvt_prefetch(ns, nullptr, 5, &pr), KVT_INVALID_ARGUMENT);
  EXPECT_THAT(kvt_last_error(), HasSubstr("hashes"));
  EXPECT_EQ(pr.local_pages, 99u);  // Untouched on failure.
  EXPECT_EQ(kvt_lease_remote_pages(nullptr), 0u);
  EXPECT_EQ(kvt_lease_prefetching_pages(nullptr), 0u);

  // The local match, pinned as asked; nothing remote without a cluster tier.
  ASSERT_EQ(kvt_lookup_remote(ns, hashes.data(), 5, 1, &lease), KVT_OK)
      << kvt_last_error();
  EXPECT_EQ(kvt_lease_matched_pages(lease), 3u);
  EXPECT_EQ(kvt_lease_usable_pages(lease), 3u);
  EXPECT_EQ(kvt_lease_remote_pages(lease), 0u);
  EXPECT_EQ(kvt_lease_prefetching_pages(lease), 0u);
  // Pinned: the namespace's other 29 rows can be reserved, not 30.
  kvt_reservation* big = nullptr;
  EXPECT_EQ(kvt_reserve(ns, 30, 0, &big), KVT_RESOURCE_EXHAUSTED);
  ASSERT_EQ(kvt_reserve(ns, 29, 0, &big), KVT_OK) << kvt_last_error();
  ASSERT_EQ(kvt_abort(big), KVT_OK);
  ASSERT_EQ(kvt_lease_release(lease, nullptr), KVT_OK);
  ASSERT_EQ(kvt_lookup_remote(ns, hashes.data(), 5, 0, &lease), KVT_OK)
      << kvt_last_error();
  EXPECT_EQ(kvt_lease_matched_pages(lease), 3u);
  ASSERT_EQ(kvt_lease_release(lease, nullptr), KVT_OK);

  ASSERT_EQ(kvt_lookup(ns, hashes.data(), 5, 0, &lease), KVT_OK);
  EXPECT_EQ(kvt_lease_matched_pages(lease), 3u);
  EXPECT_EQ(kvt_lease_remote_pages(lease), 0u);  // Not a remote lookup.
  ASSERT_EQ(kvt_lease_release(lease, nullptr), KVT_OK);

  // While the daemon is unreachable: a miss, and UNAVAILABLE.
  daemon_.Kill();
  for (int i = 0; i < 500 && kvt_session_alive(client_); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(kvt_session_alive(client_), 0);
  ASSERT_EQ(kvt_lookup_remote(ns, hashes.data(), 5, 1, &lease), KVT_OK)
      << kvt_last_error();
  EXPECT_EQ(kvt_lease_matched_pages(lease), 0u);
  EXPECT_EQ(kvt_lease_remote_pages(lease), 0u);
  ASSERT_EQ(kvt_lease_release(lease, nullptr), KVT_OK);
  EXPECT_EQ(kvt_prefetch(ns, hashes.data(), 5, &pr), KVT_UNAVAILABLE);
  EXPECT_THAT(kvt_last_error(), HasSubstr("Prefetch"));
  kvt_namespace_close(ns);
}

TEST_F(CApiTest, PrefetchWithoutAClusterTierStartsNothing) {
  kvt_namespace* ns = nullptr;
  ASSERT_EQ(kvt_attach(client_, &options_, &ns), KVT_OK) << kvt_last_error();
  std::vector<int32_t> tokens(5 * 4);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = 11 * i + 3;
  std::vector<uint8_t> hashes(5 * 32);
  size_t n = 0;
  ASSERT_EQ(kvt_hash_tokens(ns, tokens.data(), tokens.size(), nullptr, 0,
                            nullptr, 0, hashes.data(), hashes.size(), &n),
            KVT_OK);
  kvt_reservation* r = nullptr;
  ASSERT_EQ(kvt_reserve(ns, 3, 0, &r), KVT_OK) << kvt_last_error();
  ASSERT_EQ(kvt_commit(r, nullptr, 0, hashes.data(), 3, nullptr, 0, nullptr),
            KVT_OK)
      << kvt_last_error();
  kvt_prefetch_result pr{99, 99, 99};
  ASSERT_EQ(kvt_prefetch(ns, hashes.data(), 5, &pr), KVT_OK)
      << kvt_last_error();
  EXPECT_EQ(pr.local_pages, 3u);
  EXPECT_EQ(pr.remote_pages, 0u);
  EXPECT_EQ(pr.prefetching_pages, 0u);
  EXPECT_EQ(kvt_prefetch(ns, hashes.data(), 5, nullptr), KVT_OK)
      << kvt_last_error();
  kvt_lease* lease = nullptr;
  ASSERT_EQ(kvt_lookup_remote(ns, hashes.data(), 5, 0, &lease), KVT_OK);
  EXPECT_EQ(kvt_lease_matched_pages(lease), 3u);
  EXPECT_EQ(kvt_lease_prefetching_pages(lease), 0u);
  ASSERT_EQ(kvt_lease_release(lease, nullptr), KVT_OK);
  kvt_namespace_close(ns);
}

}  // namespace
