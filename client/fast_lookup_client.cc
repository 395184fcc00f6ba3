// FastLookupClient (client/fast_lookup_client.h): dialling with the Hello,
// and one framed lookup at a time.
#include "client/fast_lookup_client.h"

#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/error_reason.h"

namespace kvtier::client {
void FastLookupClient::Connect(const std::string& path, uint64_t session_id,
                               absl::Duration timeout, bool keep) {
  std::string why;
  const int fd = Dial(path, session_id, timeout, &why);
  absl::MutexLock lock(&mu_);
  error_ = why;
  if (fd < 0) {
    if (keep && !path.empty()) LogFallback(why);
    return;
  }
  if (!keep) {
    ::close(fd);
    return;
  }
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

int FastLookupClient::Dial(const std::string& path, uint64_t session_id,
                           absl::Duration timeout, std::string* why) {
  if (path.empty()) {
    *why = "the daemon offers no fast lookup socket";
    return -1;
  }
  if (path.size() >= sizeof(sockaddr_un::sun_path)) {
    *why = absl::StrCat(path, ": path too long");
    return -1;
  }
  const absl::Time deadline =
      absl::Now() + std::max(timeout, absl::Milliseconds(1));
  absl::Duration backoff = absl::Milliseconds(5);
  for (int attempt = 1;; ++attempt) {
    bool retry = false;
    const int fd = DialOnce(path, session_id, timeout, deadline, why, &retry);
    if (fd >= 0) return fd;
    if (!retry || absl::Now() + backoff >= deadline) {
      *why = absl::StrCat(path, ": ", *why, " (", attempt, " attempts)");
      return -1;
    }
    absl::SleepFor(backoff);
    backoff = std::min(backoff * 2, absl::Milliseconds(200));
  }
}

int FastLookupClient::DialOnce(const std::string& path, uint64_t session_id,
                               absl::Duration timeout, absl::Time deadline,
                               std::string* why, bool* retry) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    *why = absl::StrCat("socket: ", std::strerror(errno));
    return -1;
  }
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  fastpath::Hello hello;
  hello.session_id = session_id;
  iovec iov{&hello, sizeof(hello)};
  fastpath::HelloReply reply;
  // The deadline bounds connect (a full backlog), the Hello and its reply;
  // later the per-RPC timeout bounds each read and write of a lookup: a
  // stalled daemon fails the fast lookup (the caller falls back to gRPC,
  // which has the same deadline) instead of blocking the engine.
  const timeval first =
      absl::ToTimeval(std::max(deadline - absl::Now(), absl::Milliseconds(1)));
  const timeval later =
      absl::ToTimeval(std::max(timeout, absl::Milliseconds(1)));
  const char* step = "connect";
  bool ok =
      ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &first, sizeof(first)) == 0 &&
      ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &first, sizeof(first)) == 0 &&
      ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  const bool connected = ok;
  if (ok) {
    step = "sending the Hello";
    ok = fastpath::WriteFullV(fd, &iov, 1);
  }
  if (ok) {
    step = "reading the Hello's reply";
    errno = 0;
    ok = fastpath::ReadFull(fd, &reply, sizeof(reply));
  }
  if (!ok) {
    const int err = errno;
    ::close(fd);
    // EOF, a reset or a broken pipe after connecting: the daemon closed the
    // connection (a flood made room); a timeout uses up the deadline.
    *retry = connected && (err == 0 || err == ECONNRESET || err == EPIPE);
    *why = absl::StrCat(step, ": ",
                        err == 0 ? "connection closed by kvtierd"
                        : err == EAGAIN || err == EWOULDBLOCK
                            ? "no answer before the deadline"
                            : std::strerror(err));
    return -1;
  }
  if (reply.magic != fastpath::kReplyMagic || reply.code != 0) {
    ::close(fd);
    const auto code = static_cast<absl::StatusCode>(reply.code);
    *why =
        reply.magic != fastpath::kReplyMagic
            ? std::string("malformed Hello reply")
        : code == absl::StatusCode::kResourceExhausted
            ? std::string(
                  "kvtierd serves as many fast lookup "
                  "connections as it may (RESOURCE_EXHAUSTED)")
            : absl::StrCat("Hello refused: ", absl::StatusCodeToString(code));
    return -1;
  }
  if (::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &later, sizeof(later)) != 0 ||
      ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &later, sizeof(later)) != 0) {
    ::close(fd);
    *why = absl::StrCat("setsockopt: ", std::strerror(errno));
    return -1;
  }
  return fd;
}

bool FastLookupClient::Lookup(uint64_t namespace_id, std::string_view hashes,
                              bool pin, absl::Status* status,
                              fastpath::Reply* reply,
                              std::vector<uint32_t>* rows) {
  absl::MutexLock lock(&mu_);
  if (fd_ < 0) return false;
  if (hashes.size() > fastpath::kMaxRequestBytes) return false;
  fastpath::Request req;
  req.flags = pin ? fastpath::kFlagPin : 0;
  req.namespace_id = namespace_id;
  req.hash_bytes = static_cast<uint32_t>(hashes.size());
  iovec iov[2] = {{&req, sizeof(req)},
                  {const_cast<char*>(hashes.data()), hashes.size()}};
  errno = 0;
  bool ok = fastpath::WriteFullV(fd_, iov, 2) &&
            fastpath::ReadFull(fd_, reply, sizeof(*reply)) &&
            reply->magic == fastpath::kReplyMagic;
  if (ok && reply->code == 0) {
    rows->resize(reply->usable_pages);
    ok = fastpath::ReadFull(fd_, rows->data(), rows->size() * sizeof(uint32_t));
    *status = absl::OkStatus();
  } else if (ok) {
    std::string message(reply->message_bytes, '\0');
    ok = reply->message_bytes <= (1u << 20) &&
         fastpath::ReadFull(fd_, message.data(), message.size());
    *status = absl::Status(static_cast<absl::StatusCode>(reply->code),
                           absl::StrCat("Lookup: ", message));
    // An unknown number (a newer daemon's) reads as no reason.
    if (reply->reason <=
        static_cast<uint32_t>(ErrorReason::kDaemonUnreachable)) {
      *status = WithErrorReason(std::move(*status),
                                static_cast<ErrorReason>(reply->reason));
    }
  }
  if (!ok) {
    const int err = errno;
    ::close(fd_);
    fd_ = -1;
    error_ = err == EAGAIN || err == EWOULDBLOCK
                 ? "no answer within the per-RPC deadline"
             : err == 0 ? "connection closed by kvtierd"
                        : std::strerror(err);
    LogFallback(error_);
  }
  return ok;
}

void FastLookupClient::Close() {
  absl::MutexLock lock(&mu_);
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

bool FastLookupClient::active() const {
  absl::MutexLock lock(&mu_);
  return fd_ >= 0;
}

std::string FastLookupClient::last_error() const {
  absl::MutexLock lock(&mu_);
  return error_;
}

void FastLookupClient::LogFallback(const std::string& why) {
  if (!fallback_logged_.exchange(true)) {
    std::fprintf(stderr, "kvtier: fast lookup unavailable (%s), using gRPC\n",
                 why.c_str());
  }
}

}  // namespace kvtier::client
