// TransferPlan's copy-engine copy lists (client/transfer_plan.h): a staged
// slice's rows (StagedCopies), the copy-engine path's runs (PageRuns), the
// copy-engine share's 2D copies (PageCopies2D) and a snapshot's segments
// (SnapshotCopies).
//
// Thread-safety: see transfer_plan.h (immutable after Create; these are
// const).
#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "client/transfer_plan.h"
#include "kernels/page_copy.h"

namespace kvtier::client {

using kernels::PageCopySegment;

void TransferPlan::StagedCopies(absl::Span<const uint32_t> rows,
                                uint64_t staging_base,
                                std::vector<EngineCopy>* copies) const {
  for (size_t j = 0; j < page_banks_.size(); ++j) {
    const HostBankView& bank = page_banks_[j].second;
    const uint64_t region = staging_base + staging_.region[j];
    const bool packed = bank.row_stride == bank.row_bytes;
    for (size_t i = 0; i < rows.size();) {
      size_t run = 1;
      while (packed && i + run < rows.size() &&
             rows[i + run] == rows[i] + run) {
        ++run;
      }
      copies->push_back(EngineCopy{
          region + i * bank.row_stride,
          bank.base + static_cast<uint64_t>(rows[i]) * bank.row_stride,
          (run - 1) * bank.row_stride + bank.row_bytes});
      i += run;
    }
  }
}

void TransferPlan::PageRuns(absl::Span<const uint32_t> gpu_pages,
                            absl::Span<const uint32_t> rows,
                            std::vector<EngineCopy>* copies) const {
  const size_t first = copies->size();
  for (size_t i = 0; i < gpu_pages.size(); ++i) {
    for (const PageCopySegment& s : page_segments_) {
      const uint64_t device = s.gpu_base + gpu_pages[i] * s.gpu_stride;
      const uint64_t host = s.host_base + uint64_t{rows[i]} * s.host_stride;
      if (copies->size() > first) {
        EngineCopy& last = copies->back();
        if (last.device + last.bytes == device &&
            last.host + last.bytes == host) {
          last.bytes += s.bytes;
          continue;
        }
      }
      copies->push_back(EngineCopy{device, host, s.bytes});
    }
  }
}

void TransferPlan::BuildStrided() {
  // cudaMemcpy2DAsync's pitches must stay below the device's memPitch
  // (2^31 - 1 on current GPUs).
  constexpr uint64_t kMaxPitch = (uint64_t{1} << 31) - 1;
  strided_.clear();
  for (size_t k = 0; k < page_segments_.size();) {
    const PageCopySegment& first = page_segments_[k];
    size_t end = k + 1;
    uint64_t pitch = 0;
    for (; end < page_segments_.size(); ++end) {
      const PageCopySegment& prev = page_segments_[end - 1];
      const PageCopySegment& next = page_segments_[end];
      if (next.bytes != first.bytes || next.gpu_stride != first.gpu_stride ||
          next.host_stride != first.host_stride ||
          next.host_base != prev.host_base + prev.bytes ||
          next.gpu_base < prev.gpu_base + prev.bytes) {
        break;
      }
      const uint64_t step = next.gpu_base - prev.gpu_base;
      if ((pitch != 0 && step != pitch) || step > kMaxPitch) break;
      pitch = step;
    }
    strided_.push_back(Strided{k, end - k, pitch == 0 ? first.bytes : pitch});
    k = end;
  }
}

void TransferPlan::PageCopies2D(absl::Span<const uint32_t> gpu_pages,
                                absl::Span<const uint32_t> rows,
                                std::vector<EngineCopy2D>* copies) const {
  for (size_t i = 0; i < gpu_pages.size(); ++i) {
    for (const Strided& g : strided_) {
      const PageCopySegment& s = page_segments_[g.first];
      copies->push_back(
          EngineCopy2D{s.gpu_base + gpu_pages[i] * s.gpu_stride,
                       s.host_base + uint64_t{rows[i]} * s.host_stride, s.bytes,
                       g.lines, g.pitch, s.bytes});
    }
  }
}

void TransferPlan::SnapshotCopies(absl::Span<const uint32_t> slots,
                                  uint32_t row,
                                  std::vector<EngineCopy>* copies) const {
  for (uint32_t g = 0; g < snapshot_groups_; ++g) {
    const size_t first = copies->size();
    const uint64_t sub_row = uint64_t{row} * snapshot_groups_ + g;
    for (const PageCopySegment& s : snapshot_segments_) {
      const uint64_t device = s.gpu_base + slots[g] * s.gpu_stride;
      const uint64_t host = s.host_base + sub_row * s.host_stride;
      if (copies->size() > first) {
        EngineCopy& last = copies->back();
        // Host bytes of consecutive segments are always adjacent in the row.
        if (last.device + last.bytes == device) {
          last.bytes += s.bytes;
          continue;
        }
      }
      copies->push_back(EngineCopy{device, host, s.bytes});
    }
  }
}

}  // namespace kvtier::client
