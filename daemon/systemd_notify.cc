// SystemdNotifier: sd_notify readiness, status and watchdog.
#include "daemon/systemd_notify.h"

#include <systemd/sd-daemon.h>

#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace kvtier::daemon {
namespace {

// A status line may not contain a newline: it would start another field.
std::string OneLine(std::string s) {
  for (char& c : s) {
    if (c == '\n') c = ' ';
  }
  return s;
}

}  // namespace

SystemdNotifier::~SystemdNotifier() { StopWatchdog(); }

bool SystemdNotifier::Enabled() {
  const char* socket = std::getenv("NOTIFY_SOCKET");
  return socket != nullptr && socket[0] != '\0';
}

void SystemdNotifier::Send(const std::string& message) {
  if (!Enabled()) return;
  const int r = sd_notify(/*unset_environment=*/0, message.c_str());
  if (r < 0) {
    SPDLOG_WARN("sd_notify({}): {}", message, std::strerror(-r));
  }
}

void SystemdNotifier::Ready(const std::string& status) {
  Send(absl::StrCat("READY=1\nSTATUS=", OneLine(status)));
}

void SystemdNotifier::Status(const std::string& status) {
  Send(absl::StrCat("STATUS=", OneLine(status)));
}

void SystemdNotifier::Stopping(const std::string& status) {
  Send(absl::StrCat("STOPPING=1\nSTATUS=", OneLine(status)));
}

absl::Duration SystemdNotifier::StartWatchdog(std::function<bool()> healthy) {
  uint64_t usec = 0;
  if (!Enabled() || sd_watchdog_enabled(/*unset_environment=*/0, &usec) <= 0 ||
      usec == 0) {
    return absl::ZeroDuration();
  }
  const absl::Duration period = absl::Microseconds(usec);
  watchdog_ = std::thread([this, period, healthy = std::move(healthy)] {
    bool was_healthy = true;
    do {
      const bool ok = healthy();
      if (ok) Send("WATCHDOG=1");
      if (ok != was_healthy) {
        if (ok) {
          SPDLOG_INFO("watchdog: healthy again");
        } else {
          SPDLOG_ERROR("watchdog: health probe failed; not pinging");
        }
        was_healthy = ok;
      }
    } while (!stop_.WaitForNotificationWithTimeout(period / 2));
  });
  return period;
}

void SystemdNotifier::StopWatchdog() {
  if (!watchdog_.joinable()) return;
  if (!stop_.HasBeenNotified()) stop_.Notify();
  watchdog_.join();
}

}  // namespace kvtier::daemon
