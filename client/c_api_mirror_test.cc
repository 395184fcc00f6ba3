// Tests of the C ABI's mirrors, mirror adoption and device pools (linked
// against libkvtier.so itself) with a real kvtierd and no GPU: a reference
// mirror stores tokens and whole per-page tensors bit for bit, counts
// malformed entries, ensures rows back into the pool, is adopted into the
// prefix index, and stores nothing once its session ended; a plain
// reservation is adopted as a mirror; the device-pool calls answer a daemon
// without pools as the C++ API does. The CUDA paths run in
// python/tests/test_gpu_mirror.py.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kvtier/kvtier.h"
#include "tests/daemon_process.h"

namespace {

using ::testing::HasSubstr;

constexpr uint32_t kTokens = 4;        // tokens per page
constexpr uint64_t kKvBytes = 1024;    // 256 per token: token-major
constexpr uint64_t kScaleBytes = 102;  // not a multiple of 4: per page
constexpr uint64_t kScaleStride = 112;
constexpr uint32_t kSlots = 6;
constexpr uint32_t kLogical = 8;

template <typename F>
bool WaitUntil(F done) {
  const absl::Time end = absl::Now() + absl::Seconds(30);
  while (!done()) {
    if (absl::Now() > end) return false;
    absl::SleepFor(absl::Milliseconds(2));
  }
  return true;
}

class CApiMirrorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(daemon_.Start().ok());
    ASSERT_EQ(kvt_connect(daemon_.socket().c_str(), "c-mirror", 0, &client_),
              KVT_OK)
        << kvt_last_error();
    banks_[0] = {"kv", kKvBytes, "fp8_e4m3"};
    banks_[1] = {"scale", kScaleBytes, "fp32"};
    layout_.model = "c-mirror";
    layout_.tokens_per_page = kTokens;
    layout_.num_layers = 1;
    layout_.page_banks = banks_;
    layout_.num_page_banks = 2;
    options_.name = "mirror";
    options_.layout = &layout_;
    options_.page_rows = 32;
    options_.register_with_cuda = 0;
    ASSERT_EQ(kvt_attach(client_, &options_, &ns_), KVT_OK) << kvt_last_error();
    ASSERT_EQ(kvt_page_bank(ns_, 0, &kv_), KVT_OK);
    ASSERT_EQ(kvt_page_bank(ns_, 1, &scale_), KVT_OK);
    kv_pool_.resize(kKvBytes * kSlots);
    scale_pool_.resize(kScaleStride * kSlots);
    Randomize(1);
    tensors_[0] = {reinterpret_cast<uint64_t>(kv_pool_.data()), kKvBytes,
                   kKvBytes};
    tensors_[1] = {reinterpret_cast<uint64_t>(scale_pool_.data()), kScaleStride,
                   kScaleBytes};
    bank_pools_[0] = {"kv", &tensors_[0], 1};
    bank_pools_[1] = {"scale", &tensors_[1], 1};
    pool_.num_pages = kSlots;
    pool_.banks = bank_pools_;
    pool_.num_banks = 2;
    mopts_.logical_pages = kLogical;
    mopts_.gpu_slots = kSlots;
    mopts_.max_batch = 1;
    mopts_.max_selected = 4;
    mopts_.max_store_entries = 32;
    mopts_.backend = KVT_BACKEND_REFERENCE;
  }
  void TearDown() override {
    kvt_namespace_close(ns_);
    kvt_client_close(client_);
  }

  void Randomize(uint64_t seed) {
    std::mt19937_64 rng(seed);
    for (auto& b : kv_pool_) b = static_cast<uint8_t>(rng());
    for (auto& b : scale_pool_) b = static_cast<uint8_t>(rng());
  }
  uint8_t* KvRow(uint32_t row) {
    return static_cast<uint8_t*>(kv_.base) + row * kv_.row_stride;
  }
  uint8_t* ScaleRow(uint32_t row) {
    return static_cast<uint8_t*>(scale_.base) + row * scale_.row_stride;
  }
  uint8_t* KvSlot(uint32_t slot) { return kv_pool_.data() + slot * kKvBytes; }
  uint8_t* ScaleSlot(uint32_t slot) {
    return scale_pool_.data() + slot * kScaleStride;
  }
  std::vector<uint8_t> Hashes(uint32_t pages, int32_t base) {
    std::vector<int32_t> tokens(pages * kTokens);
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = base + i;
    std::vector<uint8_t> h(pages * 32);
    size_t n = 0;
    EXPECT_EQ(kvt_hash_tokens(ns_, tokens.data(), tokens.size(), nullptr, 0,
                              nullptr, 0, h.data(), h.size(), &n),
              KVT_OK);
    EXPECT_EQ(n, pages);
    return h;
  }
  // Every token of logical pages [0, pages), logical l in slot kSlots-1-l.
  std::vector<kvt_mirror_entry> AllTokens(uint32_t pages) {
    std::vector<kvt_mirror_entry> e;
    for (uint32_t l = 0; l < pages; ++l) {
      for (uint32_t t = 0; t < kTokens; ++t) {
        e.push_back({static_cast<int32_t>(l),
                     static_cast<int32_t>(kSlots - 1 - l),
                     static_cast<int32_t>(t)});
      }
    }
    return e;
  }
  static uint64_t Counter(const void* p) {
    uint64_t v = 0;
    std::memcpy(&v, p, sizeof(v));
    return v;
  }

  kvtier::testing::DaemonProcess daemon_;
  kvt_client* client_ = nullptr;
  kvt_namespace* ns_ = nullptr;
  kvt_bank_layout banks_[2];
  kvt_layout layout_{};
  kvt_attach_options options_{};
  kvt_bank_info kv_{}, scale_{};
  std::vector<uint8_t> kv_pool_, scale_pool_;
  kvt_pool_tensor tensors_[2];
  kvt_bank_pool bank_pools_[2];
  kvt_pool pool_{};
  kvt_mirror_options mopts_{};
};

