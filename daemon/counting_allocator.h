// CountingAllocator: a std::allocator that adds the bytes its containers
// hold to a counter the owner keeps, so that PrefixIndex::MemoryBytes can
// report the heap behind its hash and LRU sets without walking them.
//
// Thread-safety: each allocation and deallocation writes the counter
// unsynchronised; the containers sharing a counter must be changed by one
// thread at a time (the owner's exclusive lock), as their own contract asks.
#ifndef KVTIER_DAEMON_COUNTING_ALLOCATOR_H_
#define KVTIER_DAEMON_COUNTING_ALLOCATOR_H_

#include <cstddef>
#include <memory>

namespace kvtier::daemon {

// Counts the bytes its containers allocate into *bytes, which must outlive
// them.
template <typename T>
struct CountingAllocator {
  using value_type = T;
  size_t* bytes;
  explicit CountingAllocator(size_t* b) : bytes(b) {}
  template <typename U>
  CountingAllocator(const CountingAllocator<U>& o) : bytes(o.bytes) {}
  T* allocate(size_t n) {
    *bytes += n * sizeof(T);
    return std::allocator<T>().allocate(n);
  }
  void deallocate(T* p, size_t n) {
    *bytes -= n * sizeof(T);
    std::allocator<T>().deallocate(p, n);
  }
  template <typename U>
  bool operator==(const CountingAllocator<U>& o) const {
    return bytes == o.bytes;
  }
};

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_COUNTING_ALLOCATOR_H_
