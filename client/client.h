// libkvtier's internal C++ API: connect to kvtierd, attach to a namespace,
// look up, reserve and commit pages, and move them with the transfer
// engine. The C ABI (kvtier/kvtier.h, client/c_api.cc) is built on it, and
// libkvtier.so exports that alone; engines use the C ABI or the header-only
// C++ layer over it (kvtier/kvtier.hpp). Tests, benchmarks and the C ABI
// use this API directly, linking kvtier_client.
//
//   auto client = Client::Connect({.client_name = "engine-0"});
//   auto ns = (*client)->Attach({.name = "llama3-8b", .layout = layout});
//   std::string hashes = (*ns)->hasher().HashChain(tokens);
//   auto lease = (*ns)->Lookup(hashes, /*pin=*/true);  // rows to rehydrate
//   auto res = (*ns)->Reserve(pages);                  // rows to evict into
//   ... engine->Evict(gpu_pages, res->page_rows(), stream) ...
//   auto done = res->CommitAfter(stream, parent, hashes);  // never blocks
//
// The tier outlives a daemon restart: when the session stream ends, the
// client reopens a session in the background (with backoff) and re-attaches
// every namespace it holds, remapping a bank in place (same address) if the
// daemon recreated it. During the outage Lookup answers a miss (an empty
// Lease), Reserve and Commit answer UNAVAILABLE, and the leases and
// reservations of the ended session are void: committing them is
// UNAVAILABLE.
//
// The fence (proto/kvtier/v1/tier.proto, "fence"): the daemon never hands
// rows this process may still write or read to anyone else. After a
// reconnection the library reports the leases and reservations it still
// holds; each becomes a fence hold that releasing, aborting or committing
// the handle (after its stream, for the *After calls) frees. Use the
// stream-ordered AbortAfter / ReleaseAfter where copies may be queued: a
// Reservation destroyed without Commit or Abort in a process where work may
// be queued (a CUDA device, or a ReferenceStream) keeps its rows fenced
// until the process exits.
//
// The API exposes no protobuf types (absl::Status/StatusOr and absl::Span
// only); it speaks the engine protocol (common/fast_lookup.h), no gRPC. Outage
// statuses carry an ErrorReason payload (common/error_reason.h).
//
// Thread-safety: Client and Namespace are thread-safe. Lease and Reservation
// are move-only handles owned by one thread at a time; their destructors
// release the pin / abort the reservation.
#ifndef KVTIER_CLIENT_CLIENT_H_
#define KVTIER_CLIENT_CLIENT_H_

#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "client/block_hash.h"
#include "client/pool.h"

namespace kvtier::v1 {
class LookupRequest;
}  // namespace kvtier::v1

