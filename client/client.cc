// libkvtier's C++ API: the gRPC client, the session stream, bank mapping and
// the RAII leases and reservations.
#include "kvtier/client.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/random/random.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "client/cuda_host.h"
#include "client/fence_tracker.h"
#include "client/transfer_engine.h"
#include "common/default_socket.h"
#include "common/fast_lookup.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "kvtier/reference_stream.h"
#include "kvtier/v1/tier.grpc.pb.h"
#include "shm/segment.h"
#include "shm/trusted_path.h"

namespace kvtier {
namespace client {
namespace {

// The least deadline an Attach gets (see Connection::AttachDeadline).
constexpr absl::Duration kAttachTimeout = absl::Minutes(2);

absl::Status FromGrpc(const grpc::Status& s, absl::string_view what) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      absl::StrCat(what, ": ", s.error_message()));
}

// Whether an RPC failed because the daemon went away or restarted (it no
// longer knows our session or namespace), rather than over the request.
bool OutageLike(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kCancelled:
    case absl::StatusCode::kDeadlineExceeded:
      return true;
    case absl::StatusCode::kNotFound:
      return absl::StrContains(s.message(), "session_id: no open session") ||
             absl::StrContains(s.message(), "namespace_id: no namespace");
    default:
      return false;
  }
}

absl::Status Unreachable(absl::string_view what) {
  return absl::UnavailableError(absl::StrCat(
      what, ": kvtierd is unreachable or restarted; reconnecting"));
}

}  // namespace

// Runs deferred RPCs (CommitAfter, ReleaseAfter) off the engine's threads.
// A task may drop the last reference to the Connection that owns this
// Worker, so the queue lives in a State that the thread co-owns: the
// Worker can be destroyed from inside a task without pulling the queue out
// from under the running loop.
class Worker {
 public:
  Worker() : state_(std::make_shared<State>()) {
    thread_ = std::thread([state = state_] { Run(*state); });
  }
  ~Worker() {
    {
      absl::MutexLock lock(&state_->mu);
      state_->stop = true;
    }
    if (thread_.get_id() == std::this_thread::get_id()) {
      thread_.detach();  // Destroyed by a task: the loop ends by itself.
    } else {
      thread_.join();
    }
  }
  void Post(std::function<void()> task) {
    absl::MutexLock lock(&state_->mu);
    state_->tasks.push_back(std::move(task));
  }

 private:
  struct State {
    absl::Mutex mu;
    std::deque<std::function<void()>> tasks ABSL_GUARDED_BY(mu);
    bool stop ABSL_GUARDED_BY(mu) = false;
  };

  static void Run(State& s) {
    for (;;) {
      std::function<void()> task;
      {
        absl::MutexLock lock(&s.mu);
        s.mu.Await(absl::Condition(
            +[](State* st) ABSL_EXCLUSIVE_LOCKS_REQUIRED(st->mu) {
              return st->stop || !st->tasks.empty();
            },
            &s));
        if (s.tasks.empty()) return;
        task = std::move(s.tasks.front());
        s.tasks.pop_front();
      }
      task();
    }
  }

  std::shared_ptr<State> state_;
  std::thread thread_;
};

struct NamespaceState;

// One process's link to the daemon: the channel, the current session and
// the thread that keeps a session open. Session changes are published in
// this order: alive=false when the stream ends; then session_id, each
// namespace's id and epoch; then epoch; then alive=true. A request reads
// alive and epoch, then the ids, then alive and epoch again (see
// NamespaceState::Fill), so it never mixes two sessions' ids.
struct Connection {
  using Stream = grpc::ClientReaderWriter<v1::SessionRequest, v1::SessionEvent>;
  struct Session {
    std::unique_ptr<grpc::ClientContext> context;
    std::unique_ptr<Stream> stream;
    uint64_t id = 0;
    std::string fast_lookup_socket;
  };

  // Immutable after Connect.
  std::string socket;
  // The socket's owner (shm::CheckDaemonSocket): every segment mapped must
  // be this uid's, so a file planted under a bank's name is never mapped.
  uid_t daemon_uid = shm::kAnyOwner;
  absl::Duration timeout;
  std::string client_name;
  std::string instance_id;     // 16 bytes (fence protocol).
  uint64_t connection_id = 0;  // Random, non-zero, for the whole Client.
  bool fast_lookup = true;
  bool reconnect = true;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::TierService::Stub> stub;

  std::atomic<uint64_t> session_id{0};
  // Sessions opened so far: 1 after Connect, +1 per reconnection.
  std::atomic<uint64_t> epoch{0};
  std::atomic<bool> alive{false};
  std::thread session_thread;
  std::unique_ptr<Worker> worker = std::make_unique<Worker>();
  // What this process holds, to report after a reconnection.
  FenceTracker tracker;
  // Callbacks for the end of a session (WatchSessionEnd): token ->
  // (epoch, callback).
  absl::Mutex watch_mu;
  uint64_t next_watch ABSL_GUARDED_BY(watch_mu) = 1;
  absl::flat_hash_map<uint64_t, std::pair<uint64_t, std::function<void()>>>
      watches ABSL_GUARDED_BY(watch_mu);
  // Runs and forgets the callbacks of sessions up to `ended`, under the
  // lock, so that UnwatchSessionEnd returning means the callback is not
  // running and never will (callbacks are short: set a flag).
  void SessionEnded(uint64_t ended) {
    absl::MutexLock lock(&watch_mu);
    for (auto it = watches.begin(); it != watches.end();) {
      auto cur = it++;
      if (cur->second.first <= ended) {
        cur->second.second();
        watches.erase(cur);
      }
    }
  }
  absl::Mutex mu;
  bool stopping ABSL_GUARDED_BY(mu) = false;
  // The open (or opening) session's context, for ~Connection to cancel, and
  // its stream, for the Goodbye.
  grpc::ClientContext* session_context ABSL_GUARDED_BY(mu) = nullptr;
  Stream* session_stream ABSL_GUARDED_BY(mu) = nullptr;
  // The namespaces to re-attach after a reconnection.
  std::vector<std::weak_ptr<NamespaceState>> namespaces ABSL_GUARDED_BY(mu);
  // The fast lookup path; -1 when not offered or broken. One request at a
  // time per connection; every read and write on it has the per-RPC
  // deadline (SO_RCVTIMEO/SO_SNDTIMEO), so fast_mu is never held longer.
  absl::Mutex fast_mu;
  int fast_fd ABSL_GUARDED_BY(fast_mu) = -1;
  // Why the last Hello failed ("" when it succeeded): explains an Attach
  // refused for unbound credentials.
  std::string fast_error ABSL_GUARDED_BY(fast_mu);
  // Whether "fast lookup unavailable" was logged (once per Client).
  std::atomic<bool> fast_fallback_logged{false};

