// kvtierd's parameter table: every flag of the daemon, declared here and
// nowhere else, and DaemonOptionsFromFlags (daemon/daemon_options.h), the
// one place that reads and validates them. What the --cluster_* flags mean
// is in docs/cluster.md; the sockets' limits in daemon/server_limits.h.
//
// Thread-safety: as daemon_options.h says.
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/default_socket.h"
#include "common/fast_lookup.h"
#include "daemon/cluster_value.h"
#include "daemon/daemon_options.h"
#include "daemon/peer_credentials.h"
#include "daemon/redis_cluster.h"
#include "shm/numa.h"

// ---- Banks, namespaces, journals, the fence, rights ----
ABSL_FLAG(std::string, socket, "",
          "Unix socket to listen on (default: $XDG_RUNTIME_DIR/kvtier/"
          "kvtierd.sock, else /tmp/kvtier-<uid>/kvtierd.sock)");
ABSL_FLAG(std::string, shm_dir, "",
          "Folder for 4 KiB-page banks: a folder of kvtierd's uid that nobody "
          "else can write, created 0750 when missing (default: "
          "/dev/shm/kvtier-<uid>)");
ABSL_FLAG(std::string, hugetlbfs_dir, "",
          "hugetlbfs mount for 2 MiB-page banks (empty: detect one)");
ABSL_FLAG(std::string, huge_pages, "auto",
          "auto: huge pages where reserved, else shm_dir; off; require");
ABSL_FLAG(std::string, bank_numa_node, "auto",
          "NUMA node of the banks: auto (each rank's banks on the node of "
          "the GPU its engine names at Attach), none (first touch), or a "
          "node number for every bank");
ABSL_FLAG(std::string, segment_prefix, "kvtier",
          "Prefix of segment file names");
ABSL_FLAG(uint64_t, default_namespace_bytes, 1ull << 30,
          "Bank bytes per rank of a namespace whose attach names no capacity");
ABSL_FLAG(uint64_t, namespace_budget_bytes, 64ull << 30,
          "Most bank bytes one namespace may hold (all banks and ranks)");
ABSL_FLAG(uint32_t, default_max_replay_tokens, 8192,
          "Snapshot spacing: most tokens a replay should recompute");
ABSL_FLAG(uint32_t, max_namespaces, 256, "Most namespaces at once");
ABSL_FLAG(std::string, demo_namespace, "",
          "Create a small demo namespace of this name at start (make run)");
ABSL_FLAG(std::string, group, "",
          "Group (name or gid) that owns the sockets and segments, mode 0660: "
          "only its members reach the daemon and map banks (empty: the "
          "daemon's own group)");
ABSL_FLAG(std::string, admin_socket, "",
          "The operator socket (default: <socket>.admin): Drop, Stats, "
          "ListNamespaces, ListPrefixes and Verify with every right, for "
          "kvtierctl and gRPC tools; reachable only by --admin_group and "
          "kvtierd's uid (and root). 'none' disables it");
ABSL_FLAG(std::string, admin_group, "",
          "Group of the operator socket (mode 0660); empty: mode 0600, "
          "kvtierd's uid and root only");
ABSL_FLAG(std::vector<std::string>, device_pool_namespaces, {},
          "Namespaces the device pools serve (names, or prefixes ending in "
          "'*'); only sessions attached to them receive the pools' CUDA IPC "
          "handles. Empty: every namespace");
ABSL_FLAG(bool, require_peer_credentials, true,
          "Refuse Attach from sessions whose peer credentials (SO_PEERCRED, "
          "bound on the engine socket <socket>.lookup) are not known");
ABSL_FLAG(std::string, namespace_acl, "",
          "Who may attach where: PATTERN=PRINCIPAL[+PRINCIPAL...][;...], "
          "PATTERN a namespace name or a prefix ending in '*', PRINCIPAL "
          "uid:N, gid:N, user:NAME or group:NAME; a namespace's segments "
          "get its entry's first group (the daemon must be root or a "
          "member of it). Example: "
          "'llama=group:ml+user:alice;scratch.*=uid:1001'");
ABSL_FLAG(uint64_t, uid_budget_bytes, 0,
          "Most bank bytes the namespaces one uid creates may hold together "
          "(0: no limit)");
