// Tests of the public C++ layer's mirrors, mirror adoption and device pools
// (kvtier/kvtier_device.hpp and the device-snapshot methods of Namespace,
// Lease and Reservation) as an engine uses them: built as C++17 with only the
// public include folder on the include path, linked only against
// libkvtier.so (and gtest), against a real kvtierd and no GPU. They follow
// c_api_mirror_test.cc: a reference mirror stores tokens and whole per-page
// tensors bit for bit, counts malformed entries, ensures rows back into the
// pool, is adopted into the prefix index and stores nothing once its session
// ended; a plain reservation is adopted as a mirror; the device-pool calls
// answer a daemon without pools. The CUDA paths run in
// python/tests/test_gpu_mirror.py.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "kvtier/kvtier.hpp"
// Beside this file, found without the project root on the include path.
#include "kvtier_hpp_test_daemon.h"

namespace {

using kvtier::StatusCode;
using kvtier_hpp_test::Daemon;

constexpr uint32_t kTokens = 4;        // tokens per page
constexpr uint64_t kKvBytes = 1024;    // 256 per token: token-major
constexpr uint64_t kScaleBytes = 102;  // not a multiple of 4: per page
constexpr uint64_t kScaleStride = 112;
constexpr uint32_t kSlots = 6;
constexpr uint32_t kLogical = 8;

bool Contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

template <typename F>
bool WaitUntil(F done) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!done()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

uint64_t Counter(const void* p) {
  uint64_t v = 0;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

class KvtierHppDeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(daemon_.WaitUntilListening());
    kvtier::ConnectOptions co;
    co.socket = daemon_.socket();
    co.client_name = "hpp-device";
    auto c = kvtier::Client::Connect(co);
    ASSERT_TRUE(c.ok()) << c.status().message();
    client_.emplace(*std::move(c));
    kvtier::AttachOptions o;
    o.name = "mirror";
    o.layout.model = "hpp-device";
    o.layout.tokens_per_page = kTokens;
    o.layout.num_layers = 1;
    o.layout.page_banks = {{"kv", kKvBytes, "fp8_e4m3"},
                           {"scale", kScaleBytes, "fp32"}};
    o.page_rows = 32;
    o.register_with_cuda = false;
    auto ns = client_->Attach(o);
    ASSERT_TRUE(ns.ok()) << ns.status().message();
    ns_.emplace(*std::move(ns));
    auto kv = ns_->page_bank(0);
    auto scale = ns_->page_bank(1);
    ASSERT_TRUE(kv.ok() && scale.ok());
    kv_ = *kv;
    scale_ = *scale;
    kv_pool_.resize(kKvBytes * kSlots);
    scale_pool_.resize(kScaleStride * kSlots);
    Randomize(1);
    pool_.num_pages = kSlots;
    pool_.banks = {
        {"kv",
         {{reinterpret_cast<uint64_t>(kv_pool_.data()), kKvBytes, kKvBytes}}},
        {"scale",
         {{reinterpret_cast<uint64_t>(scale_pool_.data()), kScaleStride,
           kScaleBytes}}}};
    mopts_.logical_pages = kLogical;
    mopts_.gpu_slots = kSlots;
    mopts_.max_batch = 1;
    mopts_.max_selected = 4;
    mopts_.max_store_entries = 32;
    mopts_.backend = kvtier::Backend::kReference;
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
  std::string Hashes(uint32_t pages, int32_t base) {
    std::vector<int32_t> tokens(pages * kTokens);
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = base + i;
    auto h = ns_->HashTokens(tokens.data(), tokens.size());
    EXPECT_TRUE(h.ok()) << h.status().message();
    EXPECT_EQ(h.ok() ? h->size() : 0, pages * 32u);
    return h.ok() ? *h : std::string();
  }
  // Every token of logical pages [0, pages), logical l in slot kSlots-1-l.
  static std::vector<kvtier::MirrorEntry> AllTokens(uint32_t pages) {
    std::vector<kvtier::MirrorEntry> e;
    for (uint32_t l = 0; l < pages; ++l) {
      for (uint32_t t = 0; t < kTokens; ++t) {
        e.push_back({static_cast<int32_t>(l),
                     static_cast<int32_t>(kSlots - 1 - l),
                     static_cast<int32_t>(t)});
      }
    }
    return e;
  }
  kvtier::Result<kvtier::Mirror> Create(const kvtier::MirrorOptions& o) {
    return ns_->CreateMirror(pool_, o, nullptr);
  }

  Daemon daemon_;
  std::optional<kvtier::Client> client_;
  std::optional<kvtier::Namespace> ns_;
  kvtier::BankInfo kv_, scale_;
  std::vector<uint8_t> kv_pool_, scale_pool_;
  kvtier::Pool pool_;
  kvtier::MirrorOptions mopts_;
};

TEST_F(KvtierHppDeviceTest, BadArgumentsNameTheField) {
  kvtier::MirrorOptions o = mopts_;
  o.backend = static_cast<kvtier::Backend>(7);
  auto m = Create(o);
  EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(m.status().message(), "options.backend"))
      << m.status().message();
  o = mopts_;
  o.max_store_entries = 0;
  m = Create(o);
  EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(m.status().message(), "max_store_entries"))
      << m.status().message();
  o = mopts_;
  o.gpu_slots = kSlots + 1;
  m = Create(o);
  EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(m.status().message(), "gpu_slots"))
      << m.status().message();
  const kvtier::Pool good = pool_;
  std::swap(pool_.banks[0], pool_.banks[1]);
  m = Create(mopts_);
  EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(m.status().message(), "pool.banks[0].bank"))
      << m.status().message();
  pool_ = good;
  // The CUDA backend over banks not registered with CUDA (or a build
  // without CUDA) is refused either way.
  o = mopts_;
  o.backend = kvtier::Backend::kCuda;
  EXPECT_EQ(Create(o).status().code(), StatusCode::kFailedPrecondition);

  m = Create(mopts_);
  ASSERT_TRUE(m.ok()) << m.status().message();
  const uint32_t count = 1;
  kvtier::Status s = m->Store(nullptr, &count, nullptr);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(s.message(), "entries")) << s.message();
  int32_t selected[4] = {0, -1, -1, -1};
  s = m->Ensure(selected, nullptr, nullptr);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(s.message(), "translated")) << s.message();
  // Adopt checks the packed chain itself.
  const uint32_t logical[1] = {0};
  EXPECT_EQ(m->Adopt({logical, 1}, {}, std::string(33, 'x')).status().code(),
            StatusCode::kInvalidArgument);
  // A moved-from mirror is empty: its calls are refused by the C layer.
  kvtier::Mirror moved = *std::move(m);
  EXPECT_EQ(moved.rows().size(), kLogical);
  EXPECT_TRUE(m->rows().empty());
  EXPECT_FALSE(m->revoked());
  EXPECT_EQ(m->Store(AllTokens(1).data(), &count, nullptr).code(),
            StatusCode::kInvalidArgument);
}

