// Helpers of the namespace journal's tests (journal*_test.cc): a live index
// driven with its journal as TierCore drives them (Journaled), the shapes
// and headers they use, and a test fixture with a fresh state folder.
//
// Thread-safety: test code; one thread.
#ifndef KVTIER_DAEMON_JOURNAL_TEST_UTIL_H_
#define KVTIER_DAEMON_JOURNAL_TEST_UTIL_H_

#include <stdlib.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "daemon/journal.h"
#include "daemon/namespace_layout.h"
#include "daemon/prefix_index.h"
#include "gtest/gtest.h"

namespace kvtier::daemon::testing {

// A namespace's shape: bank sizes, ranks, hash width (32: SHA-256, the
// header's hash kind left unspecified; 16: XXH3-128) and the header's
// max_replay_tokens.
struct Shape {
  uint64_t page_rows = 64;
  uint64_t snapshot_rows = 0;
  uint32_t tp_size = 1;
  uint32_t hash_bytes = 32;
  uint32_t max_replay_tokens = 0;
};

// Returns the header of namespace "ns-test" of `shape`: one page bank "kv"
// of 256-byte rows (plus 512-byte snapshot rows when it has any), rank r's
// segment "/dev/shm/x.kv.r<r>" created at 1000 + r.
inline JournalHeader HeaderFor(const Shape& shape) {
  JournalHeader h;
  h.name = "ns-test";
  v1::Layout l;
  l.set_model("journal-test");
  l.set_tokens_per_page(16);
  l.set_num_layers(2);
  auto* kv = l.add_page_banks();
  kv->set_name("kv");
  kv->set_row_bytes(256);
  l.set_tp_size(shape.tp_size);
  l.set_snapshot_row_bytes(shape.snapshot_rows > 0 ? 512 : 0);
  if (shape.hash_bytes == 16) l.set_hash_kind(v1::HASH_KIND_XXH3_128);
  h.layout = NormalizeLayout(l);
  h.page_rows = shape.page_rows;
  h.snapshot_rows = shape.snapshot_rows;
  h.max_replay_tokens = shape.max_replay_tokens;
  for (uint32_t r = 0; r < shape.tp_size; ++r) {
    h.segments.push_back(
        {"kv", r, absl::StrCat("/dev/shm/x.kv.r", r), 1000 + r});
  }
  return h;
}

// Returns an empty index of `shape`.
inline std::unique_ptr<PrefixIndex> MakeIndex(const Shape& shape) {
  IndexConfig c;
  c.hash_bytes = shape.hash_bytes;
  c.tokens_per_page = 16;
  c.tp_size = shape.tp_size;
  c.page_rows = shape.page_rows;
  c.snapshot_rows = shape.snapshot_rows;
  auto index = PrefixIndex::Create(c);
  EXPECT_TRUE(index.ok()) << index.status();
  return *std::move(index);
}

// A live index with its journal, driven as TierCore drives them, plus what
// each row's bytes are: the key of the page last committed into it, or
// "overwritten" once a reservation handed it out.
class Journaled {
 public:
  Journaled(const std::string& path, const Shape& shape,
            JournalOptions options = {})
      : shape_(shape), index_(MakeIndex(shape)) {
    auto j = NamespaceJournal::Create(path, HeaderFor(shape), *index_, options);
    EXPECT_TRUE(j.ok()) << j.status();
    journal_ = *std::move(j);
  }

  struct Rows {
    std::vector<uint32_t> pages, snapshots;
  };
  absl::StatusOr<Rows> Reserve(uint32_t rank, uint32_t pages,
                               uint32_t snapshots = 0) {
    auto rows = Allocate(rank, pages, snapshots);
    if (!rows.ok()) return rows.status();
    if (absl::Status s = Journal(rank, *rows); !s.ok()) return s;
    return rows;
  }

