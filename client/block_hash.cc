// Block hash chains over token pages: SHA-256 through OpenSSL's EVP
// interface, XXH3-128 through libxxhash's streaming interface. The byte
// format is documented in client/block_hash.h.
//
// Thread-safety: see client/block_hash.h. Each call uses its own digest
// context.

#include "client/block_hash.h"

#include <openssl/evp.h>
#include <xxhash.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"

namespace kvtier::client {
namespace {

// libcrypto fails here only when it cannot allocate: there is no sensible
// hash to return, and HashChain's contract has no error.
[[noreturn]] void CryptoFailure(const char* what) {
  std::fprintf(stderr, "kvtier: block hash: %s failed\n", what);
  std::abort();
}

// Writes tokens as little-endian uint32 into `out` (4 * tokens.size()).
void EncodeTokens(absl::Span<const int32_t> tokens, unsigned char* out) {
  for (int32_t t : tokens) {
    const uint32_t u = static_cast<uint32_t>(t);
    out[0] = static_cast<unsigned char>(u);
    out[1] = static_cast<unsigned char>(u >> 8);
    out[2] = static_cast<unsigned char>(u >> 16);
    out[3] = static_cast<unsigned char>(u >> 24);
    out += 4;
  }
}

struct MdCtxDeleter {
  void operator()(EVP_MD_CTX* c) const { EVP_MD_CTX_free(c); }
};
struct XxhStateDeleter {
  void operator()(XXH3_state_t* s) const { XXH3_freeState(s); }
};

}  // namespace

uint32_t HashBytes(HashKind kind) {
  switch (kind) {
    case HashKind::kSha256:
      return 32;
    case HashKind::kXxh3_128:
      return 16;
  }
  return 0;
}

absl::StatusOr<BlockHasher> BlockHasher::Create(HashKind kind,
                                                std::string_view seed,
                                                uint32_t tokens_per_page) {
  const uint32_t bytes = HashBytes(kind);
  if (bytes == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown hash kind ", static_cast<uint32_t>(kind)));
  }
  if (seed.size() != bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "seed is ", seed.size(), " bytes; this hash needs ", bytes));
  }
  if (tokens_per_page == 0) {
    return absl::InvalidArgumentError("tokens_per_page is 0");
  }
  if (kind == HashKind::kSha256 && EVP_sha256() == nullptr) {
    return absl::FailedPreconditionError("libcrypto offers no SHA-256");
  }
  return BlockHasher(kind, std::string(seed), tokens_per_page);
}

std::string BlockHasher::HashChain(absl::Span<const int32_t> tokens,
                                   std::string_view extra_key) const {
  return Chain(seed_, tokens, extra_key);
}

absl::StatusOr<std::string> BlockHasher::HashChainFrom(
    std::string_view parent, absl::Span<const int32_t> tokens,
    std::string_view extra_key) const {
  if (parent.size() != hash_bytes()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parent is ", parent.size(), " bytes; a hash is ", hash_bytes()));
  }
  return Chain(parent, tokens, extra_key);
}

std::string BlockHasher::Chain(std::string_view parent,
                               absl::Span<const int32_t> tokens,
                               std::string_view extra_key) const {
  const size_t bytes = hash_bytes();
  const size_t pages = tokens.size() / tokens_per_page_;
  std::string out(pages * bytes, '\0');
  if (pages == 0) return out;
  std::string page(static_cast<size_t>(tokens_per_page_) * 4, '\0');
  unsigned char* page_bytes = reinterpret_cast<unsigned char*>(page.data());
  unsigned char* hash = reinterpret_cast<unsigned char*>(out.data());
  const unsigned char* prev =
      reinterpret_cast<const unsigned char*>(parent.data());

  if (kind_ == HashKind::kSha256) {
    std::unique_ptr<EVP_MD_CTX, MdCtxDeleter> ctx(EVP_MD_CTX_new());
    if (!ctx) CryptoFailure("EVP_MD_CTX_new");
    const EVP_MD* md = EVP_sha256();
    for (size_t i = 0; i < pages; ++i) {
      EncodeTokens(tokens.subspan(i * tokens_per_page_, tokens_per_page_),
                   page_bytes);
      unsigned int len = 0;
      if (EVP_DigestInit_ex(ctx.get(), md, nullptr) != 1 ||
          EVP_DigestUpdate(ctx.get(), prev, bytes) != 1 ||
          EVP_DigestUpdate(ctx.get(), page_bytes, page.size()) != 1 ||
          EVP_DigestUpdate(ctx.get(), extra_key.data(), extra_key.size()) !=
              1 ||
          EVP_DigestFinal_ex(ctx.get(), hash, &len) != 1 || len != bytes) {
        CryptoFailure("SHA-256");
      }
      prev = hash;
      hash += bytes;
    }
    return out;
  }

  std::unique_ptr<XXH3_state_t, XxhStateDeleter> state(XXH3_createState());
  if (!state) CryptoFailure("XXH3_createState");
  for (size_t i = 0; i < pages; ++i) {
    EncodeTokens(tokens.subspan(i * tokens_per_page_, tokens_per_page_),
                 page_bytes);
    if (XXH3_128bits_reset(state.get()) != XXH_OK ||
        XXH3_128bits_update(state.get(), prev, bytes) != XXH_OK ||
        XXH3_128bits_update(state.get(), page_bytes, page.size()) != XXH_OK ||
        XXH3_128bits_update(state.get(), extra_key.data(), extra_key.size()) !=
            XXH_OK) {
      CryptoFailure("XXH3-128");
    }
    XXH128_canonical_t canonical;
    XXH128_canonicalFromHash(&canonical, XXH3_128bits_digest(state.get()));
    static_assert(sizeof(canonical.digest) == 16);
    std::memcpy(hash, canonical.digest, 16);
    prev = hash;
    hash += bytes;
  }
  return out;
}

}  // namespace kvtier::client