ABSL_FLAG(std::string, metrics_address, "127.0.0.1:9464",
          "Serve Prometheus metrics at http://ADDRESS/metrics (host:port, a "
          "loopback host unless a scraper elsewhere needs it; port 0 picks "
          "one; empty: no metrics). A port in use is logged, not fatal");
ABSL_FLAG(std::string, state_dir, "",
          "Folder of the namespace journals that let a restarted daemon find "
          "every acknowledged prefix (empty: <shm_dir>/<segment_prefix>.state, "
          "beside the banks it describes: both vanish at a reboot, and "
          "daemons with their own shm_dir never share it). 'none': no "
          "journal; a restart then serves nothing committed before it");
ABSL_FLAG(bool, journal_fsync, false,
          "fdatasync the journal after every record: acknowledged commits "
          "survive a machine crash too, at a disk flush each. Without it they "
          "survive any crash of the daemon process (the page cache keeps "
          "them); banks in /dev/shm do not survive a reboot anyway");
ABSL_FLAG(uint64_t, journal_compact_bytes, 64ull << 20,
          "Rewrite a namespace's journal as a checkpoint once the records "
          "after its last one exceed this and 4x the checkpoint");
ABSL_FLAG(uint32_t, unseen_pid_fence_s, 300,
          "Fence policy for a client whose pid kvtierd cannot see (another "
          "pid namespace): the rows its sessions held stay fenced this many "
          "seconds after its last session closed, unless it reports first "
          "(daemon/fence_registry.h)");
ABSL_FLAG(uint32_t, max_fence_holders_per_uid, 16384,
          "Most client connections of one uid recorded (once per namespace "
          "they attach to) as holding rows, for the restart fence; an "
          "Attach past it is refused until some of its processes exit. At "
          "least 1 (daemon/fence_registry.h)");
ABSL_FLAG(uint32_t, max_session_reservations, 4096,
          "Most open reservations one session may hold in a namespace (0: no "
          "cap)");
ABSL_FLAG(uint32_t, max_session_leases, 65536,
          "Most pinned leases one session may hold in a namespace (0: no cap)");
ABSL_FLAG(uint64_t, max_session_reserved_rows, 16384,
          "Most rows (page + snapshot) one session may hold reserved in a "
          "namespace at once, so that no session holds a whole bank (0: no "
          "cap; the default holds two 128k-token prompts of 16-token pages)");
ABSL_FLAG(std::string, corrupt_journal, "refuse",
          "A namespace journal with a corrupt record before its end: 'refuse' "
          "keeps the namespace (journal and segments) unrecoverable and "
          "unserved until an operator drops it; 'empty' reopens it empty");
ABSL_FLAG(uint32_t, fence_sweep_ms, 50,
          "How often kvtierd checks whether the holders of fenced rows have "
          "exited (pidfd), freeing their rows");
ABSL_FLAG(std::string, log_level, "info", "trace|debug|info|warn|error");
ABSL_FLAG(std::string, kv_events_endpoint, "",
          "ZMQ endpoint to bind for KV events in vLLM's wire format, one topic "
          "per namespace (e.g. tcp://*:5557 or ipc:///run/kvtier/events; "
          "empty: none)");
ABSL_FLAG(std::string, kv_events_replay_endpoint, "",
          "ZMQ ROUTER endpoint to bind for replaying missed KV event batches "
          "(empty: none)");
ABSL_FLAG(uint64_t, device_pool_bytes, 0,
          "Bytes of daemon-owned GPU memory per GPU for recurrent-state "
          "snapshots, exported to engines over CUDA IPC; survives engine "
          "restarts (0: off, and the daemon never loads CUDA)");
ABSL_FLAG(std::vector<std::string>, device_pool_gpus, {},
          "CUDA ordinals of the GPUs that get a device pool, comma-separated "
          "(empty: every visible GPU)");
ABSL_FLAG(uint64_t, device_pool_row_bytes, 64ull << 20,
          "Bytes of one snapshot slot of the device pools");

