// Tests of DaemonOptionsFromFlags (daemon/daemon_options.h): the defaults
// give a runnable daemon, and every value kvtierd cannot run with is
// refused INVALID_ARGUMENT naming its flag, before anything starts.
#include "daemon/daemon_options.h"

#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvtier::daemon {
namespace {

using ::testing::HasSubstr;

// Sets flag `name` to `value` (as on the command line) for one check; the
// saver in the test puts every flag back.
void Set(const std::string& name, const std::string& value) {
  absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
  ASSERT_NE(flag, nullptr) << name;
  std::string error;
  ASSERT_TRUE(flag->ParseFrom(value, &error)) << name << ": " << error;
}

TEST(DaemonOptionsTest, DefaultsRun) {
  absl::FlagSaver saver;
  auto o = DaemonOptionsFromFlags();
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_FALSE(o->socket.empty());
  EXPECT_EQ(o->admin_socket, o->socket + ".admin");
  EXPECT_EQ(o->tier.state_dir,
            o->tier.segments.shm_dir + "/" + o->tier.segment_prefix + ".state");
  EXPECT_EQ(o->metrics_address, "127.0.0.1:9464");
  EXPECT_FALSE(o->cluster.has_value());
  EXPECT_EQ(o->device_pool.bytes_per_gpu, 0u);
  EXPECT_EQ(o->limits.gate.max_connections_per_uid, 64);
  EXPECT_EQ(o->fence_sweep, absl::Milliseconds(50));
}

TEST(DaemonOptionsTest, SettingsArrive) {
  absl::FlagSaver saver;
  Set("socket", "/run/kvtier/d.sock");
  Set("admin_socket", "none");
  Set("state_dir", "none");
  Set("huge_pages", "off");
  Set("bank_numa_node", "1");
  Set("corrupt_journal", "empty");
  Set("device_pool_gpus", "0,2");
  Set("cluster_redis", "127.0.0.1:7000");
  Set("cluster_key_file", "/etc/kvtier/cluster.key");
  Set("cluster_prefetch_in_flight", "7");
  auto o = DaemonOptionsFromFlags();
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->socket, "/run/kvtier/d.sock");
  EXPECT_TRUE(o->admin_socket.empty());
  EXPECT_TRUE(o->tier.state_dir.empty());
  EXPECT_EQ(o->tier.segments.huge_pages, shm::HugePagePolicy::kOff);
  EXPECT_EQ(o->tier.bank_numa_node, 1);
  EXPECT_TRUE(o->tier.corrupt_journal_empty);
  EXPECT_EQ(o->device_pool.gpus, (std::vector<int>{0, 2}));
  ASSERT_TRUE(o->cluster.has_value());
  EXPECT_EQ(o->cluster->prefetch_in_flight, 7u);
  EXPECT_EQ(o->cluster_key_file, "/etc/kvtier/cluster.key");
}

TEST(DaemonOptionsTest, BadValuesAreRefusedByName) {
  struct Case {
    std::vector<std::pair<std::string, std::string>> flags;
    std::string named;  // What the error must name.
  };
  const std::vector<Case> cases = {
      {{{"huge_pages", "sometimes"}}, "--huge_pages"},
      {{{"bank_numa_node", "near"}}, "--bank_numa_node"},
      {{{"bank_numa_node", "100000"}}, "--bank_numa_node"},
      {{{"corrupt_journal", "ignore"}}, "--corrupt_journal"},
      {{{"max_fence_holders_per_uid", "0"}}, "--max_fence_holders_per_uid"},
      {{{"namespace_acl", "llama=uid:1001"}}, "--namespace_acl"},
      {{{"device_pool_gpus", "first"}}, "--device_pool_gpus"},
      {{{"kv_events_replay_endpoint", "tcp://*:5558"}},
       "--kv_events_replay_endpoint"},
      {{{"grpc_max_connections", "0"}}, "--grpc_max_connections"},
      {{{"max_sessions_per_uid", "0"}}, "--max_sessions_per_uid"},
      {{{"fast_lookup_frame_deadline_ms", "0"}},
       "--fast_lookup_frame_deadline_ms"},
      {{{"cluster_redis", "127.0.0.1:7000"}}, "--cluster_key_file"},
      {{{"cluster_redis", "127.0.0.1:7000"},
        {"cluster_key_file", "/k"},
        {"cluster_fetch_deadline_ms", "0"}},
       "--cluster_fetch_deadline_ms"},
      {{{"cluster_redis", "127.0.0.1:7000"},
        {"cluster_key_file", "/k"},
        {"cluster_ttl_s", "-1"}},
       "--cluster_ttl_s"},
  };
  for (const Case& c : cases) {
    absl::FlagSaver saver;
    for (const auto& [name, value] : c.flags) Set(name, value);
    auto o = DaemonOptionsFromFlags();
    ASSERT_FALSE(o.ok()) << c.named;
    EXPECT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument)
        << o.status();
    EXPECT_THAT(o.status().message(), HasSubstr(c.named));
  }
  // Each case changed nothing for the next: the defaults still run.
  EXPECT_TRUE(DaemonOptionsFromFlags().ok());
}

TEST(DaemonOptionsTest, UnknownGroupIsRefused) {
  absl::FlagSaver saver;
  Set("group", "kvtier-no-such-group");
  auto o = DaemonOptionsFromFlags();
  ASSERT_FALSE(o.ok());
  EXPECT_THAT(o.status().message(), HasSubstr("--group"));
}

}  // namespace
}  // namespace kvtier::daemon