  // Reserve as the index would (evicting what it would), then trades the
  // rows it chose for `want`, which must be free once those are given back:
  // for a scenario that has to journal the rows an earlier allocator chose
  // (journal_fixture_test), whatever today's placement policy.
  absl::StatusOr<Rows> ReserveAs(uint32_t rank, const Rows& want) {
    auto chosen = Allocate(rank, want.pages.size(), want.snapshots.size());
    if (!chosen.ok()) return chosen.status();
    if (absl::Status s = index_->FreePageRows(rank, chosen->pages); !s.ok()) {
      return s;
    }
    if (absl::Status s = index_->FreeSnapshotRows(rank, chosen->snapshots);
        !s.ok()) {
      return s;
    }
    if (absl::Status s = index_->ClaimPageRows(rank, want.pages); !s.ok()) {
      return s;
    }
    if (absl::Status s = index_->ClaimSnapshotRows(rank, want.snapshots);
        !s.ok()) {
      return s;
    }
    if (absl::Status s = Journal(rank, want); !s.ok()) return s;
    return want;
  }

  absl::Status Commit(uint32_t rank, const HashKey* parent,
                      const std::vector<HashKey>& hashes, const Rows& rows,
                      const std::vector<size_t>& snapshot_at = {}) {
    std::vector<PrefixIndex::SnapshotPlacement> placements;
    for (size_t j = 0; j < snapshot_at.size(); ++j) {
      placements.push_back({rows.snapshots[j], hashes[snapshot_at[j]]});
    }
    for (size_t i = 0; i < hashes.size(); ++i) {
      page_bytes_[{rank, rows.pages[i]}] = Name(hashes[i]);
    }
    for (const auto& p : placements) snap_bytes_[{rank, p.row}] = Name(p.hash);
    auto r = index_->Commit(rank, parent, hashes, rows.pages, placements);
    if (!r.ok()) return r.status();
    return journal_->AppendCommit(rank, parent, hashes, rows.pages, placements,
                                  r->freed_page_rows, r->freed_snapshot_rows);
  }

  // Gives `rows` of `rank` (reserved, not committed) back to the index and
  // journals their release, as the prefetch does with the rows of pages
  // past a refused value. Their bytes stay "overwritten".
  absl::Status Release(uint32_t rank, const Rows& rows) {
    if (absl::Status s =
            journal_->AppendRelease(rank, rows.pages, rows.snapshots);
        !s.ok()) {
      return s;
    }
    if (absl::Status s = index_->FreePageRows(rank, rows.pages); !s.ok()) {
      return s;
    }
    return index_->FreeSnapshotRows(rank, rows.snapshots);
  }

  absl::Status Drop(const HashKey& hash) {
    auto r = index_->DropSubtree(hash);
    if (!r.ok()) return r.status();
    return journal_->AppendDrop(hash);
  }

  // Replays the journal into a fresh index.
  std::unique_ptr<PrefixIndex> Replay(JournalContents* contents = nullptr) {
    auto read = ReadJournal(journal_->path());
    EXPECT_TRUE(read.ok()) << read.status();
    if (!read.ok()) return nullptr;
    auto copy = MakeIndex(shape_);
    auto restored = RestoreIndex(*read, copy.get());
    EXPECT_TRUE(restored.ok()) << restored.status();
    EXPECT_TRUE(copy->CheckInvariants().ok()) << copy->CheckInvariants();
    EXPECT_EQ(read->inconsistent, 0u);
    EXPECT_EQ(read->stopped, "");
    EXPECT_FALSE(read->corrupt);
    if (contents != nullptr) *contents = *std::move(read);
    return copy;
  }

