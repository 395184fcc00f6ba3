// Helpers of the TransferEngine CPU tests (transfer_engine_test.cc,
// transfer_engine_staged_test.cc): pools and banks in host memory, the
// descriptors describing them, and the layouts the tests round-trip (bf16
// K/V, fp8 K/V with a scale bank, odd row sizes). Pool "device addresses"
// are ordinary host buffers.
//
// Thread-safety: none; each test owns its setups.

#ifndef KVTIER_CLIENT_TRANSFER_ENGINE_TEST_UTIL_H_
#define KVTIER_CLIENT_TRANSFER_ENGINE_TEST_UTIL_H_

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "client/pool.h"
#include "gtest/gtest.h"

namespace kvtier::client::transfer_test {

// A 64-byte aligned, zeroed host buffer.
class Buffer {
 public:
  explicit Buffer(size_t bytes)
      : bytes_(bytes),
        data_(static_cast<uint8_t*>(std::aligned_alloc(
            64, (std::max<size_t>(bytes, 1) + 63) / 64 * 64))) {
    std::memset(data_.get(), 0, bytes_);
  }
  uint8_t* data() const { return data_.get(); }
  size_t size() const { return bytes_; }
  uint64_t addr() const { return reinterpret_cast<uint64_t>(data_.get()); }

 private:
  struct Free {
    void operator()(uint8_t* p) const { std::free(p); }
  };
  size_t bytes_;
  std::unique_ptr<uint8_t, Free> data_;
};

struct TensorSpec {
  uint64_t bytes;
  uint64_t stride;
};
struct BankSpec {
  std::string name;
  std::vector<TensorSpec> tensors;
};

inline uint64_t RoundUp16(uint64_t v) { return (v + 15) / 16 * 16; }

// A pool in host memory (one buffer per tensor, region per tensor) and its
// host banks, with the descriptor and bank views describing them.
struct HostSetup {
  GpuPoolDescriptor pool;
  std::vector<std::unique_ptr<Buffer>> tensors;  // in descriptor order
  std::vector<std::unique_ptr<Buffer>> banks;
  std::vector<NamedHostBank> views;
  std::vector<uint64_t> row_bytes;

  HostSetup(const std::vector<BankSpec>& spec, uint64_t num_pages,
            uint64_t rows) {
    pool.num_pages = num_pages;
    for (const BankSpec& b : spec) {
      BankPool bp{b.name, {}};
      uint64_t sum = 0;
      for (const TensorSpec& t : b.tensors) {
        tensors.push_back(std::make_unique<Buffer>(t.stride * num_pages));
        bp.tensors.push_back(
            PoolTensor{tensors.back()->addr(), t.stride, t.bytes});
        sum += t.bytes;
      }
      pool.banks.push_back(bp);
      const uint64_t stride = RoundUp16(sum);
      banks.push_back(std::make_unique<Buffer>(stride * rows));
      views.push_back(
          {b.name, HostBankView{banks.back()->addr(), rows, sum, stride}});
      row_bytes.push_back(sum);
    }
  }

  void FillPoolRandom(uint64_t seed) {
    std::mt19937_64 rng(seed);
    for (auto& t : tensors) {
      for (size_t i = 0; i < t->size(); i += 8) {
        const uint64_t v = rng();
        std::memcpy(t->data() + i, &v, std::min<size_t>(8, t->size() - i));
      }
    }
  }

  std::vector<std::vector<uint8_t>> SnapshotPool() const {
    std::vector<std::vector<uint8_t>> out;
    for (auto& t : tensors) out.emplace_back(t->data(), t->data() + t->size());
    return out;
  }
  std::vector<std::vector<uint8_t>> SnapshotBanks() const {
    std::vector<std::vector<uint8_t>> out;
    for (auto& b : banks) out.emplace_back(b->data(), b->data() + b->size());
    return out;
  }

  // Page `page` of tensor `t` (flat index over all banks).
  const uint8_t* Page(size_t t, uint64_t page) const {
    size_t k = 0;
    for (const BankPool& b : pool.banks) {
      for (const PoolTensor& pt : b.tensors) {
        if (k++ == t)
          return reinterpret_cast<const uint8_t*>(pt.base) +
                 page * pt.page_stride;
      }
    }
    return nullptr;
  }
};

inline std::vector<uint32_t> DistinctRandom(uint32_t count, uint32_t below,
                                            std::mt19937& rng) {
  std::vector<uint32_t> all(below);
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), rng);
  all.resize(count);
  return all;
}

// bf16: 32 layers x (K, V); a page is 16 tokens x 8 KV heads x 128 dims x 2
// bytes = 32 KiB per tensor, 2 MiB per row.
inline std::vector<BankSpec> Bf16Layout(int layers) {
  BankSpec kv{"kv", {}};
  for (int i = 0; i < 2 * layers; ++i) kv.tensors.push_back({32768, 32768});
  return {kv};
}

// fp8: 32 layers x (K, V) of 16 x 8 x 128 x 1 byte, and a "scale" bank of
// per-token fp32 scales (16 x 4 bytes) per layer and K/V.
inline std::vector<BankSpec> Fp8Layout(int layers) {
  BankSpec kv{"kv", {}};
  BankSpec scale{"scale", {}};
  for (int i = 0; i < 2 * layers; ++i) {
    kv.tensors.push_back({16384, 16384});
    scale.tensors.push_back({64, 64});
  }
  return {kv, scale};
}

// Odd sizes: rows of 194 and 3 bytes; later tensors sit at odd offsets.
inline std::vector<BankSpec> OddLayout() {
  return {BankSpec{"kv", {{100, 112}, {37, 48}, {7, 16}, {50, 64}}},
          BankSpec{"scale", {{3, 16}}}};
}

}  // namespace kvtier::client::transfer_test

#endif  // KVTIER_CLIENT_TRANSFER_ENGINE_TEST_UTIL_H_
