// Tests of RedisCluster (daemon/redis_cluster.h): key slots, seeds and
// options, then, against one real three-master Redis Cluster started by
// RedisClusterFixture (tests/redis_cluster_fixture.h), round trips over
// every master, AUTH and ACL refusals, MOVED and ASK during a slot migration
// and concurrent callers. Failures (a killed, paused or restarted master, a
// failover): redis_cluster_failure_test.cc. Without redis-server the Redis
// tests skip (they fail under KVTIER_REQUIRE_REDIS=1). Nothing here asserts
// how long anything took; waits are bounded by a number of polls.
#include "daemon/redis_cluster.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "daemon/redis_cluster_test_util.h"
#include "tests/redis_cluster_fixture.h"

namespace kvtier::daemon {
namespace {

using ::kvtier::testing::RedisClusterConfig;
using ::kvtier::testing::RedisClusterFixture;
using ::testing::HasSubstr;

// --- Without a cluster ------------------------------------------------------

TEST(RedisKeySlotTest, MatchesRedis) {
  EXPECT_EQ(RedisKeySlot("foo"), 12182);
  EXPECT_EQ(RedisKeySlot("bar"), 5061);
  EXPECT_EQ(RedisKeySlot(""), 0);
  // CRC16/XMODEM's check value: "123456789" -> 0x31C3.
  EXPECT_EQ(RedisKeySlot("123456789"), 0x31C3 % 16384);
  EXPECT_EQ(RedisKeySlot("{user1000}.following"),
            RedisKeySlot("{user1000}.followers"));
  EXPECT_EQ(RedisKeySlot("{user1000}.following"), RedisKeySlot("user1000"));
  // An empty tag hashes the whole key; only the first tag counts.
  EXPECT_NE(RedisKeySlot("foo{}{bar}"), RedisKeySlot("bar"));
  EXPECT_EQ(RedisKeySlot("foo{{bar}}zap"), RedisKeySlot("{bar"));
  EXPECT_EQ(RedisKeySlot("foo{bar}{zap}"), RedisKeySlot("bar"));
  // Leading zero bytes do not change a CRC that starts at zero.
  EXPECT_EQ(RedisKeySlot(std::string("\0a", 2)), RedisKeySlot("a"));
  EXPECT_NE(RedisKeySlot(std::string("a\0", 2)), RedisKeySlot("a"));
}

TEST(ParseRedisSeedsTest, ParsesAndNamesTheBadEntry) {
  absl::StatusOr<std::vector<std::string>> seeds =
      ParseRedisSeeds("10.0.0.1:7000, redis-b:7001 ,[::1]:7002");
  ASSERT_TRUE(seeds.ok()) << seeds.status();
  EXPECT_THAT(*seeds, ::testing::ElementsAre("10.0.0.1:7000", "redis-b:7001",
                                             "[::1]:7002"));

  for (const char* bad : {"", "a:1,", "host", ":7000", "h:0", "h:65536", "h:x",
                          "::1:7000", "[::1]7000", "[]:1"}) {
    absl::StatusOr<std::vector<std::string>> parsed = ParseRedisSeeds(bad);
    EXPECT_TRUE(absl::IsInvalidArgument(parsed.status())) << bad;
  }
  absl::StatusOr<std::vector<std::string>> parsed =
      ParseRedisSeeds("a:1,b:2,nope");
  EXPECT_THAT(parsed.status().message(), HasSubstr("seed 3 \"nope\""));
}

TEST(RedisClusterCreateTest, RejectsBadOptions) {
  auto code = [](RedisClusterOptions o) {
    return RedisCluster::Create(std::move(o)).status().code();
  };
  RedisClusterOptions good;
  good.seeds = {"127.0.0.1:7000"};
  EXPECT_EQ(code(good), absl::StatusCode::kOk);
  RedisClusterOptions o = good;
  o.seeds.clear();
  EXPECT_EQ(code(o), absl::StatusCode::kInvalidArgument);
  o = good;
  o.seeds = {"127.0.0.1"};
  EXPECT_EQ(code(o), absl::StatusCode::kInvalidArgument);
  o = good;
  o.user = "kvtier";
  EXPECT_EQ(code(o), absl::StatusCode::kInvalidArgument);
  o = good;
  o.io_timeout = absl::ZeroDuration();
  EXPECT_EQ(code(o), absl::StatusCode::kInvalidArgument);
  o = good;
  o.connect_timeout = -absl::Seconds(1);
  EXPECT_EQ(code(o), absl::StatusCode::kInvalidArgument);
  o = good;
  o.connections_per_node = 0;
  EXPECT_EQ(code(o), absl::StatusCode::kInvalidArgument);
}

// Nothing listens on the seed: every key fails, none crashes, and the next
// calls fail fast (no new connection attempt within node_retry).
TEST(RedisClusterCreateTest, UnreachableSeedFailsEveryKey) {
  RedisClusterOptions options;
  options.seeds = {"127.0.0.1:1"};
  options.node_retry = absl::Hours(1);
  std::unique_ptr<RedisCluster> client = MakeClient(options);
  ASSERT_NE(client, nullptr);
  std::vector<std::string> keys = {"kvt:a", "kvt:b"};
  for (int call = 0; call < 5; ++call) {
    for (const auto& r : client->Get(keys, Deadline())) {
      EXPECT_TRUE(absl::IsUnavailable(r.status())) << r.status();
    }
  }
  RedisCluster::State state = client->GetState();
  EXPECT_EQ(state.node_failures, 1u);
  EXPECT_EQ(state.covered_slots, 0u);
  ASSERT_EQ(state.nodes.size(), 1u);
  EXPECT_FALSE(state.nodes[0].up);
  EXPECT_THAT(state.nodes[0].last_error, HasSubstr("127.0.0.1:1"));
}

// --- One shared three-master cluster ---------------------------------------

class RedisClusterTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!RedisClusterFixture::Available().ok()) return;
    RedisClusterConfig config;
    // A user that may GET but not read the slot map.
    config.extra_config = {"user noslots on >noslots-pw ~* -@all +get"};
    // One node behind a command prefix (as `ip netns exec NAME` would be).
    config.placement = [](int node) {
      testing::RedisNodePlacement placement;
      if (node == 1) placement.command_prefix = {"env", "KVTIER_NODE=1"};
      return placement;
    };
    cluster_ = new RedisClusterFixture(config);
    *start_ = cluster_->Start();
  }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
  }
  void SetUp() override {
    KVTIER_REDIS_OR_SKIP();
    ASSERT_TRUE(start_->ok()) << *start_;
  }

  static RedisClusterFixture* cluster_;
  static absl::Status* start_;
};
RedisClusterFixture* RedisClusterTest::cluster_ = nullptr;
absl::Status* RedisClusterTest::start_ = new absl::Status();