  // Connects the fast lookup path; its Hello also binds this process's
  // credentials (SO_PEERCRED) to the session, which the daemon needs before
  // Attach. Keeps the connection for lookups when `keep`, else closes it
  // once bound. Takes at most the per-RPC deadline. Leaves fast_fd at -1 on
  // any failure, with the reason in fast_error; lookups then use gRPC.
  void ConnectFast(const std::string& path, bool keep) {
    std::string why;
    const int fd = DialFast(path, &why);
    absl::MutexLock lock(&fast_mu);
    fast_error = why;
    if (fd < 0) {
      if (keep && !path.empty()) LogFallback(why);
      return;
    }
    if (!keep) {
      ::close(fd);
      return;
    }
    if (fast_fd >= 0) ::close(fast_fd);
    fast_fd = fd;
  }

  // Connects `path` and exchanges the Hello before the per-RPC deadline;
  // returns the connected fd, or -1 with *why. The daemon closes
  // connections still without a Hello when their uid holds too many (a
  // flood, maybe of this uid: common/fast_lookup.h), so a connection closed
  // before the reply is tried again, with backoff, until the deadline.
  int DialFast(const std::string& path, std::string* why) const {
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
      const int fd = DialFastOnce(path, deadline, why, &retry);
      if (fd >= 0) return fd;
      if (!retry || absl::Now() + backoff >= deadline) {
        *why = absl::StrCat(path, ": ", *why, " (", attempt, " attempts)");
        return -1;
      }
      absl::SleepFor(backoff);
      backoff = std::min(backoff * 2, absl::Milliseconds(200));
    }
  }

  // One connect + Hello before `deadline`. On failure returns -1, sets *why
  // and *retry (the daemon closed the connection before answering).
  int DialFastOnce(const std::string& path, absl::Time deadline,
                   std::string* why, bool* retry) const {
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
    // The deadline bounds connect (a full backlog), the Hello and its
    // reply; later it bounds each read and write of a lookup: a stalled
    // daemon fails the fast lookup (the caller falls back to gRPC, which
    // has the same deadline) instead of blocking the engine.
    const absl::Duration left =
        std::max(deadline - absl::Now(), absl::Milliseconds(1));
    const absl::Duration t = std::max(timeout, absl::Milliseconds(1));
    const timeval first{
        static_cast<time_t>(absl::ToInt64Seconds(left)),
        static_cast<suseconds_t>(absl::ToInt64Microseconds(left) % 1000000)};
    const timeval later{
        static_cast<time_t>(absl::ToInt64Seconds(t)),
        static_cast<suseconds_t>(absl::ToInt64Microseconds(t) % 1000000)};
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
      // EOF, a reset or a broken pipe after connecting: the daemon closed
      // the connection (a flood made room); a timeout uses up the deadline.
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

  // Runs a lookup over the fast path. Returns false when the path is not
  // available or broke (the caller then uses gRPC; the first time is
  // logged); else fills *status and the outputs.
  bool FastLookup(uint64_t namespace_id, std::string_view hashes, bool pin,
                  absl::Status* status, fastpath::Reply* reply,
                  std::vector<uint32_t>* rows) {
    absl::MutexLock lock(&fast_mu);
    if (fast_fd < 0) return false;
    if (hashes.size() > fastpath::kMaxRequestBytes) return false;
    fastpath::Request req;
    req.flags = pin ? fastpath::kFlagPin : 0;
    req.namespace_id = namespace_id;
    req.hash_bytes = static_cast<uint32_t>(hashes.size());
    iovec iov[2] = {{&req, sizeof(req)},
                    {const_cast<char*>(hashes.data()), hashes.size()}};
    errno = 0;
    bool ok = fastpath::WriteFullV(fast_fd, iov, 2) &&
              fastpath::ReadFull(fast_fd, reply, sizeof(*reply)) &&
              reply->magic == fastpath::kReplyMagic;
    if (ok && reply->code == 0) {
      rows->resize(reply->usable_pages);
      ok = fastpath::ReadFull(fast_fd, rows->data(),
                              rows->size() * sizeof(uint32_t));
      *status = absl::OkStatus();
    } else if (ok) {
      std::string message(reply->message_bytes, '\0');
      ok = reply->message_bytes <= (1u << 20) &&
           fastpath::ReadFull(fast_fd, message.data(), message.size());
      *status = absl::Status(static_cast<absl::StatusCode>(reply->code),
                             absl::StrCat("Lookup: ", message));
    }
    if (!ok) {
      const int err = errno;
      ::close(fast_fd);
      fast_fd = -1;
      fast_error = err == EAGAIN || err == EWOULDBLOCK
                       ? "no answer within the per-RPC deadline"
                   : err == 0 ? "connection closed by kvtierd"
                              : std::strerror(err);
      LogFallback(fast_error);
    }
    return ok;
  }

  // Says once per Client that lookups go over gRPC, and why.
  void LogFallback(const std::string& why) {
    if (!fast_fallback_logged.exchange(true)) {
      std::fprintf(stderr, "kvtier: fast lookup unavailable (%s), using gRPC\n",
                   why.c_str());
    }
  }

  // `s`, an Attach's error, with why this client's credentials are unbound
  // when the daemon refused it for that.
  absl::Status ExplainAttach(absl::Status s) {
    if (!absl::IsFailedPrecondition(s) ||
        !absl::StrContains(s.message(), "no verified peer credentials")) {
      return s;
    }
    absl::MutexLock lock(&fast_mu);
    if (fast_error.empty()) return s;
    return absl::Status(
        s.code(), absl::StrCat(s.message(),
                               ". This client could not bind them: the "
                               "fast lookup Hello failed: ",
                               fast_error,
                               ". Attach needs it unless kvtierd runs with "
                               "--require_peer_credentials=false"));
  }

  void Deadline(grpc::ClientContext* ctx) const {
    ctx->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  }

  // Attach may create a namespace, which populates its banks (seconds per
  // GiB on 4 KiB pages): it gets at least kAttachTimeout, whatever the
  // per-RPC deadline, so a short deadline for lookups never fails it.
  void AttachDeadline(grpc::ClientContext* ctx) const {
    ctx->set_deadline(
        absl::ToChronoTime(absl::Now() + std::max(timeout, kAttachTimeout)));
  }

  void CloseFast() {
    absl::MutexLock lock(&fast_mu);
    if (fast_fd >= 0) ::close(fast_fd);
    fast_fd = -1;
  }

  // Opens a session stream (Hello, Opened). UNAVAILABLE when the daemon
  // does not answer; CANCELLED once the connection is stopping.
  absl::StatusOr<Session> OpenSession();
  // The session thread: reads the stream until it ends, then reopens a
  // session, rebinds the fast path and re-attaches the namespaces, with
  // backoff, until it succeeds or the connection stops.
  void KeepSession(Session session);
  // Re-attaches every live namespace to session `session_id` and marks it
  // valid for `next_epoch`; a namespace that fails stays stale.
  void ReattachAll(uint64_t session_id, uint64_t next_epoch);
  // Reports what the tracker holds from sessions before `next_epoch` to the
  // new session (Fence, report_complete) and keeps the holds it answers.
  void ReportHeld(uint64_t session_id, uint64_t next_epoch);
  // Frees a fence hold of the current session (best effort: a hold whose
  // release is lost is freed by the next report or the process's exit).
  void ReleaseHold(uint64_t hold) {
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

  ~Connection() {
    worker.reset();  // Runs what is queued first (commits, releases).
    {
      absl::MutexLock lock(&mu);
      stopping = true;
      // A clean close: with nothing held, the daemon may hand this
      // session's rows out at once rather than fence them until the
      // process exits.
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
    CloseFast();
  }
};

struct NamespaceState {
  std::shared_ptr<Connection> conn;
  // Valid for the session of Connection::epoch == epoch; a namespace whose
  // re-attach failed keeps an older epoch and stays unusable.
  std::atomic<uint64_t> id{0};
  std::atomic<uint64_t> epoch{0};
  v1::AttachRequest attach_request;  // Replayed at re-attach (session unset).
  std::string name;
  Layout layout;
  uint32_t tp_rank = 0;
  bool created = false;
  std::optional<BlockHasher> hasher;
  std::vector<std::unique_ptr<shm::Segment>> segments;  // Banks, then snapshot.
  std::vector<BankMapping> page_banks;
  std::optional<BankMapping> snapshot_bank;
  bool registered = false;
  double map_seconds = 0;
  double register_seconds = 0;
  // The daemon's device pools as the first Attach reported them, valid for
  // the session of device_epoch only (immutable after Attach).
  std::vector<DevicePoolInfo> device_pools;
  uint64_t device_epoch = 0;
  absl::Mutex mu;
  // Why the last re-attach failed (empty: it did not).
  std::string stale_reason ABSL_GUARDED_BY(mu);

  ~NamespaceState() {
    if (registered) {
      for (const auto& seg : segments) {
        UnregisterHostRange(seg->base(), seg->file_bytes());
      }
    }
    // The session thread may drop the last reference while re-attaching;
    // ~Connection joins that thread, so the worker (which may end itself
    // from a task) lets the connection go instead.
    if (conn != nullptr &&
        std::this_thread::get_id() == conn->session_thread.get_id()) {
      Worker* worker = conn->worker.get();
      worker->Post([c = std::move(conn)] {});
    }
  }

  // Fills the request's session and namespace ids and returns the epoch
  // they belong to; false (nothing usable) while the daemon is unreachable
  // or this namespace is not attached to the current session.
  template <typename Req>
  bool Fill(Req* req, uint64_t* used_epoch) const {
    const uint64_t e = conn->epoch.load();
    if (!conn->alive.load() || epoch.load() != e) return false;
    req->set_api_version(1);
    req->set_session_id(conn->session_id.load());
    req->set_namespace_id(id.load());
    if (!conn->alive.load() || conn->epoch.load() != e) return false;
    *used_epoch = e;
    return true;
  }
  // True while the session of `e` is the current, open one.
  bool Current(uint64_t e) const {
    return conn->alive.load() && conn->epoch.load() == e;
  }
  // Reserve's and Commit's error while unusable.
  absl::Status Unusable(absl::string_view what) {
    {
      absl::MutexLock lock(&mu);
      if (conn->alive.load() && !stale_reason.empty()) {
        return absl::UnavailableError(absl::StrCat(
            what, ": namespace '", name,
            "' could not be re-attached after the daemon restarted (",
            stale_reason, "); attach it again"));
      }
    }
    return Unreachable(what);
  }

  // Release and Abort of a lease or reservation of an ended session do
  // nothing: the daemon that held them is gone, and so are they.
  absl::Status ReleaseLease(uint64_t lease_epoch, uint64_t lease_id) {
    v1::ReleaseRequest req;
    uint64_t e = 0;
    if (!Fill(&req, &e) || e != lease_epoch) return absl::OkStatus();
    req.set_lease_id(lease_id);
    v1::ReleaseResponse resp;
    grpc::ClientContext ctx;
    conn->Deadline(&ctx);
    absl::Status s = FromGrpc(conn->stub->Release(&ctx, req, &resp), "Release");
    return !s.ok() && (OutageLike(s) || !Current(e)) ? absl::OkStatus() : s;
  }

  // `fenced`: writes may still be queued; the daemon keeps the rows fenced
  // until this process exits.
  absl::Status AbortReservation(uint64_t reservation_epoch,
                                uint64_t reservation_id, bool fenced = false) {
    v1::AbortRequest req;
    uint64_t e = 0;
    if (!Fill(&req, &e) || e != reservation_epoch) return absl::OkStatus();
    req.set_reservation_id(reservation_id);
    req.set_fenced(fenced);
    v1::AbortResponse resp;
    grpc::ClientContext ctx;
    conn->Deadline(&ctx);
    absl::Status s = FromGrpc(conn->stub->Abort(&ctx, req, &resp), "Abort");
    return !s.ok() && (OutageLike(s) || !Current(e)) ? absl::OkStatus() : s;
  }

  absl::StatusOr<CommitResult> CommitReservation(
      uint64_t reservation_epoch, uint64_t reservation_id,
      std::string_view parent, std::string_view hashes,
      const std::vector<SnapshotPlacement>& snaps,
      const std::vector<SnapshotPlacement>& device_snaps = {}) {
    v1::CommitRequest req;
    uint64_t e = 0;
    if (!Fill(&req, &e)) return Unusable("Commit");
    if (e != reservation_epoch) {
      return absl::UnavailableError(absl::StrCat(
          "Commit: reservation ", reservation_id,
          " belongs to a daemon session that ended (the daemon restarted): "
          "its rows are void; reserve again"));
    }
    req.set_reservation_id(reservation_id);
    req.set_parent_hash(std::string(parent));
    req.set_hashes(std::string(hashes));
    for (const auto& s : snaps) {
      auto* p = req.add_snapshots();
      p->set_index(s.index);
      p->set_hash(s.hash);
    }
    for (const auto& s : device_snaps) {
      auto* p = req.add_device_snapshots();
      p->set_index(s.index);
      p->set_hash(s.hash);
    }
    v1::CommitResponse resp;
    grpc::ClientContext ctx;
    conn->Deadline(&ctx);
    if (absl::Status s =
            FromGrpc(conn->stub->Commit(&ctx, req, &resp), "Commit");
        !s.ok()) {
      if (OutageLike(s) || !Current(e)) return Unreachable("Commit");
      return s;
    }
    return CommitResult{resp.committed_pages(), resp.deduplicated_pages(),
                        resp.committed_snapshots(),
                        resp.deduplicated_snapshots()};
  }

  // Runs task(OkStatus()) on the worker once `stream`'s queued work has
  // finished; at once (on the worker) when the process has no device. A null
  // stream is CUDA's default stream, as everywhere in CUDA (torch uses it
  // unless told otherwise), so it is waited for like any other.
  // When the callback cannot be queued behind the stream, runs task(error)
  // instead: the task must then not make rows visible or unpin them.
  // Releases the pin `lease_id` of session `epoch` if that is the current
  // session, else the fence hold tracked under `track`, once the lease's
  // work is done.
  void LeaseDone(uint64_t epoch, uint64_t lease_id, uint64_t track) {
    const uint64_t hold = conn->tracker.Remove(track);
    if (Current(epoch)) {
      (void)ReleaseLease(epoch, lease_id);
    } else {
      conn->ReleaseHold(hold);
    }
  }
  // The same for a reservation whose writes are done: abort, or free its
  // hold.
  void ReservationDone(uint64_t epoch, uint64_t id, uint64_t track) {
    const uint64_t hold = conn->tracker.Remove(track);
    if (Current(epoch)) {
      (void)AbortReservation(epoch, id);
    } else {
      conn->ReleaseHold(hold);
    }
  }
  // A reservation whose writes may still be queued, given up: the daemon
  // keeps its rows fenced until this process exits (an earlier session's
  // hold simply stays).
  void ReservationAbandoned(uint64_t epoch, uint64_t id, uint64_t track) {
    // Kept in the tracker for good: reported after every reconnection, so
    // no report ever says this process no longer holds the rows.
    conn->tracker.Abandon(track);
    if (Current(epoch)) (void)AbortReservation(epoch, id, /*fenced=*/true);
  }
  // Hands a new lease or reservation to the tracker.
  uint64_t Track(uint64_t epoch, std::vector<uint32_t> page_rows,
                 std::vector<uint32_t> snapshot_rows, std::string lease_hash) {
    FenceTracker::Item item;
    item.epoch = epoch;
    item.ns_name = name;
    item.tp_rank = tp_rank;
    item.page_rows = std::move(page_rows);
    item.snapshot_rows = std::move(snapshot_rows);
    item.lease_hash = std::move(lease_hash);
    return conn->tracker.Add(std::move(item));
  }

  void After(void* stream, std::function<void(absl::Status)> task) {
    if (ReferenceStream* rs = ReferenceStream::FromHandle(stream)) {
      rs->Enqueue([c = conn, t = std::move(task)]() mutable {
        c->worker->Post([t = std::move(t)] { t(absl::OkStatus()); });
      });
      return;
    }
    if (!CudaDevicePresent()) {
      conn->worker->Post([t = std::move(task)] { t(absl::OkStatus()); });
      return;
    }
    struct Hop {
      std::shared_ptr<Connection> conn;
      std::function<void(absl::Status)> task;
    };
    auto* hop = new Hop{conn, std::move(task)};
    absl::Status s = LaunchHostCallback(
        stream,
        +[](void* arg) {
          auto* h = static_cast<Hop*>(arg);
          h->conn->worker->Post(
              [t = std::move(h->task)] { t(absl::OkStatus()); });
          delete h;
        },
        hop);
    if (!s.ok()) {
      conn->worker->Post([t = std::move(hop->task), s] { t(s); });
      delete hop;
    }
  }
};

// Maps the recreated segment `fresh` (at path) over namespace `ns`'s mapping
// i, at the same address, so every pointer the engine holds into the bank
// stays valid and now reaches the daemon's new segment. CUDA registration is
// redone. REQUIRES: no copy into or out of the bank is in flight (its
// contents were lost with the old segment anyway).
absl::Status RemapInPlace(NamespaceState& ns, size_t i,
                          const shm::Segment& fresh) {
  shm::Segment& mine = *ns.segments[i];
  if (fresh.file_bytes() != mine.file_bytes() || fresh.rows() != mine.rows() ||
      fresh.row_stride() != mine.row_stride() ||
      fresh.data_offset() != mine.data_offset()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "bank at ", fresh.path(), " was recreated with another shape (",
        fresh.rows(), " rows, ", fresh.file_bytes(), " bytes; mapped: ",
        mine.rows(), " rows, ", mine.file_bytes(), " bytes)"));
  }
  const int fd = ::open(fresh.path().c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat("reopening ", fresh.path()));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || st.st_ino != fresh.inode()) {
    ::close(fd);
    return absl::FailedPreconditionError(absl::StrCat(
        "bank at ", fresh.path(), " changed while it was being remapped"));
  }
  if (ns.registered) UnregisterHostRange(mine.base(), mine.file_bytes());
  void* p = ::mmap(mine.base(), mine.file_bytes(), PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_FIXED, fd, 0);
  const int mmap_errno = errno;
  ::close(fd);
  if (p == MAP_FAILED) {
    // Keep the range mapped (zeros) so stray pointers cannot fault.
    (void)::mmap(mine.base(), mine.file_bytes(), PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    ns.registered = false;
    return absl::ErrnoToStatus(
        mmap_errno, absl::StrCat("remapping ", fresh.path(), " in place"));
  }
  if (ns.registered) {
    if (absl::Status s = RegisterHostRange(mine.base(), mine.file_bytes());
        !s.ok()) {
      return absl::Status(
          s.code(),
          absl::StrCat("re-registering ", fresh.path(), ": ", s.message()));
    }
  }
  return absl::OkStatus();
}

