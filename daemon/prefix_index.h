// PrefixIndex: the per-namespace index of cold prefixes and the allocator of
// the namespace's bank rows.
//
// A node is page i of a cached prefix, keyed by its block hash h_i (whose
// chaining makes the key identify the whole prefix up to page i). A node holds,
// per stored rank, one page row (the same row index in every per-page bank)
// and optionally one snapshot row (the recurrent state after that page, for
// hybrid models). Rows move between three states per rank: free,
// allocated-uncommitted (a caller's reservation, invisible to Lookup) and
// committed (referenced by exactly one node). Eviction is leaf-first LRU: a
// node never goes before its children, so every rank's coverage and each
// node's completeness are prefix-closed, which Lookup relies on to binary
// search the longest match.
//
// Memory is kept near 100 bytes of daemon RAM per page (tp_size 1): nodes live
// in a chunked pool addressed by uint32 ids (daemon/node_pool.h), the hash set
// stores only node ids (hashing and comparing through the node's key, so a key
// is stored once), and the LRU sets hold the leaves and the snapshot nodes
// (eviction passes over the pinned ones). Each bank's row states are a RowPool
// (daemon/row_pool.h).
//
// The member functions are defined by job: prefix_index.cc (construction, tree
// links, pins, removal), prefix_index_alloc.cc (allocation, freeing,
// claiming), prefix_index_evict.cc (eviction and the snapshot spacing policy),
// prefix_index_lookup.cc, prefix_index_commit.cc, prefix_index_introspect.cc
// (usage, listings, the node walk, memory) and prefix_index_check.cc
// (CheckInvariants).
//
// Thread-safety: the owner serialises calls with a reader-writer lock
// (TierCore holds the namespace's Namespace::mu, daemon/tier_namespace.h).
// Const member functions only read (none moves a recency, a counter or a
// container), so any number of them may run at once, e.g. Find under a shared
// lock. Pin and Unpin need the owner's lock held shared only: they may run
// beside each other and beside the const functions (a pin count and the
// pinned set change under the index's own pin_mu_, which the readers of
// either take), so a pinned lookup and its release never wait for other
// lookups. Every other non-const member function needs exclusive access,
// with no other call in flight; eviction and DropSubtree then read the pin
// counts without pin_mu_, since no Pin or Unpin can run.
#ifndef KVTIER_DAEMON_PREFIX_INDEX_H_
#define KVTIER_DAEMON_PREFIX_INDEX_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/btree_set.h"
#include "absl/container/flat_hash_set.h"
#include "absl/hash/hash.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "daemon/counting_allocator.h"
#include "daemon/node_pool.h"
#include "daemon/prefix_index_types.h"
#include "daemon/row_pool.h"

namespace kvtier::daemon {

// kNoRow, kNoNode and HashKey: daemon/prefix_index_types.h.

// What one namespace's index manages. Validated by PrefixIndex::Create.
struct IndexConfig {
  uint32_t hash_bytes = 32;       // 16 or 32.
  uint32_t tokens_per_page = 16;  // > 0; positions for the spacing policy.
  uint32_t tp_size = 1;           // Ranks of the TP group, 1..255.
  bool replicated = false;        // One copy (rank 0's) serves every rank.
  uint64_t page_rows = 0;         // Rows per stored rank, 1..0xfffffffe.
  uint64_t snapshot_rows = 0;     // Per stored rank; 0 = not hybrid.
  // Hybrid only (ignored otherwise): keep snapshots so that resuming any
  // cached prefix replays at most this many tokens. 0 = no preference.
  uint32_t max_replay_tokens = 0;
  // Leaves some rank has not committed (no lookup can use them) are
  // evicted before any other once they are this old: the ranks of one
  // engine commit a step's pages within milliseconds of each other, so a
  // node still incomplete after this is one whose other ranks' stores
  // failed (a cap, the fence, a worker gone).
  int64_t incomplete_grace_ms = 5000;
};

class PrefixIndex {
 public:
  // Validates `config` (INVALID_ARGUMENT naming the field) and returns an
  // empty index whose rows are all free.
  static absl::StatusOr<std::unique_ptr<PrefixIndex>> Create(
      const IndexConfig& config);

