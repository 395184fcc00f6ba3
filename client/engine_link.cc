// EngineLink (client/engine_link.h): dialling the engine socket, the pool of
// call connections, and one lookup or call per connection at a time.
#include "client/engine_link.h"

#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string_view>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/error_reason.h"

namespace kvtier::client {
namespace {

using fastpath::ReadFull;
using fastpath::WriteFullV;

// One connect + first frame before `deadline`. On failure returns -1, sets
// *why and *retry (the socket is not there yet, or the daemon closed the
// connection before reading the frame).
int DialOnce(const std::string& path, const iovec* frame, int count,
             void* reply, size_t reply_bytes, absl::Time deadline,
             bool wait_for_daemon, std::string* why, bool* retry) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    *why = absl::StrCat("socket: ", std::strerror(errno));
    return -1;
  }
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  std::vector<iovec> iov(frame, frame + count);
  if (!SetSocketTimeouts(fd, deadline - absl::Now())) {
    *why = absl::StrCat("setsockopt: ", std::strerror(errno));
    ::close(fd);
    return -1;
  }
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    const int err = errno;
    ::close(fd);
    *retry = wait_for_daemon && (err == ENOENT || err == ECONNREFUSED);
    *why = absl::StrCat("connect: ", std::strerror(err));
    return -1;
  }
  if (!WriteFullV(fd, iov.data(), count)) {
    const int err = errno;
    ::close(fd);
    // A reset or a broken pipe: the daemon closed the connection (a flood
    // made room); a timeout uses up the deadline.
    *retry = err == ECONNRESET || err == EPIPE;
    *why = absl::StrCat("sending the first frame: ",
                        err == EAGAIN || err == EWOULDBLOCK
                            ? "no room before the deadline"
                            : std::strerror(err));
    return -1;
  }
  errno = 0;
  if (!ReadFull(fd, reply, reply_bytes)) {
    const int err = errno;
    ::close(fd);
    // EOF or a reset: the daemon closed the connection before answering (a
    // flood made room, or a kvtierd older than this library did not know
    // the frame); a timeout uses up the deadline.
    *retry = err == 0 || err == ECONNRESET;
    *why = absl::StrCat("reading the reply: ",
                        err == 0 ? "connection closed by kvtierd"
                        : err == EAGAIN || err == EWOULDBLOCK
                            ? "no answer before the deadline"
                            : std::strerror(err));
    return -1;
  }
  return fd;
}

// Reads the message of `bytes` bytes after an error reply into *message.
bool ReadMessage(int fd, uint32_t bytes, std::string* message) {
  if (bytes > fastpath::kMaxMessageBytes) return false;
  message->resize(bytes);
  return ReadFull(fd, message->data(), bytes);
}

// The status of a daemon's error reply.
absl::Status DaemonError(absl::string_view what, int32_t code, uint32_t reason,
                         absl::string_view message) {
  absl::Status s(static_cast<absl::StatusCode>(code),
                 absl::StrCat(what, ": ", message));
  if (s.ok()) {  // A zero code with an error's shape: malformed.
    return WithErrorReason(
        absl::UnavailableError(absl::StrCat(what, ": malformed reply")),
        ErrorReason::kDaemonUnreachable);
  }
  // An unknown number (a newer daemon's) reads as no reason.
  if (reason <= static_cast<uint32_t>(ErrorReason::kDaemonUnreachable)) {
    s = WithErrorReason(std::move(s), static_cast<ErrorReason>(reason));
  }
  return s;
}

// True when idle connection `fd` has neither been closed by the daemon nor
// sent anything (an idle connection has no reply due).
bool StillOpen(int fd) {
  char c;
  const ssize_t r = ::recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  return r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
}

}  // namespace

bool SetSocketTimeouts(int fd, absl::Duration timeout) {
  const timeval tv =
      timeout == absl::InfiniteDuration()
          ? timeval{}
          : absl::ToTimeval(std::max(timeout, absl::Milliseconds(1)));
  return ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) == 0 &&
         ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) == 0;
}

int DialEngineSocket(const std::string& path, const iovec* frame, int count,
                     void* reply, size_t reply_bytes, absl::Time deadline,
                     bool wait_for_daemon, std::string* why) {
  if (path.size() >= sizeof(sockaddr_un::sun_path)) {
    *why = absl::StrCat(path, ": path too long");
    return -1;
  }
  absl::Duration backoff = absl::Milliseconds(5);
  for (int attempt = 1;; ++attempt) {
    bool retry = false;
    const int fd = DialOnce(path, frame, count, reply, reply_bytes, deadline,
                            wait_for_daemon, why, &retry);
    if (fd >= 0) return fd;
    if (!retry || absl::Now() + backoff >= deadline) {
      *why = absl::StrCat(path, ": ", *why, " (", attempt, " attempts)");
      return -1;
    }
    absl::SleepFor(backoff);
    backoff = std::min(backoff * 2, absl::Milliseconds(200));
  }
}