TEST_F(KvtierHppDeviceTest, ReferenceStoreEnsureAndAdopt) {
  auto m = Create(mopts_);
  ASSERT_TRUE(m.ok()) << m.status().message();
  ASSERT_EQ(m->rows().size(), kLogical);
  EXPECT_NE(m->reservation_id(), 0u);
  EXPECT_NE(m->c_handle(), nullptr);
  const std::vector<uint32_t> rows(m->rows().begin(), m->rows().end());
  EXPECT_FALSE(m->revoked());
  // Known bytes in every mirror row, to see what a store leaves alone.
  for (uint32_t r : rows) {
    std::memset(KvRow(r), 0xAB, kKvBytes);
    std::memset(ScaleRow(r), 0xCD, kScaleBytes);
  }

  // Every token of logical pages 0..3.
  std::vector<kvtier::MirrorEntry> e = AllTokens(4);
  e.resize(mopts_.max_store_entries, {-1, -1, 0});  // padding
  uint32_t count = 4 * kTokens;
  ASSERT_TRUE(m->Store(e.data(), &count, nullptr).ok());
  for (uint32_t l = 0; l < 4; ++l) {
    EXPECT_EQ(0, std::memcmp(KvRow(rows[l]), KvSlot(kSlots - 1 - l), kKvBytes))
        << "logical " << l;
    EXPECT_EQ(0, std::memcmp(ScaleRow(rows[l]), ScaleSlot(kSlots - 1 - l),
                             kScaleBytes))
        << "logical " << l;
  }
  EXPECT_EQ(KvRow(rows[4])[0], 0xAB);
  EXPECT_EQ(Counter(m->store_drops()), 0u);

  // One token of logical page 4 (slot 0): just that token's kv bytes, and
  // the whole per-page scale tensor.
  const kvtier::MirrorEntry one[1] = {{4, 0, 2}};
  count = 1;
  ASSERT_TRUE(m->Store(one, &count, nullptr).ok());
  const uint64_t tok = kKvBytes / kTokens;
  EXPECT_EQ(0, std::memcmp(KvRow(rows[4]) + 2 * tok, KvSlot(0) + 2 * tok, tok));
  for (uint64_t i = 0; i < kKvBytes; ++i) {
    if (i / tok == 2) continue;
    ASSERT_EQ(KvRow(rows[4])[i], 0xAB) << "byte " << i;
  }
  EXPECT_EQ(0, std::memcmp(ScaleRow(rows[4]), ScaleSlot(0), kScaleBytes));

  // Malformed entries (slot >= P, token >= tokens_per_page) are dropped and
  // counted.
  const kvtier::MirrorEntry bad[2] = {{5, static_cast<int32_t>(kSlots), 0},
                                      {5, 0, static_cast<int32_t>(kTokens)}};
  count = 2;
  ASSERT_TRUE(m->Store(bad, &count, nullptr).ok());
  EXPECT_EQ(Counter(m->store_drops()), 2u);
  EXPECT_EQ(KvRow(rows[5])[0], 0xAB);

  // Ensure: the pool is lost; pages 3, 0 and 1 come back from the mirror,
  // an out-of-range page is dropped.
  const std::vector<uint8_t> kv_before = kv_pool_;
  std::fill(kv_pool_.begin(), kv_pool_.end(), 0);
  std::fill(scale_pool_.begin(), scale_pool_.end(), 0);
  const int32_t selected[4] = {3, 0, 99, 1};
  int32_t translated[4] = {7, 7, 7, 7};
  ASSERT_TRUE(m->Ensure(selected, translated, nullptr).ok());
  EXPECT_EQ(translated[2], -1);
  EXPECT_EQ(Counter(m->ensure_drops()), 1u);
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
  const int32_t again[4] = {1, -1, -1, -1};
  int32_t translated2[4];
  ASSERT_TRUE(m->Ensure(again, translated2, nullptr).ok());
  EXPECT_EQ(translated2[0], translated[3]);

  // Adopt pages 0..3 into the prefix index.
  const std::string h = Hashes(4, 500);
  const std::vector<uint32_t> logical = {0, 1, 2, 3};
  const std::vector<uint32_t> out_of_range = {0, 1, kLogical, 3};
  auto res = m->Adopt(out_of_range, {}, h);
  EXPECT_EQ(res.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(res.status().message(), "logical_pages[2]"))
      << res.status().message();
  // Fewer pages than hashes.
  EXPECT_EQ(m->Adopt({logical.data(), 3}, {}, h).status().code(),
            StatusCode::kInvalidArgument);
  auto miss = ns_->Lookup(h, /*pin=*/false);
  ASSERT_TRUE(miss.ok());
  EXPECT_EQ(miss->matched_pages(), 0u);
  res = m->Adopt(logical, {}, h);
  ASSERT_TRUE(res.ok()) << res.status().message();
  EXPECT_EQ(res->committed_pages, 4u);
  auto lease = ns_->Lookup(h);
  ASSERT_TRUE(lease.ok());
  ASSERT_EQ(lease->usable_pages(), 4u);
  for (uint32_t i = 0; i < 4; ++i) {
    const uint32_t r = lease->rows()[i];
    EXPECT_EQ(std::find(rows.begin(), rows.end(), r), rows.end());
    EXPECT_EQ(
        0, std::memcmp(KvRow(r), kv_before.data() + (kSlots - 1 - i) * kKvBytes,
                       kKvBytes));
    EXPECT_EQ(0, std::memcmp(ScaleRow(r), ScaleRow(rows[i]), kScaleBytes));
  }
  ASSERT_TRUE(lease->Release().ok());
  res = m->Adopt(logical, {}, h);
  ASSERT_TRUE(res.ok()) << res.status().message();
  EXPECT_EQ(res->deduplicated_pages, 4u);
  { kvtier::Mirror closed = *std::move(m); }  // Closes the mirror.
  // The mirror's rows went back: all 32 can be reserved but the 4 adopted.
  auto r = ns_->Reserve(28);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_TRUE(r->Abort().ok());
}

