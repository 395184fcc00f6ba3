// Deterministic test data shared by the multi-process tests' processes: the
// namespace layout they attach with, the token ids of a prompt, and the byte
// pattern of page i in bank b.
//
// Thread-safety: pure functions.
#ifndef KVTIER_TESTS_TEST_PATTERN_H_
#define KVTIER_TESTS_TEST_PATTERN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "client/client.h"

namespace kvtier::testing {

inline constexpr uint64_t kTestPageRows = 64;

// A small fp8-like layout: a "kv" bank and an odd-sized "scale" bank.
inline client::AttachOptions TestAttachOptions(const std::string& ns) {
  client::AttachOptions o;
  o.name = ns;
  o.layout.model = "kvtier-test";
  o.layout.tokens_per_page = 16;
  o.layout.num_layers = 2;
  o.layout.page_banks = {{"kv", 4096, "fp8_e4m3"}, {"scale", 100, "fp32"}};
  o.capacity.page_rows = kTestPageRows;
  return o;
}

inline std::vector<int32_t> TestTokens(uint64_t seed, size_t n) {
  std::vector<int32_t> t(n);
  for (size_t i = 0; i < n; ++i) {
    t[i] = static_cast<int32_t>((seed * 7919 + i * 31) % 50000);
  }
  return t;
}

inline uint64_t SplitMix(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

inline void FillPattern(uint8_t* row, uint64_t bytes, uint64_t seed,
                        uint32_t page, size_t bank) {
  uint64_t state = seed ^ (uint64_t{page} << 20) ^ (uint64_t{bank} << 44);
  for (uint64_t i = 0; i < bytes; ++i) {
    row[i] = static_cast<uint8_t>(SplitMix(state));
  }
}

inline bool CheckPattern(const uint8_t* row, uint64_t bytes, uint64_t seed,
                         uint32_t page, size_t bank) {
  uint64_t state = seed ^ (uint64_t{page} << 20) ^ (uint64_t{bank} << 44);
  for (uint64_t i = 0; i < bytes; ++i) {
    if (row[i] != static_cast<uint8_t>(SplitMix(state))) return false;
  }
  return true;
}

}  // namespace kvtier::testing

#endif  // KVTIER_TESTS_TEST_PATTERN_H_
