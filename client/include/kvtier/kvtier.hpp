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
// Handles (Client, Namespace, Lease, Reservation, PendingCommit, Transfer)
// are move-only RAII owners of one kvt_* handle; the destructor releases it
// (a Lease's pin, a Reservation's rows: see each class). They may be
// destroyed in any order, except that a Transfer uses its Namespace's banks:
// REQUIRES the Namespace to outlive its Transfers.
//
// Thread-safety: as the C ABI: Client and Namespace may be used from many
// threads; a Lease, Reservation, PendingCommit or Transfer by one thread at a
// time. Status and Result are plain values.
#ifndef KVTIER_KVTIER_HPP_
#define KVTIER_KVTIER_HPP_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kvtier/kvtier.h"

namespace kvtier {

// The canonical status codes (kvt_status; the same numbers as gRPC).
enum class StatusCode : int {
  kOk = KVT_OK,
  kCancelled = KVT_CANCELLED,
  kUnknown = KVT_UNKNOWN,
  kInvalidArgument = KVT_INVALID_ARGUMENT,
  kDeadlineExceeded = KVT_DEADLINE_EXCEEDED,
  kNotFound = KVT_NOT_FOUND,
  kAlreadyExists = KVT_ALREADY_EXISTS,
  kPermissionDenied = KVT_PERMISSION_DENIED,
  kResourceExhausted = KVT_RESOURCE_EXHAUSTED,
  kFailedPrecondition = KVT_FAILED_PRECONDITION,
  kAborted = KVT_ABORTED,
  kOutOfRange = KVT_OUT_OF_RANGE,
  kUnimplemented = KVT_UNIMPLEMENTED,
  kInternal = KVT_INTERNAL,
  kUnavailable = KVT_UNAVAILABLE,
  kDataLoss = KVT_DATA_LOSS,
  kUnauthenticated = KVT_UNAUTHENTICATED,
};

// A call's outcome: OK, or a code and a message naming what failed.
class Status {
 public:
  Status() = default;  // OK.
  Status(StatusCode code, std::string message)
      : code_(code),
        message_(code == StatusCode::kOk ? "" : std::move(message)) {}
  // The outcome of a C call that returned `s` on this thread: its message is
  // kvt_last_error(), read now (before the thread's next call replaces it).
  static Status FromC(kvt_status s) {
    if (s == KVT_OK) return Status();
    return Status(static_cast<StatusCode>(s), kvt_last_error());
  }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

// Either a T or the non-OK Status that says why there is none.
template <typename T>
class Result {
 public:
  // REQUIRES: !status.ok() (an OK status without a value is UNKNOWN).
  Result(Status status)  // NOLINT: implicit, as absl::StatusOr.
      : status_(status.ok() ? Status(StatusCode::kUnknown,
                                     "Result made from an OK Status")
                            : std::move(status)) {}
  Result(T value) : value_(std::move(value)) {}  // NOLINT: implicit.

  bool ok() const { return value_.has_value(); }
  // OK when a value is held.
  const Status& status() const { return status_; }
  // REQUIRES: ok().
  T& value() & { return *value_; }
  const T& value() const& { return *value_; }
  T&& value() && { return *std::move(value_); }
  T& operator*() & { return *value_; }
  const T& operator*() const& { return *value_; }
  T&& operator*() && { return *std::move(value_); }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }

 private:
  Status status_;
  std::optional<T> value_;
};

// A read-only view of `size` elements (C++17 has no std::span).
template <typename T>
class Span {
 public:
  Span() = default;
  Span(const T* data, size_t size) : data_(data), size_(size) {}
  const T* data() const { return data_; }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  const T* begin() const { return data_; }
  const T* end() const { return data_ + size_; }
  const T& operator[](size_t i) const { return data_[i]; }