  PrefixIndex(const PrefixIndex&) = delete;
  PrefixIndex& operator=(const PrefixIndex&) = delete;
  ~PrefixIndex();

  // ---------------------------------------------------------- allocation --

  struct AllocatedRows {
    std::vector<uint32_t> page_rows;
    std::vector<uint32_t> snapshot_rows;
  };

  // Returns `pages` page rows and `snapshots` snapshot rows of `rank`, now
  // allocated-uncommitted (owned by the caller until Commit or
  // FreePageRows / FreeSnapshotRows). All-or-nothing, and reserve fails
  // before it evicts: it first decides, changing nothing, whether both
  // counts can be had from the free rows plus what eviction could reclaim,
  // and only then evicts and takes the rows. On any error the index is
  // exactly unchanged (nothing evicted, no recency or counter moved).
  //
  // Eviction, only as far as needed: first least-recently-used unpinned
  // leaves, for page rows (each frees all its ranks' page and snapshot
  // rows); then, for snapshot rows still short, snapshots alone (the nodes
  // stay) by AllocateSnapshotRows' policy below.
  // Reclaimable for `rank`: page rows of nodes that are neither pinned nor
  // ancestors of a pinned node (leaf-first eviction never reaches those);
  // snapshot rows of unpinned nodes (an unpinned ancestor's snapshot can go
  // alone). Allocated-uncommitted rows (reservations) are never reclaimable.
  // The two banks are independent: evicting leaves only frees reclaimable
  // snapshot rows, so it changes neither bank's free + reclaimable.
  //
  // RESOURCE_EXHAUSTED naming the bank ("page rows" / "snapshot rows") and
  // its needed / free / reclaimable by eviction / pinned (protected) /
  // reserved (allocated-uncommitted) counts, when free + reclaimable is
  // short. INVALID_ARGUMENT for a bad rank (must be 0 when replicated) or a
  // count above the bank's rows per rank; FAILED_PRECONDITION for
  // snapshots > 0 when the namespace is not hybrid. Zero counts return no
  // rows. Cost beyond the rows taken and evicted: O(1) while enough rows
  // are free; else O(pinned nodes), plus, only when a cheap bound cannot
  // show pages feasible, O(pinned nodes and their ancestors).
  absl::StatusOr<AllocatedRows> AllocateRows(uint32_t rank, uint32_t pages,
                                             uint32_t snapshots);

  // AllocateRows(rank, n, 0).page_rows, with the same all-or-nothing
  // contract: refused (RESOURCE_EXHAUSTED) without evicting anything when
  // the free plus reclaimable page rows are fewer than `n`.
  absl::StatusOr<std::vector<uint32_t>> AllocatePageRows(uint32_t rank,
                                                         uint32_t n);

  // AllocateRows(rank, 0, n).snapshot_rows (FAILED_PRECONDITION when the
  // namespace is not hybrid, even for n == 0). When short it evicts
  // snapshots only (the nodes stay): first, in LRU order among the ~64
  // least recent, snapshots the spacing policy calls redundant; then the LRU
  // snapshot regardless (counted in Usage::spacing_violations when it was
  // not redundant). Evicting whole leaves could not help further: every
  // snapshot left then sits on a pinned node. Refused without evicting
  // anything when the free plus reclaimable snapshot rows are fewer than n.
  absl::StatusOr<std::vector<uint32_t>> AllocateSnapshotRows(uint32_t rank,
                                                             uint32_t n);

  // Returns allocated-uncommitted rows of `rank` to the free list. Validates
  // everything first (INVALID_ARGUMENT naming the row: out of range, not
  // allocated-uncommitted, listed twice); on error nothing changes.
  absl::Status FreePageRows(uint32_t rank, absl::Span<const uint32_t> rows);
  absl::Status FreeSnapshotRows(uint32_t rank, absl::Span<const uint32_t> rows);

