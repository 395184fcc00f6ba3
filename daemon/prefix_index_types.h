// The prefix index's vocabulary (daemon/prefix_index.h): block hash keys and
// the "no row" / "no node" sentinels, shared by the index, its row and node
// pools (daemon/row_pool.h, daemon/node_pool.h) and their callers.
//
// Thread-safety: constants and a plain value type; nothing to synchronise.
#ifndef KVTIER_DAEMON_PREFIX_INDEX_TYPES_H_
#define KVTIER_DAEMON_PREFIX_INDEX_TYPES_H_

#include <array>
#include <cstdint>
#include <string>

namespace kvtier::daemon {

// "No row" in row fields and vectors.
inline constexpr uint32_t kNoRow = 0xffffffff;
// "No node" in node ids (LookupResult::pin_node, tree links).
inline constexpr uint32_t kNoNode = 0xffffffff;

// A block hash. Hashes shorter than 32 bytes (hash_bytes 16) occupy the
// leading bytes; the index reads only the first hash_bytes bytes, and keys it
// returns have the rest zeroed.
struct HashKey {
  std::array<uint8_t, 32> bytes{};
};

// The key's first `hash_bytes` bytes, as the wire and the KV events carry it.
inline std::string KeyString(const HashKey& key, uint32_t hash_bytes) {
  return std::string(reinterpret_cast<const char*>(key.bytes.data()),
                     hash_bytes);
}

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_PREFIX_INDEX_TYPES_H_
