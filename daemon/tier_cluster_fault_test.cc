// Faults of the cluster tier through TierCore: a Redis master killed, one
// that hangs (SIGSTOP), one replaced by its replica. Each test has its own
// real Redis Cluster (tests/redis_cluster_fixture.h), since it breaks it.
// What must hold: lookups degrade to the pages the live masters hold (a
// miss, never an error or a stall), spills that cannot be written are
// counted and never block a commit, and the tier comes back by itself.
// And a value planted in Redis, far larger than any the layout makes, is a
// miss that costs the daemon no memory. Nothing here asserts a duration.
//
// Thread-safety: single-threaded tests (the cores run their own threads).
#include <string>
#include <vector>

#include "daemon/cluster_value.h"
#include "daemon/redis_cluster.h"
#include "daemon/resp_reader.h"
#include "daemon/tier_cluster_test_util.h"
#include "gtest/gtest.h"

namespace kvtier::daemon {
namespace {

using testing::RedisClusterConfig;
using testing::RedisClusterFixture;

class TierClusterFaultTest : public ::testing::Test {
 protected:
  void Start(int replicas) {
    RedisClusterConfig config;
    config.replicas = replicas;
    redis_ = std::make_unique<RedisClusterFixture>(config);
    absl::Status s = redis_->Start();
    ASSERT_TRUE(s.ok()) << s;
  }
  // The master holding page `page` of `hashes` (namespace `ns`, rank 0).
  int MasterOf(const std::string& ns, const v1::Layout& layout,
               const std::string& hashes, uint32_t page) {
    const std::string key = ClusterKeyOf(ns, layout, hashes, page);
    auto m = redis_->MasterOfSlot(RedisKeySlot(key));
    EXPECT_TRUE(m.ok()) << m.status();
    return m.ok() ? *m : -1;
  }
  // The first page of `hashes` held by `master` (n when none).
  uint32_t FirstOn(int master, const std::string& ns, const v1::Layout& l,
                   const std::string& hashes) {
    const uint32_t n = hashes.size() / 32;
    for (uint32_t i = 0; i < n; ++i) {
      if (MasterOf(ns, l, hashes, i) == master) return i;
    }
    return n;
  }

