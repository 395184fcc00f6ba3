// TransferPlan's copy-engine copy lists (client/transfer_plan.h): a staged
// slice's rows (StagedCopies), the copy-engine path's runs (PageRuns) and a
// snapshot's segments (SnapshotCopies).
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

void TransferPlan::SnapshotCopies(uint32_t slot, uint32_t row,
                                  std::vector<EngineCopy>* copies) const {
  const size_t first = copies->size();
  for (const PageCopySegment& s : snapshot_segments_) {
    const uint64_t device = s.gpu_base + slot * s.gpu_stride;
    const uint64_t host = s.host_base + row * s.host_stride;
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

}  // namespace kvtier::client
