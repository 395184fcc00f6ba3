// SystemdNotifier: kvtierd's side of systemd's service protocol (Type=notify):
// READY=1 once the daemon serves, STATUS= lines for `systemctl status`,
// STOPPING=1 when it drains, and WATCHDOG=1 pings at half of WATCHDOG_USEC
// for WatchdogSec=. Messages go through libsystemd's sd_notify to
// $NOTIFY_SOCKET; without it (a daemon started by hand or by a test) every
// call is a no-op.
//
// The watchdog pings only while a health probe answers: the probe takes the
// core's locks, so a deadlocked core stops the pings and systemd restarts the
// daemon (its segments survive).
//
// Thread-safety: Ready, Status and Stopping are thread-safe. StartWatchdog
// and StopWatchdog are called from one thread.
#ifndef KVTIER_DAEMON_SYSTEMD_NOTIFY_H_
#define KVTIER_DAEMON_SYSTEMD_NOTIFY_H_

#include <functional>
#include <string>
#include <thread>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace kvtier::daemon {

class SystemdNotifier {
 public:
  SystemdNotifier() = default;
  ~SystemdNotifier();  // Stops the watchdog.
  SystemdNotifier(const SystemdNotifier&) = delete;
  SystemdNotifier& operator=(const SystemdNotifier&) = delete;

  // True when $NOTIFY_SOCKET names a socket to notify.
  static bool Enabled();

  // Tells the service manager the daemon is ready, with a status line.
  void Ready(const std::string& status);
  // Updates the status line.
  void Status(const std::string& status);
  // Tells the service manager the daemon is stopping, with a status line.
  void Stopping(const std::string& status);

  // When the service manager asked for a watchdog (WATCHDOG_USEC, and
  // WATCHDOG_PID is unset or this process), starts a thread that sends
  // WATCHDOG=1 every half of that period while `healthy` returns true, and
  // returns the period; otherwise returns absl::ZeroDuration() and starts
  // nothing. `healthy` runs on that thread. REQUIRES: not started.
  absl::Duration StartWatchdog(std::function<bool()> healthy);
  // Stops the watchdog thread. Idempotent.
  void StopWatchdog();

 private:
  static void Send(const std::string& message);

  std::thread watchdog_;
  absl::Notification stop_;
};

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_SYSTEMD_NOTIFY_H_
