// TransferEngine: runs TransferPlan slices on the CUDA backend (staged or
// direct, see transfer_engine.h) or on the memcpy reference. The CUDA parts
// compile only when KVTIER_HAVE_CUDA.
//
// Staged path, per direction ("lane"): a high-priority kernel stream for the
// gathers / scatters, one copy stream, two staging buffers, and events: fork
// (the caller's stream up to the call), done (the lane at the call's end),
// and per buffer kernel_done (its last gather / scatter) and copies_done (its
// last copy-engine batch). Buffer reuse waits on those events, within a call
// and across calls, so a lane's mutex only has to cover enqueueing.
// cudaStreamWaitEvent waits for the event's most recent record at the time of
// the call, so re-recording an event later never disturbs a wait already
// enqueued.
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
using transfer_internal::CudaError;
using transfer_internal::OnDevice;
#endif

#if KVTIER_HAVE_CUDA

// Staging buffers per direction: double buffering.
constexpr int kStagingBuffers = 2;

// One direction's staged resources. Handles are created once (Create) and
// destroyed once (~TransferEngine); enqueueing on them is serialised by mu.
struct Lane {
  struct Buffer {
    void* base = nullptr;
    cudaEvent_t kernel_done = nullptr;  // its last gather / scatter
    cudaEvent_t copies_done = nullptr;  // its last copy-engine batch
  };

  absl::Mutex mu;
  cudaStream_t kernel_stream = nullptr;  // high priority
  cudaStream_t copy_stream = nullptr;
  // The copy-engine share's 2D copies (TransferOptions::copy_engine_share).
  cudaStream_t side_stream = nullptr;
  cudaEvent_t fork = nullptr;       // the caller's stream at a call's start
  cudaEvent_t done = nullptr;       // the lane at a call's end
  cudaEvent_t side_done = nullptr;  // the side stream at a call's end
  Buffer buffers[kStagingBuffers];

  uint64_t next_buffer ABSL_GUARDED_BY(mu) = 0;
  // Scratch, kept to spare allocations per call.
  std::vector<EngineCopy> copies ABSL_GUARDED_BY(mu);
  std::vector<EngineCopy2D> copies2d ABSL_GUARDED_BY(mu);
  std::vector<void*> dsts ABSL_GUARDED_BY(mu);
  std::vector<const void*> srcs ABSL_GUARDED_BY(mu);
  std::vector<size_t> sizes ABSL_GUARDED_BY(mu);
};

absl::Status NewEvent(cudaEvent_t* e) {
  if (cudaError_t err = cudaEventCreateWithFlags(e, cudaEventDisableTiming);
      err != cudaSuccess) {
    *e = nullptr;
    return CudaError("cudaEventCreateWithFlags", err);
  }
  return absl::OkStatus();
}

// Creates the lane's streams, events and (on the staged path) buffers on the
// current device.
absl::Status CreateLane(const TransferPlan& plan, int priority, Lane* lane) {
  if (cudaError_t err = cudaStreamCreateWithPriority(
          &lane->kernel_stream, cudaStreamNonBlocking, priority);
      err != cudaSuccess) {
    lane->kernel_stream = nullptr;
    return CudaError("cudaStreamCreateWithPriority", err);
  }
  if (cudaError_t err =
          cudaStreamCreateWithFlags(&lane->copy_stream, cudaStreamNonBlocking);
      err != cudaSuccess) {
    lane->copy_stream = nullptr;
    return CudaError("cudaStreamCreateWithFlags", err);
  }
  if (absl::Status s = NewEvent(&lane->fork); !s.ok()) return s;
  if (absl::Status s = NewEvent(&lane->done); !s.ok()) return s;
  if (plan.path() != TransferPath::kStaged) return absl::OkStatus();
  if (plan.options().copy_engine_share > 0) {
    if (cudaError_t err = cudaStreamCreateWithFlags(&lane->side_stream,
                                                    cudaStreamNonBlocking);
        err != cudaSuccess) {
      lane->side_stream = nullptr;
      return CudaError("cudaStreamCreateWithFlags", err);
    }
    if (absl::Status s = NewEvent(&lane->side_done); !s.ok()) return s;
  }
  for (Lane::Buffer& b : lane->buffers) {
    if (cudaError_t err = cudaMalloc(&b.base, plan.staging().buffer_bytes);
        err != cudaSuccess) {
      b.base = nullptr;
      cudaGetLastError();  // not sticky; keep it from later checks
      return err == cudaErrorMemoryAllocation
                 ? absl::ResourceExhaustedError(absl::StrCat(
                       "cudaMalloc of a ", plan.staging().buffer_bytes,
                       "-byte staging buffer failed: out of device memory"))
                 : CudaError("cudaMalloc (staging buffer)", err);
    }
    if (absl::Status s = NewEvent(&b.kernel_done); !s.ok()) return s;
    if (absl::Status s = NewEvent(&b.copies_done); !s.ok()) return s;
  }
  return absl::OkStatus();
}

