// The checks every TierCore request shares: its api_version, and hashes
// given as bytes (one, or packed) parsed at a namespace's hash size. Each
// names the request field at fault in its INVALID_ARGUMENT /
// FAILED_PRECONDITION, so that a client knows what to fix.
//
// Thread-safety: pure functions, thread-safe.
#ifndef KVTIER_DAEMON_TIER_REQUEST_H_
#define KVTIER_DAEMON_TIER_REQUEST_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "daemon/prefix_index.h"

namespace kvtier::daemon {

// OK for api_version 0 (unset) or kApiVersion; FAILED_PRECONDITION naming
// both otherwise. Every request checks it first.
absl::Status CheckApiVersion(uint32_t v);

// One hash of exactly `hash_bytes` into *out (zero-padded), else
// INVALID_ARGUMENT naming `field`. REQUIRES: hash_bytes <= sizeof(HashKey).
absl::Status ParseOneHash(const std::string& bytes, uint32_t hash_bytes,
                          absl::string_view field, HashKey* out);

// A hash that may be absent (a parent_hash): empty `bytes` sets *present
// false and leaves *out alone; otherwise as ParseOneHash, *present true.
absl::Status ParseOptionalHash(const std::string& bytes, uint32_t hash_bytes,
                               absl::string_view field, HashKey* out,
                               bool* present);

// Splits packed `bytes` into keys of `hash_bytes` each (zero-padded) into
// *out; INVALID_ARGUMENT naming `field` when the size is not a multiple of
// hash_bytes or there are more than `max_count`. REQUIRES: 0 < hash_bytes
// <= sizeof(HashKey).
absl::Status ParseHashes(absl::string_view bytes, uint32_t hash_bytes,
                         uint32_t max_count, absl::string_view field,
                         std::vector<HashKey>* out);

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_TIER_REQUEST_H_
