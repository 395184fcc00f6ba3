// RedisClusterFixture: a real Redis Cluster for tests (no mocks). It starts
// redis-server processes (N masters with R replicas each) on free ports, each
// in its own temporary folder with its own redis.conf and nodes.conf, joins
// them with `redis-cli --cluster create`, and waits until every node reports
// the cluster ok. Tests then kill, pause, restart and re-shard nodes through
// it, and read the cluster's own view (CLUSTER NODES) to find who serves a
// slot.
//
// ACL: the default user (the fixture's administrator, which redis-cli
// --cluster, replication and MIGRATE use) has a random password; the client
// under test logs in as `user()` with `password()`, a user allowed only what
// kvtierd needs (kDaemonAcl: GET SET EXISTS DEL on keys matching
// key_pattern, ASKING and CLUSTER SLOTS).
//
// Every node can be placed apart (RedisNodePlacement: its bind address and a
// command prefix such as {"ip", "netns", "exec", "kvt3"}), so a test can put
// each node in its own network namespace. The fixture itself reaches the
// nodes at their bind addresses from the calling process.
//
// Node processes get SIGKILL when the thread that started them exits
// (PR_SET_PDEATHSIG), so a crashed test leaves no server behind; start the
// fixture from the test's main thread.
//
// Thread-safety: not thread-safe; one test thread drives it.
#ifndef KVTIER_TESTS_REDIS_CLUSTER_FIXTURE_H_
#define KVTIER_TESTS_REDIS_CLUSTER_FIXTURE_H_

