// Tests of the cluster tier's keys and values (daemon/cluster_value.h):
// round trips, and every way a value can be wrong refused as DATA_LOSS.
//
// Thread-safety: single-threaded tests.
#include "daemon/cluster_value.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvtier::daemon {
namespace {

using ::testing::HasSubstr;

ClusterKey Key(char c = 'k') {
  return *ClusterKey::FromSecret(std::string(32, c));
}

ClusterValueShape Shape(uint32_t rank = 0, uint64_t snapshot_bytes = 0) {
  ClusterValueShape s;
  s.fingerprint.fill(7);
  s.digest =
      ClusterKeyDigest("llama", s.fingerprint, std::string(32, 'h'), rank);
  s.rank = rank;
  s.bank_bytes = {64, 16};
  s.snapshot_bytes = snapshot_bytes;
  return s;
}

std::string Encoded(const ClusterKey& key, const ClusterValueShape& shape,
                    bool snapshot = false) {
  const std::string kv(64, '\x11'), scale(16, '\0');
  const std::string snap(shape.snapshot_bytes, '\x22');
  const absl::string_view snap_view = snap;
  std::vector<absl::string_view> banks = {kv, scale};
  auto v =
      EncodeClusterValue(key, shape, banks, snapshot ? &snap_view : nullptr);
  EXPECT_TRUE(v.ok()) << v.status();
  return v.ok() ? *v : std::string();
}

TEST(ClusterValueTest, KeysSeparateNamespacesLayoutsHashesAndRanks) {
  Fingerprint f{};
  f.fill(1);
  Fingerprint g = f;
  g[31] = 2;
  const std::string h(32, 'a'), h2(32, 'b');
  const std::string base = ClusterKeyName(ClusterKeyDigest("ns", f, h, 0));
  EXPECT_THAT(base, ::testing::StartsWith("kvt1:"));
  EXPECT_EQ(base.size(), 5u + 64u);
  EXPECT_EQ(base, ClusterKeyName(ClusterKeyDigest("ns", f, h, 0)));
  EXPECT_NE(base, ClusterKeyName(ClusterKeyDigest("ns2", f, h, 0)));
  EXPECT_NE(base, ClusterKeyName(ClusterKeyDigest("ns", g, h, 0)));
  EXPECT_NE(base, ClusterKeyName(ClusterKeyDigest("ns", f, h2, 0)));
  EXPECT_NE(base, ClusterKeyName(ClusterKeyDigest("ns", f, h, 1)));
  // Length-prefixed: moving a byte between name and hash changes the key.
  EXPECT_NE(ClusterKeyName(ClusterKeyDigest("ab", f, "c", 0)),
            ClusterKeyName(ClusterKeyDigest("a", f, "bc", 0)));
}

TEST(ClusterValueTest, RoundTripWithAndWithoutSnapshot) {
  const ClusterKey key = Key();
  const ClusterValueShape shape = Shape(3, 8);
  for (bool snap : {false, true}) {
    const std::string v = Encoded(key, shape, snap);
    EXPECT_EQ(v.size(), ClusterValueBytes(shape, snap));
    auto d = DecodeClusterValue(key, v, shape);
    ASSERT_TRUE(d.ok()) << d.status();
    ASSERT_EQ(d->banks.size(), 2u);
    EXPECT_EQ(d->banks[0], std::string(64, '\x11'));
    EXPECT_EQ(d->banks[1], std::string(16, '\0'));
    EXPECT_EQ(d->has_snapshot, snap);
    EXPECT_EQ(d->snapshot, snap ? std::string(8, '\x22') : std::string());
  }
}

TEST(ClusterValueTest, EncodeRefusesRowsOfTheWrongSize) {
  const std::string small(10, 'x'), scale(16, 'y');
  std::vector<absl::string_view> banks = {small, scale};
  auto v = EncodeClusterValue(Key(), Shape(), banks, nullptr);
  EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(v.status().message(), HasSubstr("banks[0]"));
  std::vector<absl::string_view> one = {small};
  EXPECT_FALSE(EncodeClusterValue(Key(), Shape(), one, nullptr).ok());
  const std::string kv(64, 'x');
  std::vector<absl::string_view> ok = {kv, scale};
  const absl::string_view snap = "snap";
  EXPECT_FALSE(EncodeClusterValue(Key(), Shape(), ok, &snap).ok());
}

TEST(ClusterValueTest, EveryAlteredByteIsRefused) {
  const ClusterKey key = Key();
  const ClusterValueShape shape = Shape(0, 8);
  const std::string v = Encoded(key, shape, true);
  for (size_t i = 0; i < v.size(); ++i) {
    std::string bad = v;
    bad[i] ^= 0x40;
    auto d = DecodeClusterValue(key, bad, shape);
    ASSERT_FALSE(d.ok()) << "byte " << i;
    EXPECT_EQ(d.status().code(), absl::StatusCode::kDataLoss);
  }
  EXPECT_FALSE(DecodeClusterValue(key, v.substr(0, v.size() - 1), shape).ok());
  EXPECT_FALSE(DecodeClusterValue(key, v + "x", shape).ok());
  EXPECT_FALSE(DecodeClusterValue(key, "", shape).ok());
}

TEST(ClusterValueTest, AnotherKeysValueFailsItsMac) {
  // A value planted by someone without the cluster key: same format, valid
  // in every field, MAC'd under another secret.
  const ClusterValueShape shape = Shape();
  const std::string planted = Encoded(Key('x'), shape);
  auto d = DecodeClusterValue(Key('k'), planted, shape);
  ASSERT_FALSE(d.ok());
  EXPECT_THAT(d.status().message(), HasSubstr("MAC"));
}

TEST(ClusterValueTest, AValidValueUnderTheWrongNameIsRefused) {
  const ClusterKey key = Key();
  const ClusterValueShape shape = Shape(0);
  const std::string v = Encoded(key, shape);
  // Another page's key, rank, layout: each a miss, however valid its MAC.
  ClusterValueShape other = shape;
  other.digest =
      ClusterKeyDigest("llama", shape.fingerprint, std::string(32, 'i'), 0);
  EXPECT_THAT(DecodeClusterValue(key, v, other).status().message(),
              HasSubstr("digest"));
  other = shape;
  other.rank = 1;
  EXPECT_THAT(DecodeClusterValue(key, v, other).status().message(),
              HasSubstr("rank"));
  other = shape;
  other.fingerprint[0] ^= 1;
  EXPECT_THAT(DecodeClusterValue(key, v, other).status().message(),
              HasSubstr("layout"));
  other = shape;
  other.bank_bytes = {64, 32};
  EXPECT_FALSE(DecodeClusterValue(key, v, other).ok());
  other = shape;
  other.bank_bytes = {64, 16, 8};
  EXPECT_FALSE(DecodeClusterValue(key, v, other).ok());
}

TEST(ClusterValueTest, KeyFileMustBeLongAndPrivate) {
  EXPECT_EQ(ClusterKey::FromSecret("short").status().code(),
            absl::StatusCode::kInvalidArgument);
  char dir[] = "/tmp/kvtier-cluster-key.XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string path = std::string(dir) + "/key";
  EXPECT_EQ(ClusterKey::ReadFile(path).status().code(),
            absl::StatusCode::kNotFound);
  FILE* f = std::fopen(path.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fputs("0123456789abcdef0123456789abcdef\n", f);
  std::fclose(f);
  ASSERT_EQ(chmod(path.c_str(), 0644), 0);
  auto open = ClusterKey::ReadFile(path);
  EXPECT_EQ(open.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(open.status().message(), HasSubstr("chmod 600"));
  ASSERT_EQ(chmod(path.c_str(), 0600), 0);
  auto key = ClusterKey::ReadFile(path);
  ASSERT_TRUE(key.ok()) << key.status();
  EXPECT_EQ(key->secret(), "0123456789abcdef0123456789abcdef");  // No newline.
  const std::string link = std::string(dir) + "/link";
  ASSERT_EQ(symlink(path.c_str(), link.c_str()), 0);
  EXPECT_FALSE(ClusterKey::ReadFile(link).ok());
  unlink(link.c_str());
  unlink(path.c_str());
  rmdir(dir);
}

}  // namespace
}  // namespace kvtier::daemon
