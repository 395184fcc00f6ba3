// Tests of Crc32c: the standard check value, RFC 3720's vectors, continuing
// a CRC, and bit-for-bit agreement on random buffers with the table-driven
// implementation that wrote every journal and fence registry up to now
// (kept here only as the reference: the values are on disk).
#include "common/crc32c.h"

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace kvtier {
namespace {

// The slicing-by-8 CRC-32C that daemon/journal.cc (commit 07a59f1) carried
// before ISA-L replaced it, unchanged.
struct ReferenceTables {
  uint32_t t[8][256];
  constexpr ReferenceTables() : t() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0x82f63b78u & (0u - (c & 1)));
      t[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; ++i) {
      for (int s = 1; s < 8; ++s)
        t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xff];
    }
  }
};
constexpr ReferenceTables kRef;

uint32_t ReferenceCrc32c(const void* data, size_t n, uint32_t crc) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  uint32_t c = ~crc;
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    w ^= c;
    c = kRef.t[7][w & 0xff] ^ kRef.t[6][(w >> 8) & 0xff] ^
        kRef.t[5][(w >> 16) & 0xff] ^ kRef.t[4][(w >> 24) & 0xff] ^
        kRef.t[3][(w >> 32) & 0xff] ^ kRef.t[2][(w >> 40) & 0xff] ^
        kRef.t[1][(w >> 48) & 0xff] ^ kRef.t[0][w >> 56];
    p += 8;
    n -= 8;
  }
  while (n-- > 0) c = (c >> 8) ^ kRef.t[0][(c ^ *p++) & 0xff];
  return ~c;
}

TEST(Crc32cTest, CheckValueAndEmpty) {
  const std::string s = "123456789";
  EXPECT_EQ(Crc32c(s.data(), s.size()), 0xe3069283u);
  EXPECT_EQ(Crc32c(nullptr, 0), 0u);
  EXPECT_EQ(Crc32c(nullptr, 0, 0x12345678u), 0x12345678u);
}

// RFC 3720, appendix B.4.
TEST(Crc32cTest, Rfc3720Vectors) {
  std::vector<uint8_t> b(32);
  std::fill(b.begin(), b.end(), 0x00);
  EXPECT_EQ(Crc32c(b.data(), b.size()), 0x8a9136aau);
  std::fill(b.begin(), b.end(), 0xff);
  EXPECT_EQ(Crc32c(b.data(), b.size()), 0x62a8ab43u);
  for (int i = 0; i < 32; ++i) b[i] = static_cast<uint8_t>(i);
  EXPECT_EQ(Crc32c(b.data(), b.size()), 0x46dd794eu);
  for (int i = 0; i < 32; ++i) b[i] = static_cast<uint8_t>(31 - i);
  EXPECT_EQ(Crc32c(b.data(), b.size()), 0x113fdb5cu);
  // An iSCSI read command PDU.
  const uint8_t pdu[48] = {
      0x01, 0xc0, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
      0x00, 0x00, 0x00, 0x00, 0x14, 0x00, 0x00, 0x00, 0x00, 0x00, 0x04, 0x00,
      0x00, 0x00, 0x00, 0x14, 0x00, 0x00, 0x00, 0x18, 0x28, 0x00, 0x00, 0x00,
      0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00};
  EXPECT_EQ(Crc32c(pdu, sizeof(pdu)), 0xd9963a56u);
}

TEST(Crc32cTest, ContinuesFromAPreviousValue) {
  const std::string s = "123456789";
  for (size_t cut = 0; cut <= s.size(); ++cut) {
    EXPECT_EQ(Crc32c(s.data() + cut, s.size() - cut, Crc32c(s.data(), cut)),
              0xe3069283u)
        << cut;
  }
}

// Every length up to a few KiB at every alignment, from random initial
// values, and a large buffer: what ISA-L's vector paths, its tails and its
// unaligned heads compute must be what the journals on disk hold.
TEST(Crc32cTest, MatchesTheReferenceOnRandomBuffers) {
  std::mt19937_64 rng(20261201);
  std::vector<uint8_t> buf((1 << 20) + 64);
  for (uint8_t& b : buf) b = static_cast<uint8_t>(rng());
  for (size_t n = 0; n <= 4200; ++n) {
    const size_t offset = rng() % 64;
    const uint32_t seed = n % 3 == 0 ? 0 : static_cast<uint32_t>(rng());
    ASSERT_EQ(Crc32c(buf.data() + offset, n, seed),
              ReferenceCrc32c(buf.data() + offset, n, seed))
        << "length " << n << " offset " << offset << " seed " << seed;
  }
  for (size_t offset = 0; offset < 64; offset += 7) {
    const size_t n = buf.size() - offset - (offset % 5);
    ASSERT_EQ(Crc32c(buf.data() + offset, n),
              ReferenceCrc32c(buf.data() + offset, n, 0))
        << "length " << n << " offset " << offset;
  }
}

}  // namespace
}  // namespace kvtier
