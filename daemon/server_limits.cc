// Server limits: the file limit, the gRPC server's limits and the flags of
// both sockets' limits.
#include "daemon/server_limits.h"

#include <sys/resource.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <utility>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "grpc/grpc.h"
#include "grpcpp/resource_quota.h"
#include "grpcpp/server_builder.h"

ABSL_FLAG(uint32_t, fast_lookup_hello_deadline_ms, 1000,
          "A fast lookup connection must send its Hello within this many ms, "
          "else it is closed");
ABSL_FLAG(uint32_t, fast_lookup_pending_per_uid, 32,
          "Most fast lookup connections one uid may have waiting for their "
          "Hello; a new one closes that uid's oldest");
ABSL_FLAG(uint32_t, fast_lookup_max_pending, 4096,
          "Most fast lookup connections waiting for their Hello in all; a "
          "new one closes the oldest");
ABSL_FLAG(uint32_t, fast_lookup_max_connections, 1024,
          "Most fast lookup connections served at once (one per engine "
          "process); beyond, a Hello is refused RESOURCE_EXHAUSTED");
ABSL_FLAG(uint32_t, fast_lookup_max_connections_per_uid, 256,
          "Most fast lookup connections served at once for one uid");
ABSL_FLAG(uint32_t, fast_lookup_max_request_bytes,
          kvtier::fastpath::kMaxRequestBytes,
          "Largest fast lookup request (bytes of hashes); the default is the "
          "largest valid one, 1 << 20 hashes of 32 bytes");
ABSL_FLAG(uint32_t, fast_lookup_idle_timeout_ms, 300000,
          "Close an engine-socket call connection that sends no request for "
          "this many ms (libkvtier dials again on its next call; session "
          "connections are never idle-closed); 0: never");
ABSL_FLAG(uint32_t, fast_lookup_frame_deadline_ms, 10000,
          "Once the first byte of an engine-socket frame arrives, the whole "
          "frame (header and payload) must arrive within this many ms, else "
          "the connection is closed (at least 1)");
ABSL_FLAG(uint32_t, max_sessions_per_uid, 128,
          "Most sessions one uid may hold bound on the engine socket (opened "
          "there, or opened over gRPC and bound there); past it an Open is "
          "refused RESOURCE_EXHAUSTED (at least 1)");
ABSL_FLAG(uint32_t, grpc_max_message_bytes, 64u << 20,
          "Largest message kvtierd receives or sends, over gRPC or as a call "
          "on the engine socket (at most 256 MiB there)");
ABSL_FLAG(uint32_t, grpc_max_concurrent_streams, 256,
          "Most concurrent gRPC calls on one client connection");
ABSL_FLAG(uint32_t, grpc_max_threads, 64,
          "Most threads gRPC runs for synchronous handlers (0: unset)");
ABSL_FLAG(uint64_t, grpc_memory_quota_bytes, 4ull << 30,
          "Memory gRPC may use for buffers across connections (0: gRPC's "
          "default), and the most bytes of requests the engine socket holds "
          "at once (0: no bound)");
ABSL_FLAG(uint32_t, grpc_handshake_timeout_ms, 10000,
          "A gRPC connection must finish its HTTP/2 handshake within this "
          "many ms, else it is closed (0: gRPC's default, 120 s)");
ABSL_FLAG(uint32_t, grpc_max_connection_idle_s, 300,
          "Close gRPC connections that carried no call this long (clients "
          "reconnect on their next call; 0: never)");
ABSL_FLAG(uint32_t, grpc_max_connections, 4096,
          "Most gRPC connections at once (waiting for their HTTP/2 preface or "
          "served); a new one past it is closed at accept (at least 1)");
ABSL_FLAG(uint32_t, grpc_max_connections_per_uid, 64,
          "Most gRPC connections one uid may have at once; a new one past it "
          "is closed at accept (at least 1)");

namespace kvtier::daemon {
namespace {

// The most fds a process may have when the hard limit is infinite.
rlim_t NrOpen() {
  std::ifstream in("/proc/sys/fs/nr_open");
  rlim_t n = 0;
  if (in >> n && n > 0) return n;
  return 1 << 20;  // The kernel's default.
}

int ClampInt(uint64_t v) {
  return static_cast<int>(
      std::min<uint64_t>(v, std::numeric_limits<int>::max()));
}

}  // namespace

absl::StatusOr<FileLimit> RaiseFileLimit() {
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0) {
    return absl::InternalError(
        absl::StrCat("getrlimit(RLIMIT_NOFILE): ", std::strerror(errno)));
  }
  FileLimit limit;
  limit.before = rl.rlim_cur;
  limit.hard = rl.rlim_max;
  const rlim_t target = rl.rlim_max == RLIM_INFINITY ? NrOpen() : rl.rlim_max;
  if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < target) {
    rl.rlim_cur = target;
    if (::setrlimit(RLIMIT_NOFILE, &rl) != 0) {
      return absl::InternalError(absl::StrCat(
          "setrlimit(RLIMIT_NOFILE, ", target, "): ", std::strerror(errno)));
    }
  }
  limit.after = rl.rlim_cur;
  return limit;
}