// Attaches `ns` to session `session_id` as it was attached before and
// checks its banks: the same segments keep their mappings; recreated ones
// are remapped in place.
absl::Status Reattach(NamespaceState& ns, uint64_t session_id) {
  Connection& conn = *ns.conn;
  v1::AttachRequest req = ns.attach_request;
  req.set_session_id(session_id);
  v1::AttachResponse resp;
  grpc::ClientContext ctx;
  conn.AttachDeadline(&ctx);
  if (absl::Status s = FromGrpc(conn.stub->Attach(&ctx, req, &resp), "Attach");
      !s.ok()) {
    return s;
  }
  if (static_cast<size_t>(resp.segments_size()) != ns.segments.size()) {
    return absl::FailedPreconditionError(
        absl::StrCat("the daemon names ", resp.segments_size(), " banks, ",
                     ns.segments.size(), " are mapped"));
  }
  for (size_t i = 0; i < ns.segments.size(); ++i) {
    const v1::Segment& info = resp.segments(static_cast<int>(i));
    shm::Segment& mine = *ns.segments[i];
    if (info.path() != mine.path()) {
      return absl::FailedPreconditionError(
          absl::StrCat("bank '", info.bank(), "' moved from ", mine.path(),
                       " to ", info.path()));
    }
    auto fresh = shm::Segment::Open(info.path(), conn.daemon_uid);
    if (!fresh.ok()) {
      return absl::Status(fresh.status().code(),
                          absl::StrCat("mapping bank '", info.bank(),
                                       "': ", fresh.status().message()));
    }
    if (fresh->header().created_unix_ns == mine.header().created_unix_ns) {
      continue;  // The same segment: the mapping is right as it is.
    }
    if (absl::Status s = RemapInPlace(ns, i, *fresh); !s.ok()) return s;
  }
  ns.id = resp.namespace_id();
  return absl::OkStatus();
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
    CloseFast();
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
      ConnectFast(session.fast_lookup_socket, fast_lookup);
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
    const absl::Status s = Reattach(*ns, session);
    absl::MutexLock lock(&ns->mu);
    if (s.ok()) {
      ns->stale_reason.clear();
      ns->epoch = next_epoch;
    } else {
      ns->stale_reason = std::string(s.message());
    }
  }
}

