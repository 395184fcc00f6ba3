// PrefixIndex (daemon/prefix_index.h): row allocation, which decides before
// it evicts (see AllocateRows there) and then evicts through
// prefix_index_evict.cc; freeing and claiming rows; ReserveNodes.
//
// Thread-safety: as the header says. The public functions here change the
// index and need exclusive access; the Pinned* / ProtectedPageRows counts
// only read.
#include <algorithm>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "daemon/prefix_index.h"
#include "daemon/row_pool.h"

namespace kvtier::daemon {
namespace {

// One bank's shortfall, for RESOURCE_EXHAUSTED.
std::string Shortfall(const char* bank, uint32_t rank, uint64_t need,
                      uint64_t free, uint64_t reclaimable,
                      uint64_t protected_rows, const char* protected_by,
                      uint64_t reserved) {
  return absl::StrCat(bank, " of rank ", rank, ": need ", need, ", ", free,
                      " free, ", reclaimable, " reclaimable by eviction, ",
                      protected_rows, " pinned (", protected_by, "), ",
                      reserved, " reserved (allocated uncommitted)");
}

}  // namespace

uint64_t PrefixIndex::PinnedPathBound() const {
  absl::MutexLock lock(&pin_mu_);
  uint64_t bound = 0;
  for (uint32_t id : pinned_) bound += uint64_t{N(id).depth} + 1;
  return bound;
}

uint64_t PrefixIndex::ProtectedPageRows(uint32_t rank) const {
  absl::MutexLock lock(&pin_mu_);
  if (pinned_.empty()) return 0;
  // Pins protect their ancestors only implicitly (an ancestor keeps a child
  // until the pinned node goes), so walk up; paths share prefixes, and a
  // node already seen has had its ancestors seen too.
  absl::flat_hash_set<uint32_t> seen;
  seen.reserve(pinned_.size() * 4);
  uint64_t rows = 0;
  for (uint32_t id : pinned_) {
    for (uint32_t a = id; a != kNoNode && seen.insert(a).second;
         a = N(a).parent) {
      if (PageRow(a, rank) != kNoRow) ++rows;
    }
  }
  return rows;
}

uint64_t PrefixIndex::PinnedSnapshotRows(uint32_t rank) const {
  if (!hybrid_) return 0;
  absl::MutexLock lock(&pin_mu_);
  uint64_t rows = 0;
  for (uint32_t id : pinned_) {
    if (SnapshotRow(id, rank) != kNoRow) ++rows;
  }
  return rows;
}

absl::StatusOr<PrefixIndex::AllocatedRows> PrefixIndex::AllocateRows(
    uint32_t rank, uint32_t pages, uint32_t snapshots) {
  if (absl::Status s = ValidateRank(rank); !s.ok()) return s;
  if (pages > pages_.rows_per_rank()) {
    return absl::InvalidArgumentError(
        absl::StrCat("pages: ", pages, " page rows exceed the bank's ",
                     pages_.rows_per_rank(), " rows per rank"));
  }
  if (snapshots > 0 && !hybrid_) {
    return absl::FailedPreconditionError(
        "snapshot rows: the namespace is not hybrid (snapshot_rows is 0)");
  }
  if (snapshots > snapshots_.rows_per_rank()) {
    return absl::InvalidArgumentError(
        absl::StrCat("snapshots: ", snapshots, " snapshot rows exceed the ",
                     "bank's ", snapshots_.rows_per_rank(), " rows per rank"));
  }

  // Decide, changing nothing. The banks are independent: leaf eviction
  // frees only snapshot rows that snapshot eviction could free too.
  std::string refused;
  const uint64_t free_pages = pages_.free_rows(rank);
  if (free_pages < pages) {
    const uint64_t need = pages - free_pages;
    const uint64_t committed = pages_.committed_rows(rank);
    // Cheap first: pins protect at most sum(depth + 1) nodes.
    const uint64_t bound = std::min(PinnedPathBound(), committed);
    if (committed - bound < need) {
      const uint64_t held = ProtectedPageRows(rank);
      if (committed - held < need) {
        refused =
            Shortfall("page rows", rank, pages, free_pages, committed - held,
                      held, "held by pinned nodes and their ancestors",
                      pages_.allocated_rows(rank));
      }
    }
  }
  const uint64_t free_snapshots =
      hybrid_ ? snapshots_.free_rows(rank) : uint64_t{0};
  if (free_snapshots < snapshots) {
    const uint64_t committed = snapshots_.committed_rows(rank);
    const uint64_t held = PinnedSnapshotRows(rank);
    if (free_snapshots + (committed - held) < snapshots) {
      absl::StrAppend(
          &refused, refused.empty() ? "" : "; ",
          Shortfall("snapshot rows", rank, snapshots, free_snapshots,
                    committed - held, held, "on pinned nodes",
                    snapshots_.allocated_rows(rank)));
    }
  }
  if (!refused.empty()) {
    return absl::ResourceExhaustedError(
        absl::StrCat(refused, "; nothing was evicted"));
  }

  // Feasible: evict as far as needed. Leaves first: they free snapshot rows
  // too, which may spare snapshot evictions.
  if (!EvictLeavesFor(rank, pages) ||
      (snapshots > 0 && !EvictSnapshotsFor(rank, snapshots))) {
    // The counts above are exact (or conservative) over what these loops
    // can evict; reaching here is a bug.
    return absl::InternalError(absl::StrCat(
        "rank ", rank, ": eviction freed fewer rows than computed (",
        pages_.free_rows(rank), " of ", pages, " page rows, ",
        hybrid_ ? snapshots_.free_rows(rank) : 0, " of ", snapshots,
        " snapshot rows)"));
  }
  AllocatedRows out;
  out.page_rows = pages_.Take(rank, pages);
  if (snapshots > 0) out.snapshot_rows = snapshots_.Take(rank, snapshots);
  return out;
}

absl::StatusOr<std::vector<uint32_t>> PrefixIndex::AllocatePageRows(
    uint32_t rank, uint32_t n) {
  auto rows = AllocateRows(rank, n, 0);
  if (!rows.ok()) return rows.status();
  return std::move(rows->page_rows);
}

absl::StatusOr<std::vector<uint32_t>> PrefixIndex::AllocateSnapshotRows(
    uint32_t rank, uint32_t n) {
  if (!hybrid_) {
    return absl::FailedPreconditionError(
        "snapshot rows: the namespace is not hybrid (snapshot_rows is 0)");
  }
  auto rows = AllocateRows(rank, 0, n);
  if (!rows.ok()) return rows.status();
  return std::move(rows->snapshot_rows);
}

// ------------------------------------------------------ free and claim --

absl::Status PrefixIndex::FreePageRows(uint32_t rank,
                                       absl::Span<const uint32_t> rows) {
  if (absl::Status s = ValidateRank(rank); !s.ok()) return s;
  return pages_.Free(rank, rows, "page");
}

absl::Status PrefixIndex::FreeSnapshotRows(uint32_t rank,
                                           absl::Span<const uint32_t> rows) {
  if (absl::Status s = ValidateRank(rank); !s.ok()) return s;
  return snapshots_.Free(rank, rows, "snapshot");
}

absl::Status PrefixIndex::ClaimPageRows(uint32_t rank,
                                        absl::Span<const uint32_t> rows) {
  if (absl::Status s = ValidateRank(rank); !s.ok()) return s;
  return pages_.Claim(rank, rows, "page");
}

absl::Status PrefixIndex::ClaimSnapshotRows(uint32_t rank,
                                            absl::Span<const uint32_t> rows) {
  if (rows.empty()) return absl::OkStatus();
  if (!hybrid_) {
    return absl::FailedPreconditionError(
        "snapshot rows: the namespace is not hybrid (snapshot_rows is 0)");
  }
  if (absl::Status s = ValidateRank(rank); !s.ok()) return s;
  return snapshots_.Claim(rank, rows, "snapshot");
}

void PrefixIndex::ReserveNodes(size_t nodes) { by_key_.reserve(nodes); }

}  // namespace kvtier::daemon
