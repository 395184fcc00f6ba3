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

// Layers of layouts a-f256k and g (Llama-3-8B's 32).
constexpr int kLayers = 32;

// Bank "kv": K and V of `layers` layers, `bytes` each per page.
BankDef KvBank(uint64_t bytes, int layers = kLayers) {
  BankDef b{"kv", {}};
  for (int i = 0; i < 2 * layers; ++i) b.tensor_bytes.push_back(bytes);
  return b;
}

// Layouts a-d: tensor-major pools (each layer's K and V its own
// [pages][bytes] array).
std::vector<LayoutDef> TensorMajorLayouts() {
  BankDef scale{"scale", {}};
  for (int i = 0; i < 2 * kLayers; ++i) scale.tensor_bytes.push_back(512);
  return {
      {.key = "a",
       .name = "bf16_16tok",
       .description = "bf16, 32 layers x K,V, 8 KV heads x 128, 16-token "
                      "pages: 64 x 32 KiB",
       .tokens_per_page = 16,
       .banks = {KvBank(32 * kKiB)},
       .chunk_bytes = 32 * kKiB},
      {.key = "b",
       .name = "fp8_16tok",
       .description = "fp8, 32 layers x K,V, 8 KV heads x 128, 16-token "
                      "pages: 64 x 16 KiB, plus per-token per-head fp32 "
                      "scales: 64 x 512 B in bank 'scale'",
       .tokens_per_page = 16,
       .banks = {KvBank(16 * kKiB), scale},
       .chunk_bytes = 16 * kKiB,
       .side_chunk_bytes = 512},
      {.key = "c",
       .name = "bf16_64tok",
       .description = "bf16, 32 layers x K,V, 8 KV heads x 128, 64-token "
                      "pages: 64 x 128 KiB",
       .tokens_per_page = 64,
       .banks = {KvBank(128 * kKiB)},
       .chunk_bytes = 128 * kKiB},
      {.key = "d",
       .name = "tp8_bf16_16tok",
       .description = "TP shard: bf16, 32 layers x K,V, 1 KV head x 128, "
                      "16-token pages: 64 x 4 KiB",
       .tokens_per_page = 16,
       .banks = {KvBank(4 * kKiB)},
       .chunk_bytes = 4 * kKiB},
  };
}

// Layout e: recurrent-state snapshots of a hybrid model.
LayoutDef HybridSnapshotLayout() {
  LayoutDef l{.key = "e",
              .name = "hybrid_snapshot",
              .description =
                  "hybrid snapshot: 36 recurrent layers x (32 x "
                  "128 x 128 fp32 state 2 MiB + conv state 8192 x "
                  "3 bf16 48 KiB)",
              .chunk_bytes = 2 * kMiB,
              .side_chunk_bytes = 8192 * 3 * 2};
  for (int i = 0; i < 36; ++i) {
    l.snapshot_bytes.push_back(2 * kMiB);
    l.snapshot_bytes.push_back(8192 * 3 * 2);
  }
  return l;
}

// Layouts f, f256k, f640k and g: vLLM's block-first pools and its
// layer-first single buffer.
std::vector<LayoutDef> VllmLayouts() {
  return {
      {.key = "f",
       .name = "block_first_2m",
       .description = "vLLM block-first: a's shapes (64 x 32 KiB), a page "
                      "one contiguous 2 MiB run over all layers",
       .placement = GpuPlacement::kBlockFirst,
       .tokens_per_page = 16,
       .banks = {KvBank(32 * kKiB)},
       .chunk_bytes = 32 * kKiB},
      {.key = "f256k",
       .name = "block_first_256k",
       .description = "vLLM block-first: d's shapes (64 x 4 KiB), a page "
                      "one contiguous 256 KiB run over all layers",
       .placement = GpuPlacement::kBlockFirst,
       .tokens_per_page = 16,
       .banks = {KvBank(4 * kKiB)},
       .chunk_bytes = 4 * kKiB},
      {.key = "f640k",
       .name = "block_first_640k_tp8",
       .description = "vLLM block-first, one TP-8 rank of Llama-3-70B: 80 "
                      "layers x K,V, 1 KV head x 128, bf16, 16-token pages "
                      "(160 x 4 KiB), a page one contiguous 640 KiB run",
       .placement = GpuPlacement::kBlockFirst,
       .tokens_per_page = 16,
       .banks = {KvBank(4 * kKiB, 80)},
       .chunk_bytes = 4 * kKiB},
      {.key = "g",
       .name = "layer_first_buffer",
       .description = "vLLM layer-first single buffer: a's shapes (64 x 32 "
                      "KiB), one allocation, a page's chunks a fixed layer "
                      "stride apart",
       .placement = GpuPlacement::kLayerFirstBuffer,
       .tokens_per_page = 16,
       .banks = {KvBank(32 * kKiB)},
       .chunk_bytes = 32 * kKiB},
  };
}

