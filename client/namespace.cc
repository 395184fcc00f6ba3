// Namespace (client/client.h): lookups (binary frames, or Lookup calls),
// the cluster tier's remote lookups and prefetches, reservations, mirror
// adoption and transfer engines over the mapped banks. During an outage a
// lookup is a miss, and a prefetch or a reservation UNAVAILABLE
// (client/outage.h).
//
// Thread-safety: thread-safe; every call reads the shared NamespaceState,
// whose mutable parts are atomics (client/namespace_state.h).
#include <utility>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "client/namespace_state.h"
#include "client/outage.h"
#include "client/transfer_engine.h"

namespace kvtier::client {

Namespace::Namespace(std::shared_ptr<NamespaceState> state)
    : state_(std::move(state)) {}
Namespace::~Namespace() = default;

uint64_t Namespace::id() const { return state_->id.load(); }
const std::string& Namespace::name() const { return state_->name; }
const Layout& Namespace::layout() const { return state_->layout; }
uint32_t Namespace::tp_rank() const { return state_->tp_rank; }
bool Namespace::created() const { return state_->created; }
bool Namespace::cuda_registered() const {
  return state_->banks->cuda_registered();
}
const BlockHasher& Namespace::hasher() const { return *state_->hasher; }
const std::string& Namespace::acl_entry() const { return state_->acl_entry; }
const std::vector<BankMapping>& Namespace::page_banks() const {
  return state_->banks->page_banks();
}
const BankMapping* Namespace::snapshot_bank() const {
  return state_->banks->snapshot_bank();
}
double Namespace::map_seconds() const { return state_->map_seconds; }
double Namespace::register_seconds() const { return state_->register_seconds; }
const std::vector<DevicePoolInfo>& Namespace::device_pools() const {
  return state_->device_pools;
}
bool Namespace::device_pools_valid() const {
  return !state_->device_pools.empty() && state_->Current(state_->device_epoch);
}

absl::StatusOr<Lease> Namespace::LookupWithDevice(std::string_view hashes,
                                                  uint32_t device_pool,
                                                  bool pin) {
  if (device_pool >= state_->device_pools.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("device_pool: ", device_pool, " but the daemon reported ",
                     state_->device_pools.size(), " device pools"));
  }
  Lease miss;
  miss.ns_ = state_;
  v1::LookupRequest req;
  uint64_t epoch = 0;
  if (!state_->Fill(&req, &epoch)) return miss;
  // A later daemon session's pools are other allocations: ask the host only.
  if (epoch != state_->device_epoch) return Lookup(hashes, pin);
  req.set_device_pool(device_pool);
  return LookupOverCall(req, hashes, pin, epoch);
}

absl::StatusOr<Lease> Namespace::LookupOverCall(v1::LookupRequest& req,
                                                std::string_view hashes,
                                                bool pin, uint64_t epoch) {
  Lease miss;
  miss.ns_ = state_;
  req.set_hashes(std::string(hashes));
  req.set_pin(pin);
  v1::LookupResponse resp;
  if (absl::Status s =
          state_->conn->Call(fastpath::Method::kLookup, "Lookup", req, &resp);
      !s.ok()) {
    if (OutageLike(s) || !state_->Current(epoch)) return miss;
    return s;
  }
  if (!state_->Current(epoch)) return miss;
  Lease lease;
  lease.ns_ = state_;
  lease.lease_id_ = resp.lease_id();
  lease.epoch_ = epoch;
  lease.matched_pages_ = resp.matched_pages();
  lease.usable_pages_ = resp.usable_pages();
  lease.rows_.assign(resp.rows().begin(), resp.rows().end());
  lease.has_snapshot_ = resp.has_snapshot();
  lease.snapshot_row_ = resp.snapshot_row();
  lease.has_device_snapshot_ = resp.has_device_snapshot();
  lease.device_snapshot_row_ = resp.device_snapshot_row();
  lease.remote_pages_ = resp.remote_pages();
  lease.prefetching_pages_ = resp.prefetching_pages();
  lease.Track(hashes);
  return lease;
}

absl::StatusOr<Lease> Namespace::LookupRemote(std::string_view hashes,
                                              bool pin) {
  Lease miss;
  miss.ns_ = state_;
  v1::LookupRequest req;
  uint64_t epoch = 0;
  if (!state_->Fill(&req, &epoch)) return miss;
  // The binary lookup frame has no room for the cluster tier's answer.
  req.set_remote(true);
  return LookupOverCall(req, hashes, pin, epoch);
}

absl::StatusOr<PrefetchResult> Namespace::Prefetch(std::string_view hashes) {
  const uint32_t hash_bytes = state_->hasher->hash_bytes();
  if (hashes.size() % hash_bytes != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Prefetch: hashes: ", hashes.size(),
        " bytes is not a multiple of the namespace's hash size ", hash_bytes));
  }
  v1::PrefetchRequest req;
  uint64_t epoch = 0;
  if (!state_->Fill(&req, &epoch)) return state_->Unusable("Prefetch");
  req.set_hashes(std::string(hashes));
  v1::PrefetchResponse resp;
  if (absl::Status s = state_->conn->Call(fastpath::Method::kPrefetch,
                                          "Prefetch", req, &resp);
      !s.ok()) {
    if (OutageLike(s) || !state_->Current(epoch)) {
      return Unreachable("Prefetch");
    }
    return s;
  }
  PrefetchResult r;
  r.local_pages = resp.local_pages();
  r.remote_pages = resp.remote_pages();
  r.prefetching_pages = resp.prefetching_pages();
  return r;
}

