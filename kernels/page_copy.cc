// Host-side helpers of the page copy shared by the CUDA launcher and the
// reference implementation: parameter checks and grid sizing.
//
// Thread-safety: pure functions.

#include "kernels/page_copy.h"

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace kvtier::kernels {

absl::Status CheckPageCopyParams(const PageCopyParams& p) {
  const PageCopyHeader& h = p.header;
  if (h.num_items > kMaxCopyItems) {
    return absl::InvalidArgumentError(absl::StrCat(
        "page copy: num_items ", h.num_items, " exceeds ", kMaxCopyItems));
  }
  if (h.num_segments == 0 || h.num_segments > kMaxCopySegments) {
    return absl::InvalidArgumentError(
        absl::StrCat("page copy: num_segments ", h.num_segments,
                     " is not in [1, ", kMaxCopySegments, "]"));
  }
  if (h.direction != CopyDirection::kToHost &&
      h.direction != CopyDirection::kFromHost) {
    return absl::InvalidArgumentError(absl::StrCat(
        "page copy: bad direction ", static_cast<uint32_t>(h.direction)));
  }
  if (h.max_ctas == 0 || h.max_ctas > kMaxCtasLimit) {
    return absl::InvalidArgumentError(
        absl::StrCat("page copy: max_ctas ", h.max_ctas, " is not in [1, ",
                     kMaxCtasLimit, "]"));
  }
  uint64_t chunks = 0;
  for (uint32_t s = 0; s < h.num_segments; ++s) {
    const PageCopySegment& seg = p.segments[s];
    if (seg.bytes == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("page copy: segments[", s, "].bytes is 0"));
    }
    if (seg.chunk_begin != chunks) {
      return absl::InvalidArgumentError(
          absl::StrCat("page copy: segments[", s, "].chunk_begin is ",
                       seg.chunk_begin, ", expected ", chunks));
    }
    chunks +=
        (static_cast<uint64_t>(seg.bytes) + kChunkBytes - 1) / kChunkBytes;
  }
  if (chunks != h.chunks_per_item) {
    return absl::InvalidArgumentError(
        absl::StrCat("page copy: chunks_per_item is ", h.chunks_per_item,
                     ", the segments add up to ", chunks));
  }
  return absl::OkStatus();
}

uint32_t PageCopyGridSize(const PageCopyParams& p) {
  constexpr uint64_t kWarpsPerCta = kThreadsPerCta / 32;
  const uint64_t units =
      static_cast<uint64_t>(p.header.num_items) * p.header.chunks_per_item;
  uint64_t ctas = (units + kWarpsPerCta - 1) / kWarpsPerCta;
  if (ctas > p.header.max_ctas) ctas = p.header.max_ctas;
  if (ctas == 0) ctas = 1;
  return static_cast<uint32_t>(ctas);
}

}  // namespace kvtier::kernels