// One page's (or snapshot's) tensor sizes of `def`, in row order.
std::vector<uint64_t> TensorSizes(const LayoutDef& def) {
  if (def.snapshot()) return def.snapshot_bytes;
  std::vector<uint64_t> sizes;
  for (const BankDef& bank : def.banks) {
    for (uint64_t t : bank.tensor_bytes) sizes.push_back(t);
  }
  return sizes;
}

// Where the tensors of a bound layout sit in the GPU pool.
struct GpuTensors {
  std::vector<uint64_t> base, stride;  // per tensor, item 0 and item stride
  uint64_t end = 0;                    // pool bytes used, from its start
};

// Places `items` items of tensors of `sizes` at `pool` as `placement` says:
// tensor-major arrays 256-byte aligned, block-first pages `page_stride`
// apart, or one layer-first buffer of the largest tensor's array per layer.
GpuTensors PlaceOnGpu(GpuPlacement placement,
                      const std::vector<uint64_t>& sizes, uint64_t pool,
                      uint64_t items, uint64_t page_stride) {
  GpuTensors g;
  g.base.resize(sizes.size());
  g.stride.resize(sizes.size());
  switch (placement) {
    case GpuPlacement::kTensorMajor:
      for (size_t i = 0; i < sizes.size(); ++i) {
        g.base[i] = pool + g.end;
        g.stride[i] = RoundUp(sizes[i], 16);
        g.end = RoundUp(g.end + g.stride[i] * items, 256);
      }
      break;
    case GpuPlacement::kBlockFirst: {
      uint64_t in_page = 0;
      for (size_t i = 0; i < sizes.size(); ++i) {
        g.base[i] = pool + in_page;
        g.stride[i] = page_stride;
        in_page += RoundUp(sizes[i], 16);
      }
      g.end = page_stride * items;
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
        g.base[i] = pool + i * layer_stride;
        g.stride[i] = RoundUp(sizes[i], 16);
      }
      g.end = layer_stride * sizes.size();
      break;
    }
  }
  return g;
}

// The host arena as Bind fills it: banks 2 MiB aligned, back to back.
struct HostArena {
  uint8_t* host = nullptr;  // null: arithmetic only
  uint64_t dev = 0;         // device pointer of the arena's start
  uint64_t used = 0;        // bytes placed so far

  // Places `n` rows of `row_bytes` (16-byte aligned rows) at the next 2 MiB
  // boundary and returns their offset.
  uint64_t Place(uint64_t row_bytes, uint64_t n) {
    const uint64_t start = RoundUp(used, 2 * kMiB);
    used = start + RoundUp(row_bytes, 16) * n;
    return start;
  }
};

// Records a bank that carries payload (rows at `start` of `arena`) in
// b's bank_host, bank_row_bytes and bank_stride.
void AddPayloadBank(const HostArena& arena, uint64_t start, uint64_t row_bytes,
                    uint64_t stride, Bound* b) {
  b->bank_host.push_back(arena.host ? arena.host + start : nullptr);
  b->bank_row_bytes.push_back(row_bytes);
  b->bank_stride.push_back(stride);
}