TEST_F(RedisClusterTest, RoundTripOverEveryMaster) {
  std::unique_ptr<RedisCluster> client = MakeClient(OptionsFor(*cluster_));
  Keys k = MakeKeys(*cluster_, "rt", 300);
  std::vector<std::string> values;
  for (size_t i = 0; i < k.keys.size(); ++i) {
    values.push_back(RandomBytes(i % 7 == 0 ? 0 : 1 + i * 37 % 3000, i));
  }
  // Several MiB each.
  values[1] = RandomBytes(4 << 20, 101);
  values[2] = RandomBytes(6 << 20, 102);
  values[3] = RandomBytes((9 << 20) + 3, 103);
  EXPECT_EQ(std::set<int>(k.owner.begin(), k.owner.end()).size(), 3u);

  for (const absl::Status& s :
       client->Set(Pairs(k.keys, values), absl::ZeroDuration(), Deadline())) {
    ASSERT_TRUE(s.ok()) << s;
  }
  std::vector<absl::StatusOr<std::string>> got =
      client->Get(k.keys, Deadline());
  ASSERT_EQ(got.size(), k.keys.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(got[i].ok()) << k.keys[i] << ": " << got[i].status();
    EXPECT_TRUE(*got[i] == values[i]) << k.keys[i] << " differs";
  }
  for (const auto& e : client->Exists(k.keys, Deadline())) {
    ASSERT_TRUE(e.ok()) << e.status();
    EXPECT_TRUE(*e);
  }

  // Absent keys, mixed with present ones in one call.
  std::vector<std::string> mixed = {k.keys[0], "kvt:rt:absent:1", k.keys[1],
                                    "kvt:rt:absent:2"};
  std::vector<absl::StatusOr<std::string>> m = client->Get(mixed, Deadline());
  EXPECT_TRUE(m[0].ok());
  EXPECT_TRUE(absl::IsNotFound(m[1].status())) << m[1].status();
  EXPECT_TRUE(m[2].ok());
  EXPECT_TRUE(absl::IsNotFound(m[3].status())) << m[3].status();
  std::vector<absl::StatusOr<bool>> e = client->Exists(mixed, Deadline());
  EXPECT_TRUE(*e[0]);
  EXPECT_FALSE(*e[1]);

  for (const absl::Status& s : client->Del(k.keys, Deadline())) {
    EXPECT_TRUE(s.ok()) << s;
  }
  for (const auto& r : client->Get(k.keys, Deadline())) {
    EXPECT_TRUE(absl::IsNotFound(r.status())) << r.status();
  }
  for (const auto& r : client->Exists(k.keys, Deadline())) {
    EXPECT_FALSE(*r);
  }
  for (const absl::Status& s : client->Del(k.keys, Deadline())) {
    EXPECT_TRUE(s.ok()) << s;  // absent: still OK
  }

  RedisCluster::State state = client->GetState();
  EXPECT_EQ(state.covered_slots, 16384u);
  EXPECT_GE(state.slot_map_refreshes, 1u);
  uint32_t master_slots = 0;
  int masters = 0;
  for (const RedisCluster::NodeState& n : state.nodes) {
    if (!n.master) continue;
    ++masters;
    master_slots += n.slots;
    EXPECT_TRUE(n.up) << n.address;
  }
  EXPECT_EQ(masters, 3);
  EXPECT_EQ(master_slots, 16384u);
}