// ---- The sockets' limits (daemon/server_limits.h) ----
ABSL_FLAG(uint32_t, fast_lookup_hello_deadline_ms, 1000,
          "A fast lookup connection must send its Hello within this many ms, "
          "else it is closed");
ABSL_FLAG(uint32_t, fast_lookup_pending_per_uid, 32,
          "Most fast lookup connections one uid may have waiting for their "
          "Hello; a new one closes that uid's oldest");
ABSL_FLAG(uint32_t, fast_lookup_max_pending, 4096,
          "Most fast lookup connections waiting for their Hello in all; a "
          "new one closes the oldest");
ABSL_FLAG(uint32_t, fast_lookup_max_connections, 1024,
          "Most fast lookup connections served at once (one per engine "
          "process); beyond, a Hello is refused RESOURCE_EXHAUSTED");
ABSL_FLAG(uint32_t, fast_lookup_max_connections_per_uid, 256,
          "Most fast lookup connections served at once for one uid");
ABSL_FLAG(uint32_t, fast_lookup_max_request_bytes,
          kvtier::fastpath::kMaxRequestBytes,
          "Largest fast lookup request (bytes of hashes); the default is the "
          "largest valid one, 1 << 20 hashes of 32 bytes");
ABSL_FLAG(uint32_t, fast_lookup_idle_timeout_ms, 300000,
          "Close an engine-socket call connection that sends no request for "
          "this many ms (libkvtier dials again on its next call; session "
          "connections are never idle-closed); 0: never");
ABSL_FLAG(uint32_t, fast_lookup_frame_deadline_ms, 10000,
          "Once the first byte of an engine-socket frame arrives, the whole "
          "frame (header and payload) must arrive within this many ms, else "
          "the connection is closed (at least 1)");
ABSL_FLAG(uint32_t, max_sessions_per_uid, 128,
          "Most sessions one uid may hold bound on the engine socket (opened "
          "there, or opened over gRPC and bound there); past it an Open is "
          "refused RESOURCE_EXHAUSTED (at least 1)");
ABSL_FLAG(uint32_t, grpc_max_message_bytes, 64u << 20,
          "Largest message kvtierd receives or sends, over gRPC or as a call "
          "on the engine socket (at most 256 MiB there)");
ABSL_FLAG(uint32_t, grpc_max_concurrent_streams, 256,
          "Most concurrent gRPC calls on one client connection");
ABSL_FLAG(uint32_t, grpc_max_threads, 64,
          "Most threads gRPC runs for synchronous handlers (0: unset)");
ABSL_FLAG(uint64_t, grpc_memory_quota_bytes, 4ull << 30,
          "Memory gRPC may use for buffers across connections (0: gRPC's "
          "default), and the most bytes of requests the engine socket holds "
          "at once (0: no bound)");
ABSL_FLAG(uint32_t, grpc_handshake_timeout_ms, 10000,
          "A gRPC connection must finish its HTTP/2 handshake within this "
          "many ms, else it is closed (0: gRPC's default, 120 s)");
ABSL_FLAG(uint32_t, grpc_max_connection_idle_s, 300,
          "Close gRPC connections that carried no call this long (clients "
          "reconnect on their next call; 0: never)");
ABSL_FLAG(uint32_t, grpc_max_connections, 4096,
          "Most gRPC connections at once (waiting for their HTTP/2 preface or "
          "served); a new one past it is closed at accept (at least 1)");
ABSL_FLAG(uint32_t, grpc_max_connections_per_uid, 64,
          "Most gRPC connections one uid may have at once; a new one past it "
          "is closed at accept (at least 1)");

