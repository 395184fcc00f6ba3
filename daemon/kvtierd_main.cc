// kvtierd: the per-node daemon. Parses flags (absl; --flagfile works; every
// flag is in daemon/daemon_flags.cc), starts the Daemon (daemon/daemon.h:
// the TierCore, TierService, grpc.health.v1.Health and server reflection on
// a unix socket, Prometheus metrics on a loopback port, systemd's
// readiness and watchdog) and drains it cleanly on SIGTERM/SIGINT, keeping
// the segments so a restarted daemon finds them. Exits 2 for a bad
// setting, 1 when the daemon cannot start.
#include <signal.h>

#include <string>
#include <thread>

#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "daemon/daemon.h"
#include "daemon/daemon_options.h"
#include "daemon/server_limits.h"
#include "spdlog/sinks/stdout_color_sinks.h"
#include "spdlog/spdlog.h"

namespace kvtier::daemon {
namespace {

int Main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "kvtierd: per-node host-memory tier for LLM KV caches");
  absl::ParseCommandLine(argc, argv);
  // Every flag, refused by name before anything starts.
  absl::StatusOr<DaemonOptions> options = DaemonOptionsFromFlags();
  // Logs go to stderr (journald takes both streams; stdout stays clean).
  spdlog::set_default_logger(spdlog::stderr_color_mt("kvtierd"));
  spdlog::set_level(spdlog::level::from_str(
      options.ok() ? options->log_level : std::string("info")));
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ %v");
  if (!options.ok()) {
    SPDLOG_CRITICAL("{}", options.status().ToString());
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

  absl::StatusOr<std::unique_ptr<Daemon>> daemon = Daemon::Start(*options);
  if (!daemon.ok()) {
    // Code and message; not the payload that marks a configuration error.
    SPDLOG_CRITICAL("{}: {}", absl::StatusCodeToString(daemon.status().code()),
                    std::string(daemon.status().message()));
    return Daemon::IsConfigurationError(daemon.status()) ? 2 : 1;
  }
  std::thread waiter([&] {
    int sig = 0;
    sigwait(&stop_signals, &sig);
    SPDLOG_INFO("signal {}: stopping (segments are kept)", sig);
    (*daemon)->Drain();
  });
  (*daemon)->Serve();
  waiter.join();
  daemon->reset();
  return 0;
}

}  // namespace
}  // namespace kvtier::daemon

int main(int argc, char** argv) { return kvtier::daemon::Main(argc, argv); }