TEST_F(CApiMirrorTest, BadArgumentsNameTheField) {
  kvt_mirror* m = nullptr;
  EXPECT_EQ(kvt_mirror_create(ns_, &pool_, nullptr, nullptr, &m),
            KVT_INVALID_ARGUMENT);
  EXPECT_THAT(kvt_last_error(), HasSubstr("options"));
  kvt_mirror_options o = mopts_;
  o.backend = 7;
  EXPECT_EQ(kvt_mirror_create(ns_, &pool_, &o, nullptr, &m),
            KVT_INVALID_ARGUMENT);
  EXPECT_THAT(kvt_last_error(), HasSubstr("options.backend"));
  o = mopts_;
  o.max_store_entries = 0;
  EXPECT_EQ(kvt_mirror_create(ns_, &pool_, &o, nullptr, &m),
            KVT_INVALID_ARGUMENT);
  EXPECT_THAT(kvt_last_error(), HasSubstr("max_store_entries"));
  o = mopts_;
  o.gpu_slots = kSlots + 1;
  EXPECT_EQ(kvt_mirror_create(ns_, &pool_, &o, nullptr, &m),
            KVT_INVALID_ARGUMENT);
  EXPECT_THAT(kvt_last_error(), HasSubstr("gpu_slots"));
  kvt_pool p = pool_;
  p.banks = nullptr;
  EXPECT_EQ(kvt_mirror_create(ns_, &p, &mopts_, nullptr, &m),
            KVT_INVALID_ARGUMENT);
  EXPECT_THAT(kvt_last_error(), HasSubstr("pool.banks"));
  kvt_bank_pool swapped[2] = {bank_pools_[1], bank_pools_[0]};
  p = pool_;
  p.banks = swapped;
  EXPECT_EQ(kvt_mirror_create(ns_, &p, &mopts_, nullptr, &m),
            KVT_INVALID_ARGUMENT);
  EXPECT_THAT(kvt_last_error(), HasSubstr("pool.banks[0].bank"));
  // The CUDA backend over banks not registered with CUDA (or a build
  // without CUDA) is refused either way.
  o = mopts_;
  o.backend = KVT_BACKEND_CUDA;
  EXPECT_EQ(kvt_mirror_create(ns_, &pool_, &o, nullptr, &m),
            KVT_FAILED_PRECONDITION);
  EXPECT_EQ(m, nullptr);

  ASSERT_EQ(kvt_mirror_create(ns_, &pool_, &mopts_, nullptr, &m), KVT_OK)
      << kvt_last_error();
  const uint32_t count = 1;
  EXPECT_EQ(kvt_mirror_store(m, nullptr, &count, nullptr),
            KVT_INVALID_ARGUMENT);
  EXPECT_THAT(kvt_last_error(), HasSubstr("entries"));
  int32_t selected[4] = {0, -1, -1, -1};
  EXPECT_EQ(kvt_mirror_ensure(m, selected, nullptr, nullptr),
            KVT_INVALID_ARGUMENT);
  EXPECT_THAT(kvt_last_error(), HasSubstr("translated"));
  EXPECT_EQ(kvt_mirror_num_rows(nullptr), 0u);
  EXPECT_EQ(kvt_mirror_revoked(nullptr), 0);
  kvt_mirror_close(m);
}

