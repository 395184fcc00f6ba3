// TierCore: the daemon's transport-free core.
//
// It owns every namespace (its shared-memory banks and its PrefixIndex), the
// sessions of engine processes, and the reservations and leases those
// sessions hold. The gRPC service (tier_service.h) is a thin adapter over it;
// unit tests call it directly. Requests and responses are the kvtier.v1
// protobuf messages: plain data here, no transport.
//
// Every request is validated completely before anything changes: a bad id,
// count, length or hash size returns INVALID_ARGUMENT / NOT_FOUND /
// FAILED_PRECONDITION naming the field, and the state is unchanged.
//
// Thread-safety: thread-safe. Lock order: TierCore::mu_, then one
// Namespace::mu (never two namespaces at once).
#ifndef KVTIER_DAEMON_TIER_CORE_H_
#define KVTIER_DAEMON_TIER_CORE_H_

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/namespace_layout.h"
#include "daemon/prefix_index.h"
#include "kvtier/v1/tier.pb.h"
#include "shm/segment.h"

namespace kvtier::daemon {

inline constexpr uint32_t kApiVersion = 1;
inline constexpr uint32_t kMaxLookupPages = 1u << 20;
inline constexpr uint32_t kMaxReservePages = 1u << 20;

struct TierOptions {
  shm::SegmentOptions segments;
  // Segment files are named "<segment_prefix>.<namespace>.<bank>.r<rank>".
  std::string segment_prefix = "kvtier";
  // Bank bytes of a namespace whose Attach gives no capacity.
  uint64_t default_namespace_bytes = 1ull << 30;
  // Most bank bytes one namespace may hold (all banks, all ranks).
  uint64_t namespace_budget_bytes = 64ull << 30;
  // Share of default_namespace_bytes given to snapshots in hybrid namespaces.
  double default_snapshot_share = 0.25;
  uint32_t default_max_replay_tokens = 8192;
  // Most namespaces at once.
  uint32_t max_namespaces = 256;
};

// Who is on the other end of a session (from SO_PEERCRED where available).
struct PeerInfo {
  pid_t pid = 0;
  uid_t uid = static_cast<uid_t>(-1);
  gid_t gid = static_cast<gid_t>(-1);
};

class TierCore {
 public:
  explicit TierCore(TierOptions options);
  ~TierCore();
  TierCore(const TierCore&) = delete;
  TierCore& operator=(const TierCore&) = delete;

  // Opens a session for an engine process and returns its id (non-zero,
  // unguessable). Its pins and reservations live until CloseSession.
  absl::StatusOr<uint64_t> OpenSession(const v1::Hello& hello,
                                       const PeerInfo& peer);
  // Releases every lease and aborts every reservation of the session, then
  // forgets it. Unknown ids are ignored (a session may close twice: stream
  // end and server shutdown).
  void CloseSession(uint64_t session_id);

  // Creates the namespace (its banks populated) or opens it; attaches the
  // session to it at `tp_rank`. A layout that contradicts the existing
  // namespace of that name is FAILED_PRECONDITION naming the first field that
  // differs.
  absl::Status Attach(const v1::AttachRequest& request,
                      v1::AttachResponse* response);
  absl::Status Lookup(const v1::LookupRequest& request,
                      v1::LookupResponse* response);

  // Lookup's answer without protobuf: the fast lookup path uses it.
  struct LookupOutcome {
    uint32_t matched_pages = 0;
    uint32_t usable_pages = 0;
    std::vector<uint32_t> rows;
    bool has_snapshot = false;
    uint32_t snapshot_row = 0;
    uint64_t lease_id = 0;
  };
  // Lookup over packed `hashes`, with the same checks and effects.
  absl::Status LookupHashes(uint64_t session_id, uint64_t namespace_id,
                            absl::string_view hashes, bool pin,
                            LookupOutcome* out);
  // True when `session_id` is an open session.
  bool SessionOpen(uint64_t session_id);
  absl::Status Reserve(const v1::ReserveRequest& request,
                       v1::ReserveResponse* response);
  absl::Status Commit(const v1::CommitRequest& request,
                      v1::CommitResponse* response);
  absl::Status Abort(const v1::AbortRequest& request,
                     v1::AbortResponse* response);
  absl::Status Release(const v1::ReleaseRequest& request,
                       v1::ReleaseResponse* response);
  absl::Status Drop(const v1::DropRequest& request, v1::DropResponse* response);
  absl::Status Stats(const v1::StatsRequest& request,
                     v1::StatsResponse* response);
  absl::Status ListNamespaces(const v1::ListNamespacesRequest& request,
                              v1::ListNamespacesResponse* response);
  absl::Status ListPrefixes(const v1::ListPrefixesRequest& request,
                            v1::ListPrefixesResponse* response);

  // Runs CheckInvariants for the Verify RPC: OK with ok=false and the
  // violation when one is found.
  absl::Status Verify(const v1::VerifyRequest& request,
                      v1::VerifyResponse* response);

  // Creates a namespace with no session attached (the daemon's --demo
  // namespace). Same validation as Attach.
  absl::Status CreateNamespace(const std::string& name,
                               const v1::Layout& layout,
                               const v1::Capacity& capacity);

  // Checks every namespace's invariants: each row of every bank is free,
  // reserved or committed, never two of them; reservations and leases belong
  // to live sessions. Returns INTERNAL naming the first violation.
  absl::Status CheckInvariants();

  // Number of live sessions.
  size_t session_count();

 private:
  struct Namespace;
  struct Session {
    uint64_t id = 0;
    std::string client_name;
    PeerInfo peer;
    absl::Time opened;
    // namespace id -> rank the session attached at.
    absl::flat_hash_map<uint64_t, uint32_t> attached;
  };

  absl::StatusOr<std::shared_ptr<Namespace>> CreateOrOpenLocked(
      const std::string& name, const v1::Layout& layout,
      const v1::Capacity& capacity, const std::string& tenant_salt,
      bool* created) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Resolves (session, namespace) of a request to the namespace and the
  // session's storage rank there.
  absl::StatusOr<std::shared_ptr<Namespace>> Resolve(uint32_t api_version,
                                                     uint64_t session_id,
                                                     uint64_t namespace_id,
                                                     uint32_t* rank);
  void FillNamespaceInfo(Namespace& ns, v1::NamespaceInfo* info);

  const TierOptions options_;
  const absl::Time started_;
  std::atomic<uint64_t> next_id_{1};

  absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, Session> sessions_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::shared_ptr<Namespace>> by_name_
      ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, std::shared_ptr<Namespace>> by_id_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_TIER_CORE_H_
