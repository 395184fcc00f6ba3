// What the C ABI's source files (c_api.cc, c_api_device_pool.cc,
// c_api_mirror.cc) share: the definitions of the opaque handles of
// kvtier/kvtier.h over the C++ API, the thread-local last error, and the
// conversions of C arguments. Internal to libkvtier.so; not installed.
//
// Thread-safety: the functions are thread-safe; the last error is per
// thread. A handle is used as kvtier.h says.
#ifndef KVTIER_CLIENT_C_API_INTERNAL_H_
#define KVTIER_CLIENT_C_API_INTERNAL_H_

#include <cstddef>
#include <cstdint>
#include <future>
#include <memory>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "client/client.h"
#include "client/pool.h"
#include "client/transfer_engine.h"
#include "kvtier/kvtier.h"

struct kvt_client {
  std::unique_ptr<kvtier::client::Client> client;
};
struct kvt_namespace {
  std::unique_ptr<kvtier::client::Namespace> ns;
};
struct kvt_lease {
  kvtier::client::Lease lease;
};
struct kvt_reservation {
  kvtier::client::Reservation reservation;
};
struct kvt_pending_commit {
  std::future<absl::StatusOr<kvtier::client::CommitResult>> future;
};
struct kvt_transfer {
  std::unique_ptr<kvtier::client::TransferEngine> engine;
};

namespace kvtier::capi {

// Records `s` as this thread's last error (cleared when OK) and returns its
// code.
kvt_status Set(const absl::Status& s);
// This thread's last error ("" if none).
const char* LastError();

inline kvt_status Invalid(absl::string_view what) {
  return Set(absl::InvalidArgumentError(what));
}

// Copies a commit result out (out may be NULL).
void Fill(kvt_commit_result* out, const kvtier::client::CommitResult& r);

// The C++ placements of `n` C placements of hashes `hash_bytes` long;
// INVALID_ARGUMENT naming `what`[i] for a NULL hash.
absl::StatusOr<std::vector<kvtier::client::SnapshotPlacement>> Placements(
    const kvt_snapshot_placement* snaps, size_t n, uint32_t hash_bytes,
    absl::string_view what = "snaps");

// The C++ pool descriptor of `pool`; INVALID_ARGUMENT naming the field for
// NULL arrays. REQUIRES: pool != NULL.
absl::StatusOr<kvtier::client::GpuPoolDescriptor> Descriptor(
    const kvt_pool* pool);

inline std::string_view Bytes(const uint8_t* p, size_t n) {
  return p == nullptr ? std::string_view()
                      : std::string_view(reinterpret_cast<const char*>(p), n);
}

}  // namespace kvtier::capi

#define KVT_REQUIRE(cond, msg)                          \
  do {                                                  \
    if (!(cond)) return ::kvtier::capi::Invalid((msg)); \
  } while (0)

#endif  // KVTIER_CLIENT_C_API_INTERNAL_H_
