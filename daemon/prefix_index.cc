// PrefixIndex: the per-namespace prefix tree and its eviction helpers; row
// allocation is in prefix_index_alloc.cc.
#include "daemon/prefix_index.h"

#include <algorithm>
#include <cstring>
#include <queue>
#include <string>
#include <tuple>

#include "absl/base/optimization.h"
#include "absl/container/flat_hash_map.h"
#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace kvtier::daemon {
namespace {

// A redundancy check giving up after this many descendants says "needed".
constexpr size_t kRedundancyVisits = 4096;

const char* StateName(uint8_t state) {
  switch (state) {
    case 0:
      return "free";
    case 1:
      return "allocated-uncommitted";
    case 2:
      return "committed";
    default:
      return "corrupt";
  }
}

absl::string_view View(const HashKey& key, uint32_t bytes) {
  return absl::string_view(reinterpret_cast<const char*>(key.bytes.data()),
                           bytes);
}

}  // namespace

// ------------------------------------------------------------ functors --

size_t PrefixIndex::NodeHash::operator()(const HashKey& key) const {
  // Keys come from clients: a per-process seeded hash over the whole key keeps
  // crafted keys from colliding on purpose.
  return absl::Hash<absl::string_view>{}(View(key, index->hash_bytes_));
}
size_t PrefixIndex::NodeHash::operator()(uint32_t id) const {
  return (*this)(index->N(id).key);
}
bool PrefixIndex::NodeEq::operator()(uint32_t a, uint32_t b) const {
  return a == b;
}
bool PrefixIndex::NodeEq::operator()(uint32_t a, const HashKey& b) const {
  return index->KeyEquals(index->N(a).key, b);
}
bool PrefixIndex::NodeEq::operator()(const HashKey& a, uint32_t b) const {
  return index->KeyEquals(a, index->N(b).key);
}

// ------------------------------------------------------- construction --

absl::StatusOr<std::unique_ptr<PrefixIndex>> PrefixIndex::Create(
    const IndexConfig& config) {
  if (config.hash_bytes != 16 && config.hash_bytes != 32) {
    return absl::InvalidArgumentError(
        absl::StrCat("hash_bytes: must be 16 or 32, got ", config.hash_bytes));
  }
  if (config.tokens_per_page == 0) {
    return absl::InvalidArgumentError("tokens_per_page: must be positive");
  }
  if (config.tp_size == 0 || config.tp_size > 255) {
    return absl::InvalidArgumentError(
        absl::StrCat("tp_size: must be 1..255, got ", config.tp_size));
  }
  if (config.page_rows == 0 || config.page_rows >= kNoRow) {
    return absl::InvalidArgumentError(absl::StrCat(
        "page_rows: must be 1..", kNoRow - 1, ", got ", config.page_rows));
  }
  if (config.snapshot_rows >= kNoRow) {
    return absl::InvalidArgumentError(absl::StrCat(
        "snapshot_rows: at most ", kNoRow - 1, ", got ", config.snapshot_rows));
  }
  return std::unique_ptr<PrefixIndex>(new PrefixIndex(config));
}

PrefixIndex::PrefixIndex(const IndexConfig& config)
    : hash_bytes_(config.hash_bytes),
      tokens_per_page_(config.tokens_per_page),
      tp_size_(config.tp_size),
      ranks_(config.replicated ? 1 : config.tp_size),
      hybrid_(config.snapshot_rows > 0),
      max_replay_tokens_(config.snapshot_rows > 0 ? config.max_replay_tokens
                                                  : 0),
      by_key_(0, NodeHash{this}, NodeEq{this},
              CountingAllocator<uint32_t>(&container_bytes_)),
      leaf_lru_(LruSet::key_compare(),
                LruSet::allocator_type(&container_bytes_)),
      snapshot_lru_(LruSet::key_compare(),
                    LruSet::allocator_type(&container_bytes_)),
      pinned_(0, absl::Hash<uint32_t>(), std::equal_to<>(),
              CountingAllocator<uint32_t>(&container_bytes_)) {
  // Most of the ~100 bytes per page.
  static_assert(sizeof(Node) == 80);
  InitPool(pages_, config.page_rows);
  InitPool(snapshots_, config.snapshot_rows);
}

PrefixIndex::~PrefixIndex() = default;

void PrefixIndex::InitPool(RowPool& pool, uint64_t rows_per_rank) {
  pool.rows_per_rank = rows_per_rank;
  pool.state.assign(rows_per_rank * ranks_, RowPool::kFree);
  pool.state.shrink_to_fit();
  pool.free.assign(ranks_, {});
  for (auto& stack : pool.free) {
    stack.resize(rows_per_rank);
    // Row 0 on top: allocation starts at the low rows.
    for (uint64_t i = 0; i < rows_per_rank; ++i) {
      stack[i] = static_cast<uint32_t>(rows_per_rank - 1 - i);
    }
  }
  pool.allocated.assign(ranks_, 0);
  pool.committed.assign(ranks_, 0);
}

// ------------------------------------------------------------- helpers --

HashKey PrefixIndex::Normalize(const HashKey& key) const {
  HashKey out;
  std::memcpy(out.bytes.data(), key.bytes.data(), hash_bytes_);
  return out;
}

uint32_t PrefixIndex::FindNode(const HashKey& key) const {
  auto it = by_key_.find(key);
  return it == by_key_.end() ? kNoNode : *it;
}

void PrefixIndex::Tick() {
  ++tick_;
  now_ms_ = absl::ToUnixMillis(absl::Now());
}

