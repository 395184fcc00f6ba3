// kvtierd: the per-node daemon. Parses flags (absl; --flagfile works),
// creates the TierCore, serves TierService, grpc.health.v1.Health and server
// reflection on a unix socket and Prometheus metrics on a loopback port,
// tells systemd when it is ready (sd_notify, watchdog), and drains cleanly on
// SIGTERM/SIGINT, keeping the segments so a restarted daemon finds them.
#include <signal.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/default_socket.h"
#include "daemon/device_pool.h"
#include "daemon/fast_lookup_server.h"
#include "daemon/grpc_gate.h"
#include "daemon/kv_events.h"
#include "daemon/kvtierd_cluster.h"
#include "daemon/metrics.h"
#include "daemon/server_limits.h"
#include "daemon/socket_staging.h"
#include "daemon/systemd_notify.h"
#include "daemon/tier_core.h"
#include "daemon/tier_service.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "shm/numa.h"
#include "shm/trusted_path.h"
#include "spdlog/sinks/stdout_color_sinks.h"
#include "spdlog/spdlog.h"

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

namespace kvtier::daemon {
namespace {

// Makes the folder of socket `path` (named `what` in errors) trusted,
// removes a stale socket there and returns where to bind it: out of reach
// until StagedSocket::Publish gives it its group and mode.
absl::StatusOr<StagedSocket> PrepareSocket(const std::string& path, gid_t group,
                                           absl::string_view what) {
  if (path.size() >= sizeof(sockaddr_un::sun_path)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": path longer than ",
                     sizeof(sockaddr_un::sun_path) - 1, " bytes"));
  }
  std::error_code ec;
  const std::filesystem::path dir =
      std::filesystem::absolute(path).parent_path();
  const bool existed = std::filesystem::exists(dir, ec);
  if (!existed && dir.has_parent_path()) {
    std::filesystem::create_directories(dir.parent_path(), ec);
  }
  // The folder must be the daemon's and nobody else's to write
  // (shm/trusted_path.h): clients trust the socket they find there.
  if (absl::Status s = shm::EnsureTrustedDir(dir.string(), 0750, what);
      !s.ok()) {
    return s;
  }
  if (!existed && group != static_cast<gid_t>(-1) &&
      ::chown(dir.c_str(), static_cast<uid_t>(-1), group) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": cannot give ", dir.string(), " to group ", group,
                     ": ", strerror(errno)));
  }
  // A socket file left by a daemon that died is removed (a live daemon's
  // too: one kvtierd per socket path).
  struct stat st;
  if (::lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return absl::FailedPreconditionError(
          absl::StrCat(what, ": ", path, " exists and is not a socket"));
    }
    ::unlink(path.c_str());
  }
  return StagedSocket::Create(path, what);
}

v1::Layout DemoLayout() {
  // A small attention model: 4 layers, 8 KV heads, head dim 64, bf16,
  // 16-token pages, fp8-style per-token scales as a side bank.
  v1::Layout l;
  l.set_model("kvtier-demo");
  l.set_tokens_per_page(16);
  l.set_num_layers(4);
  auto* kv = l.add_page_banks();
  kv->set_name("kv");
  kv->set_row_bytes(4 * 2 * 16 * 8 * 64 * 2);
  kv->set_dtype("bf16");
  auto* scale = l.add_page_banks();
  scale->set_name("scale");
  scale->set_row_bytes(4 * 2 * 16 * 4);
  scale->set_dtype("fp32");
  l.set_tp_size(1);
  l.set_hash_kind(v1::HASH_KIND_SHA256);
  return l;
}

