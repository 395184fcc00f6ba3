// Host side of the sparse-attention offload kernels: parameter checks, the
// ensure state layout, and the plain C++ reference implementations of the
// mirror store, the ensure plan and the ensure copy (see
// kernels/sparse_offload.h for the semantics both sides implement).
//
// Thread-safety: pure functions, except the Run*Reference functions, which
// write the memory their params point to (callers serialise them).

#include "kernels/sparse_offload.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace kvtier::kernels {
namespace {

size_t Align16(size_t n) { return (n + 15) / 16 * 16; }

}  // namespace

// ------------------------------------------------------------------ mirror --

absl::Status CheckMirrorStoreParams(const MirrorStoreParams& p) {
  const MirrorStoreHeader& h = p.header;
  if (h.num_segments == 0 || h.num_segments > kMaxMirrorSegments) {
    return absl::InvalidArgumentError(
        absl::StrCat("mirror store: num_segments ", h.num_segments,
                     " is not in [1, ", kMaxMirrorSegments, "]"));
  }
  if (h.tokens_per_page == 0) {
    return absl::InvalidArgumentError("mirror store: tokens_per_page is 0");
  }
  if (h.max_entries == 0) {
    return absl::InvalidArgumentError("mirror store: max_entries is 0");
  }
  if (h.num_logical == 0 || h.num_slots == 0) {
    return absl::InvalidArgumentError(
        "mirror store: num_logical and num_slots must be > 0");
  }
  if (h.max_ctas == 0 || h.max_ctas > kMaxCtasLimit) {
    return absl::InvalidArgumentError(
        absl::StrCat("mirror store: max_ctas ", h.max_ctas, " is not in [1, ",
                     kMaxCtasLimit, "]"));
  }
  if (h.entries == nullptr || h.count == nullptr || h.mirror_rows == nullptr ||
      h.drops == nullptr) {
    return absl::InvalidArgumentError(
        "mirror store: entries, count, mirror_rows and drops must be set");
  }
  for (uint32_t s = 0; s < h.num_segments; ++s) {
    if (p.segments[s].bytes_per_token == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("mirror store: segments[", s, "].bytes_per_token is 0"));
    }
  }
  return absl::OkStatus();
}

uint32_t MirrorStoreGridSize(const MirrorStoreParams& p) {
  constexpr uint64_t kWarpsPerCta = kThreadsPerCta / 32;
  const uint64_t units =
      static_cast<uint64_t>(p.header.max_entries) * p.header.num_segments;
  uint64_t ctas = (units + kWarpsPerCta - 1) / kWarpsPerCta;
  if (ctas > p.header.max_ctas) ctas = p.header.max_ctas;
  if (ctas == 0) ctas = 1;
  return static_cast<uint32_t>(ctas);
}

absl::Status RunMirrorStoreReference(const MirrorStoreParams& p) {
  if (absl::Status s = CheckMirrorStoreParams(p); !s.ok()) return s;
  const MirrorStoreHeader& h = p.header;
  // Atomic: the session's thread may set it meanwhile (client/mirror.cc).
  if (h.revoked != nullptr && __atomic_load_n(h.revoked, __ATOMIC_ACQUIRE)) {
    return absl::OkStatus();
  }
  const uint32_t count = std::min(*h.count, h.max_entries);
  for (uint32_t i = 0; i < count; ++i) {
    const MirrorEntry e = h.entries[i];
    if (e.logical < 0) continue;
    if (static_cast<uint32_t>(e.logical) >= h.num_logical || e.slot < 0 ||
        static_cast<uint32_t>(e.slot) >= h.num_slots || e.token < 0 ||
        static_cast<uint32_t>(e.token) >= h.tokens_per_page) {
      *h.drops += 1;
      continue;
    }
    const uint64_t row = h.mirror_rows[e.logical];
    for (uint32_t s = 0; s < h.num_segments; ++s) {
      const MirrorSegment& seg = p.segments[s];
      const uint64_t off =
          seg.per_page ? 0
                       : static_cast<uint64_t>(e.token) * seg.bytes_per_token;
      std::memcpy(
          reinterpret_cast<void*>(seg.bank_base + row * seg.bank_row_stride +
                                  off),
          reinterpret_cast<const void*>(
              seg.pool_base +
              static_cast<uint64_t>(e.slot) * seg.pool_page_stride + off),
          seg.bytes_per_token);
    }
  }
  return absl::OkStatus();
}

// ------------------------------------------------------------------ ensure --

