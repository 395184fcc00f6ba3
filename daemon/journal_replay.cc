// Replaying a journal's records into a ReplayModel (journal_replay.h).
// Thread-safety: see there.
#include "daemon/journal_replay.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace kvtier::daemon::journal_internal {

// ----------------------------------------------------------- RowOwners --

namespace {

// Dense while the table has at most this many entries, or as many as the
// file has bytes (each row a record names takes at least 4 of them).
constexpr uint64_t kDenseMinEntries = 1 << 16;

}  // namespace

RowOwners::RowOwners(uint32_t ranks, uint64_t rows_per_rank,
                     uint64_t file_bytes)
    : rows_(rows_per_rank),
      sparse_(uint64_t{ranks} * rows_per_rank >
              std::max(kDenseMinEntries, file_bytes)) {
  if (!sparse_) dense_.assign(uint64_t{ranks} * rows_per_rank, kNoNode);
}

void RowOwners::Set(uint32_t rank, uint32_t row, uint32_t owner) {
  const uint64_t i = uint64_t{rank} * rows_ + row;
  if (!sparse_) {
    dense_[i] = owner;
  } else if (owner == kNoNode) {
    map_.erase(i);
  } else {
    map_[i] = owner;
  }
}

// --------------------------------------------------------- ReplayModel --

ReplayModel::ReplayModel(const JournalHeader& h, uint32_t hash_bytes,
                         uint32_t ranks, uint64_t file_bytes)
    : hash_bytes_(hash_bytes),
      ranks_(ranks),
      hybrid_(h.snapshot_rows > 0),
      page_rows_(h.page_rows),
      snapshot_rows_(h.snapshot_rows),
      by_key_(0, KeyHash{hash_bytes}, KeyEq{}),
      page_owner_(ranks, h.page_rows, file_bytes),
      snapshot_owner_(ranks, h.snapshot_rows, file_bytes),
      reserved_(ranks) {}

absl::Status ReplayModel::Apply(uint8_t type, Cursor& c) {
  ++seq_;
  // A checkpoint's records come first: nodes, then reservations in rank
  // order. An appended reservation may look the same (taking it for a
  // checkpoint's only makes the outstanding rows more conservative).
  if (type != kNodes && type != kReserve) in_checkpoint_ = false;
  switch (type) {
    case kNodes:
      if (checkpoint_rank_ >= 0) in_checkpoint_ = false;
      return ApplyNodes(c);
    case kReserve:
      return ApplyReserve(c);
    case kCommit:
      return ApplyCommit(c);
    case kDrop:
      return ApplyDrop(c);
    case kRelease:
      return ApplyRelease(c);
    default:
      return absl::DataLossError(
          absl::StrCat("unknown record type ", static_cast<int>(type)));
  }
}

void ReplayModel::Reserve(size_t nodes) {
  nodes_.reserve(nodes);
  page_row_.reserve(nodes * ranks_);
  snapshot_row_.reserve(nodes * ranks_);
  by_key_.reserve(nodes);
}

void ReplayModel::Export(JournalContents* out) const {
  out->inconsistent = inconsistent_;
  reserved_.Export(&out->outstanding_page_rows,
                   &out->outstanding_snapshot_rows);
  std::vector<uint32_t> order;
  std::vector<uint32_t> position(nodes_.size(), kNoNode);
  for (uint32_t id = 0; id < nodes_.size(); ++id) {
    if (nodes_[id].live && nodes_[id].parent == kNoNode) order.push_back(id);
  }
  for (size_t i = 0; i < order.size(); ++i) {
    for (uint32_t c = nodes_[order[i]].first_child; c != kNoNode;
         c = nodes_[c].next_sibling) {
      order.push_back(c);
    }
  }
  out->keys.reserve(order.size());
  out->parents.reserve(order.size());
  out->seq.reserve(order.size());
  out->page_rows.reserve(order.size() * ranks_);
  if (hybrid_) out->snapshot_rows.reserve(order.size() * ranks_);
  for (size_t i = 0; i < order.size(); ++i) {
    const uint32_t id = order[i];
    const Node& n = nodes_[id];
    position[id] = static_cast<uint32_t>(i);
    out->keys.push_back(n.key);
    out->parents.push_back(n.parent == kNoNode ? kNoNode : position[n.parent]);
    out->seq.push_back(n.seq);
    for (uint32_t r = 0; r < ranks_; ++r) {
      out->page_rows.push_back(page_row_[id * ranks_ + r]);
      if (hybrid_) out->snapshot_rows.push_back(snapshot_row_[id * ranks_ + r]);
    }
  }
}

