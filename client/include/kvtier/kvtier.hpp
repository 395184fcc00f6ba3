// libkvtier's C++ API: a thin, header-only layer over the C ABI
// (kvtier/kvtier.h), the way NCCL and ONNX Runtime ship theirs. It needs
// nothing but the C++17 standard library and libkvtier.so: no abseil, no
// protobuf, no gRPC, so an engine built with its own copies (or an older
// C++ standard) can use it.
//
//   kvtier::ConnectOptions co;
//   co.client_name = "engine-0";
//   kvtier::Result<kvtier::Client> client = kvtier::Client::Connect(co);
//   if (!client.ok()) return client.status();
//   auto ns = client->Attach(options);
//   auto hashes = ns->HashTokens(tokens.data(), tokens.size());
//   auto lease = ns->Lookup(*hashes);
//   auto res = ns->Reserve(pages);
//   ... transfer->Evict(gpu_pages, res->page_rows().data(), n, stream) ...
//   auto pending = res->CommitAfter(stream, {}, *hashes);  // never blocks
//
// Errors are values, as everywhere in kvtier: a call that can fail returns
// a Status (code + message, the C ABI's kvt_status and kvt_last_error()) or
// a Result<T> holding either a T or a non-OK Status. No exceptions: the C
// ABI reports failures by code, and engines built with -fno-exceptions can
// use this header as it is. The semantics of every call are those of the C
// function it wraps (kvtier/kvtier.h), outages included: while the daemon is
// unreachable a lookup is a miss and a reservation UNAVAILABLE.
//
// Handles (Client, Namespace, Lease, Reservation, PendingCommit, Transfer,
// DevicePool, Mirror) are move-only RAII owners of one kvt_* handle; the
// destructor releases it (a Lease's pin, a Reservation's rows: see each
// class). They may be destroyed in any order, except that a Transfer,
// DevicePool or Mirror uses its Namespace: REQUIRES the Namespace to outlive
// them.
//
// This file holds Client and Namespace and includes the rest of the layer;
// include it, not the parts:
//   kvtier/kvtier_status.hpp    Status, Result, Span
//   kvtier/kvtier_lease.hpp     Lease, Reservation, PendingCommit
//   kvtier/kvtier_transfer.hpp  Pool, Transfer
//   kvtier/kvtier_device.hpp    DevicePool, Mirror
//
// Thread-safety: as the C ABI: Client, Namespace and DevicePool may be used
// from many threads; a Lease, Reservation, PendingCommit or Transfer by one
// thread at a time, a Mirror by one thread and one stream at a time. Status
// and Result are plain values.
#ifndef KVTIER_KVTIER_HPP_
#define KVTIER_KVTIER_HPP_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kvtier/kvtier.h"
#include "kvtier/kvtier_device.hpp"
#include "kvtier/kvtier_lease.hpp"
#include "kvtier/kvtier_status.hpp"
#include "kvtier/kvtier_transfer.hpp"