// ---- The cluster tier (docs/cluster.md) ----
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
namespace {

int ClampInt(uint64_t v) {
  return static_cast<int>(
      std::min<uint64_t>(v, std::numeric_limits<int>::max()));
}

// --shm_dir, --hugetlbfs_dir, --huge_pages, --bank_numa_node,
// --segment_prefix.
absl::Status SegmentsFromFlags(TierOptions* options) {
  options->segments.shm_dir = absl::GetFlag(FLAGS_shm_dir);
  if (options->segments.shm_dir.empty()) {
    options->segments.shm_dir = absl::StrCat("/dev/shm/kvtier-", ::geteuid());
  }
  options->segments.hugetlbfs_dir = absl::GetFlag(FLAGS_hugetlbfs_dir);
  const std::string huge = absl::GetFlag(FLAGS_huge_pages);
  if (huge == "auto") {
    options->segments.huge_pages = shm::HugePagePolicy::kAuto;
  } else if (huge == "off") {
    options->segments.huge_pages = shm::HugePagePolicy::kOff;
  } else if (huge == "require") {
    options->segments.huge_pages = shm::HugePagePolicy::kRequire;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--huge_pages: '", huge, "' is not auto, off or require"));
  }
  const std::string numa = absl::GetFlag(FLAGS_bank_numa_node);
  if (numa == "auto") {
    options->bank_numa_node = kBankNumaAuto;
  } else if (numa == "none") {
    options->bank_numa_node = kBankNumaNone;
  } else if (int node = 0; absl::SimpleAtoi(numa, &node) && node >= 0 &&
                           node <= shm::kMaxNumaNode) {
    options->bank_numa_node = node;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--bank_numa_node: '", numa,
                     "' is not auto, none or a node 0..", shm::kMaxNumaNode));
  }
  options->segment_prefix = absl::GetFlag(FLAGS_segment_prefix);
  return absl::OkStatus();
}

// --group, --require_peer_credentials, --namespace_acl, --uid_budget_bytes
// (daemon/peer_credentials.h).
absl::Status RightsFromFlags(DaemonOptions* o) {
  if (const std::string g = absl::GetFlag(FLAGS_group); !g.empty()) {
    auto gid = ResolveGroup(g, "--group");
    if (!gid.ok()) return gid.status();
    o->group = *gid;
    o->tier.segments.group = *gid;
  }
  o->tier.require_peer_credentials =
      absl::GetFlag(FLAGS_require_peer_credentials);
  auto acl = NamespaceAcl::Parse(absl::GetFlag(FLAGS_namespace_acl));
  if (!acl.ok()) return acl.status();
  // Segments of a namespace under an entry get the entry's first group, so
  // that only its members can map them; an entry naming only users would
  // leave them in --group, open to every member.
  for (const NamespaceAclEntry& e : acl->entries()) {
    if (!e.segment_group().has_value()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--namespace_acl: entry '", e.pattern,
          "' names no group: its segments would stay in --group, which "
          "every engine can map. Name a group (group:NAME) holding exactly "
          "the users that may attach"));
    }
  }
  o->tier.namespace_acl = *std::move(acl);
  o->tier.uid_budget_bytes = absl::GetFlag(FLAGS_uid_budget_bytes);
  return absl::OkStatus();
}

// Namespace sizes, journals, session caps, the fence.
absl::Status TierFromFlags(TierOptions* options) {
  TierOptions& o = *options;
  o.default_namespace_bytes = absl::GetFlag(FLAGS_default_namespace_bytes);
  o.namespace_budget_bytes = absl::GetFlag(FLAGS_namespace_budget_bytes);
  o.default_max_replay_tokens = absl::GetFlag(FLAGS_default_max_replay_tokens);
  o.max_namespaces = absl::GetFlag(FLAGS_max_namespaces);
  o.state_dir = absl::GetFlag(FLAGS_state_dir);
  if (o.state_dir.empty()) {
    o.state_dir =
        absl::StrCat(o.segments.shm_dir, "/", o.segment_prefix, ".state");
  } else if (o.state_dir == "none") {
    o.state_dir.clear();
  }
  o.journal.fsync = absl::GetFlag(FLAGS_journal_fsync);
  o.journal.min_compact_bytes = absl::GetFlag(FLAGS_journal_compact_bytes);
  if (const std::string c = absl::GetFlag(FLAGS_corrupt_journal);
      c == "empty") {
    o.corrupt_journal_empty = true;
  } else if (c != "refuse") {
    return absl::InvalidArgumentError(
        absl::StrCat("--corrupt_journal: '", c, "' is not refuse or empty"));
  }
  o.max_session_reservations = absl::GetFlag(FLAGS_max_session_reservations);
  o.max_session_leases = absl::GetFlag(FLAGS_max_session_leases);
  o.max_session_reserved_rows = absl::GetFlag(FLAGS_max_session_reserved_rows);
  o.fence.unseen_pid_hold =
      absl::Seconds(absl::GetFlag(FLAGS_unseen_pid_fence_s));
  o.fence.max_holders_per_uid = absl::GetFlag(FLAGS_max_fence_holders_per_uid);
  if (o.fence.max_holders_per_uid == 0) {
    return absl::InvalidArgumentError(
        "--max_fence_holders_per_uid: 0; must be at least 1 (every engine "
        "connection that attaches is recorded)");
  }
  o.device_pool_namespaces = absl::GetFlag(FLAGS_device_pool_namespaces);
  return absl::OkStatus();
}

