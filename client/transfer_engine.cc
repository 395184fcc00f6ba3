// TransferEngine: runs TransferPlan slices on the CUDA backend (staged, copy
// engine or direct, see transfer_engine.h) or on the memcpy reference. The
// CUDA parts compile only when KVTIER_HAVE_CUDA. The staged and copy-engine
// paths run on one "lane" per direction (streams, events, staging buffers:
// client/transfer_lane.h); this file decides what each call enqueues there.
//
// Thread-safety: see transfer_engine.h.

#include "client/transfer_engine.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "client/pool.h"
#include "client/reference_stream.h"
#include "client/transfer_cuda.h"
#include "client/transfer_lane.h"
#include "client/transfer_plan.h"
#include "kernels/page_copy.h"

#if KVTIER_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "kernels/page_copy_launch.h"
#endif

namespace kvtier::client {
namespace {

using kernels::CopyDirection;
using kernels::PageCopyParams;
using transfer_internal::CheckCudaAvailable;
#if KVTIER_HAVE_CUDA
using transfer_internal::CheckCudaPlan;
using transfer_internal::CreateLane;
using transfer_internal::CudaError;
using transfer_internal::DestroyLane;
using transfer_internal::EnqueuePageCopies;
using transfer_internal::EnqueueStagedSlice;
using transfer_internal::Fork;
using transfer_internal::IssueCopies;
using transfer_internal::Join;
using transfer_internal::kStagingBuffers;
using transfer_internal::Lane;
using transfer_internal::OnDevice;
using transfer_internal::Wait;
#endif

}  // namespace

#if KVTIER_HAVE_CUDA
struct TransferEngine::Staging {
  int device = 0;
  Lane lanes[2];  // indexed by CopyDirection: kToHost, kFromHost
};
#else
struct TransferEngine::Staging {};
#endif

TransferEngine::TransferEngine(Backend backend, TransferPlan plan)
    : backend_(backend), plan_(std::move(plan)) {}

TransferEngine::~TransferEngine() {
#if KVTIER_HAVE_CUDA
  if (staging_ != nullptr) {
    (void)OnDevice(staging_->device, [&] {
      for (Lane& lane : staging_->lanes) DestroyLane(&lane);
      return absl::OkStatus();
    });
  }
#endif
}

absl::StatusOr<std::unique_ptr<TransferEngine>> TransferEngine::Create(
    Backend backend, const GpuPoolDescriptor& pool,
    std::vector<NamedHostBank> page_banks,
    std::optional<HostBankView> snapshot_bank, const TransferOptions& options) {
  if (backend == Backend::kCuda) {
    if (absl::Status s = CheckCudaAvailable(pool.device); !s.ok()) return s;
  } else if (backend != Backend::kReference) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown backend ", static_cast<int>(backend)));
  }
  absl::StatusOr<TransferPlan> plan =
      TransferPlan::Create(pool, page_banks, snapshot_bank, options);
  if (!plan.ok()) return plan.status();
#if KVTIER_HAVE_CUDA
  if (backend == Backend::kCuda) {
    if (absl::Status s =
            OnDevice(pool.device, [&] { return CheckCudaPlan(*plan); });
        !s.ok()) {
      return s;
    }
  }
#endif
  std::unique_ptr<TransferEngine> engine(
      new TransferEngine(backend, *std::move(plan)));
#if KVTIER_HAVE_CUDA
  if (backend == Backend::kCuda &&
      (engine->plan_.path() == TransferPath::kStaged ||
       engine->plan_.path() == TransferPath::kCopyEngine)) {
    engine->staging_ = std::make_unique<Staging>();
    engine->staging_->device = pool.device;
    absl::Status s = OnDevice(pool.device, [&] {
      int least = 0, greatest = 0;
      if (cudaError_t err = cudaDeviceGetStreamPriorityRange(&least, &greatest);
          err != cudaSuccess) {
        return CudaError("cudaDeviceGetStreamPriorityRange", err);
      }
      for (Lane& lane : engine->staging_->lanes) {
        const int priority =
            options.staging_priority == StagingPriority::kDefault ? 0
                                                                  : greatest;
        if (absl::Status st = CreateLane(engine->plan_, priority, &lane);
            !st.ok()) {
          return st;
        }
      }
      return absl::OkStatus();
    });
    if (s.ok()) {
      engine->path_ = engine->plan_.path();
    } else {
      // Free what was made; kAuto falls back to the direct path.
      (void)OnDevice(pool.device, [&] {
        for (Lane& lane : engine->staging_->lanes) DestroyLane(&lane);
        return absl::OkStatus();
      });
      engine->staging_.reset();
      if (options.path == TransferPath::kStaged ||
          options.path == TransferPath::kCopyEngine) {
        return absl::Status(s.code(),
                            absl::StrCat(options.path == TransferPath::kStaged
                                             ? "staged path: "
                                             : "copy-engine path: ",
                                         s.message()));
      }
    }
  }
#endif
  return engine;
}

