// Connection (client/connection.h): the session connection, its reopening
// after an outage, the fence report, and the clean close.
#include "client/connection.h"

#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "client/namespace_state.h"

namespace kvtier::client {

Connection::~Connection() {
  worker.reset();  // Runs what is queued first (commits, releases).
  {
    absl::MutexLock lock(&mu);
    stopping = true;
    if (session_fd >= 0) {
      // A clean close: with nothing held, the daemon may hand this
      // session's rows out at once rather than fence them until the process
      // exits. The daemon closes the session when the connection ends.
      const fastpath::Control bye{
          .kind = static_cast<uint32_t>(fastpath::ControlKind::kGoodbye),
          .arg = tracker.size() == 0 ? 1u : 0u};
      iovec iov{const_cast<fastpath::Control*>(&bye), sizeof(bye)};
      if (fastpath::WriteFullV(session_fd, &iov, 1)) {
        ::shutdown(session_fd, SHUT_WR);
        // The daemon answers the end of our side by closing its own, which
        // ends the session thread's read.
        mu.AwaitWithTimeout(
            absl::Condition(
                +[](Connection* c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(c->mu) {
                  return c->session_fd < 0;
                },
                this),
            std::min(timeout, absl::Seconds(2)));
      }
    }
    if (session_fd >= 0) ::shutdown(session_fd, SHUT_RDWR);
  }
  if (session_thread.joinable()) session_thread.join();
  link.Close();
}

void Connection::SessionEnded(uint64_t ended) {
  absl::MutexLock lock(&watch_mu);
  for (auto it = watches.begin(); it != watches.end();) {
    auto cur = it++;
    if (cur->second.first <= ended) {
      cur->second.second();
      watches.erase(cur);
    }
  }
}

void Connection::ReleaseHold(uint64_t hold) {
  if (hold == 0 || !alive.load()) return;
  v1::FenceRequest req;
  req.set_api_version(1);
  req.set_session_id(session_id.load());
  req.add_release(hold);
  v1::FenceResponse resp;
  (void)Call(fastpath::Method::kFence, "Fence", req, &resp);
}

absl::StatusOr<Connection::Session> Connection::OpenSession(
    absl::Time deadline, bool wait_for_daemon) {
  {
    absl::MutexLock lock(&mu);
    if (stopping) return absl::CancelledError("the client is closing");
  }
  v1::Hello hello;
  hello.set_client_name(client_name);
  hello.set_pid(static_cast<uint32_t>(getpid()));
  hello.set_instance_id(instance_id);
  hello.set_connection_id(connection_id);
  hello.set_fence_version(1);
  const std::string bytes = hello.SerializeAsString();
  fastpath::Open open;
  open.hello_bytes = static_cast<uint32_t>(bytes.size());
  const iovec frame[2] = {{&open, sizeof(open)},
                          {const_cast<char*>(bytes.data()), bytes.size()}};
  fastpath::OpenReply reply;
  std::string why;
  const int fd =
      DialEngineSocket(engine_socket, frame, 2, &reply, sizeof(reply), deadline,
                       wait_for_daemon, &why);
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat(
        "kvtierd did not open a session on ", why,
        " (is the daemon running, and as new as this library? set --socket "
        "or $KVTIER_SOCKET)"));
  }
  if (reply.magic != fastpath::kReplyMagic || reply.code != 0 ||
      reply.session_id == 0) {
    std::string message(
        std::min(reply.message_bytes, fastpath::kMaxMessageBytes), '\0');
    if (reply.magic != fastpath::kReplyMagic ||
        !fastpath::ReadFull(fd, message.data(), message.size())) {
      message = "malformed reply";
    }
    ::close(fd);
    const auto code = reply.code != 0
                          ? static_cast<absl::StatusCode>(reply.code)
                          : absl::StatusCode::kUnavailable;
    return absl::Status(
        code, absl::StrCat("kvtierd did not open a session: ", message));
  }
  // The session thread blocks in read() until the session ends; the
  // Goodbye's write is bounded.
  const timeval none{};
  const timeval bounded = absl::ToTimeval(std::min(timeout, absl::Seconds(2)));
  if (::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &none, sizeof(none)) != 0 ||
      ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &bounded, sizeof(bounded)) !=
          0) {
    ::close(fd);
    return absl::UnavailableError(
        absl::StrCat("session socket: setsockopt: ", std::strerror(errno)));
  }
  absl::MutexLock lock(&mu);
  if (stopping) {
    ::close(fd);
    return absl::CancelledError("the client is closing");
  }
  session_fd = fd;
  return Session{.fd = fd, .id = reply.session_id};
}

