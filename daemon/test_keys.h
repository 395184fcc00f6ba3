// Deterministic block hashes for the daemon's tests (journal_test,
// tier_recovery_test): Key(chain, page) is page `page` of chain `chain`,
// the same in every run and on every machine (the journal fixture depends
// on it).
#ifndef KVTIER_DAEMON_TEST_KEYS_H_
#define KVTIER_DAEMON_TEST_KEYS_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "daemon/prefix_index.h"

namespace kvtier::daemon::testing {

inline HashKey Key(uint64_t chain, uint64_t page) {
  HashKey k;
  uint64_t x = chain * 0x9e3779b97f4a7c15ull + page * 0xbf58476d1ce4e5b9ull + 1;
  for (int w = 0; w < 4; ++w) {
    x ^= x >> 31;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 29;
    std::memcpy(k.bytes.data() + 8 * w, &x, 8);
  }
  return k;
}

// Pages [from, from + n) of chain `chain`.
inline std::vector<HashKey> Chain(uint64_t chain, size_t n, size_t from = 0) {
  std::vector<HashKey> out;
  for (size_t i = from; i < from + n; ++i) out.push_back(Key(chain, i));
  return out;
}

}  // namespace kvtier::daemon::testing

#endif  // KVTIER_DAEMON_TEST_KEYS_H_