size_t TransferEngine::SlicesFor(CopyDirection direction,
                                 size_t num_pages) const {
  if (path_ == TransferPath::kStaged) {
    const size_t side = plan_.CopyEngineSharePages(num_pages);
    return plan_.StagedSlices(direction, num_pages - side).size() +
           (side > 0 ? 1 : 0);
  }
  if (path_ == TransferPath::kCopyEngine) return num_pages > 0 ? 1 : 0;
  return TransferPlan::NumSlices(num_pages);
}

bool TransferEngine::Capturing(void* stream) const {
#if KVTIER_HAVE_CUDA
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &status) !=
      cudaSuccess) {
    cudaGetLastError();
    return true;
  }
  return status != cudaStreamCaptureStatusNone;
#else
  (void)stream;
  return false;
#endif
}

absl::Status TransferEngine::Evict(absl::Span<const uint32_t> gpu_pages,
                                   absl::Span<const uint32_t> rows,
                                   void* stream) {
  return CopyPages(CopyDirection::kToHost, gpu_pages, rows, stream);
}

absl::Status TransferEngine::Rehydrate(absl::Span<const uint32_t> gpu_pages,
                                       absl::Span<const uint32_t> rows,
                                       void* stream) {
  return CopyPages(CopyDirection::kFromHost, gpu_pages, rows, stream);
}

absl::Status TransferEngine::SaveSnapshots(absl::Span<const uint32_t> slots,
                                           uint32_t row, void* stream) {
  return CopySnapshot(CopyDirection::kToHost, slots, row, stream);
}

absl::Status TransferEngine::RestoreSnapshots(absl::Span<const uint32_t> slots,
                                              uint32_t row, void* stream) {
  return CopySnapshot(CopyDirection::kFromHost, slots, row, stream);
}

absl::Status TransferEngine::CopyPages(CopyDirection direction,
                                       absl::Span<const uint32_t> gpu_pages,
                                       absl::Span<const uint32_t> rows,
                                       void* stream) {
  if (absl::Status s = plan_.CheckPages(direction, gpu_pages, rows); !s.ok()) {
    return s;
  }
  const size_t slices = TransferPlan::NumSlices(gpu_pages.size());
  if (slices == 0) return absl::OkStatus();
#if KVTIER_HAVE_CUDA
  if (path_ == TransferPath::kStaged && !Capturing(stream)) {
    return OnDevice(plan_.pool().device, [&] {
      return StagedPages(direction, gpu_pages, rows, stream);
    });
  }
  if (path_ == TransferPath::kCopyEngine && !Capturing(stream)) {
    return OnDevice(plan_.pool().device, [&] {
      return CopyEnginePages(direction, gpu_pages, rows, stream);
    });
  }
#endif
  // ~31 KiB on the stack: the kernel's parameter block, rebuilt per slice.
  PageCopyParams params;
  for (size_t k = 0; k < slices; ++k) {
    plan_.FillPageSlice(direction, gpu_pages, rows, k, &params);
    if (absl::Status s = Run(params, stream); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("slice ", k, " of ", slices,
                                                 ": ", s.message()));
    }
  }
  return absl::OkStatus();
}

