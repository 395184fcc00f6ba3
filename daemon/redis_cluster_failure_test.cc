// Tests of RedisCluster (daemon/redis_cluster.h) when nodes fail, each on
// its own real Redis Cluster (tests/redis_cluster_fixture.h): a master
// killed, paused and restarted, and a master killed with a replica to take
// over. Calls fail per key and fast; none asserts how long anything took.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "daemon/redis_cluster.h"
#include "daemon/redis_cluster_test_util.h"
#include "tests/redis_cluster_fixture.h"

namespace kvtier::daemon {
namespace {

using ::kvtier::testing::RedisClusterConfig;
using ::kvtier::testing::RedisClusterFixture;

// Every key in `got` whose master is `down` failed with UNAVAILABLE or
// DEADLINE_EXCEEDED; every other one came back with its value.
template <typename Results>
void ExpectOnlyDownFailed(const Keys& k, const Results& got, int down,
                          const std::vector<std::string>& values) {
  ASSERT_EQ(got.size(), k.keys.size());
  for (size_t i = 0; i < got.size(); ++i) {
    if (k.owner[i] == down) {
      EXPECT_TRUE(Unreachable(got[i].status())) << got[i].status();
    } else {
      EXPECT_TRUE(got[i].ok() && *got[i] == values[i])
          << k.keys[i] << ": " << got[i].status();
    }
  }
}

TEST(RedisClusterFailureTest, KilledPausedAndRestartedMaster) {
  KVTIER_REDIS_OR_SKIP();
  RedisClusterFixture cluster;
  ASSERT_TRUE(cluster.Start().ok());
  Keys k = MakeKeys(cluster, "down", 60);
  std::vector<std::string> values;
  for (size_t i = 0; i < k.keys.size(); ++i)
    values.push_back(RandomBytes(100, i));
  // `patient` never retries a failed node (node_retry 1h): its calls after
  // the first failure must not touch the node again.
  RedisClusterOptions options = OptionsFor(cluster);
  options.io_timeout = absl::Milliseconds(300);
  options.node_retry = absl::Hours(1);
  std::unique_ptr<RedisCluster> patient = MakeClient(options);
  options.node_retry = absl::Milliseconds(50);
  std::unique_ptr<RedisCluster> eager = MakeClient(options);
  for (const absl::Status& s :
       patient->Set(Pairs(k.keys, values), absl::ZeroDuration(), Deadline())) {
    ASSERT_TRUE(s.ok()) << s;
  }
  ASSERT_TRUE(eager->Get(k.keys, Deadline())[0].ok());  // pooled connections

  const int victim = k.owner[0];
  ASSERT_TRUE(cluster.Kill(victim).ok());
  ExpectOnlyDownFailed(k, patient->Get(k.keys, Deadline()), victim, values);
  ExpectOnlyDownFailed(k, eager->Get(k.keys, Deadline()), victim, values);
  const uint64_t failures = patient->GetState().node_failures;
  EXPECT_GE(failures, 1u);
  for (int call = 0; call < 20; ++call) {
    ExpectOnlyDownFailed(k, patient->Get(k.keys, Deadline()), victim, values);
  }
  RedisCluster::State state = patient->GetState();
  EXPECT_EQ(state.node_failures, failures);  // failed fast, 20 times
  for (const RedisCluster::NodeState& n : state.nodes) {
    EXPECT_EQ(n.up, n.address != cluster.Address(victim)) << n.address;
    if (!n.up) {
      EXPECT_FALSE(n.last_error.empty());
    }
  }

  // Restarted (from its nodes.conf, without its data): its keys are served
  // again, absent or not.
  ASSERT_TRUE(cluster.Restart(victim).ok());
  const std::vector<std::string> victim_keys = k.On(victim);
  bool back = false;
  for (int poll = 0; poll < 400 && !back; ++poll) {
    back = true;
    for (const auto& r : eager->Get(victim_keys, Deadline())) {
      back = back && (r.ok() || absl::IsNotFound(r.status()));
    }
    if (!back) absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_TRUE(back) << cluster.LogTail(victim);
  std::vector<std::string> fresh(victim_keys.size(), "fresh");
  for (const absl::Status& s : eager->Set(Pairs(victim_keys, fresh),
                                          absl::ZeroDuration(), Deadline())) {
    EXPECT_TRUE(s.ok()) << s;
  }
  ASSERT_TRUE(cluster.WaitHealthy().ok());

  // A paused master (connected, silent): its keys fail, the rest succeed.
  // With the deadline first, DEADLINE_EXCEEDED; with io_timeout first,
  // UNAVAILABLE.
  options.io_timeout = absl::Seconds(30);
  std::unique_ptr<RedisCluster> slow = MakeClient(options);
  options.io_timeout = absl::Milliseconds(200);
  std::unique_ptr<RedisCluster> quick = MakeClient(options);
  for (RedisCluster* c : {slow.get(), quick.get()}) {
    for (const auto& r : c->Get(k.keys, Deadline())) {
      ASSERT_TRUE(r.ok() || absl::IsNotFound(r.status())) << r.status();
    }
  }
  const int paused = k.owner[1] == victim ? k.owner[2] : k.owner[1];
  ASSERT_NE(paused, victim);
  ASSERT_TRUE(cluster.Pause(paused).ok());
  std::vector<absl::StatusOr<std::string>> got =
      slow->Get(k.keys, absl::Now() + absl::Milliseconds(300));
  std::vector<absl::StatusOr<std::string>> got_quick =
      quick->Get(k.keys, Deadline());
  ASSERT_TRUE(cluster.Resume(paused).ok());
  for (size_t i = 0; i < k.keys.size(); ++i) {
    if (k.owner[i] == paused) {
      EXPECT_TRUE(absl::IsDeadlineExceeded(got[i].status())) << got[i].status();
      EXPECT_TRUE(absl::IsUnavailable(got_quick[i].status()))
          << got_quick[i].status();
    } else {
      EXPECT_TRUE(got[i].ok() || absl::IsNotFound(got[i].status()))
          << got[i].status();
      EXPECT_TRUE(got_quick[i].ok() || absl::IsNotFound(got_quick[i].status()))
          << got_quick[i].status();
    }
  }
}

TEST(RedisClusterFailureTest, FailoverToReplica) {
  KVTIER_REDIS_OR_SKIP();
  RedisClusterConfig config;
  config.replicas = 1;
  RedisClusterFixture cluster(config);
  ASSERT_TRUE(cluster.Start().ok());
  Keys k = MakeKeys(cluster, "failover", 60);
  std::vector<std::string> values;
  for (size_t i = 0; i < k.keys.size(); ++i) {
    values.push_back(RandomBytes(1000, i));
  }
  RedisClusterOptions options = OptionsFor(cluster);
  options.io_timeout = absl::Milliseconds(300);
  options.node_retry = absl::Milliseconds(100);
  std::unique_ptr<RedisCluster> client = MakeClient(options);
  for (const absl::Status& s :
       client->Set(Pairs(k.keys, values), absl::ZeroDuration(), Deadline())) {
    ASSERT_TRUE(s.ok()) << s;
  }
  ASSERT_TRUE(cluster.WaitReplicasSynced().ok());

  const int victim = k.owner[0];
  const std::vector<int> replicas = cluster.ReplicasOf(victim).value();
  ASSERT_FALSE(replicas.empty());
  ASSERT_TRUE(cluster.Kill(victim).ok());
  ExpectOnlyDownFailed(k, client->Get(k.keys, Deadline()), victim, values);

  absl::StatusOr<int> promoted = cluster.WaitFailover(replicas);
  ASSERT_TRUE(promoted.ok()) << promoted.status();
  // The client finds the new master (its map refreshes while calls hit the
  // dead one) and reads what the replica had.
  const std::vector<std::string> victim_keys = k.On(victim);
  bool served = false;
  for (int poll = 0; poll < 400 && !served; ++poll) {
    served = true;
    for (const auto& r : client->Get(victim_keys, Deadline())) {
      served = served && r.ok();
    }
    if (!served) absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_TRUE(served);
  ExpectOnlyDownFailed(k, client->Get(k.keys, Deadline()), -1, values);
  std::vector<std::string> fresh(victim_keys.size(), "after failover");
  for (const absl::Status& s : client->Set(Pairs(victim_keys, fresh),
                                           absl::ZeroDuration(), Deadline())) {
    EXPECT_TRUE(s.ok()) << s;
  }
  for (const auto& r : client->Get(victim_keys, Deadline())) {
    EXPECT_EQ(r.value_or("?"), "after failover") << r.status();
  }
  bool listed = false;
  for (const RedisCluster::NodeState& n : client->GetState().nodes) {
    if (n.address == cluster.Address(*promoted)) {
      listed = n.master && n.slots > 0;
    }
  }
  EXPECT_TRUE(listed);
}

}  // namespace
}  // namespace kvtier::daemon
