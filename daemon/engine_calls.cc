// The engine calls of the engine protocol (daemon/engine_calls.h).
#include "daemon/engine_calls.h"

#include "absl/strings/str_cat.h"
#include "common/fast_lookup.h"
#include "daemon/metrics.h"

namespace kvtier::daemon {
namespace {

using fastpath::Method;

// Parses a `Req`, binds it to `session_id`, runs `run` and serializes the
// `Resp`. `name` is the method's name ("Attach"): it labels errors and picks
// the latency histogram.
template <typename Req, typename Resp, typename Run>
absl::Status Serve(const char* name, uint64_t session_id,
                   absl::string_view payload, std::string* response, Run run) {
  Req req;
  if (!req.ParseFromArray(payload.data(), static_cast<int>(payload.size()))) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": the request is not a well-formed ",
                     Req::descriptor()->full_name()));
  }
  if (req.session_id() != 0 && req.session_id() != session_id) {
    return absl::PermissionDeniedError(absl::StrCat(
        "session_id: this connection acts for its own session only, not ",
        req.session_id()));
  }
  req.set_session_id(session_id);
  Resp resp;
  OpTimer timer(TimedOpOf(name), Transport::kEngine);
  absl::Status s = run(req, &resp);
  timer.Done(s.ok());
  if (!s.ok()) return s;
  if (!resp.SerializeToString(response)) {
    return absl::InternalError(absl::StrCat(name, ": cannot serialize ",
                                            Resp::descriptor()->full_name()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RunEngineCall(TierCore* core, uint64_t session_id, uint32_t method,
                           absl::string_view payload, std::string* response) {
  response->clear();
#define KVTIER_CALL(Name)                                                \
  case Method::k##Name:                                                  \
    return Serve<v1::Name##Request, v1::Name##Response>(                 \
        #Name, session_id, payload, response,                            \
        [core](const v1::Name##Request& req, v1::Name##Response* resp) { \
          return core->Name(req, resp);                                  \
        });
  switch (static_cast<Method>(method)) {
    KVTIER_CALL(Attach)
    KVTIER_CALL(Lookup)
    KVTIER_CALL(Reserve)
    KVTIER_CALL(Commit)
    KVTIER_CALL(Abort)
    KVTIER_CALL(Release)
    KVTIER_CALL(Prefetch)
    KVTIER_CALL(Fence)
    case Method::kDrop:
      // Within the session's rights (its bound credentials), as on the
      // gRPC engine socket.
      return Serve<v1::DropRequest, v1::DropResponse>(
          "Drop", session_id, payload, response,
          [core, session_id](const v1::DropRequest& req,
                             v1::DropResponse* resp) {
            return core->Drop(
                req, resp,
                Caller{.operator_socket = false, .session_id = session_id});
          });
  }
#undef KVTIER_CALL
  return absl::UnimplementedError(
      absl::StrCat("call: method ", method, " is not one this kvtierd knows"));
}

}  // namespace kvtier::daemon
