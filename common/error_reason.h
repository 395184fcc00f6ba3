// Machine-readable reasons for the few errors whose handling differs from
// what their code alone says, carried as an absl::Status payload under
// kErrorReasonTypeUrl (and across gRPC by common/grpc_status.h, across the
// engine protocol in the reason field of its replies: fastpath::Reply,
// OpenReply and CallReply).
//
// Why a payload and not the message: the client treats "the daemon does not
// know this session or namespace" as an outage (a lookup is a miss, a commit
// is UNAVAILABLE) while other NOT_FOUND answers are the engine's error. The
// message is for people and may be reworded; the reason is the contract.
//
// Thread-safety: pure functions.
#ifndef KVTIER_COMMON_ERROR_REASON_H_
#define KVTIER_COMMON_ERROR_REASON_H_

#include <cstdint>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/string_view.h"

namespace kvtier {

// Wire values (payload text and the fastpath replies' reason): never
// renumber.
enum class ErrorReason : uint32_t {
  kNone = 0,
  // The daemon has no open session of the request's id: it ended, or the
  // daemon restarted and never knew it.
  kSessionUnknown = 1,
  // The daemon has no namespace of the request's id: it was dropped, or the
  // daemon restarted and numbered its namespaces anew.
  kNamespaceUnknown = 2,
  // Client side: kvtierd is unreachable or restarted, and the client is
  // reconnecting (or, without reconnect, stays down).
  kDaemonUnreachable = 3,
};

inline constexpr char kErrorReasonTypeUrl[] =
    "type.kvtier.dev/kvtier.ErrorReason";

// Returns `s` with `reason` attached. An OK status stays OK (absl keeps no
// payload on it); kNone removes a reason.
inline absl::Status WithErrorReason(absl::Status s, ErrorReason reason) {
  if (reason == ErrorReason::kNone) {
    s.ErasePayload(kErrorReasonTypeUrl);
  } else {
    s.SetPayload(kErrorReasonTypeUrl,
                 absl::Cord(std::to_string(static_cast<uint32_t>(reason))));
  }
  return s;
}

// Returns the reason attached to `s`; kNone when none is, or when the payload
// is not one this build knows (a newer daemon's).
inline ErrorReason GetErrorReason(const absl::Status& s) {
  const auto payload = s.GetPayload(kErrorReasonTypeUrl);
  uint32_t value = 0;
  if (!payload.has_value() ||
      !absl::SimpleAtoi(std::string(*payload), &value) ||
      value > static_cast<uint32_t>(ErrorReason::kDaemonUnreachable)) {
    return ErrorReason::kNone;
  }
  return static_cast<ErrorReason>(value);
}

// The daemon's answer to a request naming a session it has no open session
// of: NOT_FOUND, "session_id: no open session <id><detail>".
inline absl::Status SessionUnknownError(uint64_t session_id,
                                        absl::string_view detail = {}) {
  return WithErrorReason(
      absl::NotFoundError("session_id: no open session " +
                          std::to_string(session_id) + std::string(detail)),
      ErrorReason::kSessionUnknown);
}

}  // namespace kvtier

#endif  // KVTIER_COMMON_ERROR_REASON_H_