// The sockets, metrics, the demo namespace, the sweeper, the log level.
absl::Status ServingFromFlags(DaemonOptions* o) {
  o->log_level = absl::GetFlag(FLAGS_log_level);
  o->socket = absl::GetFlag(FLAGS_socket);
  if (o->socket.empty()) o->socket = DefaultDaemonSocket();
  o->admin_socket = absl::GetFlag(FLAGS_admin_socket);
  if (o->admin_socket.empty()) o->admin_socket = o->socket + ".admin";
  if (o->admin_socket == "none") o->admin_socket.clear();
  if (const std::string g = absl::GetFlag(FLAGS_admin_group);
      !g.empty() && !o->admin_socket.empty()) {
    auto gid = ResolveGroup(g, "--admin_group");
    if (!gid.ok()) return gid.status();
    o->admin_group = *gid;
  }
  o->metrics_address = absl::GetFlag(FLAGS_metrics_address);
  o->demo_namespace = absl::GetFlag(FLAGS_demo_namespace);
  o->fence_sweep = absl::Milliseconds(
      std::max<uint32_t>(1, absl::GetFlag(FLAGS_fence_sweep_ms)));
  return absl::OkStatus();
}

// --device_pool_* and --kv_events_*.
absl::Status AttachmentsFromFlags(DaemonOptions* o) {
  o->device_pool.bytes_per_gpu = absl::GetFlag(FLAGS_device_pool_bytes);
  o->device_pool.row_bytes = absl::GetFlag(FLAGS_device_pool_row_bytes);
  for (const std::string& g : absl::GetFlag(FLAGS_device_pool_gpus)) {
    int ordinal = -1;
    if (!absl::SimpleAtoi(g, &ordinal) || ordinal < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--device_pool_gpus: '", g, "' is not a CUDA ordinal"));
    }
    o->device_pool.gpus.push_back(ordinal);
  }
  o->kv_events.endpoint = absl::GetFlag(FLAGS_kv_events_endpoint);
  o->kv_events.replay_endpoint = absl::GetFlag(FLAGS_kv_events_replay_endpoint);
  if (o->kv_events.endpoint.empty() && !o->kv_events.replay_endpoint.empty()) {
    return absl::InvalidArgumentError(
        "--kv_events_replay_endpoint needs --kv_events_endpoint");
  }
  return absl::OkStatus();
}

