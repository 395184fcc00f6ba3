// transfer_bench's layouts (a-e, described in transfer_bench.cc) and Bind,
// which places one on the GPU pool (tensor-major tensors, as engines keep
// them) and the host arena (page-first banks, as the daemon keeps them),
// filling in the pool descriptor and host bank views TransferEngine takes.
//
// Thread-safety: stateless functions, safe from any thread.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "bench/transfer_bench.h"
#include "client/pool.h"

namespace kvtier::bench {

std::vector<LayoutDef> AllLayouts() {
  constexpr int kLayers = 32;
  auto kv_bank = [](uint64_t bytes) {
    BankDef b{"kv", {}};
    for (int i = 0; i < 2 * kLayers; ++i) b.tensor_bytes.push_back(bytes);
    return b;
  };
  std::vector<LayoutDef> out;
  {
    LayoutDef l;
    l.key = "a";
    l.name = "bf16_16tok";
    l.description =
        "bf16, 32 layers x K,V, 8 KV heads x 128, 16-token pages: 64 x 32 KiB";
    l.tokens_per_page = 16;
    l.banks = {kv_bank(32 * kKiB)};
    l.chunk_bytes = 32 * kKiB;
    out.push_back(l);
  }
  {
    LayoutDef l;
    l.key = "b";
    l.name = "fp8_16tok";
    l.description =
        "fp8, 32 layers x K,V, 8 KV heads x 128, 16-token pages: 64 x 16 KiB, "
        "plus per-token per-head fp32 scales: 64 x 512 B in bank 'scale'";
    l.tokens_per_page = 16;
    BankDef scale{"scale", {}};
    for (int i = 0; i < 2 * kLayers; ++i) scale.tensor_bytes.push_back(512);
    l.banks = {kv_bank(16 * kKiB), scale};
    l.chunk_bytes = 16 * kKiB;
    l.side_chunk_bytes = 512;
    out.push_back(l);
  }
  {
    LayoutDef l;
    l.key = "c";
    l.name = "bf16_64tok";
    l.description =
        "bf16, 32 layers x K,V, 8 KV heads x 128, 64-token pages: 64 x 128 KiB";
    l.tokens_per_page = 64;
    l.banks = {kv_bank(128 * kKiB)};
    l.chunk_bytes = 128 * kKiB;
    out.push_back(l);
  }
  {
    LayoutDef l;
    l.key = "d";
    l.name = "tp8_bf16_16tok";
    l.description =
        "TP shard: bf16, 32 layers x K,V, 1 KV head x 128, 16-token pages: "
        "64 x 4 KiB";
    l.tokens_per_page = 16;
    l.banks = {kv_bank(4 * kKiB)};
    l.chunk_bytes = 4 * kKiB;
    out.push_back(l);
  }
  {
    LayoutDef l;
    l.key = "e";
    l.name = "hybrid_snapshot";
    l.description =
        "hybrid snapshot: 36 recurrent layers x (32 x 128 x 128 fp32 state "
        "2 MiB + conv state 8192 x 3 bf16 48 KiB)";
    for (int i = 0; i < 36; ++i) {
      l.snapshot_bytes.push_back(2 * kMiB);
      l.snapshot_bytes.push_back(8192 * 3 * 2);
    }
    l.chunk_bytes = 2 * kMiB;
    l.side_chunk_bytes = 8192 * 3 * 2;
    out.push_back(l);
  }
  return out;
}

absl::StatusOr<Bound> Bind(const LayoutDef& def, uint64_t pool,
                           uint64_t pool_bytes, uint8_t* arena_host,
                           uint64_t arena_dev, uint64_t arena_bytes,
                           uint64_t rows) {
  Bound b;
  b.def = &def;
  b.host_rows = rows;
  b.pool.device = 0;
  std::vector<uint64_t> sizes;
  if (def.snapshot()) {
    sizes = def.snapshot_bytes;
  } else {
    for (const BankDef& bank : def.banks) {
      for (uint64_t t : bank.tensor_bytes) sizes.push_back(t);
    }
  }
  uint64_t per_item = 0;
  for (uint64_t s : sizes) {
    per_item += RoundUp(s, 16);
    b.item_bytes += s;
  }
  // Alignment slack per tensor, and the snapshot engine's dummy page bank.
  const uint64_t reserve = sizes.size() * 256 + 4096;
  if (pool_bytes <= reserve + 2 * per_item) {
    return absl::InvalidArgumentError(
        absl::StrCat("layout ", def.key, ": the pool is too small"));
  }
  uint64_t items = (pool_bytes - reserve) / per_item;
  if (def.snapshot()) items = std::min<uint64_t>(items, 4096);
  items = std::min<uint64_t>(items, 0xffffffffu);
  b.gpu_items = items;

  uint64_t gpu_off = 0;
  std::vector<uint64_t> gpu_base(sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) {
    gpu_base[i] = pool + gpu_off;
    gpu_off = RoundUp(gpu_off + RoundUp(sizes[i], 16) * items, 256);
  }
  uint64_t host_off = 0;
  auto place_host = [&](uint64_t row_bytes, uint64_t n) {
    const uint64_t start = RoundUp(host_off, 2 * kMiB);
    host_off = start + RoundUp(row_bytes, 16) * n;
    return start;
  };

  if (def.snapshot()) {
    const uint64_t row_bytes = b.item_bytes;
    const uint64_t stride = RoundUp(row_bytes, 16);
    const uint64_t start = place_host(row_bytes, rows);
    uint64_t in_row = 0;
    for (size_t i = 0; i < sizes.size(); ++i) {
      b.tensors.push_back(Tensor{gpu_base[i], RoundUp(sizes[i], 16),
                                 arena_dev + start + in_row, stride, sizes[i]});
      b.pool.snapshot.push_back(
          PoolTensor{gpu_base[i], RoundUp(sizes[i], 16), sizes[i]});
      in_row += sizes[i];
    }
    b.pool.num_snapshot_slots = items;
    b.snapshot_bank = HostBankView{arena_dev + start, rows, row_bytes, stride};
    b.bank_host.push_back(arena_host ? arena_host + start : nullptr);
    b.bank_row_bytes.push_back(row_bytes);
    b.bank_stride.push_back(stride);
    // The page bank every engine needs: one 16-byte page, never copied.
    const uint64_t dummy_gpu = pool + RoundUp(gpu_off, 256);
    gpu_off = RoundUp(gpu_off, 256) + 16;
    const uint64_t dummy_host = place_host(16, 1);
    b.pool.num_pages = 1;
    b.pool.banks = {BankPool{"kv", {PoolTensor{dummy_gpu, 16, 16}}}};
    b.banks = {{"kv", HostBankView{arena_dev + dummy_host, 1, 16, 16}}};
  } else {
    size_t ti = 0;
    for (const BankDef& bank : def.banks) {
      uint64_t row_bytes = 0;
      for (uint64_t t : bank.tensor_bytes) row_bytes += t;
      const uint64_t stride = RoundUp(row_bytes, 16);
      const uint64_t start = place_host(row_bytes, rows);
      BankPool bp{bank.name, {}};
      uint64_t in_row = 0;
      for (uint64_t t : bank.tensor_bytes) {
        b.tensors.push_back(Tensor{gpu_base[ti], RoundUp(t, 16),
                                   arena_dev + start + in_row, stride, t});
        bp.tensors.push_back(PoolTensor{gpu_base[ti], RoundUp(t, 16), t});
        in_row += t;
        ++ti;
      }
      b.pool.banks.push_back(std::move(bp));
      b.banks.push_back({bank.name, HostBankView{arena_dev + start, rows,
                                                 row_bytes, stride}});
      b.bank_host.push_back(arena_host ? arena_host + start : nullptr);
      b.bank_row_bytes.push_back(row_bytes);
      b.bank_stride.push_back(stride);
    }
    b.pool.num_pages = items;
  }
  if (gpu_off > pool_bytes) {
    return absl::InternalError(
        absl::StrCat("layout ", def.key, ": pool arithmetic overflowed"));
  }
  b.arena_used = host_off;
  if (host_off > arena_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("layout ", def.key, ": needs ", host_off,
                     " host bytes, arena has ", arena_bytes));
  }
  return b;
}

}  // namespace kvtier::bench