TEST_F(CApiMirrorTest, ReferenceStoreEnsureAndAdopt) {
  kvt_mirror* m = nullptr;
  ASSERT_EQ(kvt_mirror_create(ns_, &pool_, &mopts_, nullptr, &m), KVT_OK)
      << kvt_last_error();
  ASSERT_EQ(kvt_mirror_num_rows(m), kLogical);
  EXPECT_NE(kvt_mirror_reservation_id(m), 0u);
  std::vector<uint32_t> rows(kvt_mirror_rows(m), kvt_mirror_rows(m) + kLogical);
  EXPECT_EQ(kvt_mirror_revoked(m), 0);
  // Known bytes in every mirror row, to see what a store leaves alone.
  for (uint32_t r : rows) {
    std::memset(KvRow(r), 0xAB, kKvBytes);
    std::memset(ScaleRow(r), 0xCD, kScaleBytes);
  }

  // Every token of logical pages 0..3.
  std::vector<kvt_mirror_entry> e = AllTokens(4);
  e.resize(mopts_.max_store_entries, {-1, -1, 0});  // padding
  uint32_t count = 4 * kTokens;
  ASSERT_EQ(kvt_mirror_store(m, e.data(), &count, nullptr), KVT_OK)
      << kvt_last_error();
  for (uint32_t l = 0; l < 4; ++l) {
    EXPECT_EQ(0, std::memcmp(KvRow(rows[l]), KvSlot(kSlots - 1 - l), kKvBytes))
        << "logical " << l;
    EXPECT_EQ(0, std::memcmp(ScaleRow(rows[l]), ScaleSlot(kSlots - 1 - l),
                             kScaleBytes))
        << "logical " << l;
  }
  EXPECT_EQ(KvRow(rows[4])[0], 0xAB);
  EXPECT_EQ(Counter(kvt_mirror_store_drops(m)), 0u);

  // One token of logical page 4 (slot 0): just that token's kv bytes, and
  // the whole per-page scale tensor.
  kvt_mirror_entry one[1] = {{4, 0, 2}};
  count = 1;
  ASSERT_EQ(kvt_mirror_store(m, one, &count, nullptr), KVT_OK);
  const uint64_t tok = kKvBytes / kTokens;
  EXPECT_EQ(0, std::memcmp(KvRow(rows[4]) + 2 * tok, KvSlot(0) + 2 * tok, tok));
  for (uint64_t i = 0; i < kKvBytes; ++i) {
    if (i / tok == 2) continue;
    ASSERT_EQ(KvRow(rows[4])[i], 0xAB) << "byte " << i;
  }
  EXPECT_EQ(0, std::memcmp(ScaleRow(rows[4]), ScaleSlot(0), kScaleBytes));

  // Malformed entries (slot >= P, token >= tokens_per_page) are dropped and
  // counted; a count above max_store_entries is clamped.
  kvt_mirror_entry bad[2] = {{5, static_cast<int32_t>(kSlots), 0},
                             {5, 0, static_cast<int32_t>(kTokens)}};
  count = 2;
  ASSERT_EQ(kvt_mirror_store(m, bad, &count, nullptr), KVT_OK);
  EXPECT_EQ(Counter(kvt_mirror_store_drops(m)), 2u);
  EXPECT_EQ(KvRow(rows[5])[0], 0xAB);

  // Ensure: the pool is lost; pages 3, 0 and 1 come back from the mirror,
  // an out-of-range page is dropped.
  const std::vector<uint8_t> kv_before = kv_pool_;
  std::fill(kv_pool_.begin(), kv_pool_.end(), 0);
  std::fill(scale_pool_.begin(), scale_pool_.end(), 0);
  int32_t selected[4] = {3, 0, 99, 1};
  int32_t translated[4] = {7, 7, 7, 7};
  ASSERT_EQ(kvt_mirror_ensure(m, selected, translated, nullptr), KVT_OK)
      << kvt_last_error();
  EXPECT_EQ(translated[2], -1);
  EXPECT_EQ(Counter(kvt_mirror_ensure_drops(m)), 1u);
  std::vector<int32_t> slots;
  for (int i : {0, 1, 3}) {
    ASSERT_GE(translated[i], 0);
    ASSERT_LT(translated[i], static_cast<int32_t>(kSlots));
    slots.push_back(translated[i]);
    const uint32_t l = selected[i];
    EXPECT_EQ(0, std::memcmp(KvSlot(translated[i]), KvRow(rows[l]), kKvBytes));
    EXPECT_EQ(0, std::memcmp(KvSlot(translated[i]),
                             kv_before.data() + (kSlots - 1 - l) * kKvBytes,
                             kKvBytes));
    EXPECT_EQ(0, std::memcmp(ScaleSlot(translated[i]), ScaleRow(rows[l]),
                             kScaleBytes));
  }
  std::sort(slots.begin(), slots.end());
  EXPECT_EQ(std::unique(slots.begin(), slots.end()), slots.end());
  // A second step keeps resident pages where they are.
  int32_t again[4] = {1, -1, -1, -1};
  int32_t translated2[4];
  ASSERT_EQ(kvt_mirror_ensure(m, again, translated2, nullptr), KVT_OK);
  EXPECT_EQ(translated2[0], translated[3]);

  // Adopt pages 0..3 into the prefix index.
  const std::vector<uint8_t> h = Hashes(4, 500);
  const uint32_t logical[4] = {0, 1, 2, 3};
  const uint32_t out_of_range[4] = {0, 1, kLogical, 3};
  kvt_commit_result res{};
  EXPECT_EQ(kvt_mirror_adopt(m, out_of_range, 4, nullptr, 0, h.data(), 4, &res),
            KVT_INVALID_ARGUMENT);
  EXPECT_THAT(kvt_last_error(), HasSubstr("logical_pages[2]"));
  EXPECT_EQ(kvt_mirror_adopt(m, logical, 3, nullptr, 0, h.data(), 4, &res),
            KVT_INVALID_ARGUMENT);
  kvt_lease* lease = nullptr;
  ASSERT_EQ(kvt_lookup(ns_, h.data(), 4, 0, &lease), KVT_OK);
  EXPECT_EQ(kvt_lease_matched_pages(lease), 0u);
  ASSERT_EQ(kvt_lease_release(lease, nullptr), KVT_OK);
  ASSERT_EQ(kvt_mirror_adopt(m, logical, 4, nullptr, 0, h.data(), 4, &res),
            KVT_OK)
      << kvt_last_error();
  EXPECT_EQ(res.committed_pages, 4u);
  ASSERT_EQ(kvt_lookup(ns_, h.data(), 4, 1, &lease), KVT_OK);
  ASSERT_EQ(kvt_lease_usable_pages(lease), 4u);
  for (uint32_t i = 0; i < 4; ++i) {
    const uint32_t r = kvt_lease_rows(lease)[i];
    EXPECT_EQ(std::find(rows.begin(), rows.end(), r), rows.end());
    EXPECT_EQ(
        0, std::memcmp(KvRow(r), kv_before.data() + (kSlots - 1 - i) * kKvBytes,
                       kKvBytes));
    EXPECT_EQ(0, std::memcmp(ScaleRow(r), ScaleRow(rows[i]), kScaleBytes));
  }
  ASSERT_EQ(kvt_lease_release(lease, nullptr), KVT_OK);
  ASSERT_EQ(kvt_mirror_adopt(m, logical, 4, nullptr, 0, h.data(), 4, &res),
            KVT_OK);
  EXPECT_EQ(res.deduplicated_pages, 4u);
  kvt_mirror_close(m);
  // The mirror's rows went back: all 32 can be reserved but the 4 adopted.
  kvt_reservation* r = nullptr;
  ASSERT_EQ(kvt_reserve(ns_, 28, 0, &r), KVT_OK) << kvt_last_error();
  EXPECT_EQ(kvt_abort(r), KVT_OK);
}

