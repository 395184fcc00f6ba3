// Connection (client/connection.h): the session stream, its reopening after
// an outage, the fence report, and the clean close.
#include "client/connection.h"

#include <unistd.h>

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/namespace_state.h"

namespace kvtier::client {

Connection::~Connection() {
  worker.reset();  // Runs what is queued first (commits, releases).
  {
    absl::MutexLock lock(&mu);
    stopping = true;
    // A clean close: with nothing held, the daemon may hand this session's
    // rows out at once rather than fence them until the process exits.
    if (session_stream != nullptr) {
      v1::SessionRequest bye;
      bye.set_api_version(1);
      bye.mutable_goodbye()->set_quiescent(tracker.size() == 0);
      if (session_stream->Write(bye)) session_stream->WritesDone();
      mu.AwaitWithTimeout(
          absl::Condition(
              +[](Connection* c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(c->mu) {
                return c->session_context == nullptr;
              },
              this),
          std::min(timeout, absl::Seconds(2)));
    }
    if (session_context != nullptr) session_context->TryCancel();
  }
  if (session_thread.joinable()) session_thread.join();
  fast.Close();
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
  grpc::ClientContext ctx;
  Deadline(&ctx);
  (void)stub->Fence(&ctx, req, &resp);
}

absl::Status Connection::ExplainAttach(absl::Status s) const {
  // The daemon's message is the only sign of this refusal (it carries no
  // ErrorReason); at worst a reworded message loses the explanation.
  if (!absl::IsFailedPrecondition(s) ||
      !absl::StrContains(s.message(), "no verified peer credentials")) {
    return s;
  }
  const std::string why = fast.last_error();
  if (why.empty()) return s;
  return absl::Status(
      s.code(), absl::StrCat(s.message(),
                             ". This client could not bind them: the fast "
                             "lookup Hello failed: ",
                             why,
                             ". Attach needs it unless kvtierd runs with "
                             "--require_peer_credentials=false"));
}

absl::StatusOr<Connection::Session> Connection::OpenSession() {
  Session s;
  s.context = std::make_unique<grpc::ClientContext>();
  {
    absl::MutexLock lock(&mu);
    if (stopping) return absl::CancelledError("the client is closing");
    session_context = s.context.get();
  }
  s.stream = stub->Session(s.context.get());
  v1::SessionRequest hello;
  hello.set_api_version(1);
  hello.mutable_hello()->set_client_name(client_name);
  hello.mutable_hello()->set_pid(static_cast<uint32_t>(getpid()));
  hello.mutable_hello()->set_instance_id(instance_id);
  hello.mutable_hello()->set_connection_id(connection_id);
  hello.mutable_hello()->set_fence_version(1);
  v1::SessionEvent opened;
  if (!s.stream->Write(hello) || !s.stream->Read(&opened) ||
      !opened.has_opened()) {
    grpc::Status st = s.stream->Finish();
    {
      absl::MutexLock lock(&mu);
      session_context = nullptr;
    }
    return absl::UnavailableError(
        absl::StrCat("kvtierd at unix:", socket,
                     " did not open a session: ", st.error_message()));
  }
  s.id = opened.opened().session_id();
  s.fast_lookup_socket = opened.opened().fast_lookup_socket();
  {
    absl::MutexLock lock(&mu);
    session_stream = s.stream.get();
  }
  return s;
}

void Connection::KeepSession(Session session) {
  for (;;) {
    v1::SessionEvent event;
    while (session.stream->Read(&event)) {
    }
    // The daemon stopped, died or restarted: everything of this session is
    // void from here on.
    alive = false;
    SessionEnded(epoch.load());
    fast.Close();
    {
      absl::MutexLock lock(&mu);
      session_stream = nullptr;
    }
    (void)session.stream->Finish();
    {
      absl::MutexLock lock(&mu);
      session_context = nullptr;
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
      if (!channel->WaitForConnected(
              absl::ToChronoTime(absl::Now() + absl::Milliseconds(250)))) {
        continue;
      }
      auto opened = OpenSession();
      if (!opened.ok()) continue;
      session = *std::move(opened);
      session_id = session.id;
      // Binds this process's credentials to the new session before any
      // attach, as Connect does.
      fast.Connect(session.fast_lookup_socket, session.id, timeout,
                   fast_lookup);
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
    grpc::ClientContext ctx;
    Deadline(&ctx);
    const grpc::Status s = stub->Fence(&ctx, req, &resp);
    if (s.ok()) {
      tracker.SetHolds(tokens, resp);
      return;
    }
    if (s.error_code() == grpc::StatusCode::UNIMPLEMENTED) return;
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