// The --cluster_* flags: none without --cluster_redis.
absl::Status ClusterFromFlags(DaemonOptions* d) {
  const std::string seeds = absl::GetFlag(FLAGS_cluster_redis);
  if (seeds.empty()) return absl::OkStatus();
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
  for (const auto* t : {&lookup, &fetch, &connect, &io}) {
    if (!t->ok()) return t->status();
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
  d->cluster_key_file = absl::GetFlag(FLAGS_cluster_key_file);
  if (d->cluster_key_file.empty()) {
    return absl::InvalidArgumentError(
        "--cluster_key_file: required with --cluster_redis (a file of at "
        "least 32 secret bytes that every daemon of the cluster shares)");
  }
  d->cluster = std::move(o);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ServerLimits> ServerLimitsFromFlags() {
  // Zero where it would mean "nothing may pass" is refused by name.
  for (const auto& [name, value] : {
           std::pair<const char*, uint32_t>{
               "--fast_lookup_frame_deadline_ms",
               absl::GetFlag(FLAGS_fast_lookup_frame_deadline_ms)},
           std::pair<const char*, uint32_t>{
               "--max_sessions_per_uid",
               absl::GetFlag(FLAGS_max_sessions_per_uid)},
           std::pair<const char*, uint32_t>{
               "--grpc_max_connections",
               absl::GetFlag(FLAGS_grpc_max_connections)},
           std::pair<const char*, uint32_t>{
               "--grpc_max_connections_per_uid",
               absl::GetFlag(FLAGS_grpc_max_connections_per_uid)},
       }) {
    if (value == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": must be at least 1, got 0"));
    }
  }
  ServerLimits l;
  l.max_message_bytes = ClampInt(absl::GetFlag(FLAGS_grpc_max_message_bytes));
  l.max_concurrent_streams =
      ClampInt(absl::GetFlag(FLAGS_grpc_max_concurrent_streams));
  l.max_threads = ClampInt(absl::GetFlag(FLAGS_grpc_max_threads));
  l.memory_quota_bytes = absl::GetFlag(FLAGS_grpc_memory_quota_bytes);
  l.handshake_timeout =
      absl::Milliseconds(absl::GetFlag(FLAGS_grpc_handshake_timeout_ms));
  l.max_connection_idle =
      absl::Seconds(absl::GetFlag(FLAGS_grpc_max_connection_idle_s));
  l.gate.preface_deadline = l.handshake_timeout > absl::ZeroDuration()
                                ? l.handshake_timeout
                                : absl::Seconds(120);
  l.gate.max_connections = ClampInt(absl::GetFlag(FLAGS_grpc_max_connections));
  l.gate.max_connections_per_uid =
      ClampInt(absl::GetFlag(FLAGS_grpc_max_connections_per_uid));
  FastLookupOptions& f = l.fast_lookup;
  f.hello_deadline =
      absl::Milliseconds(absl::GetFlag(FLAGS_fast_lookup_hello_deadline_ms));
  f.max_pending_per_uid =
      ClampInt(absl::GetFlag(FLAGS_fast_lookup_pending_per_uid));
  f.max_pending = ClampInt(absl::GetFlag(FLAGS_fast_lookup_max_pending));
  f.max_connections =
      ClampInt(absl::GetFlag(FLAGS_fast_lookup_max_connections));
  f.max_connections_per_uid =
      ClampInt(absl::GetFlag(FLAGS_fast_lookup_max_connections_per_uid));
  f.max_request_bytes = absl::GetFlag(FLAGS_fast_lookup_max_request_bytes);
  const uint32_t idle_ms = absl::GetFlag(FLAGS_fast_lookup_idle_timeout_ms);
  f.idle_timeout =
      idle_ms == 0 ? absl::InfiniteDuration() : absl::Milliseconds(idle_ms);
  f.frame_deadline =
      absl::Milliseconds(absl::GetFlag(FLAGS_fast_lookup_frame_deadline_ms));
  f.max_sessions_per_uid = ClampInt(absl::GetFlag(FLAGS_max_sessions_per_uid));
  f.max_call_bytes = std::min(absl::GetFlag(FLAGS_grpc_max_message_bytes),
                              fastpath::kMaxCallBytes);
  // The same bound on requests in flight on the engine socket (0: none).
  f.max_inflight_bytes = l.memory_quota_bytes > 0
                             ? l.memory_quota_bytes
                             : std::numeric_limits<uint64_t>::max();
  return l;
}

absl::StatusOr<DaemonOptions> DaemonOptionsFromFlags() {
  DaemonOptions o;
  auto limits = ServerLimitsFromFlags();
  if (!limits.ok()) return limits.status();
  o.limits = *std::move(limits);
  // In this order: TierFromFlags puts the state folder beside the banks.
  if (absl::Status s = SegmentsFromFlags(&o.tier); !s.ok()) return s;
  if (absl::Status s = RightsFromFlags(&o); !s.ok()) return s;
  if (absl::Status s = TierFromFlags(&o.tier); !s.ok()) return s;
  if (absl::Status s = ServingFromFlags(&o); !s.ok()) return s;
  if (absl::Status s = AttachmentsFromFlags(&o); !s.ok()) return s;
  if (absl::Status s = ClusterFromFlags(&o); !s.ok()) return s;
  return o;
}

}  // namespace kvtier::daemon
