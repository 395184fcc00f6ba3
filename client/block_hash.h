// Block hashing: the chain of page hashes that keys the daemon's prefix
// index. Every process attached to a namespace must compute identical bytes,
// so the format below is a cross-process (and cross-machine) contract:
//
//   h_{-1} = seed                                   (hash_bytes bytes)
//   h_i    = H( h_{i-1}                             (hash_bytes bytes)
//             || t_{i*P} .. t_{i*P+P-1}             (P * 4 bytes: each token
//                                                    id as a little-endian
//                                                    32-bit two's complement
//                                                    integer)
//             || extra_key )                        (its raw bytes, no length;
//                                                    unambiguous because it
//                                                    is last and the rest has
//                                                    a fixed length)
//
// where P is tokens_per_page and only full pages are hashed (a partial last
// page has no hash). H is one of:
// - kSha256:   SHA-256 (FIPS 180-4); 32-byte digest as specified.
// - kXxh3_128: XXH3-128 with seed 0 (xxHash >= 0.8); the 16-byte canonical
//              form (XXH128_canonicalFromHash: high 64 bits first, each half
//              big-endian), identical on every machine.
// The same extra_key is appended to every page of one call.
//
// Thread-safety: BlockHasher is immutable; its methods may be called
// concurrently.

#ifndef KVTIER_BLOCK_HASH_H_
#define KVTIER_BLOCK_HASH_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace kvtier::client {

// Wire values: stored in namespace layouts; never renumber.
enum class HashKind : uint32_t { kSha256 = 1, kXxh3_128 = 2 };

// Returns the digest size of `kind` (32 or 16), or 0 for an unknown kind.
uint32_t HashBytes(HashKind kind);

class BlockHasher {
 public:
  // Returns a hasher for `kind` whose chains start from `seed` (the
  // namespace's seed, exactly HashBytes(kind) bytes) over pages of
  // `tokens_per_page` tokens. INVALID_ARGUMENT if kind is unknown, seed has
  // the wrong length, or tokens_per_page is 0.
  static absl::StatusOr<BlockHasher> Create(HashKind kind,
                                            std::string_view seed,
                                            uint32_t tokens_per_page);

  HashKind kind() const { return kind_; }
  // Bytes of one hash: 32 for kSha256, 16 for kXxh3_128.
  uint32_t hash_bytes() const { return HashBytes(kind_); }
  uint32_t tokens_per_page() const { return tokens_per_page_; }
  const std::string& seed() const { return seed_; }

  // Hashes every full page of `tokens` starting from the seed and returns
  // the hashes back to back: (tokens.size() / tokens_per_page) * hash_bytes
  // bytes (empty if there is no full page).
  std::string HashChain(absl::Span<const int32_t> tokens,
                        std::string_view extra_key = {}) const;

  // As HashChain, continuing from `parent` (the hash of the page before
  // tokens[0]) instead of the seed: HashChainFrom(h_k, tokens after page k)
  // equals the tail of HashChain(all tokens). INVALID_ARGUMENT if parent is
  // not hash_bytes long.
  absl::StatusOr<std::string> HashChainFrom(
      std::string_view parent, absl::Span<const int32_t> tokens,
      std::string_view extra_key = {}) const;

 private:
  BlockHasher(HashKind kind, std::string seed, uint32_t tokens_per_page)
      : kind_(kind),
        seed_(std::move(seed)),
        tokens_per_page_(tokens_per_page) {}

  std::string Chain(std::string_view parent, absl::Span<const int32_t> tokens,
                    std::string_view extra_key) const;

  // Immutable after construction.
  HashKind kind_;
  std::string seed_;
  uint32_t tokens_per_page_;
};

}  // namespace kvtier::client

#endif  // KVTIER_BLOCK_HASH_H_