void ApplyServerLimits(grpc::ServerBuilder* builder,
                       const ServerLimits& limits) {
  builder->SetMaxReceiveMessageSize(limits.max_message_bytes);
  builder->SetMaxSendMessageSize(limits.max_message_bytes);
  if (limits.max_concurrent_streams > 0) {
    builder->AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS,
                                limits.max_concurrent_streams);
  }
  if (limits.max_threads > 0 || limits.memory_quota_bytes > 0) {
    grpc::ResourceQuota quota("kvtierd");
    if (limits.max_threads > 0) quota.SetMaxThreads(limits.max_threads);
    if (limits.memory_quota_bytes > 0) {
      quota.Resize(static_cast<size_t>(limits.memory_quota_bytes));
    }
    builder->SetResourceQuota(quota);
  }
  if (limits.handshake_timeout > absl::ZeroDuration()) {
    builder->AddChannelArgument(
        GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS,
        ClampInt(absl::ToInt64Milliseconds(limits.handshake_timeout)));
  }
  if (limits.max_connection_idle > absl::ZeroDuration()) {
    builder->AddChannelArgument(
        GRPC_ARG_MAX_CONNECTION_IDLE_MS,
        ClampInt(absl::ToInt64Milliseconds(limits.max_connection_idle)));
  }
}

absl::StatusOr<ServerLimits> ServerLimitsFromFlags() {
  // Zero where it would mean "nothing may pass" is refused by name.
  for (const auto& [name, value] : {
           std::pair<const char*, uint32_t>{
               "--fast_lookup_frame_deadline_ms",
               absl::GetFlag(FLAGS_fast_lookup_frame_deadline_ms)},
           std::pair<const char*, uint32_t>{
               "--max_sessions_per_uid",
               absl::GetFlag(FLAGS_max_sessions_per_uid)},
           std::pair<const char*, uint32_t>{
               "--grpc_max_connections",
               absl::GetFlag(FLAGS_grpc_max_connections)},
           std::pair<const char*, uint32_t>{
               "--grpc_max_connections_per_uid",
               absl::GetFlag(FLAGS_grpc_max_connections_per_uid)},
       }) {
    if (value == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": must be at least 1, got 0"));
    }
  }
  ServerLimits l;
  l.max_message_bytes = ClampInt(absl::GetFlag(FLAGS_grpc_max_message_bytes));
  l.max_concurrent_streams =
      ClampInt(absl::GetFlag(FLAGS_grpc_max_concurrent_streams));
  l.max_threads = ClampInt(absl::GetFlag(FLAGS_grpc_max_threads));
  l.memory_quota_bytes = absl::GetFlag(FLAGS_grpc_memory_quota_bytes);
  l.handshake_timeout =
      absl::Milliseconds(absl::GetFlag(FLAGS_grpc_handshake_timeout_ms));
  l.max_connection_idle =
      absl::Seconds(absl::GetFlag(FLAGS_grpc_max_connection_idle_s));
  l.gate.preface_deadline = l.handshake_timeout > absl::ZeroDuration()
                                ? l.handshake_timeout
                                : absl::Seconds(120);
  l.gate.max_connections = ClampInt(absl::GetFlag(FLAGS_grpc_max_connections));
  l.gate.max_connections_per_uid =
      ClampInt(absl::GetFlag(FLAGS_grpc_max_connections_per_uid));
  FastLookupOptions& f = l.fast_lookup;
  f.hello_deadline =
      absl::Milliseconds(absl::GetFlag(FLAGS_fast_lookup_hello_deadline_ms));
  f.max_pending_per_uid =
      ClampInt(absl::GetFlag(FLAGS_fast_lookup_pending_per_uid));
  f.max_pending = ClampInt(absl::GetFlag(FLAGS_fast_lookup_max_pending));
  f.max_connections =
      ClampInt(absl::GetFlag(FLAGS_fast_lookup_max_connections));
  f.max_connections_per_uid =
      ClampInt(absl::GetFlag(FLAGS_fast_lookup_max_connections_per_uid));
  f.max_request_bytes = absl::GetFlag(FLAGS_fast_lookup_max_request_bytes);
  const uint32_t idle_ms = absl::GetFlag(FLAGS_fast_lookup_idle_timeout_ms);
  f.idle_timeout =
      idle_ms == 0 ? absl::InfiniteDuration() : absl::Milliseconds(idle_ms);
  f.frame_deadline =
      absl::Milliseconds(absl::GetFlag(FLAGS_fast_lookup_frame_deadline_ms));
  f.max_sessions_per_uid = ClampInt(absl::GetFlag(FLAGS_max_sessions_per_uid));
  f.max_call_bytes = std::min(absl::GetFlag(FLAGS_grpc_max_message_bytes),
                              fastpath::kMaxCallBytes);
  // The same bound on requests in flight on the engine socket (0: none).
  f.max_inflight_bytes = l.memory_quota_bytes > 0
                             ? l.memory_quota_bytes
                             : std::numeric_limits<uint64_t>::max();
  return l;
}

}  // namespace kvtier::daemon