absl::Status PrefixIndex::ValidateRank(uint32_t rank) const {
  if (rank >= ranks_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank: ", rank, " is not below the ", ranks_, " stored rank(s)",
        ranks_ == 1 && tp_size_ > 1 ? " (replicated: only rank 0 stores rows)"
                                    : ""));
  }
  return absl::OkStatus();
}

std::vector<uint32_t> PrefixIndex::TakeRows(RowPool& pool, uint32_t rank,
                                            uint32_t n) {
  std::vector<uint32_t>& stack = pool.free[rank];
  std::vector<uint32_t> out(stack.end() - n, stack.end());
  std::reverse(out.begin(), out.end());
  stack.resize(stack.size() - n);
  for (uint32_t row : out) {
    pool.state[rank * pool.rows_per_rank + row] = RowPool::kAllocated;
  }
  pool.allocated[rank] += n;
  return out;
}

absl::Status PrefixIndex::FreeRows(RowPool& pool, uint32_t rank,
                                   absl::Span<const uint32_t> rows,
                                   const char* bank) {
  uint8_t* state = pool.state.data() + rank * pool.rows_per_rank;
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rows[i] >= pool.rows_per_rank) {
      return absl::InvalidArgumentError(
          absl::StrCat("rows[", i, "]: ", bank, " row ", rows[i],
                       " is out of range (", pool.rows_per_rank, " rows)"));
    }
    if (state[rows[i]] != RowPool::kAllocated) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rows[", i, "]: ", bank, " row ", rows[i], " of rank ", rank, " is ",
          StateName(state[rows[i]]), ", not allocated-uncommitted"));
    }
  }
  // Marks as we go; a row already marked is listed twice.
  for (size_t i = 0; i < rows.size(); ++i) {
    if (state[rows[i]] == RowPool::kFree) {
      for (size_t j = 0; j < i; ++j) state[rows[j]] = RowPool::kAllocated;
      return absl::InvalidArgumentError(absl::StrCat(
          "rows[", i, "]: ", bank, " row ", rows[i], " is listed twice"));
    }
    state[rows[i]] = RowPool::kFree;
  }
  pool.free[rank].insert(pool.free[rank].end(), rows.begin(), rows.end());
  pool.allocated[rank] -= rows.size();
  return absl::OkStatus();
}

absl::Status PrefixIndex::ClaimRows(RowPool& pool, uint32_t rank,
                                    absl::Span<const uint32_t> rows,
                                    const char* bank) {
  uint8_t* state = pool.state.data() + rank * pool.rows_per_rank;
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rows[i] >= pool.rows_per_rank) {
      return absl::InvalidArgumentError(
          absl::StrCat("rows[", i, "]: ", bank, " row ", rows[i],
                       " is out of range (", pool.rows_per_rank, " rows)"));
    }
    if (state[rows[i]] != RowPool::kFree) {
      return absl::InvalidArgumentError(
          absl::StrCat("rows[", i, "]: ", bank, " row ", rows[i], " of rank ",
                       rank, " is ", StateName(state[rows[i]]), ", not free"));
    }
  }
  // Marks as we go; a row already marked is listed twice.
  for (size_t i = 0; i < rows.size(); ++i) {
    if (state[rows[i]] == RowPool::kAllocated) {
      for (size_t j = 0; j < i; ++j) state[rows[j]] = RowPool::kFree;
      return absl::InvalidArgumentError(absl::StrCat(
          "rows[", i, "]: ", bank, " row ", rows[i], " is listed twice"));
    }
    state[rows[i]] = RowPool::kAllocated;
  }
  // One pass over the free stack drops every claimed row, keeping the order.
  std::vector<uint32_t>& stack = pool.free[rank];
  stack.erase(std::remove_if(stack.begin(), stack.end(),
                             [state](uint32_t row) {
                               return state[row] != RowPool::kFree;
                             }),
              stack.end());
  pool.allocated[rank] += rows.size();
  return absl::OkStatus();
}

void PrefixIndex::CommitRow(RowPool& pool, uint32_t rank, uint32_t row) {
  pool.state[rank * pool.rows_per_rank + row] = RowPool::kCommitted;
  --pool.allocated[rank];
  ++pool.committed[rank];
}

void PrefixIndex::ReturnAllocated(RowPool& pool, uint32_t rank, uint32_t row) {
  pool.state[rank * pool.rows_per_rank + row] = RowPool::kFree;
  pool.free[rank].push_back(row);
  --pool.allocated[rank];
}

void PrefixIndex::ReleaseCommitted(RowPool& pool, uint32_t rank, uint32_t row) {
  pool.state[rank * pool.rows_per_rank + row] = RowPool::kFree;
  pool.free[rank].push_back(row);
  --pool.committed[rank];
}

