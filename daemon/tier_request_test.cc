// Unit tests of the checks every TierCore request shares (tier_request.h).
#include "daemon/tier_request.h"

#include <string>
#include <vector>

#include "daemon/tier_options.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvtier::daemon {
namespace {

using ::testing::HasSubstr;

TEST(CheckApiVersion, AcceptsUnsetAndCurrent) {
  EXPECT_TRUE(CheckApiVersion(0).ok());
  EXPECT_TRUE(CheckApiVersion(kApiVersion).ok());
  absl::Status s = CheckApiVersion(kApiVersion + 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("api_version"));
}

TEST(ParseOneHash, PadsAShortHash) {
  HashKey k;
  k.bytes.fill(0xff);
  ASSERT_TRUE(ParseOneHash(std::string(16, 'a'), 16, "hash", &k).ok());
  for (size_t i = 0; i < k.bytes.size(); ++i) {
    EXPECT_EQ(k.bytes[i], i < 16 ? 'a' : 0) << i;
  }
}

TEST(ParseOneHash, NamesTheFieldOfAWrongSize) {
  HashKey k;
  absl::Status s = ParseOneHash(std::string(15, 'a'), 16, "parent_hash", &k);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("parent_hash: must be 16 bytes, got 15"));
}

TEST(ParseOptionalHash, AbsentIsOkAndLeavesTheKey) {
  HashKey k;
  k.bytes.fill(7);
  bool present = true;
  ASSERT_TRUE(ParseOptionalHash("", 16, "parent_hash", &k, &present).ok());
  EXPECT_FALSE(present);
  EXPECT_EQ(k.bytes[0], 7);
  ASSERT_TRUE(
      ParseOptionalHash(std::string(16, 'a'), 16, "parent_hash", &k, &present)
          .ok());
  EXPECT_TRUE(present);
  EXPECT_EQ(k.bytes[0], 'a');
  absl::Status s =
      ParseOptionalHash(std::string(3, 'a'), 16, "parent_hash", &k, &present);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("parent_hash"));
}

TEST(ParseHashes, SplitsPackedHashes) {
  std::vector<HashKey> keys;
  const std::string packed = std::string(8, 'a') + std::string(8, 'b');
  ASSERT_TRUE(ParseHashes(packed, 8, 2, "hashes", &keys).ok());
  ASSERT_EQ(keys.size(), 2u);
  EXPECT_EQ(keys[0].bytes[7], 'a');
  EXPECT_EQ(keys[0].bytes[8], 0);
  EXPECT_EQ(keys[1].bytes[0], 'b');
  ASSERT_TRUE(ParseHashes("", 8, 2, "hashes", &keys).ok());
  EXPECT_TRUE(keys.empty());
}

TEST(ParseHashes, RefusesRaggedAndTooMany) {
  std::vector<HashKey> keys;
  absl::Status s = ParseHashes(std::string(9, 'a'), 8, 4, "hashes", &keys);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("hashes: 9 bytes is not a multiple"));
  s = ParseHashes(std::string(24, 'a'), 8, 2, "hashes", &keys);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("3 hashes exceed the limit of 2"));
}

}  // namespace
}  // namespace kvtier::daemon