uint64_t WatchSessionEnd(const Reservation& r, std::function<void()> on_end) {
  if (r.ns_ == nullptr) {
    on_end();
    return 0;
  }
  Connection& c = *r.ns_->conn;
  {
    absl::MutexLock lock(&c.watch_mu);
    if (r.ns_->Current(r.epoch_)) {
      const uint64_t token = c.next_watch++;
      c.watches[token] = {r.epoch_, std::move(on_end)};
      return token;
    }
  }
  on_end();  // Ended already.
  return 0;
}

void UnwatchSessionEnd(const Reservation& r, uint64_t token) {
  if (r.ns_ == nullptr || token == 0) return;
  Connection& c = *r.ns_->conn;
  absl::MutexLock lock(&c.watch_mu);
  c.watches.erase(token);
}

}  // namespace client

using client::Connection;
using client::NamespaceState;

// ------------------------------------------------------------------ Lease --

Lease::Lease(Lease&& o) noexcept { *this = std::move(o); }

Lease& Lease::operator=(Lease&& o) noexcept {
  if (this != &o) {
    if (lease_id_ != 0) (void)Release();
    ns_ = std::move(o.ns_);
    lease_id_ = std::exchange(o.lease_id_, 0);
    track_ = std::exchange(o.track_, 0);
    epoch_ = o.epoch_;
    matched_pages_ = o.matched_pages_;
    usable_pages_ = o.usable_pages_;
    rows_ = std::move(o.rows_);
    has_snapshot_ = o.has_snapshot_;
    snapshot_row_ = o.snapshot_row_;
    has_device_snapshot_ = o.has_device_snapshot_;
    device_snapshot_row_ = o.device_snapshot_row_;
  }
  return *this;
}