  // Every node of `live` is in `restored` with the same rows; every row
  // `restored` serves holds its node's bytes.
  void ExpectRestored(const PrefixIndex& live, const PrefixIndex& restored) {
    absl::flat_hash_map<std::string, std::vector<uint32_t>> got;
    restored.ForEachNode([&](const PrefixIndex::NodeView& v) {
      std::vector<uint32_t> rows(v.page_rows.begin(), v.page_rows.end());
      rows.insert(rows.end(), v.snapshot_rows.begin(), v.snapshot_rows.end());
      got[Name(*v.key)] = rows;
      for (uint32_t r = 0; r < v.page_rows.size(); ++r) {
        if (v.page_rows[r] != kNoRow) {
          EXPECT_EQ(page_bytes_[std::make_pair(r, v.page_rows[r])],
                    Name(*v.key))
              << "restored page row " << v.page_rows[r] << " of rank " << r
              << " holds other bytes";
        }
        if (!v.snapshot_rows.empty() && v.snapshot_rows[r] != kNoRow) {
          EXPECT_EQ(snap_bytes_[std::make_pair(r, v.snapshot_rows[r])],
                    Name(*v.key))
              << "restored snapshot row " << v.snapshot_rows[r]
              << " holds other bytes";
        }
      }
    });
    // Where the live node has a row, the restored one has the same. The
    // restored node may hold more: rows evicted without a later reservation
    // (a failed allocation's evictions, the other ranks' snapshot rows of a
    // snapshot eviction) come back, their bytes intact.
    live.ForEachNode([&](const PrefixIndex::NodeView& v) {
      std::vector<uint32_t> rows(v.page_rows.begin(), v.page_rows.end());
      rows.insert(rows.end(), v.snapshot_rows.begin(), v.snapshot_rows.end());
      auto it = got.find(Name(*v.key));
      ASSERT_NE(it, got.end()) << "a committed node was not restored";
      ASSERT_EQ(it->second.size(), rows.size());
      for (size_t i = 0; i < rows.size(); ++i) {
        if (rows[i] != kNoRow) {
          EXPECT_EQ(it->second[i], rows[i]) << i;
        }
      }
    });
    PrefixIndex::Usage u = restored.GetUsage();
    for (uint64_t a : u.allocated_page_rows) EXPECT_EQ(a, 0u);
    for (uint64_t a : u.allocated_snapshot_rows) EXPECT_EQ(a, 0u);
  }

  PrefixIndex& index() { return *index_; }
  NamespaceJournal& journal() { return *journal_; }

 private:
  // The index's rows for a reservation, not yet journaled.
  absl::StatusOr<Rows> Allocate(uint32_t rank, size_t pages, size_t snapshots) {
    Rows rows;
    if (pages > 0) {
      auto p = index_->AllocatePageRows(rank, pages);
      if (!p.ok()) return p.status();
      rows.pages = *p;
    }
    if (snapshots > 0) {
      auto s = index_->AllocateSnapshotRows(rank, snapshots);
      if (!s.ok()) {
        EXPECT_TRUE(index_->FreePageRows(rank, rows.pages).ok());
        return s.status();
      }
      rows.snapshots = *s;
    }
    return rows;
  }

  // Journals the reservation of `rows` and marks them overwritten.
  absl::Status Journal(uint32_t rank, const Rows& rows) {
    if (absl::Status s =
            journal_->AppendReserve(rank, rows.pages, rows.snapshots);
        !s.ok()) {
      return s;
    }
    for (uint32_t row : rows.pages) page_bytes_[{rank, row}] = kOverwritten;
    for (uint32_t row : rows.snapshots) snap_bytes_[{rank, row}] = kOverwritten;
    return absl::OkStatus();
  }

  static constexpr const char* kOverwritten = "overwritten";
  static std::string Name(const HashKey& k) {
    return std::string(reinterpret_cast<const char*>(k.bytes.data()), 32);
  }
  Shape shape_;
  std::unique_ptr<PrefixIndex> index_;
  std::unique_ptr<NamespaceJournal> journal_;
  absl::flat_hash_map<std::pair<uint32_t, uint32_t>, std::string> page_bytes_,
      snap_bytes_;
};

// A fresh state folder in /dev/shm, removed after the test; path_ is its
// journal of "ns-test".
class JournalTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/dev/shm/kvtier-journal-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    path_ = JournalPath(dir_, "ns-test");
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string dir_;
  std::string path_;
};

// Reads `path`, expecting it whole (no torn tail, no corruption).
inline JournalContents MustRead(const std::string& path) {
  auto read = ReadJournal(path);
  EXPECT_TRUE(read.ok()) << read.status();
  if (!read.ok()) return {};
  EXPECT_EQ(read->stopped, "");
  return *std::move(read);
}

// Returns `rows` sorted ascending.
inline std::vector<uint32_t> Sorted(std::vector<uint32_t> rows) {
  std::sort(rows.begin(), rows.end());
  return rows;
}

}  // namespace kvtier::daemon::testing

#endif  // KVTIER_DAEMON_JOURNAL_TEST_UTIL_H_
