// Helpers for the RedisCluster tests (daemon/redis_cluster_test.cc,
// daemon/redis_cluster_failure_test.cc): clients for a RedisClusterFixture,
// keys with the masters that serve them, and test values. Test-only.
#ifndef KVTIER_DAEMON_REDIS_CLUSTER_TEST_UTIL_H_
#define KVTIER_DAEMON_REDIS_CLUSTER_TEST_UTIL_H_

#include <algorithm>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "daemon/redis_cluster.h"
#include "gtest/gtest.h"
#include "tests/redis_cluster_fixture.h"

namespace kvtier::daemon {

// Generous: these bound a stuck call, they are not measured.
inline absl::Time Deadline() { return absl::Now() + absl::Seconds(20); }

// `n` pseudo-random bytes from `seed`, with a run of 64 zeros every 4 KiB.
inline std::string RandomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string out(n, '\0');
  for (char& c : out) c = static_cast<char>(rng() & 0xff);
  for (size_t i = 0; i < n; i += 4096) {
    for (size_t j = i; j < std::min(n, i + 64); ++j) out[j] = '\0';
  }
  return out;
}

// Options for the daemon's user of `cluster`, every node a seed.
inline RedisClusterOptions OptionsFor(
    const ::kvtier::testing::RedisClusterFixture& cluster) {
  RedisClusterOptions options;
  options.seeds = ParseRedisSeeds(cluster.Seeds()).value();
  options.user = cluster.user();
  options.password = cluster.password();
  return options;
}

// A client (null, with a test failure, when Create refuses `options`).
inline std::unique_ptr<RedisCluster> MakeClient(RedisClusterOptions options) {
  absl::StatusOr<std::unique_ptr<RedisCluster>> client =
      RedisCluster::Create(std::move(options));
  EXPECT_TRUE(client.ok()) << client.status();
  return client.ok() ? std::move(*client) : nullptr;
}

// keys[i] -> vals[i], viewing both.
inline std::vector<RedisCluster::KeyValue> Pairs(
    const std::vector<std::string>& keys,
    const std::vector<std::string>& vals) {
  std::vector<RedisCluster::KeyValue> items;
  for (size_t i = 0; i < keys.size(); ++i) items.push_back({keys[i], vals[i]});
  return items;
}

// What a key on a node down, slow or unknown gets.
inline bool Unreachable(const absl::Status& s) {
  return absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s);
}

// `n` keys with the slot owners that serve them.
struct Keys {
  std::vector<std::string> keys;
  std::vector<int> owner;  // fixture index of each key's master
  std::vector<std::string> On(int master) const {
    std::vector<std::string> out;
    for (size_t i = 0; i < keys.size(); ++i) {
      if (owner[i] == master) out.push_back(keys[i]);
    }
    return out;
  }
};

inline Keys MakeKeys(::kvtier::testing::RedisClusterFixture& cluster,
                     const std::string& prefix, int n) {
  Keys out;
  std::vector<int> owners = cluster.SlotOwners().value();
  for (int i = 0; i < n; ++i) {
    out.keys.push_back(absl::StrCat("kvt:", prefix, ":", i));
    out.owner.push_back(owners[RedisKeySlot(out.keys.back())]);
  }
  return out;
}

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_REDIS_CLUSTER_TEST_UTIL_H_