uint32_t PrefixIndex::NewNode(const HashKey& key, uint32_t parent,
                              uint32_t rank, uint32_t row) {
  uint32_t id;
  if (free_nodes_ != kNoNode) {
    id = free_nodes_;
    free_nodes_ = N(id).next_sibling;
  } else {
    if ((next_unused_ >> kChunkBits) == chunks_.size()) {
      Chunk chunk;
      chunk.nodes = std::make_unique<Node[]>(kChunkNodes);
      chunk.page_rows = std::make_unique<uint32_t[]>(kChunkNodes * ranks_);
      std::fill_n(chunk.page_rows.get(), kChunkNodes * ranks_, kNoRow);
      if (hybrid_) {
        chunk.snapshot_rows =
            std::make_unique<uint32_t[]>(kChunkNodes * ranks_);
        std::fill_n(chunk.snapshot_rows.get(), kChunkNodes * ranks_, kNoRow);
      }
      chunks_.push_back(std::move(chunk));
    }
    id = next_unused_++;
  }
  Node& n = N(id);
  n.key = Normalize(key);
  n.tick = tick_;
  n.unix_ms = now_ms_;
  n.parent = parent;
  n.first_child = kNoNode;
  n.next_sibling = kNoNode;
  n.prev_sibling = kNoNode;
  n.depth = parent == kNoNode ? 0 : N(parent).depth + 1;
  n.pins = 0;
  n.page_ranks = 1;
  n.snapshot_ranks = 0;
  PageRow(id, rank) = row;
  if (parent != kNoNode) {
    Node& p = N(parent);
    if (p.first_child == kNoNode) {
      --leaves_;
      if (InLeafSet(p)) leaf_lru_.erase({p.tick, parent});
    } else {
      N(p.first_child).prev_sibling = id;
    }
    n.next_sibling = p.first_child;
    p.first_child = id;
  }
  by_key_.insert(id);
  leaf_lru_.insert({n.tick, id});
  ++nodes_;
  ++leaves_;
  return id;
}

void PrefixIndex::SetRecency(uint32_t id, uint64_t tick, int64_t unix_ms) {
  Node& n = N(id);
  if (n.tick != tick) {
    if (InLeafSet(n)) {
      leaf_lru_.erase({n.tick, id});
      leaf_lru_.insert({tick, id});
    }
    if (InSnapshotSet(n)) {
      snapshot_lru_.erase({n.tick, id});
      snapshot_lru_.insert({tick, id});
    }
    n.tick = tick;
  }
  n.unix_ms = unix_ms;
}

void PrefixIndex::RemoveSnapshot(uint32_t id) {
  Node& n = N(id);
  if (n.snapshot_ranks == 0) return;
  if (InSnapshotSet(n)) snapshot_lru_.erase({n.tick, id});
  for (uint32_t r = 0; r < ranks_; ++r) {
    uint32_t& row = SnapshotRow(id, r);
    if (row != kNoRow) {
      ReleaseCommitted(snapshots_, r, row);
      row = kNoRow;
    }
  }
  n.snapshot_ranks = 0;
  --snapshot_nodes_;
}

void PrefixIndex::RemoveLeaf(uint32_t id) {
  Node& n = N(id);
  if (InLeafSet(n)) leaf_lru_.erase({n.tick, id});
  RemoveSnapshot(id);
  for (uint32_t r = 0; r < ranks_; ++r) {
    uint32_t& row = PageRow(id, r);
    if (row != kNoRow) {
      ReleaseCommitted(pages_, r, row);
      row = kNoRow;
    }
  }
  by_key_.erase(id);  // Hashes through the key: before the node is reused.
  const uint32_t parent = n.parent;
  if (parent != kNoNode) {
    Node& p = N(parent);
    const bool last_child = p.first_child == id && n.next_sibling == kNoNode;
    // An ancestor is as recent as its most recent descendant (Lookup touches
    // only the deepest node): it inherits the leaf's recency.
    if (last_child && n.tick > p.tick) SetRecency(parent, n.tick, n.unix_ms);
    if (n.prev_sibling != kNoNode) {
      N(n.prev_sibling).next_sibling = n.next_sibling;
    } else {
      p.first_child = n.next_sibling;
    }
    if (n.next_sibling != kNoNode) {
      N(n.next_sibling).prev_sibling = n.prev_sibling;
    }
    if (last_child) {
      ++leaves_;
      if (InLeafSet(p)) leaf_lru_.insert({p.tick, parent});
    }
  }
  --nodes_;
  --leaves_;
  n.page_ranks = 0;
  n.pins = 0;
  n.parent = kNoNode;
  n.first_child = kNoNode;
  n.prev_sibling = kNoNode;
  n.next_sibling = free_nodes_;
  free_nodes_ = id;
}

void PrefixIndex::EvictLeaf(uint32_t id) {
  ++evicted_pages_;
  if (N(id).snapshot_ranks != 0) ++evicted_snapshots_;
  RemoveLeaf(id);
}

void PrefixIndex::EvictSnapshot(uint32_t id) {
  ++evicted_snapshots_;
  RemoveSnapshot(id);
}

bool PrefixIndex::SnapshotRedundant(uint32_t id) const {
  const uint64_t limit = max_replay_tokens_;
  const Node& n = N(id);
  const uint64_t pn = Position(n);
  // Nearest ancestor snapshot; stop once even it would leave too long a
  // replay up to n (a snapshot further up is further away).
  uint64_t pa = 0;
  for (uint32_t a = n.parent; a != kNoNode; a = N(a).parent) {
    const Node& an = N(a);
    if (SnapshotComplete(an)) {
      pa = Position(an);
      break;
    }
    if (pn - Position(an) >= limit) return false;
  }
  if (pn - pa > limit) return false;
  // Every downward path must reach a snapshot or its end within the limit.
  std::vector<uint32_t> stack;
  for (uint32_t c = n.first_child; c != kNoNode; c = N(c).next_sibling) {
    stack.push_back(c);
  }
  size_t visits = 0;
  while (!stack.empty()) {
    const uint32_t c = stack.back();
    stack.pop_back();
    if (++visits > kRedundancyVisits) return false;
    const Node& cn = N(c);
    if (Position(cn) - pa > limit) return false;
    if (SnapshotComplete(cn)) continue;
    for (uint32_t g = cn.first_child; g != kNoNode; g = N(g).next_sibling) {
      stack.push_back(g);
    }
  }
  return true;
}