TEST_F(KvtierHppDeviceTest, AReservationIsAdoptedAsAMirror) {
  auto mirror = ns_->Reserve(8);
  ASSERT_TRUE(mirror.ok()) << mirror.status().message();
  const kvtier::Span<uint32_t> rows = mirror->page_rows();
  for (uint32_t k = 0; k < 8; ++k) {
    std::memset(KvRow(rows[k]), 0x10 + k, kKvBytes);
    std::memset(ScaleRow(rows[k]), 0x60 + k, kScaleBytes);
  }
  const std::string h = Hashes(3, 900);
  const std::vector<uint32_t> indices = {7, 2, 5};
  const std::vector<uint32_t> bad = {7, 8, 5};
  auto res = ns_->AdoptMirror(*mirror, bad, {}, h);
  EXPECT_EQ(res.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(res.status().message(), "mirror_indices[1]"))
      << res.status().message();
  EXPECT_EQ(ns_->AdoptMirror(*mirror, indices, {}, h.substr(1)).status().code(),
            StatusCode::kInvalidArgument);
  res = ns_->AdoptMirror(*mirror, indices, {}, h);
  ASSERT_TRUE(res.ok()) << res.status().message();
  EXPECT_EQ(res->committed_pages, 3u);
  auto lease = ns_->Lookup(h);
  ASSERT_TRUE(lease.ok());
  ASSERT_EQ(lease->usable_pages(), 3u);
  for (uint32_t i = 0; i < 3; ++i) {
    const uint8_t* kv = KvRow(lease->rows()[i]);
    const uint8_t* sc = ScaleRow(lease->rows()[i]);
    EXPECT_EQ(kv[0], 0x10 + indices[i]);
    EXPECT_EQ(kv[kKvBytes - 1], 0x10 + indices[i]);
    EXPECT_EQ(sc[kScaleBytes - 1], 0x60 + indices[i]);
  }
  ASSERT_TRUE(lease->Release().ok());
  // The mirror stays reserved: it can be adopted again, then aborted.
  res = ns_->AdoptMirror(*mirror, indices, {}, h);
  ASSERT_TRUE(res.ok()) << res.status().message();
  EXPECT_EQ(res->deduplicated_pages, 3u);
  EXPECT_TRUE(mirror->Abort().ok());
  // A spent reservation is no mirror.
  res = ns_->AdoptMirror(*mirror, indices, {}, h);
  EXPECT_EQ(res.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(res.status().message(), "mirror"))
      << res.status().message();
}