// Binds layout e: `items` snapshot slots of segments `sizes` at `gpu`, a
// snapshot bank of `rows` rows in `arena`, and the one-page dummy page bank
// every engine needs (after the slots, extending gpu->end).
void BindSnapshots(const std::vector<uint64_t>& sizes, uint64_t pool,
                   uint64_t items, uint64_t rows, GpuTensors* gpu,
                   HostArena* arena, Bound* b) {
  const uint64_t row_bytes = b->item_bytes;
  const uint64_t stride = RoundUp(row_bytes, 16);
  const uint64_t start = arena->Place(row_bytes, rows);
  uint64_t in_row = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    b->tensors.push_back(Tensor{gpu->base[i], gpu->stride[i],
                                arena->dev + start + in_row, stride, sizes[i]});
    b->pool.snapshot.push_back(
        PoolTensor{gpu->base[i], gpu->stride[i], sizes[i]});
    in_row += sizes[i];
  }
  b->pool.num_snapshot_slots = items;
  b->snapshot_bank = HostBankView{arena->dev + start, rows, row_bytes, stride};
  AddPayloadBank(*arena, start, row_bytes, stride, b);
  // The page bank every engine needs: one 16-byte page, never copied.
  const uint64_t dummy_gpu = pool + RoundUp(gpu->end, 256);
  gpu->end = RoundUp(gpu->end, 256) + 16;
  const uint64_t dummy_host = arena->Place(16, 1);
  b->pool.num_pages = 1;
  b->pool.banks = {BankPool{"kv", {PoolTensor{dummy_gpu, 16, 16}}}};
  b->banks = {{"kv", HostBankView{arena->dev + dummy_host, 1, 16, 16}}};
}

// Binds the page banks of `def`: `items` pages of its tensors at `gpu`
// (in the banks' row order) and a page-first bank of `rows` rows per
// BankDef in `arena`.
void BindPageBanks(const LayoutDef& def, const GpuTensors& gpu, uint64_t items,
                   uint64_t rows, HostArena* arena, Bound* b) {
  size_t ti = 0;
  for (const BankDef& bank : def.banks) {
    uint64_t row_bytes = 0;
    for (uint64_t t : bank.tensor_bytes) row_bytes += t;
    const uint64_t stride = RoundUp(row_bytes, 16);
    const uint64_t start = arena->Place(row_bytes, rows);
    BankPool bp{bank.name, {}};
    uint64_t in_row = 0;
    for (uint64_t t : bank.tensor_bytes) {
      b->tensors.push_back(Tensor{gpu.base[ti], gpu.stride[ti],
                                  arena->dev + start + in_row, stride, t});
      bp.tensors.push_back(PoolTensor{gpu.base[ti], gpu.stride[ti], t});
      in_row += t;
      ++ti;
    }
    b->pool.banks.push_back(std::move(bp));
    b->banks.push_back(
        {bank.name, HostBankView{arena->dev + start, rows, row_bytes, stride}});
    AddPayloadBank(*arena, start, row_bytes, stride, b);
  }
  b->pool.num_pages = items;
}

}  // namespace

std::vector<LayoutDef> AllLayouts() {
  std::vector<LayoutDef> out = TensorMajorLayouts();
  out.push_back(HybridSnapshotLayout());
  for (LayoutDef& l : VllmLayouts()) out.push_back(std::move(l));
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
  const std::vector<uint64_t> sizes = TensorSizes(def);
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

  GpuTensors gpu = PlaceOnGpu(def.placement, sizes, pool, items, page_stride);
  HostArena arena{arena_host, arena_dev};
  if (def.snapshot()) {
    BindSnapshots(sizes, pool, items, rows, &gpu, &arena, &b);
  } else {
    BindPageBanks(def, gpu, items, rows, &arena, &b);
  }
  if (gpu.end > pool_bytes) {
    return absl::InternalError(
        absl::StrCat("layout ", def.key, ": pool arithmetic overflowed"));
  }
  b.arena_used = arena.used;
  if (arena.used > arena_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("layout ", def.key, ": needs ", arena.used,
                     " host bytes, arena has ", arena_bytes));
  }
  return b;
}

}  // namespace kvtier::bench
