// kvtierd's cluster-tier flags: see kvtierd_cluster.h.
//
// Thread-safety: as the header says.
#include "daemon/kvtierd_cluster.h"

#include <cstdint>
#include <string>
#include <utility>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "daemon/cluster_value.h"
#include "daemon/redis_cluster.h"

ABSL_FLAG(std::string, cluster_redis, "",
          "The cluster tier: seed nodes of a Redis Cluster shared by the "
          "daemons of several nodes, host:port,... (empty: no cluster tier). "
          "See docs/cluster.md.");
ABSL_FLAG(std::string, cluster_key_file, "",
          "File holding the cluster key (at least 32 bytes, mode 0600) that "
          "every daemon of the cluster shares: values are MAC'd under it, and "
          "a value that fails its MAC is a miss. Required with "
          "--cluster_redis.");
ABSL_FLAG(std::string, cluster_user, "",
          "Redis ACL user of the daemons (empty: AUTH with the password "
          "alone).");
ABSL_FLAG(std::string, cluster_password_file, "",
          "File holding the Redis password (mode 0600; empty: no AUTH).");
ABSL_FLAG(bool, cluster_write_through, false,
          "Write every committed page to the cluster tier at once (else only "
          "what the host tier evicts is spilled).");
ABSL_FLAG(uint64_t, cluster_spill_queue_bytes, uint64_t{1} << 30,
          "Bytes of pages waiting to be written to Redis; past it, spills "
          "are dropped and counted (eviction never waits for the network).");
ABSL_FLAG(int64_t, cluster_ttl_s, 0,
          "Expiry of the values written (0: none; Redis's maxmemory policy "
          "evicts).");
ABSL_FLAG(int64_t, cluster_lookup_deadline_ms, 20,
          "How long a remote Lookup may ask Redis how far a chain continues.");
ABSL_FLAG(int64_t, cluster_fetch_deadline_ms, 10000,
          "Deadline of one prefetch slice's GETs.");
ABSL_FLAG(int64_t, cluster_connect_timeout_ms, 250,
          "Connecting to a Redis node.");
ABSL_FLAG(int64_t, cluster_io_timeout_ms, 2000,
          "One read or write on a Redis connection.");
ABSL_FLAG(uint32_t, cluster_prefetch_slice_pages, 32,
          "Pages a prefetch fetches, checks and commits at a time (also at "
          "most 64 MiB).");
ABSL_FLAG(uint32_t, cluster_prefetch_threads, 2,
          "Prefetches that run at once.");
ABSL_FLAG(uint32_t, cluster_prefetch_in_flight, 4,
          "Slices of one prefetch whose GETs are out at once (1..8; each "
          "holds up to a slice's bytes of memory).");
ABSL_FLAG(uint32_t, cluster_check_threads, 0,
          "Threads that check (HMAC-SHA256) and copy a prefetch slice's "
          "values (0: one per core, 2 to 8).");

namespace kvtier::daemon {

absl::StatusOr<std::unique_ptr<ClusterTier>> ClusterTierFromFlags(
    KvEventSink* kv_events) {
  const std::string seeds = absl::GetFlag(FLAGS_cluster_redis);
  if (seeds.empty()) return std::unique_ptr<ClusterTier>();
  ClusterTierOptions o;
  auto parsed = ParseRedisSeeds(seeds);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--cluster_redis: ", parsed.status().message()));
  }
  o.redis.seeds = *std::move(parsed);
  o.redis.user = absl::GetFlag(FLAGS_cluster_user);
  if (const std::string p = absl::GetFlag(FLAGS_cluster_password_file);
      !p.empty()) {
    auto password = ReadSecretFile(p, "--cluster_password_file");
    if (!password.ok()) return password.status();
    o.redis.password = *std::move(password);
  }
  auto ms = [](const char* flag, int64_t v) -> absl::StatusOr<absl::Duration> {
    if (v <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, ": ", v, " must be positive"));
    }
    return absl::Milliseconds(v);
  };
  auto lookup = ms("cluster_lookup_deadline_ms",
                   absl::GetFlag(FLAGS_cluster_lookup_deadline_ms));
  auto fetch = ms("cluster_fetch_deadline_ms",
                  absl::GetFlag(FLAGS_cluster_fetch_deadline_ms));
  auto connect = ms("cluster_connect_timeout_ms",
                    absl::GetFlag(FLAGS_cluster_connect_timeout_ms));
  auto io =
      ms("cluster_io_timeout_ms", absl::GetFlag(FLAGS_cluster_io_timeout_ms));
  for (const auto* d : {&lookup, &fetch, &connect, &io}) {
    if (!d->ok()) return d->status();
  }
  o.lookup_deadline = *lookup;
  o.fetch_deadline = *fetch;
  o.write_deadline = *fetch;
  o.redis.connect_timeout = *connect;
  o.redis.io_timeout = *io;
  const int64_t ttl = absl::GetFlag(FLAGS_cluster_ttl_s);
  if (ttl < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--cluster_ttl_s: ", ttl, " is negative"));
  }
  o.ttl = absl::Seconds(ttl);
  o.write_through = absl::GetFlag(FLAGS_cluster_write_through);
  o.spill_queue_bytes = absl::GetFlag(FLAGS_cluster_spill_queue_bytes);
  o.prefetch_slice_pages = absl::GetFlag(FLAGS_cluster_prefetch_slice_pages);
  o.prefetch_threads = absl::GetFlag(FLAGS_cluster_prefetch_threads);
  o.prefetch_in_flight = absl::GetFlag(FLAGS_cluster_prefetch_in_flight);
  o.check_threads = absl::GetFlag(FLAGS_cluster_check_threads);
  o.kv_events = kv_events;
  const std::string key_file = absl::GetFlag(FLAGS_cluster_key_file);
  if (key_file.empty()) {
    return absl::InvalidArgumentError(
        "--cluster_key_file: required with --cluster_redis (a file of at "
        "least 32 secret bytes that every daemon of the cluster shares)");
  }
  auto key = ClusterKey::ReadFile(key_file);
  if (!key.ok()) return key.status();
  return ClusterTier::Create(std::move(o), *std::move(key));
}

}  // namespace kvtier::daemon
