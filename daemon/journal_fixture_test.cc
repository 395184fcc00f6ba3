// Journals that earlier versions wrote (testdata/, see its README.md) still
// open, replay and restore to exactly the state they held; and the
// scenarios that wrote them, run by today's writer, replay alike.
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "daemon/journal.h"
#include "daemon/journal_test_util.h"
#include "daemon/test_keys.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvtier::daemon {
namespace {

using testing::Chain;
using testing::Journaled;
using testing::JournalTest;
using testing::Key;
using testing::MakeIndex;
using testing::Shape;

// The scenario that wrote testdata/journal_v1.journal (see the fixture test
// below): a hybrid namespace of 2 ranks, 16 page rows and 4 snapshot rows.
constexpr Shape kFixtureShape{
    .page_rows = 16, .snapshot_rows = 4, .tp_size = 2};

void WriteFixtureScenario(Journaled& j) {
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

// --------------------------------------------- journals old versions wrote --

// testdata/journal_v1.journal was written by the journal code of commit
// fa61dda (before torn/corrupt were told apart and before checkpoints held
// reservations) running WriteFixtureScenario above on kFixtureShape, and
// copied as is. It is data: NEVER regenerate it with a newer version (that
// would test nothing); add a new fixture for a new format instead. The
// expected nodes below are what that scenario committed (hashes Key(chain,
// page); rows as the index allocated them then).
struct FixtureNode {
  HashKey key;
  std::optional<HashKey> parent;
  std::vector<uint32_t> page_rows, snapshot_rows;  // By rank.
};

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

// The restored index holds exactly FixtureV1Nodes().
void ExpectFixtureV1Nodes(const PrefixIndex& index) {
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
  const std::vector<FixtureNode> want = FixtureV1Nodes();
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

void ExpectFixtureV1Contents(const JournalContents& c) {
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
  const std::string path =
      std::string(KVTIER_TESTDATA_DIR) + "/journal_v1.journal";
  ASSERT_TRUE(std::filesystem::exists(path)) << path;
  auto read = ReadJournal(path);
  ASSERT_TRUE(read.ok()) << read.status();
  ExpectFixtureV1Contents(*read);
  // Header, checkpoint, 4 reserves, 3 commits, a drop.
  EXPECT_EQ(read->records, 10u);
  EXPECT_EQ(read->file_bytes, 1198u);
  EXPECT_EQ(read->valid_bytes, read->file_bytes);
  auto index = MakeIndex(kFixtureShape);
  auto restored = RestoreIndex(*read, index.get());
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ(*restored, 15u);  // Node-rank pairs.
  EXPECT_TRUE(index->CheckInvariants().ok()) << index->CheckInvariants();
  ExpectFixtureV1Nodes(*index);
}

TEST_F(JournalTest, TheFixtureScenarioReplaysAlikeWithTheCurrentWriter) {
  Journaled j(path_, kFixtureShape);
  WriteFixtureScenario(j);
  JournalContents c;
  auto restored = j.Replay(&c);
  ASSERT_NE(restored, nullptr);
  ExpectFixtureV1Contents(c);
  ExpectFixtureV1Nodes(*restored);
}

}  // namespace
}  // namespace kvtier::daemon
