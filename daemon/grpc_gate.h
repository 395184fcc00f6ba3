// GrpcGate: kvtierd's own acceptor for its gRPC socket, so that each uid's
// connections can be capped (issue 27, item 5).
//
// gRPC 1.51 accepts on its own listener and tells nobody who connected, so
// any member of --group could open connections until the daemon ran out of
// file descriptors, and then no engine of any uid got in (the engine socket
// cannot accept without fds either, and gRPC's listener stops for good at
// EMFILE). So the gate listens instead, reads each new connection's
// SO_PEERCRED and hands the connection to the gRPC server
// (grpc::AddInsecureChannelFromFd) once the client has sent the HTTP/2
// connection preface:
//
// - A uid holding max_connections_per_uid connections (waiting for their
//   preface or served), or a server holding max_connections, has a new
//   connection closed at accept; a gRPC client sees UNAVAILABLE.
// - The 24-byte preface must arrive within preface_deadline of the accept,
//   else the connection is closed (gRPC's own handshake deadline applies only
//   to connections its listener accepted). Until then a connection costs an
//   fd, no gRPC state.
// - A served connection counts until it ends. The gate keeps a duplicate of
//   its fd and watches it for the hang-up that both the peer's close and
//   gRPC's cause (gRPC shuts a socket down before it closes it).
// - Out of fds in accept, the oldest connection still waiting for its
//   preface is closed to make room; with none, the new one is shed with a
//   reserve fd.
//
// Idle served connections are gRPC's to close: GRPC_ARG_MAX_CONNECTION_IDLE_MS
// (daemon/server_limits.h) applies to these channels as to any. Closes are
// counted in the process-wide metrics (kvtier_grpc_connections_closed_total)
// and refusals logged at most once per 10 s.
//
// Thread-safety: Start and Stop from one thread; the gate's thread owns the
// connection state; connections() is thread-safe.
#ifndef KVTIER_DAEMON_GRPC_GATE_H_
#define KVTIER_DAEMON_GRPC_GATE_H_

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <list>
#include <optional>
#include <string>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "daemon/metrics.h"

namespace grpc {
class Server;
}  // namespace grpc

namespace kvtier::daemon {

// Limits of the gRPC socket's connections (kvtierd's --grpc_* flags).
struct GrpcGateOptions {
  // How long a new connection may take to send the HTTP/2 preface.
  absl::Duration preface_deadline = absl::Seconds(10);
  // Most connections at once, in all and per uid (waiting for their preface
  // or served). At least 1.
  int max_connections = 4096;
  int max_connections_per_uid = 64;
};

class GrpcGate {
 public:
  // REQUIRES: `server` was built without listening ports of its own and
  // outlives this gate (Stop before shutting it down).
  GrpcGate(grpc::Server* server, const GrpcGateOptions& options);
  ~GrpcGate();  // Stops.
  GrpcGate(const GrpcGate&) = delete;
  GrpcGate& operator=(const GrpcGate&) = delete;

  // Listens on unix socket `path` (created by bind(2): the umask decides its
  // mode, the caller its group and mode after) and starts the gate's thread.
  // INVALID_ARGUMENT for a path too long, FAILED_PRECONDITION when it cannot
  // be bound. REQUIRES: not started.
  absl::Status Start(const std::string& path);
  // Stops accepting, closes the connections waiting for their preface and
  // stops watching the served ones (gRPC keeps serving those until the
  // server shuts down). Idempotent.
  void Stop();

  // Connections counted now (waiting or served).
  int connections() const { return total_.load(std::memory_order_relaxed); }

 private:
  using Clock = std::chrono::steady_clock;
  struct Conn {
    int fd = -1;  // Waiting: the socket. Served: the gate's duplicate.
    uid_t uid = 0;
    bool served = false;
    Clock::time_point deadline;           // Waiting only.
    std::list<uint64_t>::iterator order;  // In waiting_ (waiting only).
  };

  // The gate's thread: epoll over the listener, the wake eventfd and the
  // connections, until Stop.
  void Loop();
  // Accepts what the listener holds (bounded per call).
  void AcceptReady();
  // Out of fds in accept: closes the oldest waiting connection, else sheds
  // the new one with the reserve fd, else pauses accepting.
  void OnFdsExhausted(int err);
  // An event on connection `seq`: reads a waiting one's preface (handing it
  // over once whole), forgets a served one that hung up.
  void OnEvent(uint64_t seq);
  // Hands waiting connection `seq` to the gRPC server.
  void HandOver(uint64_t seq);
  // Forgets connection `seq` and closes the gate's fd of it, counting `why`.
  void Close(uint64_t seq, std::optional<GrpcClose> why);
  // Counts a refusal of `uid` at its cap (`uid_cap`) or the socket's and
  // logs the refusals at most once per interval.
  void LogRefusal(uid_t uid, bool uid_cap);
  // Milliseconds until the next preface deadline or accept resumption, -1
  // for none.
  int NextTimeoutMs(Clock::time_point now) const;

  grpc::Server* const server_;
  const GrpcGateOptions options_;
  std::string path_;
  int listen_fd_ = -1;
  int epoll_fd_ = -1;
  int wake_fd_ = -1;
  std::thread thread_;

  // The gate's thread's alone.
  absl::flat_hash_map<uint64_t, Conn> conns_;
  std::list<uint64_t> waiting_;  // Oldest first (so by deadline).
  absl::flat_hash_map<uid_t, int> per_uid_;
  uint64_t next_seq_ = 1;
  int reserve_fd_ = -1;
  bool accept_paused_ = false;
  Clock::time_point accept_resume_;
  Clock::time_point last_log_{};
  uint64_t refusals_ = 0;  // Since the last log line.

  std::atomic<int> total_{0};
};

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_GRPC_GATE_H_
