// kvtierd: the per-node daemon. Parses flags (absl; --flagfile works),
// creates the TierCore, serves TierService, grpc.health.v1.Health and server
// reflection on a unix socket, and stops cleanly on SIGTERM/SIGINT, keeping
// the segments so a restarted daemon finds them.
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

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/default_socket.h"
#include "daemon/fast_lookup_server.h"
#include "daemon/tier_core.h"
#include "daemon/tier_service.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(std::string, socket, "",
          "Unix socket to listen on (default: $XDG_RUNTIME_DIR/kvtier/"
          "kvtierd.sock, else /tmp/kvtier-<uid>/kvtierd.sock)");
ABSL_FLAG(std::string, shm_dir, "/dev/shm", "Folder for 4 KiB-page banks");
ABSL_FLAG(std::string, hugetlbfs_dir, "",
          "hugetlbfs mount for 2 MiB-page banks (empty: detect one)");
ABSL_FLAG(std::string, huge_pages, "auto",
          "auto: huge pages where reserved, else shm_dir; off; require");
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
ABSL_FLAG(bool, fast_lookup, true,
          "Serve the fast lookup path on <socket>.lookup beside gRPC");
ABSL_FLAG(std::string, log_level, "info", "trace|debug|info|warn|error");

namespace kvtier::daemon {
namespace {

absl::Status PrepareSocket(const std::string& path) {
  if (path.size() >= sizeof(sockaddr_un::sun_path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--socket: path longer than ",
                     sizeof(sockaddr_un::sun_path) - 1, " bytes"));
  }
  std::error_code ec;
  const std::filesystem::path dir = std::filesystem::path(path).parent_path();
  if (!dir.empty() && !std::filesystem::exists(dir, ec)) {
    std::filesystem::create_directories(dir, ec);
    if (ec) {
      return absl::FailedPreconditionError(absl::StrCat(
          "--socket: cannot create ", dir.string(), ": ", ec.message()));
    }
    ::chmod(dir.c_str(), 0770);
  }
  // A socket file left by a daemon that died is removed; a live daemon's
  // socket would make bind fail, which gRPC reports.
  struct stat st;
  if (::lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return absl::FailedPreconditionError(
          absl::StrCat("--socket: ", path, " exists and is not a socket"));
    }
    ::unlink(path.c_str());
  }
  return absl::OkStatus();
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
  spdlog::set_level(spdlog::level::from_str(absl::GetFlag(FLAGS_log_level)));
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ %v");

  // Block the stop signals in every thread; one thread waits for them.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  TierOptions options;
  options.segments.shm_dir = absl::GetFlag(FLAGS_shm_dir);
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
  options.segment_prefix = absl::GetFlag(FLAGS_segment_prefix);
  options.default_namespace_bytes = absl::GetFlag(FLAGS_default_namespace_bytes);
  options.namespace_budget_bytes = absl::GetFlag(FLAGS_namespace_budget_bytes);
  options.default_max_replay_tokens =
      absl::GetFlag(FLAGS_default_max_replay_tokens);
  options.max_namespaces = absl::GetFlag(FLAGS_max_namespaces);

  TierCore core(options);
  if (const std::string demo = absl::GetFlag(FLAGS_demo_namespace);
      !demo.empty()) {
    if (absl::Status s = core.CreateNamespace(demo, DemoLayout(), {});
        !s.ok()) {
      SPDLOG_CRITICAL("--demo_namespace: {}", s.ToString());
      return 1;
    }
  }

  std::string socket = absl::GetFlag(FLAGS_socket);
  if (socket.empty()) socket = DefaultDaemonSocket();
  if (absl::Status s = PrepareSocket(socket); !s.ok()) {
    SPDLOG_CRITICAL("{}", s.ToString());
    return 1;
  }

  FastLookupServer fast(&core);
  std::string fast_socket;
  if (absl::GetFlag(FLAGS_fast_lookup)) {
    fast_socket = socket + ".lookup";
    if (absl::Status s = fast.Start(fast_socket); !s.ok()) {
      SPDLOG_CRITICAL("{}", s.ToString());
      return 1;
    }
  }
  TierService service(&core, fast_socket);
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.AddListeningPort("unix:" + socket, grpc::InsecureServerCredentials());
  builder.RegisterService(&service);
  builder.SetMaxReceiveMessageSize(64 << 20);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr) {
    SPDLOG_CRITICAL("cannot listen on unix:{} (another daemon running?)",
                    socket);
    return 1;
  }
  ::chmod(socket.c_str(), 0660);
  server->GetHealthCheckService()->SetServingStatus(true);
  SPDLOG_INFO("kvtierd {} serving on unix:{}", KVTIER_VERSION, socket);

  std::thread waiter([&] {
    int sig = 0;
    sigwait(&stop_signals, &sig);
    SPDLOG_INFO("signal {}: stopping (segments are kept)", sig);
    server->GetHealthCheckService()->SetServingStatus(false);
    server->Shutdown(std::chrono::system_clock::now() +
                     std::chrono::seconds(2));
  });
  server->Wait();
  waiter.join();
  fast.Stop();
  ::unlink(socket.c_str());
  SPDLOG_INFO("kvtierd stopped");
  return 0;
}

}  // namespace
}  // namespace kvtier::daemon

int main(int argc, char** argv) { return kvtier::daemon::Main(argc, argv); }
