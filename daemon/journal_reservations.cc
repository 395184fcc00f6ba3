// ReservationTracker: matching the replay's commits to their reservations
// (journal_reservations.h). Thread-safety: see there.
#include "daemon/journal_reservations.h"

#include <algorithm>
#include <utility>

#include "daemon/prefix_index.h"

namespace kvtier::daemon::journal_internal {

ReservationTracker::ReservationTracker(uint32_t ranks)
    : ranks_(ranks), page_holder_(ranks), snapshot_holder_(ranks) {}

void ReservationTracker::Reserve(uint32_t rank,
                                 absl::Span<const uint32_t> pages,
                                 absl::Span<const uint32_t> snapshots,
                                 bool merged) {
  // A checkpoint's rows of one rank may take several records in a row: one
  // merged reservation.
  const bool extend = merged && !reservations_.empty() &&
                      reservations_.back().merged &&
                      reservations_.back().rank == rank;
  if (!extend) {
    reservations_.emplace_back();
    reservations_.back().rank = rank;
    reservations_.back().merged = merged;
  }
  const uint32_t id = static_cast<uint32_t>(reservations_.size() - 1);
  const bool was_holding = reservations_[id].held > 0;
  // A row handed out again was freed (an abort, an expiry, or a commit not
  // matched): that reservation is over, though its other rows, which an
  // engine may still write, stay outstanding.
  auto take = [&](absl::flat_hash_map<uint32_t, uint32_t>& holder,
                  uint32_t row) {
    auto [it, inserted] = holder.try_emplace(row, id);
    if (!inserted) {
      if (it->second == id) return;  // Listed twice.
      const uint32_t old = it->second;
      Close(old);
      Reservation& o = reservations_[old];
      if (--o.held == 0) {
        if (o.merged) --ranks_[o.rank].merged_holding;
        o.pages = {};
        o.snapshots = {};
      }
      it->second = id;
    }
    ++reservations_[id].held;
  };
  for (uint32_t row : pages) take(page_holder_[rank], row);
  for (uint32_t row : snapshots) take(snapshot_holder_[rank], row);
  Reservation& r = reservations_[id];
  r.pages.insert(r.pages.end(), pages.begin(), pages.end());
  r.snapshots.insert(r.snapshots.end(), snapshots.begin(), snapshots.end());
  if (r.held == 0) {
    r.open = false;
    r.pages = {};
    r.snapshots = {};
  } else if (merged) {
    if (!was_holding) ++ranks_[rank].merged_holding;
  } else {
    ranks_[rank].open_by_size[r.pages.size()].insert(id);
  }
}

void ReservationTracker::Close(uint32_t id) {
  Reservation& r = reservations_[id];
  if (!r.open) return;
  r.open = false;
  if (r.merged) return;
  auto& by_size = ranks_[r.rank].open_by_size;
  auto it = by_size.find(r.pages.size());
  if (it == by_size.end()) return;
  it->second.erase(id);
  if (it->second.empty()) by_size.erase(it);
}

void ReservationTracker::Release(uint32_t rank, uint32_t row, bool snapshot,
                                 uint32_t id) {
  auto& holder = snapshot ? snapshot_holder_[rank] : page_holder_[rank];
  auto it = holder.find(row);
  if (it == holder.end() || (id != kNoNode && it->second != id)) return;
  const uint32_t owner = it->second;
  holder.erase(it);
  Reservation& r = reservations_[owner];
  // A row made visible or freed by a commit: its reservation is over.
  Close(owner);
  if (--r.held == 0) {
    if (r.merged) --ranks_[rank].merged_holding;
    r.pages = {};
    r.snapshots = {};
  }
}

void ReservationTracker::Consume(uint32_t id, bool all_snapshots,
                                 absl::Span<const uint32_t> snapshot_rows) {
  const Reservation& r = reservations_[id];
  const uint32_t rank = r.rank;
  // Copies: releasing the last row clears the reservation's vectors.
  const std::vector<uint32_t> pages = r.pages;
  const std::vector<uint32_t> snaps =
      all_snapshots
          ? r.snapshots
          : std::vector<uint32_t>(snapshot_rows.begin(), snapshot_rows.end());
  Close(id);
  for (uint32_t row : pages) Release(rank, row, false, id);
  for (uint32_t row : snaps) {
    if (row != kNoRow) Release(rank, row, true, id);
  }
}

void ReservationTracker::Commit(uint32_t rank,
                                absl::Span<const uint32_t> page_rows,
                                absl::Span<const uint32_t> snapshot_rows) {
  // The reservation holding a row the commit names.
  uint32_t id = kNoNode;
  for (uint32_t row : page_rows) {
    if (row == kNoRow) continue;
    if (auto it = page_holder_[rank].find(row);
        it != page_holder_[rank].end()) {
      id = it->second;
    }
    break;
  }
  bool named = false;  // The commit names some row.
  for (uint32_t row : page_rows) named = named || row != kNoRow;
  for (uint32_t row : snapshot_rows) {
    if (row == kNoRow) continue;
    if (!named && id == kNoNode) {
      if (auto it = snapshot_holder_[rank].find(row);
          it != snapshot_holder_[rank].end()) {
        id = it->second;
      }
    }
    named = true;
  }
  if (!named) {
    // Everything deduplicated: match by size, when that is unambiguous.
    if (page_rows.empty() && snapshot_rows.empty()) return;
    const Rank& r = ranks_[rank];
    if (r.merged_holding > 0) return;
    auto it = r.open_by_size.find(page_rows.size());
    if (it == r.open_by_size.end() || it->second.size() != 1) return;
    const uint32_t only = *it->second.begin();
    if (reservations_[only].snapshots.size() < snapshot_rows.size()) return;
    Consume(only, /*all_snapshots=*/true, {});
    return;
  }
  bool match = id != kNoNode && reservations_[id].open &&
               reservations_[id].pages.size() == page_rows.size();
  if (match) {
    const Reservation& r = reservations_[id];
    for (size_t i = 0; match && i < page_rows.size(); ++i) {
      if (page_rows[i] == kNoRow) continue;
      if (r.merged) {
        auto it = page_holder_[rank].find(page_rows[i]);
        match = it != page_holder_[rank].end() && it->second == id;
      } else {
        match = r.pages[i] == page_rows[i];
      }
    }
    for (size_t i = 0; match && i < snapshot_rows.size(); ++i) {
      if (snapshot_rows[i] == kNoRow) continue;
      auto it = snapshot_holder_[rank].find(snapshot_rows[i]);
      match = it != snapshot_holder_[rank].end() && it->second == id;
    }
  }
  if (match) {
    Consume(id, /*all_snapshots=*/!reservations_[id].merged, snapshot_rows);
    return;
  }
  // Not a reservation the records explain: only the rows it names are
  // known to be done with.
  for (uint32_t row : page_rows) {
    if (row != kNoRow) Release(rank, row, false, kNoNode);
  }
  for (uint32_t row : snapshot_rows) {
    if (row != kNoRow) Release(rank, row, true, kNoNode);
  }
}

void ReservationTracker::Released(uint32_t rank,
                                  absl::Span<const uint32_t> pages,
                                  absl::Span<const uint32_t> snapshots) {
  for (uint32_t row : pages) Release(rank, row, false, kNoNode);
  for (uint32_t row : snapshots) Release(rank, row, true, kNoNode);
}

void ReservationTracker::Export(
    std::vector<std::vector<uint32_t>>* pages,
    std::vector<std::vector<uint32_t>>* snapshots) const {
  auto sorted = [](const absl::flat_hash_map<uint32_t, uint32_t>& holder) {
    std::vector<uint32_t> rows;
    rows.reserve(holder.size());
    for (const auto& [row, id] : holder) rows.push_back(row);
    std::sort(rows.begin(), rows.end());
    return rows;
  };
  pages->clear();
  snapshots->clear();
  for (size_t r = 0; r < page_holder_.size(); ++r) {
    pages->push_back(sorted(page_holder_[r]));
    snapshots->push_back(sorted(snapshot_holder_[r]));
  }
}

}  // namespace kvtier::daemon::journal_internal