 private:
  const T* data_ = nullptr;
  size_t size_ = 0;
};

enum class HashKind : int32_t {
  kSha256 = KVT_HASH_SHA256,
  kXxh3_128 = KVT_HASH_XXH3_128,
};
enum class Backend : int32_t {
  kCuda = KVT_BACKEND_CUDA,            // The engine's GPU pool (CUDA).
  kReference = KVT_BACKEND_REFERENCE,  // Host memory, for tests.
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

struct CommitResult {
  uint32_t committed_pages = 0;
  uint32_t deduplicated_pages = 0;
  uint32_t committed_snapshots = 0;
  uint32_t deduplicated_snapshots = 0;
};

// Where a reserved snapshot row goes: the state after page `hash`.
struct SnapshotPlacement {
  uint32_t index = 0;  // Into Reservation::snapshot_rows().
  std::string hash;    // hash_bytes long.
};

// The engine's GPU pool, as kvt_pool describes it.
struct PoolTensor {
  uint64_t base = 0;  // Device address of page 0 (16-aligned).
  uint64_t page_stride = 0;
  uint64_t bytes_per_page = 0;
};
struct BankPool {
  std::string bank;
  std::vector<PoolTensor> tensors;
};
struct Pool {
  int32_t device = 0;
  uint64_t num_pages = 0;
  std::vector<BankPool> banks;  // One per page bank, in namespace order.
  std::vector<PoolTensor> snapshot;
  uint64_t num_snapshot_slots = 0;
};

namespace internal {

// Owns one kvt_* handle; `Free` releases it. Move-only.
template <typename H, void (*Free)(H*)>
class Handle {
 public:
  Handle() = default;
  explicit Handle(H* h) : h_(h) {}
  Handle(Handle&& o) noexcept : h_(std::exchange(o.h_, nullptr)) {}
  Handle& operator=(Handle&& o) noexcept {
    if (this != &o) {
      reset();
      h_ = std::exchange(o.h_, nullptr);
    }
    return *this;
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  ~Handle() { reset(); }

  H* get() const { return h_; }
  // Gives the handle up (the C call that consumed it freed it).
  H* release() { return std::exchange(h_, nullptr); }
  void reset() {
    if (h_ != nullptr) Free(std::exchange(h_, nullptr));
  }

 private:
  H* h_ = nullptr;
};

inline void ReleaseLease(kvt_lease* l) { (void)kvt_lease_release(l, nullptr); }
inline const uint8_t* Bytes(std::string_view s) {
  return reinterpret_cast<const uint8_t*>(s.data());
}
// *n = hashes.size() / hash_bytes; INVALID_ARGUMENT when that leaves a rest.
inline Status CountHashes(std::string_view hashes, uint32_t hash_bytes,
                          size_t* n) {
  if (hash_bytes == 0 || hashes.size() % hash_bytes != 0) {
    return Status(StatusCode::kInvalidArgument,
                  "hashes: " + std::to_string(hashes.size()) +
                      " bytes, not a multiple of hash_bytes " +
                      std::to_string(hash_bytes));
  }
  *n = hashes.size() / hash_bytes;
  return Status();
}
inline CommitResult ToCommitResult(const kvt_commit_result& r) {
  return {r.committed_pages, r.deduplicated_pages, r.committed_snapshots,
          r.deduplicated_snapshots};
}
inline std::vector<kvt_snapshot_placement> ToC(
    const std::vector<SnapshotPlacement>& snaps) {
  std::vector<kvt_snapshot_placement> out;
  out.reserve(snaps.size());
  for (const auto& s : snaps) out.push_back({s.index, Bytes(s.hash)});
  return out;
}

}  // namespace internal

// The answer of a Lookup. When pinned, the rows stay valid until Release (or
// the destructor, which releases now).
class Lease {
 public:
  uint32_t matched_pages() const { return kvt_lease_matched_pages(h_.get()); }
  uint32_t usable_pages() const { return kvt_lease_usable_pages(h_.get()); }
  // usable_pages() rows, in chain order.
  Span<uint32_t> rows() const {
    return {kvt_lease_rows(h_.get()), usable_pages()};
  }
  bool has_snapshot() const { return kvt_lease_has_snapshot(h_.get()) != 0; }
  uint32_t snapshot_row() const { return kvt_lease_snapshot_row(h_.get()); }