absl::StatusOr<Lease> Namespace::Lookup(std::string_view hashes, bool pin) {
  // During an outage (or when the answer came from a session that ended
  // meanwhile, whose pin is void) the engine gets a miss: it recomputes.
  Lease miss;
  miss.ns_ = state_;
  v1::LookupRequest req;
  uint64_t epoch = 0;
  if (!state_->Fill(&req, &epoch)) return miss;
  if (!state_->conn->fast_lookup) {
    return LookupOverCall(req, hashes, pin, epoch);
  }
  fastpath::Reply reply;
  Lease lease;
  const absl::Status status = state_->conn->link.Lookup(
      req.session_id(), req.namespace_id(), hashes, pin, state_->conn->timeout,
      &reply, &lease.rows_);
  if (!state_->Current(epoch)) return miss;
  if (!status.ok()) {
    if (OutageLike(status)) return miss;
    return status;
  }
  lease.ns_ = state_;
  lease.lease_id_ = reply.lease_id;
  lease.epoch_ = epoch;
  lease.matched_pages_ = reply.matched_pages;
  lease.usable_pages_ = reply.usable_pages;
  lease.has_snapshot_ = reply.has_snapshot != 0;
  lease.snapshot_row_ = reply.snapshot_row;
  lease.Track(hashes);
  return lease;
}

absl::StatusOr<Reservation> Namespace::Reserve(uint32_t pages,
                                               uint32_t snapshots,
                                               uint32_t device_snapshots,
                                               uint32_t device_pool) {
  v1::ReserveRequest req;
  uint64_t epoch = 0;
  if (!state_->Fill(&req, &epoch)) return state_->Unusable("Reserve");
  if (device_snapshots > 0 && epoch != state_->device_epoch) {
    return absl::UnavailableError(
        "Reserve: device_snapshots: the daemon session that exported the "
        "device pools ended (the daemon stopped or restarted); attach again");
  }
  req.set_pages(pages);
  req.set_snapshots(snapshots);
  req.set_device_snapshots(device_snapshots);
  req.set_device_pool(device_pool);
  v1::ReserveResponse resp;
  if (absl::Status s =
          state_->conn->Call(fastpath::Method::kReserve, "Reserve", req, &resp);
      !s.ok()) {
    if (OutageLike(s) || !state_->Current(epoch)) {
      return Unreachable("Reserve");
    }
    return s;
  }
  // Rows of a session that ended during the call are void.
  if (!state_->Current(epoch)) return Unreachable("Reserve");
  Reservation r;
  r.ns_ = state_;
  r.id_ = resp.reservation_id();
  r.epoch_ = epoch;
  r.page_rows_.assign(resp.page_rows().begin(), resp.page_rows().end());
  r.snapshot_rows_.assign(resp.snapshot_rows().begin(),
                          resp.snapshot_rows().end());
  r.device_snapshot_rows_.assign(resp.device_snapshot_rows().begin(),
                                 resp.device_snapshot_rows().end());
  r.track_ = state_->Track(epoch, r.page_rows_, r.snapshot_rows_, "");
  return r;
}

absl::StatusOr<CommitResult> Namespace::AdoptMirror(
    const Reservation& mirror, absl::Span<const uint32_t> mirror_indices,
    std::string_view parent_hash, std::string_view hashes) {
  if (mirror.id() == 0 || mirror.ns_ != state_) {
    return absl::InvalidArgumentError(
        "AdoptMirror: mirror: not a live reservation of this namespace");
  }
  v1::CommitRequest req;
  uint64_t epoch = 0;
  if (!state_->Fill(&req, &epoch)) return state_->Unusable("AdoptMirror");
  if (epoch != mirror.epoch_) {
    return absl::UnavailableError(
        "AdoptMirror: the mirror belongs to a daemon session that ended (the "
        "daemon restarted): its rows are void");
  }
  req.set_reservation_id(mirror.id());
  req.mutable_mirror_indices()->Assign(mirror_indices.begin(),
                                       mirror_indices.end());
  req.set_parent_hash(std::string(parent_hash));
  req.set_hashes(std::string(hashes));
  v1::CommitResponse resp;
  if (absl::Status s = state_->conn->Call(fastpath::Method::kCommit,
                                          "AdoptMirror", req, &resp);
      !s.ok()) {
    if (OutageLike(s) || !state_->Current(epoch)) {
      return Unreachable("AdoptMirror");
    }
    return s;
  }
  CommitResult r;
  r.committed_pages = resp.committed_pages();
  r.deduplicated_pages = resp.deduplicated_pages();
  return r;
}

absl::StatusOr<std::unique_ptr<TransferEngine>> Namespace::CreateTransferEngine(
    Backend backend, const GpuPoolDescriptor& pool, uint32_t max_ctas) const {
  std::vector<std::pair<std::string, HostBankView>> banks;
  for (const auto& b : state_->banks->page_banks()) {
    banks.emplace_back(b.name, HostBankView{reinterpret_cast<uint64_t>(b.base),
                                            b.rows, b.row_bytes, b.row_stride});
  }
  std::optional<HostBankView> snap;
  if (const BankMapping* sb = state_->banks->snapshot_bank()) {
    const auto& b = *sb;
    snap = HostBankView{reinterpret_cast<uint64_t>(b.base), b.rows, b.row_bytes,
                        b.row_stride};
  }
  if (backend == Backend::kCuda && !state_->banks->cuda_registered()) {
    return absl::FailedPreconditionError(
        "the namespace's banks are not registered with CUDA (no device at "
        "attach, or register_with_cuda was false)");
  }
  TransferOptions options;
  if (max_ctas != 0) options.max_ctas = max_ctas;
  return TransferEngine::Create(backend, pool, std::move(banks), snap, options);
}

}  // namespace kvtier::client
