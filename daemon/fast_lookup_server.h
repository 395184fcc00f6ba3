// FastLookupServer: serves the engine protocol (common/fast_lookup.h) on the
// engine socket (<socket>.lookup) beside gRPC: the sessions libkvtier opens
// there, their lookups and every other engine call. A connection's first
// frame binds the peer's SO_PEERCRED to its session: this socket is how the
// daemon learns who an engine is (daemon/peer_credentials.h), so it must stay
// reachable for engines however other members of the socket's group abuse
// it.
//
// Two stages. Until its Hello arrives a connection is *pending*: it costs an
// fd and a few dozen bytes, no thread. One acceptor thread accepts and waits
// for every pending connection's Hello in one epoll loop, for at most
// FastLookupOptions::hello_deadline, after which the connection is closed.
// Pending connections count against their peer's uid (SO_PEERCRED at
// accept): a uid at max_pending_per_uid loses its OLDEST pending connection
// to make room for the new one. So a flood of silent connections from any
// uid, the engine's own included, delays an engine's Hello (sent right after
// connect, usually there before the accept) by at most the deadline, and
// exhausts neither threads nor the served-connection cap. A client whose
// pending connection was closed sees EOF and connects again.
//
// Only a well-formed first frame (magic, version) gets the connection a
// serving thread (daemon/fast_lookup_serve.cc): for an Open, that thread
// reads the rest of the first frame (its v1.Hello) by the same deadline,
// opens the session, binds the credentials and then reads the session's
// control frames until the connection ends, which closes the session; for a
// Hello it binds the credentials to the named session
// (TierCore::BindPeerCredentials, which may wait on the core's lock, never
// on the acceptor) and then blocks in read() and answers each lookup with
// TierCore::LookupHashes and each call with RunEngineCall
// (daemon/engine_calls.h): no HTTP/2, no thread hand-off. Engines are few per
// node (one per GPU, a Client each), so a thread each is cheap; served
// connections are capped in all and per uid, and one past a cap is answered
// RESOURCE_EXHAUSTED and closed (logged, rate-limited). A request's hash buffer
// grows only as its bytes arrive, up to max_request_bytes, and is given back
// after a large request.
//
// Deadlines keep a served connection's thread from being held by a peer
// that says nothing or says it slowly: a call connection with no request
// for idle_timeout is closed (libkvtier dials again on its next call); a
// session connection is never idle-closed, since its session lives as long
// as it does. Once a frame's first byte arrives, the whole frame (header
// and payload) must arrive within frame_deadline, however steadily its
// bytes trickle. Sessions bound on this socket are capped per uid
// (max_sessions_per_uid; daemon/uid_sessions.h): past it an Open is answered
// RESOURCE_EXHAUSTED naming --max_sessions_per_uid, and so is a Hello that
// would bind another session to that uid.
//
// Running out of fds (EMFILE/ENFILE) in accept closes the oldest pending
// connection to make room; with none pending it sheds the new connection
// with a reserve fd (so the acceptor does not spin on a listen socket it
// cannot drain) or, without one, pauses accepting briefly; logged at most
// once per interval. Closes are counted in the process-wide metrics
// (daemon/metrics.h, kvtier_fast_lookup_connections_closed_total).
//
// Thread-safety: Start and Stop from one thread; the acceptor and serving
// threads are internal. The pending-connection state is the acceptor
// thread's alone.
#ifndef KVTIER_DAEMON_FAST_LOOKUP_SERVER_H_
#define KVTIER_DAEMON_FAST_LOOKUP_SERVER_H_

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <list>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/fast_lookup.h"
#include "daemon/metrics.h"
#include "daemon/tier_core.h"
#include "daemon/uid_sessions.h"