  // Moves the listed free rows of `rank` to allocated-uncommitted, as if
  // allocated: recovery (daemon/journal.h) rebuilds an index whose rows are
  // fixed by the segments' contents, so it chooses them instead of taking
  // what AllocatePageRows hands out, then commits them with Commit. Nothing
  // is evicted. Validates everything first (INVALID_ARGUMENT naming the row:
  // bad rank, out of range, not free, listed twice); on error nothing
  // changes. O(rows.size() + free rows of the rank): claim in bulk.
  absl::Status ClaimPageRows(uint32_t rank, absl::Span<const uint32_t> rows);
  // As ClaimPageRows, for the snapshot bank (FAILED_PRECONDITION when the
  // namespace is not hybrid and rows is not empty).
  absl::Status ClaimSnapshotRows(uint32_t rank,
                                 absl::Span<const uint32_t> rows);
  // Sizes the hash set for `nodes` nodes in all, so that adding that many
  // (recovery knows how many it will) does not rehash on the way.
  void ReserveNodes(size_t nodes);

  // -------------------------------------------------------------- lookup --

  struct LookupResult {
    // Longest leading run of `hashes` whose nodes are complete (hold a page
    // row for every stored rank).
    uint32_t matched_pages = 0;
    // matched_pages when not hybrid; when hybrid, depth+1 of the deepest node
    // within the run holding a complete snapshot (every stored rank), else 0.
    uint32_t usable_pages = 0;
    // The rank's page rows of pages [0, usable_pages).
    std::vector<uint32_t> rows;
    bool has_snapshot = false;
    uint32_t snapshot_row = kNoRow;  // The rank's snapshot row at the match.
    // Node of page usable_pages-1 (kNoNode when usable_pages == 0): Pin it to
    // keep the rows (and that snapshot) from eviction while they are read.
    uint32_t pin_node = kNoNode;
    // Node whose recency the lookup refreshes (pin_node, else the deepest
    // matched node; kNoNode when nothing matched).
    uint32_t touch_node = kNoNode;
  };

  // Finds the usable match of the chain `hashes` (h_0..h_{n-1}) for `rank`
  // (any rank below tp_size; a replicated index serves rank 0's rows to all)
  // and touches the LRU recency of the node at the usable end (the matched
  // end when nothing is usable). O(log n) hash probes plus one walk up the
  // matched path, which also verifies every key: a chain that disagrees with
  // the tree falls back to a linear scan, so it never yields wrong rows.
  // A rank >= tp_size yields an empty result.
  LookupResult Lookup(absl::Span<const HashKey> hashes, uint32_t rank);

  // Lookup split for concurrency: Find changes nothing (callers may run it
  // under a shared lock, many at once); Touch then records the use of
  // result.touch_node under the exclusive lock. Touch of a node that is no
  // longer live does nothing. NodeHasKey tells whether `node` is still the
  // live node of `key` (a concurrent eviction may have reused the id between
  // Find and taking the exclusive lock).
  LookupResult Find(absl::Span<const HashKey> hashes, uint32_t rank) const;
  void Touch(uint32_t node);
  bool NodeHasKey(uint32_t node, const HashKey& key) const;
  // The live node of `key` (kNoNode when absent), and its page row for
  // `rank` (a replicated index answers rank 0's for every rank; kNoRow when
  // the node is not live or holds no row of the rank). The fence re-pins a
  // lease reported after a restart through them.
  uint32_t NodeOf(const HashKey& key) const { return FindNode(key); }
  uint32_t PageRowOf(uint32_t node, uint32_t rank) const {
    if (!IsLive(node) || rank >= tp_size_) return kNoRow;
    return PageRow(node, ranks_ == 1 ? 0 : rank);
  }

  // -------------------------------------------------------------- commit --

  struct SnapshotPlacement {
    uint32_t row = kNoRow;  // An allocated-uncommitted snapshot row.
    HashKey hash;           // The page after which the state was taken.
  };
  struct CommitResult {
    uint32_t committed_pages = 0;
    uint32_t deduplicated_pages = 0;
    uint32_t committed_snapshots = 0;
    uint32_t deduplicated_snapshots = 0;
    // Rows of the commit not needed because the index already held the same
    // hash for this rank; the index has already returned them to the free
    // list.
    std::vector<uint32_t> freed_page_rows;
    std::vector<uint32_t> freed_snapshot_rows;
    // Indices into `hashes` of the pages this commit made complete (every
    // stored rank holds a row), ascending: what the KV events announce.
    std::vector<uint32_t> completed;
  };

