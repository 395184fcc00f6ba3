// Tests of the sparse-offload planning and reference implementations: the
// ensure configuration check, the reference LRU on hand-made and random
// selection traces (invariants and an independent list-based LRU model),
// the ensure copy and the mirror store (fp8 codes + fp32 scales).

#include "kernels/sparse_offload.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "gtest/gtest.h"

namespace kvtier::kernels {
namespace {

uint64_t Addr(const void* p) { return reinterpret_cast<uint64_t>(p); }

// A host-memory ensure: state, selection and translation buffers.
struct HostEnsure {
  explicit HostEnsure(const EnsureConfig& c)
      : memory(EnsureStateBytes(c) / 8 + 2),
        selected(c.max_batch * c.max_selected, -1),
        translated(c.max_batch * c.max_selected, -2),
        mirror_rows(c.num_logical) {
    p.state = LayOutEnsureState(c, memory.data());
    ResetEnsureStateHost(p.state);
    for (uint32_t l = 0; l < c.num_logical; ++l) mirror_rows[l] = l * 7 + 3;
    p.selected = selected.data();
    p.translated = translated.data();
    p.mirror_rows = mirror_rows.data();
  }
  std::vector<uint64_t> memory;
  std::vector<int32_t> selected;
  std::vector<int32_t> translated;
  std::vector<uint32_t> mirror_rows;
  EnsurePlanParams p;
};

// Independent model: timestamps per resident page, evict least recently
// used (ties: lowest slot) among pages not selected this step.
struct ModelLru {
  explicit ModelLru(uint32_t slots) : slot_page(slots, -1), stamp(slots, 0) {}
  std::vector<int32_t> slot_page;
  std::vector<uint32_t> stamp;
  std::map<int32_t, uint32_t> where;
  uint32_t step = 0;
  // Returns the slots of `sel` (-1 for padding).
  std::vector<int32_t> Step(const std::vector<int32_t>& sel) {
    ++step;
    std::vector<int32_t> missing;
    std::set<int32_t> seen;
    for (int32_t l : sel) {
      if (l < 0 || !seen.insert(l).second) continue;
      auto it = where.find(l);
      if (it != where.end()) {
        stamp[it->second] = step;
      } else {
        missing.push_back(l);
      }
    }
    std::vector<uint32_t> order;
    for (uint32_t s = 0; s < slot_page.size(); ++s) {
      if (stamp[s] != step) order.push_back(s);
    }
    std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
      return stamp[a] < stamp[b];
    });
    order.resize(missing.size());
    std::sort(order.begin(), order.end());
    for (size_t k = 0; k < missing.size(); ++k) {
      const uint32_t s = order[k];
      if (slot_page[s] >= 0) where.erase(slot_page[s]);
      slot_page[s] = missing[k];
      where[missing[k]] = s;
      stamp[s] = step;
    }
    std::vector<int32_t> out;
    for (int32_t l : sel) out.push_back(l < 0 ? -1 : where.at(l));
    return out;
  }
};

TEST(EnsureConfig, RefusesSelectionsThatCannotFit) {
  EXPECT_TRUE(CheckEnsureConfig({.num_slots = 64,
                                 .num_logical = 1000,
                                 .max_batch = 4,
                                 .max_selected = 16})
                  .ok());
  const absl::Status s = CheckEnsureConfig({.num_slots = 63,
                                            .num_logical = 1000,
                                            .max_batch = 4,
                                            .max_selected = 16});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("exceeds num_slots 63"), std::string::npos)
      << s.message();
  EXPECT_FALSE(CheckEnsureConfig({.num_slots = 64,
                                  .num_logical = 0,
                                  .max_batch = 1,
                                  .max_selected = 1})
                   .ok());
  EXPECT_FALSE(CheckEnsureConfig({.num_slots = 64,
                                  .num_logical = 10,
                                  .max_batch = 0,
                                  .max_selected = 1})
                   .ok());
}

