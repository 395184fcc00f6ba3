// GroupRows (client/transfer_plan_groups.h) and TransferPlan::CheckSnapshot,
// which checks one slot per snapshot group.
//
// Thread-safety: as the headers say.
#include "client/transfer_plan_groups.h"

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "client/transfer_plan.h"

namespace kvtier::client {

absl::StatusOr<GroupedBank> GroupRows(const std::string& what,
                                      const HostBankView& bank,
                                      uint64_t part_bytes,
                                      uint32_t max_groups) {
  if (part_bytes == 0 || bank.row_bytes % part_bytes != 0 ||
      bank.row_bytes / part_bytes > max_groups) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": the tensors' bytes_per_page add up to ", part_bytes,
        " bytes, the bank's row_bytes is ", bank.row_bytes,
        max_groups > 1 ? absl::StrCat(" (nor up to ", max_groups,
                                      " times that: a row of groups)")
                       : ""));
  }
  GroupedBank g{static_cast<uint32_t>(bank.row_bytes / part_bytes), bank};
  if (g.groups == 1) return g;
  if (bank.row_stride != bank.row_bytes || part_bytes % 16 != 0 ||
      bank.rows * g.groups > uint64_t{UINT32_MAX}) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": a row of ", g.groups, " groups of ", part_bytes,
                     " bytes needs 16-byte multiples back to back (row_stride ",
                     bank.row_stride, ", row_bytes ", bank.row_bytes,
                     ") and fewer than 2^32 groups in the bank"));
  }
  g.view.rows *= g.groups;
  g.view.row_bytes = part_bytes;
  g.view.row_stride = part_bytes;
  return g;
}

absl::Status TransferPlan::CheckSnapshot(absl::Span<const uint32_t> slots,
                                         uint32_t row) const {
  if (!has_snapshot()) {
    return absl::FailedPreconditionError(
        "the pool descriptor has no snapshot segments");
  }
  if (slots.size() != snapshot_groups_) {
    return absl::InvalidArgumentError(
        absl::StrCat("a snapshot row holds ", snapshot_groups_,
                     " group(s)' slots; ", slots.size(), " slot(s) given"));
  }
  for (size_t g = 0; g < slots.size(); ++g) {
    if (slots[g] >= pool_.num_snapshot_slots) {
      return absl::InvalidArgumentError(absl::StrCat(
          "slot ", slots[g],
          snapshot_groups_ > 1 ? absl::StrCat(" (group ", g, ")") : "",
          " is out of range: the pool has ", pool_.num_snapshot_slots,
          " snapshot slots"));
    }
  }
  if (row >= snapshot_bank_->rows) {
    return absl::InvalidArgumentError(
        absl::StrCat("row ", row, " is out of range: the snapshot bank has ",
                     snapshot_bank_->rows, " rows"));
  }
  return absl::OkStatus();
}

}  // namespace kvtier::client