// Waits for everything enqueued on the lane's streams, then destroys them,
// its events and its buffers. Handles that were never created are skipped.
void DestroyLane(Lane* lane) {
  for (cudaStream_t s :
       {lane->kernel_stream, lane->copy_stream, lane->side_stream}) {
    if (s != nullptr) cudaStreamSynchronize(s);
  }
  for (Lane::Buffer& b : lane->buffers) {
    if (b.base != nullptr) cudaFree(b.base);
    for (cudaEvent_t e : {b.kernel_done, b.copies_done}) {
      if (e != nullptr) cudaEventDestroy(e);
    }
  }
  for (cudaEvent_t e : {lane->fork, lane->done, lane->side_done}) {
    if (e != nullptr) cudaEventDestroy(e);
  }
  for (cudaStream_t s :
       {lane->kernel_stream, lane->copy_stream, lane->side_stream}) {
    if (s != nullptr) cudaStreamDestroy(s);
  }
  cudaGetLastError();
}

absl::Status Record(cudaEvent_t e, cudaStream_t s) {
  if (cudaError_t err = cudaEventRecord(e, s); err != cudaSuccess) {
    return CudaError("cudaEventRecord", err);
  }
  return absl::OkStatus();
}

absl::Status Wait(cudaStream_t s, cudaEvent_t e) {
  if (cudaError_t err = cudaStreamWaitEvent(s, e, 0); err != cudaSuccess) {
    return CudaError("cudaStreamWaitEvent", err);
  }
  return absl::OkStatus();
}

// Enqueues lane->copies on `stream` (the lane's copy stream, or its side
// stream for a copy-engine share) as one cudaMemcpyBatchAsync. On the H200 one
// batch on one stream beat one cudaMemcpyAsync per copy on 1-4 streams by 5-40
// % (rows of 256 KiB - 2 MiB; streams of one direction share a copy engine, so
// more streams only added overhead) and a batch per stream on two streams by ~1
// % (2026-12-03: f256k beside the decode step, 46.0 GB/s either way).
absl::Status IssueCopies(Lane* lane, CopyDirection direction,
                         cudaStream_t stream)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(lane->mu) {
  if (lane->copies.empty()) return absl::OkStatus();
  const bool to_host = direction == CopyDirection::kToHost;
  lane->dsts.clear();
  lane->srcs.clear();
  lane->sizes.clear();
  for (const EngineCopy& e : lane->copies) {
    lane->dsts.push_back(reinterpret_cast<void*>(to_host ? e.host : e.device));
    lane->srcs.push_back(
        reinterpret_cast<const void*>(to_host ? e.device : e.host));
    lane->sizes.push_back(e.bytes);
  }
  cudaMemcpyAttributes attr{};
  attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
  size_t attr_index = 0;
  if (cudaError_t err = cudaMemcpyBatchAsync(
          lane->dsts.data(), lane->srcs.data(), lane->sizes.data(),
          lane->dsts.size(), &attr, &attr_index, 1, stream);
      err != cudaSuccess) {
    return CudaError("cudaMemcpyBatchAsync", err);
  }
  return absl::OkStatus();
}

// Enqueues lane->copies2d on the lane's side stream, one cudaMemcpy2DAsync
// each.
absl::Status IssueCopies2D(Lane* lane, CopyDirection direction)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(lane->mu) {
  const bool to_host = direction == CopyDirection::kToHost;
  for (const EngineCopy2D& c : lane->copies2d) {
    void* dst = reinterpret_cast<void*>(to_host ? c.host : c.device);
    const void* src =
        reinterpret_cast<const void*>(to_host ? c.device : c.host);
    const size_t dpitch = to_host ? c.host_pitch : c.device_pitch;
    const size_t spitch = to_host ? c.device_pitch : c.host_pitch;
    if (cudaError_t err =
            cudaMemcpy2DAsync(dst, dpitch, src, spitch, c.width, c.lines,
                              cudaMemcpyDefault, lane->side_stream);
        err != cudaSuccess) {
      return CudaError("cudaMemcpy2DAsync", err);
    }
  }
  return absl::OkStatus();
}

