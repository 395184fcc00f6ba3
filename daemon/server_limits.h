// Server limits: what kvtierd bounds so that its sockets hold when members of
// the socket's group abuse them (issue 14). The process's file limit is
// raised to what the hard limit allows (every connection is an fd); the gRPC
// server gets a resource quota, message size caps, a stream cap per
// connection and an idle timeout, and its socket's gate (daemon/grpc_gate.h)
// caps connections per uid and closes one that never speaks HTTP/2; the fast
// lookup socket gets FastLookupOptions (daemon/fast_lookup_server.h). The
// --grpc_*, --fast_lookup_* and --max_sessions_per_uid flags that set them
// are read by ServerLimitsFromFlags (daemon/daemon_options.h).
//
// Thread-safety: RaiseFileLimit changes process state: call it once, early in
// main, before threads start. The rest are pure functions of their inputs.
#ifndef KVTIER_DAEMON_SERVER_LIMITS_H_
#define KVTIER_DAEMON_SERVER_LIMITS_H_

#include <sys/resource.h>

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "daemon/fast_lookup_server.h"
#include "daemon/grpc_gate.h"

namespace grpc {
class ServerBuilder;
}  // namespace grpc

namespace kvtier::daemon {

struct ServerLimits {
  // Largest gRPC message received or sent. A Lookup or Commit of the most
  // pages a request may name (1 << 20 hashes of 32 bytes) is 32 MiB plus
  // framing.
  int max_message_bytes = 64 << 20;
  // Most concurrent calls on one HTTP/2 connection (one engine's channel);
  // more wait on the client side.
  int max_concurrent_streams = 256;
  // Most threads gRPC may run for synchronous handlers (reflection); the
  // tier's own service is callback-based and does not use them. 0: unset.
  int max_threads = 64;
  // Memory gRPC may use for buffers across connections; under pressure it
  // shrinks its buffers and windows rather than fail. 0: gRPC's default.
  uint64_t memory_quota_bytes = 4ull << 30;
  // A new connection must finish its HTTP/2 handshake within this, else it
  // is closed. Zero: gRPC's default (120 s).
  absl::Duration handshake_timeout = absl::Seconds(10);
  // Close a connection that carried no call for this long (clients
  // reconnect on their next call; a Session stream is a call). Zero: never.
  absl::Duration max_connection_idle = absl::Minutes(5);
  // The gRPC socket's connections: per-uid caps and the preface deadline
  // (the handshake timeout, or gRPC's 120 s when that is zero).
  GrpcGateOptions gate;
  FastLookupOptions fast_lookup;
};

// The process's open-file limit before and after RaiseFileLimit.
struct FileLimit {
  rlim_t before = 0;  // Soft limit found.
  rlim_t after = 0;   // Soft limit now.
  rlim_t hard = 0;
};

// Raises the soft RLIMIT_NOFILE to the hard limit (capped at
// /proc/sys/fs/nr_open when the hard limit is infinite). Returns the limits
// (after == before when already there); INTERNAL naming the call when
// getrlimit or setrlimit fails (the limit is then unchanged).
absl::StatusOr<FileLimit> RaiseFileLimit();

// Applies `limits` (all but gate and fast_lookup) to `builder`. REQUIRES:
// before BuildAndStart.
void ApplyServerLimits(grpc::ServerBuilder* builder,
                       const ServerLimits& limits);

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_SERVER_LIMITS_H_