namespace kvtier {

enum class HashKind : int32_t {
  kSha256 = KVT_HASH_SHA256,
  kXxh3_128 = KVT_HASH_XXH3_128,
};

struct ConnectOptions {
  std::string socket;       // Empty: $KVTIER_SOCKET, /run/kvtier, default.
  std::string client_name;  // Shown to operators.
  uint32_t timeout_ms = 0;  // Connect and per-RPC deadline; 0: 5000.
  // 16 bytes shared by the processes of one engine (fence protocol); empty:
  // a fresh instance.
  std::string instance_id;
};

struct BankLayout {
  std::string name;  // [a-z0-9_]{1,32}
  uint64_t row_bytes = 0;
  std::string dtype;  // Informational; part of the fingerprint.
};

struct Layout {
  std::string model;
  uint32_t tokens_per_page = 16;
  uint32_t num_layers = 0;
  std::vector<BankLayout> page_banks;
  uint64_t snapshot_row_bytes = 0;  // 0: no snapshots.
  uint32_t tp_size = 1;
  bool replicated = false;  // One copy for the whole TP group (MLA).
  HashKind hash_kind = HashKind::kSha256;
};

struct AttachOptions {
  std::string name;
  Layout layout;
  uint32_t tp_rank = 0;
  uint64_t page_rows = 0;      // 0: the daemon's default.
  uint64_t snapshot_rows = 0;  // 0: the daemon's default (hybrid only).
  uint32_t max_replay_tokens = 0;
  std::string tenant_salt;
  bool register_with_cuda = true;  // cudaHostRegister when a GPU exists.
};

// A mapped bank: row r starts at base + r * row_stride; when registered,
// base is also the device address. `name` is valid while the Namespace is.
struct BankInfo {
  std::string_view name;
  void* base = nullptr;
  uint64_t rows = 0;
  uint64_t row_bytes = 0;
  uint64_t row_stride = 0;
  bool cuda_registered = false;
  bool huge_pages = false;
};

// What Namespace::Prefetch answered (kvt_prefetch_result), in pages of the
// chain it was given.
struct PrefetchResult {
  uint32_t local_pages = 0;  // The local match (complete on every rank).
  // Pages past local_pages that this prefetch brings in: 0 when the cluster
  // tier holds none, or when a running prefetch already brings them in
  // (prefetching_pages then says how many).
  uint32_t remote_pages = 0;
  uint32_t prefetching_pages = 0;
};

class Namespace {
 public:
  uint64_t id() const { return kvt_namespace_id(h_.get()); }
  // Bytes of one hash.
  uint32_t hash_bytes() const { return kvt_hash_bytes(h_.get()); }
  uint32_t num_page_banks() const { return kvt_num_page_banks(h_.get()); }
  Result<BankInfo> page_bank(uint32_t index) const {
    kvt_bank_info b{};
    const kvt_status s = kvt_page_bank(h_.get(), index, &b);
    if (s != KVT_OK) return Status::FromC(s);
    return ToBankInfo(b);
  }
  // NOT_FOUND when the namespace has no snapshot bank.
  Result<BankInfo> snapshot_bank() const {
    kvt_bank_info b{};
    const kvt_status s = kvt_snapshot_bank(h_.get(), &b);
    if (s != KVT_OK) return Status::FromC(s);
    return ToBankInfo(b);
  }

  // The hash chain (hash_bytes() per full page, packed) of `tokens`,
  // continuing from `parent` when not empty.
  Result<std::string> HashTokens(const int32_t* tokens, size_t num_tokens,
                                 std::string_view parent = {},
                                 std::string_view extra_key = {}) const {
    const size_t pages =
        tokens_per_page_ == 0 ? 0 : num_tokens / tokens_per_page_;
    std::string out(static_cast<size_t>(hash_bytes()) * pages, '\0');
    size_t n = 0;
    const kvt_status s = kvt_hash_tokens(
        h_.get(), tokens, num_tokens,
        parent.empty() ? nullptr : internal::Bytes(parent), parent.size(),
        internal::Bytes(extra_key), extra_key.size(),
        reinterpret_cast<uint8_t*>(out.data()), out.size(), &n);
    if (s != KVT_OK) return Status::FromC(s);
    out.resize(n * hash_bytes());
    return out;
  }