uint32_t ReplayModel::NewNode(const HashKey& key, uint32_t parent) {
  uint32_t id;
  if (!free_ids_.empty()) {
    id = free_ids_.back();
    free_ids_.pop_back();
  } else {
    id = static_cast<uint32_t>(nodes_.size());
    nodes_.emplace_back();
    for (uint32_t r = 0; r < ranks_; ++r) {
      page_row_.push_back(kNoRow);
      snapshot_row_.push_back(kNoRow);
    }
  }
  Node& n = nodes_[id];
  n = Node();
  n.key = key;
  n.parent = parent;
  n.seq = seq_;
  n.live = true;
  if (parent != kNoNode) {
    Node& p = nodes_[parent];
    n.next_sibling = p.first_child;
    if (p.first_child != kNoNode) nodes_[p.first_child].prev_sibling = id;
    p.first_child = id;
  }
  by_key_[key] = id;
  return id;
}

void ReplayModel::RemoveSnapshot(uint32_t id) {
  for (uint32_t r = 0; r < ranks_; ++r) {
    uint32_t& row = SnapshotRow(id, r);
    if (row != kNoRow) snapshot_owner_.Set(r, row, kNoNode);
    row = kNoRow;
  }
}

void ReplayModel::ClearPageRow(uint32_t id, uint32_t rank) {
  uint32_t& row = PageRow(id, rank);
  if (row != kNoRow) page_owner_.Set(rank, row, kNoNode);
  row = kNoRow;
  ClearSnapshotRow(id, rank);
  for (uint32_t r = 0; r < ranks_; ++r) {
    if (PageRow(id, r) != kNoRow) return;
  }
  RemoveSubtree(id);
}

void ReplayModel::ClearSnapshotRow(uint32_t id, uint32_t rank) {
  uint32_t& row = SnapshotRow(id, rank);
  if (row != kNoRow) snapshot_owner_.Set(rank, row, kNoNode);
  row = kNoRow;
}

void ReplayModel::RemoveSubtree(uint32_t root) {
  Node& rn = nodes_[root];
  if (rn.parent != kNoNode) {
    if (rn.prev_sibling != kNoNode) {
      nodes_[rn.prev_sibling].next_sibling = rn.next_sibling;
    } else {
      nodes_[rn.parent].first_child = rn.next_sibling;
    }
    if (rn.next_sibling != kNoNode) {
      nodes_[rn.next_sibling].prev_sibling = rn.prev_sibling;
    }
  }
  std::vector<uint32_t> stack = {root};
  while (!stack.empty()) {
    const uint32_t id = stack.back();
    stack.pop_back();
    Node& n = nodes_[id];
    for (uint32_t c = n.first_child; c != kNoNode; c = nodes_[c].next_sibling) {
      stack.push_back(c);
    }
    RemoveSnapshot(id);
    for (uint32_t r = 0; r < ranks_; ++r) {
      uint32_t& row = PageRow(id, r);
      if (row != kNoRow) page_owner_.Set(r, row, kNoNode);
      row = kNoRow;
    }
    by_key_.erase(n.key);
    n.live = false;
    n.first_child = n.next_sibling = n.prev_sibling = kNoNode;
    free_ids_.push_back(id);
  }
}