// ---------------------------------------------------------- allocation --

// AllocateRows, AllocatePageRows and AllocateSnapshotRows:
// prefix_index_alloc.cc.

absl::Status PrefixIndex::FreePageRows(uint32_t rank,
                                       absl::Span<const uint32_t> rows) {
  if (absl::Status s = ValidateRank(rank); !s.ok()) return s;
  return FreeRows(pages_, rank, rows, "page");
}

absl::Status PrefixIndex::FreeSnapshotRows(uint32_t rank,
                                           absl::Span<const uint32_t> rows) {
  if (absl::Status s = ValidateRank(rank); !s.ok()) return s;
  return FreeRows(snapshots_, rank, rows, "snapshot");
}

absl::Status PrefixIndex::ClaimPageRows(uint32_t rank,
                                        absl::Span<const uint32_t> rows) {
  if (absl::Status s = ValidateRank(rank); !s.ok()) return s;
  return ClaimRows(pages_, rank, rows, "page");
}

absl::Status PrefixIndex::ClaimSnapshotRows(uint32_t rank,
                                            absl::Span<const uint32_t> rows) {
  if (rows.empty()) return absl::OkStatus();
  if (!hybrid_) {
    return absl::FailedPreconditionError(
        "snapshot rows: the namespace is not hybrid (snapshot_rows is 0)");
  }
  if (absl::Status s = ValidateRank(rank); !s.ok()) return s;
  return ClaimRows(snapshots_, rank, rows, "snapshot");
}

void PrefixIndex::ReserveNodes(size_t nodes) { by_key_.reserve(nodes); }

// -------------------------------------------------------------- lookup --

PrefixIndex::LookupResult PrefixIndex::Lookup(absl::Span<const HashKey> hashes,
                                              uint32_t rank) {
  LookupResult result = Find(hashes, rank);
  if (result.touch_node != kNoNode) Touch(result.touch_node);
  return result;
}

void PrefixIndex::Touch(uint32_t node) {
  if (!IsLive(node)) return;
  Tick();
  SetRecency(node, tick_, now_ms_);
}

bool PrefixIndex::NodeHasKey(uint32_t node, const HashKey& key) const {
  return IsLive(node) && KeyEquals(N(node).key, key);
}

PrefixIndex::LookupResult PrefixIndex::Find(absl::Span<const HashKey> hashes,
                                            uint32_t rank) const {
  LookupResult result;
  if (rank >= tp_size_ || hashes.empty()) return result;
  const uint32_t r = ranks_ == 1 ? 0 : rank;
  const size_t n = std::min<size_t>(hashes.size(), kNoNode - 1);

  // Node of page k-1 when pages [0, k) are all present and complete, under
  // prefix-closure (verified below).
  auto probe = [&](size_t k) -> uint32_t {
    const uint32_t id = FindNode(hashes[k - 1]);
    if (id == kNoNode) return kNoNode;
    const Node& node = N(id);
    return Complete(node) && node.depth == k - 1 ? id : kNoNode;
  };
  size_t matched = 0;
  uint32_t deepest = kNoNode;
  if (uint32_t id = probe(n); id != kNoNode) {
    matched = n;
    deepest = id;
  } else {
    size_t lo = 0, hi = n - 1;
    while (lo < hi) {
      const size_t mid = lo + (hi - lo + 1) / 2;
      if (uint32_t id = probe(mid); id != kNoNode) {
        lo = mid;
        deepest = id;
      } else {
        hi = mid - 1;
      }
    }
    matched = lo;
  }

  // One walk up: collects rows, finds the deepest complete snapshot and checks
  // that node i's key is hashes[i].
  result.rows.resize(matched);
  uint32_t snapshot_node = kNoNode;
  bool verified = true;
  uint32_t id = deepest;
  for (size_t i = matched; i-- > 0;) {
    if (id == kNoNode || !KeyEquals(N(id).key, hashes[i])) {
      verified = false;
      break;
    }
    const Node& node = N(id);
    result.rows[i] = PageRow(id, r);
    if (hybrid_ && snapshot_node == kNoNode && SnapshotComplete(node)) {
      snapshot_node = id;
    }
    // Chains committed at once sit at consecutive ids. Guessing id - 1 and
    // correcting on a branch (kept a branch by the empty asm) breaks the
    // load-to-load dependency through `parent`: the next node's loads start
    // before this one's parent field arrives.
    uint32_t next = id - 1;
    if (ABSL_PREDICT_FALSE(node.parent != next)) {
      asm volatile("");
      next = node.parent;
    }
    id = next;
  }
  if (verified && id != kNoNode) verified = false;
  if (!verified) {
    // The chain disagrees with the tree: scan it page by page.
    result.rows.clear();
    snapshot_node = kNoNode;
    matched = 0;
    deepest = kNoNode;
    for (size_t i = 0; i < n; ++i) {
      const uint32_t c = FindNode(hashes[i]);
      if (c == kNoNode) break;
      const Node& node = N(c);
      if (node.parent != deepest || !Complete(node)) break;
      result.rows.push_back(PageRow(c, r));
      if (hybrid_ && SnapshotComplete(node)) snapshot_node = c;
      deepest = c;
      matched = i + 1;
    }
  }

  result.matched_pages = static_cast<uint32_t>(matched);
  if (hybrid_) {
    if (snapshot_node != kNoNode) {
      result.usable_pages = N(snapshot_node).depth + 1;
      result.has_snapshot = true;
      result.snapshot_row = SnapshotRow(snapshot_node, r);
      result.pin_node = snapshot_node;
    }
    result.rows.resize(result.usable_pages);
  } else {
    result.usable_pages = result.matched_pages;
    result.pin_node = deepest;
  }
  result.touch_node = result.pin_node != kNoNode ? result.pin_node : deepest;
  return result;
}