void Connection::AbandonSession(int fd) {
  absl::MutexLock lock(&mu);
  if (session_fd == fd) session_fd = -1;
  ::close(fd);
}

void Connection::KeepSession(Session session) {
  for (;;) {
    // Control frames (Draining) until the daemon closes the connection.
    fastpath::Control c;
    while (fastpath::ReadFull(session.fd, &c, sizeof(c)) &&
           c.magic == fastpath::kControlMagic) {
    }
    // The daemon stopped, died or restarted: everything of this session is
    // void from here on.
    alive = false;
    SessionEnded(epoch.load());
    link.Close();
    {
      absl::MutexLock lock(&mu);
      session_fd = -1;
      ::close(session.fd);
    }
    session = Session();
    if (!reconnect) return;
    absl::Duration backoff = absl::Milliseconds(20);
    for (;;) {
      {
        absl::MutexLock lock(&mu);
        mu.AwaitWithTimeout(absl::Condition(&stopping), backoff);
        if (stopping) return;
      }
      backoff = std::min(backoff * 2, absl::Seconds(1));
      auto opened =
          OpenSession(absl::Now() + std::min(timeout, absl::Seconds(1)),
                      /*wait_for_daemon=*/false);
      if (!opened.ok()) continue;
      session = *opened;
      session_id = session.id;
      // The call connections join the new session before any attach.
      if (!link.Bind(engine_socket, session.id, timeout).ok()) {
        AbandonSession(session.fd);
        session = Session();
        continue;
      }
      const uint64_t next = epoch.load() + 1;
      ReattachAll(session.id, next);
      ReportHeld(session.id, next);
      epoch = next;
      alive = true;
      break;
    }
  }
}

void Connection::ReportHeld(uint64_t session, uint64_t next_epoch) {
  v1::FenceRequest req;
  req.set_api_version(1);
  req.set_session_id(session);
  req.set_report_complete(true);
  const std::vector<uint64_t> tokens = tracker.Report(next_epoch, &req);
  // A daemon without the fence answers UNIMPLEMENTED: nothing to keep. An
  // unanswered report only keeps the restart fence up until this process
  // exits (never unsafe): try it a few times.
  for (int attempt = 0; attempt < 3; ++attempt) {
    v1::FenceResponse resp;
    const absl::Status s = Call(fastpath::Method::kFence, "Fence", req, &resp);
    if (s.ok()) {
      tracker.SetHolds(tokens, resp);
      return;
    }
    if (absl::IsUnimplemented(s)) return;
    absl::SleepFor(absl::Milliseconds(50));
  }
}

void Connection::ReattachAll(uint64_t session, uint64_t next_epoch) {
  std::vector<std::shared_ptr<NamespaceState>> live;
  {
    absl::MutexLock lock(&mu);
    namespaces.erase(std::remove_if(namespaces.begin(), namespaces.end(),
                                    [](const auto& w) { return w.expired(); }),
                     namespaces.end());
    for (const auto& w : namespaces) {
      if (auto ns = w.lock()) live.push_back(std::move(ns));
    }
  }
  for (const auto& ns : live) {
    const absl::Status s = ns->Reattach(session);
    absl::MutexLock lock(&ns->mu);
    if (s.ok()) {
      ns->stale_reason.clear();
      ns->epoch = next_epoch;
    } else {
      ns->stale_reason = std::string(s.message());
    }
  }
}

}  // namespace kvtier::client
