// Journals that earlier versions wrote (testdata/, see its README.md) still
// open, replay and restore to exactly the state they held; and the
// scenarios that wrote them, run by today's writer, replay alike and write
// the same bytes.
//
// A fixture is data: NEVER regenerate one with a newer version (that would
// test nothing); add a new one when the writer writes something the others
// lack.
#include <stdlib.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "daemon/journal.h"
#include "daemon/journal_test_util.h"
#include "daemon/test_keys.h"
#include "gtest/gtest.h"

namespace kvtier::daemon {
namespace {

using testing::Chain;
using testing::Journaled;
using testing::JournalTest;
using testing::Key;
using testing::MakeIndex;
using testing::Shape;

// One node a fixture holds.
struct FixtureNode {
  HashKey key;
  std::optional<HashKey> parent;
  std::vector<uint32_t> page_rows, snapshot_rows;  // By rank.
};

// The restored index holds exactly `want`.
void ExpectNodes(const PrefixIndex& index,
                 const std::vector<FixtureNode>& want) {
  auto name = [](const HashKey& k) {
    return std::string(reinterpret_cast<const char*>(k.bytes.data()), 32);
  };
  absl::flat_hash_map<uint32_t, std::string> key_of;
  absl::flat_hash_map<std::string, FixtureNode> got;
  index.ForEachNode([&](const PrefixIndex::NodeView& v) {
    key_of[v.id] = name(*v.key);
    FixtureNode n;
    n.key = *v.key;
    if (v.parent != kNoNode) {
      const std::string& p = key_of[v.parent];
      std::memcpy(n.parent.emplace().bytes.data(), p.data(), 32);
    }
    n.page_rows.assign(v.page_rows.begin(), v.page_rows.end());
    n.snapshot_rows.assign(v.snapshot_rows.begin(), v.snapshot_rows.end());
    got[name(*v.key)] = n;
  });
  EXPECT_EQ(got.size(), want.size());
  for (const FixtureNode& w : want) {
    auto it = got.find(name(w.key));
    ASSERT_NE(it, got.end()) << "missing node " << w.page_rows[0];
    const FixtureNode& g = it->second;
    EXPECT_EQ(g.parent.has_value(), w.parent.has_value()) << w.page_rows[0];
    if (g.parent && w.parent) {
      EXPECT_EQ(name(*g.parent), name(*w.parent)) << w.page_rows[0];
    }
    EXPECT_EQ(g.page_rows, w.page_rows) << w.page_rows[0];
    EXPECT_EQ(g.snapshot_rows, w.snapshot_rows) << w.page_rows[0];
  }
}

// Expects the file `written` to hold exactly the bytes of `fixture`: today's
// writer writes what the older one did, CRCs included. A writer that writes
// other bytes on purpose (a new format) keeps the replay tests of the
// fixtures before it, drops this comparison for them and adds a fixture of
// its own.
void ExpectSameBytes(const std::string& written, const std::string& fixture) {
  auto slurp = [](const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
  };
  const std::string a = slurp(written), b = slurp(fixture);
  size_t at = 0;
  while (at < a.size() && at < b.size() && a[at] == b[at]) ++at;
  EXPECT_TRUE(a == b) << "today's writer wrote " << a.size()
                      << " bytes, the fixture " << fixture << " has "
                      << b.size() << ": the first difference is at offset "
                      << at;
}

// Copies `path` to $KVTIER_WRITE_JOURNAL_FIXTURE when set: how a new
// fixture is made (never an existing one remade).
void MaybeWriteFixture(const std::string& path) {
  if (const char* out = getenv("KVTIER_WRITE_JOURNAL_FIXTURE")) {
    std::filesystem::copy_file(
        path, out, std::filesystem::copy_options::overwrite_existing);
  }
}

std::string FixturePath(const std::string& name) {
  return std::string(KVTIER_TESTDATA_DIR) + "/" + name;
}

// ------------------------------------------------------------------ v1 --

// testdata/journal_v1.journal was written by the journal code of commit
// fa61dda (before torn/corrupt were told apart and before checkpoints held
// reservations) running WriteV1Scenario on kV1Shape, a hybrid namespace of
// 2 ranks, 16 page rows and 4 snapshot rows, and copied as is. Its one
// checkpoint has no reservation outstanding. FixtureV1Nodes are what that
// scenario committed (hashes Key(chain, page); rows as the index allocated
// them then).
constexpr Shape kV1Shape{.page_rows = 16, .snapshot_rows = 4, .tp_size = 2};

void WriteV1Scenario(Journaled& j) {
  const auto a = Chain(1, 4);
  const auto b = Chain(2, 2);
  const auto c = Chain(3, 3);
  const HashKey e0 = Key(5, 0);
  auto r = j.Reserve(0, 4, 1);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(j.Commit(0, nullptr, a, *r, {3}).ok());
  r = j.Reserve(1, 4, 1);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(j.Commit(1, nullptr, a, *r, {1}).ok());
  r = j.Reserve(0, 2);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(j.Commit(0, nullptr, b, *r).ok());
  // The node checkpoint: a[0..3], b[0..1].
  ASSERT_TRUE(j.journal().Checkpoint(j.index()).ok());
  r = j.Reserve(0, 3, 1);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(j.Commit(0, &a[1], c, *r, {2}).ok());
  r = j.Reserve(1, 2);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(j.Commit(1, &a[1], {c[0], c[1]}, *r).ok());
  // a[3] deduplicates on rank 0 (page and snapshot); e0 is new.
  r = j.Reserve(0, 2, 1);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(j.Commit(0, &a[2], {a[3], e0}, *r, {0}).ok());
  ASSERT_TRUE(j.Drop(b[1]).ok());
  // Reserved, never committed.
  r = j.Reserve(1, 2, 1);
  ASSERT_TRUE(r.ok()) << r.status();
}

std::vector<FixtureNode> FixtureV1Nodes() {
  constexpr uint32_t x = kNoRow;
  const HashKey a0 = Key(1, 0), a1 = Key(1, 1), a2 = Key(1, 2), a3 = Key(1, 3);
  const HashKey b0 = Key(2, 0), c0 = Key(3, 0), c1 = Key(3, 1), c2 = Key(3, 2);
  const HashKey e0 = Key(5, 0);
  return {
      {a0, std::nullopt, {0, 0}, {x, x}},
      {a1, a0, {1, 1}, {x, 0}},
      {a2, a1, {2, 2}, {x, x}},
      {a3, a2, {3, 3}, {0, x}},            // Rank 0's second a[3] deduplicated.
      {b0, std::nullopt, {4, x}, {x, x}},  // b[1] dropped.
      {c0, a1, {6, 4}, {x, x}},
      {c1, c0, {7, 5}, {x, x}},
      {c2, c1, {8, x}, {1, x}},
      {e0, a3, {10, x}, {x, x}},  // Row 9 went to the deduplicated a[3].
  };
}

void ExpectV1Contents(const JournalContents& c) {
  EXPECT_EQ(c.stopped, "");
  EXPECT_FALSE(c.corrupt);
  EXPECT_EQ(c.inconsistent, 0u);
  EXPECT_EQ(c.header.name, "ns-test");
  EXPECT_EQ(c.header.page_rows, 16u);
  EXPECT_EQ(c.header.snapshot_rows, 4u);
  EXPECT_EQ(c.header.layout.tp_size(), 2u);
  EXPECT_EQ(c.header.layout.snapshot_row_bytes(), 512u);
  ASSERT_EQ(c.header.segments.size(), 2u);
  EXPECT_EQ(c.header.segments[1].path, "/dev/shm/x.kv.r1");
  EXPECT_EQ(c.header.segments[1].created_unix_ns, 1001u);
  EXPECT_EQ(c.ranks, 2u);
  EXPECT_EQ(c.keys.size(), 9u);
  // Rank 1's last reservation was never committed.
  EXPECT_EQ(c.outstanding_page_rows,
            (std::vector<std::vector<uint32_t>>{{}, {6, 7}}));
  EXPECT_EQ(c.outstanding_snapshot_rows,
            (std::vector<std::vector<uint32_t>>{{}, {1}}));
}

TEST(JournalFixtureTest, JournalV1StillReplays) {
  const std::string path = FixturePath("journal_v1.journal");
  ASSERT_TRUE(std::filesystem::exists(path)) << path;
  auto read = ReadJournal(path);
  ASSERT_TRUE(read.ok()) << read.status();
  ExpectV1Contents(*read);
  // Header, checkpoint, 4 reserves, 3 commits, a drop.
  EXPECT_EQ(read->records, 10u);
  EXPECT_EQ(read->file_bytes, 1198u);
  EXPECT_EQ(read->valid_bytes, read->file_bytes);
  auto index = MakeIndex(kV1Shape);
  auto restored = RestoreIndex(*read, index.get());
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ(*restored, 15u);  // Node-rank pairs.
  EXPECT_TRUE(index->CheckInvariants().ok()) << index->CheckInvariants();
  ExpectNodes(*index, FixtureV1Nodes());
}

TEST_F(JournalTest, TheV1ScenarioReplaysAlikeWithTheCurrentWriter) {
  Journaled j(path_, kV1Shape);
  WriteV1Scenario(j);
  JournalContents c;
  auto restored = j.Replay(&c);
  ASSERT_NE(restored, nullptr);
  ExpectV1Contents(c);
  ExpectNodes(*restored, FixtureV1Nodes());
  ExpectSameBytes(path_, FixturePath("journal_v1.journal"));
}

// ------------------------------------------------------------------ v2 --

// testdata/journal_v2.journal was written by the journal code of commit
// 07a59f1 (the last with its own CRC-32C, before ISA-L's) running
// WriteV2Scenario on kV2Shape: this file's
// TheV2ScenarioReplaysAlikeWithTheCurrentWriter, built against that commit,
// with KVTIER_WRITE_JOURNAL_FIXTURE set to the fixture's path. What v1 lacks:
// 16-byte (XXH3-128) hashes, max_replay_tokens, and a checkpoint taken while
// reservations were outstanding, so that it holds reservation records: one
// consumed after it by a commit with a snapshot, one never committed. After
// it: an abort and the same row reserved again, a fully deduplicated commit,
// a reservation that evicts, a drop, and a reservation left open.
constexpr Shape kV2Shape{.page_rows = 12,
                         .snapshot_rows = 4,
                         .tp_size = 2,
                         .hash_bytes = 16,
                         .max_replay_tokens = 64};

// Key(chain, page) cut to 16 bytes (the rest zero, as the index keeps it).
HashKey Key16(uint64_t chain, uint64_t page) {
  HashKey k = Key(chain, page);
  std::memset(k.bytes.data() + 16, 0, k.bytes.size() - 16);
  return k;
}

void WriteV2Scenario(Journaled& j) {
  const HashKey a0 = Key16(11, 0), a1 = Key16(11, 1), a2 = Key16(11, 2);
  const HashKey b0 = Key16(12, 0), b1 = Key16(12, 1), c0 = Key16(13, 0);
  std::vector<HashKey> d;
  for (int i = 0; i < 8; ++i) d.push_back(Key16(14, i));
  auto r = j.Reserve(0, 3, 1);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(j.Commit(0, nullptr, {a0, a1, a2}, *r, {2}).ok());
  r = j.Reserve(1, 3);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(j.Commit(1, nullptr, {a0, a1, a2}, *r).ok());
  // Outstanding at the checkpoint: p0 committed after it, p1 never.
  auto p0 = j.Reserve(0, 2, 1);
  ASSERT_TRUE(p0.ok()) << p0.status();
  auto p1 = j.Reserve(1, 2, 1);
  ASSERT_TRUE(p1.ok()) << p1.status();
  ASSERT_TRUE(j.journal().Checkpoint(j.index()).ok());
  ASSERT_TRUE(j.Commit(0, &a2, {b0, b1}, *p0, {1}).ok());
  // An abort (unjournaled), the same row reserved again and committed.
  r = j.Reserve(0, 1);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(j.index().FreePageRows(0, r->pages).ok());
  r = j.Reserve(0, 1);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(j.Commit(0, &a0, {c0}, *r).ok());
  // Fully deduplicated: the commit record names no row.
  r = j.Reserve(0, 2);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(j.Commit(0, &a0, {a1, a2}, *r).ok());
  // Eight rows of rank 0's twelve: evicts what no commit since has used.
  // The rows in the order 07a59f1's allocator (a LIFO free stack) handed
  // them out: the evicted b rows, the deduplicated commit's, then the
  // untouched rest. Today's allocator hands out runs; the fixture keeps
  // the old order.
  r = j.ReserveAs(0, {.pages = {3, 4, 7, 6, 8, 9, 10, 11}});
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(j.Commit(0, nullptr, d, *r).ok());
  ASSERT_TRUE(j.Drop(d[6]).ok());
  // Reserved, never committed: the row d[6] freed, as 07a59f1 chose.
  r = j.ReserveAs(0, {.pages = {10}, .snapshots = {1}});
  ASSERT_TRUE(r.ok()) << r.status();
}

std::vector<FixtureNode> FixtureV2Nodes() {
  constexpr uint32_t x = kNoRow;
  const HashKey a0 = Key16(11, 0), a1 = Key16(11, 1), a2 = Key16(11, 2);
  const HashKey c0 = Key16(13, 0);
  HashKey d[6];
  for (int i = 0; i < 6; ++i) d[i] = Key16(14, i);
  return {
      {a0, std::nullopt, {0, 0}, {x, x}},
      {a1, a0, {1, 1}, {x, x}},
      {a2, a1, {2, 2}, {0, x}},
      {c0, a0, {5, x}, {x, x}},  // Row 5 reserved, aborted, reserved again.
      // b[0..1] held rows 3 and 4 until d's reservation took them.
      {d[0], std::nullopt, {3, x}, {x, x}},
      {d[1], d[0], {4, x}, {x, x}},
      {d[2], d[1], {7, x}, {x, x}},  // Rows 6 and 7: the deduplicated commit's.
      {d[3], d[2], {6, x}, {x, x}},
      {d[4], d[3], {8, x}, {x, x}},
      {d[5], d[4], {9, x}, {x, x}},  // d[6..7] dropped.
  };
}

void ExpectV2Contents(const JournalContents& c) {
  EXPECT_EQ(c.stopped, "");
  EXPECT_FALSE(c.corrupt);
  EXPECT_EQ(c.inconsistent, 0u);
  EXPECT_EQ(c.header.name, "ns-test");
  EXPECT_EQ(c.header.layout.hash_kind(), v1::HASH_KIND_XXH3_128);
  EXPECT_EQ(c.hash_bytes, 16u);
  EXPECT_EQ(c.header.page_rows, 12u);
  EXPECT_EQ(c.header.snapshot_rows, 4u);
  EXPECT_EQ(c.header.max_replay_tokens, 64u);
  EXPECT_EQ(c.header.layout.tp_size(), 2u);
  ASSERT_EQ(c.header.segments.size(), 2u);
  EXPECT_EQ(c.header.segments[0].bank, "kv");
  EXPECT_EQ(c.header.segments[0].path, "/dev/shm/x.kv.r0");
  EXPECT_EQ(c.header.segments[0].created_unix_ns, 1000u);
  EXPECT_EQ(c.ranks, 2u);
  EXPECT_EQ(c.keys.size(), 10u);
  // Rank 0: the last reservation. Rank 1: the one the checkpoint carried.
  EXPECT_EQ(c.outstanding_page_rows,
            (std::vector<std::vector<uint32_t>>{{10}, {3, 4}}));
  EXPECT_EQ(c.outstanding_snapshot_rows,
            (std::vector<std::vector<uint32_t>>{{1}, {0}}));
}

TEST(JournalFixtureTest, JournalV2StillReplays) {
  const std::string path = FixturePath("journal_v2.journal");
  ASSERT_TRUE(std::filesystem::exists(path)) << path;
  auto read = ReadJournal(path);
  ASSERT_TRUE(read.ok()) << read.status();
  ExpectV2Contents(*read);
  // Header, checkpoint (nodes, a reservation per rank), 6 reserves, 3
  // commits, a drop.
  EXPECT_EQ(read->records, 14u);
  EXPECT_EQ(read->file_bytes, 979u);
  EXPECT_EQ(read->valid_bytes, read->file_bytes);
  auto index = MakeIndex(kV2Shape);
  auto restored = RestoreIndex(*read, index.get());
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ(*restored, 13u);  // Node-rank pairs.
  EXPECT_TRUE(index->CheckInvariants().ok()) << index->CheckInvariants();
  ExpectNodes(*index, FixtureV2Nodes());
}

TEST_F(JournalTest, TheV2ScenarioReplaysAlikeWithTheCurrentWriter) {
  Journaled j(path_, kV2Shape);
  WriteV2Scenario(j);
  MaybeWriteFixture(path_);
  JournalContents c;
  auto restored = j.Replay(&c);
  ASSERT_NE(restored, nullptr);
  j.ExpectRestored(j.index(), *restored);
  ExpectV2Contents(c);
  ExpectNodes(*restored, FixtureV2Nodes());
  ExpectSameBytes(path_, FixturePath("journal_v2.journal"));
}

// ------------------------------------------------------------------ v3 --

// testdata/journal_v3.journal was written by this file's
// TheV3ScenarioReplaysAlikeWithTheCurrentWriter at the commit that added
// release records (issue 27, item 1). What v2 lacks: a release record.
// The scenario is the prefetch's, on a full bank: a reservation that
// evicts committed pages, part of it released (the pages past a refused
// value), the rest committed; then a reservation released whole.
constexpr Shape kV3Shape{.page_rows = 8, .snapshot_rows = 2, .tp_size = 1};

void WriteV3Scenario(Journaled& j) {
  const auto a = Chain(21, 4);
  const auto b = Chain(22, 4);
  const auto c = Chain(23, 1);
  auto r = j.Reserve(0, 4, 1);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(j.Commit(0, nullptr, a, *r, {3}).ok());
  r = j.Reserve(0, 4);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(j.Commit(0, nullptr, b, *r).ok());
  // The bank is full: three rows evicted from a's tail (the older chain).
  r = j.Reserve(0, 3);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(j.Release(0, {.pages = {r->pages[1], r->pages[2]}}).ok());
  ASSERT_TRUE(j.Commit(0, nullptr, c, {.pages = {r->pages[0]}}).ok());
  // Released whole, snapshot row included.
  r = j.Reserve(0, 2, 1);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(j.Release(0, *r).ok());
}

std::vector<FixtureNode> FixtureV3Nodes() {
  constexpr uint32_t x = kNoRow;
  const auto a = Chain(21, 4);
  const auto b = Chain(22, 4);
  const auto c = Chain(23, 1);
  // The rows as the allocator of the fixture's commit handed them out.
  return {
      {a[0], std::nullopt, {0}, {x}},
      {b[0], std::nullopt, {4}, {x}},
      {b[1], b[0], {5}, {x}},
      {b[2], b[1], {6}, {x}},
      {b[3], b[2], {7}, {x}},
      {c[0], std::nullopt, {1}, {x}},  // a[1..3] evicted.
  };
}

void ExpectV3Contents(const JournalContents& c) {
  EXPECT_EQ(c.stopped, "");
  EXPECT_FALSE(c.corrupt);
  EXPECT_EQ(c.inconsistent, 0u);
  EXPECT_EQ(c.header.page_rows, 8u);
  EXPECT_EQ(c.ranks, 1u);
  EXPECT_EQ(c.keys.size(), 6u);
  // Every reserved row was committed or released: nothing to fence.
  EXPECT_EQ(c.outstanding_page_rows, (std::vector<std::vector<uint32_t>>{{}}));
  EXPECT_EQ(c.outstanding_snapshot_rows,
            (std::vector<std::vector<uint32_t>>{{}}));
}

TEST(JournalFixtureTest, JournalV3StillReplays) {
  const std::string path = FixturePath("journal_v3.journal");
  ASSERT_TRUE(std::filesystem::exists(path)) << path;
  auto read = ReadJournal(path);
  ASSERT_TRUE(read.ok()) << read.status();
  ExpectV3Contents(*read);
  auto index = MakeIndex(kV3Shape);
  auto restored = RestoreIndex(*read, index.get());
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ(*restored, 6u);
  EXPECT_TRUE(index->CheckInvariants().ok()) << index->CheckInvariants();
  ExpectNodes(*index, FixtureV3Nodes());
}

TEST_F(JournalTest, TheV3ScenarioReplaysAlikeWithTheCurrentWriter) {
  Journaled j(path_, kV3Shape);
  WriteV3Scenario(j);
  MaybeWriteFixture(path_);
  JournalContents c;
  auto restored = j.Replay(&c);
  ASSERT_NE(restored, nullptr);
  j.ExpectRestored(j.index(), *restored);
  ExpectV3Contents(c);
  ExpectNodes(*restored, FixtureV3Nodes());
  ExpectSameBytes(path_, FixturePath("journal_v3.journal"));
}

}  // namespace
}  // namespace kvtier::daemon
