// Helpers for tests that scrape kvtierd's Prometheus endpoint without curl: a
// minimal HTTP/1.0 GET over loopback TCP, a free loopback port, and a parser
// of the text exposition format's samples.
//
// Thread-safety: pure functions (one socket per call).
#ifndef KVTIER_TESTS_METRICS_SCRAPE_H_
#define KVTIER_TESTS_METRICS_SCRAPE_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace kvtier::testing {

// Returns the body of GET `path` from 127.0.0.1:`port`; UNAVAILABLE when it
// cannot connect, INTERNAL for an answer that is not "200 OK". Each socket
// operation gives up after 10 s.
inline absl::StatusOr<std::string> HttpGet(int port, const std::string& path) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(strerror(errno));
  timeval tv{10, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    const int err = errno;
    ::close(fd);
    return absl::UnavailableError(
        absl::StrCat("connect 127.0.0.1:", port, ": ", strerror(err)));
  }
  const std::string request =
      absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
  if (::send(fd, request.data(), request.size(), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(request.size())) {
    ::close(fd);
    return absl::InternalError("send failed");
  }
  std::string response;
  char buf[16384];
  for (;;) {
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    response.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  const size_t body = response.find("\r\n\r\n");
  if (response.compare(0, 9, "HTTP/1.0 ") != 0 &&
      response.compare(0, 9, "HTTP/1.1 ") != 0) {
    return absl::InternalError(absl::StrCat("not HTTP: ", response));
  }
  if (response.compare(9, 3, "200") != 0 || body == std::string::npos) {
    return absl::InternalError(
        absl::StrCat("answer: ", response.substr(0, response.find('\r'))));
  }
  return response.substr(body + 4);
}

// Returns a TCP port on 127.0.0.1 that was free a moment ago (bound to port
// 0 and released), or 0.
inline int FreeLoopbackPort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  ::close(fd);
  return port;
}

// Returns the samples of a text exposition: "name{labels}" (as written,
// labels in the exporter's order) -> value. Comment lines are skipped.
inline std::map<std::string, double> ParseMetrics(const std::string& text) {
  std::map<std::string, double> out;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (line.empty() || line[0] == '#') continue;
    const size_t space = line.rfind(' ');
    if (space == absl::string_view::npos) continue;
    double v = 0;
    absl::string_view value = line.substr(space + 1);
    if (value == "+Inf") {
      v = HUGE_VAL;
    } else if (!absl::SimpleAtod(value, &v)) {
      continue;
    }
    out[std::string(line.substr(0, space))] = v;
  }
  return out;
}

}  // namespace kvtier::testing

#endif  // KVTIER_TESTS_METRICS_SCRAPE_H_