absl::Status CheckEnsureConfig(const EnsureConfig& c) {
  if (c.num_slots == 0) {
    return absl::InvalidArgumentError("ensure: num_slots is 0");
  }
  if (c.num_logical == 0) {
    return absl::InvalidArgumentError("ensure: num_logical is 0");
  }
  if (c.max_batch == 0 || c.max_selected == 0) {
    return absl::InvalidArgumentError(
        "ensure: max_batch and max_selected must be > 0");
  }
  const uint64_t entries = static_cast<uint64_t>(c.max_batch) * c.max_selected;
  if (entries > c.num_slots) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ensure: max_batch x max_selected = ", c.max_batch, " x ",
        c.max_selected, " = ", entries, " exceeds num_slots ", c.num_slots,
        ": one step's selection could not be resident at once"));
  }
  if (c.num_logical > (1u << 31) - 1 || c.num_slots > (1u << 31) - 1) {
    return absl::InvalidArgumentError(
        "ensure: num_logical and num_slots must be < 2^31");
  }
  return absl::OkStatus();
}

size_t EnsureStateBytes(const EnsureConfig& c) {
  const size_t p = c.num_slots;
  const size_t l = c.num_logical;
  const size_t n = static_cast<size_t>(c.max_batch) * c.max_selected;
  return Align16(p * 4) + Align16(l * 4) + Align16(p * 4) + Align16(l * 8) +
         16 + 16 + Align16(n * 4) * 3 + 16;
}

EnsureState LayOutEnsureState(const EnsureConfig& c, void* memory) {
  EnsureState s;
  s.num_slots = c.num_slots;
  s.num_logical = c.num_logical;
  s.max_entries = c.max_batch * c.max_selected;
  uint8_t* at = static_cast<uint8_t*>(memory);
  auto take = [&at](size_t bytes) {
    uint8_t* p = at;
    at += Align16(bytes);
    return p;
  };
  const size_t n = s.max_entries;
  // 8-byte arrays first so every array keeps its natural alignment.
  s.claim = reinterpret_cast<unsigned long long*>(take(c.num_logical * 8ull));
  s.drops = reinterpret_cast<unsigned long long*>(take(16));
  s.slot_logical = reinterpret_cast<int32_t*>(take(c.num_slots * 4ull));
  s.logical_slot = reinterpret_cast<int32_t*>(take(c.num_logical * 4ull));
  s.slot_stamp = reinterpret_cast<uint32_t*>(take(c.num_slots * 4ull));
  s.step = reinterpret_cast<uint32_t*>(take(16));
  s.miss_logical = reinterpret_cast<int32_t*>(take(n * 4));
  s.copy_slot = reinterpret_cast<uint32_t*>(take(n * 4));
  s.copy_row = reinterpret_cast<uint32_t*>(take(n * 4));
  s.copy_count = reinterpret_cast<uint32_t*>(take(16));
  return s;
}

void ResetEnsureStateHost(const EnsureState& s) {
  std::fill_n(s.slot_logical, s.num_slots, -1);
  std::fill_n(s.logical_slot, s.num_logical, -1);
  std::fill_n(s.slot_stamp, s.num_slots, 0u);
  std::fill_n(s.claim, s.num_logical, 0ull);
  *s.step = 0;
  *s.drops = 0;
  *s.copy_count = 0;
}

absl::Status CheckEnsurePlanParams(const EnsurePlanParams& p) {
  const EnsureState& s = p.state;
  if (s.num_slots == 0 || s.num_logical == 0 || s.max_entries == 0 ||
      s.max_entries > s.num_slots) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ensure plan: state sizes num_slots ", s.num_slots, ", num_logical ",
        s.num_logical, ", max_entries ", s.max_entries, " are inconsistent"));
  }
  if (s.slot_logical == nullptr || s.logical_slot == nullptr ||
      s.slot_stamp == nullptr || s.claim == nullptr || s.step == nullptr ||
      s.drops == nullptr || s.miss_logical == nullptr ||
      s.copy_slot == nullptr || s.copy_row == nullptr ||
      s.copy_count == nullptr) {
    return absl::InvalidArgumentError("ensure plan: a state array is null");
  }
  if (p.selected == nullptr || p.translated == nullptr ||
      p.mirror_rows == nullptr) {
    return absl::InvalidArgumentError(
        "ensure plan: selected, translated and mirror_rows must be set");
  }
  return absl::OkStatus();
}