Lease::~Lease() {
  if (lease_id_ != 0) (void)Release();
}

absl::Status Lease::Release() {
  if (lease_id_ == 0) return absl::OkStatus();
  const uint64_t id = std::exchange(lease_id_, 0);
  const uint64_t hold = ns_->conn->tracker.Remove(std::exchange(track_, 0));
  if (!ns_->Current(epoch_)) {
    ns_->conn->ReleaseHold(hold);  // An earlier session's fence hold.
    return absl::OkStatus();
  }
  return ns_->ReleaseLease(epoch_, id);
}

void Lease::Track(std::string_view hashes) {
  if (lease_id_ == 0 || usable_pages_ == 0) return;
  const size_t hb = ns_->hasher->hash_bytes();
  std::string last;
  if (hashes.size() >= usable_pages_ * hb) {
    last = std::string(hashes.substr((usable_pages_ - 1) * hb, hb));
  }
  std::vector<uint32_t> snaps;
  if (has_snapshot_) snaps.push_back(snapshot_row_);
  track_ = ns_->Track(epoch_, rows_, std::move(snaps), std::move(last));
}

void Lease::ReleaseAfter(void* stream) {
  if (lease_id_ == 0) return;
  const uint64_t id = std::exchange(lease_id_, 0);
  const uint64_t track = std::exchange(track_, 0);
  auto ns = ns_;
  // If the callback cannot be queued, the pin is kept (and fenced when the
  // session ends): unpinning rows a copy may still read would be worse.
  ns->After(stream, [ns, id, track, epoch = epoch_](absl::Status queued) {
    if (queued.ok()) ns->LeaseDone(epoch, id, track);
  });
}

// ------------------------------------------------------------ Reservation --

Reservation::Reservation(Reservation&& o) noexcept { *this = std::move(o); }

Reservation& Reservation::operator=(Reservation&& o) noexcept {
  if (this != &o) {
    Drop();
    ns_ = std::move(o.ns_);
    id_ = std::exchange(o.id_, 0);
    track_ = std::exchange(o.track_, 0);
    epoch_ = o.epoch_;
    page_rows_ = std::move(o.page_rows_);
    snapshot_rows_ = std::move(o.snapshot_rows_);
    device_snapshot_rows_ = std::move(o.device_snapshot_rows_);
  }
  return *this;
}

Reservation::~Reservation() { Drop(); }

void Reservation::Drop() {
  if (id_ == 0) return;
  // Dropped without Commit or Abort: where copies into the rows may still be
  // queued (a GPU, a ReferenceStream), they stay fenced until the process
  // exits rather than go to another engine under the copies.
  if (client::CudaDevicePresent() || ReferenceStream::live_count() > 0) {
    ns_->ReservationAbandoned(epoch_, std::exchange(id_, 0),
                              std::exchange(track_, 0));
    return;
  }
  (void)Abort();
}

absl::StatusOr<CommitResult> Reservation::Commit(
    std::string_view parent_hash, std::string_view hashes,
    const std::vector<SnapshotPlacement>& snapshots,
    const std::vector<SnapshotPlacement>& device_snapshots) {
  if (id_ == 0) {
    return absl::FailedPreconditionError(
        "reservation: already committed or aborted");
  }
  auto result = ns_->CommitReservation(epoch_, id_, parent_hash, hashes,
                                       snapshots, device_snapshots);
  if (result.ok()) {
    id_ = 0;
    (void)ns_->conn->tracker.Remove(std::exchange(track_, 0));
  }
  return result;
}

std::future<absl::StatusOr<CommitResult>> Reservation::CommitAfter(
    void* stream, std::string parent_hash, std::string hashes,
    std::vector<SnapshotPlacement> snapshots) {
  auto promise = std::make_shared<std::promise<absl::StatusOr<CommitResult>>>();
  auto future = promise->get_future();
  if (id_ == 0) {
    promise->set_value(absl::FailedPreconditionError(
        "reservation: already committed or aborted"));
    return future;
  }
  const uint64_t id = std::exchange(id_, 0);
  const uint64_t track = std::exchange(track_, 0);
  auto ns = ns_;
  ns->After(stream, [ns, id, track, epoch = epoch_, promise,
                     parent = std::move(parent_hash), h = std::move(hashes),
                     s = std::move(snapshots)](absl::Status queued) {
    if (!queued.ok()) {
      // The copies may still run: fence the rows rather than free them.
      ns->ReservationAbandoned(epoch, id, track);
      promise->set_value(queued);
      return;
    }
    auto result = ns->CommitReservation(epoch, id, parent, h, s);
    if (result.ok()) {
      (void)ns->conn->tracker.Remove(track);
    } else {
      ns->ReservationDone(epoch, id, track);  // The copies are done.
    }
    promise->set_value(std::move(result));
  });
  return future;
}