  std::unique_ptr<RedisClusterFixture> redis_;
};

TEST_F(TierClusterFaultTest, AMasterDownDegradesToMissesThenComesBack) {
  KVTIER_REDIS_OR_SKIP();
  Start(/*replicas=*/0);
  ClusterNode a(*redis_, true);
  ClusterNode b(*redis_, true);
  const v1::Layout layout = AttentionLayout();
  a.Attach("down", layout);
  b.Attach("down", layout);
  const std::string hashes = RandomHashes(30, 32, 1001);
  a.WritePages(1, "", hashes, 0);
  a.WaitSpilled(30);
  const int victim = MasterOf("down", layout, hashes, 0) == 0 ? 1 : 0;
  const uint32_t first_lost = FirstOn(victim, "down", layout, hashes);
  ASSERT_LT(first_lost, 30u) << "no page on the victim: pick another seed";
  ASSERT_TRUE(redis_->Kill(victim).ok());
  // The continuation stops at the first page the dead master held; asked
  // again (the node now known down: failed fast), the same.
  for (int i = 0; i < 3; ++i) {
    const v1::LookupResponse r = b.Lookup(hashes, /*remote=*/true);
    EXPECT_EQ(r.matched_pages(), 0u);
    EXPECT_EQ(r.remote_pages(), first_lost);
  }
  EXPECT_GE(b.cluster().Counters().probe_errors, 1u);
  if (first_lost > 0) {
    ASSERT_TRUE(b.Prefetch(hashes).ok());
    EXPECT_EQ(b.WaitPrefetched(hashes), first_lost);
    b.ExpectPages(1, hashes, first_lost);
  }
  // A commit on A meanwhile is not held up: its spills to the dead master
  // fail and are counted.
  const std::string during = RandomHashes(30, 32, 1002);
  a.WritePages(2, "", during, 0);
  for (int i = 0; i < 3000 && a.cluster().Counters().spill_queue_bytes > 0;
       ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const ClusterCounters ac = a.cluster().Counters();
  EXPECT_GE(ac.spills_failed, 1u);
  EXPECT_EQ(ac.spilled_pages + ac.spills_failed + ac.spills_dropped, 60u);
  EXPECT_TRUE(a.core().CheckInvariants().ok());
  // The master returns (empty: no persistence); what is written from now
  // on is found again, on every master.
  ASSERT_TRUE(redis_->Restart(victim).ok());
  ASSERT_TRUE(redis_->WaitHealthy().ok());
  // A spill may still fail while the daemons hold the node down (until
  // their node_retry passes): write fresh chains until one is all there.
  std::string after;
  uint32_t found = 0;
  for (int attempt = 0; attempt < 50 && found < 30; ++attempt) {
    after = RandomHashes(30, 32, 1100 + attempt);
    if (FirstOn(victim, "down", layout, after) == 30) continue;
    a.WritePages(3, "", after, 0);
    for (int i = 0; i < 3000 && a.cluster().Counters().spill_queue_bytes > 0;
         ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    found = b.Lookup(after, true).remote_pages();
    if (found < 30) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(found, 30u);
  ASSERT_TRUE(b.Prefetch(after).ok());
  EXPECT_EQ(b.WaitPrefetched(after), 30u);
  b.ExpectPages(3, after, 30);
}

TEST_F(TierClusterFaultTest, AHungMasterCostsMissesNotAStall) {
  KVTIER_REDIS_OR_SKIP();
  Start(/*replicas=*/0);
  ClusterNode a(*redis_, true);
  ClusterNode b(*redis_, true);
  const v1::Layout layout = AttentionLayout();
  a.Attach("hung", layout);
  b.Attach("hung", layout);
  const std::string hashes = RandomHashes(30, 32, 2001);
  a.WritePages(1, "", hashes, 0);
  a.WaitSpilled(30);
  const int victim = MasterOf("hung", layout, hashes, 0) == 0 ? 1 : 0;
  const uint32_t first_lost = FirstOn(victim, "hung", layout, hashes);
  ASSERT_LT(first_lost, 30u);
  ASSERT_TRUE(redis_->Pause(victim).ok());
  // It accepts connections and answers nothing: the lookup's deadline (and
  // each read's timeout) ends the wait; the pages before it are reported.
  const v1::LookupResponse r = b.Lookup(hashes, true);
  EXPECT_EQ(r.remote_pages(), first_lost);
  EXPECT_GE(b.cluster().Counters().probe_errors, 1u);
  ASSERT_TRUE(redis_->Resume(victim).ok());
  uint32_t found = 0;
  for (int i = 0; i < 500 && found < 30; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    found = b.Lookup(hashes, true).remote_pages();
  }
  EXPECT_EQ(found, 30u);
}

TEST_F(TierClusterFaultTest, AFailoverKeepsLookupsAndPrefetchesGoing) {
  KVTIER_REDIS_OR_SKIP();
  Start(/*replicas=*/1);
  ClusterNode a(*redis_, true);
  ClusterNode b(*redis_, true);
  const v1::Layout layout = AttentionLayout();
  a.Attach("failover", layout);
  b.Attach("failover", layout);
  const std::string hashes = RandomHashes(24, 32, 3001);
  a.WritePages(4, "", hashes, 0);
  a.WaitSpilled(24);
  ASSERT_TRUE(redis_->WaitReplicasSynced().ok());
  const int victim = MasterOf("failover", layout, hashes, 0);
  ASSERT_GE(victim, 0);
  auto replicas = redis_->ReplicasOf(victim);
  ASSERT_TRUE(replicas.ok() && !replicas->empty());
  ASSERT_TRUE(redis_->Kill(victim).ok());
  auto promoted = redis_->WaitFailover(*replicas);
  ASSERT_TRUE(promoted.ok()) << promoted.status();
  // The replica serves the slots now: the daemon finds it (a refresh of its
  // slot map after the failed node) and every page is there.
  uint32_t found = 0;
  for (int i = 0; i < 500 && found < 24; ++i) {
    found = b.Lookup(hashes, true).remote_pages();
    if (found < 24) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(found, 24u);
  ASSERT_TRUE(b.Prefetch(hashes).ok());
  EXPECT_EQ(b.WaitPrefetched(hashes), 24u);
  b.ExpectPages(4, hashes, 24);
  EXPECT_TRUE(b.core().CheckInvariants().ok());
}

// 64 MiB planted under the key of page 5 (anyone who can write to Redis,
// or a bug, can): the prefetch refuses it from its header, before
// allocating anything for it, so the daemon's memory does not grow by it;
// the pages before it are fetched, it is a miss, and it is counted as a
// rejected value.
TEST_F(TierClusterFaultTest, AnOversizedValueIsAMissNotAnAllocation) {
  KVTIER_REDIS_OR_SKIP();
  Start(/*replicas=*/0);
  ClusterNode a(*redis_, true);
  ClusterNode b(*redis_, true);
  const v1::Layout layout = AttentionLayout();
  a.Attach("planted", layout);
  b.Attach("planted", layout);
  const std::string hashes = RandomHashes(12, 32, 4001);
  a.WritePages(1, "", hashes, 0);
  a.WaitSpilled(12);
  constexpr uint32_t kPlanted = 5;
  constexpr size_t kPlantedBytes = 64 << 20;
  {
    RedisClusterOptions o;
    auto seeds = ParseRedisSeeds(redis_->Seeds());
    ASSERT_TRUE(seeds.ok()) << seeds.status();
    o.seeds = *seeds;
    o.user = redis_->user();
    o.password = redis_->password();
    auto client = RedisCluster::Create(o);
    ASSERT_TRUE(client.ok()) << client.status();
    const std::string key = ClusterKeyOf("planted", layout, hashes, kPlanted);
    const std::string value(kPlantedBytes, 'p');
    const std::vector<absl::Status> set = (*client)->Set(
        {{key, value}}, absl::ZeroDuration(), absl::Now() + absl::Seconds(30));
    ASSERT_TRUE(set[0].ok()) << set[0];
  }
  EXPECT_EQ(b.Lookup(hashes, /*remote=*/true).remote_pages(), 12u);
  const uint64_t allocated = ValueArena::TotalAllocatedBytes();
  const ClusterCounters before = b.cluster().Counters();
  ASSERT_TRUE(b.Prefetch(hashes).ok());
  EXPECT_EQ(b.WaitPrefetched(hashes), kPlanted);
  b.ExpectPages(1, hashes, kPlanted);
  // The slices' arenas (a few MiB), never the planted value.
  const uint64_t grown = ValueArena::TotalAllocatedBytes() - allocated;
  EXPECT_LT(grown, kPlantedBytes / 4)
      << "the prefetch's arenas grew by " << grown << " bytes";
  const ClusterCounters after = b.cluster().Counters();
  EXPECT_EQ(after.rejected_values, before.rejected_values + 1);
  EXPECT_EQ(after.fetch_errors, before.fetch_errors);
  EXPECT_TRUE(b.core().CheckInvariants().ok());
  // The connection that drained it is still good: the next fetch works.
  const std::string more = RandomHashes(6, 32, 4002);
  a.WritePages(2, "", more, 0);
  a.WaitSpilled(18);
  ASSERT_TRUE(b.Prefetch(more).ok());
  EXPECT_EQ(b.WaitPrefetched(more), 6u);
  b.ExpectPages(2, more, 6);
}

}  // namespace
}  // namespace kvtier::daemon