// The server's own CLUSTER KEYSLOT agrees, binary keys and tags included.
TEST_F(RedisClusterTest, KeySlotMatchesTheServer) {
  std::vector<std::string> keys = {
      "foo", "kvt:x",  "{a}b",  "a{b}",
      "{}x", "x{}{y}", "{{y}}", std::string("z\0\xff{", 4)};
  for (int i = 0; i < 200; ++i) keys.push_back(RandomBytes(1 + i % 40, i));
  for (const std::string& key : keys) {
    int64_t slot = -1;
    ASSERT_TRUE(absl::SimpleAtoi(
        cluster_->Command(0, {"CLUSTER", "KEYSLOT", key}).value(), &slot));
    EXPECT_EQ(RedisKeySlot(key), slot);
  }
}

TEST_F(RedisClusterTest, TtlIsSet) {
  std::unique_ptr<RedisCluster> client = MakeClient(OptionsFor(*cluster_));
  std::vector<std::string> keys = {"kvt:ttl:1", "kvt:ttl:none"};
  ASSERT_TRUE(
      client->Set({{keys[0], "x"}}, absl::Hours(1), Deadline())[0].ok());
  ASSERT_TRUE(
      client->Set({{keys[1], "y"}}, absl::ZeroDuration(), Deadline())[0].ok());
  auto pttl = [&](const std::string& key) {
    int owner = cluster_->MasterOfSlot(RedisKeySlot(key)).value();
    int64_t ms = 0;
    EXPECT_TRUE(
        absl::SimpleAtoi(cluster_->Command(owner, {"PTTL", key}).value(), &ms));
    return ms;
  };
  EXPECT_GT(pttl(keys[0]), 0);
  EXPECT_LE(pttl(keys[0]), 3600 * 1000);
  EXPECT_EQ(pttl(keys[1]), -1);
  EXPECT_TRUE(absl::IsInvalidArgument(
      client->Set({{keys[0], "x"}}, -absl::Seconds(1), Deadline())[0]));
  client->Del(keys, Deadline());
}

TEST_F(RedisClusterTest, WrongCredentialsAreClearErrors) {
  std::vector<std::string> keys = {"kvt:auth:1", "kvt:auth:2"};
  struct Case {
    std::string user, password, want;
  };
  for (const Case& c :
       {Case{cluster_->user(), "wrong", "WRONGPASS"},
        Case{"nobody", cluster_->password(), "WRONGPASS"},
        Case{"", "wrong", "WRONGPASS"}, Case{"", "", "NOAUTH"}}) {
    RedisClusterOptions options = OptionsFor(*cluster_);
    options.user = c.user;
    options.password = c.password;
    std::unique_ptr<RedisCluster> client = MakeClient(options);
    ASSERT_NE(client, nullptr);
    for (int call = 0; call < 2; ++call) {
      for (const auto& r : client->Get(keys, Deadline())) {
        EXPECT_TRUE(absl::IsUnauthenticated(r.status()))
            << c.user << "/" << c.password << ": " << r.status();
        EXPECT_THAT(r.status().message(), HasSubstr(c.want));
      }
    }
    EXPECT_TRUE(absl::IsUnauthenticated(
        client->Set({{keys[0], "v"}}, absl::ZeroDuration(), Deadline())[0]));
  }
}