namespace kvtier::daemon {

// Limits of the fast lookup socket (kvtierd's --fast_lookup_* flags).
struct FastLookupOptions {
  // How long a new connection may take to send its Hello.
  absl::Duration hello_deadline = absl::Seconds(1);
  // Most connections awaiting their Hello from one uid; a new one closes
  // that uid's oldest. At least 1.
  int max_pending_per_uid = 32;
  // Most connections awaiting their Hello in all; a new one closes the
  // oldest. At least 1.
  int max_pending = 4096;
  // Most connections being served (Hello accepted) at once, in all and per
  // uid; beyond, a Hello is answered RESOURCE_EXHAUSTED.
  int max_connections = 1024;
  int max_connections_per_uid = 256;
  // Largest request (bytes of hashes) a connection may send; a larger one is
  // read, dropped and answered RESOURCE_EXHAUSTED. At most
  // fastpath::kMaxRequestBytes.
  uint32_t max_request_bytes = fastpath::kMaxRequestBytes;
  // Largest call (bytes of a protobuf request, and of a response) a
  // connection may send; a larger one is read, dropped and answered
  // RESOURCE_EXHAUSTED. At most fastpath::kMaxCallBytes.
  uint32_t max_call_bytes = 64u << 20;
  // Most bytes of requests (calls and lookups) held at once for all
  // connections; a request past it is read, dropped and answered
  // RESOURCE_EXHAUSTED (kvtierd: --grpc_memory_quota_bytes, the gRPC
  // server's own bound).
  uint64_t max_inflight_bytes = 4ull << 30;
  // A call connection that sends no request for this long is closed.
  // absl::InfiniteDuration(): never. Session connections never are.
  absl::Duration idle_timeout = absl::Minutes(5);
  // Once a frame's first byte has arrived, the rest of it (header and
  // payload) must arrive within this, else the connection is closed.
  // (A first frame, an Open's v1.Hello included, has hello_deadline from
  // the connect.)
  absl::Duration frame_deadline = absl::Seconds(10);
  // Most sessions one uid may hold bound on this socket (opened here, or
  // opened over gRPC and bound by a call connection's Hello). At least 1.
  int max_sessions_per_uid = 128;
};

class FastLookupServer {
 public:
  // REQUIRES: `core` outlives this server.
  explicit FastLookupServer(TierCore* core)
      : FastLookupServer(core, FastLookupOptions()) {}
  FastLookupServer(TierCore* core, const FastLookupOptions& options);
  ~FastLookupServer();  // Stops.
  FastLookupServer(const FastLookupServer&) = delete;
  FastLookupServer& operator=(const FastLookupServer&) = delete;

  // Listens on `path` (a stale socket file is replaced; mode 0660, owned by
  // `group` unless it is -1, both set before the socket appears there:
  // daemon/socket_staging.h) and starts the acceptor. REQUIRES: not started.
  absl::Status Start(const std::string& path,
                     gid_t group = static_cast<gid_t>(-1));
  // Closes the listener and every connection and waits for their threads.
  // Idempotent.
  void Stop();

  // Sends the Draining frame to every open session connection: the daemon
  // is stopping, so engines finish what they do and reconnect to the next
  // daemon. Call before Stop.
  void DrainSessions();

  // Connections being served now (for tests).
  int served_connections() const;