uint32_t Reservation::hash_bytes() const {
  return ns_ == nullptr ? 0 : ns_->hasher->hash_bytes();
}

absl::Status Reservation::Abort() {
  if (id_ == 0) return absl::OkStatus();
  const uint64_t id = std::exchange(id_, 0);
  const uint64_t hold = ns_->conn->tracker.Remove(std::exchange(track_, 0));
  if (!ns_->Current(epoch_)) {
    ns_->conn->ReleaseHold(hold);  // An earlier session's fence hold.
    return absl::OkStatus();
  }
  return ns_->AbortReservation(epoch_, id);
}

void Reservation::AbortAfter(void* stream) {
  if (id_ == 0) return;
  const uint64_t id = std::exchange(id_, 0);
  const uint64_t track = std::exchange(track_, 0);
  auto ns = ns_;
  ns->After(stream, [ns, id, track, epoch = epoch_](absl::Status queued) {
    if (queued.ok()) {
      ns->ReservationDone(epoch, id, track);
    } else {
      ns->ReservationAbandoned(epoch, id, track);
    }
  });
}

// -------------------------------------------------------------- Namespace --

Namespace::Namespace(std::shared_ptr<NamespaceState> state)
    : state_(std::move(state)) {}
Namespace::~Namespace() = default;

uint64_t Namespace::id() const { return state_->id.load(); }
const std::string& Namespace::name() const { return state_->name; }
const Layout& Namespace::layout() const { return state_->layout; }
uint32_t Namespace::tp_rank() const { return state_->tp_rank; }
bool Namespace::created() const { return state_->created; }
bool Namespace::cuda_registered() const { return state_->registered; }
const BlockHasher& Namespace::hasher() const { return *state_->hasher; }
const std::vector<BankMapping>& Namespace::page_banks() const {
  return state_->page_banks;
}
const BankMapping* Namespace::snapshot_bank() const {
  return state_->snapshot_bank ? &*state_->snapshot_bank : nullptr;
}
double Namespace::map_seconds() const { return state_->map_seconds; }
double Namespace::register_seconds() const { return state_->register_seconds; }
const std::vector<DevicePoolInfo>& Namespace::device_pools() const {
  return state_->device_pools;
}
bool Namespace::device_pools_valid() const {
  return !state_->device_pools.empty() && state_->Current(state_->device_epoch);
}

absl::StatusOr<Lease> Namespace::LookupWithDevice(std::string_view hashes,
                                                  uint32_t device_pool,
                                                  bool pin) {
  if (device_pool >= state_->device_pools.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("device_pool: ", device_pool, " but the daemon reported ",
                     state_->device_pools.size(), " device pools"));
  }
  Lease miss;
  miss.ns_ = state_;
  v1::LookupRequest req;
  uint64_t epoch = 0;
  if (!state_->Fill(&req, &epoch)) return miss;
  // A later daemon session's pools are other allocations: ask the host only.
  if (epoch != state_->device_epoch) return Lookup(hashes, pin);
  req.set_hashes(std::string(hashes));
  req.set_pin(pin);
  req.set_device_pool(device_pool);
  v1::LookupResponse resp;
  grpc::ClientContext ctx;
  state_->conn->Deadline(&ctx);
  if (absl::Status s = client::FromGrpc(
          state_->conn->stub->Lookup(&ctx, req, &resp), "Lookup");
      !s.ok()) {
    if (client::OutageLike(s) || !state_->Current(epoch)) return miss;
    return s;
  }
  if (!state_->Current(epoch)) return miss;
  Lease lease;
  lease.ns_ = state_;
  lease.lease_id_ = resp.lease_id();
  lease.epoch_ = epoch;
  lease.matched_pages_ = resp.matched_pages();
  lease.usable_pages_ = resp.usable_pages();
  lease.rows_.assign(resp.rows().begin(), resp.rows().end());
  lease.has_snapshot_ = resp.has_snapshot();
  lease.snapshot_row_ = resp.snapshot_row();
  lease.has_device_snapshot_ = resp.has_device_snapshot();
  lease.device_snapshot_row_ = resp.device_snapshot_row();
  lease.Track(hashes);
  return lease;
}

absl::StatusOr<Lease> Namespace::Lookup(std::string_view hashes, bool pin) {
  // During an outage (or when the answer came from a session that ended
  // meanwhile, whose pin is void) the engine gets a miss: it recomputes.
  Lease miss;
  miss.ns_ = state_;
  v1::LookupRequest req;
  uint64_t epoch = 0;
  if (!state_->Fill(&req, &epoch)) return miss;
  {
    absl::Status status;
    fastpath::Reply reply;
    Lease lease;
    if (state_->conn->FastLookup(req.namespace_id(), hashes, pin, &status,
                                 &reply, &lease.rows_)) {
      if (!state_->Current(epoch)) return miss;
      if (!status.ok()) {
        if (client::OutageLike(status)) return miss;
        return status;
      }
      lease.ns_ = state_;
      lease.lease_id_ = reply.lease_id;
      lease.epoch_ = epoch;
      lease.matched_pages_ = reply.matched_pages;
      lease.usable_pages_ = reply.usable_pages;
      lease.has_snapshot_ = reply.has_snapshot != 0;
      lease.snapshot_row_ = reply.snapshot_row;
      lease.Track(hashes);
      return lease;
    }
  }
  req.set_hashes(std::string(hashes));
  req.set_pin(pin);
  v1::LookupResponse resp;
  grpc::ClientContext ctx;
  state_->conn->Deadline(&ctx);
  if (absl::Status s = client::FromGrpc(
          state_->conn->stub->Lookup(&ctx, req, &resp), "Lookup");
      !s.ok()) {
    if (client::OutageLike(s) || !state_->Current(epoch)) return miss;
    return s;
  }
  if (!state_->Current(epoch)) return miss;
  Lease lease;
  lease.ns_ = state_;
  lease.lease_id_ = resp.lease_id();
  lease.epoch_ = epoch;
  lease.matched_pages_ = resp.matched_pages();
  lease.usable_pages_ = resp.usable_pages();
  lease.rows_.assign(resp.rows().begin(), resp.rows().end());
  lease.has_snapshot_ = resp.has_snapshot();
  lease.snapshot_row_ = resp.snapshot_row();
  lease.Track(hashes);
  return lease;
}

