// Description of an engine's GPU KV pool: where each page's bytes live
// on the device, tensor by tensor, and how they map onto the rows of the
// namespace's host banks. An engine fills a GpuPoolDescriptor once at attach;
// libkvtier validates it (see client/transfer_plan.h) and copies pages between
// the pool and host rows with it.
//
// Row format (a cross-process contract with the daemon and other engines):
// a row of bank B holds, back to back and in the order of
// GpuPoolDescriptor::banks[B].tensors, bytes_per_page bytes of each tensor of
// the page; nothing else, no padding. A snapshot row likewise holds the
// snapshot segments back to back in the order of GpuPoolDescriptor::snapshot.
// Page tensors must not overlap each other, nor snapshot segments each other;
// a snapshot segment may overlay page tensors (engines such as vLLM place
// recurrent-state blocks and attention pages in one allocation, a block
// belonging to one of them at a time).
//
// Thread-safety: plain value types.

#ifndef KVTIER_POOL_H_
#define KVTIER_POOL_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace kvtier::client {

// Most tensors one GpuPoolDescriptor may list over all its banks, and most
// snapshot segments. One copy launch carries its whole tensor table as a
// kernel parameter (<= 32,764 bytes); 768 entries of 40 bytes fit beside the
// slice's page ids and rows.
inline constexpr size_t kMaxPoolTensors = 768;

// Required alignment, in bytes, of PoolTensor::base and ::page_stride (and of
// host bank bases and row strides): the copy kernel moves 16-byte vectors.
inline constexpr uint64_t kPoolAlignment = 16;

// One tensor of the pool. Page p's bytes are
// [base + p * page_stride, base + p * page_stride + bytes_per_page).
struct PoolTensor {
  uint64_t base = 0;            // device address of page 0; 16-aligned
  uint64_t page_stride = 0;     // bytes from page p to p + 1; 16-aligned
  uint64_t bytes_per_page = 0;  // > 0 and < 4 GiB; any size (odd is fine)
};

// The tensors whose bytes make up one row of the host bank named `bank`.
// The row size is the sum of the tensors' bytes_per_page.
struct BankPool {
  std::string bank;
  std::vector<PoolTensor> tensors;
};

struct GpuPoolDescriptor {
  int device = 0;          // CUDA device ordinal (ignored by the reference
                           // backend)
  uint64_t num_pages = 0;  // GPU page ids are < num_pages; > 0
  // Same order and names as the namespace's page banks ("kv", "scale", ...);
  // page i of a transfer uses the same row in every bank.
  std::vector<BankPool> banks;
  // Snapshot slot s is segment k's bytes at base + s * page_stride, for
  // every k; empty if the model keeps no recurrent state.
  std::vector<PoolTensor> snapshot;
  uint64_t num_snapshot_slots = 0;  // > 0 iff snapshot is not empty
};

}  // namespace kvtier::client

#endif  // KVTIER_POOL_H_