TEST_F(CApiMirrorTest, AReservationIsAdoptedAsAMirror) {
  kvt_reservation* mirror = nullptr;
  ASSERT_EQ(kvt_reserve(ns_, 8, 0, &mirror), KVT_OK);
  const uint32_t* rows = kvt_reservation_page_rows(mirror);
  for (uint32_t k = 0; k < 8; ++k) {
    std::memset(KvRow(rows[k]), 0x10 + k, kKvBytes);
    std::memset(ScaleRow(rows[k]), 0x60 + k, kScaleBytes);
  }
  const std::vector<uint8_t> h = Hashes(3, 900);
  const uint32_t indices[3] = {7, 2, 5};
  const uint32_t bad[3] = {7, 8, 5};
  kvt_commit_result res{};
  EXPECT_EQ(
      kvt_adopt_mirror(ns_, nullptr, indices, 3, nullptr, 0, h.data(), 3, &res),
      KVT_INVALID_ARGUMENT);
  EXPECT_THAT(kvt_last_error(), HasSubstr("mirror"));
  EXPECT_EQ(
      kvt_adopt_mirror(ns_, mirror, bad, 3, nullptr, 0, h.data(), 3, &res),
      KVT_INVALID_ARGUMENT);
  EXPECT_THAT(kvt_last_error(), HasSubstr("mirror_indices[1]"));
  ASSERT_EQ(
      kvt_adopt_mirror(ns_, mirror, indices, 3, nullptr, 0, h.data(), 3, &res),
      KVT_OK)
      << kvt_last_error();
  EXPECT_EQ(res.committed_pages, 3u);
  kvt_lease* lease = nullptr;
  ASSERT_EQ(kvt_lookup(ns_, h.data(), 3, 1, &lease), KVT_OK);
  ASSERT_EQ(kvt_lease_usable_pages(lease), 3u);
  for (uint32_t i = 0; i < 3; ++i) {
    const uint8_t* kv = KvRow(kvt_lease_rows(lease)[i]);
    const uint8_t* sc = ScaleRow(kvt_lease_rows(lease)[i]);
    EXPECT_EQ(kv[0], 0x10 + indices[i]);
    EXPECT_EQ(kv[kKvBytes - 1], 0x10 + indices[i]);
    EXPECT_EQ(sc[kScaleBytes - 1], 0x60 + indices[i]);
  }
  ASSERT_EQ(kvt_lease_release(lease, nullptr), KVT_OK);
  // The mirror stays reserved: it can be adopted again, then aborted.
  ASSERT_EQ(
      kvt_adopt_mirror(ns_, mirror, indices, 3, nullptr, 0, h.data(), 3, &res),
      KVT_OK);
  EXPECT_EQ(res.deduplicated_pages, 3u);
  EXPECT_EQ(kvt_abort(mirror), KVT_OK);
}

