// Daemon (daemon/daemon.h): kvtierd's parts started in dependency order,
// served, drained.
//
// Thread-safety: as daemon.h says.
#include "daemon/daemon.h"

#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "daemon/cluster_tier.h"
#include "daemon/cluster_value.h"
#include "daemon/device_pool.h"
#include "daemon/fast_lookup_server.h"
#include "daemon/grpc_gate.h"
#include "daemon/kv_events.h"
#include "daemon/metrics.h"
#include "daemon/socket_staging.h"
#include "daemon/systemd_notify.h"
#include "daemon/tier_core.h"
#include "daemon/tier_service.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "shm/trusted_path.h"
#include "spdlog/spdlog.h"

namespace kvtier::daemon {
namespace {

// The payload that marks a configuration error of Start (exit 2).
constexpr char kConfigurationPayload[] = "kvtier.daemon/configuration";

absl::Status Configuration(absl::Status s) {
  if (!s.ok()) s.SetPayload(kConfigurationPayload, absl::Cord("1"));
  return s;
}

// `s` with its message after `prefix` (the flag or step it came from).
absl::Status Prefixed(absl::string_view prefix, const absl::Status& s) {
  return absl::Status(s.code(), absl::StrCat(prefix, s.message()));
}

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

}  // namespace

bool Daemon::IsConfigurationError(const absl::Status& status) {
  return status.GetPayload(kConfigurationPayload).has_value();
}

Daemon::Daemon(const DaemonOptions& options) : options_(options) {}

absl::StatusOr<std::unique_ptr<Daemon>> Daemon::Start(
    const DaemonOptions& options) {
  std::unique_ptr<Daemon> d(new Daemon(options));
  if (absl::Status s = d->StartAttachments(); !s.ok()) return s;
  if (absl::Status s = d->StartCore(); !s.ok()) return s;
  if (absl::Status s = d->StartMetrics(); !s.ok()) return s;
  if (absl::Status s = d->StartSockets(); !s.ok()) return s;
  d->NotifyReady();
  return d;
}

Daemon::~Daemon() {
  // Whatever Serve did not stop (a Start that failed half way).
  if (admin_server_) admin_server_->Shutdown();
  if (gate_) gate_->Stop();
  if (server_) server_->Shutdown();
  if (fast_) fast_->Stop();
  if (notifier_) notifier_->StopWatchdog();
  // The latency hook goes before the metrics it feeds.
  SetLatencySink(nullptr);
  if (metrics_) metrics_->Stop();
  if (served_) {
    ::unlink(options_.socket.c_str());
    if (!options_.admin_socket.empty()) {
      ::unlink(options_.admin_socket.c_str());
    }
    SPDLOG_INFO("kvtierd stopped");
  }
}

absl::Status Daemon::StartAttachments() {
  TierOptions& tier = options_.tier;
  // Banks live only in a folder nobody but the daemon can write, so nobody
  // can pre-create a namespace's banks (shm/trusted_path.h). Engines of
  // --group enter it to map them.
  const std::string& dir = tier.segments.shm_dir;
  struct stat before;
  const bool existed = ::lstat(dir.c_str(), &before) == 0;
  if (absl::Status s = shm::EnsureTrustedDir(dir, 0750, "--shm_dir"); !s.ok()) {
    return Configuration(s);
  }
  if (!existed && options_.group != static_cast<gid_t>(-1) &&
      ::chown(dir.c_str(), static_cast<uid_t>(-1), options_.group) != 0) {
    return Configuration(absl::FailedPreconditionError(
        absl::StrCat("--shm_dir: cannot give ", dir, " to group ",
                     options_.group, ": ", strerror(errno))));
  }
  // The device pools: the only place the daemon touches CUDA, and only when
  // asked (daemon/device_pool.h).
  if (options_.device_pool.bytes_per_gpu > 0) {
    auto pool = DevicePool::Create(options_.device_pool);
    if (!pool.ok()) {
      return Configuration(Prefixed("--device_pool_bytes: ", pool.status()));
    }
    device_pool_ = *std::move(pool);
    for (const DevicePoolExport& e : device_pool_->exports()) {
      SPDLOG_INFO("device pool on GPU {} ({}): {} snapshot slots of {} bytes",
                  e.device_ordinal, e.pci_bus_id, e.rows, e.row_bytes);
    }
    tier.device_pools = device_pool_->exports();
  }
  // KV events (daemon/kv_events.h).
  if (!options_.kv_events.endpoint.empty()) {
    auto pub = KvEventPublisher::Start(options_.kv_events);
    if (!pub.ok()) {
      return Configuration(Prefixed("--kv_events_endpoint: ", pub.status()));
    }
    kv_events_ = *std::move(pub);
    SPDLOG_INFO("KV events on {}{}{}", kv_events_->endpoint(),
                kv_events_->replay_endpoint().empty() ? "" : ", replay on ",
                kv_events_->replay_endpoint());
    tier.kv_events = kv_events_.get();
  }
  // The cluster tier (docs/cluster.md).
  if (options_.cluster.has_value()) {
    auto key = ClusterKey::ReadFile(options_.cluster_key_file);
    if (!key.ok()) return Configuration(key.status());
    ClusterTierOptions o = *options_.cluster;
    o.kv_events = kv_events_.get();
    auto cluster = ClusterTier::Create(std::move(o), *std::move(key));
    if (!cluster.ok()) return Configuration(cluster.status());
    cluster_ = *std::move(cluster);
    tier.cluster = cluster_.get();
  }
  return absl::OkStatus();
}

absl::Status Daemon::StartCore() {
  core_ = std::make_unique<TierCore>(options_.tier);
  // Before anything is served: namespaces and indexes from the journals.
  auto report = core_->Recover();
  if (!report.ok()) return report.status();
  if (!options_.tier.state_dir.empty()) {
    SPDLOG_INFO(
        "recovered {} namespaces ({} emptied: segments recreated), "
        "{} pages, from {} journal bytes in {} ({} torn, {} "
        "unreadable, {} corrupt; {} namespaces unrecoverable) in {}",
        report->namespaces, report->namespaces_emptied, report->pages,
        report->journal_bytes, options_.tier.state_dir, report->journals_torn,
        report->journals_unreadable, report->journals_corrupt,
        report->namespaces_unrecoverable,
        absl::FormatDuration(report->elapsed));
  }
  core_->StartFenceSweeper(options_.fence_sweep);
  if (!options_.demo_namespace.empty()) {
    if (absl::Status s =
            core_->CreateNamespace(options_.demo_namespace, DemoLayout(), {});
        !s.ok()) {
      return Prefixed("--demo_namespace: ", s);
    }
  }
  return absl::OkStatus();
}

absl::Status Daemon::StartMetrics() {
  // Metrics read the core at scrape time; the hook times requests. They are
  // auxiliary: a taken port is logged and the tier serves without them.
  metrics_ = std::make_unique<MetricsExporter>(core_.get());
  const std::string& address = options_.metrics_address;
  if (address.empty()) return absl::OkStatus();
  if (absl::Status s = metrics_->Start(address); s.ok()) {
    SetLatencySink(metrics_.get());
    metrics_status_ = absl::StrCat("metrics on http://",
                                   address.substr(0, address.rfind(':')), ":",
                                   metrics_->port(), "/metrics");
    SPDLOG_INFO("{}", metrics_status_);
  } else if (absl::IsInvalidArgument(s)) {
    return Configuration(s);
  } else {
    metrics_status_ = "metrics unavailable";
    SPDLOG_ERROR("{}; serving without metrics", s.ToString());
  }
  return absl::OkStatus();
}

absl::Status Daemon::StartSockets() {
  notifier_ = std::make_unique<SystemdNotifier>();
  const std::string& socket = options_.socket;
  const gid_t group = options_.group;
  // Each gRPC socket is bound out of reach and appears at its path only
  // with its group and mode set (daemon/socket_staging.h).
  absl::StatusOr<StagedSocket> staged =
      PrepareSocket(socket, group, "--socket");
  if (!staged.ok()) return staged.status();
  // The engine socket: libkvtier's sessions and calls (common/fast_lookup.h).
  const std::string fast_socket = socket + ".lookup";
  fast_ = std::make_unique<FastLookupServer>(core_.get(),
                                             options_.limits.fast_lookup);
  if (absl::Status s = fast_->Start(fast_socket, group); !s.ok()) return s;
  service_ = std::make_unique<TierService>(core_.get(), fast_socket);
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.RegisterService(service_.get());
  ApplyServerLimits(&builder, options_.limits);
  server_ = builder.BuildAndStart();
  if (server_ == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("cannot start the gRPC server for unix:", socket));
  }
  // The server has no listener of its own: its connections come through the
  // gate, which caps them per uid (daemon/grpc_gate.h).
  gate_ = std::make_unique<GrpcGate>(server_.get(), options_.limits.gate);
  if (absl::Status s = gate_->Start(staged->bind_path()); !s.ok()) {
    return absl::Status(
        s.code(), absl::StrCat(s.message(), " (another daemon running?)"));
  }
  if (absl::Status s = staged->Publish(group, 0660); !s.ok()) return s;
  return StartOperatorSocket();
}