  // Makes `rows` (allocated-uncommitted page rows of `rank`, rows[i] holding
  // page hashes[i]) and `snapshots` visible for `rank`.
  // `parent`: nullptr when hashes[0] is a first page; otherwise it must be in
  // the index with this rank's page row (FAILED_PRECONDITION). A hash already
  // held for this rank deduplicates (our row is freed); a hash present under
  // a different parent is FAILED_PRECONDITION (inconsistent chain). Each
  // placement's hash must be among `hashes` or already in the index with this
  // rank's page row; a node already holding this rank's snapshot
  // deduplicates. Everything is validated before anything changes: on error
  // (INVALID_ARGUMENT / FAILED_PRECONDITION naming the field) the index is
  // unchanged. REQUIRES: rows.size() == hashes.size() (else
  // INVALID_ARGUMENT).
  absl::StatusOr<CommitResult> Commit(
      uint32_t rank, const HashKey* parent, absl::Span<const HashKey> hashes,
      absl::Span<const uint32_t> rows,
      absl::Span<const SnapshotPlacement> snapshots);

  // ---------------------------------------------------------------- pins --

  // Adds one pin to `node`: it, its ancestors and its snapshot are then kept
  // from eviction and DropSubtree until as many Unpin calls. REQUIRES: `node`
  // is a live node id, e.g. a LookupResult::pin_node of the same critical
  // section (anything else is a no-op), and the owner's lock is held, shared
  // at least (see the file comment).
  void Pin(uint32_t node) ABSL_LOCKS_EXCLUDED(pin_mu_);
  // Removes one pin. FAILED_PRECONDITION when `node` is not a live, pinned
  // node. Clear() invalidates every pin: forget them there. REQUIRES: as Pin.
  absl::Status Unpin(uint32_t node) ABSL_LOCKS_EXCLUDED(pin_mu_);

  // ------------------------------------------------------------- removal --

  struct DropResult {
    uint64_t pages = 0;      // Nodes removed.
    uint64_t snapshots = 0;  // Of them, nodes that held a snapshot.
  };
  // Removes the node of `hash` and everything below it, freeing their rows.
  // NOT_FOUND when absent; FAILED_PRECONDITION (naming the pin count) when
  // any node in it is pinned, and then nothing changes.
  absl::StatusOr<DropResult> DropSubtree(const HashKey& hash);

  // From now on, every complete node removed (evicted or dropped; not by
  // Clear) appends its key to `*log`, for the KV events; nullptr stops it.
  // The owner drains the log. REQUIRES: exclusive access.
  void SetRemovalLog(std::vector<HashKey>* log) { removal_log_ = log; }

  // Drops everything: nodes, pins and allocated-uncommitted rows (callers
  // forget their reservations and leases). Every row becomes free; eviction
  // counters are kept.
  void Clear();

  // ------------------------------------------------------- introspection --

  struct Usage {
    uint64_t nodes = 0;             // Pages held (one node per page).
    uint64_t leaves = 0;            // Childless nodes (prefixes).
    uint64_t evictable_leaves = 0;  // Childless and unpinned.
    uint64_t snapshots = 0;         // Nodes holding at least one snapshot row.
    uint64_t pinned_nodes = 0;
    uint64_t pins = 0;  // Their pin counts summed (each Pin not yet undone).
    // Indexed by stored rank (tp_size entries, or 1 when replicated); the
    // snapshot vectors are all zero when the namespace is not hybrid.
    std::vector<uint64_t> free_page_rows, allocated_page_rows,
        committed_page_rows;
    std::vector<uint64_t> free_snapshot_rows, allocated_snapshot_rows,
        committed_snapshot_rows;
    uint64_t evicted_pages = 0;       // Nodes evicted (not dropped).
    uint64_t evicted_snapshots = 0;   // Snapshot nodes evicted, alone or not.
    uint64_t spacing_violations = 0;  // Forced non-redundant evictions.
    // Of evicted_pages, nodes some rank never committed (no lookup could
    // use them; evicted first, see IndexConfig::incomplete_grace_ms).
    uint64_t evicted_incomplete_pages = 0;
  };
  // O(ranks).
  Usage GetUsage() const;
  // The allocated-uncommitted rows of `rank` (reservations and fences:
  // rows handed out for writing), ascending; empty for a bad rank or, for
  // snapshots, a namespace that is not hybrid. The journal's checkpoint
  // records them. O(rows of the rank).
  std::vector<uint32_t> AllocatedPageRows(uint32_t rank) const;
  std::vector<uint32_t> AllocatedSnapshotRows(uint32_t rank) const;

