// SpinUntil: keeps a stream busy until the host lets it go, so that work
// queued behind it is really pending for as long as a test wants (the fence
// tests: GPU copies still queued across a daemon restart). One thread polls
// `flag` (host memory mapped into the device, read over the bus each time)
// until it is non-zero, sleeping ~1 µs between reads.
//
// SpinUntilReference is the same on the calling thread. The launcher is in
// kernels/spin_wait_launch.h (CUDA builds only).
//
// Thread-safety: stateless.
#ifndef KVTIER_KERNELS_SPIN_WAIT_H_
#define KVTIER_KERNELS_SPIN_WAIT_H_

#include <cstdint>

namespace kvtier::kernels {

// Returns once *flag != 0. REQUIRES: another thread sets it, with an atomic
// store (__atomic_store_n) when it is host memory read here.
void SpinUntilReference(const volatile uint32_t* flag);

}  // namespace kvtier::kernels

#endif  // KVTIER_KERNELS_SPIN_WAIT_H_
