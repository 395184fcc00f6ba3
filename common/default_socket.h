// Where kvtierd listens and where clients look for it.
//
// The daemon listens on --socket; by default under $XDG_RUNTIME_DIR/kvtier/
// (a developer's daemon) or /tmp/kvtier-<uid>/. The systemd unit passes
// /run/kvtier/kvtierd.sock. Clients (libkvtier, kvtierctl) take, in order:
// an explicit path, $KVTIER_SOCKET, /run/kvtier/kvtierd.sock if it exists,
// then the daemon's default.
//
// Thread-safety: reads the environment; call before starting threads that
// change it.
#ifndef KVTIER_COMMON_DEFAULT_SOCKET_H_
#define KVTIER_COMMON_DEFAULT_SOCKET_H_

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

namespace kvtier {

inline constexpr char kSystemSocket[] = "/run/kvtier/kvtierd.sock";

// Returns the daemon's default socket path for this user.
inline std::string DefaultDaemonSocket() {
  const char* xdg = std::getenv("XDG_RUNTIME_DIR");
  if (xdg != nullptr && xdg[0] == '/') {
    return std::string(xdg) + "/kvtier/kvtierd.sock";
  }
  return "/tmp/kvtier-" + std::to_string(getuid()) + "/kvtierd.sock";
}

// Returns the socket a client should connect to when given `explicit_path`
// (empty: not given).
inline std::string ResolveClientSocket(const std::string& explicit_path) {
  if (!explicit_path.empty()) return explicit_path;
  const char* env = std::getenv("KVTIER_SOCKET");
  if (env != nullptr && env[0] != '\0') return env;
  struct stat st;
  if (::stat(kSystemSocket, &st) == 0 && S_ISSOCK(st.st_mode)) {
    return kSystemSocket;
  }
  return DefaultDaemonSocket();
}

}  // namespace kvtier

#endif  // KVTIER_COMMON_DEFAULT_SOCKET_H_
