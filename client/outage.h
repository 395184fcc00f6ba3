// How the client tells an outage (the daemon went away or restarted, so the
// request's session or namespace is gone) from an error about the request,
// and the status it answers while one lasts.
//
// The daemon marks "no such session" and "no such namespace id" with an
// ErrorReason payload (common/error_reason.h), which the engine protocol's
// replies carry to the client (client/engine_link.h). The client marks its
// own outage statuses with kDaemonUnreachable, so an engine can tell them
// apart too.
//
// Thread-safety: pure functions.
#ifndef KVTIER_CLIENT_OUTAGE_H_
#define KVTIER_CLIENT_OUTAGE_H_

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/error_reason.h"

namespace kvtier::client {

// Returns whether an RPC's failure `s` means the daemon went away or
// restarted (it no longer knows our session or namespace, or never
// answered), rather than a problem with the request.
inline bool OutageLike(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kCancelled:
    case absl::StatusCode::kDeadlineExceeded:
      return true;
    default:
      break;
  }
  switch (GetErrorReason(s)) {
    case ErrorReason::kSessionUnknown:
    case ErrorReason::kNamespaceUnknown:
    case ErrorReason::kDaemonUnreachable:
      return true;
    case ErrorReason::kNone:
      break;
  }
  return false;
}

// Returns the UNAVAILABLE status (reason kDaemonUnreachable) of `what` while
// the daemon is unreachable or restarted.
inline absl::Status Unreachable(absl::string_view what) {
  return WithErrorReason(
      absl::UnavailableError(absl::StrCat(
          what, ": kvtierd is unreachable or restarted; reconnecting")),
      ErrorReason::kDaemonUnreachable);
}

}  // namespace kvtier::client

#endif  // KVTIER_CLIENT_OUTAGE_H_