absl::Status Daemon::StartOperatorSocket() {
  // A second server whose callers have every right; the kernel decides who
  // reaches it (mode 0600, or 0660 in --admin_group).
  const std::string& path = options_.admin_socket;
  if (path.empty()) return absl::OkStatus();
  const gid_t group = options_.admin_group;
  admin_service_ = std::make_unique<TierService>(
      core_.get(), options_.socket + ".lookup", /*operator_socket=*/true);
  absl::StatusOr<StagedSocket> staged =
      PrepareSocket(path, group, "--admin_socket");
  if (!staged.ok()) return staged.status();
  grpc::ServerBuilder builder;
  builder.AddListeningPort("unix:" + staged->bind_path(),
                           grpc::InsecureServerCredentials());
  builder.RegisterService(admin_service_.get());
  admin_server_ = builder.BuildAndStart();
  if (admin_server_ == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot listen on unix:", path));
  }
  return staged->Publish(group, group != static_cast<gid_t>(-1) ? 0660 : 0600);
}

void Daemon::NotifyReady() {
  server_->GetHealthCheckService()->SetServingStatus(true);
  const std::string& socket = options_.socket;
  SPDLOG_INFO(
      "kvtierd {} serving on unix:{}{}", KVTIER_VERSION, socket,
      options_.admin_socket.empty()
          ? ""
          : absl::StrCat(", operators on unix:", options_.admin_socket));
  // Banks and index are ready and the socket accepts: tell systemd. The
  // watchdog pings while the core answers Stats (its locks are not stuck).
  notifier_->Ready(
      absl::StrCat("serving on unix:", socket, ", ", metrics_status_));
  TierCore* core = core_.get();
  const absl::Duration watchdog = notifier_->StartWatchdog([core] {
    v1::StatsResponse stats;
    return core->Stats(v1::StatsRequest(), &stats).ok();
  });
  if (watchdog > absl::ZeroDuration()) {
    SPDLOG_INFO("systemd watchdog: pinging every {}",
                absl::FormatDuration(watchdog / 2));
  }
}

void Daemon::Drain() {
  notifier_->Stopping("draining: segments are kept");
  server_->GetHealthCheckService()->SetServingStatus(false);
  service_->DrainSessions();
  fast_->DrainSessions();
  gate_->Stop();  // No new connection for a server shutting down.
  if (admin_server_) {
    admin_server_->Shutdown(std::chrono::system_clock::now() +
                            std::chrono::seconds(2));
  }
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
}

void Daemon::Serve() {
  server_->Wait();
  served_ = true;
}

}  // namespace kvtier::daemon
