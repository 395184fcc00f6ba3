// DaemonProbe: Stats and Verify over a raw stub.
#include "tests/daemon_probe.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"

namespace kvtier::testing {
namespace {

// Waits for the channel to (re)connect: the daemon may have just restarted.
void Deadline(grpc::ClientContext* ctx) {
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  ctx->set_wait_for_ready(true);
}

// Calls `rpc` until it gets past UNAVAILABLE (for up to 5 s): the first
// call after a daemon restart may meet the dead daemon's connection.
template <typename Resp, typename Rpc>
absl::StatusOr<Resp> Call(Rpc rpc) {
  const absl::Time end = absl::Now() + absl::Seconds(5);
  for (;;) {
    grpc::ClientContext ctx;
    Deadline(&ctx);
    Resp resp;
    absl::Status s = FromGrpcStatus(rpc(&ctx, &resp));
    if (s.ok()) return resp;
    if (!absl::IsUnavailable(s) || absl::Now() > end) return s;
    absl::SleepFor(absl::Milliseconds(20));
  }
}

}  // namespace

// An operator's view: the operator socket beside the engine socket, where
// Stats lists every namespace and Verify is allowed.
DaemonProbe::DaemonProbe(const std::string& socket)
    : stub_(v1::TierService::NewStub(grpc::CreateChannel(
          "unix:" + socket + ".admin", grpc::InsecureChannelCredentials()))) {}

absl::StatusOr<v1::StatsResponse> DaemonProbe::Stats() {
  return Call<v1::StatsResponse>(
      [this](grpc::ClientContext* ctx, v1::StatsResponse* resp) {
        return stub_->Stats(ctx, {}, resp);
      });
}

absl::StatusOr<v1::VerifyResponse> DaemonProbe::Verify() {
  return Call<v1::VerifyResponse>(
      [this](grpc::ClientContext* ctx, v1::VerifyResponse* resp) {
        return stub_->Verify(ctx, {}, resp);
      });
}

absl::StatusOr<BankTotals> DaemonProbe::Totals(const std::string& ns) {
  auto stats = Stats();
  if (!stats.ok()) return stats.status();
  for (const auto& n : stats->namespaces()) {
    if (n.name() != ns) continue;
    BankTotals t;
    for (const auto& b : n.banks()) {
      t.rows += b.rows();
      t.free += b.free_rows();
      t.reserved += b.reserved_rows();
      t.used += b.used_rows();
      t.fenced += b.fenced_rows();
    }
    t.leases = n.leases();
    t.reservations = n.reservations();
    t.fence_holds = n.fence_holds();
    return t;
  }
  return absl::NotFoundError(absl::StrCat("no namespace ", ns));
}

absl::StatusOr<absl::Duration> DaemonProbe::WaitUntilNothingHeld(
    const std::string& ns, absl::Duration limit) {
  const absl::Time start = absl::Now();
  for (;;) {
    auto t = Totals(ns);
    if (!t.ok()) return t.status();
    if (t->reserved == 0 && t->leases == 0 && t->reservations == 0 &&
        t->fence_holds == 0 && t->fenced == 0) {
      return absl::Now() - start;
    }
    if (absl::Now() - start > limit) {
      return absl::DeadlineExceededError(
          absl::StrCat(ns, ": still ", t->reserved, " reserved rows, ",
                       t->reservations, " reservations, ", t->leases,
                       " leases, ", t->fence_holds, " fence holds of ",
                       t->fenced, " rows after ", absl::FormatDuration(limit)));
    }
    absl::SleepFor(absl::Milliseconds(2));
  }
}

}  // namespace kvtier::testing
