// SpinUntilReference: the host side of the spin kernel.
#include "kernels/spin_wait.h"

#include <thread>

namespace kvtier::kernels {

void SpinUntilReference(const volatile uint32_t* flag) {
  // Atomic, as the setter's store: another thread writes the flag.
  while (__atomic_load_n(flag, __ATOMIC_ACQUIRE) == 0) {
    std::this_thread::yield();
  }
}

}  // namespace kvtier::kernels
