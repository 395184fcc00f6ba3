// Tests of PrefixIndex as a whole: configuration, Clear, random operations
// against an outside model with invariants after every step, and memory per
// page at a million pages. The other suites split by job:
// prefix_index_{lookup,snapshot,alloc,commit}_test.cc.
//
// Thread-safety: single-threaded tests.
#include "daemon/prefix_index.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "daemon/prefix_index_test_util.h"
#include "gtest/gtest.h"

namespace kvtier::daemon::index_testing {
namespace {

TEST(PrefixIndexTest, CreateValidatesConfig) {
  IndexConfig c = Config(16);
  c.hash_bytes = 20;
  EXPECT_EQ(PrefixIndex::Create(c).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_NE(PrefixIndex::Create(c).status().message().find("hash_bytes"),
            std::string::npos);
  c = Config(0);
  EXPECT_EQ(PrefixIndex::Create(c).status().code(),
            absl::StatusCode::kInvalidArgument);
  c = Config(16);
  c.tokens_per_page = 0;
  EXPECT_EQ(PrefixIndex::Create(c).status().code(),
            absl::StatusCode::kInvalidArgument);
  c = Config(16, 0, 0);
  EXPECT_EQ(PrefixIndex::Create(c).status().code(),
            absl::StatusCode::kInvalidArgument);
  c = Config(uint64_t{kNoRow});
  EXPECT_EQ(PrefixIndex::Create(c).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(PrefixIndex::Create(Config(16, 4, 8)).ok());
}

TEST(PrefixIndexTest, ClearDropsEverything) {
  auto index = Make(Config(16, 4, 2));
  Put(*index, 0, nullptr, Chain(1, 4), {3});
  Put(*index, 1, nullptr, Chain(1, 4), {3});
  ASSERT_EQ(index->Lookup(Chain(1, 4), 0).usable_pages, 4u);
  index->Pin(index->Lookup(Chain(1, 4), 0).pin_node);
  ASSERT_TRUE(index->AllocatePageRows(1, 2).ok());
  index->Clear();
  PrefixIndex::Usage u = index->GetUsage();
  EXPECT_EQ(u.nodes, 0u);
  EXPECT_EQ(u.pinned_nodes, 0u);
  EXPECT_EQ(u.free_page_rows, (std::vector<uint64_t>{16, 16}));
  EXPECT_EQ(u.allocated_page_rows, (std::vector<uint64_t>{0, 0}));
  EXPECT_EQ(u.free_snapshot_rows, (std::vector<uint64_t>{4, 4}));
  EXPECT_EQ(index->Lookup(Chain(1, 4), 0).matched_pages, 0u);
  EXPECT_TRUE(index->CheckInvariants().ok());
  Put(*index, 0, nullptr, Chain(2, 2));
  EXPECT_TRUE(index->CheckInvariants().ok());
}

// Random operations on a small TP-2 hybrid index, invariants after each, and
// every row Lookup returns is the one last committed for that page and rank;
// each allocation succeeds exactly when an outside count of free plus
// reclaimable rows allows it, and a refused one changes nothing.
TEST(PrefixIndexTest, RandomOperationsKeepInvariants) {
  auto index = Make(Config(48, 12, 2, false, 48));
  std::mt19937_64 rng(42);
  // Path (family, branch): the family's first 3 pages, then the branch's.
  auto path = [](uint64_t family, uint64_t branch, size_t n) {
    std::vector<HashKey> out;
    for (size_t i = 0; i < n; ++i) {
      out.push_back(i < 3 ? Key(family, i)
                          : Key(family * 16 + branch + 100, i));
    }
    return out;
  };
  absl::flat_hash_map<std::string, uint32_t> committed;  // key+rank -> row
  auto id = [](const HashKey& k, uint32_t rank) {
    return std::string(reinterpret_cast<const char*>(k.bytes.data()), 32) +
           static_cast<char>(rank);
  };
  std::vector<uint32_t> pins;
  // The most rows of `rank` an allocation may get, computed from the outside:
  // free plus committed rows of nodes neither pinned nor ancestors of a
  // pinned node (pages), or of unpinned nodes (snapshots).
  struct Capacity {
    uint64_t pages = 0, snapshots = 0;
  };
  auto capacity = [&](uint32_t rank) {
    struct Seen {
      uint32_t parent;
      bool page, snapshot;
    };
    absl::flat_hash_map<uint32_t, Seen> nodes;
    index->ForEachNode([&](const PrefixIndex::NodeView& v) {
      nodes[v.id] = {v.parent, v.page_rows[rank] != kNoRow,
                     v.snapshot_rows[rank] != kNoRow};
    });
    absl::flat_hash_map<uint32_t, bool> is_protected;
    for (uint32_t pin : pins) {
      for (uint32_t n = pin; n != kNoNode; n = nodes.at(n).parent) {
        is_protected[n] = true;
      }
    }
    PrefixIndex::Usage u = index->GetUsage();
    Capacity cap{u.free_page_rows[rank], u.free_snapshot_rows[rank]};
    for (const auto& [id, seen] : nodes) {
      if (seen.page && !is_protected.contains(id)) ++cap.pages;
      const bool pinned = std::find(pins.begin(), pins.end(), id) != pins.end();
      if (seen.snapshot && !pinned) ++cap.snapshots;
    }
    return cap;
  };
  // Checks an allocation's outcome against the capacity before it.
  auto check = [&](const absl::Status& status, const Capacity& cap,
                   uint64_t pages, uint64_t snapshots,
                   const std::string& before) {
    if (pages <= cap.pages && snapshots <= cap.snapshots) {
      EXPECT_TRUE(status.ok()) << status;
    } else {
      EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
      EXPECT_EQ(Describe(index->GetUsage()), before);
    }
  };
  int commits = 0, lookups_hit = 0, refused = 0;
  for (int step = 0; step < 4000; ++step) {
    const uint32_t rank = rng() % 2;
    const auto p = path(rng() % 3, rng() % 4, 2 + rng() % 10);
    const int op = rng() % 10;
    if (op < 4) {
      const size_t from = rng() % p.size();
      const size_t n = 1 + rng() % (p.size() - from);
      std::vector<HashKey> hashes(p.begin() + from, p.begin() + from + n);
      Capacity cap = capacity(rank);
      std::string before_alloc = Describe(index->GetUsage());
      auto rows = index->AllocatePageRows(rank, n);
      check(rows.status(), cap, n, 0, before_alloc);
      if (!rows.ok()) {
        ++refused;
        continue;
      }
      std::vector<PrefixIndex::SnapshotPlacement> snaps;
      std::vector<uint32_t> snap_rows;
      if (rng() % 2) {
        cap = capacity(rank);
        before_alloc = Describe(index->GetUsage());
        auto s = index->AllocateSnapshotRows(rank, 1);
        check(s.status(), cap, 0, 1, before_alloc);
        if (s.ok()) {
          snap_rows = *s;
          snaps.push_back({(*s)[0], hashes[rng() % n]});
        }
      }
      const std::string before = Describe(index->GetUsage());
      auto c = index->Commit(rank, from == 0 ? nullptr : &p[from - 1], hashes,
                             *rows, snaps);
      if (c.ok()) {
        ++commits;
        for (size_t i = 0; i < n; ++i) {
          if (std::find(c->freed_page_rows.begin(), c->freed_page_rows.end(),
                        (*rows)[i]) == c->freed_page_rows.end()) {
            committed[id(hashes[i], rank)] = (*rows)[i];
          }
        }
      } else {
        ASSERT_EQ(c.status().code(), absl::StatusCode::kFailedPrecondition)
            << c.status();
        ASSERT_EQ(Describe(index->GetUsage()), before);
        ASSERT_TRUE(index->FreePageRows(rank, *rows).ok());
        ASSERT_TRUE(index->FreeSnapshotRows(rank, snap_rows).ok());
      }
    } else if (op < 7) {
      LookupResult r = index->Lookup(p, rank);
      ASSERT_LE(r.usable_pages, r.matched_pages);
      ASSERT_EQ(r.rows.size(), r.usable_pages);
      for (size_t i = 0; i < r.rows.size(); ++i) {
        auto it = committed.find(id(p[i], rank));
        ASSERT_TRUE(it != committed.end());
        ASSERT_EQ(it->second, r.rows[i]) << "page " << i;
      }
      if (r.usable_pages > 0) ++lookups_hit;
      if (r.pin_node != kNoNode && rng() % 3 == 0) {
        index->Pin(r.pin_node);
        pins.push_back(r.pin_node);
      }
    } else if (op < 8 && pins.size() > 8) {  // Some pins stay held.
      const size_t k = rng() % pins.size();
      ASSERT_TRUE(index->Unpin(pins[k]).ok());
      pins.erase(pins.begin() + k);
    } else if (op < 9) {
      auto d = index->DropSubtree(p[rng() % p.size()]);
      ASSERT_TRUE(d.ok() || d.status().code() == absl::StatusCode::kNotFound ||
                  d.status().code() == absl::StatusCode::kFailedPrecondition)
          << d.status();
    } else {
      // Up to the whole bank: refused whenever pins protect too much.
      const uint32_t pages = 1 + rng() % 48;
      const uint32_t snapshots = rng() % 13;
      const Capacity cap = capacity(rank);
      const std::string before_alloc = Describe(index->GetUsage());
      auto rows = index->AllocateRows(rank, pages, snapshots);
      check(rows.status(), cap, pages, snapshots, before_alloc);
      if (rows.ok()) {
        ASSERT_TRUE(index->FreePageRows(rank, rows->page_rows).ok());
        ASSERT_TRUE(index->FreeSnapshotRows(rank, rows->snapshot_rows).ok());
      } else {
        ++refused;
      }
    }
    absl::Status s = index->CheckInvariants();
    ASSERT_TRUE(s.ok()) << "step " << step << ": " << s;
  }
  EXPECT_GT(commits, 100);
  EXPECT_GT(lookups_hit, 50);
  EXPECT_GT(refused, 10);
  for (uint32_t p : pins) ASSERT_TRUE(index->Unpin(p).ok());
  EXPECT_TRUE(index->CheckInvariants().ok());
}

TEST(PrefixIndexTest, MemoryPerPageAtOneMillionPages) {
  constexpr size_t kChains = 1000, kPages = 1000;
  auto index = Make(Config(kChains * kPages));
  std::vector<HashKey> chain(kPages);
  const auto start = std::chrono::steady_clock::now();
  for (size_t c = 0; c < kChains; ++c) {
    for (size_t i = 0; i < kPages; ++i) chain[i] = Key(c, i);
    auto rows = index->AllocatePageRows(0, kPages);
    ASSERT_TRUE(rows.ok()) << rows.status();
    auto r = index->Commit(0, nullptr, chain, *rows, {});
    ASSERT_TRUE(r.ok()) << r.status();
  }
  const double commit_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  PrefixIndex::Usage u = index->GetUsage();
  ASSERT_EQ(u.nodes, kChains * kPages);
  ASSERT_EQ(u.free_page_rows[0], 0u);
  const double per_page =
      static_cast<double>(index->MemoryBytes()) / (kChains * kPages);
  std::printf("[ memory ] %.1f bytes/page at %zu pages; commit %.0f pages/s\n",
              per_page, kChains * kPages, kChains * kPages / commit_s);
  EXPECT_LE(per_page, 128.0);
  ASSERT_TRUE(index->CheckInvariants().ok());

  // Lookup of a whole 1000-page chain, for orientation.
  std::vector<std::vector<HashKey>> queries;
  for (size_t c = 0; c < 16; ++c) queries.push_back(Chain(c * 61, kPages));
  uint64_t matched = 0;
  const double us = BestMicros(300, [&](int i) {
    matched += index->Lookup(queries[i % queries.size()], 0).matched_pages;
  });
  std::printf("[ lookup ] %zu hashes in a 1M-page index: %.2f us\n", kPages,
              us);
  EXPECT_EQ(matched, uint64_t{7 * 300} * kPages);
}

}  // namespace
}  // namespace kvtier::daemon::index_testing