absl::Status ReplayModel::ApplyNodes(Cursor& c) {
  struct Entry {
    uint32_t parent;
    HashKey key;
    uint64_t tick;
  };
  // A node: parent, hash, tick, every rank's page (and snapshot) row.
  const size_t node_bytes =
      4 + hash_bytes_ + 8 + size_t{4} * ranks_ * (hybrid_ ? 2 : 1);
  uint32_t count = 0;
  if (absl::Status s = ReadCount(c, node_bytes, "nodes.count", &count);
      !s.ok()) {
    return s;
  }
  if (count > kNodesPerRecord) {
    return absl::DataLossError(absl::StrCat(
        "nodes.count: ", count, " is over the limit of ", kNodesPerRecord));
  }
  std::vector<Entry> entries(count);
  std::vector<uint32_t> pages(uint64_t{count} * ranks_);
  std::vector<uint32_t> snaps(hybrid_ ? uint64_t{count} * ranks_ : 0);
  const size_t base = checkpoint_ids_.size();
  for (uint32_t i = 0; i < count; ++i) {
    Entry& e = entries[i];
    e.parent = c.U32();
    e.key = c.Hash(hash_bytes_);
    e.tick = c.U64();
    if (e.parent != kNoNode && e.parent >= base + i) {
      return absl::DataLossError(
          absl::StrCat("nodes[", i, "]: parent follows the node"));
    }
    for (uint32_t r = 0; r < ranks_; ++r) {
      const uint32_t row = c.U32();
      if (row != kNoRow && !PageRowOk(row)) {
        return absl::DataLossError(
            absl::StrCat("nodes[", i, "]: page row ", row, " out of range"));
      }
      pages[uint64_t{i} * ranks_ + r] = row;
    }
    if (hybrid_) {
      for (uint32_t r = 0; r < ranks_; ++r) {
        const uint32_t row = c.U32();
        if (row != kNoRow && !SnapshotRowOk(row)) {
          return absl::DataLossError(absl::StrCat(
              "nodes[", i, "]: snapshot row ", row, " out of range"));
        }
        snaps[uint64_t{i} * ranks_ + r] = row;
      }
    }
  }
  if (!c.ok() || !c.done()) return absl::DataLossError("nodes: truncated");
  for (uint32_t i = 0; i < count; ++i) {
    const Entry& e = entries[i];
    const uint32_t parent =
        e.parent == kNoNode ? kNoNode : checkpoint_ids_[e.parent];
    if ((e.parent != kNoNode && !Live(parent)) || Find(e.key) != kNoNode) {
      checkpoint_ids_.push_back(kNoNode);  // Its subtree goes too.
      continue;
    }
    seq_ = std::max(seq_, e.tick + 1);
    const uint32_t id = NewNode(e.key, parent);
    nodes_[id].seq = e.tick;
    // A row held twice, or by an outstanding reservation (which no
    // checkpoint writes), goes to no node.
    for (uint32_t r = 0; r < ranks_; ++r) {
      const uint32_t row = pages[uint64_t{i} * ranks_ + r];
      if (row != kNoRow && PageOwner(r, row) == kNoNode &&
          !reserved_.HoldsPage(r, row)) {
        page_owner_.Set(r, row, id);
        PageRow(id, r) = row;
      }
      const uint32_t snap = hybrid_ ? snaps[uint64_t{i} * ranks_ + r] : kNoRow;
      if (snap != kNoRow && SnapshotOwner(r, snap) == kNoNode &&
          !reserved_.HoldsSnapshot(r, snap)) {
        snapshot_owner_.Set(r, snap, id);
        SnapshotRow(id, r) = snap;
      }
    }
    checkpoint_ids_.push_back(id);
  }
  return absl::OkStatus();
}