absl::Status TransferEngine::CopySnapshot(CopyDirection direction,
                                          absl::Span<const uint32_t> slots,
                                          uint32_t row, void* stream) {
  if (absl::Status s = plan_.CheckSnapshot(slots, row); !s.ok()) return s;
#if KVTIER_HAVE_CUDA
  if ((path_ == TransferPath::kStaged || path_ == TransferPath::kCopyEngine) &&
      !Capturing(stream)) {
    return OnDevice(plan_.pool().device, [&] {
      return StagedSnapshot(direction, slots, row, stream);
    });
  }
#endif
  PageCopyParams params;
  plan_.FillSnapshot(direction, slots, row, &params);
  return Run(params, stream);
}

absl::Status TransferEngine::Run(const PageCopyParams& params, void* stream) {
  absl::Status status;
  if (backend_ == Backend::kReference) {
    if (ReferenceStream* rs = ReferenceStream::FromHandle(stream)) {
      // Queued like a kernel launch: it runs after what the stream holds.
      auto queued = std::make_shared<PageCopyParams>(params);
      rs->Enqueue([queued] { (void)kernels::RunPageCopyReference(*queued); });
    } else {
      status = kernels::RunPageCopyReference(params);
    }
  } else {
#if KVTIER_HAVE_CUDA
    status = OnDevice(plan_.pool().device, [&] {
      return kernels::LaunchPageCopy(params, static_cast<cudaStream_t>(stream));
    });
#else
    status = absl::FailedPreconditionError("built without CUDA");
#endif
  }
  if (status.ok()) slices_launched_.fetch_add(1, std::memory_order_relaxed);
  return status;
}

absl::Status TransferEngine::StagedPages(CopyDirection direction,
                                         absl::Span<const uint32_t> gpu_pages,
                                         absl::Span<const uint32_t> rows,
                                         void* stream) {
#if KVTIER_HAVE_CUDA
  const cudaStream_t caller = static_cast<cudaStream_t>(stream);
  const bool evict = direction == CopyDirection::kToHost;
  Lane& lane = staging_->lanes[evict ? 0 : 1];
  // The last `side` pages go through the copy engine directly.
  const size_t side = plan_.CopyEngineSharePages(gpu_pages.size());
  const size_t staged = gpu_pages.size() - side;
  const std::vector<uint32_t> sizes = plan_.StagedSlices(direction, staged);
  PageCopyParams params;  // ~31 KiB on the stack, rebuilt per slice

  absl::MutexLock lock(&lane.mu);
  // Fork: everything below starts after the caller's stream's earlier work.
  absl::Status status = Fork(&lane, caller, lane.kernel_stream);
  if (status.ok() && !evict) status = Wait(lane.copy_stream, lane.fork);
  bool side_forked = false;
  if (status.ok() && side > 0) {
    status = Wait(lane.side_stream, lane.fork);
    side_forked = status.ok();
    // Block-first pages (one run each): one batch, as the copy-engine path
    // issues it, rather than a 2D copy per page.
    if (status.ok()) {
      status =
          EnqueuePageCopies(plan_, &lane, direction, gpu_pages.subspan(staged),
                            rows.subspan(staged),
                            /*two_d=*/plan_.page_runs() != 1, lane.side_stream);
    }
    if (status.ok()) slices_launched_.fetch_add(1, std::memory_order_relaxed);
  }
  size_t begin = 0;
  for (size_t k = 0; status.ok() && k < sizes.size(); ++k) {
    Lane::Buffer& buf = lane.buffers[lane.next_buffer++ % kStagingBuffers];
    const uint64_t base = reinterpret_cast<uint64_t>(buf.base);
    const size_t n = sizes[k];
    lane.copies.clear();
    plan_.StagedCopies(rows.subspan(begin, n), base, &lane.copies);
    // The fill (an eviction's first gather) and the drain (a rehydration's
    // last scatter) overlap no copy: a wider grid (edge_slice_ctas).
    const bool edge = evict ? k == 0 : k + 1 == sizes.size();
    plan_.FillStagedSlice(direction, gpu_pages, begin, n, base, &params, edge);
    status = EnqueueStagedSlice(&lane, &buf, direction, params);
    if (status.ok()) {
      slices_launched_.fetch_add(1, std::memory_order_relaxed);
      begin += n;
    } else {
      status = absl::Status(
          status.code(), absl::StrCat("staged slice ", k, " of ", sizes.size(),
                                      ": ", status.message()));
    }
  }
  // Join, also after a failure, so the caller's stream never runs ahead of
  // what was enqueued. An eviction ends on the copy stream (each batch waits
  // for its gather), a rehydration on the kernel stream (each scatter waits
  // for its batch).
  absl::Status join =
      Join(evict ? lane.copy_stream : lane.kernel_stream, lane.done, caller);
  if (side_forked && join.ok()) {
    join = Join(lane.side_stream, lane.side_done, caller);
  }
  return status.ok() ? join : status;
#else
  (void)direction;
  (void)gpu_pages;
  (void)rows;
  (void)stream;
  return absl::FailedPreconditionError("built without CUDA");
#endif
}