namespace kvtier::client {

class Reservation;

class TransferEngine;
enum class Backend;
struct Connection;
struct NamespaceState;
// Runs `on_end` (on libkvtier's session thread) once the daemon session
// that made `r` has ended, or at once if it has; returns a token for
// UnwatchSessionEnd. Mirrors stop storing into rows of an ended session
// through it (client/mirror.h). Internal: not exported by libkvtier.so.
uint64_t WatchSessionEnd(const Reservation& r, std::function<void()> on_end);
void UnwatchSessionEnd(const Reservation& r, uint64_t token);

// One per-page bank of a namespace (KV codes, scales, ...).
struct BankLayout {
  std::string name;        // [a-z0-9_]{1,32}; "kv" first by convention.
  uint64_t row_bytes = 0;  // Bytes of one page in this bank.
  std::string dtype;       // Informational; part of the fingerprint.
};

// Everything that decides whether two engines can share rows.
struct Layout {
  std::string model;
  uint32_t tokens_per_page = 16;
  uint32_t num_layers = 0;
  std::vector<BankLayout> page_banks;
  uint64_t snapshot_row_bytes = 0;  // 0: no snapshots (not hybrid).
  uint32_t tp_size = 1;
  bool replicated = false;  // KV identical on every rank (MLA): stored once.
  HashKind hash_kind = HashKind::kSha256;
};

// Bank sizes used when this attach creates the namespace (0: daemon default).
struct Capacity {
  uint64_t page_rows = 0;
  uint64_t snapshot_rows = 0;
  uint32_t max_replay_tokens = 0;
};

struct ConnectOptions {
  std::string socket;       // Empty: $KVTIER_SOCKET, /run/kvtier, default.
  std::string client_name;  // Shown to operators.
  absl::Duration timeout = absl::Seconds(5);  // Connect and per-call deadline.
  // Send lookups as the engine protocol's binary lookup frames
  // (common/fast_lookup.h); false: as Lookup calls (protobuf), the way
  // LookupWithDevice always goes. Both ask the same daemon code.
  bool fast_lookup = true;
  // Reopen the session and re-attach the namespaces when the daemon goes
  // away (retrying every 20 ms, backing off to 1 s); false: stay down.
  bool reconnect = true;
  // The client instance this Client belongs to (fence protocol): 16 bytes
  // shared by the processes of one engine that share leases and
  // reservations (vLLM's scheduler and workers). Empty: a fresh random id,
  // this Client alone.
  std::string instance_id;
};

struct AttachOptions {
  std::string name;
  Layout layout;
  uint32_t tp_rank = 0;
  Capacity capacity;
  std::string tenant_salt;
  // Register the banks with CUDA (cudaHostRegister, mapped) when a device is
  // present. Without a device the attach is host-only either way.
  bool register_with_cuda = true;
  // The PCI bus id of the GPU that copies this rank's rows, for the banks'
  // NUMA placement (kvtierd --bank_numa_node). Empty: the calling thread's
  // current CUDA device when register_with_cuda, else none.
  std::string pci_bus_id;
};

// A mapped bank: row r starts at base + r * row_stride. When registered,
// `base` is also the device address (UVA). Every field is immutable once
// Attach returned, across daemon restarts too: a recreated bank is mapped
// over the same range (client/bank_mapping.h), so engine threads may read
// these without a lock. cuda_registered says the bank was registered at
// attach; Namespace::cuda_registered() says whether it still is.
struct BankMapping {
  std::string name;
  uint8_t* base = nullptr;
  uint64_t rows = 0;
  uint64_t row_bytes = 0;
  uint64_t row_stride = 0;
  bool cuda_registered = false;
  bool huge_pages = false;
  std::string path;
};

// What Namespace::Prefetch answered (proto/kvtier/v1/tier.proto,
// "prefetch"), in pages of the chain it was given.
struct PrefetchResult {
  uint32_t local_pages = 0;  // The local match (complete on every rank).
  // Pages past local_pages that this prefetch brings in from the cluster
  // tier; 0 when it holds none, or when a running prefetch already brings
  // them in (prefetching_pages says how many).
  uint32_t remote_pages = 0;
  uint32_t prefetching_pages = 0;
};

struct CommitResult {
  uint32_t committed_pages = 0;
  uint32_t deduplicated_pages = 0;
  uint32_t committed_snapshots = 0;
  uint32_t deduplicated_snapshots = 0;
};

// Where a reserved snapshot row goes: the state after the page `hash`.
struct SnapshotPlacement {
  uint32_t index = 0;  // Into Reservation::snapshot_rows().
  std::string hash;
};

// A daemon-owned GPU pool of snapshot slots (kvtierd --device_pool_bytes),
// as Attach reported it; open it with kvtier::client::DevicePoolHandle
// (client/device_pool_client.h). Valid only for the daemon session that
// reported it: after a daemon restart, attach again.
struct DevicePoolInfo {
  int device_ordinal = 0;  // In the daemon's CUDA numbering.
  std::string pci_bus_id;  // Match GPUs by this.
  std::string ipc_handle;  // 64 bytes: a cudaIpcMemHandle_t.
  uint64_t rows = 0;
  uint64_t row_bytes = 0;
  uint64_t row_stride = 0;
  // The pool does not serve this namespace (kvtierd
  // --device_pool_namespaces): no handle; DevicePoolHandle::Open is
  // PERMISSION_DENIED. Listed so that indices stay the daemon's.
  bool withheld = false;
};

// The answer of a Lookup. When pinned, the rows stay valid until Release
// (or the destructor, or the session's end).
class Lease {
 public:
  Lease() = default;
  Lease(Lease&&) noexcept;
  Lease& operator=(Lease&&) noexcept;
  ~Lease();

