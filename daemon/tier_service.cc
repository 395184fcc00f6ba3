// TierService: the gRPC adapter over TierCore (callback API).
#include "daemon/tier_service.h"

#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/grpc_status.h"
#include "daemon/metrics.h"
#include "spdlog/spdlog.h"

namespace kvtier::daemon {
namespace {

// One engine process's Session stream. gRPC serialises neither reads against
// writes nor OnDone against them, so the few fields shared between the
// reactions are guarded by mu_.
class SessionReactor
    : public grpc::ServerBidiReactor<v1::SessionRequest, v1::SessionEvent>,
      public SessionDrainer {
 public:
  SessionReactor(TierCore* core, TierService* service,
                 const std::string& fast_lookup_socket)
      : core_(core),
        service_(service),
        fast_lookup_socket_(fast_lookup_socket) {
    draining_.mutable_draining();
    service_->Register(this);
    StartRead(&request_);
  }

  void SendDraining() override {
    absl::MutexLock lock(&mu_);
    if (finished_ || draining_sent_ || session_id_ == 0) return;
    if (write_in_flight_) {
      draining_pending_ = true;  // OnWriteDone sends it.
      return;
    }
    draining_sent_ = true;
    write_in_flight_ = true;
    StartWrite(&draining_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // Client closed its side, died, or the server is stopping.
      FinishOnce(grpc::Status::OK);
      return;
    }
    if (request_.api_version() > kApiVersion) {
      FinishOnce(grpc::Status(
          grpc::StatusCode::FAILED_PRECONDITION,
          absl::StrCat("api_version: daemon speaks ", kApiVersion)));
      return;
    }
    switch (request_.kind_case()) {
      case v1::SessionRequest::kHello: {
        grpc::Status error;
        {
          absl::MutexLock lock(&mu_);
          if (session_id_ != 0) {
            error = grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                 "hello: sent twice on one session");
          } else {
            PeerInfo peer;
            peer.pid = static_cast<pid_t>(request_.hello().pid());
            auto id = core_->OpenSession(request_.hello(), peer);
            if (id.ok()) {
              session_id_ = *id;
              event_.mutable_opened()->set_session_id(*id);
              event_.mutable_opened()->set_fast_lookup_socket(
                  fast_lookup_socket_);
            } else {
              error = ToGrpcStatus(id.status());
            }
          }
        }
        if (!error.ok()) {
          FinishOnce(error);
          return;
        }
        {
          absl::MutexLock lock(&mu_);
          write_in_flight_ = true;
          StartWrite(&event_);
        }
        break;
      }
      case v1::SessionRequest::kHeartbeat:
        break;
      case v1::SessionRequest::kGoodbye: {
        uint64_t id;
        {
          absl::MutexLock lock(&mu_);
          id = session_id_;
        }
        if (id != 0) core_->SessionGoodbye(id, request_.goodbye().quiescent());
        break;
      }
      default:
        FinishOnce(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                "session request: neither hello nor "
                                "heartbeat"));
        return;
    }
    StartRead(&request_);
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    write_in_flight_ = false;
    if (ok && draining_pending_ && !draining_sent_ && !finished_) {
      draining_pending_ = false;
      draining_sent_ = true;
      write_in_flight_ = true;
      StartWrite(&draining_);
    }
  }

  void OnDone() override {
    service_->Unregister(this);
    uint64_t id;
    {
      absl::MutexLock lock(&mu_);
      id = session_id_;
    }
    if (id != 0) core_->CloseSession(id);
    delete this;
  }

 private:
  void FinishOnce(const grpc::Status& status) {
    absl::MutexLock lock(&mu_);
    if (finished_) return;
    finished_ = true;
    Finish(status);
  }

  TierCore* const core_;
  TierService* const service_;
  const std::string fast_lookup_socket_;
  v1::SessionRequest request_;  // Only touched by the read chain.
  v1::SessionEvent event_;      // Written once, before its StartWrite.
  v1::SessionEvent draining_;   // Immutable after construction.
  absl::Mutex mu_;
  uint64_t session_id_ ABSL_GUARDED_BY(mu_) = 0;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  // One write at a time: Opened, then (at shutdown) Draining.
  bool write_in_flight_ ABSL_GUARDED_BY(mu_) = false;
  bool draining_pending_ ABSL_GUARDED_BY(mu_) = false;
  bool draining_sent_ ABSL_GUARDED_BY(mu_) = false;
};

template <typename Req, typename Resp>
grpc::ServerUnaryReactor* Unary(grpc::CallbackServerContext* context,
                                absl::Status status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

}  // namespace

grpc::ServerBidiReactor<v1::SessionRequest, v1::SessionEvent>*
TierService::Session(grpc::CallbackServerContext* /*context*/) {
  return new SessionReactor(core_, this, fast_lookup_socket_);
}

void TierService::Register(SessionDrainer* session) {
  absl::MutexLock lock(&sessions_mu_);
  sessions_.insert(session);
}

void TierService::Unregister(SessionDrainer* session) {
  absl::MutexLock lock(&sessions_mu_);
  sessions_.erase(session);
}

void TierService::DrainSessions() {
  absl::MutexLock lock(&sessions_mu_);
  for (SessionDrainer* s : sessions_) s->SendDraining();
}

// Lookup, Commit and Attach are timed into the metrics' histograms.
#define KVTIER_UNARY(Method)                                                  \
  grpc::ServerUnaryReactor* TierService::Method(                              \
      grpc::CallbackServerContext* context, const v1::Method##Request* req,   \
      v1::Method##Response* resp) {                                           \
    constexpr TimedOp kOp = TimedOpOf(#Method);                               \
    OpTimer timer(kOp, Transport::kGrpc);                                     \
    absl::Status status = core_->Method(*req, resp);                          \
    timer.Done(status.ok());                                                  \
    return Unary<v1::Method##Request, v1::Method##Response>(context, status); \
  }

KVTIER_UNARY(Attach)
KVTIER_UNARY(Lookup)
KVTIER_UNARY(Reserve)
KVTIER_UNARY(Commit)
KVTIER_UNARY(Abort)
KVTIER_UNARY(Release)
KVTIER_UNARY(Prefetch)
KVTIER_UNARY(Fence)

#undef KVTIER_UNARY

// The operator RPCs: the socket they came in on decides the caller's rights
// (the request's session_id, where it has one, decides an engine's).
#define KVTIER_OPERATOR_UNARY(Method)                                         \
  grpc::ServerUnaryReactor* TierService::Method(                              \
      grpc::CallbackServerContext* context, const v1::Method##Request* req,   \
      v1::Method##Response* resp) {                                           \
    absl::Status status = core_->Method(                                      \
        *req, resp, Caller{.operator_socket = operator_socket_});             \
    return Unary<v1::Method##Request, v1::Method##Response>(context, status); \
  }

KVTIER_OPERATOR_UNARY(Drop)
KVTIER_OPERATOR_UNARY(Stats)
KVTIER_OPERATOR_UNARY(ListNamespaces)
KVTIER_OPERATOR_UNARY(ListPrefixes)
KVTIER_OPERATOR_UNARY(Verify)

#undef KVTIER_OPERATOR_UNARY

}  // namespace kvtier::daemon
