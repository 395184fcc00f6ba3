// A direction's CUDA resources for TransferEngine (client/transfer_engine.cc)
// and how work is enqueued on them ("lanes"). Internal to libkvtier.
//
// A lane holds a high-priority kernel stream for the staged gathers /
// scatters, a copy stream, on a staged lane with a copy-engine share a side
// stream, two staging buffers, and events: fork (the caller's stream up to
// the call), done (the lane at the call's end), side_done (the side stream
// at the call's end), and per buffer kernel_done (its last gather / scatter)
// and copies_done (its last copy-engine batch). A call forks the lane's
// streams off the caller's stream and joins the caller's stream to their
// ends. Buffer reuse waits on the buffer's events, within a call and across
// calls, so a lane's mutex only has to cover enqueueing.
// cudaStreamWaitEvent waits for the event's most recent record at the time
// of the call, so re-recording an event later never disturbs a wait already
// enqueued.
//
// The copy engine's part of a call is written once, in EnqueuePageCopies:
// the copy-engine path runs all of a transfer through it on the copy stream,
// a staged transfer its copy-engine share on the side stream, beside the
// pipeline.
//
// Thread-safety: a Lane's handles are created once and destroyed once (by
// TransferEngine's Create and destructor); everything that enqueues on them
// requires lane->mu, which also guards the scratch lists.
#ifndef KVTIER_CLIENT_TRANSFER_LANE_H_
#define KVTIER_CLIENT_TRANSFER_LANE_H_

#if KVTIER_HAVE_CUDA

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "client/transfer_plan.h"
#include "kernels/page_copy.h"

namespace kvtier::client::transfer_internal {

// Staging buffers per direction: double buffering.
inline constexpr int kStagingBuffers = 2;

// One direction's CUDA resources. Handles are created once (CreateLane) and
// destroyed once (DestroyLane); enqueueing on them is serialised by mu.
struct Lane {
  struct Buffer {
    void* base = nullptr;
    cudaEvent_t kernel_done = nullptr;  // its last gather / scatter
    cudaEvent_t copies_done = nullptr;  // its last copy-engine batch
  };

  absl::Mutex mu;
  cudaStream_t kernel_stream = nullptr;  // high priority
  cudaStream_t copy_stream = nullptr;
  // The copy-engine share's copies (TransferOptions::copy_engine_share).
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

// Creates the lane's kernel stream (at `priority`), copy stream, fork and
// done events, and on the staged path its buffers and their events, and the
// side stream and side_done where plan.options().copy_engine_share > 0, on
// the current device. On failure returns the error (RESOURCE_EXHAUSTED for
// a staging buffer that does not fit) and leaves what was made for
// DestroyLane.
absl::Status CreateLane(const TransferPlan& plan, int priority, Lane* lane);

// Waits for everything enqueued on the lane's streams, then destroys them,
// its events and its buffers. Handles that were never created are skipped.
void DestroyLane(Lane* lane);

// cudaEventRecord(e, s) as a Status.
absl::Status Record(cudaEvent_t e, cudaStream_t s);

// cudaStreamWaitEvent(s, e) as a Status.
absl::Status Wait(cudaStream_t s, cudaEvent_t e);

// Records lane->fork on `caller` and makes `stream` (one of the lane's)
// wait for it: what is enqueued on `stream` next starts after the caller's
// earlier work. Other streams of the lane may then Wait on lane->fork too.
absl::Status Fork(Lane* lane, cudaStream_t caller, cudaStream_t stream);

// Records `done` at the end of `stream` (one of a lane's) and makes `caller`
// wait for it: what the caller's stream does next sees the lane's work
// complete.
absl::Status Join(cudaStream_t stream, cudaEvent_t done, cudaStream_t caller);

// Enqueues lane->copies on `stream` as one cudaMemcpyBatchAsync (nothing
// when empty). On the H200 one batch on one stream beat one cudaMemcpyAsync
// per copy on 1-4 streams by 5-40 % (rows of 256 KiB - 2 MiB; streams of one
// direction share a copy engine, so more streams only added overhead) and a
// batch per stream on two streams by ~1 % (2026-12-03: f256k beside the
// decode step, 46.0 GB/s either way).
absl::Status IssueCopies(Lane* lane, kernels::CopyDirection direction,
                         cudaStream_t stream)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(lane->mu);

// The copy engine's lane of a call: enqueues on `stream` the copies that move
// pages gpu_pages[i] <-> rows[i] straight between the pool and the host rows,
// with no kernel and no staging: one cudaMemcpyBatchAsync of the plan's
// PageRuns, or with `two_d` one cudaMemcpy2DAsync per PageCopies2D copy. The
// copy-engine path runs a whole transfer through it on the copy stream
// (runs); a staged transfer its copy-engine share on the side stream (runs
// where a page is one run, 2D copies otherwise). REQUIRES: `stream` already
// waits for the call's fork; plan.CheckPages(...).ok().
absl::Status EnqueuePageCopies(const TransferPlan& plan, Lane* lane,
                               kernels::CopyDirection direction,
                               absl::Span<const uint32_t> gpu_pages,
                               absl::Span<const uint32_t> rows, bool two_d,
                               cudaStream_t stream)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(lane->mu);

// Enqueues one staged slice through `buf`: `params` (the slice's gather or
// scatter, FillStagedSlice) on the kernel stream and lane->copies (its rows,
// StagedCopies) as one batch on the copy stream. An eviction gathers once
// the buffer's previous copies have read it out, then copies it out once
// gathered; a rehydration copies in once the buffer's previous scatter has
// read it out, then scatters once copied. Records the buffer's events.
absl::Status EnqueueStagedSlice(Lane* lane, Lane::Buffer* buf,
                                kernels::CopyDirection direction,
                                const kernels::PageCopyParams& params)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(lane->mu);

}  // namespace kvtier::client::transfer_internal

#endif  // KVTIER_HAVE_CUDA

#endif  // KVTIER_CLIENT_TRANSFER_LANE_H_
