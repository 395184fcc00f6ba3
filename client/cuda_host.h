// The few CUDA runtime calls libkvtier's host code makes: is a device there,
// register and unregister host ranges, queue a host callback on a stream.
//
// Built against the CUDA runtime when KVTIER_HAVE_CUDA, else every call
// reports "no device", so the same client code runs host-only.
//
// Thread-safety: thread-safe (the CUDA runtime is).
#ifndef KVTIER_CLIENT_CUDA_HOST_H_
#define KVTIER_CLIENT_CUDA_HOST_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace kvtier::client {

// Largest single cudaHostRegister call: recent drivers refuse larger ones.
inline constexpr uint64_t kMaxRegisterChunk = 64ull << 30;

// Returns true when the CUDA runtime sees at least one device. Cached.
bool CudaDevicePresent();

// The PCI bus id of the calling thread's current CUDA device
// ("0000:3B:00.0"), or "" when there is none.
std::string CurrentDevicePciBusId();

// Registers [p, p+bytes) as mapped, portable pinned memory in chunks of at
// most kMaxRegisterChunk, so kernels reach it at the same address (UVA).
// On failure, whatever was registered is unregistered again.
absl::Status RegisterHostRange(void* p, uint64_t bytes);

// Undoes RegisterHostRange. REQUIRES: the same (p, bytes).
void UnregisterHostRange(void* p, uint64_t bytes);

// Queues fn(arg) on `stream` (a cudaStream_t) after the work queued so far.
// fn runs on a CUDA runtime thread and must not call CUDA. Returns
// FAILED_PRECONDITION when no device is present.
absl::Status LaunchHostCallback(void* stream, void (*fn)(void*), void* arg);

}  // namespace kvtier::client

#endif  // KVTIER_CLIENT_CUDA_HOST_H_