TEST_F(RedisClusterTest, AclRefusalsArePerKey) {
  std::unique_ptr<RedisCluster> client = MakeClient(OptionsFor(*cluster_));
  // Outside the user's key pattern (~kvt*): refused, the others served.
  std::vector<RedisCluster::KeyValue> items = {{"kvt:acl:1", "a"},
                                               {"other:acl", "b"}};
  std::vector<absl::Status> set =
      client->Set(items, absl::ZeroDuration(), Deadline());
  EXPECT_TRUE(set[0].ok()) << set[0];
  EXPECT_TRUE(absl::IsPermissionDenied(set[1])) << set[1];
  std::vector<absl::StatusOr<std::string>> got =
      client->Get({"kvt:acl:1", "other:acl"}, Deadline());
  EXPECT_EQ(got[0].value_or(""), "a");
  EXPECT_TRUE(absl::IsPermissionDenied(got[1].status())) << got[1].status();
  EXPECT_THAT(got[1].status().message(), HasSubstr("NOPERM"));
  client->Del({"kvt:acl:1"}, Deadline());

  // A user without CLUSTER SLOTS gets no slot map.
  RedisClusterOptions options = OptionsFor(*cluster_);
  options.user = "noslots";
  options.password = "noslots-pw";
  std::unique_ptr<RedisCluster> noslots = MakeClient(options);
  for (const auto& r : noslots->Get({"kvt:acl:1"}, Deadline())) {
    EXPECT_TRUE(absl::IsPermissionDenied(r.status())) << r.status();
    EXPECT_THAT(r.status().message(), HasSubstr("CLUSTER SLOTS"));
  }
}