// -------------------------------------------------------------- commit --

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
  const uint8_t* page_state = pages_.state.data() + rank * pages_.rows_per_rank;
  absl::flat_hash_set<uint32_t> seen_rows;
  seen_rows.reserve(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rows[i] >= pages_.rows_per_rank) {
      return absl::InvalidArgumentError(
          absl::StrCat("rows[", i, "]: page row ", rows[i],
                       " is out of range (", pages_.rows_per_rank, " rows)"));
    }
    if (page_state[rows[i]] != RowPool::kAllocated) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rows[", i, "]: page row ", rows[i], " of rank ", rank, " is ",
          StateName(page_state[rows[i]]), ", not allocated-uncommitted"));
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
    auto [it, inserted] = position.try_emplace(View(hashes[i], hash_bytes_),
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
    nodes[i] = id;
    expected = id;
  }
  // Snapshot targets: an index into `hashes`, or an existing node.
  constexpr uint32_t kInCommit = 0x80000000;
  std::vector<uint32_t> targets(snapshots.size());
  const uint8_t* snap_state =
      snapshots_.state.data() + rank * snapshots_.rows_per_rank;
  absl::flat_hash_set<uint32_t> seen_snap_rows;
  absl::flat_hash_set<absl::string_view> seen_snap_hashes;
  for (size_t j = 0; j < snapshots.size(); ++j) {
    const SnapshotPlacement& p = snapshots[j];
    if (p.row >= snapshots_.rows_per_rank) {
      return absl::InvalidArgumentError(absl::StrCat(
          "snapshots[", j, "].row: snapshot row ", p.row, " is out of range (",
          snapshots_.rows_per_rank, " rows)"));
    }
    if (snap_state[p.row] != RowPool::kAllocated) {
      return absl::InvalidArgumentError(absl::StrCat(
          "snapshots[", j, "].row: snapshot row ", p.row, " of rank ", rank,
          " is ", StateName(snap_state[p.row]), ", not allocated-uncommitted"));
    }
    if (!seen_snap_rows.insert(p.row).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "snapshots[", j, "].row: snapshot row ", p.row, " listed twice"));
    }
    if (!seen_snap_hashes.insert(View(p.hash, hash_bytes_)).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("snapshots[", j, "].hash: placed twice"));
    }
    if (auto it = position.find(View(p.hash, hash_bytes_));
        it != position.end()) {
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
      CommitRow(pages_, rank, rows[i]);
      id = NewNode(hashes[i], prev, rank, rows[i]);
      ++result.committed_pages;
    } else if (PageRow(id, rank) != kNoRow) {
      ReturnAllocated(pages_, rank, rows[i]);
      result.freed_page_rows.push_back(rows[i]);
      ++result.deduplicated_pages;
    } else {
      CommitRow(pages_, rank, rows[i]);
      PageRow(id, rank) = rows[i];
      ++N(id).page_ranks;
      ++result.committed_pages;
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
      ReturnAllocated(snapshots_, rank, row);
      result.freed_snapshot_rows.push_back(row);
      ++result.deduplicated_snapshots;
      continue;
    }
    CommitRow(snapshots_, rank, row);
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

// ---------------------------------------------------------------- pins --

void PrefixIndex::Pin(uint32_t node) {
  if (!IsLive(node)) return;
  Node& n = N(node);
  if (n.pins == 0) {
    if (InLeafSet(n)) leaf_lru_.erase({n.tick, node});
    if (InSnapshotSet(n)) snapshot_lru_.erase({n.tick, node});
    pinned_.insert(node);
  }
  ++n.pins;
}

absl::Status PrefixIndex::Unpin(uint32_t node) {
  if (!IsLive(node) || N(node).pins == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("node: ", node, " is not a pinned node"));
  }
  Node& n = N(node);
  if (--n.pins == 0) {
    pinned_.erase(node);
    if (InLeafSet(n)) leaf_lru_.insert({n.tick, node});
    if (InSnapshotSet(n)) snapshot_lru_.insert({n.tick, node});
  }
  return absl::OkStatus();
}

// ------------------------------------------------------------- removal --

absl::StatusOr<PrefixIndex::DropResult> PrefixIndex::DropSubtree(
    const HashKey& hash) {
  const uint32_t root = FindNode(hash);
  if (root == kNoNode) {
    return absl::NotFoundError("hash: not in the index");
  }
  // Pre-order: a node's descendants follow it.
  std::vector<uint32_t> order = {root};
  uint64_t pinned = 0;
  for (size_t i = 0; i < order.size(); ++i) {
    const Node& n = N(order[i]);
    if (n.pins != 0) ++pinned;
    for (uint32_t c = n.first_child; c != kNoNode; c = N(c).next_sibling) {
      order.push_back(c);
    }
  }
  if (pinned != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("hash: ", pinned, " of the subtree's ", order.size(),
                     " nodes are pinned (leases in flight)"));
  }
  DropResult result;
  for (size_t i = order.size(); i-- > 0;) {
    ++result.pages;
    if (N(order[i]).snapshot_ranks != 0) ++result.snapshots;
    RemoveLeaf(order[i]);
  }
  return result;
}