  struct PrefixInfo {
    HashKey leaf;
    uint32_t pages = 0;      // Depth of the leaf + 1.
    uint32_t snapshots = 0;  // Nodes on the path holding a snapshot.
    uint64_t last_use_tick = 0;
    int64_t last_use_unix_ms = 0;
    uint32_t pins = 0;  // Pins on the path's nodes.
  };
  // One entry per leaf (childless node), at most `limit`: the most recently
  // used first when `by_recent`, else the longest first. `*total` (when not
  // null) receives the number of leaves. O(leaves) for the longest-first
  // order, O(limit) plus the distinct path nodes walked otherwise.
  std::vector<PrefixInfo> ListPrefixes(bool by_recent, size_t limit,
                                       uint64_t* total) const;

  // One node as ForEachNode shows it. The spans index stored ranks (1 when
  // replicated, else tp_size) and hold kNoRow where the rank has no row;
  // snapshot_rows is empty when the namespace is not hybrid. Valid only
  // during the callback.
  struct NodeView {
    uint32_t id = kNoNode;
    uint32_t parent = kNoNode;  // kNoNode for a first page.
    uint32_t depth = 0;
    const HashKey* key = nullptr;         // Bytes beyond hash_bytes are zero.
    const HashKey* parent_key = nullptr;  // nullptr for a first page.
    absl::Span<const uint32_t> page_rows;
    absl::Span<const uint32_t> snapshot_rows;
    uint64_t last_use_tick = 0;
  };
  // Calls `visit` once per node, every parent before its children (a
  // depth-first walk from the first pages). The journal's checkpoint
  // (daemon/journal.h) writes the index through it. `visit` must not call
  // into this index. O(nodes).
  void ForEachNode(const std::function<void(const NodeView&)>& visit) const;

  // What eviction removed, as SetEvictionObserver shows it.
  struct Eviction {
    NodeView node;
    // Every stored rank had committed the page (an incomplete node no
    // lookup could use: see IndexConfig::incomplete_grace_ms).
    bool complete = false;
    // false: the node's snapshot alone went, the page stays.
    bool page = true;
    // A snapshot went (the page's, with it, or alone).
    bool snapshot = false;
  };
  // From now on, everything eviction removes (a leaf evicted for rows, or a
  // snapshot evicted alone; not DropSubtree, not Clear) is shown to
  // `observer` just before its rows are freed, as ForEachNode shows a node,
  // so the rows still hold the committed pages: the cluster tier copies
  // them out there (daemon/cluster_bridge.h). The evicted_* counters of
  // Usage count exactly what it is shown. `observer` must not call into
  // this index. An empty function stops it. REQUIRES: exclusive access.
  void SetEvictionObserver(std::function<void(const Eviction&)> observer) {
    eviction_observer_ = std::move(observer);
  }

  // Checks every invariant: each row of each rank in exactly one of {free,
  // allocated-uncommitted, committed}, committed rows referenced by exactly
  // one node, tree links and depths consistent, coverage prefix-closed, hash
  // set, LRU sets and counters matching the nodes. INTERNAL naming the first
  // violation. O(nodes + rows); for tests and debugging.
  absl::Status CheckInvariants() const;

  // Heap bytes held: node pool, per-node row arrays, row states and free
  // lists, hash set, LRU and pin sets (counted by their allocator).
  size_t MemoryBytes() const;

 private:
  using Node = NodePool::Node;