  // Longest cached run of `hashes` (packed, a multiple of hash_bytes()).
  // While the daemon is unreachable: a miss, an unpinned empty lease.
  Result<Lease> Lookup(std::string_view hashes, bool pin = true) {
    size_t n = 0;
    if (Status s = internal::CountHashes(hashes, hash_bytes(), &n); !s.ok()) {
      return s;
    }
    kvt_lease* l = nullptr;
    const kvt_status s =
        kvt_lookup(h_.get(), internal::Bytes(hashes), n, pin ? 1 : 0, &l);
    if (s != KVT_OK) return Status::FromC(s);
    return Lease(l);
  }
  // Lookup that also asks the daemon's cluster tier (kvtierd
  // --cluster_redis) how far the chain continues past the local match
  // (Lease::remote_pages) and how much of it a running prefetch brings in
  // (Lease::prefetching_pages); both 0 from a daemon without a cluster
  // tier. Always a protobuf Lookup call. While the daemon is unreachable: a
  // miss, as Lookup.
  Result<Lease> LookupRemote(std::string_view hashes, bool pin = true) {
    size_t n = 0;
    if (Status s = internal::CountHashes(hashes, hash_bytes(), &n); !s.ok()) {
      return s;
    }
    kvt_lease* l = nullptr;
    const kvt_status s = kvt_lookup_remote(h_.get(), internal::Bytes(hashes), n,
                                           pin ? 1 : 0, &l);
    if (s != KVT_OK) return Status::FromC(s);
    return Lease(l);
  }
  // Starts bringing the continuation of `hashes` (the chain from its first
  // page, packed) past the local match from the cluster tier into the host
  // tier, and returns at once: later lookups see the pages locally. Without
  // a cluster tier nothing starts (remote_pages 0). UNAVAILABLE while the
  // daemon is unreachable.
  Result<PrefetchResult> Prefetch(std::string_view hashes) {
    size_t n = 0;
    if (Status s = internal::CountHashes(hashes, hash_bytes(), &n); !s.ok()) {
      return s;
    }
    kvt_prefetch_result r{};
    const kvt_status s = kvt_prefetch(h_.get(), internal::Bytes(hashes), n, &r);
    if (s != KVT_OK) return Status::FromC(s);
    return PrefetchResult{r.local_pages, r.remote_pages, r.prefetching_pages};
  }
  // UNAVAILABLE while the daemon is unreachable.
  Result<Reservation> Reserve(uint32_t pages, uint32_t snapshots = 0) {
    kvt_reservation* r = nullptr;
    const kvt_status s = kvt_reserve(h_.get(), pages, snapshots, &r);
    if (s != KVT_OK) return Status::FromC(s);
    return Reservation(r, hash_bytes());
  }
  // A transfer engine over this namespace's banks and `pool`; max_ctas: the
  // most CTAs one copy launch uses (0: the default).
  Result<Transfer> CreateTransfer(Backend backend, const Pool& pool,
                                  uint32_t max_ctas = 0) const {
    const internal::CPool p(pool);
    kvt_transfer* t = nullptr;
    const kvt_status s = kvt_transfer_create(
        h_.get(), static_cast<int32_t>(backend), p.pool(), max_ctas, &t);
    if (s != KVT_OK) return Status::FromC(s);
    return Transfer(t);
  }

  // ---- Device pools (kvtier/kvtier_device.hpp) and mirrors.

  // How many device pools the daemon reported at the first attach (0 unless
  // kvtierd runs with --device_pool_bytes), and whether the session that
  // reported them is still the current, open one (false forever once it
  // ended: attach again).
  uint32_t num_device_pools() const { return kvt_num_device_pools(h_.get()); }
  bool device_pools_valid() const {
    return kvt_device_pools_valid(h_.get()) != 0;
  }
  // Pool `index` as the daemon reported it; OUT_OF_RANGE unless index <
  // num_device_pools().
  Result<DevicePoolInfo> device_pool(uint32_t index) const {
    kvt_device_pool_info p{};
    const kvt_status s = kvt_device_pool(h_.get(), index, &p);
    if (s != KVT_OK) return Status::FromC(s);
    return internal::ToDevicePoolInfo(p);
  }
  // Opens pool `index` on the current CUDA device, which must be the pool's
  // GPU (matched by PCI bus id). INVALID_ARGUMENT naming `index`;
  // PERMISSION_DENIED when withheld; FAILED_PRECONDITION without a device (or
  // a CUDA build) or on another GPU; UNAVAILABLE once the exporting session
  // ended.
  Result<DevicePool> OpenDevicePool(uint32_t index) const {
    kvt_device_pool_handle* p = nullptr;
    const kvt_status s = kvt_device_pool_open(h_.get(), index, &p);
    if (s != KVT_OK) return Status::FromC(s);
    return DevicePool(p);
  }

