// EngineLink: a Client's call connections to kvtierd's engine socket
// (common/fast_lookup.h): a small pool of connections bound to the current
// session, over which lookups (binary frames) and every other call (protobuf
// requests in call frames) travel. libkvtier speaks no gRPC.
//
// A caller takes a connection from the pool (dialling one, with its Hello,
// when none is idle and fewer than kMaxConnections are open), runs one
// request on it and gives it back. Every read and write carries the call's
// deadline (SO_RCVTIMEO and SO_SNDTIMEO); a connection that failed or timed
// out mid-call is closed, never reused, so replies never cross. An idle
// connection the daemon closed (kvtierd --fast_lookup_idle_timeout_ms) is
// dropped when next taken, and another one dialled. Bind moves
// the pool to a new session (after a reconnection); connections of the old
// one are closed as they come back.
//
// Failures of the link itself (no daemon, a broken or stalled connection)
// are UNAVAILABLE or DEADLINE_EXCEEDED with ErrorReason kDaemonUnreachable
// (client/outage.h): an outage, not an answer. The daemon's own errors keep
// its code, message and ErrorReason.
//
// Thread-safety: thread-safe. mu_ guards the pool only; no lock is held
// while a request is on the wire.
#ifndef KVTIER_CLIENT_ENGINE_LINK_H_
#define KVTIER_CLIENT_ENGINE_LINK_H_

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/fast_lookup.h"
#include "google/protobuf/message_lite.h"

namespace kvtier::client {

// Connects to unix socket `path` before `deadline`, writes `frame` (`count`
// iovecs: a Hello, or an Open and its v1.Hello) and reads the `reply_bytes`
// of its fixed-size reply into `reply`, retrying with backoff while the
// socket is not there yet or refuses (the daemon is starting) when
// `wait_for_daemon`, and when the daemon closed the connection before
// answering (it does so to connections still without a first frame when
// their uid holds too many). Every read and write of the returned fd is
// bounded by what was left of the deadline. Returns the fd, or -1 with *why.
int DialEngineSocket(const std::string& path, const iovec* frame, int count,
                     void* reply, size_t reply_bytes, absl::Time deadline,
                     bool wait_for_daemon, std::string* why);

// Sets both socket timeouts of `fd` to `timeout` (at least 1 ms; infinite
// for absl::InfiniteDuration()); false on error.
bool SetSocketTimeouts(int fd, absl::Duration timeout);

class EngineLink {
 public:
  // Most connections one Client opens at once; more concurrent callers wait
  // for one to come back (within their deadline). Each costs a daemon thread
  // and counts against --fast_lookup_max_connections_per_uid (256): with the
  // session connection, a Client holds at most 9.
  static constexpr int kMaxConnections = 8;
  // Idle connections kept for reuse: all of them, so a burst never re-dials.
  static constexpr int kMaxIdle = kMaxConnections;

  EngineLink() = default;
  ~EngineLink() { Close(); }
  EngineLink(const EngineLink&) = delete;
  EngineLink& operator=(const EngineLink&) = delete;

  // Makes session `session_id` on engine socket `path` the link's: dials
  // one connection now (its Hello checks the session and this process's
  // credentials) within `timeout` and keeps it idle. On error the link is
  // closed.
  absl::Status Bind(const std::string& path, uint64_t session_id,
                    absl::Duration timeout);
  // Forgets the session: idle connections close now, busy ones when they
  // come back; requests fail as outages until the next Bind.
  void Close();

  // A lookup of packed `hashes` in namespace `namespace_id` (binary frame)
  // for session `session`, within `timeout`. On OK fills *reply and *rows;
  // else the daemon's error or an outage (see above): the latter also when
  // the link is bound to another session than `session` (the request was
  // made for a session that ended), so a request never runs for a session
  // it was not filled for.
  absl::Status Lookup(uint64_t session, uint64_t namespace_id,
                      std::string_view hashes, bool pin, absl::Duration timeout,
                      fastpath::Reply* reply, std::vector<uint32_t>* rows);
  // Call `method` with `request`, made for session `session`, within
  // `timeout`; on OK parses the response into *response. `what` (the call's
  // name) prefixes messages. An outage when bound to another session, as
  // for Lookup.
  absl::Status Call(uint64_t session, fastpath::Method method,
                    absl::string_view what,
                    const google::protobuf::MessageLite& request,
                    google::protobuf::MessageLite* response,
                    absl::Duration timeout);

  // True while a session is bound.
  bool active() const;

 private:
  struct Conn {
    int fd = -1;
    uint64_t generation = 0;
    absl::Duration timeout;  // What the fd's socket timeouts are set to.
  };
  // Takes an idle connection of session `session` or dials one, waiting
  // while kMaxConnections are busy, before `deadline`; with its socket
  // timeouts set to `timeout`. An outage when not bound to `session`.
  absl::Status Acquire(uint64_t session, absl::Time deadline,
                       absl::Duration timeout, Conn* c);
  // Gives `c` back: kept when `healthy` and of the current session, else
  // closed.
  void Return(Conn c, bool healthy);
  // The outage status for a broken request: `what`, the step and errno.
  static absl::Status Broken(absl::string_view what, const char* step, int err);

  mutable absl::Mutex mu_;
  std::string path_ ABSL_GUARDED_BY(mu_);
  uint64_t session_id_ ABSL_GUARDED_BY(mu_) = 0;  // 0: not bound.
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;  // +1 per Bind and Close.
  std::vector<Conn> idle_ ABSL_GUARDED_BY(mu_);
  int open_ ABSL_GUARDED_BY(mu_) = 0;  // Idle and busy.
};

}  // namespace kvtier::client

#endif  // KVTIER_CLIENT_ENGINE_LINK_H_
