// transfer_bench's layouts (a-g, described in transfer_bench.cc) and Bind,
// which places one on the GPU pool (tensor-major tensors, block-first pages
// or one layer-first buffer, as engines keep them) and the host arena
// (page-first banks, as the daemon keeps them), filling in the pool descriptor
// and host bank views TransferEngine takes.
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

namespace {
// Layers of layouts a-g (Llama-3-8B's 32).
constexpr int kLayers = 32;
}  // namespace

std::vector<LayoutDef> AllLayouts() {
  auto kv_bank = [](uint64_t bytes, int layers = kLayers) {
    BankDef b{"kv", {}};
    for (int i = 0; i < 2 * layers; ++i) b.tensor_bytes.push_back(bytes);
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
  {
    LayoutDef l;
    l.key = "f";
    l.name = "block_first_2m";
    l.description =
        "vLLM block-first: a's shapes (64 x 32 KiB), a page one contiguous "
        "2 MiB run over all layers";
    l.placement = GpuPlacement::kBlockFirst;
    l.tokens_per_page = 16;
    l.banks = {kv_bank(32 * kKiB)};
    l.chunk_bytes = 32 * kKiB;
    out.push_back(l);
  }
  {
    LayoutDef l;
    l.key = "f256k";
    l.name = "block_first_256k";
    l.description =
        "vLLM block-first: d's shapes (64 x 4 KiB), a page one contiguous "
        "256 KiB run over all layers";
    l.placement = GpuPlacement::kBlockFirst;
    l.tokens_per_page = 16;
    l.banks = {kv_bank(4 * kKiB)};
    l.chunk_bytes = 4 * kKiB;
    out.push_back(l);
  }
  {
    LayoutDef l;
    l.key = "f640k";
    l.name = "block_first_640k_tp8";
    l.description =
        "vLLM block-first, one TP-8 rank of Llama-3-70B: 80 layers x K,V, "
        "1 KV head x 128, bf16, 16-token pages (160 x 4 KiB), a page one "
        "contiguous 640 KiB run";
    l.placement = GpuPlacement::kBlockFirst;
    l.tokens_per_page = 16;
    l.banks = {kv_bank(4 * kKiB, 80)};
    l.chunk_bytes = 4 * kKiB;
    out.push_back(l);
  }
  {
    LayoutDef l;
    l.key = "g";
    l.name = "layer_first_buffer";
    l.description =
        "vLLM layer-first single buffer: a's shapes (64 x 32 KiB), one "
        "allocation, a page's chunks a fixed layer stride apart";
    l.placement = GpuPlacement::kLayerFirstBuffer;
    l.tokens_per_page = 16;
    l.banks = {kv_bank(32 * kKiB)};
    l.chunk_bytes = 32 * kKiB;
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
  // Block-first pages keep 256-byte alignment from one to the next.
  const uint64_t page_stride = def.placement == GpuPlacement::kBlockFirst
                                   ? RoundUp(per_item, 256)
                                   : per_item;
  uint64_t items = (pool_bytes - reserve) / page_stride;
  if (def.snapshot()) items = std::min<uint64_t>(items, 4096);
  items = std::min<uint64_t>(items, 0xffffffffu);
  b.gpu_items = items;

  uint64_t gpu_off = 0;
  std::vector<uint64_t> gpu_base(sizes.size()), gpu_stride(sizes.size());
  switch (def.placement) {
    case GpuPlacement::kTensorMajor:
      for (size_t i = 0; i < sizes.size(); ++i) {
        gpu_base[i] = pool + gpu_off;
        gpu_stride[i] = RoundUp(sizes[i], 16);
        gpu_off = RoundUp(gpu_off + gpu_stride[i] * items, 256);
      }
      break;
    case GpuPlacement::kBlockFirst: {
      uint64_t in_page = 0;
      for (size_t i = 0; i < sizes.size(); ++i) {
        gpu_base[i] = pool + in_page;
        gpu_stride[i] = page_stride;
        in_page += RoundUp(sizes[i], 16);
      }
      gpu_off = page_stride * items;
      break;
    }
    case GpuPlacement::kLayerFirstBuffer: {
      // One stride for every layer: the largest tensor's array.
      uint64_t layer_stride = 0;
      for (uint64_t s : sizes) {
        layer_stride = std::max(layer_stride, RoundUp(s, 16) * items);
      }
      layer_stride = RoundUp(layer_stride, 256);
      for (size_t i = 0; i < sizes.size(); ++i) {
        gpu_base[i] = pool + i * layer_stride;
        gpu_stride[i] = RoundUp(sizes[i], 16);
      }
      gpu_off = layer_stride * sizes.size();
      break;
    }
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
      b.tensors.push_back(Tensor{gpu_base[i], gpu_stride[i],
                                 arena_dev + start + in_row, stride, sizes[i]});
      b.pool.snapshot.push_back(
          PoolTensor{gpu_base[i], gpu_stride[i], sizes[i]});
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
        b.tensors.push_back(Tensor{gpu_base[ti], gpu_stride[ti],
                                   arena_dev + start + in_row, stride, t});
        bp.tensors.push_back(PoolTensor{gpu_base[ti], gpu_stride[ti], t});
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