#include <sys/types.h>

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace kvtier::testing {

// The daemon user's ACL rule after its name, password and key pattern: the
// least Redis 7.0 accepts for RedisCluster (daemon/redis_cluster.h).
inline constexpr char kDaemonAcl[] =
    "resetchannels -@all +get +set +exists +del +asking +cluster|slots";

// Where one node runs.
struct RedisNodePlacement {
  std::string bind_address = "127.0.0.1";
  // Prepended to the redis-server command line (the pid stays the server's
  // when the prefix execs it, as `ip netns exec` does).
  std::vector<std::string> command_prefix;
};

struct RedisClusterConfig {
  int masters = 3;
  int replicas = 0;  // per master
  // Node i's placement (0 <= i < masters * (1 + replicas)); empty: every node
  // on 127.0.0.1 without a prefix.
  std::function<RedisNodePlacement(int node)> placement;
  absl::Duration node_timeout = absl::Milliseconds(1000);
  std::string maxmemory = "256mb";  // with maxmemory-policy allkeys-lru
  std::string user = "kvtier";      // the daemon's ACL user
  std::string key_pattern = "kvt*";
  // More redis.conf lines for every node (another ACL user, say).
  std::vector<std::string> extra_config;
};

class RedisClusterFixture {
 public:
  // OK when redis-server and redis-cli are found (in $KVTIER_REDIS_BIN_DIR
  // when set, else on PATH, then in /usr/bin and /usr/sbin); NOT_FOUND
  // naming the missing one otherwise.
  static absl::Status Available();
  // True when KVTIER_REQUIRE_REDIS=1: a missing Redis fails the test instead
  // of skipping it (KVTIER_REDIS_OR_SKIP).
  static bool Required();

  explicit RedisClusterFixture(RedisClusterConfig config = {});
  ~RedisClusterFixture();  // Stop()
  RedisClusterFixture(const RedisClusterFixture&) = delete;
  RedisClusterFixture& operator=(const RedisClusterFixture&) = delete;

  // Starts every node, creates the cluster and waits until it is ok and,
  // with replicas, every replica is in sync. REQUIRES: called once.
  absl::Status Start();
  // Kills every node and removes the temporary folders.
  void Stop();

  int size() const { return static_cast<int>(nodes_.size()); }
  // "host:port" of node i, and of every node joined by commas.
  std::string Address(int i) const;
  std::string Seeds() const;
  const std::string& user() const { return config_.user; }
  const std::string& password() const { return password_; }
  const std::string& admin_password() const { return admin_password_; }
  pid_t pid(int i) const { return nodes_[i].pid; }
  bool running(int i) const { return nodes_[i].pid > 0; }
  // Node i's redis log (for failure messages).
  std::string LogTail(int i, size_t max_bytes = 4000) const;

  // SIGKILL node i and reap it.
  absl::Status Kill(int i);
  // SIGSTOP / SIGCONT node i: it stays connected but answers nothing.
  absl::Status Pause(int i);
  absl::Status Resume(int i);
  // Starts node i again from its folder (same port, config and nodes.conf;
  // its data is gone: no persistence) and waits until it answers PING.
  absl::Status Restart(int i);

  // Runs one command on node i as the administrator. The reply flattened:
  // strings and status as they are, integers in decimal, nil empty, arrays
  // one element per line; an error reply is an error status with its text.
  absl::StatusOr<std::string> Command(int i,
                                      const std::vector<std::string>& argv);
  absl::StatusOr<std::string> NodeId(int i);
  // The index of the master serving `slot` in running node `ask`'s view
  // (-1: the first running node); NOT_FOUND when none does.
  absl::StatusOr<int> MasterOfSlot(int slot, int ask = -1);
  // The master serving each of the 16384 slots (-1: none), as above.
  absl::StatusOr<std::vector<int>> SlotOwners(int ask = -1);
  // Masters and each master's replicas, as running node `ask` sees them.
  absl::StatusOr<std::vector<int>> Masters(int ask = -1);
  absl::StatusOr<std::vector<int>> ReplicasOf(int master, int ask = -1);

  // Polls (at most `polls` times, `interval` apart) until every running node
  // reports cluster_state:ok with all slots assigned and none failing.
  absl::Status WaitHealthy(int polls = 300,
                           absl::Duration interval = absl::Milliseconds(100));
  // Polls until every replica of a running master has its link up and the
  // master's replication offset.
  absl::Status WaitReplicasSynced(
      int polls = 300, absl::Duration interval = absl::Milliseconds(100));
  // After Kill(dead_master): polls until one of its former replicas
  // (`replicas`, from ReplicasOf before the kill) is a master with slots in
  // every running node's view; returns its index.
  absl::StatusOr<int> WaitFailover(
      const std::vector<int>& replicas, int polls = 600,
      absl::Duration interval = absl::Milliseconds(100));

  // Slot migration by hand, as redis-cli --cluster reshard does it:
  // BeginSlotMigration marks `slot` IMPORTING on `to` and MIGRATING on its
  // owner; MigrateKeys moves `keys` (all in `slot`) to `to`;
  // FinishSlotMigration moves the rest and assigns the slot to `to` on every
  // running master. MoveSlot does all three.
  absl::Status BeginSlotMigration(int slot, int to);
  absl::Status MigrateKeys(int slot, const std::vector<std::string>& keys,
                           int to);
  absl::Status FinishSlotMigration(int slot, int to);
  absl::Status MoveSlot(int slot, int to);

 private:
  struct Node {
    RedisNodePlacement placement;
    int port = 0;
    std::string dir;
    pid_t pid = -1;
  };

  absl::Status StartNode(int i);
  absl::Status WaitPing(int i);
  absl::StatusOr<int> IndexOf(const std::string& address) const;
  int FirstRunning() const;
  absl::StatusOr<std::string> ClusterNodes(int ask);

  RedisClusterConfig config_;
  std::string server_path_, cli_path_;
  std::string password_, admin_password_;
  std::string root_;  // temporary folder holding one folder per node
  std::vector<Node> nodes_;
};

}  // namespace kvtier::testing

// In a test or SetUp: skips when Redis is not installed, or fails when
// KVTIER_REQUIRE_REDIS=1.
#define KVTIER_REDIS_OR_SKIP()                                                \
  do {                                                                        \
    const ::absl::Status kvtier_redis_available =                             \
        ::kvtier::testing::RedisClusterFixture::Available();                  \
    if (!kvtier_redis_available.ok()) {                                       \
      if (::kvtier::testing::RedisClusterFixture::Required()) {               \
        GTEST_FAIL() << "KVTIER_REQUIRE_REDIS=1: " << kvtier_redis_available; \
      }                                                                       \
      GTEST_SKIP() << kvtier_redis_available;                                 \
    }                                                                         \
  } while (0)

#endif  // KVTIER_TESTS_REDIS_CLUSTER_FIXTURE_H_
