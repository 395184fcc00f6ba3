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
#include "daemon/namespace_layout.h"

namespace kvtier::daemon {
namespace {

// The file's first 8 bytes.
constexpr char kMagic[8] = {'K', 'V', 'T', 'J', 'R', 'N', 'L', '1'};
constexpr size_t kFrameBytes = 8;  // u32 length, u32 CRC.
// Larger records are corrupt: a commit of kMaxReservePages 32-byte hashes
// with rows is about 36 MiB.
constexpr uint32_t kMaxRecordBytes = 256u << 20;
// Nodes per checkpoint record.
constexpr uint32_t kNodesPerRecord = 16384;
// Write the checkpoint in pieces of about this size.
constexpr size_t kWriteChunk = 4u << 20;

enum RecordType : uint8_t {
  kHeader = 1,
  kNodes = 2,
  kReserve = 3,
  kCommit = 4,
  kDrop = 5,
};

// ------------------------------------------------------------- CRC-32C --

struct Crc32cTables {
  uint32_t t[8][256];
  constexpr Crc32cTables() : t() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0x82f63b78u & (0u - (c & 1)));
      t[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; ++i) {
      for (int s = 1; s < 8; ++s)
        t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xff];
    }
  }
};
constexpr Crc32cTables kCrc;

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

// Bounds-checked reads from one record's payload. Any read past the end
// marks the cursor failed and yields zeros.
class Cursor {
 public:
  Cursor(const uint8_t* p, size_t n) : p_(p), n_(n) {}
  bool ok() const { return ok_; }
  bool done() const { return n_ == 0; }
  size_t left() const { return n_; }
  uint8_t U8() {
    uint8_t v = 0;
    Read(&v, 1);
    return v;
  }
  uint32_t U32() {
    uint32_t v = 0;
    Read(&v, 4);
    return v;
  }
  uint64_t U64() {
    uint64_t v = 0;
    Read(&v, 8);
    return v;
  }
  std::string String(size_t max_bytes) {
    const uint32_t n = U32();
    if (n > max_bytes || n > n_) {
      ok_ = false;
      return "";
    }
    std::string s(reinterpret_cast<const char*>(p_), n);
    p_ += n;
    n_ -= n;
    return s;
  }
  HashKey Hash(uint32_t hash_bytes) {
    HashKey k;
    Read(k.bytes.data(), hash_bytes);
    return k;
  }

 private:
  void Read(void* dst, size_t n) {
    if (!ok_ || n > n_) {
      ok_ = false;
      return;
    }
    std::memcpy(dst, p_, n);
    p_ += n;
    n_ -= n;
  }
  const uint8_t* p_;
  size_t n_;
  bool ok_ = true;
};

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

