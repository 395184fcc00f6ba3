// Server limits: the file limit and the gRPC server's limits.
#include "daemon/server_limits.h"

#include <sys/resource.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "grpc/grpc.h"
#include "grpcpp/resource_quota.h"
#include "grpcpp/server_builder.h"

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

}  // namespace kvtier::daemon