  // Lookup that also asks device pool `device_pool` for the usable snapshot
  // (Lease::has_device_snapshot). Always a protobuf Lookup call, never the
  // binary lookup frame. While !device_pools_valid(): a host-only lookup.
  // INVALID_ARGUMENT when device_pool is not below num_device_pools().
  Result<Lease> LookupWithDevice(std::string_view hashes, uint32_t device_pool,
                                 bool pin = true) {
    size_t n = 0;
    if (Status s = internal::CountHashes(hashes, hash_bytes(), &n); !s.ok()) {
      return s;
    }
    kvt_lease* l = nullptr;
    const kvt_status s = kvt_lookup_with_device(
        h_.get(), internal::Bytes(hashes), n, device_pool, pin ? 1 : 0, &l);
    if (s != KVT_OK) return Status::FromC(s);
    return Lease(l);
  }
  // Reserve plus `device_snapshots` slots of device pool `device_pool`
  // (Reservation::device_snapshot_rows; place them at Commit). UNAVAILABLE
  // with device_snapshots > 0 while !device_pools_valid().
  Result<Reservation> ReserveWithDevice(uint32_t pages, uint32_t snapshots,
                                        uint32_t device_snapshots,
                                        uint32_t device_pool) {
    kvt_reservation* r = nullptr;
    const kvt_status s = kvt_reserve_with_device(
        h_.get(), pages, snapshots, device_snapshots, device_pool, &r);
    if (s != KVT_OK) return Status::FromC(s);
    return Reservation(r, hash_bytes());
  }

  // A write-through mirror over this namespace's banks and `pool`: reserves
  // options.logical_pages rows, uploads the logical -> row table and
  // allocates the ensure state on pool.device, initialised on `stream` (a
  // cudaStream_t). INVALID_ARGUMENT naming the field for a bad option or a
  // pool that does not match the banks (or max_batch x max_selected >
  // gpu_slots); FAILED_PRECONDITION without CUDA or with banks not
  // registered with CUDA (unless the reference backend); Reserve's errors.
  Result<Mirror> CreateMirror(const Pool& pool, const MirrorOptions& options,
                              void* stream) {
    const internal::CPool p(pool);
    kvt_mirror_options o{};
    o.logical_pages = options.logical_pages;
    o.gpu_slots = options.gpu_slots;
    o.max_batch = options.max_batch;
    o.max_selected = options.max_selected;
    o.max_store_entries = options.max_store_entries;
    o.copy_ctas = options.copy_ctas;
    o.store_ctas = options.store_ctas;
    o.backend = static_cast<int32_t>(options.backend);
    kvt_mirror* m = nullptr;
    const kvt_status s = kvt_mirror_create(h_.get(), p.pool(), &o, stream, &m);
    if (s != KVT_OK) return Status::FromC(s);
    return Mirror(m, hash_bytes());
  }
  // Mirror::Adopt for a reservation of this session used as a mirror (rows
  // written by any means): the daemon copies the rows
  // mirror.page_rows()[mirror_indices[i]] host-to-host into fresh rows and
  // commits them under `hashes` (one per index, packed) below `parent`.
  // `mirror` stays reserved. REQUIRES: those rows are fully written.
  // INVALID_ARGUMENT naming mirror_indices[i] when out of range; UNAVAILABLE
  // when `mirror` belongs to an ended session.
  Result<CommitResult> AdoptMirror(const Reservation& mirror,
                                   Span<uint32_t> mirror_indices,
                                   std::string_view parent,
                                   std::string_view hashes) {
    size_t n = 0;
    if (Status s = internal::CountHashes(hashes, hash_bytes(), &n); !s.ok()) {
      return s;
    }
    kvt_commit_result r{};
    const kvt_status s = kvt_adopt_mirror(
        h_.get(), mirror.h_.get(), mirror_indices.data(), mirror_indices.size(),
        internal::Bytes(parent), parent.size(), internal::Bytes(hashes), n, &r);
    if (s != KVT_OK) return Status::FromC(s);
    return internal::ToCommitResult(r);
  }

