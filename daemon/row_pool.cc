// RowPool (daemon/row_pool.h): row states, free stacks and their checks.
//
// Thread-safety: as the header says; nothing here is shared between pools.
#include "daemon/row_pool.h"

#include <algorithm>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace kvtier::daemon {

const char* RowPool::StateName(uint8_t state) {
  switch (state) {
    case kFree:
      return "free";
    case kAllocated:
      return "allocated-uncommitted";
    case kCommitted:
      return "committed";
    default:
      return "corrupt";
  }
}

void RowPool::Reset(uint32_t ranks, uint64_t rows_per_rank) {
  rows_per_rank_ = rows_per_rank;
  state_.assign(rows_per_rank * ranks, kFree);
  state_.shrink_to_fit();
  free_.assign(ranks, {});
  for (auto& stack : free_) {
    stack.resize(rows_per_rank);
    // Row 0 on top: allocation starts at the low rows.
    for (uint64_t i = 0; i < rows_per_rank; ++i) {
      stack[i] = static_cast<uint32_t>(rows_per_rank - 1 - i);
    }
  }
  allocated_.assign(ranks, 0);
  committed_.assign(ranks, 0);
}

std::vector<uint32_t> RowPool::Take(uint32_t rank, uint32_t n) {
  std::vector<uint32_t>& stack = free_[rank];
  std::vector<uint32_t> out(stack.end() - n, stack.end());
  std::reverse(out.begin(), out.end());
  stack.resize(stack.size() - n);
  for (uint32_t row : out) state_[Slot(rank, row)] = kAllocated;
  allocated_[rank] += n;
  return out;
}

absl::Status RowPool::Free(uint32_t rank, absl::Span<const uint32_t> rows,
                           const char* bank) {
  uint8_t* state = state_.data() + rank * rows_per_rank_;
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rows[i] >= rows_per_rank_) {
      return absl::InvalidArgumentError(
          absl::StrCat("rows[", i, "]: ", bank, " row ", rows[i],
                       " is out of range (", rows_per_rank_, " rows)"));
    }
    if (state[rows[i]] != kAllocated) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rows[", i, "]: ", bank, " row ", rows[i], " of rank ", rank, " is ",
          StateName(state[rows[i]]), ", not allocated-uncommitted"));
    }
  }
  // Marks as we go; a row already marked is listed twice.
  for (size_t i = 0; i < rows.size(); ++i) {
    if (state[rows[i]] == kFree) {
      for (size_t j = 0; j < i; ++j) state[rows[j]] = kAllocated;
      return absl::InvalidArgumentError(absl::StrCat(
          "rows[", i, "]: ", bank, " row ", rows[i], " is listed twice"));
    }
    state[rows[i]] = kFree;
  }
  free_[rank].insert(free_[rank].end(), rows.begin(), rows.end());
  allocated_[rank] -= rows.size();
  return absl::OkStatus();
}

absl::Status RowPool::Claim(uint32_t rank, absl::Span<const uint32_t> rows,
                            const char* bank) {
  uint8_t* state = state_.data() + rank * rows_per_rank_;
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rows[i] >= rows_per_rank_) {
      return absl::InvalidArgumentError(
          absl::StrCat("rows[", i, "]: ", bank, " row ", rows[i],
                       " is out of range (", rows_per_rank_, " rows)"));
    }
    if (state[rows[i]] != kFree) {
      return absl::InvalidArgumentError(
          absl::StrCat("rows[", i, "]: ", bank, " row ", rows[i], " of rank ",
                       rank, " is ", StateName(state[rows[i]]), ", not free"));
    }
  }
  // Marks as we go; a row already marked is listed twice.
  for (size_t i = 0; i < rows.size(); ++i) {
    if (state[rows[i]] == kAllocated) {
      for (size_t j = 0; j < i; ++j) state[rows[j]] = kFree;
      return absl::InvalidArgumentError(absl::StrCat(
          "rows[", i, "]: ", bank, " row ", rows[i], " is listed twice"));
    }
    state[rows[i]] = kAllocated;
  }
  // One pass over the free stack drops every claimed row, keeping the order.
  std::vector<uint32_t>& stack = free_[rank];
  stack.erase(
      std::remove_if(stack.begin(), stack.end(),
                     [state](uint32_t row) { return state[row] != kFree; }),
      stack.end());
  allocated_[rank] += rows.size();
  return absl::OkStatus();
}

std::vector<uint32_t> RowPool::RowsInState(uint32_t rank, State wanted) const {
  std::vector<uint32_t> out;
  const uint64_t begin = uint64_t{rank} * rows_per_rank_;
  if (rows_per_rank_ == 0 || begin + rows_per_rank_ > state_.size()) {
    return out;
  }
  for (uint64_t r = 0; r < rows_per_rank_; ++r) {
    if (state_[begin + r] == wanted) out.push_back(static_cast<uint32_t>(r));
  }
  return out;
}

absl::Status RowPool::Check(absl::Span<const uint32_t> holder,
                            const char* bank) const {
  auto fail = [](auto&&... parts) {
    return absl::InternalError(absl::StrCat(parts...));
  };
  const uint32_t ranks = static_cast<uint32_t>(free_.size());
  std::vector<bool> on_stack(rows_per_rank_);
  for (uint32_t r = 0; r < ranks; ++r) {
    std::fill(on_stack.begin(), on_stack.end(), false);
    for (uint32_t row : free_[r]) {
      if (row >= rows_per_rank_ || on_stack[row] ||
          state_[Slot(r, row)] != kFree) {
        return fail(bank, " free list of rank ", r, ": row ", row,
                    " is out of range, repeated or not free");
      }
      on_stack[row] = true;
    }
    uint64_t count[3] = {0, 0, 0};
    for (uint64_t row = 0; row < rows_per_rank_; ++row) {
      const size_t k = r * rows_per_rank_ + row;
      const uint8_t s = state_[k];
      if (s > kCommitted) {
        return fail(bank, " row ", row, " of rank ", r, ": bad state ", s);
      }
      ++count[s];
      if ((s == kCommitted) != (holder[k] != kNoNode)) {
        return fail(
            bank, " row ", row, " of rank ", r, ": ", StateName(s), " but ",
            holder[k] == kNoNode ? "held by no node" : "held by a node");
      }
    }
    if (count[0] != free_[r].size() || count[1] != allocated_[r] ||
        count[2] != committed_[r]) {
      return fail(bank, " rows of rank ", r, ": ", count[0], "/", count[1], "/",
                  count[2], " free/allocated/committed, recorded ",
                  free_[r].size(), "/", allocated_[r], "/", committed_[r]);
    }
  }
  return absl::OkStatus();
}

size_t RowPool::MemoryBytes() const {
  size_t bytes = state_.capacity();
  for (const auto& stack : free_) bytes += stack.capacity() * sizeof(uint32_t);
  bytes += free_.capacity() * sizeof(free_[0]) +
           (allocated_.capacity() + committed_.capacity()) * sizeof(uint64_t);
  return bytes;
}

}  // namespace kvtier::daemon