// Forks the lane's copy stream off `caller`, enqueues lane->copies there as
// one batch and joins the caller's stream to its end, the join also after a
// failure (see StagedPages). The copy-engine path and snapshots.
absl::Status ForkCopiesJoin(Lane* lane, CopyDirection direction,
                            cudaStream_t caller)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(lane->mu) {
  absl::Status status = Record(lane->fork, caller);
  if (status.ok()) status = Wait(lane->copy_stream, lane->fork);
  if (status.ok()) status = IssueCopies(lane, direction, lane->copy_stream);
  absl::Status join = Record(lane->done, lane->copy_stream);
  if (join.ok()) join = Wait(caller, lane->done);
  return status.ok() ? join : status;
}

#endif  // KVTIER_HAVE_CUDA

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
  absl::Status status = Record(lane.fork, caller);
  if (status.ok()) status = Wait(lane.kernel_stream, lane.fork);
  if (status.ok() && !evict) status = Wait(lane.copy_stream, lane.fork);
  bool side_forked = false;
  if (status.ok() && side > 0) {
    status = Wait(lane.side_stream, lane.fork);
    side_forked = status.ok();
    if (plan_.page_runs() == 1) {
      // Block-first pages (one run each): one batch, as the copy-engine
      // path issues it, rather than a 2D copy per page.
      lane.copies.clear();
      plan_.PageRuns(gpu_pages.subspan(staged), rows.subspan(staged),
                     &lane.copies);
      if (status.ok()) status = IssueCopies(&lane, direction, lane.side_stream);
    } else {
      lane.copies2d.clear();
      plan_.PageCopies2D(gpu_pages.subspan(staged), rows.subspan(staged),
                         &lane.copies2d);
      if (status.ok()) status = IssueCopies2D(&lane, direction);
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
    if (evict) {
      // Gather once the buffer's previous copies have read it out, then copy
      // it out once gathered.
      status = Wait(lane.kernel_stream, buf.copies_done);
      if (status.ok()) {
        status = kernels::LaunchPageCopy(params, lane.kernel_stream);
      }
      if (status.ok()) status = Record(buf.kernel_done, lane.kernel_stream);
      if (status.ok()) status = Wait(lane.copy_stream, buf.kernel_done);
      if (status.ok()) status = IssueCopies(&lane, direction, lane.copy_stream);
      if (status.ok()) status = Record(buf.copies_done, lane.copy_stream);
    } else {
      // Copy in once the buffer's previous scatter has read it out, then
      // scatter it once copied.
      status = Wait(lane.copy_stream, buf.kernel_done);
      if (status.ok()) status = IssueCopies(&lane, direction, lane.copy_stream);
      if (status.ok()) status = Record(buf.copies_done, lane.copy_stream);
      if (status.ok()) status = Wait(lane.kernel_stream, buf.copies_done);
      if (status.ok()) {
        status = kernels::LaunchPageCopy(params, lane.kernel_stream);
      }
      if (status.ok()) status = Record(buf.kernel_done, lane.kernel_stream);
    }
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
  const cudaStream_t last = evict ? lane.copy_stream : lane.kernel_stream;
  absl::Status join = Record(lane.done, last);
  if (join.ok()) join = Wait(caller, lane.done);
  if (side_forked) {
    if (join.ok()) join = Record(lane.side_done, lane.side_stream);
    if (join.ok()) join = Wait(caller, lane.side_done);
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
  // One batch of every run on the direction's copy stream.
  Lane& lane = staging_->lanes[direction == CopyDirection::kToHost ? 0 : 1];
  absl::MutexLock lock(&lane.mu);
  lane.copies.clear();
  plan_.PageRuns(gpu_pages, rows, &lane.copies);
  absl::Status status =
      ForkCopiesJoin(&lane, direction, static_cast<cudaStream_t>(stream));
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
  Lane& lane = staging_->lanes[direction == CopyDirection::kToHost ? 0 : 1];
  absl::MutexLock lock(&lane.mu);
  lane.copies.clear();
  plan_.SnapshotCopies(slots, row, &lane.copies);
  absl::Status status =
      ForkCopiesJoin(&lane, direction, static_cast<cudaStream_t>(stream));
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