  // Hash and equality of node ids through their keys, transparent to
  // HashKey so lookups need no node. Defined inline below, so that every
  // file's FindNode (Find's probes, Commit's checks) inlines them.
  struct NodeHash {
    using is_transparent = void;
    const PrefixIndex* index;
    size_t operator()(uint32_t id) const;
    size_t operator()(const HashKey& key) const;
  };
  struct NodeEq {
    using is_transparent = void;
    const PrefixIndex* index;
    bool operator()(uint32_t a, uint32_t b) const;
    bool operator()(uint32_t a, const HashKey& b) const;
    bool operator()(const HashKey& a, uint32_t b) const;
  };

  using LruSet =
      absl::btree_set<std::pair<uint64_t, uint32_t>,
                      std::less<std::pair<uint64_t, uint32_t>>,
                      CountingAllocator<std::pair<uint64_t, uint32_t>>>;
  using NodeSet = absl::flat_hash_set<uint32_t, NodeHash, NodeEq,
                                      CountingAllocator<uint32_t>>;
  using IdSet =
      absl::flat_hash_set<uint32_t, absl::Hash<uint32_t>, std::equal_to<>,
                          CountingAllocator<uint32_t>>;

  explicit PrefixIndex(const IndexConfig& config);

  // Node access (NodePool's, under the index's short names).
  Node& N(uint32_t id) { return node_pool_.node(id); }
  const Node& N(uint32_t id) const { return node_pool_.node(id); }
  uint32_t& PageRow(uint32_t id, uint32_t rank) {
    return node_pool_.PageRow(id, rank);
  }
  uint32_t PageRow(uint32_t id, uint32_t rank) const {
    return node_pool_.PageRow(id, rank);
  }
  uint32_t& SnapshotRow(uint32_t id, uint32_t rank) {
    return node_pool_.SnapshotRow(id, rank);
  }
  uint32_t SnapshotRow(uint32_t id, uint32_t rank) const {
    return node_pool_.SnapshotRow(id, rank);
  }
  bool IsLive(uint32_t id) const { return node_pool_.IsLive(id); }
  bool Complete(const Node& n) const { return n.page_ranks == ranks_; }
  bool SnapshotComplete(const Node& n) const {
    return ranks_ != 0 && n.snapshot_ranks == ranks_;
  }
  // Set membership is a function of the node's state.
  // (Pins do not change membership, so that Pin and Unpin leave the sets
  // alone; eviction passes over pinned entries.)
  static bool InLeafSet(const Node& n) { return n.first_child == kNoNode; }
  static bool InSnapshotSet(const Node& n) { return n.snapshot_ranks != 0; }
  uint64_t Position(const Node& n) const {
    return (uint64_t{n.depth} + 1) * tokens_per_page_;
  }

  // INVALID_ARGUMENT unless rank < ranks_.
  absl::Status ValidateRank(uint32_t rank) const;

  // Allocation (prefix_index_alloc.cc). Sum of depth + 1 over pinned
  // nodes: a bound on the nodes pins protect (each pinned node and its
  // ancestors). O(pinned nodes).
  uint64_t PinnedPathBound() const ABSL_LOCKS_EXCLUDED(pin_mu_);
  // Committed page rows of `rank` held by pinned nodes and their ancestors,
  // which leaf eviction cannot free: a walk up from each pinned node that
  // stops at nodes already seen. O(pinned nodes and their ancestors).
  uint64_t ProtectedPageRows(uint32_t rank) const ABSL_LOCKS_EXCLUDED(pin_mu_);
  // Committed snapshot rows of `rank` on pinned nodes. O(pinned nodes).
  uint64_t PinnedSnapshotRows(uint32_t rank) const ABSL_LOCKS_EXCLUDED(pin_mu_);

  // Eviction (prefix_index_evict.cc). Evict until `rank` has `n` free rows
  // of the bank, as far as eviction can. Return whether it has.
  bool EvictLeavesFor(uint32_t rank, uint32_t n);
  // EvictLeavesFor's first pass: unpinned leaves holding a row of `rank`
  // that some other rank never committed, older than the grace, from the
  // oldest; at most kIncompleteScan leaves looked at (lookups never touch
  // incomplete nodes, so they age to the front of the LRU).
  void EvictIncompleteFor(uint32_t rank, uint32_t n);
  bool EvictSnapshotsFor(uint32_t rank, uint32_t n);
  // RemoveLeaf / RemoveSnapshot, counted as evictions.
  void EvictLeaf(uint32_t id);
  void EvictSnapshot(uint32_t id);
  // Whether, without the node's snapshot, resuming anywhere in the tree
  // still replays at most max_replay_tokens_ (bounded search; "no" when the
  // bound is hit).
  bool SnapshotRedundant(uint32_t id) const;