absl::StatusOr<Reservation> Namespace::Reserve(uint32_t pages,
                                               uint32_t snapshots,
                                               uint32_t device_snapshots,
                                               uint32_t device_pool) {
  v1::ReserveRequest req;
  uint64_t epoch = 0;
  if (!state_->Fill(&req, &epoch)) return state_->Unusable("Reserve");
  if (device_snapshots > 0 && epoch != state_->device_epoch) {
    return absl::UnavailableError(
        "Reserve: device_snapshots: the daemon session that exported the "
        "device pools ended (the daemon stopped or restarted); attach again");
  }
  req.set_pages(pages);
  req.set_snapshots(snapshots);
  req.set_device_snapshots(device_snapshots);
  req.set_device_pool(device_pool);
  v1::ReserveResponse resp;
  grpc::ClientContext ctx;
  state_->conn->Deadline(&ctx);
  if (absl::Status s = client::FromGrpc(
          state_->conn->stub->Reserve(&ctx, req, &resp), "Reserve");
      !s.ok()) {
    if (client::OutageLike(s) || !state_->Current(epoch)) {
      return client::Unreachable("Reserve");
    }
    return s;
  }
  // Rows of a session that ended during the call are void.
  if (!state_->Current(epoch)) return client::Unreachable("Reserve");
  Reservation r;
  r.ns_ = state_;
  r.id_ = resp.reservation_id();
  r.epoch_ = epoch;
  r.page_rows_.assign(resp.page_rows().begin(), resp.page_rows().end());
  r.snapshot_rows_.assign(resp.snapshot_rows().begin(),
                          resp.snapshot_rows().end());
  r.device_snapshot_rows_.assign(resp.device_snapshot_rows().begin(),
                                 resp.device_snapshot_rows().end());
  r.track_ = state_->Track(epoch, r.page_rows_, r.snapshot_rows_, "");
  return r;
}

absl::StatusOr<CommitResult> Namespace::AdoptMirror(
    const Reservation& mirror, absl::Span<const uint32_t> mirror_indices,
    std::string_view parent_hash, std::string_view hashes) {
  if (mirror.id() == 0 || mirror.ns_ != state_) {
    return absl::InvalidArgumentError(
        "AdoptMirror: mirror: not a live reservation of this namespace");
  }
  v1::CommitRequest req;
  uint64_t epoch = 0;
  if (!state_->Fill(&req, &epoch)) return state_->Unusable("AdoptMirror");
  if (epoch != mirror.epoch_) {
    return absl::UnavailableError(
        "AdoptMirror: the mirror belongs to a daemon session that ended (the "
        "daemon restarted): its rows are void");
  }
  req.set_reservation_id(mirror.id());
  req.mutable_mirror_indices()->Assign(mirror_indices.begin(),
                                       mirror_indices.end());
  req.set_parent_hash(std::string(parent_hash));
  req.set_hashes(std::string(hashes));
  v1::CommitResponse resp;
  grpc::ClientContext ctx;
  state_->conn->Deadline(&ctx);
  if (absl::Status s = client::FromGrpc(
          state_->conn->stub->Commit(&ctx, req, &resp), "AdoptMirror");
      !s.ok()) {
    if (client::OutageLike(s) || !state_->Current(epoch)) {
      return client::Unreachable("AdoptMirror");
    }
    return s;
  }
  CommitResult r;
  r.committed_pages = resp.committed_pages();
  r.deduplicated_pages = resp.deduplicated_pages();
  return r;
}

absl::StatusOr<std::unique_ptr<client::TransferEngine>>
Namespace::CreateTransferEngine(client::Backend backend,
                                const GpuPoolDescriptor& pool,
                                uint32_t max_ctas) const {
  std::vector<std::pair<std::string, client::HostBankView>> banks;
  for (const auto& b : state_->page_banks) {
    banks.emplace_back(
        b.name, client::HostBankView{reinterpret_cast<uint64_t>(b.base), b.rows,
                                     b.row_bytes, b.row_stride});
  }
  std::optional<client::HostBankView> snap;
  if (state_->snapshot_bank) {
    const auto& b = *state_->snapshot_bank;
    snap = client::HostBankView{reinterpret_cast<uint64_t>(b.base), b.rows,
                                b.row_bytes, b.row_stride};
  }
  if (backend == client::Backend::kCuda && !state_->registered) {
    return absl::FailedPreconditionError(
        "the namespace's banks are not registered with CUDA (no device at "
        "attach, or register_with_cuda was false)");
  }
  client::TransferOptions options;
  if (max_ctas != 0) options.max_ctas = max_ctas;
  return client::TransferEngine::Create(backend, pool, std::move(banks), snap,
                                        options);
}

// ----------------------------------------------------------------- Client --

Client::Client(std::shared_ptr<Connection> connection)
    : connection_(std::move(connection)) {}

Client::~Client() = default;

uint64_t Client::session_id() const { return connection_->session_id.load(); }
const std::string& Client::socket() const { return connection_->socket; }
bool Client::session_alive() const { return connection_->alive.load(); }
bool Client::fast_lookup_active() const {
  absl::MutexLock lock(&connection_->fast_mu);
  return connection_->fast_fd >= 0;
}

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(
    const ConnectOptions& options) {
  auto conn = std::make_shared<Connection>();
  conn->socket = ResolveClientSocket(options.socket);
  conn->timeout = options.timeout;
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  // Each Client is its own connection, as each engine process is.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  // A restarted daemon is found again within ~a second, not gRPC's default
  // backoff of up to two minutes.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  conn->client_name = options.client_name;
  if (!options.instance_id.empty() && options.instance_id.size() != 16) {
    return absl::InvalidArgumentError(
        absl::StrCat("instance_id: must be empty or 16 bytes, got ",
                     options.instance_id.size()));
  }
  conn->instance_id = options.instance_id;
  {
    absl::BitGen gen;
    do {
      conn->connection_id = absl::Uniform<uint64_t>(gen);
    } while (conn->connection_id == 0);
  }
  if (conn->instance_id.empty()) {
    absl::BitGen gen;
    conn->instance_id.resize(16);
    for (char& c : conn->instance_id) {
      c = static_cast<char>(absl::Uniform<uint8_t>(gen));
    }
  }
  conn->fast_lookup = options.fast_lookup;
  conn->reconnect = options.reconnect;
  conn->channel = grpc::CreateCustomChannel(
      "unix:" + conn->socket, grpc::InsecureChannelCredentials(), args);
  if (!conn->channel->WaitForConnected(
          absl::ToChronoTime(absl::Now() + options.timeout))) {
    return absl::UnavailableError(absl::StrCat(
        "cannot connect to kvtierd at unix:", conn->socket,
        " (is the daemon running? set --socket or $KVTIER_SOCKET)"));
  }
  // Who answered: the socket's owner is the daemon, if its folder is one
  // nobody else could have put a socket in (shm/trusted_path.h).
  auto daemon_uid = shm::CheckDaemonSocket(conn->socket);
  if (!daemon_uid.ok()) return daemon_uid.status();
  conn->daemon_uid = *daemon_uid;
  conn->stub = v1::TierService::NewStub(conn->channel);
  auto session = conn->OpenSession();
  if (!session.ok()) return session.status();
  conn->session_id = session->id;
  conn->ConnectFast(session->fast_lookup_socket, options.fast_lookup);
  conn->epoch = 1;
  conn->alive = true;
  Connection* raw = conn.get();
  conn->session_thread =
      std::thread([raw, first = *std::move(session)]() mutable {
        raw->KeepSession(std::move(first));
      });
  return std::unique_ptr<Client>(new Client(std::move(conn)));
}