  uint32_t matched_pages() const { return matched_pages_; }
  uint32_t usable_pages() const { return usable_pages_; }
  absl::Span<const uint32_t> rows() const { return rows_; }
  bool has_snapshot() const { return has_snapshot_; }
  uint32_t snapshot_row() const { return snapshot_row_; }
  // The same snapshot is also in the device pool the lookup named, in this
  // slot (pinned with the lease): restore it device-to-device.
  bool has_device_snapshot() const { return has_device_snapshot_; }
  uint32_t device_snapshot_row() const { return device_snapshot_row_; }
  // From LookupRemote (0 for any other lookup): the pages past
  // matched_pages() that the daemon's cluster tier holds for every rank, and
  // those a running prefetch is bringing into the host tier (each
  // consecutive from matched_pages()). Neither is pinned or readable yet:
  // Prefetch brings the first in; later lookups see both locally.
  uint32_t remote_pages() const { return remote_pages_; }
  uint32_t prefetching_pages() const { return prefetching_pages_; }
  bool pinned() const { return lease_id_ != 0; }

  // Releases the pin now. REQUIRES: the engine's copies from these rows have
  // finished (else use ReleaseAfter).
  absl::Status Release();
  // Releases the pin once the work queued on `stream` (a cudaStream_t; null
  // is CUDA's default stream; or a ReferenceStream's handle) so far has
  // finished, without blocking the calling thread. In a process without a
  // GPU, with a null stream: releases now.
  void ReleaseAfter(void* stream);

 private:
  friend class Namespace;
  // Registers a pinned lease with the fence tracker; `hashes` is the
  // looked-up chain.
  void Track(std::string_view hashes);
  std::shared_ptr<NamespaceState> ns_;
  uint64_t lease_id_ = 0;
  uint64_t track_ = 0;  // FenceTracker token.
  uint64_t epoch_ = 0;  // The session (Connection::epoch) that pinned it.
  uint32_t matched_pages_ = 0;
  uint32_t usable_pages_ = 0;
  std::vector<uint32_t> rows_;
  bool has_snapshot_ = false;
  uint32_t snapshot_row_ = 0;
  bool has_device_snapshot_ = false;
  uint32_t device_snapshot_row_ = 0;
  uint32_t remote_pages_ = 0;
  uint32_t prefetching_pages_ = 0;
};

// Rows reserved for writing; invisible until Commit. The destructor aborts a
// reservation that was neither committed nor aborted.
class Reservation {
 public:
  Reservation() = default;
  Reservation(Reservation&&) noexcept;
  Reservation& operator=(Reservation&&) noexcept;
  ~Reservation();

  uint64_t id() const { return id_; }
  // Bytes of one hash in this reservation's namespace.
  uint32_t hash_bytes() const;
  absl::Span<const uint32_t> page_rows() const { return page_rows_; }
  absl::Span<const uint32_t> snapshot_rows() const { return snapshot_rows_; }
  // Slots of the device pool named at Reserve.
  absl::Span<const uint32_t> device_snapshot_rows() const {
    return device_snapshot_rows_;
  }