TEST(EnsureReference, HandMadeTrace) {
  // P = 3 slots, one sequence of up to 3 pages.
  HostEnsure e(
      {.num_slots = 3, .num_logical = 10, .max_batch = 1, .max_selected = 3});
  auto step = [&](std::vector<int32_t> sel) {
    std::copy(sel.begin(), sel.end(), e.selected.begin());
    EXPECT_TRUE(RunEnsurePlanReference(e.p).ok());
    return std::vector<int32_t>(e.translated.begin(), e.translated.end());
  };
  // Empty pool: misses fill slots 0, 1 in order.
  EXPECT_EQ(step({5, 7, -1}), (std::vector<int32_t>{0, 1, -1}));
  EXPECT_EQ(*e.p.state.copy_count, 2u);
  EXPECT_EQ(e.p.state.copy_row[0], 5u * 7 + 3);
  // 5 hits; 2 takes the empty slot 2 (stamp 0 is the oldest).
  EXPECT_EQ(step({2, 5, -1}), (std::vector<int32_t>{2, 0, -1}));
  EXPECT_EQ(*e.p.state.copy_count, 1u);
  // 7 (slot 1, stamp 1) is the least recently used: 9 replaces it.
  EXPECT_EQ(step({9, -1, 9}), (std::vector<int32_t>{1, -1, 1}));
  EXPECT_EQ(*e.p.state.copy_count, 1u);
  EXPECT_EQ(e.p.state.logical_slot[7], -1);
  // All hits: nothing copied.
  EXPECT_EQ(step({9, 2, 5}), (std::vector<int32_t>{1, 2, 0}));
  EXPECT_EQ(*e.p.state.copy_count, 0u);
  // Out-of-range pages are dropped and counted, not aliased.
  EXPECT_EQ(step({10, -5, 5}), (std::vector<int32_t>{-1, -1, 0}));
  EXPECT_EQ(*e.p.state.drops, 2u);
}

TEST(EnsureReference, MatchesModelLruOnRandomTraces) {
  for (uint32_t seed = 1; seed <= 6; ++seed) {
    std::mt19937 rng(seed);
    const EnsureConfig c{.num_slots = 40 + seed * 8,
                         .num_logical = 300,
                         .max_batch = 4,
                         .max_selected = 8};
    HostEnsure e(c);
    ModelLru model(c.num_slots);
    // A skewed working set so both hits and evictions happen.
    std::geometric_distribution<int32_t> hot(0.02);
    for (int t = 0; t < 300; ++t) {
      for (auto& v : e.selected) {
        const uint32_t r = rng() % 10;
        v = r == 0 ? -1 : std::min<int32_t>(hot(rng), c.num_logical - 1);
      }
      ASSERT_TRUE(RunEnsurePlanReference(e.p).ok());
      const std::vector<int32_t> want = model.Step(e.selected);
      ASSERT_EQ(e.translated, want) << "seed " << seed << " step " << t;
      // Invariants: a bijection between resident pages and their slots,
      // and every copy lands in a slot now holding its page.
      std::set<int32_t> resident;
      for (uint32_t s = 0; s < c.num_slots; ++s) {
        const int32_t l = e.p.state.slot_logical[s];
        if (l < 0) continue;
        ASSERT_TRUE(resident.insert(l).second);
        ASSERT_EQ(e.p.state.logical_slot[l], static_cast<int32_t>(s));
      }
      for (uint32_t k = 0; k < *e.p.state.copy_count; ++k) {
        const int32_t l = e.p.state.slot_logical[e.p.state.copy_slot[k]];
        ASSERT_EQ(e.p.state.copy_row[k], e.mirror_rows[l]);
      }
    }
    EXPECT_EQ(*e.p.state.drops, 0u);
  }
}

TEST(EnsureReference, HitRateGrowsWithPoolSize) {
  std::vector<double> rates;
  for (uint32_t slots : {64u, 256u, 1024u}) {
    HostEnsure e({.num_slots = slots,
                  .num_logical = 2048,
                  .max_batch = 2,
                  .max_selected = 32});
    std::mt19937 rng(7);
    uint64_t misses = 0;
    uint64_t total = 0;
    for (int t = 0; t < 200; ++t) {
      for (auto& v : e.selected) v = static_cast<int32_t>(rng() % 512);
      ASSERT_TRUE(RunEnsurePlanReference(e.p).ok());
      misses += *e.p.state.copy_count;
      total += e.selected.size();
    }
    rates.push_back(1.0 - static_cast<double>(misses) / total);
  }
  EXPECT_LT(rates[0], rates[1]);
  EXPECT_LT(rates[1], rates[2]);
  EXPECT_GT(rates[2], 0.9);  // the whole working set (512) fits
}

