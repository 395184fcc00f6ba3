// The lanes of TransferEngine's CUDA backend (client/transfer_lane.h):
// creating and destroying a direction's streams, events and staging
// buffers, and enqueueing on them: forks and joins, the copy engine's
// batches and 2D copies, and a staged slice's gather / scatter with its
// copies.
//
// Thread-safety: see transfer_lane.h.
#include "client/transfer_lane.h"

#if KVTIER_HAVE_CUDA

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "client/transfer_cuda.h"
#include "client/transfer_plan.h"
#include "kernels/page_copy.h"
#include "kernels/page_copy_launch.h"

namespace kvtier::client::transfer_internal {
namespace {

using kernels::CopyDirection;

// Creates an event without timing in `*e`; leaves it null on failure.
absl::Status NewEvent(cudaEvent_t* e) {
  if (cudaError_t err = cudaEventCreateWithFlags(e, cudaEventDisableTiming);
      err != cudaSuccess) {
    *e = nullptr;
    return CudaError("cudaEventCreateWithFlags", err);
  }
  return absl::OkStatus();
}

// Enqueues lane->copies2d on `stream`, one cudaMemcpy2DAsync each.
absl::Status IssueCopies2D(Lane* lane, CopyDirection direction,
                           cudaStream_t stream)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(lane->mu) {
  const bool to_host = direction == CopyDirection::kToHost;
  for (const EngineCopy2D& c : lane->copies2d) {
    void* dst = reinterpret_cast<void*>(to_host ? c.host : c.device);
    const void* src =
        reinterpret_cast<const void*>(to_host ? c.device : c.host);
    const size_t dpitch = to_host ? c.host_pitch : c.device_pitch;
    const size_t spitch = to_host ? c.device_pitch : c.host_pitch;
    if (cudaError_t err = cudaMemcpy2DAsync(dst, dpitch, src, spitch, c.width,
                                            c.lines, cudaMemcpyDefault, stream);
        err != cudaSuccess) {
      return CudaError("cudaMemcpy2DAsync", err);
    }
  }
  return absl::OkStatus();
}

}  // namespace

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

absl::Status Fork(Lane* lane, cudaStream_t caller, cudaStream_t stream) {
  absl::Status status = Record(lane->fork, caller);
  if (status.ok()) status = Wait(stream, lane->fork);
  return status;
}

absl::Status Join(cudaStream_t stream, cudaEvent_t done, cudaStream_t caller) {
  absl::Status status = Record(done, stream);
  if (status.ok()) status = Wait(caller, done);
  return status;
}

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

absl::Status EnqueuePageCopies(const TransferPlan& plan, Lane* lane,
                               CopyDirection direction,
                               absl::Span<const uint32_t> gpu_pages,
                               absl::Span<const uint32_t> rows, bool two_d,
                               cudaStream_t stream) {
  if (two_d) {
    lane->copies2d.clear();
    plan.PageCopies2D(gpu_pages, rows, &lane->copies2d);
    return IssueCopies2D(lane, direction, stream);
  }
  lane->copies.clear();
  plan.PageRuns(gpu_pages, rows, &lane->copies);
  return IssueCopies(lane, direction, stream);
}

absl::Status EnqueueStagedSlice(Lane* lane, Lane::Buffer* buf,
                                CopyDirection direction,
                                const kernels::PageCopyParams& params) {
  absl::Status status;
  if (direction == CopyDirection::kToHost) {
    status = Wait(lane->kernel_stream, buf->copies_done);
    if (status.ok()) {
      status = kernels::LaunchPageCopy(params, lane->kernel_stream);
    }
    if (status.ok()) status = Record(buf->kernel_done, lane->kernel_stream);
    if (status.ok()) status = Wait(lane->copy_stream, buf->kernel_done);
    if (status.ok()) status = IssueCopies(lane, direction, lane->copy_stream);
    if (status.ok()) status = Record(buf->copies_done, lane->copy_stream);
  } else {
    status = Wait(lane->copy_stream, buf->kernel_done);
    if (status.ok()) status = IssueCopies(lane, direction, lane->copy_stream);
    if (status.ok()) status = Record(buf->copies_done, lane->copy_stream);
    if (status.ok()) status = Wait(lane->kernel_stream, buf->copies_done);
    if (status.ok()) {
      status = kernels::LaunchPageCopy(params, lane->kernel_stream);
    }
    if (status.ok()) status = Record(buf->kernel_done, lane->kernel_stream);
  }
  return status;
}

}  // namespace kvtier::client::transfer_internal

#endif  // KVTIER_HAVE_CUDA