  // Tree links (prefix_index.cc). Creates a node holding `rank`'s committed
  // `row`, linked under `parent` (kNoNode: a first page), with the current
  // recency, in the leaf LRU.
  uint32_t NewNode(const HashKey& key, uint32_t parent, uint32_t rank,
                   uint32_t row);
  // Sets the node's recency, keeping its LRU set entries keyed by it.
  void SetRecency(uint32_t id, uint64_t tick, int64_t unix_ms);
  // The node `id` (live) as ForEachNode shows it.
  NodeView ViewOf(uint32_t id) const;
  // Removes a childless node: frees its rows, unlinks it, and puts a parent
  // left childless into the leaf LRU with max(own, child's) recency.
  void RemoveLeaf(uint32_t id);
  // Frees every rank's snapshot row of the node (the node stays).
  void RemoveSnapshot(uint32_t id);

  // Key comparison over hash_bytes_ bytes (constant sizes: inlined compares).
  bool KeyEquals(const HashKey& a, const HashKey& b) const {
    return hash_bytes_ == 32
               ? std::memcmp(a.bytes.data(), b.bytes.data(), 32) == 0
               : std::memcmp(a.bytes.data(), b.bytes.data(), 16) == 0;
  }
  // The key's significant bytes, for hashing and per-call maps.
  absl::string_view KeyBytes(const HashKey& key) const {
    return absl::string_view(reinterpret_cast<const char*>(key.bytes.data()),
                             hash_bytes_);
  }
  // The key with the bytes beyond hash_bytes_ zeroed.
  HashKey Normalize(const HashKey& key) const;
  // The node holding `key`, or kNoNode.
  uint32_t FindNode(const HashKey& key) const {
    auto it = by_key_.find(key);
    return it == by_key_.end() ? kNoNode : *it;
  }
  // Advances the logical clock and samples the wall clock.
  void Tick();

  // Commit's steps (prefix_index_commit.cc). The checks change nothing,
  // return Commit's errors and fill the plan the applying steps follow.
  // REQUIRES: exclusive access (Commit's).
  struct CommitPlan;
  // The rank; a row per hash, fewer than kNoNode hashes, snapshots only when
  // hybrid; `parent` (unless null) in the index with a page row of `rank`,
  // its node then in plan.parent_id.
  absl::Status CheckCommitArgs(uint32_t rank, const HashKey* parent,
                               size_t hashes, size_t rows, size_t snapshots,
                               CommitPlan& plan) const;
  // Each row in range, allocated-uncommitted for `rank`, listed once.
  absl::Status CheckCommitRows(uint32_t rank,
                               absl::Span<const uint32_t> rows) const;
  // No hash twice; those already in the index form a chain from
  // plan.parent_id, above the new ones. Fills plan.position and plan.nodes.
  absl::Status CheckCommitChain(absl::Span<const HashKey> hashes,
                                CommitPlan& plan) const;
  // Each placement's snapshot row as CheckCommitRows checks a page row; its
  // hash placed once, among the hashes or in the index with a page row of
  // `rank`. Fills plan.targets. REQUIRES: CheckCommitChain passed.
  absl::Status CheckSnapshotPlacements(
      uint32_t rank, absl::Span<const SnapshotPlacement> snapshots,
      CommitPlan& plan) const;
  // Commits each page row (a new node, or a rank added to a node) or frees
  // it (the node holds the rank's row: a duplicate); plan.nodes then holds
  // every hash's node, and the last one the current recency.
  void LinkPages(uint32_t rank, absl::Span<const HashKey> hashes,
                 absl::Span<const uint32_t> rows, CommitPlan& plan,
                 CommitResult& result);
  // Commits each snapshot row on its node, or frees it when the node holds
  // the rank's snapshot already. REQUIRES: LinkPages ran.
  void PlaceSnapshots(uint32_t rank,
                      absl::Span<const SnapshotPlacement> snapshots,
                      const CommitPlan& plan, CommitResult& result);