  // Makes the rows visible under `hashes` (one per page row, packed; see
  // BlockHasher) below `parent_hash` (empty: first pages). REQUIRES: the
  // rows are fully written (else use CommitAfter).
  // `device_snapshots` place device slots (index into
  // device_snapshot_rows()) the same way; a device slot is served only where
  // the host index holds the same snapshot.
  absl::StatusOr<CommitResult> Commit(
      std::string_view parent_hash, std::string_view hashes,
      const std::vector<SnapshotPlacement>& snapshots = {},
      const std::vector<SnapshotPlacement>& device_snapshots = {});
  // Commits once the work queued on `stream` so far has finished, without
  // blocking the calling thread: the stream's host callback hands the commit
  // to libkvtier's worker thread. The future holds the result.
  std::future<absl::StatusOr<CommitResult>> CommitAfter(
      void* stream, std::string parent_hash, std::string hashes,
      std::vector<SnapshotPlacement> snapshots = {});
  // The token ids of the pages this reservation will commit
  // (tokens_per_page per page, in order), sent with its Commit or
  // CommitAfter for the daemon's KV events (BlockStored carries them to
  // cache-aware routers; the daemon does not keep them). Optional; a count
  // other than tokens_per_page x the committed hashes makes the commit
  // INVALID_ARGUMENT.
  void SetTokenIds(std::vector<uint32_t> token_ids) {
    token_ids_ = std::move(token_ids);
  }
  // Returns the rows. REQUIRES: no work that writes them is queued (else
  // AbortAfter).
  absl::Status Abort();
  // Returns the rows once the work queued on `stream` so far has finished,
  // without blocking. Until then they stay reserved (and fenced, should the
  // session end). When the callback cannot be queued the rows stay fenced
  // until the process exits.
  void AbortAfter(void* stream);

 private:
  friend class Namespace;
  friend uint64_t WatchSessionEnd(const Reservation& r,
                                  std::function<void()> on_end);
  friend void UnwatchSessionEnd(const Reservation& r, uint64_t token);
  // What the destructor (and a move over a live reservation) does: abort,
  // or fence the rows where copies into them may still be queued.
  void Drop();
  std::shared_ptr<NamespaceState> ns_;
  uint64_t id_ = 0;
  uint64_t track_ = 0;  // FenceTracker token.
  uint64_t epoch_ = 0;  // The session (Connection::epoch) that reserved it.
  std::vector<uint32_t> page_rows_;
  std::vector<uint32_t> snapshot_rows_;
  std::vector<uint32_t> device_snapshot_rows_;
  std::vector<uint32_t> token_ids_;  // see SetTokenIds
};

class Namespace {
 public:
  ~Namespace();
  Namespace(const Namespace&) = delete;
  Namespace& operator=(const Namespace&) = delete;

  uint64_t id() const;
  const std::string& name() const;
  const Layout& layout() const;
  uint32_t tp_rank() const;
  bool created() const;  // This attach created the namespace.
  // The pattern of the daemon's --namespace_acl entry governing this
  // namespace, as the first Attach reported it; "" when none does (every
  // session of the engine socket may then attach and write its rows).
  const std::string& acl_entry() const;
  // True while every bank is registered with CUDA (false during a remap
  // after a daemon restart, and after a failed re-registration).
  bool cuda_registered() const;
  const BlockHasher& hasher() const;
  const std::vector<BankMapping>& page_banks() const;
  const BankMapping* snapshot_bank() const;  // nullptr when not hybrid.
  // Seconds spent mapping and registering the banks at attach.
  double map_seconds() const;
  double register_seconds() const;
  // The daemon's device pools as the first Attach reported them (empty
  // unless kvtierd runs with --device_pool_bytes).
  const std::vector<DevicePoolInfo>& device_pools() const;
  // True while the daemon session that reported device_pools() is the
  // current, open one; false forever once it ends (the daemon stopped or
  // restarted: its GPU memory is gone).
  bool device_pools_valid() const;