TEST_F(KvtierHppDeviceTest, ARevokedMirrorStoresNothing) {
  auto m = Create(mopts_);
  ASSERT_TRUE(m.ok()) << m.status().message();
  const std::vector<uint32_t> rows(m->rows().begin(), m->rows().end());
  const std::vector<kvtier::MirrorEntry> e = AllTokens(2);
  const uint32_t count = static_cast<uint32_t>(e.size());
  ASSERT_TRUE(m->Store(e.data(), &count, nullptr).ok());
  const std::vector<uint8_t> stored(KvRow(rows[0]), KvRow(rows[0]) + kKvBytes);
  ASSERT_EQ(0, std::memcmp(stored.data(), KvSlot(kSlots - 1), kKvBytes));

  daemon_.Kill();
  ASSERT_TRUE(WaitUntil([&] { return m->revoked(); }));
  daemon_.Start();
  ASSERT_TRUE(daemon_.WaitUntilListening());
  ASSERT_TRUE(WaitUntil([&] { return client_->session_alive(); }));
  EXPECT_TRUE(m->revoked());  // For good: new rows need a new mirror.
  Randomize(2);
  ASSERT_TRUE(m->Store(e.data(), &count, nullptr).ok());
  EXPECT_EQ(0, std::memcmp(KvRow(rows[0]), stored.data(), kKvBytes))
      << "a revoked mirror wrote its rows";
  EXPECT_NE(0, std::memcmp(KvRow(rows[0]), KvSlot(kSlots - 1), kKvBytes));
  const std::string h = Hashes(2, 77);
  const std::vector<uint32_t> logical = {0, 1};
  EXPECT_EQ(m->Adopt(logical, {}, h).status().code(), StatusCode::kUnavailable);
  { kvtier::Mirror closed = *std::move(m); }
  // A new mirror over the new session works.
  m = Create(mopts_);
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_FALSE(m->revoked());
  ASSERT_TRUE(m->Store(e.data(), &count, nullptr).ok());
  EXPECT_EQ(0, std::memcmp(KvRow(m->rows()[0]), KvSlot(kSlots - 1), kKvBytes));
}

