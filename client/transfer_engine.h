// TransferEngine: copies pages between an engine's GPU KV pool and the
// namespace's host banks, and recurrent-state snapshots between GPU slots and
// snapshot rows. It executes a TransferPlan slice by slice (at most
// kMaxSlicePages pages per kernel launch) on one of two backends:
// - kCuda: the page copy kernel on the caller's stream. Launches are
//   asynchronous and allocate nothing (the only extra device memory is each
//   launch's ~31 KiB parameter block, held by the driver), so a transfer can
//   be captured in a CUDA graph. The engine never synchronises the device;
//   it switches to the pool's device for a launch and restores the caller's
//   current device afterwards.
// - kReference: the same plan executed with memcpy on the calling thread; the
//   pool's "device addresses" are ordinary host pointers. CPU tests use it.
//
// Errors: every argument is checked before the first launch, so a call that
// returns INVALID_ARGUMENT or FAILED_PRECONDITION has written nothing. A
// launch failure (INTERNAL) after some slices were enqueued leaves those
// slices' destinations written: the rows of an uncommitted reservation, or
// GPU pages the engine has not published yet.
//
// Thread-safety: thread-safe. Concurrent calls are fine; ordering between
// transfers is the caller's business (streams, events).

#ifndef KVTIER_CLIENT_TRANSFER_ENGINE_H_
#define KVTIER_CLIENT_TRANSFER_ENGINE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "client/transfer_plan.h"
#include "kernels/page_copy.h"
#include "kvtier/pool.h"

namespace kvtier::client {

enum class Backend { kCuda, kReference };

class TransferEngine {
 public:
  // Validates `pool` against `page_banks` (the namespace's page banks, in
  // namespace order) and `snapshot_bank` (see TransferPlan::Create for every
  // rule) and returns an engine.
  // kCuda returns FAILED_PRECONDITION when libkvtier was built without CUDA
  // or no CUDA device is present, INVALID_ARGUMENT when pool.device is not a
  // device ordinal, when a tensor is not device memory of pool.device, or
  // when a host bank is not host memory registered as mapped
  // (cudaHostRegisterMapped) and given by its device pointer. These checks
  // run once here (cudaPointerGetAttributes on each range's first and last
  // byte), never per transfer.
  static absl::StatusOr<std::unique_ptr<TransferEngine>> Create(
      Backend backend, const GpuPoolDescriptor& pool,
      std::vector<NamedHostBank> page_banks,
      std::optional<HostBankView> snapshot_bank,
      const TransferOptions& options = {});

  TransferEngine(const TransferEngine&) = delete;
  TransferEngine& operator=(const TransferEngine&) = delete;

  // Copies GPU page gpu_pages[i] into row rows[i] of every page bank (a
  // gather), enqueued on `stream` (a cudaStream_t; ignored by kReference,
  // which copies before returning). The rows are complete once the stream
  // reaches this point; commit them only after that.
  // REQUIRES: gpu_pages.size() == rows.size(); pages < num_pages; rows < the
  // banks' rows and distinct. Returns INVALID_ARGUMENT naming the field and
  // index otherwise (nothing copied).
  absl::Status Evict(absl::Span<const uint32_t> gpu_pages,
                     absl::Span<const uint32_t> rows, void* stream);

  // Copies row rows[i] of every page bank into GPU page gpu_pages[i] (a
  // scatter), enqueued on `stream` as for Evict. The rows must stay leased
  // until the stream has passed this point.
  // REQUIRES: as for Evict, with gpu_pages (the destinations) distinct
  // instead of rows.
  absl::Status Rehydrate(absl::Span<const uint32_t> gpu_pages,
                         absl::Span<const uint32_t> rows, void* stream);

  // Copies snapshot slot `slot` into snapshot row `row`, enqueued on
  // `stream`. FAILED_PRECONDITION if the pool has no snapshot segments;
  // INVALID_ARGUMENT if slot or row is out of range.
  absl::Status SaveSnapshot(uint32_t slot, uint32_t row, void* stream);

  // Copies snapshot row `row` into snapshot slot `slot`; as SaveSnapshot.
  absl::Status RestoreSnapshot(uint32_t slot, uint32_t row, void* stream);

  // Kernel launches (or reference runs) so far: one per slice of a page
  // transfer, one per snapshot copy. For tests.
  uint64_t slices_launched() const {
    return slices_launched_.load(std::memory_order_relaxed);
  }

  Backend backend() const { return backend_; }
  const TransferPlan& plan() const { return plan_; }

 private:
  TransferEngine(Backend backend, TransferPlan plan)
      : backend_(backend), plan_(std::move(plan)) {}

  absl::Status CopyPages(kernels::CopyDirection direction,
                         absl::Span<const uint32_t> gpu_pages,
                         absl::Span<const uint32_t> rows, void* stream);
  absl::Status CopySnapshot(kernels::CopyDirection direction, uint32_t slot,
                            uint32_t row, void* stream);
  // Runs one parameter block on the backend.
  absl::Status Run(const kernels::PageCopyParams& params, void* stream);

  // Immutable after construction.
  const Backend backend_;
  const TransferPlan plan_;

  std::atomic<uint64_t> slices_launched_{0};
};

}  // namespace kvtier::client

#endif  // KVTIER_CLIENT_TRANSFER_ENGINE_H_
