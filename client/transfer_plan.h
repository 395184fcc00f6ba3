// Transfer planning: validates an engine's GpuPoolDescriptor against the
// namespace's host banks once, turns it into the copy kernel's segment table,
// and cuts each transfer into slices of at most kMaxSlicePages pages, one
// kernel parameter block (kernels::PageCopyParams) per slice.
//
// The plan holds no GPU resources: the kernel reads and writes host rows
// directly over UVA and takes the slice's page ids, rows and the whole
// segment table by value as its parameter, so a transfer of any length needs
// no device memory beyond the launch's own parameter block (~31 KiB, managed
// by the driver).
//
// Thread-safety: a TransferPlan is immutable after Create; every const method
// may be called concurrently.

#ifndef KVTIER_CLIENT_TRANSFER_PLAN_H_
#define KVTIER_CLIENT_TRANSFER_PLAN_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/page_copy.h"
#include "kvtier/pool.h"

namespace kvtier::client {

// Most pages one kernel launch copies. A transfer of N pages takes
// ceil(N / kMaxSlicePages) launches.
inline constexpr uint32_t kMaxSlicePages = 128;
static_assert(kMaxSlicePages == kernels::kMaxCopyItems);
static_assert(kMaxPoolTensors == kernels::kMaxCopySegments);

// One mapped host bank as the copy sees it.
struct HostBankView {
  // Address of row 0: the device pointer of the registered mapping
  // (cudaHostGetDevicePointer; with UVA usually the host address) for the
  // CUDA backend, a plain host pointer for the reference backend.
  // 16-aligned, not null.
  uint64_t base = 0;
  uint64_t rows = 0;        // > 0
  uint64_t row_bytes = 0;   // bytes of one row's payload
  uint64_t row_stride = 0;  // bytes from row r to r + 1; multiple of 16,
                            // >= row_bytes
};

// A namespace's page bank: its name and its mapping.
using NamedHostBank = std::pair<std::string, HostBankView>;

struct TransferOptions {
  // Most CTAs one copy launch uses, in [1, kernels::kMaxCtasLimit]. The copy
  // is bound by the host link; a small grid leaves the engine its SMs.
  uint32_t max_ctas = kernels::kDefaultMaxCtas;
};

class TransferPlan {
 public:
  // Validates `pool` against the namespace's page banks (`page_banks`, in
  // namespace order) and its snapshot bank, and builds the segment tables.
  // Returns INVALID_ARGUMENT naming the field and index when:
  // - the banks differ from the namespace's in number, order or name, or a
  //   namespace bank name repeats;
  // - num_pages is 0; a bank lists no tensors; more than kMaxPoolTensors
  //   tensors (all banks together) or snapshot segments;
  // - a tensor's base is null, base or page_stride is not a multiple of 16,
  //   bytes_per_page is 0 or >= 4 GiB, its pages overlap one another
  //   (page_stride < bytes_per_page with more than one page), its address
  //   range overflows, or it overlaps another tensor or a host bank. Tensors
  //   with the same page_stride may interleave (K and V of one page side by
  //   side) as long as their bytes do not overlap; otherwise two tensors'
  //   address ranges must be disjoint;
  // - a bank's tensors do not add up to its row_bytes;
  // - a host bank's base is null or not 16-aligned, its row_stride is not a
  //   multiple of 16 or is below row_bytes, it has no rows, or the page banks
  //   differ in row count;
  // - snapshot segments without slots or without a snapshot bank, or a
  //   snapshot bank or slots without segments;
  // - options.max_ctas is out of range.
  static absl::StatusOr<TransferPlan> Create(
      const GpuPoolDescriptor& pool, absl::Span<const NamedHostBank> page_banks,
      std::optional<HostBankView> snapshot_bank,
      const TransferOptions& options = {});

  // Returns OK if gpu_pages[i] -> rows[i] (kToHost) or rows[i] ->
  // gpu_pages[i] (kFromHost) is a valid transfer: equal lengths, every page
  // < num_pages, every row < the banks' rows, and no destination (rows for
  // kToHost, gpu_pages for kFromHost) repeated. Otherwise INVALID_ARGUMENT
  // naming the field and index.
  absl::Status CheckPages(kernels::CopyDirection direction,
                          absl::Span<const uint32_t> gpu_pages,
                          absl::Span<const uint32_t> rows) const;

  // Returns OK if the plan has a snapshot, slot < num_snapshot_slots and
  // row < the snapshot bank's rows; FAILED_PRECONDITION if the descriptor has
  // no snapshot; INVALID_ARGUMENT otherwise.
  absl::Status CheckSnapshot(uint32_t slot, uint32_t row) const;

  // Number of launches a transfer of `num_pages` pages takes.
  static size_t NumSlices(size_t num_pages) {
    return (num_pages + kMaxSlicePages - 1) / kMaxSlicePages;
  }

  // Fills `*params` with slice `slice` of the transfer: pages
  // [slice * kMaxSlicePages, +kMaxSlicePages) of gpu_pages/rows.
  // REQUIRES: CheckPages(direction, gpu_pages, rows).ok(),
  // slice < NumSlices(gpu_pages.size()).
  void FillPageSlice(kernels::CopyDirection direction,
                     absl::Span<const uint32_t> gpu_pages,
                     absl::Span<const uint32_t> rows, size_t slice,
                     kernels::PageCopyParams* params) const;

  // Fills `*params` with the copy between snapshot slot `slot` and snapshot
  // row `row`. REQUIRES: CheckSnapshot(slot, row).ok().
  void FillSnapshot(kernels::CopyDirection direction, uint32_t slot,
                    uint32_t row, kernels::PageCopyParams* params) const;

  const GpuPoolDescriptor& pool() const { return pool_; }
  const std::vector<NamedHostBank>& page_banks() const { return page_banks_; }
  const std::optional<HostBankView>& snapshot_bank() const {
    return snapshot_bank_;
  }
  bool has_snapshot() const { return !pool_.snapshot.empty(); }
  // Rows of every page bank.
  uint64_t rows() const { return rows_; }

 private:
  TransferPlan() = default;

  // Immutable after Create.
  GpuPoolDescriptor pool_;
  std::vector<NamedHostBank> page_banks_;
  std::optional<HostBankView> snapshot_bank_;
  uint64_t rows_ = 0;
  uint32_t max_ctas_ = kernels::kDefaultMaxCtas;
  std::vector<kernels::PageCopySegment> page_segments_;
  uint32_t page_chunks_ = 0;  // chunks per page, over all segments
  std::vector<kernels::PageCopySegment> snapshot_segments_;
  uint32_t snapshot_chunks_ = 0;
};

}  // namespace kvtier::client

#endif  // KVTIER_CLIENT_TRANSFER_PLAN_H_
