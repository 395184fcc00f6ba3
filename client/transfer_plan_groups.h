// How a TransferPlan (client/transfer_plan.h) addresses host rows that hold
// several groups back to back: vLLM's hybrid models keep one state block per
// Mamba group at a page boundary (snapshot groups), and its sliding-window
// models one block of each attention group per page (page groups). A bank
// whose rows hold K such parts is seen as a bank of K times the rows, each a
// part: row r's part g is row r * K + g, so the kernels and the staged and
// copy-engine paths need no notion of groups.
//
// Thread-safety: a stateless function.
#ifndef KVTIER_CLIENT_TRANSFER_PLAN_GROUPS_H_
#define KVTIER_CLIENT_TRANSFER_PLAN_GROUPS_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "client/transfer_plan.h"

namespace kvtier::client {

// A bank (`view`) as the plan addresses it, and how many parts a row holds.
struct GroupedBank {
  uint32_t groups = 1;
  HostBankView view;
};

// The bank `bank` whose pool tensors give `part_bytes` a row: itself when
// that is its row_bytes, else the view of its parts when row_bytes is up to
// `max_groups` times part_bytes, the rows have no padding (row_stride ==
// row_bytes), part_bytes is a multiple of 16 and rows * groups < 2^32.
// INVALID_ARGUMENT naming `what` otherwise.
absl::StatusOr<GroupedBank> GroupRows(const std::string& what,
                                      const HostBankView& bank,
                                      uint64_t part_bytes, uint32_t max_groups);

}  // namespace kvtier::client

#endif  // KVTIER_CLIENT_TRANSFER_PLAN_GROUPS_H_
