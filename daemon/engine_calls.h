// The engine calls of the engine protocol (common/fast_lookup.h): a call
// frame's protobuf request, run by TierCore for the session its connection
// is bound to, and the protobuf response.
//
// The same TierCore methods answer the gRPC service (daemon/tier_service.h);
// this is the other adapter, for libkvtier, which speaks no gRPC.
//
// Thread-safety: thread-safe (TierCore is).
#ifndef KVTIER_DAEMON_ENGINE_CALLS_H_
#define KVTIER_DAEMON_ENGINE_CALLS_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "daemon/tier_core.h"

namespace kvtier::daemon {

// Runs call `method` (a fastpath::Method) of serialized request `payload`
// for session `session_id` and serializes its response into *response.
// A request that names another session is PERMISSION_DENIED; a malformed
// one, or an unknown method, INVALID_ARGUMENT (UNIMPLEMENTED for a method
// number this daemon does not know, so a newer client can tell). Drop acts
// within the session's rights, as on the gRPC engine socket.
absl::Status RunEngineCall(TierCore* core, uint64_t session_id, uint32_t method,
                           absl::string_view payload, std::string* response);

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_ENGINE_CALLS_H_