absl::Status EngineLink::Bind(const std::string& path, uint64_t session_id,
                              absl::Duration timeout) {
  Close();
  {
    absl::MutexLock lock(&mu_);
    path_ = path;
    session_id_ = session_id;
  }
  Conn c;
  absl::Status s = Acquire(session_id, absl::Now() + timeout, timeout, &c);
  if (!s.ok()) {
    Close();
    return s;
  }
  Return(c, true);
  return absl::OkStatus();
}

void EngineLink::Close() {
  std::vector<Conn> idle;
  {
    absl::MutexLock lock(&mu_);
    session_id_ = 0;
    ++generation_;
    idle.swap(idle_);
    open_ -= static_cast<int>(idle.size());
  }
  for (const Conn& c : idle) ::close(c.fd);
}

bool EngineLink::active() const {
  absl::MutexLock lock(&mu_);
  return session_id_ != 0;
}

absl::Status EngineLink::Acquire(uint64_t expected, absl::Time deadline,
                                 absl::Duration timeout, Conn* c) {
  std::string path;
  uint64_t session = 0;
  {
    absl::MutexLock lock(&mu_);
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return session_id_ == 0 || !idle_.empty() || open_ < kMaxConnections;
    };
    while (!ready()) {
      if (mu_.AwaitWithDeadline(absl::Condition(&ready), deadline)) break;
      return WithErrorReason(
          absl::DeadlineExceededError(absl::StrCat(
              "all ", kMaxConnections,
              " connections to kvtierd are busy past the deadline")),
          ErrorReason::kDaemonUnreachable);
    }
    if (session_id_ == 0 || session_id_ != expected) {
      return WithErrorReason(
          absl::UnavailableError(
              session_id_ == 0
                  ? "no session with kvtierd (reconnecting)"
                  : "the request's session with kvtierd ended (reconnected)"),
          ErrorReason::kDaemonUnreachable);
    }
    // An idle connection the daemon has closed meanwhile (its idle
    // timeout) is dropped, not used: the request would fail as an outage.
    while (!idle_.empty() && !StillOpen(idle_.back().fd)) {
      ::close(idle_.back().fd);
      idle_.pop_back();
      --open_;
    }
    if (!idle_.empty()) {
      *c = idle_.back();
      idle_.pop_back();
    } else {
      ++open_;  // Counted while it is dialled.
      c->fd = -1;
      c->generation = generation_;
      path = path_;
      session = session_id_;
    }
  }
  if (c->fd < 0) {
    fastpath::Hello hello;
    hello.session_id = session;
    const iovec frame{&hello, sizeof(hello)};
    std::string why;
    fastpath::HelloReply reply;
    int fd = DialEngineSocket(path, &frame, 1, &reply, sizeof(reply), deadline,
                              /*wait_for_daemon=*/false, &why);
    if (fd >= 0 && (reply.magic != fastpath::kReplyMagic || reply.code != 0)) {
      const auto code = static_cast<absl::StatusCode>(reply.code);
      why =
          reply.magic != fastpath::kReplyMagic
              ? std::string("malformed Hello reply")
          : code == absl::StatusCode::kResourceExhausted
              ? std::string(
                    "kvtierd serves as many connections as it may "
                    "(RESOURCE_EXHAUSTED)")
              : absl::StrCat("Hello refused: ", absl::StatusCodeToString(code));
      ::close(fd);
      fd = -1;
    }
    if (fd < 0) {
      Return(Conn{}, false);
      return WithErrorReason(absl::UnavailableError(absl::StrCat(
                                 "cannot reach kvtierd's engine socket ", why)),
                             ErrorReason::kDaemonUnreachable);
    }
    c->fd = fd;
    c->timeout = absl::ZeroDuration();
  }
  if (c->timeout != timeout) {
    if (!SetSocketTimeouts(c->fd, timeout)) {
      Return(*c, false);
      return Broken("connection", "setsockopt", errno);
    }
    c->timeout = timeout;
  }
  return absl::OkStatus();
}

void EngineLink::Return(Conn c, bool healthy) {
  bool close_it = true;
  {
    absl::MutexLock lock(&mu_);
    if (healthy && c.fd >= 0 && c.generation == generation_ &&
        session_id_ != 0 && idle_.size() < static_cast<size_t>(kMaxIdle)) {
      idle_.push_back(c);
      close_it = false;
    } else {
      --open_;
    }
  }
  if (close_it && c.fd >= 0) ::close(c.fd);
}

