// PrefixIndex (daemon/prefix_index.h): Commit, which validates a whole
// commit (rows, chain, snapshot placements) before it changes anything, then
// links the new nodes, deduplicates what the index already holds and places
// the snapshots. Each of those is a step below; the checks fill a CommitPlan
// that the applying steps follow.
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
namespace {

// Marks a snapshot target that is an index into `hashes`, not a node id.
constexpr uint32_t kInCommit = 0x80000000;

}  // namespace

// What the checks learned, for the applying steps.
struct PrefixIndex::CommitPlan {
  uint32_t parent_id = kNoNode;
  // Index in `hashes` by key.
  absl::flat_hash_map<absl::string_view, uint32_t> position;
  // Per hash: its existing node, or kNoNode (LinkPages fills those in).
  std::vector<uint32_t> nodes;
  // Per placement: kInCommit | an index into `hashes`, or an existing node.
  std::vector<uint32_t> targets;
};

absl::StatusOr<PrefixIndex::CommitResult> PrefixIndex::Commit(
    uint32_t rank, const HashKey* parent, absl::Span<const HashKey> hashes,
    absl::Span<const uint32_t> rows,
    absl::Span<const SnapshotPlacement> snapshots) {
  // Validation: nothing changes until every check passed.
  CommitPlan plan;
  if (absl::Status s = CheckCommitArgs(rank, parent, hashes.size(), rows.size(),
                                       snapshots.size(), plan);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckCommitRows(rank, rows); !s.ok()) return s;
  if (absl::Status s = CheckCommitChain(hashes, plan); !s.ok()) return s;
  if (absl::Status s = CheckSnapshotPlacements(rank, snapshots, plan);
      !s.ok()) {
    return s;
  }

  // Apply.
  Tick();
  CommitResult result;
  LinkPages(rank, hashes, rows, plan, result);
  PlaceSnapshots(rank, snapshots, plan, result);
  return result;
}

absl::Status PrefixIndex::CheckCommitArgs(uint32_t rank, const HashKey* parent,
                                          size_t hashes, size_t rows,
                                          size_t snapshots,
                                          CommitPlan& plan) const {
  if (absl::Status s = ValidateRank(rank); !s.ok()) return s;
  if (rows != hashes) {
    return absl::InvalidArgumentError(
        absl::StrCat("rows: ", rows, " rows for ", hashes, " hashes"));
  }
  if (hashes >= kNoNode) {
    return absl::InvalidArgumentError(
        absl::StrCat("hashes: ", hashes, " is too many"));
  }
  if (snapshots != 0 && !hybrid_) {
    return absl::InvalidArgumentError(
        "snapshots: the namespace is not hybrid (snapshot_rows is 0)");
  }
  if (parent != nullptr) {
    plan.parent_id = FindNode(*parent);
    if (plan.parent_id == kNoNode) {
      return absl::FailedPreconditionError(
          "parent: the parent hash is not in the index (evicted or never "
          "committed)");
    }
    if (PageRow(plan.parent_id, rank) == kNoRow) {
      return absl::FailedPreconditionError(absl::StrCat(
          "parent: the parent hash has no page row of rank ", rank));
    }
  }
  return absl::OkStatus();
}

absl::Status PrefixIndex::CheckCommitRows(
    uint32_t rank, absl::Span<const uint32_t> rows) const {
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
  return absl::OkStatus();
}

absl::Status PrefixIndex::CheckCommitChain(absl::Span<const HashKey> hashes,
                                           CommitPlan& plan) const {
  plan.position.reserve(hashes.size());
  plan.nodes.assign(hashes.size(), kNoNode);
  uint32_t expected = plan.parent_id;
  bool below_new = false;  // A new node's children are new too.
  for (size_t i = 0; i < hashes.size(); ++i) {
    auto [it, inserted] = plan.position.try_emplace(KeyBytes(hashes[i]),
                                                    static_cast<uint32_t>(i));
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
    plan.nodes[i] = id;
    expected = id;
  }
  return absl::OkStatus();
}

absl::Status PrefixIndex::CheckSnapshotPlacements(
    uint32_t rank, absl::Span<const SnapshotPlacement> snapshots,
    CommitPlan& plan) const {
  plan.targets.resize(snapshots.size());
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
    if (auto it = plan.position.find(KeyBytes(p.hash));
        it != plan.position.end()) {
      plan.targets[j] = kInCommit | it->second;
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
    plan.targets[j] = id;
  }
  return absl::OkStatus();
}

void PrefixIndex::LinkPages(uint32_t rank, absl::Span<const HashKey> hashes,
                            absl::Span<const uint32_t> rows, CommitPlan& plan,
                            CommitResult& result) {
  std::vector<uint32_t>& nodes = plan.nodes;
  uint32_t prev = plan.parent_id;
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
}

void PrefixIndex::PlaceSnapshots(uint32_t rank,
                                 absl::Span<const SnapshotPlacement> snapshots,
                                 const CommitPlan& plan, CommitResult& result) {
  for (size_t j = 0; j < snapshots.size(); ++j) {
    const uint32_t row = snapshots[j].row;
    const uint32_t target = plan.targets[j];
    const uint32_t id =
        (target & kInCommit) != 0 ? plan.nodes[target & ~kInCommit] : target;
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
}

}  // namespace kvtier::daemon