TEST(EnsureCopyReference, CopiesEverySegmentOfMissedPages) {
  // Two tensors (one multi-chunk) in the pool, back to back in a host row.
  const std::vector<uint32_t> sizes = {40000, 52};
  const uint32_t slots = 4;
  const uint32_t rows = 6;
  const uint64_t row_bytes = sizes[0] + sizes[1];
  std::vector<uint8_t> host(rows * row_bytes);
  std::mt19937_64 rng(3);
  for (auto& b : host) b = static_cast<uint8_t>(rng());
  std::vector<uint8_t> pool0(slots * 40000, 0), pool1(slots * 64, 0);
  EnsureCopyParams p;
  p.segments[0] = {.gpu_base = Addr(pool0.data()),
                   .gpu_stride = 40000,
                   .host_base = Addr(host.data()),
                   .host_stride = row_bytes,
                   .bytes = sizes[0],
                   .chunk_begin = 0};
  p.segments[1] = {.gpu_base = Addr(pool1.data()),
                   .gpu_stride = 64,
                   .host_base = Addr(host.data() + sizes[0]),
                   .host_stride = row_bytes,
                   .bytes = sizes[1],
                   .chunk_begin = 3};
  std::vector<uint32_t> copy_slot = {2, 0}, copy_row = {5, 1};
  uint32_t count = 2;
  p.header = {.num_segments = 2,
              .chunks_per_item = 4,
              .max_ctas = 16,
              .max_items = 2,
              .copy_slot = copy_slot.data(),
              .copy_row = copy_row.data(),
              .copy_count = &count};
  ASSERT_TRUE(RunEnsureCopyReference(p).ok());
  for (uint32_t k = 0; k < 2; ++k) {
    const uint8_t* row = host.data() + copy_row[k] * row_bytes;
    EXPECT_EQ(0, std::memcmp(pool0.data() + copy_slot[k] * 40000, row, 40000));
    EXPECT_EQ(0,
              std::memcmp(pool1.data() + copy_slot[k] * 64, row + 40000, 52));
  }
  // Slots 1 and 3 untouched.
  EXPECT_TRUE(std::all_of(pool0.begin() + 40000, pool0.begin() + 80000,
                          [](uint8_t b) { return b == 0; }));
  // A wrong chunk table is refused and copies nothing.
  p.header.chunks_per_item = 3;
  EXPECT_EQ(RunEnsureCopyReference(p).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(MirrorStoreReference, Fp8CodesAndScalesFromThePool) {
  // Pool: 2 layers of fp8 codes (K+V, 16 tokens x 64 bytes) and fp32
  // scales (16 tokens x 4 bytes), 3 slots. Mirror: "kv" rows hold both
  // layers' codes, "scale" rows both layers' scales.
  const uint32_t tpp = 16, slots = 3, rows = 5;
  const uint32_t code_bpt = 64, scale_bpt = 4;
  std::vector<uint8_t> codes[2], scales[2];
  std::mt19937 rng(9);
  for (int l = 0; l < 2; ++l) {
    codes[l].resize(slots * tpp * code_bpt);
    scales[l].resize(slots * tpp * scale_bpt);
    for (auto& b : codes[l]) b = static_cast<uint8_t>(rng());
    for (auto& b : scales[l]) b = static_cast<uint8_t>(rng());
  }
  const uint64_t kv_row = 2 * tpp * code_bpt, scale_row = 2 * tpp * scale_bpt;
  std::vector<uint8_t> kv(rows * kv_row, 0), sc(rows * scale_row, 0);
  MirrorStoreParams p;
  for (int l = 0; l < 2; ++l) {
    p.segments[l] = {.pool_base = Addr(codes[l].data()),
                     .pool_page_stride = tpp * code_bpt,
                     .bank_base = Addr(kv.data() + l * tpp * code_bpt),
                     .bank_row_stride = kv_row,
                     .bytes_per_token = code_bpt};
    p.segments[2 + l] = {.pool_base = Addr(scales[l].data()),
                         .pool_page_stride = tpp * scale_bpt,
                         .bank_base = Addr(sc.data() + l * tpp * scale_bpt),
                         .bank_row_stride = scale_row,
                         .bytes_per_token = scale_bpt};
  }
  std::vector<uint32_t> mirror_rows = {4, 0, 2, 1};  // logical -> row
  std::vector<MirrorEntry> entries(8);
  entries[0] = {.logical = 2, .slot = 1, .token = 0};
  entries[1] = {.logical = 2, .slot = 1, .token = 15};
  entries[2] = {.logical = -1, .slot = 0, .token = 0};  // padding
  entries[3] = {.logical = 0, .slot = 2, .token = 3};
  entries[4] = {.logical = 9, .slot = 2, .token = 3};   // bad logical
  entries[5] = {.logical = 3, .slot = 0, .token = 16};  // bad token
  entries[6] = {.logical = 3, .slot = 0, .token = 1};   // beyond count
  uint32_t count = 6;
  unsigned long long drops = 0;
  p.header = {.num_segments = 4,
              .tokens_per_page = tpp,
              .max_entries = 8,
              .num_logical = 4,
              .num_slots = slots,
              .max_ctas = 16,
              .entries = entries.data(),
              .count = &count,
              .mirror_rows = mirror_rows.data(),
              .drops = &drops};
  ASSERT_TRUE(RunMirrorStoreReference(p).ok());
  EXPECT_EQ(drops, 2u);
  auto check = [&](const MirrorEntry& e, bool want_equal) {
    const uint32_t row = mirror_rows[e.logical];
    for (int l = 0; l < 2; ++l) {
      const bool c_eq =
          0 ==
          std::memcmp(kv.data() + row * kv_row + l * tpp * code_bpt +
                          e.token * code_bpt,
                      codes[l].data() + (e.slot * tpp + e.token) * code_bpt,
                      code_bpt);
      const bool s_eq =
          0 ==
          std::memcmp(sc.data() + row * scale_row + l * tpp * scale_bpt +
                          e.token * scale_bpt,
                      scales[l].data() + (e.slot * tpp + e.token) * scale_bpt,
                      scale_bpt);
      EXPECT_EQ(c_eq, want_equal);
      EXPECT_EQ(s_eq, want_equal);
    }
  };
  check(entries[0], true);
  check(entries[1], true);
  check(entries[3], true);
  check(entries[6], false);
  // Only the three stored tokens' bytes changed in the mirror.
  size_t nonzero = 0;
  for (uint8_t b : kv) nonzero += b != 0;
  EXPECT_LE(nonzero, 3u * 2 * code_bpt);
  p.header.num_segments = 0;
  EXPECT_EQ(RunMirrorStoreReference(p).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(MirrorStoreReference, PerPageTensorIsCopiedWholeOnAnyToken) {
  // A 100-byte per-page tensor (does not split into 16 tokens).
  std::vector<uint8_t> pool(2 * 112), bank(3 * 112, 0);
  for (size_t i = 0; i < pool.size(); ++i)
    pool[i] = static_cast<uint8_t>(i + 1);
  MirrorStoreParams p;
  p.segments[0] = {.pool_base = Addr(pool.data()),
                   .pool_page_stride = 112,
                   .bank_base = Addr(bank.data()),
                   .bank_row_stride = 112,
                   .bytes_per_token = 100,
                   .per_page = 1};
  std::vector<uint32_t> rows = {2, 0};
  MirrorEntry e{.logical = 0, .slot = 1, .token = 9};
  uint32_t count = 1;
  unsigned long long drops = 0;
  p.header = {.num_segments = 1,
              .tokens_per_page = 16,
              .max_entries = 1,
              .num_logical = 2,
              .num_slots = 2,
              .max_ctas = 1,
              .entries = &e,
              .count = &count,
              .mirror_rows = rows.data(),
              .drops = &drops};
  ASSERT_TRUE(RunMirrorStoreReference(p).ok());
  EXPECT_EQ(0, std::memcmp(bank.data() + 2 * 112, pool.data() + 112, 100));
  EXPECT_EQ(bank[2 * 112 + 100], 0);  // nothing past the tensor's bytes
  EXPECT_EQ(drops, 0u);
}

TEST(MirrorStoreReference, ARevokedStoreWritesNothing) {
  std::vector<uint8_t> pool(2 * 112, 7), bank(3 * 112, 0);
  MirrorStoreParams p;
  p.segments[0] = {.pool_base = Addr(pool.data()),
                   .pool_page_stride = 112,
                   .bank_base = Addr(bank.data()),
                   .bank_row_stride = 112,
                   .bytes_per_token = 100,
                   .per_page = 1};
  std::vector<uint32_t> rows = {2, 0};
  MirrorEntry e{.logical = 0, .slot = 1, .token = 0};
  uint32_t count = 1;
  unsigned long long drops = 0;
  volatile uint32_t revoked = 1;
  p.header = {.num_segments = 1,
              .tokens_per_page = 16,
              .max_entries = 1,
              .num_logical = 2,
              .num_slots = 2,
              .max_ctas = 1,
              .entries = &e,
              .count = &count,
              .mirror_rows = rows.data(),
              .drops = &drops,
              .revoked = &revoked};
  ASSERT_TRUE(RunMirrorStoreReference(p).ok());
  EXPECT_EQ(bank, std::vector<uint8_t>(3 * 112, 0));
  revoked = 0;  // The same store, not revoked, writes.
  ASSERT_TRUE(RunMirrorStoreReference(p).ok());
  EXPECT_EQ(bank[2 * 112], 7);
}

}  // namespace
}  // namespace kvtier::kernels