void PrefixIndex::Clear() {
  chunks_.clear();
  chunks_.shrink_to_fit();
  next_unused_ = 0;
  free_nodes_ = kNoNode;
  by_key_ = NodeSet(0, NodeHash{this}, NodeEq{this},
                    CountingAllocator<uint32_t>(&container_bytes_));
  leaf_lru_.clear();
  snapshot_lru_.clear();
  pinned_ = IdSet(0, absl::Hash<uint32_t>(), std::equal_to<>(),
                  CountingAllocator<uint32_t>(&container_bytes_));
  InitPool(pages_, pages_.rows_per_rank);
  InitPool(snapshots_, snapshots_.rows_per_rank);
  nodes_ = leaves_ = snapshot_nodes_ = 0;
}

// ------------------------------------------------------- introspection --

namespace {

std::vector<uint32_t> RowsInState(const std::vector<uint8_t>& state,
                                  uint64_t rows_per_rank, uint32_t rank,
                                  uint8_t wanted) {
  std::vector<uint32_t> out;
  const uint64_t begin = uint64_t{rank} * rows_per_rank;
  if (rows_per_rank == 0 || begin + rows_per_rank > state.size()) return out;
  for (uint64_t r = 0; r < rows_per_rank; ++r) {
    if (state[begin + r] == wanted) out.push_back(static_cast<uint32_t>(r));
  }
  return out;
}

}  // namespace

std::vector<uint32_t> PrefixIndex::AllocatedPageRows(uint32_t rank) const {
  if (rank >= ranks_) return {};
  return RowsInState(pages_.state, pages_.rows_per_rank, rank,
                     RowPool::kAllocated);
}

std::vector<uint32_t> PrefixIndex::AllocatedSnapshotRows(uint32_t rank) const {
  if (rank >= ranks_) return {};
  return RowsInState(snapshots_.state, snapshots_.rows_per_rank, rank,
                     RowPool::kAllocated);
}

PrefixIndex::Usage PrefixIndex::GetUsage() const {
  Usage u;
  u.nodes = nodes_;
  u.leaves = leaves_;
  u.evictable_leaves = leaf_lru_.size();
  u.snapshots = snapshot_nodes_;
  u.pinned_nodes = pinned_.size();
  for (uint32_t r = 0; r < ranks_; ++r) {
    u.free_page_rows.push_back(pages_.free[r].size());
    u.allocated_page_rows.push_back(pages_.allocated[r]);
    u.committed_page_rows.push_back(pages_.committed[r]);
    u.free_snapshot_rows.push_back(snapshots_.free[r].size());
    u.allocated_snapshot_rows.push_back(snapshots_.allocated[r]);
    u.committed_snapshot_rows.push_back(snapshots_.committed[r]);
  }
  u.evicted_pages = evicted_pages_;
  u.evicted_snapshots = evicted_snapshots_;
  u.spacing_violations = spacing_violations_;
  return u;
}

std::vector<PrefixIndex::PrefixInfo> PrefixIndex::ListPrefixes(
    bool by_recent, size_t limit, uint64_t* total) const {
  if (total != nullptr) *total = leaves_;
  // Pinned leaves are outside the leaf LRU.
  std::vector<std::pair<uint64_t, uint32_t>> pinned_leaves;
  for (uint32_t id : pinned_) {
    if (N(id).first_child == kNoNode) pinned_leaves.push_back({N(id).tick, id});
  }
  std::vector<uint32_t> chosen;
  if (by_recent) {
    std::sort(pinned_leaves.rbegin(), pinned_leaves.rend());
    auto a = leaf_lru_.rbegin();
    auto b = pinned_leaves.begin();
    while (chosen.size() < limit &&
           (a != leaf_lru_.rend() || b != pinned_leaves.end())) {
      if (b == pinned_leaves.end() || (a != leaf_lru_.rend() && *a > *b)) {
        chosen.push_back((a++)->second);
      } else {
        chosen.push_back((b++)->second);
      }
    }
  } else {
    // Longest first (ties: most recent first): a bounded min-heap.
    using Entry = std::tuple<uint32_t, uint64_t, uint32_t>;
    std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap;
    auto offer = [&](uint64_t tick, uint32_t id) {
      if (limit == 0) return;
      Entry e{N(id).depth, tick, id};
      if (heap.size() < limit) {
        heap.push(e);
      } else if (heap.top() < e) {
        heap.pop();
        heap.push(e);
      }
    };
    for (const auto& [tick, id] : leaf_lru_) offer(tick, id);
    for (const auto& [tick, id] : pinned_leaves) offer(tick, id);
    while (!heap.empty()) {
      chosen.push_back(std::get<2>(heap.top()));
      heap.pop();
    }
    std::reverse(chosen.begin(), chosen.end());
  }
  // Path aggregates (snapshots, pins), memoized: shared prefixes are walked
  // once.
  absl::flat_hash_map<uint32_t, std::pair<uint32_t, uint32_t>> memo;
  std::vector<uint32_t> path;
  std::vector<PrefixInfo> out;
  out.reserve(chosen.size());
  for (uint32_t leaf : chosen) {
    path.clear();
    std::pair<uint32_t, uint32_t> acc{0, 0};
    for (uint32_t a = leaf; a != kNoNode; a = N(a).parent) {
      if (auto it = memo.find(a); it != memo.end()) {
        acc = it->second;
        break;
      }
      path.push_back(a);
    }
    for (size_t i = path.size(); i-- > 0;) {
      const Node& n = N(path[i]);
      acc.first += n.snapshot_ranks != 0 ? 1 : 0;
      acc.second += n.pins;
      memo[path[i]] = acc;
    }
    const Node& n = N(leaf);
    PrefixInfo info;
    info.leaf = n.key;
    info.pages = n.depth + 1;
    info.snapshots = acc.first;
    info.last_use_tick = n.tick;
    info.last_use_unix_ms = n.unix_ms;
    info.pins = acc.second;
    out.push_back(info);
  }
  return out;
}

