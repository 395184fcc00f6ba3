// The checks every TierCore request shares (tier_request.h).
//
// Thread-safety: pure functions, thread-safe.
#include "daemon/tier_request.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "daemon/tier_options.h"

namespace kvtier::daemon {

absl::Status CheckApiVersion(uint32_t v) {
  if (v != 0 && v != kApiVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        "api_version: daemon speaks ", kApiVersion, ", request has ", v));
  }
  return absl::OkStatus();
}

absl::Status ParseOneHash(const std::string& bytes, uint32_t hash_bytes,
                          absl::string_view field, HashKey* out) {
  if (bytes.size() != hash_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": must be ", hash_bytes, " bytes, got ", bytes.size()));
  }
  out->bytes.fill(0);
  std::memcpy(out->bytes.data(), bytes.data(), hash_bytes);
  return absl::OkStatus();
}

absl::Status ParseOptionalHash(const std::string& bytes, uint32_t hash_bytes,
                               absl::string_view field, HashKey* out,
                               bool* present) {
  *present = !bytes.empty();
  if (!*present) return absl::OkStatus();
  return ParseOneHash(bytes, hash_bytes, field, out);
}

absl::Status ParseHashes(absl::string_view bytes, uint32_t hash_bytes,
                         uint32_t max_count, absl::string_view field,
                         std::vector<HashKey>* out) {
  if (bytes.size() % hash_bytes != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": ", bytes.size(),
        " bytes is not a multiple of the namespace's hash size ", hash_bytes));
  }
  const size_t n = bytes.size() / hash_bytes;
  if (n > max_count) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": ", n, " hashes exceed the limit of ", max_count));
  }
  out->resize(n);
  for (size_t i = 0; i < n; ++i) {
    HashKey& k = (*out)[i];
    k.bytes.fill(0);
    std::memcpy(k.bytes.data(), bytes.data() + i * hash_bytes, hash_bytes);
  }
  return absl::OkStatus();
}

}  // namespace kvtier::daemon