absl::Status ReplayModel::ReadRows(Cursor& c, bool snapshot,
                                   std::vector<uint32_t>* rows) {
  const char* field = snapshot ? "reserve.snapshot_rows" : "reserve.page_rows";
  uint32_t n = 0;
  if (absl::Status s = ReadCount(c, 4, field, &n); !s.ok()) return s;
  rows->resize(n);
  for (uint32_t i = 0; i < n; ++i) {
    const uint32_t row = c.U32();
    if (snapshot ? !SnapshotRowOk(row) : !PageRowOk(row)) {
      return absl::DataLossError(
          absl::StrCat(field, "[", i, "]: row ", row, " out of range"));
    }
    (*rows)[i] = row;
  }
  return absl::OkStatus();
}

absl::Status ReplayModel::ReadReserve(Cursor& c, const char* what,
                                      uint32_t* rank,
                                      std::vector<uint32_t>* pages,
                                      std::vector<uint32_t>* snaps) {
  *rank = c.U32();
  if (!c.ok() || *rank >= ranks_) {
    return absl::DataLossError(
        absl::StrCat(what, ".rank: ", *rank, " is not below ", ranks_));
  }
  if (absl::Status s = ReadRows(c, false, pages); !s.ok()) return s;
  if (absl::Status s = ReadRows(c, true, snaps); !s.ok()) return s;
  if (!c.ok() || !c.done()) {
    return absl::DataLossError(
        absl::StrCat(what, ": bytes left after the rows"));
  }
  return absl::OkStatus();
}

absl::Status ReplayModel::ApplyReserve(Cursor& c) {
  uint32_t rank = 0;
  std::vector<uint32_t> pages, snaps;
  if (absl::Status s = ReadReserve(c, "reserve", &rank, &pages, &snaps);
      !s.ok()) {
    return s;
  }
  const bool merged = in_checkpoint_ && int64_t{rank} >= checkpoint_rank_;
  if (merged) {
    checkpoint_rank_ = rank;
  } else {
    in_checkpoint_ = false;
  }
  reserved_.Reserve(rank, pages, snaps, merged);
  // The engine may have written these rows: whatever held them lost them.
  TakeRows(rank, pages, snaps);
  return absl::OkStatus();
}

absl::Status ReplayModel::ApplyRelease(Cursor& c) {
  uint32_t rank = 0;
  std::vector<uint32_t> pages, snaps;
  if (absl::Status s = ReadReserve(c, "release", &rank, &pages, &snaps);
      !s.ok()) {
    return s;
  }
  reserved_.Released(rank, pages, snaps);
  // Their bytes are nobody's: a node the model still has there (which a
  // journal the daemon wrote never has, the rows' reservation having taken
  // them) goes too.
  TakeRows(rank, pages, snaps);
  return absl::OkStatus();
}

void ReplayModel::TakeRows(uint32_t rank, absl::Span<const uint32_t> pages,
                           absl::Span<const uint32_t> snaps) {
  for (uint32_t row : pages) {
    if (const uint32_t owner = PageOwner(rank, row); owner != kNoNode) {
      ClearPageRow(owner, rank);
    }
  }
  for (uint32_t row : snaps) {
    if (const uint32_t owner = SnapshotOwner(rank, row); owner != kNoNode) {
      ClearSnapshotRow(owner, rank);
    }
  }
}

