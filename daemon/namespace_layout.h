// Namespace layouts: validation, fingerprints and hash seeds.
//
// A namespace is a compatibility domain: two engines share rows only when
// they present the same layout. The fingerprint is a SHA-256 over a canonical
// text form of the layout, so it is stable across daemon versions and
// restarts; the hash seed is derived from the namespace name, the fingerprint
// and the tenant salt, so chains of different namespaces or tenants never
// collide by construction.
//
// Thread-safety: free functions over values; safe from any thread.
#ifndef KVTIER_DAEMON_NAMESPACE_LAYOUT_H_
#define KVTIER_DAEMON_NAMESPACE_LAYOUT_H_

#include <array>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "kvtier/v1/tier.pb.h"

namespace kvtier::daemon {

using Fingerprint = std::array<uint8_t, 32>;

inline constexpr uint32_t kMaxPageBanks = 16;
inline constexpr uint32_t kMaxTpSize = 64;
inline constexpr size_t kMaxNamespaceName = 128;
inline constexpr size_t kMaxTenantSalt = 64;
inline constexpr uint64_t kMaxRowBytes = 1ull << 32;  // 4 GiB per row.

// Returns OK when `name` is a valid namespace name ([A-Za-z0-9._-]{1,128},
// not "." or ".."), else INVALID_ARGUMENT naming the field `field`.
absl::Status ValidateNamespaceName(absl::string_view name,
                                   absl::string_view field = "namespace");

// Returns OK when every field of `layout` is in range, else INVALID_ARGUMENT
// with a message naming the first offending field ("layout.page_banks[1]
// .row_bytes: must be > 0").
absl::Status ValidateLayout(const v1::Layout& layout);

// Returns the layout with defaults made explicit (tp_size 0 -> 1, hash kind
// UNSPECIFIED -> SHA256). REQUIRES: ValidateLayout(layout).ok().
v1::Layout NormalizeLayout(const v1::Layout& layout);

// Returns the fingerprint of a normalized layout.
Fingerprint LayoutFingerprint(const v1::Layout& normalized);

// Returns "" when the two normalized layouts are equal, else a description of
// the first difference ("tokens_per_page: existing 16, requested 32").
std::string DescribeLayoutDifference(const v1::Layout& existing,
                                     const v1::Layout& requested);

// Returns the hash length of a hash kind: 32 for SHA-256, 16 for XXH3-128.
uint32_t HashBytes(v1::HashKind kind);

// Returns h_{-1} of the namespace's chains: SHA-256 over a domain tag, the
// namespace name, the fingerprint and the salt, truncated to `hash_bytes`.
std::string DeriveHashSeed(absl::string_view namespace_name,
                           const Fingerprint& fingerprint,
                           absl::string_view tenant_salt, uint32_t hash_bytes);

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_NAMESPACE_LAYOUT_H_