  // CheckInvariants' families (prefix_index_check.cc), read-only: each
  // returns INTERNAL naming the first violation. REQUIRES: `id` live.
  struct NodeTally;
  // Rank counts within ranks_; the key finds the node; key bytes beyond
  // hash_bytes_ are zero.
  absl::Status CheckNodeRecord(uint32_t id) const;
  // Depth and sibling links against the parent's; the child list's links,
  // and no loop in it.
  absl::Status CheckNodeLinks(uint32_t id) const;
  // Each rank's rows: in range, committed, held by no other node
  // (`page_ref` / `snap_ref`: the node seen holding each row slot, updated),
  // a page row only where the parent has one (prefix-closed coverage), a
  // snapshot only beside a page row; the node's counts of them.
  absl::Status CheckNodeRows(uint32_t id, absl::Span<uint32_t> page_ref,
                             absl::Span<uint32_t> snap_ref) const;
  // Membership of the pin set and both LRU sets, as the node's state says.
  absl::Status CheckNodeSets(uint32_t id) const
      ABSL_SHARED_LOCKS_REQUIRED(pin_mu_);
  // The counters and the sets' sizes against the nodes' `tally`.
  absl::Status CheckCounters(const NodeTally& tally) const
      ABSL_SHARED_LOCKS_REQUIRED(pin_mu_);

  // Immutable after construction.
  const uint32_t hash_bytes_;
  const uint32_t tokens_per_page_;
  const uint32_t tp_size_;
  const uint32_t ranks_;  // Stored ranks: 1 when replicated, else tp_size.
  const bool hybrid_;
  const uint32_t max_replay_tokens_;

  // Mutable state (guarded by the owner's lock, as the file comment says).
  mutable size_t container_bytes_ = 0;  // Counted by CountingAllocator.
  NodePool node_pool_;
  RowPool pages_, snapshots_;
  NodeSet by_key_;
  LruSet leaf_lru_;      // (tick, id) of childless nodes.
  LruSet snapshot_lru_;  // (tick, id) of nodes holding snapshots.
  // Node::pins change under pin_mu_ (Pin and Unpin run under the owner's
  // lock held shared); read under pin_mu_, or with the owner's lock held
  // exclusively. pinned_ holds the nodes whose count is not zero.
  mutable absl::Mutex pin_mu_;
  size_t pinned_bytes_ ABSL_GUARDED_BY(pin_mu_) = 0;  // pinned_'s allocations.
  IdSet pinned_ ABSL_GUARDED_BY(pin_mu_);
  uint64_t tick_ = 0;
  int64_t now_ms_ = 0;
  uint64_t nodes_ = 0, leaves_ = 0, snapshot_nodes_ = 0;
  uint64_t evicted_pages_ = 0, evicted_snapshots_ = 0;
  uint64_t spacing_violations_ = 0;
  uint64_t evicted_incomplete_ = 0;
  int64_t incomplete_grace_ms_ = 5000;
  std::vector<HashKey>* removal_log_ = nullptr;             // see SetRemovalLog
  std::function<void(const Eviction&)> eviction_observer_;  // see above
};

// ------------------------------------------------------------ functors --

inline size_t PrefixIndex::NodeHash::operator()(const HashKey& key) const {
  // Keys come from clients: a per-process seeded hash over the whole key keeps
  // crafted keys from colliding on purpose.
  return absl::Hash<absl::string_view>{}(index->KeyBytes(key));
}
inline size_t PrefixIndex::NodeHash::operator()(uint32_t id) const {
  return (*this)(index->N(id).key);
}
inline bool PrefixIndex::NodeEq::operator()(uint32_t a, uint32_t b) const {
  return a == b;
}
inline bool PrefixIndex::NodeEq::operator()(uint32_t a,
                                            const HashKey& b) const {
  return index->KeyEquals(index->N(a).key, b);
}
inline bool PrefixIndex::NodeEq::operator()(const HashKey& a,
                                            uint32_t b) const {
  return index->KeyEquals(a, index->N(b).key);
}

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_PREFIX_INDEX_H_