int Main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "kvtierd: per-node host-memory tier for LLM KV caches");
  absl::ParseCommandLine(argc, argv);
  // Logs go to stderr (journald takes both streams; stdout stays clean).
  spdlog::set_default_logger(spdlog::stderr_color_mt("kvtierd"));
  spdlog::set_level(spdlog::level::from_str(absl::GetFlag(FLAGS_log_level)));
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ %v");
  // The sockets' limits (daemon/server_limits.h), refused by name before
  // anything starts.
  const absl::StatusOr<ServerLimits> limits = ServerLimitsFromFlags();
  if (!limits.ok()) {
    SPDLOG_CRITICAL("{}", limits.status().ToString());
    return 2;
  }
  // Every connection costs an fd (daemon/server_limits.h).
  if (auto fds = RaiseFileLimit(); fds.ok()) {
    SPDLOG_INFO("open files: soft limit {} (was {}, hard {})", fds->after,
                fds->before, fds->hard);
  } else {
    SPDLOG_WARN("{}; keeping the open-file limit", fds.status().ToString());
  }

  // Block the stop signals in every thread; one thread waits for them.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  TierOptions options;
  options.segments.shm_dir = absl::GetFlag(FLAGS_shm_dir);
  if (options.segments.shm_dir.empty()) {
    options.segments.shm_dir = absl::StrCat("/dev/shm/kvtier-", ::geteuid());
  }
  options.segments.hugetlbfs_dir = absl::GetFlag(FLAGS_hugetlbfs_dir);
  const std::string huge = absl::GetFlag(FLAGS_huge_pages);
  if (huge == "auto") {
    options.segments.huge_pages = shm::HugePagePolicy::kAuto;
  } else if (huge == "off") {
    options.segments.huge_pages = shm::HugePagePolicy::kOff;
  } else if (huge == "require") {
    options.segments.huge_pages = shm::HugePagePolicy::kRequire;
  } else {
    SPDLOG_CRITICAL("--huge_pages: '{}' is not auto, off or require", huge);
    return 2;
  }
  const std::string numa = absl::GetFlag(FLAGS_bank_numa_node);
  if (numa == "auto") {
    options.bank_numa_node = kvtier::daemon::kBankNumaAuto;
  } else if (numa == "none") {
    options.bank_numa_node = kvtier::daemon::kBankNumaNone;
  } else if (int node = 0; absl::SimpleAtoi(numa, &node) && node >= 0 &&
                           node <= kvtier::shm::kMaxNumaNode) {
    options.bank_numa_node = node;
  } else {
    SPDLOG_CRITICAL("--bank_numa_node: '{}' is not auto, none or a node 0..{}",
                    numa, kvtier::shm::kMaxNumaNode);
    return 2;
  }
  options.segment_prefix = absl::GetFlag(FLAGS_segment_prefix);
  options.default_namespace_bytes =
      absl::GetFlag(FLAGS_default_namespace_bytes);
  options.namespace_budget_bytes = absl::GetFlag(FLAGS_namespace_budget_bytes);
  options.default_max_replay_tokens =
      absl::GetFlag(FLAGS_default_max_replay_tokens);
  options.max_namespaces = absl::GetFlag(FLAGS_max_namespaces);
  // Isolation: see daemon/peer_credentials.h.
  gid_t group = static_cast<gid_t>(-1);
  if (const std::string g = absl::GetFlag(FLAGS_group); !g.empty()) {
    auto gid = ResolveGroup(g, "--group");
    if (!gid.ok()) {
      SPDLOG_CRITICAL("{}", gid.status().ToString());
      return 2;
    }
    group = *gid;
    options.segments.group = group;
  }
  options.require_peer_credentials =
      absl::GetFlag(FLAGS_require_peer_credentials);
  auto acl = NamespaceAcl::Parse(absl::GetFlag(FLAGS_namespace_acl));
  if (!acl.ok()) {
    SPDLOG_CRITICAL("{}", acl.status().ToString());
    return 2;
  }
  // Segments of a namespace under an entry get the entry's first group, so
  // that only its members can map them; an entry naming only users would
  // leave them in --group, open to every member.
  for (const NamespaceAclEntry& e : acl->entries()) {
    if (!e.segment_group().has_value()) {
      SPDLOG_CRITICAL(
          "--namespace_acl: entry '{}' names no group: its segments would "
          "stay in --group, which every engine can map. Name a group "
          "(group:NAME) holding exactly the users that may attach",
          e.pattern);
      return 2;
    }
  }
  options.namespace_acl = *std::move(acl);
  // Banks live only in a folder nobody but the daemon can write, so nobody
  // can pre-create a namespace's banks (shm/trusted_path.h). Engines of
  // --group enter it to map them.
  {
    const std::string& dir = options.segments.shm_dir;
    struct stat before;
    const bool existed = ::lstat(dir.c_str(), &before) == 0;
    if (absl::Status s = shm::EnsureTrustedDir(dir, 0750, "--shm_dir");
        !s.ok()) {
      SPDLOG_CRITICAL("{}", s.ToString());
      return 2;
    }
    if (!existed && group != static_cast<gid_t>(-1) &&
        ::chown(dir.c_str(), static_cast<uid_t>(-1), group) != 0) {
      SPDLOG_CRITICAL("--shm_dir: cannot give {} to group {}: {}", dir, group,
                      strerror(errno));
      return 2;
    }
  }
  options.uid_budget_bytes = absl::GetFlag(FLAGS_uid_budget_bytes);
  options.state_dir = absl::GetFlag(FLAGS_state_dir);
  if (options.state_dir.empty()) {
    options.state_dir = absl::StrCat(options.segments.shm_dir, "/",
                                     options.segment_prefix, ".state");
  } else if (options.state_dir == "none") {
    options.state_dir.clear();
  }
  options.journal.fsync = absl::GetFlag(FLAGS_journal_fsync);
  if (const std::string c = absl::GetFlag(FLAGS_corrupt_journal);
      c == "empty") {
    options.corrupt_journal_empty = true;
  } else if (c != "refuse") {
    SPDLOG_CRITICAL("--corrupt_journal: '{}' is not refuse or empty", c);
    return 2;
  }
  options.max_session_reservations =
      absl::GetFlag(FLAGS_max_session_reservations);
  options.max_session_leases = absl::GetFlag(FLAGS_max_session_leases);
  options.max_session_reserved_rows =
      absl::GetFlag(FLAGS_max_session_reserved_rows);
  options.fence.unseen_pid_hold =
      absl::Seconds(absl::GetFlag(FLAGS_unseen_pid_fence_s));
  options.fence.max_holders_per_uid =
      absl::GetFlag(FLAGS_max_fence_holders_per_uid);
  if (options.fence.max_holders_per_uid == 0) {
    SPDLOG_CRITICAL(
        "--max_fence_holders_per_uid: 0; must be at least 1 (every engine "
        "connection that attaches is recorded)");
    return 2;
  }
  options.journal.min_compact_bytes =
      absl::GetFlag(FLAGS_journal_compact_bytes);

  // The device pools: the only place the daemon touches CUDA, and only when
  // asked (daemon/device_pool.h). Declared before the core, which hands
  // their handles out, so it outlives it.
  std::unique_ptr<DevicePool> device_pool;
  if (const uint64_t bytes = absl::GetFlag(FLAGS_device_pool_bytes);
      bytes > 0) {
    DevicePoolOptions dp;
    dp.bytes_per_gpu = bytes;
    dp.row_bytes = absl::GetFlag(FLAGS_device_pool_row_bytes);
    for (const std::string& g : absl::GetFlag(FLAGS_device_pool_gpus)) {
      int ordinal = -1;
      if (!absl::SimpleAtoi(g, &ordinal) || ordinal < 0) {
        SPDLOG_CRITICAL("--device_pool_gpus: '{}' is not a CUDA ordinal", g);
        return 2;
      }
      dp.gpus.push_back(ordinal);
    }
    auto pool = DevicePool::Create(dp);
    if (!pool.ok()) {
      SPDLOG_CRITICAL("--device_pool_bytes: {}", pool.status().ToString());
      return 2;
    }
    device_pool = std::move(*pool);
    for (const DevicePoolExport& e : device_pool->exports()) {
      SPDLOG_INFO("device pool on GPU {} ({}): {} snapshot slots of {} bytes",
                  e.device_ordinal, e.pci_bus_id, e.rows, e.row_bytes);
    }
    options.device_pools = device_pool->exports();
  }
  options.device_pool_namespaces = absl::GetFlag(FLAGS_device_pool_namespaces);

  // KV events (daemon/kv_events.h): declared before the core, which
  // publishes through it, so it outlives it.
  std::unique_ptr<kvtier::daemon::KvEventPublisher> kv_events;
  if (const std::string e = absl::GetFlag(FLAGS_kv_events_endpoint);
      !e.empty()) {
    auto pub = kvtier::daemon::KvEventPublisher::Start(
        {.endpoint = e,
         .replay_endpoint = absl::GetFlag(FLAGS_kv_events_replay_endpoint)});
    if (!pub.ok()) {
      SPDLOG_CRITICAL("--kv_events_endpoint: {}", pub.status().ToString());
      return 2;
    }
    kv_events = *std::move(pub);
    SPDLOG_INFO("KV events on {}{}{}", kv_events->endpoint(),
                kv_events->replay_endpoint().empty() ? "" : ", replay on ",
                kv_events->replay_endpoint());
    options.kv_events = kv_events.get();
  } else if (!absl::GetFlag(FLAGS_kv_events_replay_endpoint).empty()) {
    SPDLOG_CRITICAL("--kv_events_replay_endpoint needs --kv_events_endpoint");
    return 2;
  }

  // The cluster tier (docs/cluster.md): outlives the core, which waits for
  // its prefetch jobs when destroyed.
  auto cluster = kvtier::daemon::ClusterTierFromFlags(kv_events.get());
  if (!cluster.ok()) {
    SPDLOG_CRITICAL("{}", cluster.status().ToString());
    return 2;
  }
  options.cluster = cluster->get();
  TierCore core(options);
  // Before anything is served: namespaces and indexes from the journals.
  if (auto report = core.Recover(); !report.ok()) {
    SPDLOG_CRITICAL("{}", report.status().ToString());
    return 1;
  } else if (!options.state_dir.empty()) {
    SPDLOG_INFO(
        "recovered {} namespaces ({} emptied: segments recreated), "
        "{} pages, from {} journal bytes in {} ({} torn, {} "
        "unreadable, {} corrupt; {} namespaces unrecoverable) in {}",
        report->namespaces, report->namespaces_emptied, report->pages,
        report->journal_bytes, options.state_dir, report->journals_torn,
        report->journals_unreadable, report->journals_corrupt,
        report->namespaces_unrecoverable,
        absl::FormatDuration(report->elapsed));
  }
  core.StartFenceSweeper(absl::Milliseconds(
      std::max<uint32_t>(1, absl::GetFlag(FLAGS_fence_sweep_ms))));
  if (const std::string demo = absl::GetFlag(FLAGS_demo_namespace);
      !demo.empty()) {
    if (absl::Status s = core.CreateNamespace(demo, DemoLayout(), {});
        !s.ok()) {
      SPDLOG_CRITICAL("--demo_namespace: {}", s.ToString());
      return 1;
    }
  }

  // Metrics read the core at scrape time; the hook times requests. They are
  // auxiliary: a taken port is logged and the tier serves without them.
  MetricsExporter metrics(&core);
  std::string metrics_status = "no metrics";
  if (const std::string address = absl::GetFlag(FLAGS_metrics_address);
      !address.empty()) {
    if (absl::Status s = metrics.Start(address); s.ok()) {
      SetLatencySink(&metrics);
      metrics_status = absl::StrCat("metrics on http://",
                                    address.substr(0, address.rfind(':')), ":",
                                    metrics.port(), "/metrics");
      SPDLOG_INFO("{}", metrics_status);
    } else if (absl::IsInvalidArgument(s)) {
      SPDLOG_CRITICAL("{}", s.ToString());
      return 2;
    } else {
      metrics_status = "metrics unavailable";
      SPDLOG_ERROR("{}; serving without metrics", s.ToString());
    }
  }
  // Uninstalls the hook before `metrics` goes, whichever way Main returns
  // (declared after it, so destroyed first; the servers below go earlier).
  struct SinkGuard {
    ~SinkGuard() { SetLatencySink(nullptr); }
  } sink_guard;
  SystemdNotifier notifier;

  std::string socket = absl::GetFlag(FLAGS_socket);
  if (socket.empty()) socket = DefaultDaemonSocket();
  // Each gRPC socket is bound out of reach and appears at its path only
  // with its group and mode set (daemon/socket_staging.h).
  absl::StatusOr<StagedSocket> staged =
      PrepareSocket(socket, group, "--socket");
  if (!staged.ok()) {
    SPDLOG_CRITICAL("{}", staged.status().ToString());
    return 1;
  }

  FastLookupServer fast(&core, limits->fast_lookup);
  // The engine socket: libkvtier's sessions and calls (common/fast_lookup.h).
  const std::string fast_socket = socket + ".lookup";
  if (absl::Status s = fast.Start(fast_socket, group); !s.ok()) {
    SPDLOG_CRITICAL("{}", s.ToString());
    return 1;
  }
  TierService service(&core, fast_socket);
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.RegisterService(&service);
  ApplyServerLimits(&builder, *limits);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr) {
    SPDLOG_CRITICAL("cannot start the gRPC server for unix:{}", socket);
    return 1;
  }
  // The server has no listener of its own: its connections come through the
  // gate, which caps them per uid (daemon/grpc_gate.h).
  GrpcGate gate(server.get(), limits->gate);
  if (absl::Status s = gate.Start(staged->bind_path()); !s.ok()) {
    SPDLOG_CRITICAL("{} (another daemon running?)", s.ToString());
    server->Shutdown();
    fast.Stop();
    return 1;
  }
  if (absl::Status s = staged->Publish(group, 0660); !s.ok()) {
    SPDLOG_CRITICAL("{}", s.ToString());
    server->Shutdown();
    fast.Stop();
    return 1;
  }
  // The operator socket: a second server whose callers have every right;
  // the kernel decides who reaches it (mode 0600, or 0660 in
  // --admin_group).
  std::string admin_socket = absl::GetFlag(FLAGS_admin_socket);
  if (admin_socket.empty()) admin_socket = socket + ".admin";
  if (admin_socket == "none") admin_socket.clear();
  TierService admin_service(&core, fast_socket, /*operator_socket=*/true);
  std::unique_ptr<grpc::Server> admin_server;
  if (!admin_socket.empty()) {
    gid_t admin_group = static_cast<gid_t>(-1);
    if (const std::string g = absl::GetFlag(FLAGS_admin_group); !g.empty()) {
      auto gid = ResolveGroup(g, "--admin_group");
      if (!gid.ok()) {
        SPDLOG_CRITICAL("{}", gid.status().ToString());
        server->Shutdown();
        fast.Stop();
        return 2;
      }
      admin_group = *gid;
    }
    absl::StatusOr<StagedSocket> admin_staged =
        PrepareSocket(admin_socket, admin_group, "--admin_socket");
    absl::Status prepared = admin_staged.status();
    if (prepared.ok()) {
      grpc::ServerBuilder admin_builder;
      admin_builder.AddListeningPort("unix:" + admin_staged->bind_path(),
                                     grpc::InsecureServerCredentials());
      admin_builder.RegisterService(&admin_service);
      admin_server = admin_builder.BuildAndStart();
      if (admin_server == nullptr) {
        prepared = absl::FailedPreconditionError(
            absl::StrCat("cannot listen on unix:", admin_socket));
      }
    }
    if (prepared.ok()) {
      prepared = admin_staged->Publish(
          admin_group, admin_group != static_cast<gid_t>(-1) ? 0660 : 0600);
    }
    if (!prepared.ok()) {
      SPDLOG_CRITICAL("{}", prepared.ToString());
      if (admin_server) admin_server->Shutdown();
      server->Shutdown();
      fast.Stop();
      return 1;
    }
  }
  server->GetHealthCheckService()->SetServingStatus(true);
  SPDLOG_INFO("kvtierd {} serving on unix:{}{}", KVTIER_VERSION, socket,
              admin_socket.empty()
                  ? ""
                  : absl::StrCat(", operators on unix:", admin_socket));
  // Banks and index are ready and the socket accepts: tell systemd. The
  // watchdog pings while the core answers Stats (its locks are not stuck).
  notifier.Ready(
      absl::StrCat("serving on unix:", socket, ", ", metrics_status));
  const absl::Duration watchdog = notifier.StartWatchdog([&core] {
    v1::StatsResponse stats;
    return core.Stats(v1::StatsRequest(), &stats).ok();
  });
  if (watchdog > absl::ZeroDuration()) {
    SPDLOG_INFO("systemd watchdog: pinging every {}",
                absl::FormatDuration(watchdog / 2));
  }

  std::thread waiter([&] {
    int sig = 0;
    sigwait(&stop_signals, &sig);
    SPDLOG_INFO("signal {}: stopping (segments are kept)", sig);
    // Drain: health says NOT_SERVING at once, then in-flight calls get the
    // Shutdown deadline and open Session streams end, which tells every
    // engine to reconnect; the segments stay for the next daemon.
    notifier.Stopping("draining: segments are kept");
    server->GetHealthCheckService()->SetServingStatus(false);
    service.DrainSessions();
    fast.DrainSessions();
    gate.Stop();  // No new connection for a server shutting down.
    if (admin_server) {
      admin_server->Shutdown(std::chrono::system_clock::now() +
                             std::chrono::seconds(2));
    }
    server->Shutdown(std::chrono::system_clock::now() +
                     std::chrono::seconds(2));
  });
  server->Wait();
  waiter.join();
  fast.Stop();
  notifier.StopWatchdog();
  SetLatencySink(nullptr);
  metrics.Stop();
  ::unlink(socket.c_str());
  if (!admin_socket.empty()) ::unlink(admin_socket.c_str());
  SPDLOG_INFO("kvtierd stopped");
  return 0;
}

}  // namespace
}  // namespace kvtier::daemon

int main(int argc, char** argv) { return kvtier::daemon::Main(argc, argv); }