TEST_F(KvtierHppDeviceTest, DevicePoolCallsWithoutPools) {
  EXPECT_EQ(ns_->num_device_pools(), 0u);
  EXPECT_FALSE(ns_->device_pools_valid());
  auto info = ns_->device_pool(0);
  EXPECT_EQ(info.status().code(), StatusCode::kOutOfRange);
  EXPECT_TRUE(Contains(info.status().message(), "index"))
      << info.status().message();
  auto pool = ns_->OpenDevicePool(0);
  EXPECT_EQ(pool.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(pool.status().message(), "index"))
      << pool.status().message();

  const std::string h = Hashes(2, 40);
  EXPECT_EQ(ns_->ReserveWithDevice(0, 0, 1, 0).status().code(),
            StatusCode::kInvalidArgument);
  auto r = ns_->ReserveWithDevice(2, 0, 0, 0);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_TRUE(r->device_snapshot_rows().empty());
  EXPECT_EQ(r->page_rows().size(), 2u);
  // A device placement into a reservation without device slots is refused
  // by the daemon, naming it; the reservation stays open.
  auto res = r->Commit({}, h, {}, {{0, h.substr(0, 32)}});
  EXPECT_EQ(res.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(res.status().message(), "device_snapshots[0]"))
      << res.status().message();
  res = r->Commit({}, h);
  ASSERT_TRUE(res.ok()) << res.status().message();
  EXPECT_EQ(res->committed_pages, 2u);

  auto lease = ns_->LookupWithDevice(h, 0);
  EXPECT_EQ(lease.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(lease.status().message(), "device_pool"))
      << lease.status().message();
  EXPECT_EQ(ns_->LookupWithDevice(h.substr(1), 0).status().code(),
            StatusCode::kInvalidArgument);
  lease = ns_->Lookup(h);
  ASSERT_TRUE(lease.ok()) << lease.status().message();
  EXPECT_EQ(lease->usable_pages(), 2u);
  EXPECT_FALSE(lease->has_device_snapshot());
  EXPECT_TRUE(lease->Release().ok());
}

}  // namespace