TEST_F(CApiMirrorTest, ARevokedMirrorStoresNothing) {
  kvt_mirror* m = nullptr;
  ASSERT_EQ(kvt_mirror_create(ns_, &pool_, &mopts_, nullptr, &m), KVT_OK)
      << kvt_last_error();
  std::vector<uint32_t> rows(kvt_mirror_rows(m), kvt_mirror_rows(m) + kLogical);
  std::vector<kvt_mirror_entry> e = AllTokens(2);
  uint32_t count = static_cast<uint32_t>(e.size());
  ASSERT_EQ(kvt_mirror_store(m, e.data(), &count, nullptr), KVT_OK);
  const std::vector<uint8_t> stored(KvRow(rows[0]), KvRow(rows[0]) + kKvBytes);
  ASSERT_EQ(0, std::memcmp(stored.data(), KvSlot(kSlots - 1), kKvBytes));

  daemon_.Kill();
  ASSERT_TRUE(WaitUntil([&] { return kvt_mirror_revoked(m) != 0; }));
  ASSERT_TRUE(daemon_.Start().ok());
  ASSERT_TRUE(WaitUntil([&] { return kvt_session_alive(client_) != 0; }));
  EXPECT_NE(kvt_mirror_revoked(m), 0);  // for good: new rows need a new mirror
  Randomize(2);
  ASSERT_EQ(kvt_mirror_store(m, e.data(), &count, nullptr), KVT_OK);
  EXPECT_EQ(0, std::memcmp(KvRow(rows[0]), stored.data(), kKvBytes))
      << "a revoked mirror wrote its rows";
  EXPECT_NE(0, std::memcmp(KvRow(rows[0]), KvSlot(kSlots - 1), kKvBytes));
  const std::vector<uint8_t> h = Hashes(2, 77);
  const uint32_t logical[2] = {0, 1};
  kvt_commit_result res{};
  EXPECT_EQ(kvt_mirror_adopt(m, logical, 2, nullptr, 0, h.data(), 2, &res),
            KVT_UNAVAILABLE);
  kvt_mirror_close(m);
  // A new mirror over the new session works.
  ASSERT_EQ(kvt_mirror_create(ns_, &pool_, &mopts_, nullptr, &m), KVT_OK)
      << kvt_last_error();
  EXPECT_EQ(kvt_mirror_revoked(m), 0);
  ASSERT_EQ(kvt_mirror_store(m, e.data(), &count, nullptr), KVT_OK);
  EXPECT_EQ(0, std::memcmp(KvRow(kvt_mirror_rows(m)[0]), KvSlot(kSlots - 1),
                           kKvBytes));
  kvt_mirror_close(m);
}

