// The namespace journal: record framing, checkpoints, replay and restore.
#include "daemon/journal.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/hash/hash.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/crc32c.h"
#include "daemon/journal_replay.h"
#include "daemon/namespace_layout.h"

namespace kvtier::daemon {
namespace {

using journal_internal::Cursor;
using journal_internal::NextRecord;
using journal_internal::NextStatus;
using journal_internal::ReadCount;
using journal_internal::ReservationTracker;
using journal_internal::RowOwners;

// The file's first 8 bytes.
constexpr char kMagic[8] = {'K', 'V', 'T', 'J', 'R', 'N', 'L', '1'};
// Nodes per checkpoint record.
constexpr uint32_t kNodesPerRecord = 16384;
// Rows (of each bank) per checkpoint reservation record.
constexpr size_t kRowsPerReserveRecord = 1 << 20;
// Header limits.
constexpr uint32_t kMaxLayoutBytes = 1 << 20;
constexpr uint32_t kMaxSegments = 4096;
constexpr uint32_t kMaxBankName = 64;
constexpr uint32_t kMaxSegmentPath = 4096;
// Write the checkpoint in pieces of about this size.
constexpr size_t kWriteChunk = 4u << 20;

enum RecordType : uint8_t {
  kHeader = 1,
  kNodes = 2,
  kReserve = 3,
  kCommit = 4,
  kDrop = 5,
};

// ------------------------------------------------------------ encoding --

void PutU8(std::string* out, uint8_t v) {
  out->push_back(static_cast<char>(v));
}
void PutU32(std::string* out, uint32_t v) {
  char b[4];
  std::memcpy(b, &v, 4);  // Little-endian hosts only (see bank_header.h).
  out->append(b, 4);
}
void PutU64(std::string* out, uint64_t v) {
  char b[8];
  std::memcpy(b, &v, 8);
  out->append(b, 8);
}
void PutString(std::string* out, absl::string_view s) {
  PutU32(out, static_cast<uint32_t>(s.size()));
  out->append(s.data(), s.size());
}
void PutHash(std::string* out, const HashKey& k, uint32_t hash_bytes) {
  out->append(reinterpret_cast<const char*>(k.bytes.data()), hash_bytes);
}

// Appends a framed record of `type` holding `payload` to `out`.
void Frame(std::string* out, uint8_t type, absl::string_view payload) {
  const uint32_t length = static_cast<uint32_t>(payload.size() + 1);
  const uint8_t t = type;
  uint32_t crc = Crc32c(&t, 1);
  crc = Crc32c(payload.data(), payload.size(), crc);
  PutU32(out, length);
  PutU32(out, crc);
  PutU8(out, type);
  out->append(payload.data(), payload.size());
}

void EncodeReserve(std::string* out, uint32_t rank,
                   absl::Span<const uint32_t> page_rows,
                   absl::Span<const uint32_t> snapshot_rows) {
  PutU32(out, rank);
  PutU32(out, static_cast<uint32_t>(page_rows.size()));
  for (uint32_t row : page_rows) PutU32(out, row);
  PutU32(out, static_cast<uint32_t>(snapshot_rows.size()));
  for (uint32_t row : snapshot_rows) PutU32(out, row);
}

std::string EncodeHeader(const JournalHeader& h) {
  std::string out;
  PutString(&out, h.name);
  std::string layout;
  h.layout.SerializeToString(&layout);
  PutString(&out, layout);
  PutU64(&out, h.page_rows);
  PutU64(&out, h.snapshot_rows);
  PutU32(&out, h.max_replay_tokens);
  PutU32(&out, static_cast<uint32_t>(h.segments.size()));
  for (const JournalSegment& s : h.segments) {
    PutString(&out, s.bank);
    PutU32(&out, s.rank);
    PutString(&out, s.path);
    PutU64(&out, s.created_unix_ns);
  }
  return out;
}

// Reads a string of at most `max` bytes (u32 length, bytes) named `field`.
absl::Status ReadString(Cursor& c, uint32_t max, absl::string_view field,
                        std::string* out) {
  const uint32_t n = c.U32();
  if (!c.ok()) return absl::DataLossError(absl::StrCat(field, ": truncated"));
  if (n > max || n > c.left()) {
    return absl::DataLossError(
        absl::StrCat(field, ": length ", n, " is over the limit of ", max,
                     " or the record's ", c.left(), " bytes left"));
  }
  *out = std::string(c.Bytes(n));
  return absl::OkStatus();
}

absl::Status DecodeHeader(Cursor& c, JournalHeader* h) {
  std::string layout;
  if (absl::Status s =
          ReadString(c, kMaxNamespaceName, "header.name", &h->name);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = ReadString(c, kMaxLayoutBytes, "header.layout", &layout);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = ValidateNamespaceName(h->name, "header.name"); !s.ok()) {
    return absl::DataLossError(s.message());
  }
  v1::Layout raw;
  if (!raw.ParseFromString(layout)) {
    return absl::DataLossError("header.layout: does not parse");
  }
  if (absl::Status s = ValidateLayout(raw); !s.ok()) {
    return absl::DataLossError(absl::StrCat("header.", s.message()));
  }
  h->layout = NormalizeLayout(raw);
  h->page_rows = c.U64();
  h->snapshot_rows = c.U64();
  h->max_replay_tokens = c.U32();
  if (!c.ok()) return absl::DataLossError("header: truncated bank sizes");
  // A segment takes at least its two lengths, rank and time stamp.
  uint32_t segments = 0;
  if (absl::Status s = ReadCount(c, 20, "header.segments", &segments);
      !s.ok()) {
    return s;
  }
  if (segments > kMaxSegments) {
    return absl::DataLossError(absl::StrCat(
        "header.segments: ", segments, " is over the limit of ", kMaxSegments));
  }
  h->segments.reserve(segments);
  for (uint32_t i = 0; i < segments; ++i) {
    const std::string field = absl::StrCat("header.segments[", i, "]");
    JournalSegment s;
    if (absl::Status e = ReadString(c, kMaxBankName, field + ".bank", &s.bank);
        !e.ok()) {
      return e;
    }
    s.rank = c.U32();
    if (absl::Status e =
            ReadString(c, kMaxSegmentPath, field + ".path", &s.path);
        !e.ok()) {
      return e;
    }
    s.created_unix_ns = c.U64();
    if (!c.ok()) return absl::DataLossError(absl::StrCat(field, ": truncated"));
    h->segments.push_back(std::move(s));
  }
  if (h->page_rows == 0 || h->page_rows >= kNoRow) {
    return absl::DataLossError(absl::StrCat("header.page_rows: ", h->page_rows,
                                            " out of range 1..", kNoRow - 1));
  }
  if (h->snapshot_rows >= kNoRow) {
    return absl::DataLossError(
        absl::StrCat("header.snapshot_rows: ", h->snapshot_rows,
                     " out of range 0..", kNoRow - 1));
  }
  if ((h->snapshot_rows > 0) != (h->layout.snapshot_row_bytes() > 0)) {
    return absl::DataLossError(
        "header.snapshot_rows: disagrees with layout.snapshot_row_bytes");
  }
  return absl::OkStatus();
}

uint32_t StoredRanks(const v1::Layout& layout) {
  return layout.replicated() ? 1 : std::max<uint32_t>(1, layout.tp_size());
}

absl::Status Errno(absl::string_view what, const std::string& path) {
  return absl::InternalError(
      absl::StrCat("journal: ", what, " ", path, ": ", std::strerror(errno)));
}

// Writes all of `data` to `fd` (retrying short writes and EINTR).
bool WriteAll(int fd, absl::string_view data) {
  while (!data.empty()) {
    const ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

std::string Dirname(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

std::string Basename(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// ------------------------------------------------------------- replay --

struct KeyHash {
  uint32_t hash_bytes;
  size_t operator()(const HashKey& k) const {
    return absl::Hash<absl::string_view>{}(absl::string_view(
        reinterpret_cast<const char*>(k.bytes.data()), hash_bytes));
  }
};
struct KeyEq {
  bool operator()(const HashKey& a, const HashKey& b) const {
    return a.bytes == b.bytes;  // Bytes beyond hash_bytes are zero.
  }
};

// The index as the records say it is, without allocation or eviction:
// nodes, their rows, and who holds each row. Records whose effects disagree
// with it (which a consistent journal never has) are applied as far as
// they make sense and never leave a row held twice.
class ReplayModel {
 public:
  ReplayModel(const JournalHeader& h, uint32_t hash_bytes, uint32_t ranks,
              uint64_t file_bytes)
      : hash_bytes_(hash_bytes),
        ranks_(ranks),
        hybrid_(h.snapshot_rows > 0),
        page_rows_(h.page_rows),
        snapshot_rows_(h.snapshot_rows),
        by_key_(0, KeyHash{hash_bytes}, KeyEq{}),
        page_owner_(ranks, h.page_rows, file_bytes),
        snapshot_owner_(ranks, h.snapshot_rows, file_bytes),
        reserved_(ranks) {}

  // Each Apply validates the whole payload before changing anything and
  // returns DATA_LOSS for a malformed one.
  absl::Status Apply(uint8_t type, Cursor& c) {
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
      default:
        return absl::DataLossError(
            absl::StrCat("unknown record type ", static_cast<int>(type)));
    }
  }

  void Reserve(size_t nodes) {
    nodes_.reserve(nodes);
    page_row_.reserve(nodes * ranks_);
    snapshot_row_.reserve(nodes * ranks_);
    by_key_.reserve(nodes);
  }

  void Export(JournalContents* out) const {
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
      out->parents.push_back(n.parent == kNoNode ? kNoNode
                                                 : position[n.parent]);
      out->seq.push_back(n.seq);
      for (uint32_t r = 0; r < ranks_; ++r) {
        out->page_rows.push_back(page_row_[id * ranks_ + r]);
        if (hybrid_)
          out->snapshot_rows.push_back(snapshot_row_[id * ranks_ + r]);
      }
    }
  }

 private:
  struct Node {
    HashKey key;
    uint32_t parent = kNoNode;
    uint32_t first_child = kNoNode;
    uint32_t next_sibling = kNoNode;
    uint32_t prev_sibling = kNoNode;
    uint64_t seq = 0;
    bool live = false;
  };

  bool PageRowOk(uint32_t row) const { return row < page_rows_; }
  bool SnapshotRowOk(uint32_t row) const {
    return hybrid_ && row < snapshot_rows_;
  }
  uint32_t PageOwner(uint32_t rank, uint32_t row) const {
    return page_owner_.Get(rank, row);
  }
  uint32_t SnapshotOwner(uint32_t rank, uint32_t row) const {
    return snapshot_owner_.Get(rank, row);
  }
  uint32_t& PageRow(uint32_t id, uint32_t rank) {
    return page_row_[uint64_t{id} * ranks_ + rank];
  }
  uint32_t& SnapshotRow(uint32_t id, uint32_t rank) {
    return snapshot_row_[uint64_t{id} * ranks_ + rank];
  }
  bool Live(uint32_t id) const {
    return id != kNoNode && id < nodes_.size() && nodes_[id].live;
  }
  uint32_t Find(const HashKey& key) const {
    auto it = by_key_.find(key);
    return it == by_key_.end() ? kNoNode : it->second;
  }

  uint32_t NewNode(const HashKey& key, uint32_t parent) {
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

  // Frees every rank's snapshot row of `id` (as the index's snapshot
  // eviction does).
  void RemoveSnapshot(uint32_t id) {
    for (uint32_t r = 0; r < ranks_; ++r) {
      uint32_t& row = SnapshotRow(id, r);
      if (row != kNoRow) snapshot_owner_.Set(r, row, kNoNode);
      row = kNoRow;
    }
  }

  // Takes rank `rank`'s page row (and snapshot row) from `id`: that row was
  // handed out again, so this copy of the node is stale for the rank. Other
  // ranks' rows stay (their bytes are intact until reserved themselves); a
  // node left with no page row goes, with its subtree, which no rank can
  // reach any more.
  void ClearPageRow(uint32_t id, uint32_t rank) {
    uint32_t& row = PageRow(id, rank);
    if (row != kNoRow) page_owner_.Set(rank, row, kNoNode);
    row = kNoRow;
    ClearSnapshotRow(id, rank);
    for (uint32_t r = 0; r < ranks_; ++r) {
      if (PageRow(id, r) != kNoRow) return;
    }
    RemoveSubtree(id);
  }

  void ClearSnapshotRow(uint32_t id, uint32_t rank) {
    uint32_t& row = SnapshotRow(id, rank);
    if (row != kNoRow) snapshot_owner_.Set(rank, row, kNoNode);
    row = kNoRow;
  }

  // Forgets `root` and everything below it, freeing their rows.
  void RemoveSubtree(uint32_t root) {
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
      for (uint32_t c = n.first_child; c != kNoNode;
           c = nodes_[c].next_sibling) {
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

  absl::Status ApplyNodes(Cursor& c) {
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
        const uint32_t snap =
            hybrid_ ? snaps[uint64_t{i} * ranks_ + r] : kNoRow;
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

  absl::Status ReadRows(Cursor& c, bool snapshot, std::vector<uint32_t>* rows) {
    const char* field =
        snapshot ? "reserve.snapshot_rows" : "reserve.page_rows";
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

  absl::Status ApplyReserve(Cursor& c) {
    const uint32_t rank = c.U32();
    if (!c.ok() || rank >= ranks_) {
      return absl::DataLossError(
          absl::StrCat("reserve.rank: ", rank, " is not below ", ranks_));
    }
    std::vector<uint32_t> pages, snaps;
    if (absl::Status s = ReadRows(c, false, &pages); !s.ok()) return s;
    if (absl::Status s = ReadRows(c, true, &snaps); !s.ok()) return s;
    if (!c.ok() || !c.done()) {
      return absl::DataLossError("reserve: bytes left after the rows");
    }
    const bool merged = in_checkpoint_ && int64_t{rank} >= checkpoint_rank_;
    if (merged) {
      checkpoint_rank_ = rank;
    } else {
      in_checkpoint_ = false;
    }
    reserved_.Reserve(rank, pages, snaps, merged);
    // The engine may have written these rows: whatever held them lost them.
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
    return absl::OkStatus();
  }

  absl::Status ApplyCommit(Cursor& c) {
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
        if (row != kNoRow &&
            (snapshot ? !SnapshotRowOk(row) : !PageRowOk(row))) {
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

  absl::Status ApplyDrop(Cursor& c) {
    const HashKey key = c.Hash(hash_bytes_);
    if (!c.ok() || !c.done()) {
      return absl::DataLossError("drop: not exactly one hash");
    }
    if (const uint32_t id = Find(key); id != kNoNode) RemoveSubtree(id);
    return absl::OkStatus();
  }

  const uint32_t hash_bytes_;
  const uint32_t ranks_;
  const bool hybrid_;
  const uint64_t page_rows_;
  const uint64_t snapshot_rows_;

  std::vector<Node> nodes_;
  std::vector<uint32_t> page_row_;      // [id * ranks + rank]
  std::vector<uint32_t> snapshot_row_;  // Same.
  std::vector<uint32_t> free_ids_;
  absl::flat_hash_map<HashKey, uint32_t, KeyHash, KeyEq> by_key_;
  RowOwners page_owner_;
  RowOwners snapshot_owner_;
  ReservationTracker reserved_;
  std::vector<uint32_t> checkpoint_ids_;  // Checkpoint ordinal -> id.
  // Still within what a checkpoint writes, and its last reservation's rank.
  bool in_checkpoint_ = true;
  int64_t checkpoint_rank_ = -1;
  uint64_t seq_ = 0;
  uint64_t inconsistent_ = 0;
};

}  // namespace

std::string JournalPath(const std::string& state_dir, const std::string& name) {
  return absl::StrCat(state_dir, "/ns.", name, ".journal");
}

absl::StatusOr<std::vector<std::string>> ListJournals(
    const std::string& state_dir) {
  std::error_code ec;
  std::filesystem::directory_iterator it(state_dir, ec);
  if (ec) {
    if (ec == std::errc::no_such_file_or_directory) {
      return absl::NotFoundError(
          absl::StrCat("journal: no folder ", state_dir));
    }
    return absl::InternalError(
        absl::StrCat("journal: listing ", state_dir, ": ", ec.message()));
  }
  std::vector<std::string> names;
  constexpr absl::string_view kPrefix = "ns.", kSuffix = ".journal";
  for (; it != std::filesystem::directory_iterator(); it.increment(ec)) {
    const std::string file = it->path().filename().string();
    if (absl::StartsWith(file, ".ns.") && absl::EndsWith(file, ".tmp")) {
      std::error_code ignored;
      std::filesystem::remove(it->path(), ignored);  // A checkpoint cut short.
      continue;
    }
    if (file.size() <= kPrefix.size() + kSuffix.size() ||
        !absl::StartsWith(file, kPrefix) || !absl::EndsWith(file, kSuffix)) {
      continue;
    }
    std::string name = file.substr(
        kPrefix.size(), file.size() - kPrefix.size() - kSuffix.size());
    if (ValidateNamespaceName(name).ok()) names.push_back(std::move(name));
  }
  if (ec) {
    return absl::InternalError(
        absl::StrCat("journal: listing ", state_dir, ": ", ec.message()));
  }
  std::sort(names.begin(), names.end());
  return names;
}

// -------------------------------------------------------- writing side --

NamespaceJournal::NamespaceJournal(std::string path, JournalHeader header,
                                   const JournalOptions& options)
    : path_(std::move(path)),
      header_(std::move(header)),
      options_(options),
      hash_bytes_(HashBytes(header_.layout.hash_kind())),
      ranks_(StoredRanks(header_.layout)),
      hybrid_(header_.snapshot_rows > 0) {}

NamespaceJournal::~NamespaceJournal() {
  if (fd_ >= 0) ::close(fd_);
}

absl::StatusOr<std::unique_ptr<NamespaceJournal>> NamespaceJournal::Create(
    const std::string& path, const JournalHeader& header,
    const PrefixIndex& index, const JournalOptions& options) {
  std::unique_ptr<NamespaceJournal> journal(
      new NamespaceJournal(path, header, options));
  if (absl::Status s = journal->Checkpoint(index); !s.ok()) return s;
  return journal;
}

absl::Status NamespaceJournal::Checkpoint(const PrefixIndex& index) {
  const std::string dir = Dirname(path_);
  const std::string tmp = absl::StrCat(dir, "/.", Basename(path_), ".tmp");
  const int fd = ::open(
      tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0600);
  if (fd < 0) return Errno("cannot create", tmp);
  bool keep = false;
  absl::Cleanup discard = [&] {
    if (!keep) {
      ::close(fd);
      ::unlink(tmp.c_str());
    }
  };
  uint64_t total = 0;
  std::string out(kMagic, sizeof(kMagic));
  Frame(&out, kHeader, EncodeHeader(header_));
  // Checkpoint ordinals: node id -> position in the checkpoint. Node ids
  // are dense (a pool), so a vector indexes them.
  std::vector<uint32_t> ordinal;
  uint32_t next_ordinal = 0;
  std::string batch;
  uint32_t in_batch = 0;
  bool write_failed = false;
  auto flush = [&](bool force) {
    if (in_batch > 0 && (force || in_batch == kNodesPerRecord)) {
      std::string payload;
      PutU32(&payload, in_batch);
      payload += batch;
      Frame(&out, kNodes, payload);
      batch.clear();
      in_batch = 0;
    }
    if (!write_failed && (force || out.size() >= kWriteChunk)) {
      if (!WriteAll(fd, out)) write_failed = true;
      total += out.size();
      out.clear();
    }
  };
  index.ForEachNode([&](const PrefixIndex::NodeView& v) {
    if (v.id >= ordinal.size()) ordinal.resize(v.id + v.id / 2 + 1024, kNoNode);
    ordinal[v.id] = next_ordinal++;
    PutU32(&batch, v.parent == kNoNode ? kNoNode : ordinal[v.parent]);
    PutHash(&batch, *v.key, hash_bytes_);
    PutU64(&batch, v.last_use_tick);
    for (uint32_t row : v.page_rows) PutU32(&batch, row);
    if (hybrid_) {
      for (uint32_t row : v.snapshot_rows) PutU32(&batch, row);
    }
    ++in_batch;
    flush(false);
  });
  flush(true);
  // Then the reservations outstanding now: one record per rank (more when
  // very large), after the nodes.
  for (uint32_t r = 0; r < ranks_; ++r) {
    const std::vector<uint32_t> pages = index.AllocatedPageRows(r);
    const std::vector<uint32_t> snaps =
        hybrid_ ? index.AllocatedSnapshotRows(r) : std::vector<uint32_t>();
    for (size_t i = 0; i < std::max(pages.size(), snaps.size());
         i += kRowsPerReserveRecord) {
      auto chunk = [&](const std::vector<uint32_t>& rows) {
        const size_t from = std::min(i, rows.size());
        return absl::MakeConstSpan(rows).subspan(
            from, std::min(kRowsPerReserveRecord, rows.size() - from));
      };
      std::string payload;
      EncodeReserve(&payload, r, chunk(pages), chunk(snaps));
      Frame(&out, kReserve, payload);
      flush(false);
    }
  }
  flush(true);
  if (write_failed) return Errno("cannot write", tmp);
  if (options_.fsync && ::fdatasync(fd) != 0) return Errno("cannot sync", tmp);
  if (::rename(tmp.c_str(), path_.c_str()) != 0) {
    return Errno("cannot rename to", path_);
  }
  keep = true;
  if (options_.fsync) {
    const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
      (void)::fsync(dfd);
      ::close(dfd);
    }
  }
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
  bytes_ = checkpoint_bytes_ = total;
  broken_ = false;
  return absl::OkStatus();
}

bool NamespaceJournal::NeedsCheckpoint() const {
  if (broken_) return true;
  const double limit =
      std::max<double>(static_cast<double>(options_.min_compact_bytes),
                       options_.compact_factor * checkpoint_bytes_);
  return static_cast<double>(bytes_ - checkpoint_bytes_) > limit;
}

absl::Status NamespaceJournal::Append(uint8_t type) {
  if (fd_ < 0) {
    return absl::InternalError(absl::StrCat("journal: ", path_, " is closed"));
  }
  if (broken_) {
    return absl::InternalError(absl::StrCat(
        "journal: ", path_, " failed a write and awaits a checkpoint"));
  }
  record_.clear();
  Frame(&record_, type, payload_);
  if (!WriteAll(fd_, record_)) {
    const absl::Status error = Errno("cannot append to", path_);
    broken_ = true;
    // Cut a partial record off, so nothing after it is ever hidden by it.
    if (::ftruncate(fd_, static_cast<off_t>(bytes_)) != 0) {
      return absl::InternalError(absl::StrCat(
          error.message(), "; and cannot truncate: ", std::strerror(errno)));
    }
    return error;
  }
  bytes_ += record_.size();
  if (options_.fsync && ::fdatasync(fd_) != 0) {
    broken_ = true;
    return Errno("cannot sync", path_);
  }
  return absl::OkStatus();
}

absl::Status NamespaceJournal::AppendReserve(
    uint32_t rank, absl::Span<const uint32_t> page_rows,
    absl::Span<const uint32_t> snapshot_rows) {
  payload_.clear();
  EncodeReserve(&payload_, rank, page_rows, snapshot_rows);
  return Append(kReserve);
}

absl::Status NamespaceJournal::AppendCommit(
    uint32_t rank, const HashKey* parent, absl::Span<const HashKey> hashes,
    absl::Span<const uint32_t> rows,
    absl::Span<const PrefixIndex::SnapshotPlacement> snapshots,
    absl::Span<const uint32_t> freed_page_rows,
    absl::Span<const uint32_t> freed_snapshot_rows) {
  if (rows.size() != hashes.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rows: ", rows.size(), " rows for ", hashes.size(), " hashes"));
  }
  const absl::flat_hash_set<uint32_t> freed_pages(freed_page_rows.begin(),
                                                  freed_page_rows.end());
  const absl::flat_hash_set<uint32_t> freed_snaps(freed_snapshot_rows.begin(),
                                                  freed_snapshot_rows.end());
  payload_.clear();
  payload_.reserve(16 + (hashes.size() + snapshots.size()) * (hash_bytes_ + 4));
  PutU32(&payload_, rank);
  PutU8(&payload_, parent != nullptr ? 1 : 0);
  if (parent != nullptr) PutHash(&payload_, *parent, hash_bytes_);
  PutU32(&payload_, static_cast<uint32_t>(hashes.size()));
  for (size_t i = 0; i < hashes.size(); ++i) {
    PutHash(&payload_, hashes[i], hash_bytes_);
    PutU32(&payload_, freed_pages.contains(rows[i]) ? kNoRow : rows[i]);
  }
  PutU32(&payload_, static_cast<uint32_t>(snapshots.size()));
  for (const auto& s : snapshots) {
    PutHash(&payload_, s.hash, hash_bytes_);
    PutU32(&payload_, freed_snaps.contains(s.row) ? kNoRow : s.row);
  }
  return Append(kCommit);
}

absl::Status NamespaceJournal::AppendDrop(const HashKey& hash) {
  payload_.clear();
  PutHash(&payload_, hash, hash_bytes_);
  return Append(kDrop);
}

absl::Status NamespaceJournal::Remove() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  if (::unlink(path_.c_str()) != 0 && errno != ENOENT) {
    return Errno("cannot remove", path_);
  }
  return absl::OkStatus();
}

// -------------------------------------------------------- reading side --

absl::StatusOr<JournalContents> ReadJournal(const std::string& path) {
  // O_NOFOLLOW, then the owner check below: only the daemon's own journal
  // is replayed (shm/trusted_path.h).
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) {
    if (errno == ENOENT) {
      return absl::NotFoundError(absl::StrCat("journal: no file ", path));
    }
    return Errno("cannot open", path);
  }
  absl::Cleanup close_fd = [fd] { ::close(fd); };
  struct stat st;
  if (::fstat(fd, &st) != 0) return Errno("cannot stat", path);
  if (!S_ISREG(st.st_mode) || st.st_uid != ::geteuid()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "journal ", path, ": not a regular file of kvtierd's uid ", ::geteuid(),
        " (uid ", st.st_uid, "): refused, never replayed"));
  }
  const size_t size = static_cast<size_t>(st.st_size);
  if (size < sizeof(kMagic)) {
    return absl::DataLossError(absl::StrCat("journal ", path, ": ", size,
                                            " bytes, shorter than its magic"));
  }
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  if (map == MAP_FAILED) return Errno("cannot map", path);
  absl::Cleanup unmap = [map, size] { ::munmap(map, size); };
  const uint8_t* data = static_cast<const uint8_t*>(map);
  if (std::memcmp(data, kMagic, sizeof(kMagic)) != 0) {
    return absl::DataLossError(
        absl::StrCat("journal ", path, ": bad magic (not a kvtier journal)"));
  }

  JournalContents out;
  out.file_bytes = size;
  size_t pos = sizeof(kMagic);
  uint8_t type = 0;
  Cursor payload(nullptr, 0);
  std::string why;
  if (NextRecord(data, size, &pos, &type, &payload, &why) !=
          NextStatus::kRecord ||
      type != kHeader) {
    return absl::DataLossError(
        absl::StrCat("journal ", path, ": no readable header",
                     why.empty() ? "" : absl::StrCat(" (", why, ")")));
  }
  if (absl::Status s = DecodeHeader(payload, &out.header); !s.ok()) {
    return absl::DataLossError(
        absl::StrCat("journal ", path, ": ", s.message()));
  }
  out.hash_bytes = HashBytes(out.header.layout.hash_kind());
  out.ranks = StoredRanks(out.header.layout);
  out.records = 1;
  out.valid_bytes = pos;
  ReplayModel model(out.header, out.hash_bytes, out.ranks, size);
  // Every node came with at least a hash and a row in some record.
  model.Reserve(std::min<uint64_t>(out.ranks * out.header.page_rows,
                                   size / (out.hash_bytes + 4)));
  for (;;) {
    const size_t at = pos;
    const NextStatus next = NextRecord(data, size, &pos, &type, &payload, &why);
    if (next == NextStatus::kEnd) break;
    if (next != NextStatus::kRecord) {
      out.corrupt = next == NextStatus::kCorrupt;
      out.stopped = why;
      break;
    }
    // A record whose CRC matches was written whole: a bad field in it is
    // corruption wherever it is (no crash writes one).
    if (absl::Status s = model.Apply(type, payload); !s.ok()) {
      out.corrupt = true;
      out.stopped =
          absl::StrCat("corrupt record at offset ", at, ": ", s.message());
      break;
    }
    ++out.records;
    out.valid_bytes = pos;
  }
  model.Export(&out);
  return out;
}

absl::StatusOr<uint64_t> RestoreIndex(const JournalContents& contents,
                                      PrefixIndex* index) {
  const size_t n = contents.keys.size();
  const uint32_t ranks = contents.ranks;
  const bool hybrid = !contents.snapshot_rows.empty();
  uint64_t restored = 0;
  std::vector<bool> included(n), has_child(n), inserted(n);
  std::vector<uint32_t> leaves, path, rows, snaps;
  std::vector<HashKey> hashes;
  std::vector<PrefixIndex::SnapshotPlacement> placements;
  index->ReserveNodes(n);
  for (uint32_t r = 0; r < ranks; ++r) {
    std::fill(has_child.begin(), has_child.end(), false);
    std::fill(inserted.begin(), inserted.end(), false);
    rows.clear();
    snaps.clear();
    for (size_t i = 0; i < n; ++i) {
      const uint32_t p = contents.parents[i];
      included[i] = contents.page_rows[i * ranks + r] != kNoRow &&
                    (p == kNoNode || included[p]);
      if (!included[i]) continue;
      if (p != kNoNode) has_child[p] = true;
      rows.push_back(contents.page_rows[i * ranks + r]);
      if (hybrid && contents.snapshot_rows[i * ranks + r] != kNoRow) {
        snaps.push_back(contents.snapshot_rows[i * ranks + r]);
      }
    }
    if (absl::Status s = index->ClaimPageRows(r, rows); !s.ok()) {
      return absl::InternalError(
          absl::StrCat("rank ", r, ": claiming page rows: ", s.message()));
    }
    if (absl::Status s = index->ClaimSnapshotRows(r, snaps); !s.ok()) {
      return absl::InternalError(
          absl::StrCat("rank ", r, ": claiming snapshot rows: ", s.message()));
    }
    leaves.clear();
    for (size_t i = 0; i < n; ++i) {
      if (included[i] && !has_child[i])
        leaves.push_back(static_cast<uint32_t>(i));
    }
    // Least recent first: each commit is more recent than the one before.
    std::stable_sort(leaves.begin(), leaves.end(), [&](uint32_t a, uint32_t b) {
      return contents.seq[a] < contents.seq[b];
    });
    for (uint32_t leaf : leaves) {
      path.clear();
      uint32_t x = leaf;
      while (x != kNoNode && !inserted[x]) {
        path.push_back(x);
        x = contents.parents[x];
      }
      std::reverse(path.begin(), path.end());
      hashes.clear();
      rows.clear();
      placements.clear();
      for (uint32_t i : path) {
        hashes.push_back(contents.keys[i]);
        rows.push_back(contents.page_rows[i * ranks + r]);
        if (hybrid && contents.snapshot_rows[i * ranks + r] != kNoRow) {
          placements.push_back(
              {contents.snapshot_rows[i * ranks + r], contents.keys[i]});
        }
        inserted[i] = true;
      }
      auto result = index->Commit(r, x == kNoNode ? nullptr : &contents.keys[x],
                                  hashes, rows, placements);
      if (!result.ok()) {
        return absl::InternalError(
            absl::StrCat("rank ", r, ": restoring a path of ", path.size(),
                         " pages: ", result.status().message()));
      }
      if (result->deduplicated_pages != 0 ||
          result->deduplicated_snapshots != 0) {
        return absl::InternalError(absl::StrCat(
            "rank ", r, ": a restored path deduplicated ",
            result->deduplicated_pages, " pages (a hash held twice)"));
      }
      restored += path.size();
    }
  }
  return restored;
}

}  // namespace kvtier::daemon
