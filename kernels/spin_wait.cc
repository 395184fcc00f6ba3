// SpinUntilReference: the host side of the spin kernel.
#include "kernels/spin_wait.h"

#include <thread>

namespace kvtier::kernels {

void SpinUntilReference(const volatile uint32_t* flag) {
  while (*flag == 0) std::this_thread::yield();
}

}  // namespace kvtier::kernels