  // The C handle, for calls this header does not wrap. Owned by *this.
  kvt_namespace* c_handle() const { return h_.get(); }

 private:
  friend class Client;
  Namespace(kvt_namespace* h, uint32_t tokens_per_page)
      : h_(h), tokens_per_page_(tokens_per_page) {}
  static BankInfo ToBankInfo(const kvt_bank_info& b) {
    return {b.name == nullptr ? std::string_view() : std::string_view(b.name),
            b.base,
            b.rows,
            b.row_bytes,
            b.row_stride,
            b.cuda_registered != 0,
            b.huge_pages != 0};
  }
  internal::Handle<kvt_namespace, kvt_namespace_close> h_;
  uint32_t tokens_per_page_ = 0;
};

class Client {
 public:
  // Connects to the daemon and opens this process's session.
  static Result<Client> Connect(const ConnectOptions& options) {
    kvt_client* c = nullptr;
    const kvt_status s = kvt_connect_instance(
        options.socket.empty() ? nullptr : options.socket.c_str(),
        options.client_name.c_str(), options.timeout_ms,
        options.instance_id.empty() ? nullptr
                                    : internal::Bytes(options.instance_id),
        options.instance_id.size(), &c);
    if (s != KVT_OK) return Status::FromC(s);
    return Client(c);
  }

  uint64_t session_id() const { return kvt_session_id(h_.get()); }
  // False from the moment the daemon's session ends until a new one is open
  // and every namespace re-attached.
  bool session_alive() const { return kvt_session_alive(h_.get()) != 0; }

  // Creates or opens a namespace and maps its banks.
  Result<Namespace> Attach(const AttachOptions& options) {
    std::vector<kvt_bank_layout> banks;
    banks.reserve(options.layout.page_banks.size());
    for (const auto& b : options.layout.page_banks) {
      banks.push_back({b.name.c_str(), b.row_bytes, b.dtype.c_str()});
    }
    kvt_layout l{};
    l.model = options.layout.model.c_str();
    l.tokens_per_page = options.layout.tokens_per_page;
    l.num_layers = options.layout.num_layers;
    l.page_banks = banks.data();
    l.num_page_banks = static_cast<uint32_t>(banks.size());
    l.snapshot_row_bytes = options.layout.snapshot_row_bytes;
    l.tp_size = options.layout.tp_size;
    l.replicated = options.layout.replicated ? 1 : 0;
    l.hash_kind = static_cast<int32_t>(options.layout.hash_kind);
    kvt_attach_options o{};
    o.name = options.name.c_str();
    o.layout = &l;
    o.tp_rank = options.tp_rank;
    o.page_rows = options.page_rows;
    o.snapshot_rows = options.snapshot_rows;
    o.max_replay_tokens = options.max_replay_tokens;
    o.tenant_salt = options.tenant_salt.data();
    o.tenant_salt_len = options.tenant_salt.size();
    o.register_with_cuda = options.register_with_cuda ? 1 : 0;
    kvt_namespace* ns = nullptr;
    const kvt_status s = kvt_attach(h_.get(), &o, &ns);
    if (s != KVT_OK) return Status::FromC(s);
    return Namespace(ns, options.layout.tokens_per_page);
  }
  // Drops a namespace (hash empty) or the prefix subtree under `hash`.
  Status Drop(const std::string& name, std::string_view hash = {},
              bool force = false) {
    return Status::FromC(kvt_drop(h_.get(), name.c_str(), internal::Bytes(hash),
                                  hash.size(), force ? 1 : 0));
  }

  // The C handle, for calls this header does not wrap. Owned by *this.
  kvt_client* c_handle() const { return h_.get(); }

 private:
  explicit Client(kvt_client* h) : h_(h) {}
  internal::Handle<kvt_client, kvt_client_close> h_;
};

}  // namespace kvtier

#endif  // KVTIER_KVTIER_HPP_