TEST_F(CApiMirrorTest, DevicePoolCallsWithoutPools) {
  EXPECT_EQ(kvt_num_device_pools(ns_), 0u);
  EXPECT_EQ(kvt_device_pools_valid(ns_), 0);
  kvt_device_pool_info info{};
  EXPECT_EQ(kvt_device_pool(ns_, 0, &info), KVT_OUT_OF_RANGE);
  EXPECT_THAT(kvt_last_error(), HasSubstr("index"));
  kvt_device_pool_handle* pool = nullptr;
  EXPECT_EQ(kvt_device_pool_open(ns_, 0, &pool), KVT_INVALID_ARGUMENT);
  EXPECT_THAT(kvt_last_error(), HasSubstr("index"));
  EXPECT_EQ(pool, nullptr);
  EXPECT_EQ(kvt_device_pool_check(nullptr), KVT_INVALID_ARGUMENT);
  void* slot = nullptr;
  EXPECT_EQ(kvt_device_pool_slot(nullptr, 0, &slot), KVT_INVALID_ARGUMENT);

  const std::vector<uint8_t> h = Hashes(2, 40);
  kvt_reservation* r = nullptr;
  EXPECT_EQ(kvt_reserve_with_device(ns_, 0, 0, 1, 0, &r), KVT_INVALID_ARGUMENT);
  ASSERT_EQ(kvt_reserve_with_device(ns_, 2, 0, 0, 0, &r), KVT_OK)
      << kvt_last_error();
  EXPECT_EQ(kvt_reservation_num_device_snapshot_rows(r), 0u);
  kvt_commit_result res{};
  EXPECT_EQ(kvt_commit_with_device(r, nullptr, 0, h.data(), 2, nullptr, 0,
                                   nullptr, 1, &res),
            KVT_INVALID_ARGUMENT);
  EXPECT_THAT(kvt_last_error(), HasSubstr("device_snaps"));
  ASSERT_EQ(kvt_commit_with_device(r, nullptr, 0, h.data(), 2, nullptr, 0,
                                   nullptr, 0, &res),
            KVT_OK)
      << kvt_last_error();
  EXPECT_EQ(res.committed_pages, 2u);
  kvt_lease* lease = nullptr;
  EXPECT_EQ(kvt_lookup_with_device(ns_, h.data(), 2, 0, 1, &lease),
            KVT_INVALID_ARGUMENT);
  EXPECT_THAT(kvt_last_error(), HasSubstr("device_pool"));
  ASSERT_EQ(kvt_lookup(ns_, h.data(), 2, 1, &lease), KVT_OK);
  EXPECT_EQ(kvt_lease_usable_pages(lease), 2u);
  EXPECT_EQ(kvt_lease_has_device_snapshot(lease), 0);
  EXPECT_EQ(kvt_lease_release(lease, nullptr), KVT_OK);
}

}  // namespace