  // Releases the pin: now (stream null; REQUIRES the copies from the rows
  // to have finished), or once the work queued on `stream` so far has
  // finished, without blocking. The lease is empty afterwards.
  Status Release(void* stream = nullptr) {
    if (h_.get() == nullptr) return Status();
    return Status::FromC(kvt_lease_release(h_.release(), stream));
  }

 private:
  friend class Namespace;
  explicit Lease(kvt_lease* h) : h_(h) {}
  internal::Handle<kvt_lease, internal::ReleaseLease> h_;
};

// The result of CommitAfter, to wait on.
class PendingCommit {
 public:
  // Waits (timeout_ms 0: until the commit ran). DEADLINE_EXCEEDED when
  // still pending: wait again. Otherwise the commit's outcome, and the
  // handle is spent.
  Result<CommitResult> Wait(uint32_t timeout_ms = 0) {
    if (h_.get() == nullptr) {
      return Status(StatusCode::kFailedPrecondition,
                    "pending commit: already waited for");
    }
    kvt_commit_result r{};
    const kvt_status s = kvt_pending_wait(h_.get(), timeout_ms, &r);
    if (s == KVT_DEADLINE_EXCEEDED) return Status::FromC(s);
    (void)h_.release();  // kvt_pending_wait freed it.
    if (s != KVT_OK) return Status::FromC(s);
    return internal::ToCommitResult(r);
  }

 private:
  friend class Reservation;
  explicit PendingCommit(kvt_pending_commit* h) : h_(h) {}
  internal::Handle<kvt_pending_commit, kvt_pending_free> h_;
};

// Rows reserved for writing; invisible until Commit. The destructor drops a
// reservation neither committed nor aborted (kvt_reservation_free: aborted,
// or fenced until the process exits where copies may be queued).
class Reservation {
 public:
  uint64_t id() const { return kvt_reservation_id(h_.get()); }
  Span<uint32_t> page_rows() const {
    return {kvt_reservation_page_rows(h_.get()),
            kvt_reservation_num_page_rows(h_.get())};
  }
  Span<uint32_t> snapshot_rows() const {
    return {kvt_reservation_snapshot_rows(h_.get()),
            kvt_reservation_num_snapshot_rows(h_.get())};
  }

  // Makes the rows visible under `hashes` (one per page row, hash_bytes
  // each, packed) below `parent` (empty: first pages). REQUIRES: the rows
  // are fully written. On success the reservation is spent; on failure it
  // stays open (retry, or Abort).
  Result<CommitResult> Commit(
      std::string_view parent, std::string_view hashes,
      const std::vector<SnapshotPlacement>& snaps = {}) {
    size_t num_hashes = 0;
    if (Status s = internal::CountHashes(hashes, hash_bytes_, &num_hashes);
        !s.ok()) {
      return s;
    }
    const auto c = internal::ToC(snaps);
    kvt_commit_result r{};
    const kvt_status s =
        kvt_commit(h_.get(), internal::Bytes(parent), parent.size(),
                   internal::Bytes(hashes), num_hashes, c.data(), c.size(), &r);
    if (s != KVT_OK) return Status::FromC(s);
    (void)h_.release();  // kvt_commit freed it.
    return internal::ToCommitResult(r);
  }
  // Commits once the work queued on `stream` so far has finished, without
  // blocking; the reservation is spent once this returns OK.
  Result<PendingCommit> CommitAfter(
      void* stream, std::string_view parent, std::string_view hashes,
      const std::vector<SnapshotPlacement>& snaps = {}) {
    size_t num_hashes = 0;
    if (Status s = internal::CountHashes(hashes, hash_bytes_, &num_hashes);
        !s.ok()) {
      return s;
    }
    const auto c = internal::ToC(snaps);
    kvt_pending_commit* p = nullptr;
    const kvt_status s = kvt_commit_after(
        h_.get(), stream, internal::Bytes(parent), parent.size(),
        internal::Bytes(hashes), num_hashes, c.data(), c.size(), &p);
    if (s != KVT_OK) return Status::FromC(s);
    (void)h_.release();  // kvt_commit_after freed it.
    return PendingCommit(p);
  }
  // Returns the rows: now (stream null; REQUIRES no queued work writes
  // them), or once the work queued on `stream` so far has finished. The
  // reservation is spent either way.
  Status Abort(void* stream = nullptr) {
    if (h_.get() == nullptr) return Status();
    return Status::FromC(kvt_abort_after(h_.release(), stream));
  }

