// TransferEngine: copies pages between an engine's GPU KV pool and the
// namespace's host banks, and recurrent-state snapshots between GPU slots and
// snapshot rows. It executes a TransferPlan on one of two backends:
// - kCuda, on one of two paths (TransferOptions::path, resolved by the plan):
//   * staged (the default): per slice, the page copy kernel gathers the pages
//     into an HBM staging buffer on a few CTAs (a short burst), then the copy
//     engine moves the buffer's rows across PCIe into the host rows (one
//     cudaMemcpyBatchAsync per slice); two buffers per direction keep the
//     gather of slice k+1 under the copy of slice k. Rehydration runs the
//     other way round (copy engine into staging, then a short scatter
//     kernel). Snapshots go through the copy engine segment by segment, one
//     batch per snapshot, without staging. Each direction has its own
//     buffers, copy stream (the D2H and H2D engines are separate) and
//     high-priority kernel stream, so an eviction and a rehydration overlap.
//     On the H200 it moves 97-99 % of the link's contiguous rate for pages
//     of 1-8 MiB and snapshots (94-97 % for 256 KiB pages of 4 KiB chunks)
//     against the direct path's 90-95 %, and matches the direct path on the
//     smallest transfers (docs/benchmarks.md). The work forks off the
//     caller's stream and joins it again (events), so the caller's stream
//     orders a transfer exactly like one kernel launch: it starts after what
//     the stream did before, and what the stream does afterwards sees
//     complete rows (or pages). The staging buffers (4 x
//     TransferOptions::staging_bytes at most, 64 MiB by default), streams and
//     events are allocated by Create.
//   * copy engine (kAuto's choice for pools whose pages are long contiguous
//     runs, vLLM's block-first layouts): no kernel and no staging; each run
//     of a page contiguous in the pool and in the host row is one copy of
//     one cudaMemcpyBatchAsync on the direction's copy stream, forked off
//     and joined to the caller's stream like the staged path, so it needs
//     no SMs and keeps its rate beside compute that holds them all
//     (docs/benchmarks.md, layout f). Snapshots as on the staged path.
//   * direct: the page copy kernel reads and writes host rows over UVA on the
//     caller's stream, at most kMaxSlicePages pages per launch. It allocates
//     nothing per call (each launch's ~31 KiB parameter block is held by the
//     driver). A transfer enqueued on a stream that is capturing a CUDA
//     graph always takes this path, whatever the options: a captured staged
//     transfer would wait on and record events of the engine's internal
//     streams across the capture boundary, and its replays would share the
//     staging buffers with live transfers without the engine's ordering, so
//     the graph gets the self-contained kernel nodes instead.
//   The engine never synchronises the device (its destructor waits for its
//   own outstanding staged work); it switches to the pool's device for each
//   call and restores the caller's current device afterwards.
// - kReference: the same plan executed with memcpy on the calling thread; the
//   pool's "device addresses" are ordinary host pointers. CPU tests use it.
//   With a kvtier::client::ReferenceStream's handle as the stream
//   (client/reference_stream.h) the copies are queued on that stream
//   instead, in order, and can be held there.
//
// Errors: every argument is checked before the first launch or copy, so a
// call that returns INVALID_ARGUMENT or FAILED_PRECONDITION has written
// nothing. A CUDA failure (INTERNAL) after some work was enqueued leaves that
// work's destinations written: the rows of an uncommitted reservation, or GPU
// pages the engine has not published yet.
//
// Thread-safety: thread-safe. Concurrent calls are fine (staged calls of one
// direction are enqueued one after another under a mutex); ordering between
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
#include "client/pool.h"
#include "client/transfer_plan.h"
#include "kernels/page_copy.h"

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
  // Waits for the engine's outstanding staged work, then frees its staging
  // buffers, streams and events.
  ~TransferEngine();

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
  // INVALID_ARGUMENT if slot or row is out of range, or if a snapshot row
  // holds several groups' slots (SaveSnapshots).
  absl::Status SaveSnapshot(uint32_t slot, uint32_t row, void* stream) {
    return SaveSnapshots({slot}, row, stream);
  }

  // Copies snapshot row `row` into snapshot slot `slot`; as SaveSnapshot.
  absl::Status RestoreSnapshot(uint32_t slot, uint32_t row, void* stream) {
    return RestoreSnapshots({slot}, row, stream);
  }

  // Copies slots[g] into group g's part of snapshot row `row`, for each of
  // the plan's snapshot_groups() (vLLM's several Mamba groups: one state
  // block each at a page boundary), as one copy on `stream`. Errors as
  // TransferPlan::CheckSnapshot.
  absl::Status SaveSnapshots(absl::Span<const uint32_t> slots, uint32_t row,
                             void* stream);

  // Copies group g's part of snapshot row `row` into slots[g]; as
  // SaveSnapshots.
  absl::Status RestoreSnapshots(absl::Span<const uint32_t> slots, uint32_t row,
                                void* stream);

  // Slices run so far: one per slice of a page transfer (a direct kernel
  // launch, or a staged gather / scatter with its copies; the reference
  // backend counts direct slices), one per snapshot copy. For tests.
  uint64_t slices_launched() const {
    return slices_launched_.load(std::memory_order_relaxed);
  }

  // The path page transfers and snapshots take outside graph capture:
  // kStaged, kCopyEngine or kDirect (kDirect for kReference). Differs from
  // plan().path() only where kAuto fell back to kDirect because the staging
  // buffers or streams could not be allocated.
  TransferPath path() const { return path_; }

  // Slices (see slices_launched) that a transfer of `num_pages` pages in
  // `direction` takes on path().
  size_t SlicesFor(kernels::CopyDirection direction, size_t num_pages) const;

  Backend backend() const { return backend_; }
  const TransferPlan& plan() const { return plan_; }

 private:
  struct Staging;  // CUDA resources of the staged path (transfer_engine.cc)

  TransferEngine(Backend backend, TransferPlan plan);

  absl::Status CopyPages(kernels::CopyDirection direction,
                         absl::Span<const uint32_t> gpu_pages,
                         absl::Span<const uint32_t> rows, void* stream);
  absl::Status CopySnapshot(kernels::CopyDirection direction,
                            absl::Span<const uint32_t> slots, uint32_t row,
                            void* stream);
  // Runs one parameter block on the backend.
  absl::Status Run(const kernels::PageCopyParams& params, void* stream);
  // The staged path; called on the pool's device.
  absl::Status StagedPages(kernels::CopyDirection direction,
                           absl::Span<const uint32_t> gpu_pages,
                           absl::Span<const uint32_t> rows, void* stream);
  // The copy-engine path; called on the pool's device.
  absl::Status CopyEnginePages(kernels::CopyDirection direction,
                               absl::Span<const uint32_t> gpu_pages,
                               absl::Span<const uint32_t> rows, void* stream);
  absl::Status StagedSnapshot(kernels::CopyDirection direction,
                              absl::Span<const uint32_t> slots, uint32_t row,
                              void* stream);
  // True if `stream` is capturing a graph (or the query failed, in which
  // case the direct path is the safe one).
  bool Capturing(void* stream) const;

  // Immutable after construction.
  const Backend backend_;
  const TransferPlan plan_;
  TransferPath path_ = TransferPath::kDirect;
  // Set by Create on the staged path; its lanes carry their own mutexes.
  std::unique_ptr<Staging> staging_;

  std::atomic<uint64_t> slices_launched_{0};
};

}  // namespace kvtier::client

#endif  // KVTIER_CLIENT_TRANSFER_ENGINE_H_
