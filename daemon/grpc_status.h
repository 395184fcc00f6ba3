// The one mapping between absl::Status and grpc::Status.
//
// absl and gRPC share the canonical code numbering, so the mapping keeps the
// code and the message. Thread-safety: pure functions.
#ifndef KVTIER_DAEMON_GRPC_STATUS_H_
#define KVTIER_DAEMON_GRPC_STATUS_H_

#include <string>

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace kvtier::daemon {

// Returns the gRPC status with the same code and message as `s`.
inline grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()),
                      std::string(s.message()));
}

// Returns the absl status with the same code and message as `s`.
inline absl::Status FromGrpcStatus(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      s.error_message());
}

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_GRPC_STATUS_H_