absl::Status TransferEngine::CopyEnginePages(
    CopyDirection direction, absl::Span<const uint32_t> gpu_pages,
    absl::Span<const uint32_t> rows, void* stream) {
#if KVTIER_HAVE_CUDA
  // One batch of every run on the direction's copy stream, forked off the
  // caller's stream and joined to it again (also after a failure).
  const cudaStream_t caller = static_cast<cudaStream_t>(stream);
  Lane& lane = staging_->lanes[direction == CopyDirection::kToHost ? 0 : 1];
  absl::MutexLock lock(&lane.mu);
  absl::Status status = Fork(&lane, caller, lane.copy_stream);
  if (status.ok()) {
    status = EnqueuePageCopies(plan_, &lane, direction, gpu_pages, rows,
                               /*two_d=*/false, lane.copy_stream);
  }
  absl::Status join = Join(lane.copy_stream, lane.done, caller);
  if (status.ok()) status = join;
  if (status.ok()) slices_launched_.fetch_add(1, std::memory_order_relaxed);
  return status;
#else
  (void)direction;
  (void)gpu_pages;
  (void)rows;
  (void)stream;
  return absl::FailedPreconditionError("built without CUDA");
#endif
}

absl::Status TransferEngine::StagedSnapshot(CopyDirection direction,
                                            absl::Span<const uint32_t> slots,
                                            uint32_t row, void* stream) {
#if KVTIER_HAVE_CUDA
  // One batch of the segments on the direction's copy stream, forked and
  // joined as on the copy-engine path.
  const cudaStream_t caller = static_cast<cudaStream_t>(stream);
  Lane& lane = staging_->lanes[direction == CopyDirection::kToHost ? 0 : 1];
  absl::MutexLock lock(&lane.mu);
  lane.copies.clear();
  plan_.SnapshotCopies(slots, row, &lane.copies);
  absl::Status status = Fork(&lane, caller, lane.copy_stream);
  if (status.ok()) status = IssueCopies(&lane, direction, lane.copy_stream);
  absl::Status join = Join(lane.copy_stream, lane.done, caller);
  if (status.ok()) status = join;
  if (status.ok()) slices_launched_.fetch_add(1, std::memory_order_relaxed);
  return status;
#else
  (void)direction;
  (void)slots;
  (void)row;
  (void)stream;
  return absl::FailedPreconditionError("built without CUDA");
#endif
}

}  // namespace kvtier::client