  // Longest cached run of `hashes` (packed chain, hash_bytes each). While the
  // daemon is unreachable (or restarted and not yet re-attached): a miss, an
  // empty unpinned Lease. Errors only for a bad request (INVALID_ARGUMENT
  // naming the field) and refusals unrelated to an outage.
  absl::StatusOr<Lease> Lookup(std::string_view hashes, bool pin = true);
  // Lookup that also asks device pool `device_pool` (index into
  // device_pools()) for the usable snapshot (Lease::has_device_snapshot).
  // Always a Lookup call. While !device_pools_valid(): a host-only Lookup.
  absl::StatusOr<Lease> LookupWithDevice(std::string_view hashes,
                                         uint32_t device_pool, bool pin = true);
  // Lookup that also asks the daemon's cluster tier (kvtierd
  // --cluster_redis) how far the chain continues past the local match, and
  // how much of it a running prefetch brings in (Lease::remote_pages,
  // Lease::prefetching_pages; both 0 from a daemon without a cluster tier).
  // Always a Lookup call, never the binary lookup frame. The local part is
  // Lookup's: pinned as `pin` asks, a miss while the daemon is unreachable.
  absl::StatusOr<Lease> LookupRemote(std::string_view hashes, bool pin = true);
  // Starts bringing the continuation of `hashes` (the packed chain from its
  // first page, as for Lookup) past the local match from the cluster tier
  // into the host tier, and returns at once: later lookups see the pages
  // locally, slice by slice. Without a cluster tier nothing starts
  // (remote_pages 0). INVALID_ARGUMENT naming the field for a bad chain;
  // UNAVAILABLE (reason kDaemonUnreachable, client/outage.h) while the
  // daemon is unreachable or not re-attached.
  absl::StatusOr<PrefetchResult> Prefetch(std::string_view hashes);
  // UNAVAILABLE while the daemon is unreachable or not re-attached;
  // with device_snapshots > 0 also while !device_pools_valid().
  absl::StatusOr<Reservation> Reserve(uint32_t pages, uint32_t snapshots = 0,
                                      uint32_t device_snapshots = 0,
                                      uint32_t device_pool = 0);
  // Commits pages of a write-through mirror (a reservation of this session,
  // see client/mirror.h) into the prefix index: the daemon copies the rows
  // mirror.page_rows()[mirror_indices[i]] host-to-host into fresh rows and
  // commits them under `hashes` (packed, one per index) below `parent_hash`.
  // `mirror` stays reserved. REQUIRES: those rows are fully written.
  // UNAVAILABLE while the daemon is unreachable or when `mirror` belongs to
  // an ended session.
  absl::StatusOr<CommitResult> AdoptMirror(
      const Reservation& mirror, absl::Span<const uint32_t> mirror_indices,
      std::string_view parent_hash, std::string_view hashes);

  // A transfer engine over this namespace's banks and the engine's GPU pool
  // (Backend::kCuda), or over host memory (kReference, for tests).
  // max_ctas: most CTAs one copy launch uses (0: the default).
  absl::StatusOr<std::unique_ptr<TransferEngine>> CreateTransferEngine(
      Backend backend, const GpuPoolDescriptor& pool,
      uint32_t max_ctas = 0) const;

 private:
  friend class Client;
  explicit Namespace(std::shared_ptr<NamespaceState> state);
  // The Lookup call of a lookup whose `req` NamespaceState::Fill filled at
  // `epoch`: asks the daemon for `hashes` and turns the answer into a Lease;
  // a miss during an outage or when the session changed meanwhile.
  absl::StatusOr<Lease> LookupOverCall(v1::LookupRequest& req,
                                       std::string_view hashes, bool pin,
                                       uint64_t epoch);
  std::shared_ptr<NamespaceState> state_;
};

struct DropResult {
  uint64_t dropped_pages = 0;
  uint64_t dropped_snapshots = 0;
};

class Client {
 public:
  // Connects to the daemon and opens this process's session.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(
      const ConnectOptions& options);
  // Closes the session: the daemon releases its pins and reservations.
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  uint64_t session_id() const;
  const std::string& socket() const;
  // False from the moment the daemon's session ends (it stopped, died or
  // restarted) until a new one is open and every namespace re-attached.
  // session_id() changes with each new session.
  bool session_alive() const;
  // True while lookups go as binary frames rather than Lookup calls.
  bool fast_lookup_active() const;

  // Creates or opens a namespace and maps its banks.
  absl::StatusOr<std::unique_ptr<Namespace>> Attach(
      const AttachOptions& options);
  // Drops a namespace (hash empty) or the prefix subtree under `hash`.
  absl::StatusOr<DropResult> Drop(const std::string& name,
                                  std::string_view hash = {},
                                  bool force = false);

 private:
  explicit Client(std::shared_ptr<Connection> connection);
  std::shared_ptr<Connection> connection_;
};

}  // namespace kvtier::client

#endif  // KVTIER_CLIENT_CLIENT_H_