absl::StatusOr<std::unique_ptr<Namespace>> Client::Attach(
    const AttachOptions& options) {
  v1::AttachRequest req;
  req.set_api_version(1);
  req.set_namespace_(options.name);
  v1::Layout* l = req.mutable_layout();
  l->set_model(options.layout.model);
  l->set_tokens_per_page(options.layout.tokens_per_page);
  l->set_num_layers(options.layout.num_layers);
  for (const auto& b : options.layout.page_banks) {
    auto* pb = l->add_page_banks();
    pb->set_name(b.name);
    pb->set_row_bytes(b.row_bytes);
    pb->set_dtype(b.dtype);
  }
  l->set_snapshot_row_bytes(options.layout.snapshot_row_bytes);
  l->set_tp_size(options.layout.tp_size);
  l->set_replicated(options.layout.replicated);
  l->set_hash_kind(static_cast<v1::HashKind>(options.layout.hash_kind));
  req.set_tp_rank(options.tp_rank);
  req.mutable_capacity()->set_page_rows(options.capacity.page_rows);
  req.mutable_capacity()->set_snapshot_rows(options.capacity.snapshot_rows);
  req.mutable_capacity()->set_max_replay_tokens(
      options.capacity.max_replay_tokens);
  req.set_tenant_salt(options.tenant_salt);
  const v1::AttachRequest replay = req;  // Without a session.
  const uint64_t epoch = connection_->epoch.load();
  if (!connection_->alive.load()) return client::Unreachable("Attach");
  req.set_session_id(connection_->session_id.load());
  if (!connection_->alive.load() || connection_->epoch.load() != epoch) {
    return client::Unreachable("Attach");
  }
  v1::AttachResponse resp;
  grpc::ClientContext ctx;
  connection_->AttachDeadline(&ctx);
  if (absl::Status s = client::FromGrpc(
          connection_->stub->Attach(&ctx, req, &resp), "Attach");
      !s.ok()) {
    return connection_->ExplainAttach(std::move(s));
  }

  auto state = std::make_shared<NamespaceState>();
  state->conn = connection_;
  state->id = resp.namespace_id();
  state->epoch = epoch;
  state->attach_request = replay;
  state->name = options.name;
  state->layout = options.layout;
  state->tp_rank = options.tp_rank;
  state->created = resp.created();
  state->device_epoch = epoch;
  for (const auto& p : resp.device_pools()) {
    DevicePoolInfo info;
    info.device_ordinal = p.device_ordinal();
    info.pci_bus_id = p.pci_bus_id();
    info.ipc_handle = p.ipc_handle();
    info.rows = p.rows();
    info.row_bytes = p.row_bytes();
    info.row_stride = p.row_stride();
    info.withheld = p.withheld();
    state->device_pools.push_back(std::move(info));
  }
  auto hasher = BlockHasher::Create(options.layout.hash_kind, resp.hash_seed(),
                                    options.layout.tokens_per_page);
  if (!hasher.ok()) return hasher.status();
  state->hasher.emplace(*std::move(hasher));

  const absl::Time map_start = absl::Now();
  for (const auto& seg : resp.segments()) {
    auto mapped = shm::Segment::Open(seg.path(), connection_->daemon_uid);
    if (!mapped.ok()) {
      return absl::Status(mapped.status().code(),
                          absl::StrCat("mapping bank '", seg.bank(),
                                       "': ", mapped.status().message()));
    }
    if (mapped->rows() != seg.rows() ||
        mapped->row_bytes() != seg.row_bytes()) {
      return absl::DataLossError(
          absl::StrCat("bank '", seg.bank(), "' at ", seg.path(),
                       ": header disagrees with the daemon (rows ",
                       mapped->rows(), " vs ", seg.rows(), ")"));
    }
    BankMapping m;
    m.name = seg.bank();
    m.base = mapped->row(0);
    m.rows = mapped->rows();
    m.row_bytes = mapped->row_bytes();
    m.row_stride = mapped->row_stride();
    m.huge_pages = mapped->huge_pages();
    m.path = seg.path();
    if (seg.bank() == "snapshot") {
      state->snapshot_bank = m;
    } else {
      state->page_banks.push_back(m);
    }
    state->segments.push_back(
        std::make_unique<shm::Segment>(*std::move(mapped)));
  }
  state->map_seconds = absl::ToDoubleSeconds(absl::Now() - map_start);

  if (options.register_with_cuda && client::CudaDevicePresent()) {
    const absl::Time reg_start = absl::Now();
    for (size_t i = 0; i < state->segments.size(); ++i) {
      const auto& seg = state->segments[i];
      if (absl::Status s =
              client::RegisterHostRange(seg->base(), seg->file_bytes());
          !s.ok()) {
        for (size_t j = 0; j < i; ++j) {
          client::UnregisterHostRange(state->segments[j]->base(),
                                      state->segments[j]->file_bytes());
        }
        return absl::Status(
            s.code(), absl::StrCat("registering bank at ", seg->path(), ": ",
                                   s.message()));
      }
    }
    state->registered = true;
    state->register_seconds = absl::ToDoubleSeconds(absl::Now() - reg_start);
    for (auto& b : state->page_banks) b.cuda_registered = true;
    if (state->snapshot_bank) state->snapshot_bank->cuda_registered = true;
  }
  {
    absl::MutexLock lock(&connection_->mu);
    connection_->namespaces.push_back(state);
  }
  // A session that ended during the attach may have been replaced without
  // this namespace: its id would be the dead session's.
  if (!state->Current(epoch)) return client::Unreachable("Attach");
  return std::unique_ptr<Namespace>(new Namespace(std::move(state)));
}

absl::StatusOr<DropResult> Client::Drop(const std::string& name,
                                        std::string_view hash, bool force) {
  if (!connection_->alive.load()) return client::Unreachable("Drop");
  v1::DropRequest req;
  req.set_api_version(1);
  req.set_namespace_(name);
  req.set_hash(std::string(hash));
  req.set_force(force);
  // The session's bound credentials carry the right to drop namespaces
  // under --namespace_acl (docs/operations.md, "Security model").
  req.set_session_id(connection_->session_id.load());
  v1::DropResponse resp;
  grpc::ClientContext ctx;
  connection_->Deadline(&ctx);
  if (absl::Status s =
          client::FromGrpc(connection_->stub->Drop(&ctx, req, &resp), "Drop");
      !s.ok()) {
    return s;
  }
  return DropResult{resp.dropped_pages(), resp.dropped_snapshots()};
}

}  // namespace kvtier
