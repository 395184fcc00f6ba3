// Raw clients of kvtierd's sockets for the connection-limit tests: a
// session opened with a bare Open frame, a call connection bound by a bare
// Hello, an HTTP/2 connection that says its preface and nothing more, and a
// bounded wait for the daemon to close a connection. Nothing here speaks
// gRPC, so a test process that forks may use it.
//
// Thread-safety: stateless functions; each fd belongs to its caller.
#ifndef KVTIER_TESTS_RAW_SOCKETS_H_
#define KVTIER_TESTS_RAW_SOCKETS_H_

#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>

#include "common/fast_lookup.h"
#include "kvtier/v1/tier.pb.h"

namespace kvtier::testing {

// A connection to unix socket `path`, or -1. The connect and each read and
// write give up after `timeout_s` seconds, so a daemon that never answers
// fails the test instead of hanging it.
inline int DialUnix(const std::string& path, int timeout_s = 5) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  const timeval tv{timeout_s, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Sends all of `bytes` without raising SIGPIPE; false when the connection
// broke.
inline bool SendAll(int fd, const void* bytes, size_t n) {
  const char* p = static_cast<const char*>(bytes);
  while (n > 0) {
    const ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

// A session opened on the engine socket with a bare Open frame.
struct RawSession {
  int fd = -1;  // The session connection: closing it ends the session.
  fastpath::OpenReply reply;
  std::string message;  // The refusal's message, when reply.code != 0.
  bool answered = false;
};

// Opens a session named `client_name` on engine socket `lookup` (socket
// timeouts as DialUnix). answered = false when the daemon closed the
// connection or sent no reply.
inline RawSession OpenRawSession(const std::string& lookup,
                                 const std::string& client_name,
                                 int timeout_s = 5) {
  RawSession s;
  s.fd = DialUnix(lookup, timeout_s);
  if (s.fd < 0) return s;
  v1::Hello hello;
  hello.set_client_name(client_name);
  const std::string body = hello.SerializeAsString();
  fastpath::Open open;
  open.hello_bytes = static_cast<uint32_t>(body.size());
  std::string frame(reinterpret_cast<const char*>(&open), sizeof(open));
  frame += body;
  if (!SendAll(s.fd, frame.data(), frame.size()) ||
      !fastpath::ReadFull(s.fd, &s.reply, sizeof(s.reply)) ||
      s.reply.magic != fastpath::kReplyMagic) {
    return s;
  }
  s.message.resize(s.reply.message_bytes);
  s.answered = fastpath::ReadFull(s.fd, s.message.data(), s.message.size());
  return s;
}

// A call connection on engine socket `lookup` bound to `session` by a bare
// Hello; -1 when the daemon refused it or did not answer.
inline int RawCallConnection(const std::string& lookup, uint64_t session) {
  const int fd = DialUnix(lookup);
  if (fd < 0) return -1;
  fastpath::Hello hello;
  hello.session_id = session;
  fastpath::HelloReply reply;
  if (!SendAll(fd, &hello, sizeof(hello)) ||
      !fastpath::ReadFull(fd, &reply, sizeof(reply)) ||
      reply.magic != fastpath::kReplyMagic || reply.code != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// The HTTP/2 client connection preface and an empty SETTINGS frame: what a
// gRPC client sends first, after which a server considers the connection
// open.
inline std::string Http2Preface() {
  std::string s = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
  s += std::string("\x00\x00\x00\x04\x00\x00\x00\x00\x00", 9);
  return s;
}

// An HTTP/2 connection to `socket` that has said its preface and will carry
// no call (socket timeouts as DialUnix); -1 when it could not be made.
inline int RawHttp2Connection(const std::string& socket, int timeout_s = 5) {
  const int fd = DialUnix(socket, timeout_s);
  if (fd < 0) return -1;
  const std::string preface = Http2Preface();
  if (!SendAll(fd, preface.data(), preface.size())) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// True when the peer has closed `fd` (EOF or a reset), reading and dropping
// whatever it sent before (an HTTP/2 server's SETTINGS and GOAWAY). Waits
// at most `wait_ms`.
inline bool PeerClosed(int fd, int wait_ms) {
  pollfd p{fd, POLLIN | POLLRDHUP, 0};
  if (::poll(&p, 1, wait_ms) <= 0) return false;
  char buf[4096];
  for (;;) {
    const ssize_t r = ::recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (r == 0) return true;
    if (r < 0) return errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
  }
}

// Polls `fd` up to `polls` times, 100 ms each, calling `each` (when set)
// before every poll; true as soon as the peer has closed `fd`, or `each`
// returns false (a send found it broken). A bound on the number of polls,
// so a connection the daemon never closes fails the test, never hangs it;
// no duration is asserted.
inline bool ClosedWithinPolls(int fd, int polls,
                              const std::function<bool()>& each = nullptr) {
  for (int i = 0; i < polls; ++i) {
    if (each && !each()) return true;
    if (PeerClosed(fd, 100)) return true;
  }
  return false;
}

}  // namespace kvtier::testing

#endif  // KVTIER_TESTS_RAW_SOCKETS_H_
