// DaemonProbe: raw TierService calls for the multi-process tests that look
// at a real daemon's books from outside: Stats (rows free / reserved / used
// per bank, leases, reservations) and Verify (the invariant check).
//
// Thread-safety: thread-safe (a gRPC stub).
#ifndef KVTIER_TESTS_DAEMON_PROBE_H_
#define KVTIER_TESTS_DAEMON_PROBE_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kvtier/v1/tier.grpc.pb.h"

namespace kvtier::testing {

// Rows of one namespace's banks, summed over banks and ranks.
struct BankTotals {
  uint64_t rows = 0;
  uint64_t free = 0;
  uint64_t reserved = 0;
  uint64_t used = 0;
  uint64_t fenced = 0;  // Rows fenced (BankUsage.fenced_rows).
  uint64_t leases = 0;
  uint64_t reservations = 0;
  uint64_t fence_holds = 0;
};

class DaemonProbe {
 public:
  explicit DaemonProbe(const std::string& socket);

  // One RPC each, with a 10 s deadline.
  absl::StatusOr<v1::StatsResponse> Stats();
  absl::StatusOr<v1::VerifyResponse> Verify();
  // Stats of namespace `ns`; NOT_FOUND when the daemon has none.
  absl::StatusOr<BankTotals> Totals(const std::string& ns);
  // Polls Totals until the namespace has no reservation, no lease and no
  // fence hold (a dead engine's rows come back once kvtierd saw it exit), for
  // at most `limit`; returns how long that took (DEADLINE_EXCEEDED past it).
  absl::StatusOr<absl::Duration> WaitUntilNothingHeld(const std::string& ns,
                                                      absl::Duration limit);

 private:
  std::unique_ptr<v1::TierService::Stub> stub_;
};

}  // namespace kvtier::testing

#endif  // KVTIER_TESTS_DAEMON_PROBE_H_
