// tsan_canary: the programs tsan_canary_test runs to prove the TSan build is
// live (tests/CMakeLists.txt builds it only with KVTIER_SANITIZE=thread).
//   tsan_canary race    two threads increment one counter, unsynchronised:
//                       TSan must report a data race in RacyIncrement.
//   tsan_canary mutex   the same under an absl::Mutex: clean only when the
//                       abseil it runs on is instrumented (scripts/
//                       tsan-abseil.sh), since Debian's Mutex never calls
//                       into TSan.
// Prints "counter N" and exits 0 unless TSan stops it first.
//
// Thread-safety: deliberately racy in mode race; nothing else shares state.
#include <atomic>
#include <cstdio>
#include <cstring>
#include <thread>

#include "absl/base/attributes.h"
#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace {

constexpr int kIncrements = 1000;

// Both threads run at once: TSan may recycle a finished thread's slot for
// the next one and then see its accesses as the new thread's own. The
// counter's increments are ordered by neither barrier.
std::atomic<int> started{0};
std::atomic<int> finished{0};
void Meet(std::atomic<int>& barrier) {
  barrier.fetch_add(1);
  while (barrier.load() < 2) std::this_thread::yield();
}

int racy_counter = 0;
absl::Mutex mu;
int locked_counter ABSL_GUARDED_BY(mu) = 0;

ABSL_ATTRIBUTE_NOINLINE void RacyIncrement() {
  Meet(started);
  for (int i = 0; i < kIncrements; ++i) {
    ++racy_counter;
    // One load and store each time round, not one += kIncrements: TSan may
    // miss a race between two single accesses made at the very same time.
    asm volatile("" ::: "memory");
  }
  Meet(finished);
}

ABSL_ATTRIBUTE_NOINLINE void LockedIncrement() {
  Meet(started);
  for (int i = 0; i < kIncrements; ++i) {
    absl::MutexLock lock(&mu);
    ++locked_counter;
  }
  Meet(finished);
}

}  // namespace

int main(int argc, char** argv) {
  const bool racy = argc == 2 && std::strcmp(argv[1], "race") == 0;
  if (!racy && !(argc == 2 && std::strcmp(argv[1], "mutex") == 0)) {
    std::fprintf(stderr, "usage: tsan_canary race|mutex\n");
    return 2;
  }
  void (*increment)() = racy ? RacyIncrement : LockedIncrement;
  std::thread a(increment), b(increment);
  a.join();
  b.join();
  int total = racy_counter;
  if (!racy) {
    absl::MutexLock lock(&mu);
    total = locked_counter;
  }
  std::printf("counter %d\n", total);
  return 0;
}