 private:
  using Clock = std::chrono::steady_clock;
  // A connection awaiting its Hello.
  struct Pending {
    int fd = -1;
    uid_t uid = 0;
    Clock::time_point deadline;
    size_t got = 0;  // Bytes of `hello` read so far.
    fastpath::Hello hello;
    std::list<uint64_t>::iterator order_pos;  // In order_.
    std::list<uint64_t>::iterator uid_pos;    // In by_uid_[uid].
  };
  // The acceptor thread: epoll over the listener, the wake eventfd and the
  // pending connections, until Stop.
  void AcceptLoop();
  // Accepts what the listener holds (bounded per call).
  void AcceptReady();
  // Out of fds in accept: closes the oldest pending connection, else sheds
  // the new one with the reserve fd, else pauses accepting; logs at most
  // once per interval.
  void OnFdsExhausted(int err);
  // Reads what has arrived of pending connection `seq`'s Hello; at a full
  // Hello, hands it to a serving thread or refuses it.
  void ReadHello(uint64_t seq);
  // Forgets pending connection `seq` and closes its fd, counting `why` (none:
  // the peer left, or the server stops).
  void ClosePending(uint64_t seq, std::optional<FastLookupClose> why);
  // Forgets pending connection `seq` (its fd stays open); returns it.
  Pending TakePending(uint64_t seq);
  // Milliseconds until the next pending deadline or accept resumption, -1
  // for none.
  int NextTimeoutMs(Clock::time_point now) const;
  // The serving thread of connection `id` on `fd`, whose first frame is
  // `first` (a Hello or an Open) and must be whole by `first_end`; closes
  // `fd` at the end.
  void Serve(uint64_t id, int fd, uid_t uid, fastpath::Hello first,
             Clock::time_point first_end);
  // A session connection: reads the v1.Hello after `open` by `open_end`,
  // opens and binds the session, answers, then reads Control frames until
  // the connection ends and closes the session.
  void ServeSession(int fd, uid_t uid, const fastpath::Open& open,
                    Clock::time_point open_end);
  // A call connection: binds the peer to session `hello.session_id`, then
  // answers lookups and calls until the connection ends, breaks framing,
  // stays idle for options_.idle_timeout or sends a frame too slowly.
  void ServeCalls(int fd, uid_t uid, const fastpath::Hello& hello);
  // Reads a frame's `bytes`-byte header into `header`: waits for its first
  // bytes as long as fd's SO_RCVTIMEO allows (none: forever), then for the
  // rest until options_.frame_deadline after them, the end it sets in
  // *frame_end for the frame's payload too. False when the connection
  // ended, counting a close for a passed deadline (FastLookupClose::kIdle,
  // kFrameDeadline).
  bool ReadHeader(int fd, void* header, size_t bytes,
                  Clock::time_point* frame_end) const;
  // Reads `bytes` bytes into *buf by `end`, growing it only as they arrive
  // (a header that claims a large payload costs nothing until it is sent).
  // False when the connection broke or `end` passed (errno ETIMEDOUT).
  static bool ReadPayload(int fd, uint32_t bytes, Clock::time_point end,
                          std::string* buf);
  // Reads a request's `bytes` bytes into *payload by `end`; when they
  // exceed `limit` or did not fit in the in-flight budget (!`fits`), reads
  // and drops them instead and sets *refused (RESOURCE_EXHAUSTED for
  // `what`), else OK. False: the connection broke or `end` passed (counted
  // as FastLookupClose::kFrameDeadline).
  static bool TakePayload(int fd, uint32_t bytes, uint32_t limit, bool fits,
                          Clock::time_point end, const char* what,
                          std::string* payload, absl::Status* refused);
  // Reads and drops `bytes` bytes (a refused request's) by `end`.
  static bool Discard(int fd, uint32_t bytes, Clock::time_point end);
  // A request's share of max_inflight_bytes, held while it is read and
  // answered; !ok() when it does not fit (and then holds nothing).
  class PayloadBudget {
   public:
    PayloadBudget(FastLookupServer* server, uint64_t bytes);
    ~PayloadBudget();
    PayloadBudget(const PayloadBudget&) = delete;
    PayloadBudget& operator=(const PayloadBudget&) = delete;
    bool ok() const { return ok_; }

   private:
    FastLookupServer* const server_;
    uint64_t bytes_;
    bool ok_ = true;
  };
  // Joins the threads of connections that ended.
  void ReapFinished();

  TierCore* const core_;
  const FastLookupOptions options_;
  std::string path_;
  int listen_fd_ = -1;
  int epoll_fd_ = -1;
  int wake_fd_ = -1;  // eventfd: Stop wakes the acceptor.
  std::thread acceptor_;

  // The acceptor thread's alone.
  absl::flat_hash_map<uint64_t, Pending> pending_;
  std::list<uint64_t> order_;  // Pending connections, oldest first.
  absl::flat_hash_map<uid_t, std::list<uint64_t>> by_uid_;  // Oldest first.
  uint64_t next_seq_ = 1;
  int reserve_fd_ = -1;  // Closed to shed a connection when out of fds.
  bool accept_paused_ = false;
  Clock::time_point accept_resume_;
  Clock::time_point last_fd_log_{};
  uint64_t fd_refusals_ = 0;  // Since the last log line.
  Clock::time_point last_cap_log_{};
  uint64_t cap_refusals_ = 0;  // Since the last log line.

  // Bytes of requests held now (PayloadBudget).
  std::atomic<uint64_t> inflight_bytes_{0};
  // The sessions each uid holds bound here.
  UidSessions uid_sessions_;

  mutable absl::Mutex mu_;
  absl::flat_hash_set<int> connections_ ABSL_GUARDED_BY(mu_);  // Served fds.
  // Session connections that have their OpenReply (DrainSessions).
  absl::flat_hash_set<int> sessions_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uid_t, int> served_per_uid_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, std::thread> threads_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> finished_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_FAST_LOOKUP_SERVER_H_
