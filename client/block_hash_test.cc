// Tests of BlockHasher: fixed vectors (computed independently with Python's
// hashlib and the xxhash package), agreement with one-shot digests of the
// documented byte format, chain continuation, partial pages, and identical
// results in a forked child process.

#include "client/block_hash.h"

#include <openssl/sha.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "gtest/gtest.h"

namespace kvtier::client {
namespace {

std::string Seed(unsigned char first, size_t n) {
  std::string s;
  for (size_t i = 0; i < n; ++i) s.push_back(static_cast<char>(first + i));
  return s;
}

// The documented message of one page, built independently of the library:
// parent || tokens as little-endian uint32 || extra.
std::string Message(const std::string& parent,
                    const std::vector<int32_t>& tokens, size_t begin,
                    size_t count, const std::string& extra) {
  std::string m = parent;
  for (size_t i = begin; i < begin + count; ++i) {
    const uint32_t u = static_cast<uint32_t>(tokens[i]);
    for (int b = 0; b < 4; ++b) m.push_back(static_cast<char>(u >> (8 * b)));
  }
  return m + extra;
}

std::string OneShotSha256(const std::string& m) {
  unsigned char d[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(m.data()), m.size(), d);
  return std::string(reinterpret_cast<char*>(d), sizeof(d));
}

std::string OneShotXxh3(const std::string& m) {
  const XXH128_hash_t h = XXH3_128bits(m.data(), m.size());
  std::string out;
  for (int b = 7; b >= 0; --b)
    out.push_back(static_cast<char>(h.high64 >> (8 * b)));
  for (int b = 7; b >= 0; --b)
    out.push_back(static_cast<char>(h.low64 >> (8 * b)));
  return out;
}

const std::vector<int32_t> kSmallTokens = {1, 2, 3, 4,  5,
                                           6, 7, 8, -1, 2147483647};

TEST(BlockHasher, KnownSha256Chain) {
  auto hasher = BlockHasher::Create(HashKind::kSha256, Seed(0, 32), 4);
  ASSERT_TRUE(hasher.ok()) << hasher.status();
  EXPECT_EQ(hasher->hash_bytes(), 32u);
  // Ten tokens: two full pages; the last two tokens are not hashed.
  EXPECT_EQ(absl::BytesToHexString(hasher->HashChain(kSmallTokens)),
            "4c187568241c551aeb5ae17113cd0f8e0091594e0f75734e87a343850edbd58c"
            "e6034ef3a4033b60a1a5938be640dd7e32e818e4c83256678bb202bf0527cfdf");
  EXPECT_EQ(absl::BytesToHexString(hasher->HashChain(kSmallTokens, "lora:7")),
            "c6c6a3ed3b034366c3e8cfc7bffb7183ac2b445498a184aa0ef748a99a17d645"
            "00a58fc23218377abc9a8bb9eedb2a0921f0affb113da171a73d9c82d9b182c8");
}

TEST(BlockHasher, KnownXxh3Chain) {
  auto hasher = BlockHasher::Create(HashKind::kXxh3_128, Seed(0xa0, 16), 4);
  ASSERT_TRUE(hasher.ok()) << hasher.status();
  EXPECT_EQ(hasher->hash_bytes(), 16u);
  EXPECT_EQ(absl::BytesToHexString(hasher->HashChain(kSmallTokens)),
            "391b554a844bae94794774ab7a53b8bb"
            "2891fea42d6020d034dba3434b42e65b");
  EXPECT_EQ(absl::BytesToHexString(hasher->HashChain(kSmallTokens, "lora:7")),
            "ebe0fd8d3d8e563c7cc2957d6925b29b"
            "de7f3e2ad1baa997a595fcd148b50490");
}

TEST(BlockHasher, MatchesOneShotDigestsOfTheDocumentedFormat) {
  std::mt19937 rng(7);
  std::vector<int32_t> tokens(1000);
  for (auto& t : tokens) t = static_cast<int32_t>(rng());
  const std::string extra("tenant-salt\x00\x01", 13);
  for (HashKind kind : {HashKind::kSha256, HashKind::kXxh3_128}) {
    const size_t bytes = kind == HashKind::kSha256 ? 32 : 16;
    const std::string seed = Seed(3, bytes);
    auto hasher = BlockHasher::Create(kind, seed, 16);
    ASSERT_TRUE(hasher.ok());
    const std::string chain = hasher->HashChain(tokens, extra);
    ASSERT_EQ(chain.size(), (1000 / 16) * bytes);
    std::string parent = seed;
    for (size_t i = 0; i < 1000 / 16; ++i) {
      const std::string m = Message(parent, tokens, i * 16, 16, extra);
      const std::string want =
          kind == HashKind::kSha256 ? OneShotSha256(m) : OneShotXxh3(m);
      ASSERT_EQ(chain.substr(i * bytes, bytes), want) << "page " << i;
      parent = want;
    }
  }
}

TEST(BlockHasher, PartialLastPageIsNotHashed) {
  auto hasher = BlockHasher::Create(HashKind::kSha256, Seed(0, 32), 16);
  ASSERT_TRUE(hasher.ok());
  std::vector<int32_t> tokens(47);
  for (size_t i = 0; i < tokens.size(); ++i)
    tokens[i] = static_cast<int32_t>(i);
  const std::string chain = hasher->HashChain(tokens);
  EXPECT_EQ(chain.size(), 2u * 32);
  EXPECT_EQ(chain, hasher->HashChain(absl::MakeSpan(tokens).subspan(0, 32)));
  EXPECT_TRUE(hasher->HashChain(absl::MakeSpan(tokens).subspan(0, 15)).empty());
  EXPECT_TRUE(hasher->HashChain({}).empty());
}

TEST(BlockHasher, HashChainFromContinuesAChain) {
  for (HashKind kind : {HashKind::kSha256, HashKind::kXxh3_128}) {
    const uint32_t bytes = kind == HashKind::kSha256 ? 32 : 16;
    auto hasher = BlockHasher::Create(kind, Seed(9, bytes), 8);
    ASSERT_TRUE(hasher.ok());
    std::vector<int32_t> tokens(8 * 10 + 3);
    for (size_t i = 0; i < tokens.size(); ++i)
      tokens[i] = static_cast<int32_t>(i * 31);
    const std::string all = hasher->HashChain(tokens, "x");
    ASSERT_EQ(all.size(), 10u * bytes);
    const std::string parent = all.substr(3 * bytes, bytes);  // h_3
    auto tail = hasher->HashChainFrom(
        parent, absl::MakeSpan(tokens).subspan(4 * 8), "x");
    ASSERT_TRUE(tail.ok());
    EXPECT_EQ(*tail, all.substr(4 * bytes));
    // Starting from the seed is HashChain.
    auto from_seed = hasher->HashChainFrom(hasher->seed(), tokens, "x");
    ASSERT_TRUE(from_seed.ok());
    EXPECT_EQ(*from_seed, all);
  }
}

TEST(BlockHasher, ExtraKeyAndSeedChangeEveryHash) {
  auto a = BlockHasher::Create(HashKind::kSha256, Seed(0, 32), 4);
  auto b = BlockHasher::Create(HashKind::kSha256, Seed(1, 32), 4);
  ASSERT_TRUE(a.ok() && b.ok());
  const std::string plain = a->HashChain(kSmallTokens);
  const std::string keyed = a->HashChain(kSmallTokens, "k");
  const std::string reseeded = b->HashChain(kSmallTokens);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_NE(plain.substr(i * 32, 32), keyed.substr(i * 32, 32));
    EXPECT_NE(plain.substr(i * 32, 32), reseeded.substr(i * 32, 32));
  }
}

TEST(BlockHasher, ForkedChildComputesIdenticalHashes) {
  std::vector<int32_t> tokens(4096);
  for (size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = static_cast<int32_t>(i * 2654435761u);
  }
  for (HashKind kind : {HashKind::kSha256, HashKind::kXxh3_128}) {
    const uint32_t bytes = kind == HashKind::kSha256 ? 32 : 16;
    auto hasher = BlockHasher::Create(kind, Seed(5, bytes), 16);
    ASSERT_TRUE(hasher.ok());
    const std::string parent_chain = hasher->HashChain(tokens, "ns");
    int fds[2];
    ASSERT_EQ(pipe(fds), 0);
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      close(fds[0]);
      // A fresh hasher in the child: nothing shared but the inputs.
      auto child = BlockHasher::Create(kind, Seed(5, bytes), 16);
      const std::string c = child.ok() ? child->HashChain(tokens, "ns") : "";
      size_t off = 0;
      while (off < c.size()) {
        const ssize_t n = write(fds[1], c.data() + off, c.size() - off);
        if (n <= 0) _exit(2);
        off += static_cast<size_t>(n);
      }
      close(fds[1]);
      _exit(child.ok() ? 0 : 1);
    }
    close(fds[1]);
    std::string from_child;
    char buf[4096];
    ssize_t n;
    while ((n = read(fds[0], buf, sizeof(buf))) > 0) from_child.append(buf, n);
    close(fds[0]);
    int wstatus = 0;
    ASSERT_EQ(waitpid(pid, &wstatus, 0), pid);
    ASSERT_TRUE(WIFEXITED(wstatus));
    ASSERT_EQ(WEXITSTATUS(wstatus), 0);
    EXPECT_EQ(from_child.size(), 256u * bytes);
    EXPECT_EQ(from_child, parent_chain);
  }
}

TEST(BlockHasher, RejectsBadArguments) {
  auto short_seed = BlockHasher::Create(HashKind::kSha256, Seed(0, 16), 16);
  EXPECT_EQ(short_seed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(short_seed.status().message().find("seed"), std::string::npos);
  auto zero_tpp = BlockHasher::Create(HashKind::kXxh3_128, Seed(0, 16), 0);
  EXPECT_EQ(zero_tpp.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(zero_tpp.status().message().find("tokens_per_page"),
            std::string::npos);
  auto unknown = BlockHasher::Create(static_cast<HashKind>(3), Seed(0, 16), 16);
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(unknown.status().message().find("unknown hash kind"),
            std::string::npos);
  auto hasher = BlockHasher::Create(HashKind::kXxh3_128, Seed(0, 16), 4);
  ASSERT_TRUE(hasher.ok());
  auto bad_parent = hasher->HashChainFrom(Seed(0, 32), kSmallTokens);
  EXPECT_EQ(bad_parent.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad_parent.status().message().find("parent"), std::string::npos);
}

}  // namespace
}  // namespace kvtier::client