absl::Status EngineLink::Broken(absl::string_view what, const char* step,
                                int err) {
  if (err == EAGAIN || err == EWOULDBLOCK) {
    return WithErrorReason(
        absl::DeadlineExceededError(absl::StrCat(
            what, ": kvtierd did not answer within the deadline (", step, ")")),
        ErrorReason::kDaemonUnreachable);
  }
  return WithErrorReason(
      absl::UnavailableError(absl::StrCat(
          what, ": connection to kvtierd lost (", step, ": ",
          err == 0 ? "closed by kvtierd" : std::strerror(err), ")")),
      ErrorReason::kDaemonUnreachable);
}

absl::Status EngineLink::Lookup(uint64_t session, uint64_t namespace_id,
                                std::string_view hashes, bool pin,
                                absl::Duration timeout, fastpath::Reply* reply,
                                std::vector<uint32_t>* rows) {
  if (hashes.size() > fastpath::kMaxRequestBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("Lookup: hashes: ", hashes.size(), " bytes, at most ",
                     fastpath::kMaxRequestBytes));
  }
  Conn c;
  if (absl::Status s = Acquire(session, absl::Now() + timeout, timeout, &c);
      !s.ok()) {
    return s;
  }
  fastpath::Request req;
  req.flags = pin ? fastpath::kFlagPin : 0;
  req.namespace_id = namespace_id;
  req.hash_bytes = static_cast<uint32_t>(hashes.size());
  iovec iov[2] = {{&req, sizeof(req)},
                  {const_cast<char*>(hashes.data()), hashes.size()}};
  errno = 0;
  const char* step = "sending";
  bool ok = WriteFullV(c.fd, iov, 2);
  if (ok) {
    step = "reading the reply";
    ok = ReadFull(c.fd, reply, sizeof(*reply)) &&
         reply->magic == fastpath::kReplyMagic;
  }
  absl::Status status;
  if (ok && reply->code == 0) {
    ok = reply->usable_pages <= fastpath::kMaxLookupHashes;
    if (ok) {
      rows->resize(reply->usable_pages);
      ok = ReadFull(c.fd, rows->data(), rows->size() * sizeof(uint32_t));
    }
  } else if (ok) {
    std::string message;
    ok = ReadMessage(c.fd, reply->message_bytes, &message);
    status = DaemonError("Lookup", reply->code, reply->reason, message);
  }
  const int err = errno;
  Return(c, ok);
  if (!ok) return Broken("Lookup", step, err);
  return status;
}

absl::Status EngineLink::Call(uint64_t session, fastpath::Method method,
                              absl::string_view what,
                              const google::protobuf::MessageLite& request,
                              google::protobuf::MessageLite* response,
                              absl::Duration timeout) {
  std::string payload;
  if (!request.SerializeToString(&payload) ||
      payload.size() > fastpath::kMaxCallBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": the request cannot be sent (", payload.size(),
                     " bytes, at most ", fastpath::kMaxCallBytes, ")"));
  }
  Conn c;
  if (absl::Status s = Acquire(session, absl::Now() + timeout, timeout, &c);
      !s.ok()) {
    return WithErrorReason(
        absl::Status(s.code(), absl::StrCat(what, ": ", s.message())),
        GetErrorReason(s));
  }
  fastpath::Call call;
  call.method = static_cast<uint32_t>(method);
  call.payload_bytes = static_cast<uint32_t>(payload.size());
  iovec iov[2] = {{&call, sizeof(call)}, {payload.data(), payload.size()}};
  errno = 0;
  const char* step = "sending";
  fastpath::CallReply reply;
  bool ok = WriteFullV(c.fd, iov, 2);
  if (ok) {
    step = "reading the reply";
    ok = ReadFull(c.fd, &reply, sizeof(reply)) &&
         reply.magic == fastpath::kCallReplyMagic &&
         reply.payload_bytes <= fastpath::kMaxCallBytes;
  }
  std::string message;
  if (ok) ok = ReadMessage(c.fd, reply.message_bytes, &message);
  std::string body;
  if (ok) {
    body.resize(reply.payload_bytes);
    ok = ReadFull(c.fd, body.data(), body.size());
  }
  const int err = errno;
  Return(c, ok);
  if (!ok) return Broken(what, step, err);
  if (reply.code != 0) {
    return DaemonError(what, reply.code, reply.reason, message);
  }
  if (!response->ParseFromString(body)) {
    return WithErrorReason(absl::UnavailableError(absl::StrCat(
                               what, ": kvtierd's response is malformed")),
                           ErrorReason::kDaemonUnreachable);
  }
  return absl::OkStatus();
}

}  // namespace kvtier::client
