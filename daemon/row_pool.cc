// RowPool (daemon/row_pool.h): row states, free runs and their checks.
//
// Thread-safety: as the header says; nothing here is shared between pools.
#include "daemon/row_pool.h"

#include <algorithm>
#include <iterator>
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
  free_.clear();
  free_.reserve(ranks);
  for (uint32_t r = 0; r < ranks; ++r) {
    free_.emplace_back(tree_bytes_.get());
    if (rows_per_rank > 0) {
      InsertRun(free_.back(), 0, static_cast<uint32_t>(rows_per_rank));
    }
  }
  allocated_.assign(ranks, 0);
  committed_.assign(ranks, 0);
}

void RowPool::InsertRun(FreeRuns& f, uint32_t start, uint32_t length) {
  f.by_start.emplace(start, length);
  f.by_length.emplace(length, start);
  f.rows += length;
}

void RowPool::EraseRun(FreeRuns& f, RunsByStart::iterator it) {
  f.by_length.erase(Run{it->second, it->first});
  f.rows -= it->second;
  f.by_start.erase(it);
}

void RowPool::AddFree(uint32_t rank, uint32_t row) {
  FreeRuns& f = free_[rank];
  const uint8_t* state = state_.data() + rank * rows_per_rank_;
  uint32_t start = row;
  uint32_t length = 1;
  // The states say whether a neighbour is free; only then look its run up.
  if (row + 1 < rows_per_rank_ && state[row + 1] == kFree) {
    auto next = f.by_start.find(row + 1);
    length += next->second;
    EraseRun(f, next);
  }
  if (row > 0 && state[row - 1] == kFree) {
    auto prev = std::prev(f.by_start.upper_bound(row - 1));
    start = prev->first;
    length += prev->second;
    EraseRun(f, prev);
  }
  InsertRun(f, start, length);
  state_[Slot(rank, row)] = kFree;
}

void RowPool::RemoveFree(uint32_t rank, uint32_t row) {
  FreeRuns& f = free_[rank];
  auto it = std::prev(f.by_start.upper_bound(row));
  const uint32_t start = it->first;
  const uint32_t end = it->first + it->second;
  EraseRun(f, it);
  if (row > start) InsertRun(f, start, row - start);
  if (row + 1 < end) InsertRun(f, row + 1, end - row - 1);
}

std::vector<uint32_t> RowPool::Take(uint32_t rank, uint32_t n) {
  FreeRuns& f = free_[rank];
  std::vector<uint32_t> out;
  out.reserve(n);
  while (out.size() < n) {
    const uint32_t want = n - static_cast<uint32_t>(out.size());
    // The smallest run that holds the rest, lowest first; else the longest.
    auto fit = f.by_length.lower_bound(Run{want, 0});
    if (fit == f.by_length.end()) {
      fit = f.by_length.lower_bound(Run{std::prev(fit)->first, 0});
    }
    const auto [length, start] = *fit;
    const uint32_t take = std::min(length, want);
    EraseRun(f, f.by_start.find(start));
    if (take < length) InsertRun(f, start + take, length - take);
    for (uint32_t row = start; row < start + take; ++row) {
      state_[Slot(rank, row)] = kAllocated;
      out.push_back(row);
    }
  }
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
  // Marks as we go; a row already marked is listed twice. The marks are
  // undone either way: AddFree reads the neighbours' states.
  for (size_t i = 0; i < rows.size(); ++i) {
    if (state[rows[i]] == kFree) {
      for (size_t j = 0; j < i; ++j) state[rows[j]] = kAllocated;
      return absl::InvalidArgumentError(absl::StrCat(
          "rows[", i, "]: ", bank, " row ", rows[i], " is listed twice"));
    }
    state[rows[i]] = kFree;
  }
  for (uint32_t row : rows) state[row] = kAllocated;
  for (uint32_t row : rows) AddFree(rank, row);
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
  for (uint32_t row : rows) RemoveFree(rank, row);
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
  for (uint32_t r = 0; r < ranks; ++r) {
    const FreeRuns& f = free_[r];
    uint64_t run_rows = 0;
    uint64_t prev_end = 0;
    bool first = true;
    for (const auto& [start, length] : f.by_start) {
      const uint64_t end = uint64_t{start} + length;
      if (length == 0 || end > rows_per_rank_ ||
          (!first && start <= prev_end)) {
        return fail(bank, " free runs of rank ", r, ": run of ", length,
                    " rows at row ", start,
                    " is empty, out of range, or overlaps or touches the "
                    "run before it");
      }
      for (uint64_t row = start; row < end; ++row) {
        if (state_[Slot(r, static_cast<uint32_t>(row))] != kFree) {
          return fail(bank, " free runs of rank ", r, ": row ", row, " is ",
                      StateName(state_[Slot(r, static_cast<uint32_t>(row))]));
        }
      }
      if (!f.by_length.contains(Run{length, start})) {
        return fail(bank, " free runs of rank ", r, ": run of ", length,
                    " rows at row ", start,
                    " is missing from the length index");
      }
      run_rows += length;
      prev_end = end;
      first = false;
    }
    if (f.by_length.size() != f.by_start.size() || run_rows != f.rows) {
      return fail(bank, " free runs of rank ", r, ": ", f.by_start.size(),
                  " runs of ", run_rows, " rows, ", f.by_length.size(),
                  " indexed by length, ", f.rows, " recorded");
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
    if (count[0] != free_[r].rows || count[1] != allocated_[r] ||
        count[2] != committed_[r]) {
      return fail(bank, " rows of rank ", r, ": ", count[0], "/", count[1], "/",
                  count[2], " free/allocated/committed, recorded ",
                  free_[r].rows, "/", allocated_[r], "/", committed_[r]);
    }
  }
  return absl::OkStatus();
}

size_t RowPool::MemoryBytes() const {
  return state_.capacity() + *tree_bytes_ +
         free_.capacity() * sizeof(FreeRuns) +
         (allocated_.capacity() + committed_.capacity()) * sizeof(uint64_t);
}

}  // namespace kvtier::daemon