absl::Status ReplayModel::ApplyCommit(Cursor& c) {
  const uint32_t rank = c.U32();
  const bool has_parent = c.U8() != 0;
  HashKey parent_key;
  if (has_parent) parent_key = c.Hash(hash_bytes_);
  if (!c.ok() || rank >= ranks_) {
    return absl::DataLossError(absl::StrCat(
        "commit.rank: ", rank, " is not below ", ranks_, " (or truncated)"));
  }
  struct Entry {
    HashKey key;
    uint32_t row;
  };
  auto read_entries = [&](bool snapshot, std::vector<Entry>* out) {
    const char* field = snapshot ? "commit.snapshots" : "commit.pages";
    uint32_t n = 0;
    if (absl::Status s = ReadCount(c, hash_bytes_ + 4, field, &n); !s.ok()) {
      return s;
    }
    out->resize(n);
    for (uint32_t i = 0; i < n; ++i) {
      (*out)[i].key = c.Hash(hash_bytes_);
      const uint32_t row = c.U32();
      if (row != kNoRow && (snapshot ? !SnapshotRowOk(row) : !PageRowOk(row))) {
        return absl::DataLossError(
            absl::StrCat(field, "[", i, "]: row ", row, " out of range"));
      }
      (*out)[i].row = row;
    }
    return absl::OkStatus();
  };
  std::vector<Entry> pages, snaps;
  if (absl::Status s = read_entries(false, &pages); !s.ok()) return s;
  if (absl::Status s = read_entries(true, &snaps); !s.ok()) return s;
  if (!c.ok() || !c.done()) {
    return absl::DataLossError("commit: bytes left after the snapshots");
  }
  {
    std::vector<uint32_t> page_rows, snapshot_rows;
    page_rows.reserve(pages.size());
    snapshot_rows.reserve(snaps.size());
    for (const Entry& e : pages) page_rows.push_back(e.row);
    for (const Entry& e : snaps) snapshot_rows.push_back(e.row);
    reserved_.Commit(rank, page_rows, snapshot_rows);
  }

  // Rows this commit made visible: whatever else the model has there is
  // stale (its eviction was not journaled).
  for (const Entry& e : pages) {
    if (e.row == kNoRow) continue;
    const uint32_t owner = PageOwner(rank, e.row);
    if (owner != kNoNode && !KeyEq()(nodes_[owner].key, e.key)) {
      ClearPageRow(owner, rank);
    }
  }
  for (const Entry& e : snaps) {
    if (e.row == kNoRow) continue;
    const uint32_t owner = SnapshotOwner(rank, e.row);
    if (owner != kNoNode && !KeyEq()(nodes_[owner].key, e.key)) {
      ClearSnapshotRow(owner, rank);
    }
  }
  uint32_t prev = kNoNode;
  if (has_parent) {
    prev = Find(parent_key);
    if (prev == kNoNode || PageRow(prev, rank) == kNoRow) {
      ++inconsistent_;
      return absl::OkStatus();
    }
  }
  for (const Entry& e : pages) {
    uint32_t id = Find(e.key);
    if (id != kNoNode && nodes_[id].parent != prev) {
      // Evicted and committed again under another parent.
      RemoveSubtree(id);
      id = kNoNode;
      if (prev != kNoNode && !Live(prev)) break;
    }
    if (e.row == kNoRow) {
      // Deduplicated: the hash had this rank's row already.
      if (id == kNoNode || PageRow(id, rank) == kNoRow) {
        ++inconsistent_;
        break;
      }
    } else {
      if (id == kNoNode) id = NewNode(e.key, prev);
      uint32_t& row = PageRow(id, rank);
      if (row != kNoRow && row != e.row) page_owner_.Set(rank, row, kNoNode);
      row = e.row;
      page_owner_.Set(rank, e.row, id);
    }
    nodes_[id].seq = seq_;
    prev = id;
  }
  for (const Entry& e : snaps) {
    if (e.row == kNoRow) continue;
    const uint32_t id = Find(e.key);
    if (id == kNoNode || PageRow(id, rank) == kNoRow) continue;
    uint32_t& row = SnapshotRow(id, rank);
    if (row != kNoRow && row != e.row) {
      snapshot_owner_.Set(rank, row, kNoNode);
    }
    row = e.row;
    snapshot_owner_.Set(rank, e.row, id);
  }
  return absl::OkStatus();
}

absl::Status ReplayModel::ApplyDrop(Cursor& c) {
  const HashKey key = c.Hash(hash_bytes_);
  if (!c.ok() || !c.done()) {
    return absl::DataLossError("drop: not exactly one hash");
  }
  if (const uint32_t id = Find(key); id != kNoNode) RemoveSubtree(id);
  return absl::OkStatus();
}

}  // namespace kvtier::daemon::journal_internal