void PrefixIndex::ForEachNode(
    const std::function<void(const NodeView&)>& visit) const {
  // Pre-order from each first page: a parent is always visited before its
  // children, which is what a replay needs.
  std::vector<uint32_t> stack;
  for (uint32_t root = 0; root < next_unused_; ++root) {
    if (!IsLive(root) || N(root).parent != kNoNode) continue;
    stack.push_back(root);
    while (!stack.empty()) {
      const uint32_t id = stack.back();
      stack.pop_back();
      const Node& n = N(id);
      const Chunk& chunk = chunks_[id >> kChunkBits];
      const size_t slot = (id & kChunkMask) * ranks_;
      NodeView view;
      view.id = id;
      view.parent = n.parent;
      view.depth = n.depth;
      view.key = &n.key;
      view.page_rows =
          absl::MakeConstSpan(chunk.page_rows.get() + slot, ranks_);
      if (hybrid_) {
        view.snapshot_rows =
            absl::MakeConstSpan(chunk.snapshot_rows.get() + slot, ranks_);
      }
      view.last_use_tick = n.tick;
      visit(view);
      for (uint32_t c = n.first_child; c != kNoNode; c = N(c).next_sibling) {
        stack.push_back(c);
      }
    }
  }
}

absl::Status PrefixIndex::CheckInvariants() const {
  auto fail = [](auto&&... parts) {
    return absl::InternalError(absl::StrCat(parts...));
  };
  std::vector<uint32_t> page_ref(pages_.state.size(), kNoNode);
  std::vector<uint32_t> snap_ref(snapshots_.state.size(), kNoNode);
  uint64_t live = 0, childless = 0, with_snapshot = 0, in_leaf = 0, in_snap = 0,
           pinned = 0;
  for (uint32_t id = 0; id < next_unused_; ++id) {
    const Node& n = N(id);
    if (n.page_ranks == 0) continue;
    ++live;
    if (n.page_ranks > ranks_ || n.snapshot_ranks > ranks_) {
      return fail("node ", id, ": page_ranks ", n.page_ranks,
                  " / snapshot_ranks ", n.snapshot_ranks, " exceed ", ranks_);
    }
    if (FindNode(n.key) != id) {
      return fail("node ", id, ": its key does not find it in the hash set");
    }
    for (uint32_t b = hash_bytes_; b < 32; ++b) {
      if (n.key.bytes[b] != 0) {
        return fail("node ", id, ": key byte ", b, " beyond hash_bytes is set");
      }
    }
    if (n.parent == kNoNode) {
      if (n.depth != 0 || n.prev_sibling != kNoNode ||
          n.next_sibling != kNoNode) {
        return fail("node ", id, ": a first page with depth ", n.depth,
                    " or sibling links");
      }
    } else {
      if (!IsLive(n.parent)) {
        return fail("node ", id, ": parent ", n.parent, " is not live");
      }
      const Node& p = N(n.parent);
      if (n.depth != p.depth + 1) {
        return fail("node ", id, ": depth ", n.depth, " under parent depth ",
                    p.depth);
      }
      if (n.prev_sibling == kNoNode && p.first_child != id) {
        return fail("node ", id,
                    ": no previous sibling but not its parent's "
                    "first child");
      }
    }
    uint32_t prev = kNoNode;
    uint64_t children = 0;
    for (uint32_t c = n.first_child; c != kNoNode; c = N(c).next_sibling) {
      if (!IsLive(c) || N(c).parent != id || N(c).prev_sibling != prev) {
        return fail("node ", id, ": child ", c, " has inconsistent links");
      }
      if (++children > nodes_) return fail("node ", id, ": child list loops");
      prev = c;
    }
    uint32_t page_count = 0, snap_count = 0;
    for (uint32_t r = 0; r < ranks_; ++r) {
      const uint32_t row = PageRow(id, r);
      if (row != kNoRow) {
        ++page_count;
        if (row >= pages_.rows_per_rank) {
          return fail("node ", id, " rank ", r, ": page row ", row,
                      " out of range");
        }
        const size_t k = r * pages_.rows_per_rank + row;
        if (pages_.state[k] != RowPool::kCommitted) {
          return fail("node ", id, " rank ", r, ": page row ", row, " is ",
                      StateName(pages_.state[k]));
        }
        if (page_ref[k] != kNoNode) {
          return fail("page row ", row, " of rank ", r, ": held by nodes ",
                      page_ref[k], " and ", id);
        }
        page_ref[k] = id;
        if (n.parent != kNoNode && PageRow(n.parent, r) == kNoRow) {
          return fail("node ", id, " rank ", r,
                      ": has a page row its parent lacks");
        }
      }
      const uint32_t snap = hybrid_ ? SnapshotRow(id, r) : kNoRow;
      if (snap != kNoRow) {
        ++snap_count;
        if (snap >= snapshots_.rows_per_rank) {
          return fail("node ", id, " rank ", r, ": snapshot row ", snap,
                      " out of range");
        }
        const size_t k = r * snapshots_.rows_per_rank + snap;
        if (snapshots_.state[k] != RowPool::kCommitted) {
          return fail("node ", id, " rank ", r, ": snapshot row ", snap, " is ",
                      StateName(snapshots_.state[k]));
        }
        if (snap_ref[k] != kNoNode) {
          return fail("snapshot row ", snap, " of rank ", r, ": held by nodes ",
                      snap_ref[k], " and ", id);
        }
        snap_ref[k] = id;
        if (row == kNoRow) {
          return fail("node ", id, " rank ", r,
                      ": a snapshot without a page row");
        }
      }
    }
    if (page_count != n.page_ranks || snap_count != n.snapshot_ranks) {
      return fail("node ", id, ": counts ", page_count, "/", snap_count,
                  " rows but records ", n.page_ranks, "/", n.snapshot_ranks);
    }
    if (n.first_child == kNoNode) ++childless;
    if (n.snapshot_ranks != 0) ++with_snapshot;
    if (n.pins != 0) ++pinned;
    if ((n.pins != 0) != pinned_.contains(id)) {
      return fail("node ", id, ": pin set disagrees with ", n.pins, " pins");
    }
    if (InLeafSet(n) != leaf_lru_.contains({n.tick, id})) {
      return fail("node ", id, ": leaf LRU membership is wrong");
    }
    if (InSnapshotSet(n) != snapshot_lru_.contains({n.tick, id})) {
      return fail("node ", id, ": snapshot LRU membership is wrong");
    }
    in_leaf += InLeafSet(n) ? 1 : 0;
    in_snap += InSnapshotSet(n) ? 1 : 0;
  }
  if (live != nodes_ || by_key_.size() != nodes_) {
    return fail("node count: ", live, " live, ", nodes_, " recorded, ",
                by_key_.size(), " in the hash set");
  }
  if (childless != leaves_) {
    return fail("leaf count: ", childless, " childless, ", leaves_,
                " recorded");
  }
  if (with_snapshot != snapshot_nodes_) {
    return fail("snapshot count: ", with_snapshot, " nodes, ", snapshot_nodes_,
                " recorded");
  }
  if (in_leaf != leaf_lru_.size() || in_snap != snapshot_lru_.size() ||
      pinned != pinned_.size()) {
    return fail("set sizes: leaf LRU ", leaf_lru_.size(), " vs ", in_leaf,
                ", snapshot LRU ", snapshot_lru_.size(), " vs ", in_snap,
                ", pins ", pinned_.size(), " vs ", pinned);
  }
  uint64_t free_count = 0;
  for (uint32_t id = free_nodes_; id != kNoNode; id = N(id).next_sibling) {
    if (id >= next_unused_ || N(id).page_ranks != 0) {
      return fail("free node list: node ", id, " is live or out of range");
    }
    if (++free_count > next_unused_) return fail("free node list loops");
  }
  if (free_count + live != next_unused_) {
    return fail("node pool: ", free_count, " free + ", live,
                " live != ", next_unused_, " used ids");
  }
  auto check_pool = [&](const RowPool& pool, const std::vector<uint32_t>& ref,
                        const char* bank) -> absl::Status {
    std::vector<bool> on_stack(pool.rows_per_rank);
    for (uint32_t r = 0; r < ranks_; ++r) {
      std::fill(on_stack.begin(), on_stack.end(), false);
      for (uint32_t row : pool.free[r]) {
        const size_t k = r * pool.rows_per_rank + row;
        if (row >= pool.rows_per_rank || on_stack[row] ||
            pool.state[k] != RowPool::kFree) {
          return fail(bank, " free list of rank ", r, ": row ", row,
                      " is out of range, repeated or not free");
        }
        on_stack[row] = true;
      }
      uint64_t count[3] = {0, 0, 0};
      for (uint64_t row = 0; row < pool.rows_per_rank; ++row) {
        const size_t k = r * pool.rows_per_rank + row;
        const uint8_t s = pool.state[k];
        if (s > RowPool::kCommitted) {
          return fail(bank, " row ", row, " of rank ", r, ": bad state ", s);
        }
        ++count[s];
        if ((s == RowPool::kCommitted) != (ref[k] != kNoNode)) {
          return fail(bank, " row ", row, " of rank ", r, ": ", StateName(s),
                      " but ",
                      ref[k] == kNoNode ? "held by no node" : "held by a node");
        }
      }
      if (count[0] != pool.free[r].size() || count[1] != pool.allocated[r] ||
          count[2] != pool.committed[r]) {
        return fail(bank, " rows of rank ", r, ": ", count[0], "/", count[1],
                    "/", count[2], " free/allocated/committed, recorded ",
                    pool.free[r].size(), "/", pool.allocated[r], "/",
                    pool.committed[r]);
      }
    }
    return absl::OkStatus();
  };
  if (absl::Status s = check_pool(pages_, page_ref, "page"); !s.ok()) return s;
  return check_pool(snapshots_, snap_ref, "snapshot");
}

size_t PrefixIndex::MemoryBytes() const {
  size_t bytes = sizeof(*this) + container_bytes_;
  bytes += chunks_.capacity() * sizeof(Chunk);
  bytes += chunks_.size() * kChunkNodes *
           (sizeof(Node) + ranks_ * sizeof(uint32_t) * (hybrid_ ? 2 : 1));
  for (const RowPool* pool : {&pages_, &snapshots_}) {
    bytes += pool->state.capacity();
    for (const auto& stack : pool->free) {
      bytes += stack.capacity() * sizeof(uint32_t);
    }
    bytes += pool->free.capacity() * sizeof(pool->free[0]) +
             (pool->allocated.capacity() + pool->committed.capacity()) *
                 sizeof(uint64_t);
  }
  return bytes;
}

}  // namespace kvtier::daemon