// The client's map goes stale when a slot moves to another master: MOVED is
// followed and the map refreshed.
TEST_F(RedisClusterTest, FollowsMovedAfterSlotMigration) {
  std::vector<int> masters = cluster_->Masters().value();
  ASSERT_EQ(masters.size(), 3u);
  RedisClusterOptions options = OptionsFor(*cluster_);
  options.seeds = {cluster_->Address(masters[0])};  // one seed
  std::unique_ptr<RedisCluster> client = MakeClient(options);

  const std::string key = "kvt{moved}:1";
  const int slot = RedisKeySlot(key);
  ASSERT_TRUE(
      client->Set({{key, "before"}}, absl::ZeroDuration(), Deadline())[0].ok());
  const int from = cluster_->MasterOfSlot(slot).value();
  const int to = masters[0] == from ? masters[1] : masters[0];
  ASSERT_TRUE(cluster_->MoveSlot(slot, to).ok());
  ASSERT_EQ(cluster_->MasterOfSlot(slot).value(), to);
  const uint64_t moved_before = client->GetState().moved;

  std::vector<absl::StatusOr<std::string>> got =
      client->Get({key, "kvt{moved}:absent"}, Deadline());
  EXPECT_EQ(got[0].value_or("?"), "before") << got[0].status();
  EXPECT_TRUE(absl::IsNotFound(got[1].status())) << got[1].status();
  EXPECT_GT(client->GetState().moved, moved_before);
  ASSERT_TRUE(
      client->Set({{key, "after"}}, absl::ZeroDuration(), Deadline())[0].ok());

  // The refreshed map sends the key straight to its new master.
  bool settled = false;
  for (int poll = 0; poll < 100 && !settled; ++poll) {
    const uint64_t moved = client->GetState().moved;
    EXPECT_EQ(client->Get({key}, Deadline())[0].value_or("?"), "after");
    settled = client->GetState().moved == moved;
    if (!settled) absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_TRUE(settled);
  client->Del({key}, Deadline());
}

// A slot half-migrated: a key already moved answers ASK; ASKING + GET on the
// importing node serves it, and keys still on the source are served there.
TEST_F(RedisClusterTest, FollowsAskDuringSlotMigration) {
  std::unique_ptr<RedisCluster> client = MakeClient(OptionsFor(*cluster_));
  const std::vector<std::string> keys = {"kvt{ask}:1", "kvt{ask}:2",
                                         "kvt{ask}:3"};
  const int slot = RedisKeySlot(keys[0]);
  std::vector<std::string> values = {"one", RandomBytes(2 << 20, 7), "three"};
  for (const absl::Status& s :
       client->Set(Pairs({keys[0], keys[1]}, {values[0], values[1]}),
                   absl::ZeroDuration(), Deadline())) {
    ASSERT_TRUE(s.ok()) << s;
  }
  std::vector<int> masters = cluster_->Masters().value();
  const int from = cluster_->MasterOfSlot(slot).value();
  const int to = masters[0] == from ? masters[1] : masters[0];
  ASSERT_TRUE(cluster_->BeginSlotMigration(slot, to).ok());
  ASSERT_TRUE(cluster_->MigrateKeys(slot, {keys[0]}, to).ok());

  const RedisCluster::State before = client->GetState();
  std::vector<absl::StatusOr<std::string>> got =
      client->Get({keys[0], keys[1]}, Deadline());
  EXPECT_EQ(got[0].value_or("?"), values[0]) << got[0].status();
  EXPECT_TRUE(got[1].ok() && *got[1] == values[1]) << got[1].status();
  const RedisCluster::State after = client->GetState();
  EXPECT_GT(after.asked, before.asked);
  EXPECT_EQ(after.moved, before.moved);

  // A new key in a migrating slot goes to the importing node.
  ASSERT_TRUE(
      client->Set({{keys[2], values[2]}}, absl::ZeroDuration(), Deadline())[0]
          .ok());
  std::vector<absl::StatusOr<bool>> exists = client->Exists(keys, Deadline());
  for (const auto& e : exists) EXPECT_TRUE(e.value_or(false)) << e.status();

  ASSERT_TRUE(cluster_->FinishSlotMigration(slot, to).ok());
  got = client->Get(keys, Deadline());
  for (size_t i = 0; i < keys.size(); ++i) {
    EXPECT_TRUE(got[i].ok() && *got[i] == values[i]) << got[i].status();
  }
  client->Del(keys, Deadline());
}

TEST_F(RedisClusterTest, ConcurrentCallers) {
  RedisClusterOptions options = OptionsFor(*cluster_);
  options.connections_per_node = 2;  // fewer than the threads: some wait
  std::unique_ptr<RedisCluster> client = MakeClient(options);
  constexpr int kThreads = 8;
  constexpr int kRounds = 40;
  std::atomic<int> calls{0};
  absl::Mutex mu;
  std::vector<std::string> failures;
  auto fail = [&](std::string what) {
    absl::MutexLock lock(&mu);
    failures.push_back(std::move(what));
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(t);
      for (int round = 0; round < kRounds; ++round) {
        std::vector<std::string> keys, values;
        for (int j = 0; j < 6; ++j) {
          keys.push_back(absl::StrCat("kvt:conc:", t, ":", round, ":", j));
          values.push_back(RandomBytes(1 + rng() % 65536, rng()));
        }
        for (const absl::Status& s :
             client->Set(Pairs(keys, values), absl::Minutes(10), Deadline())) {
          if (!s.ok()) fail(s.ToString());
        }
        std::vector<absl::StatusOr<std::string>> got =
            client->Get(keys, Deadline());
        for (size_t j = 0; j < keys.size(); ++j) {
          if (!got[j].ok()) {
            fail(got[j].status().ToString());
          } else if (*got[j] != values[j]) {
            fail(keys[j] + " differs");
          }
        }
        if (round % 4 == 3) {
          for (const absl::Status& s : client->Del(keys, Deadline())) {
            if (!s.ok()) fail(s.ToString());
          }
          for (const auto& e : client->Exists(keys, Deadline())) {
            if (!e.ok() || *e) fail("exists after DEL");
          }
        }
        calls.fetch_add(1);
      }
    });
  }
  // GetState runs alongside the callers too.
  for (int i = 0; i < 20; ++i) {
    EXPECT_LE(client->GetState().covered_slots, 16384u);
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(calls.load(), kThreads * kRounds);
  EXPECT_TRUE(failures.empty())
      << failures.size() << " failures, first: " << failures.front();
}

}  // namespace
}  // namespace kvtier::daemon
