// Test helpers for the engine socket's tests (fast_lookup_server_test,
// engine_protocol_test): a client connection with bounded reads and writes,
// and how to tell that the server closed it.
//
// Thread-safety: stateless functions.
#ifndef KVTIER_DAEMON_ENGINE_SOCKET_TEST_UTIL_H_
#define KVTIER_DAEMON_ENGINE_SOCKET_TEST_UTIL_H_

#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

namespace kvtier::daemon::testing {

// Connects to `path`; -1 on failure. Reads and writes give up after 30 s,
// so a test whose server never answers fails instead of hanging.
inline int Connect(const std::string& path) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  const timeval tv{30, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// True when the server closed `fd` (read returns EOF or ECONNRESET) within
// 30 s; false when it is still open then or data arrived.
inline bool WaitClosed(int fd) {
  char c;
  const ssize_t r = ::recv(fd, &c, 1, 0);
  return r == 0 || (r < 0 && errno == ECONNRESET);
}

}  // namespace kvtier::daemon::testing

#endif  // KVTIER_DAEMON_ENGINE_SOCKET_TEST_UTIL_H_