absl::Status RunEnsurePlanReference(const EnsurePlanParams& p) {
  if (absl::Status st = CheckEnsurePlanParams(p); !st.ok()) return st;
  const EnsureState& s = p.state;
  const uint32_t step = ++*s.step;
  const uint32_t n = s.max_entries;
  // 2: mark hits, count malformed entries.
  for (uint32_t i = 0; i < n; ++i) {
    const int32_t l = p.selected[i];
    if (l == -1) continue;
    if (l < 0 || static_cast<uint32_t>(l) >= s.num_logical) {
      *s.drops += 1;
      continue;
    }
    const int32_t slot = s.logical_slot[l];
    if (slot >= 0) s.slot_stamp[slot] = step;
  }
  // 3: distinct misses in order of first occurrence (claim marks "seen this
  // step", as the kernel's claim does).
  std::vector<int32_t> misses;
  for (uint32_t i = 0; i < n; ++i) {
    const int32_t l = p.selected[i];
    if (l < 0 || static_cast<uint32_t>(l) >= s.num_logical) continue;
    const unsigned long long key =
        (static_cast<unsigned long long>(step) << 32) | (0xFFFFFFFFu - i);
    if ((s.claim[l] >> 32) == step) continue;  // an earlier entry has it
    s.claim[l] = key;
    if (s.logical_slot[l] < 0) misses.push_back(l);
  }
  std::vector<std::pair<uint64_t, uint32_t>> candidates;
  for (uint32_t slot = 0; slot < s.num_slots; ++slot) {
    if (s.slot_stamp[slot] == step) continue;
    candidates.emplace_back(
        (static_cast<uint64_t>(s.slot_stamp[slot]) << 32) | slot, slot);
  }
  if (misses.size() > candidates.size()) {
    *s.drops += misses.size() - candidates.size();
    misses.resize(candidates.size());
  }
  const size_t m = misses.size();
  // 4: the m smallest keys, then in slot order.
  std::partial_sort(candidates.begin(), candidates.begin() + m,
                    candidates.end());
  std::vector<uint32_t> victims;
  victims.reserve(m);
  for (size_t k = 0; k < m; ++k) victims.push_back(candidates[k].second);
  std::sort(victims.begin(), victims.end());
  // 5: rebind.
  for (size_t k = 0; k < m; ++k) {
    const uint32_t slot = victims[k];
    const int32_t l = misses[k];
    const int32_t old = s.slot_logical[slot];
    if (old >= 0) s.logical_slot[old] = -1;
    s.slot_logical[slot] = l;
    s.logical_slot[l] = static_cast<int32_t>(slot);
    s.slot_stamp[slot] = step;
    s.miss_logical[k] = l;
    s.copy_slot[k] = slot;
    s.copy_row[k] = p.mirror_rows[l];
  }
  *s.copy_count = static_cast<uint32_t>(m);
  // 6: translate.
  for (uint32_t i = 0; i < n; ++i) {
    const int32_t l = p.selected[i];
    p.translated[i] = (l < 0 || static_cast<uint32_t>(l) >= s.num_logical)
                          ? -1
                          : s.logical_slot[l];
  }
  return absl::OkStatus();
}

absl::Status CheckEnsureCopyParams(const EnsureCopyParams& p) {
  const EnsureCopyHeader& h = p.header;
  if (h.num_segments == 0 || h.num_segments > kMaxEnsureSegments) {
    return absl::InvalidArgumentError(
        absl::StrCat("ensure copy: num_segments ", h.num_segments,
                     " is not in [1, ", kMaxEnsureSegments, "]"));
  }
  if (h.max_ctas == 0 || h.max_ctas > kMaxCtasLimit) {
    return absl::InvalidArgumentError(
        absl::StrCat("ensure copy: max_ctas ", h.max_ctas, " is not in [1, ",
                     kMaxCtasLimit, "]"));
  }
  if (h.max_items == 0 || h.copy_slot == nullptr || h.copy_row == nullptr ||
      h.copy_count == nullptr) {
    return absl::InvalidArgumentError(
        "ensure copy: max_items, copy_slot, copy_row and copy_count must be "
        "set");
  }
  uint64_t chunks = 0;
  for (uint32_t s = 0; s < h.num_segments; ++s) {
    const PageCopySegment& seg = p.segments[s];
    if (seg.bytes == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("ensure copy: segments[", s, "].bytes is 0"));
    }
    if (seg.chunk_begin != chunks) {
      return absl::InvalidArgumentError(
          absl::StrCat("ensure copy: segments[", s, "].chunk_begin is ",
                       seg.chunk_begin, ", expected ", chunks));
    }
    chunks +=
        (static_cast<uint64_t>(seg.bytes) + kChunkBytes - 1) / kChunkBytes;
  }
  if (chunks != h.chunks_per_item) {
    return absl::InvalidArgumentError(
        absl::StrCat("ensure copy: chunks_per_item is ", h.chunks_per_item,
                     ", the segments add up to ", chunks));
  }
  return absl::OkStatus();
}

absl::Status RunEnsureCopyReference(const EnsureCopyParams& p) {
  if (absl::Status s = CheckEnsureCopyParams(p); !s.ok()) return s;
  const EnsureCopyHeader& h = p.header;
  const uint32_t count = std::min(*h.copy_count, h.max_items);
  for (uint32_t k = 0; k < count; ++k) {
    for (uint32_t c = 0; c < h.chunks_per_item; ++c) {
      const PageCopyChunk chunk = ResolveEnsureChunk(
          p.segments, h.num_segments, h.copy_slot[k], h.copy_row[k], c);
      std::memcpy(reinterpret_cast<void*>(chunk.dst),
                  reinterpret_cast<const void*>(chunk.src), chunk.bytes);
    }
  }
  return absl::OkStatus();
}

}  // namespace kvtier::kernels
