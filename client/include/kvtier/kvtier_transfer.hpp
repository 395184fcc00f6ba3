// Copies between an engine's GPU pool and a namespace's banks in libkvtier's
// C++ layer (kvtier/kvtier.hpp, which includes this file): Pool (the
// engine's pool, as kvt_pool describes it), Backend, and Transfer, the owner
// of one kvt_transfer (Namespace::CreateTransfer makes one). Every copy is
// queued on the engine's stream; none synchronises the device.
//
// Thread-safety: as the C ABI: a Transfer is used by one thread at a time.
// Pool and its parts are plain values.
#ifndef KVTIER_KVTIER_TRANSFER_HPP_
#define KVTIER_KVTIER_TRANSFER_HPP_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kvtier/kvtier.h"
#include "kvtier/kvtier_status.hpp"

namespace kvtier {

class Namespace;

enum class Backend : int32_t {
  kCuda = KVT_BACKEND_CUDA,            // The engine's GPU pool (CUDA).
  kReference = KVT_BACKEND_REFERENCE,  // Host memory, for tests.
};

// The engine's GPU pool, as kvt_pool describes it.
struct PoolTensor {
  uint64_t base = 0;  // Device address of page 0 (16-aligned).
  uint64_t page_stride = 0;
  uint64_t bytes_per_page = 0;
};
struct BankPool {
  std::string bank;
  std::vector<PoolTensor> tensors;
};
struct Pool {
  int32_t device = 0;
  uint64_t num_pages = 0;
  std::vector<BankPool> banks;  // One per page bank, in namespace order.
  std::vector<PoolTensor> snapshot;
  uint64_t num_snapshot_slots = 0;
};

namespace internal {

// A Pool as the C ABI takes it: pool() points into *this (and into the Pool
// it was made from, for the bank names), so both must outlive its use.
class CPool {
 public:
  explicit CPool(const Pool& pool) {
    tensors_.reserve(pool.banks.size());
    banks_.reserve(pool.banks.size());
    for (const auto& b : pool.banks) {
      tensors_.push_back(ToC(b.tensors));
      banks_.push_back({b.bank.c_str(), tensors_.back().data(),
                        static_cast<uint32_t>(tensors_.back().size())});
    }
    snapshot_ = ToC(pool.snapshot);
    pool_.device = pool.device;
    pool_.num_pages = pool.num_pages;
    pool_.banks = banks_.data();
    pool_.num_banks = static_cast<uint32_t>(banks_.size());
    pool_.snapshot = snapshot_.empty() ? nullptr : snapshot_.data();
    pool_.num_snapshot_tensors = static_cast<uint32_t>(snapshot_.size());
    pool_.num_snapshot_slots = pool.num_snapshot_slots;
  }
  CPool(const CPool&) = delete;
  CPool& operator=(const CPool&) = delete;

  const kvt_pool* pool() const { return &pool_; }

 private:
  static std::vector<kvt_pool_tensor> ToC(const std::vector<PoolTensor>& ts) {
    std::vector<kvt_pool_tensor> out;
    out.reserve(ts.size());
    for (const auto& t : ts) {
      out.push_back({t.base, t.page_stride, t.bytes_per_page});
    }
    return out;
  }

  std::vector<std::vector<kvt_pool_tensor>> tensors_;
  std::vector<kvt_bank_pool> banks_;
  std::vector<kvt_pool_tensor> snapshot_;
  kvt_pool pool_{};
};

}  // namespace internal

// Copies between the engine's GPU pool and the namespace's banks, queued on
// the engine's streams. REQUIRES: the Namespace outlives it.
class Transfer {
 public:
  // Queues GPU page gpu_pages[i] -> bank row rows[i], for i < n.
  Status Evict(const uint32_t* gpu_pages, const uint32_t* rows, size_t n,
               void* stream) {
    return Status::FromC(kvt_evict(h_.get(), gpu_pages, rows, n, stream));
  }
  // Queues bank row rows[i] -> GPU page gpu_pages[i], for i < n.
  Status Rehydrate(const uint32_t* gpu_pages, const uint32_t* rows, size_t n,
                   void* stream) {
    return Status::FromC(kvt_rehydrate(h_.get(), gpu_pages, rows, n, stream));
  }
  Status SaveSnapshot(uint32_t slot, uint32_t row, void* stream) {
    return Status::FromC(kvt_snapshot_save(h_.get(), slot, row, stream));
  }
  Status RestoreSnapshot(uint32_t slot, uint32_t row, void* stream) {
    return Status::FromC(kvt_snapshot_restore(h_.get(), slot, row, stream));
  }
  // A snapshot row of several groups: slots[g] <-> group g's part of `row`.
  Status SaveSnapshots(const uint32_t* slots, uint32_t num_slots, uint32_t row,
                       void* stream) {
    return Status::FromC(
        kvt_snapshot_save_groups(h_.get(), slots, num_slots, row, stream));
  }
  Status RestoreSnapshots(const uint32_t* slots, uint32_t num_slots,
                          uint32_t row, void* stream) {
    return Status::FromC(
        kvt_snapshot_restore_groups(h_.get(), slots, num_slots, row, stream));
  }

 private:
  friend class Namespace;
  explicit Transfer(kvt_transfer* h) : h_(h) {}
  internal::Handle<kvt_transfer, kvt_transfer_free> h_;
};

}  // namespace kvtier

#endif  // KVTIER_KVTIER_TRANSFER_HPP_
