// kvtier::client::Mirror: the client side of the sparse-attention offload.
// Turns the engine's pool descriptor and the namespace's banks into the mirror
// store's and the ensure copy's segment tables once, owns the mirror
// reservation and the ensure state, and enqueues the kernels
// (kernels/sparse_offload*.h).
//
// Thread-safety: one thread and one stream at a time (see mirror.h).

#include "client/mirror.h"

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "client/reference_stream.h"
#include "kernels/sparse_offload.h"

#if KVTIER_HAVE_CUDA
#include <cuda_runtime.h>

#include "kernels/sparse_offload_launch.h"
#endif

namespace kvtier::client {

static_assert(sizeof(MirrorStoreEntry) == sizeof(kernels::MirrorEntry));

struct Mirror::Impl {
  // Immutable after Create.
  Namespace* ns = nullptr;
  Reservation reservation;
  MirrorOptions options;
  kernels::MirrorStoreParams store;
  kernels::EnsureCopyParams copy;
  kernels::EnsureState state;
  uint32_t* d_rows = nullptr;  // [L] logical -> row
  unsigned long long* d_store_drops = nullptr;
  // Set (to 1) once the session that reserved the rows ended: the store
  // kernel, captured graphs included, then writes nothing (mapped host
  // memory; the kernel reads it through revoked_device).
  volatile uint32_t* revoked = nullptr;
  const uint32_t* revoked_device = nullptr;
  uint64_t watch = 0;  // WatchSessionEnd token.
  // The reference backend's host memory (MirrorOptions::reference).
  bool reference = false;
  std::vector<uint32_t> h_rows;
  unsigned long long h_store_drops = 0;
  std::vector<uint64_t> h_state;  // EnsureState arrays.
  volatile uint32_t h_revoked = 0;