 private:
  friend class Namespace;
  Reservation(kvt_reservation* h, uint32_t hash_bytes)
      : h_(h), hash_bytes_(hash_bytes) {}
  internal::Handle<kvt_reservation, kvt_reservation_free> h_;
  uint32_t hash_bytes_ = 0;
};

// Copies between the engine's GPU pool and the namespace's banks, queued on
// the engine's streams. REQUIRES: the Namespace outlives it.
class Transfer {
 public:
  // Queues GPU page gpu_pages[i] -> bank row rows[i], for i < n.
  Status Evict(const uint32_t* gpu_pages, const uint32_t* rows, size_t n,
               void* stream) {
    return Status::FromC(kvt_evict(h_.get(), gpu_pages, rows, n, stream));
  }
  // Queues bank row rows[i] -> GPU page gpu_pages[i], for i < n.
  Status Rehydrate(const uint32_t* gpu_pages, const uint32_t* rows, size_t n,
                   void* stream) {
    return Status::FromC(kvt_rehydrate(h_.get(), gpu_pages, rows, n, stream));
  }
  Status SaveSnapshot(uint32_t slot, uint32_t row, void* stream) {
    return Status::FromC(kvt_snapshot_save(h_.get(), slot, row, stream));
  }
  Status RestoreSnapshot(uint32_t slot, uint32_t row, void* stream) {
    return Status::FromC(kvt_snapshot_restore(h_.get(), slot, row, stream));
  }

 private:
  friend class Namespace;
  explicit Transfer(kvt_transfer* h) : h_(h) {}
  internal::Handle<kvt_transfer, kvt_transfer_free> h_;
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
    std::vector<std::vector<kvt_pool_tensor>> tensors;
    std::vector<kvt_bank_pool> banks;
    tensors.reserve(pool.banks.size());
    for (const auto& b : pool.banks) {
      tensors.push_back(ToC(b.tensors));
      banks.push_back({b.bank.c_str(), tensors.back().data(),
                       static_cast<uint32_t>(tensors.back().size())});
    }
    const std::vector<kvt_pool_tensor> snapshot = ToC(pool.snapshot);
    kvt_pool p{};
    p.device = pool.device;
    p.num_pages = pool.num_pages;
    p.banks = banks.data();
    p.num_banks = static_cast<uint32_t>(banks.size());
    p.snapshot = snapshot.empty() ? nullptr : snapshot.data();
    p.num_snapshot_tensors = static_cast<uint32_t>(snapshot.size());
    p.num_snapshot_slots = pool.num_snapshot_slots;
    kvt_transfer* t = nullptr;
    const kvt_status s = kvt_transfer_create(
        h_.get(), static_cast<int32_t>(backend), &p, max_ctas, &t);
    if (s != KVT_OK) return Status::FromC(s);
    return Transfer(t);
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
  static std::vector<kvt_pool_tensor> ToC(const std::vector<PoolTensor>& ts) {
    std::vector<kvt_pool_tensor> out;
    out.reserve(ts.size());
    for (const auto& t : ts)
      out.push_back({t.base, t.page_stride, t.bytes_per_page});
    return out;
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
