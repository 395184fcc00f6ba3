// PrefixIndex (daemon/prefix_index.h): Commit, which validates a whole
// commit (rows, chain, snapshot placements) before it changes anything, then
// links the new nodes, deduplicates what the index already holds and places
// the snapshots.
//
// Thread-safety: as the header says; Commit needs exclusive access.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "daemon/prefix_index.h"
#include "daemon/row_pool.h"

namespace kvtier::daemon {

absl::StatusOr<PrefixIndex::CommitResult> PrefixIndex::Commit(
    uint32_t rank, const HashKey* parent, absl::Span<const HashKey> hashes,
    absl::Span<const uint32_t> rows,
    absl::Span<const SnapshotPlacement> snapshots) {
  // Validation: nothing changes until every check passed.
  if (absl::Status s = ValidateRank(rank); !s.ok()) return s;
  if (rows.size() != hashes.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rows: ", rows.size(), " rows for ", hashes.size(), " hashes"));
  }
  if (hashes.size() >= kNoNode) {
    return absl::InvalidArgumentError(
        absl::StrCat("hashes: ", hashes.size(), " is too many"));
  }
  if (!snapshots.empty() && !hybrid_) {
    return absl::InvalidArgumentError(
        "snapshots: the namespace is not hybrid (snapshot_rows is 0)");
  }
  uint32_t parent_id = kNoNode;
  if (parent != nullptr) {
    parent_id = FindNode(*parent);
    if (parent_id == kNoNode) {
      return absl::FailedPreconditionError(
          "parent: the parent hash is not in the index (evicted or never "
          "committed)");
    }
    if (PageRow(parent_id, rank) == kNoRow) {
      return absl::FailedPreconditionError(absl::StrCat(
          "parent: the parent hash has no page row of rank ", rank));
    }
  }
  absl::flat_hash_set<uint32_t> seen_rows;
  seen_rows.reserve(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rows[i] >= pages_.rows_per_rank()) {
      return absl::InvalidArgumentError(
          absl::StrCat("rows[", i, "]: page row ", rows[i],
                       " is out of range (", pages_.rows_per_rank(), " rows)"));
    }
    if (const uint8_t state = pages_.state(rank, rows[i]);
        state != RowPool::kAllocated) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rows[", i, "]: page row ", rows[i], " of rank ", rank, " is ",
          RowPool::StateName(state), ", not allocated-uncommitted"));
    }
    if (!seen_rows.insert(rows[i]).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("rows[", i, "]: page row ", rows[i], " listed twice"));
    }
  }
  // Index in `hashes` by key; existing node (or kNoNode) per hash.
  absl::flat_hash_map<absl::string_view, uint32_t> position;
  position.reserve(hashes.size());
  std::vector<uint32_t> nodes(hashes.size(), kNoNode);
  uint32_t expected = parent_id;
  bool below_new = false;  // A new node's children are new too.
  for (size_t i = 0; i < hashes.size(); ++i) {
    auto [it, inserted] =
        position.try_emplace(KeyBytes(hashes[i]), static_cast<uint32_t>(i));
    if (!inserted) {
      return absl::InvalidArgumentError(
          absl::StrCat("hashes[", i, "]: repeats hashes[", it->second, "]"));
    }
    const uint32_t id = FindNode(hashes[i]);
    if (id == kNoNode) {
      below_new = true;
      continue;
    }
    if (below_new || N(id).parent != expected) {
      return absl::FailedPreconditionError(
          absl::StrCat("hashes[", i,
                       "]: already in the index under a different parent "
                       "(inconsistent chain)"));
    }
    nodes[i] = id;
    expected = id;
  }
  // Snapshot targets: an index into `hashes`, or an existing node.
  constexpr uint32_t kInCommit = 0x80000000;
  std::vector<uint32_t> targets(snapshots.size());
  absl::flat_hash_set<uint32_t> seen_snap_rows;
  absl::flat_hash_set<absl::string_view> seen_snap_hashes;
  for (size_t j = 0; j < snapshots.size(); ++j) {
    const SnapshotPlacement& p = snapshots[j];
    if (p.row >= snapshots_.rows_per_rank()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "snapshots[", j, "].row: snapshot row ", p.row, " is out of range (",
          snapshots_.rows_per_rank(), " rows)"));
    }
    if (const uint8_t state = snapshots_.state(rank, p.row);
        state != RowPool::kAllocated) {
      return absl::InvalidArgumentError(absl::StrCat(
          "snapshots[", j, "].row: snapshot row ", p.row, " of rank ", rank,
          " is ", RowPool::StateName(state), ", not allocated-uncommitted"));
    }
    if (!seen_snap_rows.insert(p.row).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "snapshots[", j, "].row: snapshot row ", p.row, " listed twice"));
    }
    if (!seen_snap_hashes.insert(KeyBytes(p.hash)).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("snapshots[", j, "].hash: placed twice"));
    }
    if (auto it = position.find(KeyBytes(p.hash)); it != position.end()) {
      targets[j] = kInCommit | it->second;
      continue;
    }
    const uint32_t id = FindNode(p.hash);
    if (id == kNoNode || PageRow(id, rank) == kNoRow) {
      return absl::FailedPreconditionError(
          absl::StrCat("snapshots[", j,
                       "].hash: neither among hashes nor in the index "
                       "with a page row of rank ",
                       rank));
    }
    targets[j] = id;
  }

  // Apply.
  Tick();
  CommitResult result;
  uint32_t prev = parent_id;
  for (size_t i = 0; i < hashes.size(); ++i) {
    uint32_t id = nodes[i];
    if (id == kNoNode) {
      pages_.CommitRow(rank, rows[i]);
      id = NewNode(hashes[i], prev, rank, rows[i]);
      ++result.committed_pages;
      if (Complete(N(id))) result.completed.push_back(static_cast<uint32_t>(i));
    } else if (PageRow(id, rank) != kNoRow) {
      pages_.ReturnAllocated(rank, rows[i]);
      result.freed_page_rows.push_back(rows[i]);
      ++result.deduplicated_pages;
    } else {
      pages_.CommitRow(rank, rows[i]);
      PageRow(id, rank) = rows[i];
      ++N(id).page_ranks;
      ++result.committed_pages;
      if (Complete(N(id))) result.completed.push_back(static_cast<uint32_t>(i));
    }
    nodes[i] = id;
    prev = id;
  }
  if (!nodes.empty()) SetRecency(nodes.back(), tick_, now_ms_);
  for (size_t j = 0; j < snapshots.size(); ++j) {
    const uint32_t row = snapshots[j].row;
    const uint32_t id = (targets[j] & kInCommit) != 0
                            ? nodes[targets[j] & ~kInCommit]
                            : targets[j];
    if (SnapshotRow(id, rank) != kNoRow) {
      snapshots_.ReturnAllocated(rank, row);
      result.freed_snapshot_rows.push_back(row);
      ++result.deduplicated_snapshots;
      continue;
    }
    snapshots_.CommitRow(rank, row);
    SnapshotRow(id, rank) = row;
    Node& n = N(id);
    if (n.snapshot_ranks++ == 0) {
      ++snapshot_nodes_;
      if (InSnapshotSet(n)) snapshot_lru_.insert({n.tick, id});
    }
    ++result.committed_snapshots;
  }
  return result;
}

}  // namespace kvtier::daemon