  // Points the kernels' headers at the row table, drop counter, revocation
  // flag (as the store kernel reads them) and ensure state, and has the
  // session's end revoke the mirror. REQUIRES: reservation, state and
  // revoked set.
  void WireUp(const uint32_t* rows, unsigned long long* store_drops,
              const volatile uint32_t* kernel_revoked) {
    kernels::MirrorStoreHeader& h = store.header;
    h.max_entries = options.max_store_entries;
    h.num_logical = options.logical_pages;
    h.num_slots = options.gpu_slots;
    h.max_ctas = options.store_ctas;
    h.mirror_rows = rows;
    h.drops = store_drops;
    h.revoked = kernel_revoked;
    kernels::EnsureCopyHeader& c = copy.header;
    c.max_ctas = options.copy_ctas;
    c.max_items = state.max_entries;
    c.copy_slot = state.copy_slot;
    c.copy_row = state.copy_row;
    c.copy_count = state.copy_count;
    // Mirrors stop storing into rows of a session that ended (the daemon
    // fences them until this process reports or exits).
    volatile uint32_t* flag = revoked;
    // Atomic: the session's thread sets it while the engine's thread (and
    // the reference store) read it.
    watch = WatchSessionEnd(
        reservation, [flag] { __atomic_store_n(flag, 1, __ATOMIC_RELEASE); });
  }
#if KVTIER_HAVE_CUDA
  int device = 0;
#endif
};

Mirror::Mirror(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

namespace {

// Fills the segment tables from the pool and the banks.
absl::Status BuildSegments(const Namespace& ns, const GpuPoolDescriptor& pool,
                           kernels::MirrorStoreParams* store,
                           kernels::EnsureCopyParams* copy) {
  const auto& banks = ns.page_banks();
  const uint32_t tpp = ns.layout().tokens_per_page;
  if (pool.banks.size() != banks.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("pool.banks: ", pool.banks.size(),
                     " banks, the namespace has ", banks.size()));
  }
  uint32_t n = 0;
  uint32_t chunks = 0;
  for (size_t b = 0; b < banks.size(); ++b) {
    if (pool.banks[b].bank != banks[b].name) {
      return absl::InvalidArgumentError(
          absl::StrCat("pool.banks[", b, "].bank: '", pool.banks[b].bank,
                       "', the namespace's bank is '", banks[b].name, "'"));
    }
    uint64_t offset = 0;
    for (size_t t = 0; t < pool.banks[b].tensors.size(); ++t) {
      const PoolTensor& pt = pool.banks[b].tensors[t];
      const std::string field =
          absl::StrCat("pool.banks[", b, "].tensors[", t, "]");
      if (n >= kernels::kMaxMirrorSegments) {
        return absl::InvalidArgumentError(absl::StrCat(
            field, ": more than ", kernels::kMaxMirrorSegments, " tensors"));
      }
      if (pt.bytes_per_page == 0 || pt.bytes_per_page >= (1ull << 32)) {
        return absl::InvalidArgumentError(
            absl::StrCat(field, ".bytes_per_page: ", pt.bytes_per_page,
                         " is not in [1, 2^32)"));
      }
      // A tensor that does not split into tokens is mirrored whole on every
      // store of one of its page's tokens.
      const bool per_page = pt.bytes_per_page % tpp != 0;
      const uint64_t host = reinterpret_cast<uint64_t>(banks[b].base) + offset;
      store->segments[n] = {
          .pool_base = pt.base,
          .pool_page_stride = pt.page_stride,
          .bank_base = host,
          .bank_row_stride = banks[b].row_stride,
          .bytes_per_token = static_cast<uint32_t>(
              per_page ? pt.bytes_per_page : pt.bytes_per_page / tpp),
          .per_page = per_page ? 1u : 0u};
      copy->segments[n] = {.gpu_base = pt.base,
                           .gpu_stride = pt.page_stride,
                           .host_base = host,
                           .host_stride = banks[b].row_stride,
                           .bytes = static_cast<uint32_t>(pt.bytes_per_page),
                           .chunk_begin = chunks};
      chunks +=
          static_cast<uint32_t>((pt.bytes_per_page + kernels::kChunkBytes - 1) /
                                kernels::kChunkBytes);
      offset += pt.bytes_per_page;
      ++n;
    }
    if (offset != banks[b].row_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "pool.banks[", b, "]: tensors add up to ", offset,
          " bytes per page, the bank's rows hold ", banks[b].row_bytes));
    }
  }
  if (n == 0) {
    return absl::InvalidArgumentError("pool.banks: no tensors");
  }
  store->header.num_segments = n;
  store->header.tokens_per_page = tpp;
  copy->header.num_segments = n;
  copy->header.chunks_per_item = chunks;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Mirror>> Mirror::Create(
    Namespace& ns, const GpuPoolDescriptor& pool, const MirrorOptions& o,
    void* stream) {
  const kernels::EnsureConfig config{.num_slots = o.gpu_slots,
                                     .num_logical = o.logical_pages,
                                     .max_batch = o.max_batch,
                                     .max_selected = o.max_selected};
  if (absl::Status s = kernels::CheckEnsureConfig(config); !s.ok()) return s;
  if (o.gpu_slots > pool.num_pages) {
    return absl::InvalidArgumentError(absl::StrCat("gpu_slots: ", o.gpu_slots,
                                                   " exceeds pool.num_pages ",
                                                   pool.num_pages));
  }
  if (o.max_store_entries == 0) {
    return absl::InvalidArgumentError("max_store_entries: must be > 0");
  }
  auto impl = std::make_unique<Impl>();
  impl->ns = &ns;
  impl->options = o;
  if (absl::Status s = BuildSegments(ns, pool, &impl->store, &impl->copy);
      !s.ok()) {
    return s;
  }
  if (o.reference) return CreateReference(std::move(impl));
#if !KVTIER_HAVE_CUDA
  (void)stream;
  return absl::FailedPreconditionError(
      "Mirror: libkvtier was built without CUDA");
#else
  if (!ns.cuda_registered()) {
    return absl::FailedPreconditionError(
        "Mirror: the namespace's banks are not registered with CUDA");
  }
  auto res = ns.Reserve(o.logical_pages);
  if (!res.ok()) return res.status();
  impl->reservation = *std::move(res);
  int previous = 0;
  cudaGetDevice(&previous);
  impl->device = pool.device;
  if (cudaSetDevice(pool.device) != cudaSuccess) {
    cudaGetLastError();
    return absl::InvalidArgumentError(
        absl::StrCat("pool.device: cannot use device ", pool.device));
  }
  auto fail = [&](absl::Status s) {
    cudaFree(impl->d_rows);
    cudaFree(impl->d_store_drops);
    if (impl->revoked != nullptr) {
      cudaFreeHost(const_cast<uint32_t*>(impl->revoked));
    }
    cudaSetDevice(previous);
    return s;
  };
  {
    void* flag = nullptr;
    void* device_flag = nullptr;
    if (cudaHostAlloc(&flag, sizeof(uint32_t), cudaHostAllocMapped) !=
            cudaSuccess ||
        cudaHostGetDevicePointer(&device_flag, flag, 0) != cudaSuccess) {
      cudaGetLastError();
      if (flag != nullptr) cudaFreeHost(flag);
      return fail(
          absl::ResourceExhaustedError("Mirror: cudaHostAlloc of the flag"));
    }
    impl->revoked = static_cast<volatile uint32_t*>(flag);
    *impl->revoked = 0;
    impl->revoked_device = static_cast<const uint32_t*>(device_flag);
  }
  const auto rows = impl->reservation.page_rows();
  if (cudaMalloc(&impl->d_rows, rows.size() * 4) != cudaSuccess ||
      cudaMalloc(&impl->d_store_drops, 8) != cudaSuccess) {
    cudaGetLastError();
    return fail(absl::ResourceExhaustedError("Mirror: cudaMalloc failed"));
  }
  auto st = static_cast<cudaStream_t>(stream);
  if (cudaMemcpyAsync(impl->d_rows, rows.data(), rows.size() * 4,
                      cudaMemcpyHostToDevice, st) != cudaSuccess ||
      cudaMemsetAsync(impl->d_store_drops, 0, 8, st) != cudaSuccess) {
    cudaGetLastError();
    return fail(absl::InternalError("Mirror: uploading the row table failed"));
  }
  auto state = kernels::AllocateEnsureState(config, st);
  if (!state.ok()) return fail(state.status());
  impl->state = *state;
  impl->WireUp(impl->d_rows, impl->d_store_drops, impl->revoked_device);
  cudaSetDevice(previous);
  return std::unique_ptr<Mirror>(new Mirror(std::move(impl)));
#endif
}

absl::StatusOr<std::unique_ptr<Mirror>> Mirror::CreateReference(
    std::unique_ptr<Impl> impl) {
  const MirrorOptions& o = impl->options;
  const kernels::EnsureConfig config{.num_slots = o.gpu_slots,
                                     .num_logical = o.logical_pages,
                                     .max_batch = o.max_batch,
                                     .max_selected = o.max_selected};
  auto res = impl->ns->Reserve(o.logical_pages);
  if (!res.ok()) return res.status();
  impl->reservation = *std::move(res);
  impl->reference = true;
  impl->h_rows.assign(impl->reservation.page_rows().begin(),
                      impl->reservation.page_rows().end());
  impl->h_state.resize((kernels::EnsureStateBytes(config) + 7) / 8 + 2);
  uint8_t* mem = reinterpret_cast<uint8_t*>(impl->h_state.data());
  mem += (16 - reinterpret_cast<uintptr_t>(mem) % 16) % 16;
  impl->state = kernels::LayOutEnsureState(config, mem);
  kernels::ResetEnsureStateHost(impl->state);
  impl->revoked = &impl->h_revoked;
  impl->WireUp(impl->h_rows.data(), &impl->h_store_drops, &impl->h_revoked);
  return std::unique_ptr<Mirror>(new Mirror(std::move(impl)));
}

Mirror::~Mirror() {
  if (impl_ == nullptr) return;
  UnwatchSessionEnd(impl_->reservation, impl_->watch);
  // No launch that uses the mirror is pending (the contract): the rows go
  // back at once, or their fence hold after a restart is released.
  (void)impl_->reservation.Abort();
  if (impl_->reference) return;
#if KVTIER_HAVE_CUDA
  if (impl_->revoked != nullptr) {
    cudaFreeHost(const_cast<uint32_t*>(impl_->revoked));
  }
  int previous = 0;
  cudaGetDevice(&previous);
  cudaSetDevice(impl_->device);
  kernels::FreeEnsureState(impl_->state);
  cudaFree(impl_->d_rows);
  cudaFree(impl_->d_store_drops);
  cudaSetDevice(previous);
#endif
}

absl::Span<const uint32_t> Mirror::rows() const {
  return impl_->reservation.page_rows();
}

const Reservation& Mirror::reservation() const { return impl_->reservation; }

const void* Mirror::ensure_drops() const { return impl_->state.drops; }
const void* Mirror::store_drops() const {
  return impl_->reference ? static_cast<const void*>(&impl_->h_store_drops)
                          : impl_->d_store_drops;
}
bool Mirror::revoked() const {
  return impl_->revoked != nullptr &&
         __atomic_load_n(impl_->revoked, __ATOMIC_ACQUIRE) != 0;
}

absl::Status Mirror::Store(const MirrorStoreEntry* entries,
                           const uint32_t* count, void* stream) {
  if (impl_->reference) {
    auto p = std::make_shared<kernels::MirrorStoreParams>(impl_->store);
    p->header.entries = reinterpret_cast<const kernels::MirrorEntry*>(entries);
    p->header.count = count;
    if (absl::Status s = kernels::CheckMirrorStoreParams(*p); !s.ok()) {
      return s;
    }
    if (ReferenceStream* rs = ReferenceStream::FromHandle(stream)) {
      rs->Enqueue([p] { (void)kernels::RunMirrorStoreReference(*p); });
      return absl::OkStatus();
    }
    return kernels::RunMirrorStoreReference(*p);
  }
#if KVTIER_HAVE_CUDA
  kernels::MirrorStoreParams p = impl_->store;
  p.header.entries = reinterpret_cast<const kernels::MirrorEntry*>(entries);
  p.header.count = count;
  return kernels::LaunchMirrorStore(p, static_cast<cudaStream_t>(stream));
#else
  return absl::FailedPreconditionError("Mirror: built without CUDA");
#endif
}

absl::Status Mirror::Ensure(const int32_t* selected, int32_t* translated,
                            void* stream) {
  if (impl_->reference) {
    const kernels::EnsurePlanParams plan{.state = impl_->state,
                                         .selected = selected,
                                         .translated = translated,
                                         .mirror_rows = impl_->h_rows.data()};
    if (absl::Status s = kernels::CheckEnsurePlanParams(plan); !s.ok()) {
      return s;
    }
    auto copy = std::make_shared<kernels::EnsureCopyParams>(impl_->copy);
    auto run = [plan, copy] {
      absl::Status s = kernels::RunEnsurePlanReference(plan);
      return s.ok() ? kernels::RunEnsureCopyReference(*copy) : s;
    };
    if (ReferenceStream* rs = ReferenceStream::FromHandle(stream)) {
      rs->Enqueue([run] { (void)run(); });
      return absl::OkStatus();
    }
    return run();
  }
#if KVTIER_HAVE_CUDA
  const kernels::EnsurePlanParams plan{.state = impl_->state,
                                       .selected = selected,
                                       .translated = translated,
                                       .mirror_rows = impl_->d_rows};
  auto st = static_cast<cudaStream_t>(stream);
  if (absl::Status s = kernels::LaunchEnsurePlan(plan, st); !s.ok()) return s;
  return kernels::LaunchEnsureCopy(impl_->copy, st);
#else
  return absl::FailedPreconditionError("Mirror: built without CUDA");
#endif
}

absl::StatusOr<CommitResult> Mirror::Adopt(
    absl::Span<const uint32_t> logical_pages, std::string_view parent_hash,
    std::string_view hashes) {
  std::vector<uint32_t> indices;
  indices.reserve(logical_pages.size());
  for (size_t i = 0; i < logical_pages.size(); ++i) {
    if (logical_pages[i] >= impl_->options.logical_pages) {
      return absl::InvalidArgumentError(
          absl::StrCat("logical_pages[", i, "]: ", logical_pages[i],
                       " is not below ", impl_->options.logical_pages));
    }
    indices.push_back(logical_pages[i]);
  }
  return impl_->ns->AdoptMirror(impl_->reservation, indices, parent_hash,
                                hashes);
}

}  // namespace kvtier::client
