// TransferPlan's per-transfer work (client/transfer_plan.h): checking a
// transfer's pages and rows (CheckPages) and cutting it into copy-kernel
// parameter blocks, for the direct path (FillPageSlice), snapshots
// (FillSnapshot) and the staged path's slices (StagedSlices,
// FillStagedSlice). The copy engine's lists are in transfer_plan_copies.cc.
//
// Thread-safety: see transfer_plan.h (immutable after Create; these are
// const).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "client/transfer_plan.h"
#include "kernels/page_copy.h"

namespace kvtier::client {
namespace {

using kernels::CopyDirection;
using kernels::PageCopyParams;
using kernels::PageCopySegment;

// Fills p's header (`items` items, `segments`, `chunks` chunks per item, at
// most `max_ctas` CTAs) and copies `segments` into it.
void FillHeader(CopyDirection direction, uint32_t items,
                absl::Span<const PageCopySegment> segments, uint32_t chunks,
                uint32_t max_ctas, PageCopyParams* p) {
  p->header.num_items = items;
  p->header.num_segments = static_cast<uint32_t>(segments.size());
  p->header.direction = direction;
  p->header.max_ctas = max_ctas;
  p->header.chunks_per_item = chunks;
  p->header.reserved = 0;
  std::copy(segments.begin(), segments.end(), p->segments);
}

// Returns INVALID_ARGUMENT if a value of `values` repeats.
absl::Status CheckDistinct(absl::string_view field,
                           absl::Span<const uint32_t> values) {
  std::vector<std::pair<uint32_t, uint32_t>> sorted;  // (value, index)
  sorted.reserve(values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    sorted.emplace_back(values[i], static_cast<uint32_t>(i));
  }
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 1; i < sorted.size(); ++i) {
    if (sorted[i].first == sorted[i - 1].first) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, "[", sorted[i].second, "] = ", sorted[i].first,
                       " repeats ", field, "[", sorted[i - 1].second,
                       "]: destinations of one transfer must be distinct"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status TransferPlan::CheckPages(CopyDirection direction,
                                      absl::Span<const uint32_t> gpu_pages,
                                      absl::Span<const uint32_t> rows) const {
  if (gpu_pages.size() != rows.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gpu_pages has ", gpu_pages.size(), " entries but rows has ",
        rows.size(), ": they must have the same length"));
  }
  for (size_t i = 0; i < gpu_pages.size(); ++i) {
    if (gpu_pages[i] >= pool_.num_pages) {
      return absl::InvalidArgumentError(absl::StrCat(
          "gpu_pages[", i, "] = ", gpu_pages[i],
          " is out of range: the pool has ", pool_.num_pages, " pages"));
    }
    if (rows[i] >= rows_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rows[", i, "] = ", rows[i], " is out of range: the page banks have ",
          rows_, " rows"));
    }
  }
  if (direction == CopyDirection::kToHost) {
    return CheckDistinct("rows", rows);
  }
  return CheckDistinct("gpu_pages", gpu_pages);
}

void TransferPlan::FillPageSlice(CopyDirection direction,
                                 absl::Span<const uint32_t> gpu_pages,
                                 absl::Span<const uint32_t> rows, size_t slice,
                                 PageCopyParams* params) const {
  const size_t begin = slice * kMaxSlicePages;
  const size_t n = std::min<size_t>(kMaxSlicePages, gpu_pages.size() - begin);
  FillHeader(direction, static_cast<uint32_t>(n), page_segments_, page_chunks_,
             max_ctas_, params);
  std::copy_n(gpu_pages.begin() + begin, n, params->gpu_index);
  std::copy_n(rows.begin() + begin, n, params->host_index);
}

void TransferPlan::FillSnapshot(CopyDirection direction,
                                absl::Span<const uint32_t> slots, uint32_t row,
                                PageCopyParams* params) const {
  const uint32_t groups = snapshot_groups_;
  FillHeader(direction, groups, snapshot_segments_, snapshot_chunks_, max_ctas_,
             params);
  for (uint32_t g = 0; g < groups; ++g) {
    params->gpu_index[g] = slots[g];
    params->host_index[g] = row * groups + g;  // < rows * groups: in range
  }
}

std::vector<uint32_t> TransferPlan::StagedSlices(CopyDirection direction,
                                                 size_t num_pages) const {
  const uint32_t full = staging_.slice_pages;
  std::vector<uint32_t> sizes;
  // Ramp: the first slice (options_.first_slice_bytes, else
  // kAutoFirstSliceBytes), then doubling up to a full buffer.
  const uint64_t first_bytes = options_.first_slice_bytes == 0
                                   ? kAutoFirstSliceBytes
                                   : options_.first_slice_bytes;
  const uint64_t first_pages =
      first_bytes / std::max<uint64_t>(1, staging_.page_bytes);
  uint32_t next = static_cast<uint32_t>(
      std::clamp<uint64_t>(first_pages, 1, std::max<uint32_t>(1, full)));
  for (size_t left = num_pages; left > 0;) {
    const uint32_t n = static_cast<uint32_t>(std::min<size_t>(next, left));
    sizes.push_back(n);
    left -= n;
    next = std::min(full, 2 * next);
  }
  if (direction == CopyDirection::kFromHost) {
    std::reverse(sizes.begin(), sizes.end());
  }
  return sizes;
}

void TransferPlan::FillStagedSlice(CopyDirection direction,
                                   absl::Span<const uint32_t> gpu_pages,
                                   size_t begin, size_t count,
                                   uint64_t staging_base,
                                   PageCopyParams* params, bool edge) const {
  const uint32_t ctas =
      edge ? std::max(options_.staging_ctas, options_.edge_slice_ctas)
           : options_.staging_ctas;
  FillHeader(direction, static_cast<uint32_t>(count), staged_segments_,
             page_chunks_, ctas, params);
  for (uint32_t k = 0; k < params->header.num_segments; ++k) {
    params->segments[k].host_base += staging_base;
  }
  std::copy_n(gpu_pages.begin() + begin, count, params->gpu_index);
  for (size_t i = 0; i < count; ++i) {
    params->host_index[i] = static_cast<uint32_t>(i);
  }
}

}  // namespace kvtier::client