absl::Status DecodeHeader(Cursor& c, JournalHeader* h) {
  h->name = c.String(kMaxNamespaceName);
  const std::string layout = c.String(1 << 20);
  if (!c.ok()) return absl::DataLossError("header: truncated name or layout");
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
  const uint32_t segments = c.U32();
  if (!c.ok() || segments > 4096) {
    return absl::DataLossError("header: truncated sizes or segment count");
  }
  for (uint32_t i = 0; i < segments; ++i) {
    JournalSegment s;
    s.bank = c.String(64);
    s.rank = c.U32();
    s.path = c.String(4096);
    s.created_unix_ns = c.U64();
    if (!c.ok()) {
      return absl::DataLossError(
          absl::StrCat("header.segments[", i, "]: truncated"));
    }
    h->segments.push_back(std::move(s));
  }
  if (h->page_rows == 0 || h->page_rows >= kNoRow ||
      h->snapshot_rows >= kNoRow) {
    return absl::DataLossError(absl::StrCat("header: bank rows ", h->page_rows,
                                            " / ", h->snapshot_rows,
                                            " out of range"));
  }
  if ((h->snapshot_rows > 0) != (h->layout.snapshot_row_bytes() > 0)) {
    return absl::DataLossError(
        "header: snapshot_rows disagrees with layout.snapshot_row_bytes");
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
  ReplayModel(const JournalHeader& h, uint32_t hash_bytes, uint32_t ranks)
      : hash_bytes_(hash_bytes),
        ranks_(ranks),
        hybrid_(h.snapshot_rows > 0),
        page_rows_(h.page_rows),
        snapshot_rows_(h.snapshot_rows),
        by_key_(0, KeyHash{hash_bytes}, KeyEq{}),
        page_owner_(ranks * h.page_rows, kNoNode),
        snapshot_owner_(ranks * h.snapshot_rows, kNoNode) {}

  // Each Apply validates the whole payload before changing anything and
  // returns DATA_LOSS for a malformed one.
  absl::Status Apply(uint8_t type, Cursor& c) {
    ++seq_;
    switch (type) {
      case kNodes:
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
  uint32_t& PageOwner(uint32_t rank, uint32_t row) {
    return page_owner_[uint64_t{rank} * page_rows_ + row];
  }
  uint32_t& SnapshotOwner(uint32_t rank, uint32_t row) {
    return snapshot_owner_[uint64_t{rank} * snapshot_rows_ + row];
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
      if (row != kNoRow) SnapshotOwner(r, row) = kNoNode;
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
    if (row != kNoRow) PageOwner(rank, row) = kNoNode;
    row = kNoRow;
    ClearSnapshotRow(id, rank);
    for (uint32_t r = 0; r < ranks_; ++r) {
      if (PageRow(id, r) != kNoRow) return;
    }
    RemoveSubtree(id);
  }

  void ClearSnapshotRow(uint32_t id, uint32_t rank) {
    uint32_t& row = SnapshotRow(id, rank);
    if (row != kNoRow) SnapshotOwner(rank, row) = kNoNode;
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
        if (row != kNoRow) PageOwner(r, row) = kNoNode;
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
    const uint32_t count = c.U32();
    if (!c.ok() || count > kNodesPerRecord) {
      return absl::DataLossError("nodes: bad count");
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
      for (uint32_t r = 0; r < ranks_; ++r) {
        const uint32_t row = pages[uint64_t{i} * ranks_ + r];
        if (row != kNoRow && PageOwner(r, row) == kNoNode) {
          PageOwner(r, row) = id;
          PageRow(id, r) = row;
        }
        const uint32_t snap =
            hybrid_ ? snaps[uint64_t{i} * ranks_ + r] : kNoRow;
        if (snap != kNoRow && SnapshotOwner(r, snap) == kNoNode) {
          SnapshotOwner(r, snap) = id;
          SnapshotRow(id, r) = snap;
        }
      }
      checkpoint_ids_.push_back(id);
    }
    return absl::OkStatus();
  }

  absl::Status ReadRows(Cursor& c, bool snapshot, std::vector<uint32_t>* rows) {
    const uint32_t n = c.U32();
    if (!c.ok() || n > c.left() / 4) {
      return absl::DataLossError("rows: bad count");
    }
    rows->resize(n);
    for (uint32_t i = 0; i < n; ++i) {
      const uint32_t row = c.U32();
      if (snapshot ? !SnapshotRowOk(row) : !PageRowOk(row)) {
        return absl::DataLossError(absl::StrCat(snapshot ? "snapshot" : "page",
                                                " row ", row, " out of range"));
      }
      (*rows)[i] = row;
    }
    return absl::OkStatus();
  }

  absl::Status ApplyReserve(Cursor& c) {
    const uint32_t rank = c.U32();
    if (!c.ok() || rank >= ranks_) return absl::DataLossError("reserve: rank");
    std::vector<uint32_t> pages, snaps;
    if (absl::Status s = ReadRows(c, false, &pages); !s.ok()) return s;
    if (absl::Status s = ReadRows(c, true, &snaps); !s.ok()) return s;
    if (!c.ok() || !c.done()) return absl::DataLossError("reserve: truncated");
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
    if (!c.ok() || rank >= ranks_) return absl::DataLossError("commit: rank");
    struct Entry {
      HashKey key;
      uint32_t row;
    };
    auto read_entries = [&](bool snapshot, std::vector<Entry>* out) {
      const uint32_t n = c.U32();
      if (!c.ok() || n > c.left() / (hash_bytes_ + 4)) {
        return absl::DataLossError("commit: bad count");
      }
      out->resize(n);
      for (uint32_t i = 0; i < n; ++i) {
        (*out)[i].key = c.Hash(hash_bytes_);
        const uint32_t row = c.U32();
        if (row != kNoRow &&
            (snapshot ? !SnapshotRowOk(row) : !PageRowOk(row))) {
          return absl::DataLossError(
              absl::StrCat("commit: ", snapshot ? "snapshot" : "page", " row ",
                           row, " out of range"));
        }
        (*out)[i].row = row;
      }
      return absl::OkStatus();
    };
    std::vector<Entry> pages, snaps;
    if (absl::Status s = read_entries(false, &pages); !s.ok()) return s;
    if (absl::Status s = read_entries(true, &snaps); !s.ok()) return s;
    if (!c.ok() || !c.done()) return absl::DataLossError("commit: truncated");

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
        if (row != kNoRow && row != e.row) PageOwner(rank, row) = kNoNode;
        row = e.row;
        PageOwner(rank, e.row) = id;
      }
      nodes_[id].seq = seq_;
      prev = id;
    }
    for (const Entry& e : snaps) {
      if (e.row == kNoRow) continue;
      const uint32_t id = Find(e.key);
      if (id == kNoNode || PageRow(id, rank) == kNoRow) continue;
      uint32_t& row = SnapshotRow(id, rank);
      if (row != kNoRow && row != e.row) SnapshotOwner(rank, row) = kNoNode;
      row = e.row;
      SnapshotOwner(rank, e.row) = id;
    }
    return absl::OkStatus();
  }

  absl::Status ApplyDrop(Cursor& c) {
    const HashKey key = c.Hash(hash_bytes_);
    if (!c.ok() || !c.done()) return absl::DataLossError("drop: truncated");
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
  std::vector<uint32_t> page_owner_;      // [rank * page_rows + row]
  std::vector<uint32_t> snapshot_owner_;  // [rank * snapshot_rows + row]
  std::vector<uint32_t> checkpoint_ids_;  // Checkpoint ordinal -> id.
  uint64_t seq_ = 0;
  uint64_t inconsistent_ = 0;
};

}  // namespace

uint32_t Crc32c(const void* data, size_t n, uint32_t crc) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  uint32_t c = ~crc;
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    w ^= c;
    c = kCrc.t[7][w & 0xff] ^ kCrc.t[6][(w >> 8) & 0xff] ^
        kCrc.t[5][(w >> 16) & 0xff] ^ kCrc.t[4][(w >> 24) & 0xff] ^
        kCrc.t[3][(w >> 32) & 0xff] ^ kCrc.t[2][(w >> 40) & 0xff] ^
        kCrc.t[1][(w >> 48) & 0xff] ^ kCrc.t[0][w >> 56];
    p += 8;
    n -= 8;
  }
  while (n-- > 0) c = (c >> 8) ^ kCrc.t[0][(c ^ *p++) & 0xff];
  return ~c;
}

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
  PutU32(&payload_, rank);
  PutU32(&payload_, static_cast<uint32_t>(page_rows.size()));
  for (uint32_t row : page_rows) PutU32(&payload_, row);
  PutU32(&payload_, static_cast<uint32_t>(snapshot_rows.size()));
  for (uint32_t row : snapshot_rows) PutU32(&payload_, row);
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
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) {
      return absl::NotFoundError(absl::StrCat("journal: no file ", path));
    }
    return Errno("cannot open", path);
  }
  absl::Cleanup close_fd = [fd] { ::close(fd); };
  struct stat st;
  if (::fstat(fd, &st) != 0) return Errno("cannot stat", path);
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
  // Returns the next record's type and payload, or an empty optional with
  // `why` set when the file ends (why empty) or the record is torn.
  std::string why;
  auto next = [&](uint8_t* type, Cursor* payload) -> bool {
    why.clear();
    if (pos == size) return false;
    if (size - pos < kFrameBytes + 1) {
      why = absl::StrCat("torn record frame at offset ", pos);
      return false;
    }
    uint32_t length, crc;
    std::memcpy(&length, data + pos, 4);
    std::memcpy(&crc, data + pos + 4, 4);
    if (length == 0 || length > kMaxRecordBytes ||
        length > size - pos - kFrameBytes) {
      why = absl::StrCat("torn record at offset ", pos, " (length ", length,
                         ", ", size - pos - kFrameBytes, " bytes left)");
      return false;
    }
    const uint8_t* body = data + pos + kFrameBytes;
    if (Crc32c(body, length) != crc) {
      why = absl::StrCat("CRC mismatch in the record at offset ", pos);
      return false;
    }
    *type = body[0];
    *payload = Cursor(body + 1, length - 1);
    pos += kFrameBytes + length;
    return true;
  };

  uint8_t type = 0;
  Cursor payload(nullptr, 0);
  if (!next(&type, &payload) || type != kHeader) {
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
  ReplayModel model(out.header, out.hash_bytes, out.ranks);
  // Every node came with at least a hash and a row in some record.
  model.Reserve(std::min<uint64_t>(out.ranks * out.header.page_rows,
                                   size / (out.hash_bytes + 4)));
  for (;;) {
    const size_t at = pos;
    if (!next(&type, &payload)) {
      out.stopped = why;
      break;
    }
    if (absl::Status s = model.Apply(type, payload); !s.ok()) {
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
