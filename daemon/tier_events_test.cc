// Tests of TierCore's KV events (daemon/kv_event_observer.h) through a sink
// that records them: a commit announces what it made complete, with its tokens;
// eviction and Drop withdraw what was announced; a dropped namespace is
// cleared; nothing else (deduplicated pages, a TP page only some ranks hold,
// a refused commit) makes an event.
#include <memory>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "daemon/kv_event_test_util.h"
#include "daemon/kv_event_types.h"
#include "daemon/tier_core.h"
#include "daemon/tier_core_test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvtier::daemon {
namespace {

using ::testing::HasSubstr;

class TierEventsTest : public TierCoreTest {
 protected:
  void Configure(TierOptions* o) override { o->kv_events = &sink_; }
  // Reserve + Commit of `hashes` under `parent`, with `tokens`.
  absl::Status Put(uint64_t s, uint64_t ns, const std::string& parent,
                   const std::string& hashes, std::vector<uint32_t> tokens) {
    auto r = Reserve(s, ns, hashes.size() / 32);
    if (!r.ok()) return r.status();
    v1::CommitRequest req;
    req.set_session_id(s);
    req.set_namespace_id(ns);
    req.set_reservation_id(r->reservation_id());
    req.set_parent_hash(parent);
    req.set_hashes(hashes);
    for (uint32_t t : tokens) req.add_token_ids(t);
    v1::CommitResponse resp;
    return core_->Commit(req, &resp);
  }
  static std::vector<uint32_t> Tokens(size_t pages, uint32_t from) {
    std::vector<uint32_t> t(pages * 16);
    for (size_t i = 0; i < t.size(); ++i) t[i] = from + i;
    return t;
  }
  static std::vector<std::string> Split(const std::string& hashes) {
    std::vector<std::string> out;
    for (size_t i = 0; i < hashes.size(); i += 32) {
      out.push_back(hashes.substr(i, 32));
    }
    return out;
  }
  RecordingSink sink_;
};

TEST_F(TierEventsTest, CommitsAnnounceEvictionAndDropWithdraw) {
  const uint64_t s = Open();
  v1::AttachResponse a = Attach(s, "llama", AttentionLayout(), 0, 12);
  const uint64_t ns = a.namespace_id();
  const std::string first = RandomHashes(4, 32, 1);
  ASSERT_TRUE(Put(s, ns, "", first, Tokens(4, 100)).ok());
  auto got = sink_.Take();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].first, "llama");
  const auto& stored = std::get<BlockStored>(got[0].second);
  EXPECT_EQ(stored.block_hashes, Split(first));
  EXPECT_FALSE(stored.parent_block_hash.has_value());
  EXPECT_EQ(stored.token_ids, Tokens(4, 100));
  EXPECT_EQ(stored.block_size, 16u);
  EXPECT_EQ(stored.medium, "CPU");

  // A child chain names its parent; without tokens it carries none.
  const std::string child = RandomHashes(2, 32, 2);
  ASSERT_TRUE(Put(s, ns, HashAt(first, 3, 32), child, {}).ok());
  got = sink_.Take();
  ASSERT_EQ(got.size(), 1u);
  const auto& c = std::get<BlockStored>(got[0].second);
  EXPECT_EQ(c.block_hashes, Split(child));
  EXPECT_EQ(c.parent_block_hash, HashAt(first, 3, 32));
  EXPECT_TRUE(c.token_ids.empty());

  // Deduplicated pages are not announced again.
  ASSERT_TRUE(Put(s, ns, "", first, Tokens(4, 100)).ok());
  EXPECT_TRUE(sink_.Take().empty());

  // The bank (12 rows) holds 6: an 8-page Reserve evicts two pages, leaf
  // first: the child chain.
  auto r = Reserve(s, ns, 8);
  ASSERT_TRUE(r.ok()) << r.status();
  got = sink_.Take();
  ASSERT_EQ(got.size(), 1u);
  const auto& removed = std::get<BlockRemoved>(got[0].second);
  EXPECT_EQ(
      removed.block_hashes,
      (std::vector<std::string>{HashAt(child, 1, 32), HashAt(child, 0, 32)}));
  EXPECT_EQ(removed.medium, "CPU");

  // Drop of a prefix withdraws its subtree.
  v1::DropRequest drop;
  drop.set_namespace_("llama");
  drop.set_hash(HashAt(first, 2, 32));
  v1::DropResponse dr;
  ASSERT_TRUE(core_->Drop(drop, &dr).ok());
  got = sink_.Take();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(std::get<BlockRemoved>(got[0].second).block_hashes.size(),
            dr.dropped_pages());

  // Dropping the namespace clears it.
  drop.clear_hash();
  drop.set_force(true);
  ASSERT_TRUE(core_->Drop(drop, &dr).ok());
  got = sink_.Take();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_TRUE(std::holds_alternative<AllBlocksCleared>(got[0].second));
}

TEST_F(TierEventsTest, BadTokenCountsAreRefusedAndAnnounceNothing) {
  const uint64_t s = Open();
  v1::AttachResponse a = Attach(s, "llama", AttentionLayout(), 0, 8);
  const std::string before = State();
  absl::Status st =
      Put(s, a.namespace_id(), "", RandomHashes(2, 32, 3), Tokens(1, 0));
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("token_ids: 16 token ids for 2 pages"));
  EXPECT_TRUE(sink_.Take().empty());
  EXPECT_EQ(Lookup(s, a.namespace_id(), RandomHashes(2, 32, 3)).matched_pages(),
            0u);
}

// A TP page is announced once every rank holds it.
TEST_F(TierEventsTest, TensorParallelPagesAreAnnouncedWhenComplete) {
  v1::Layout tp2 = AttentionLayout();
  tp2.set_tp_size(2);
  const uint64_t r0 = Open("rank0");
  v1::AttachResponse a = Attach(r0, "tp", tp2, 0, 8);
  const uint64_t r1 = Open("rank1");
  Attach(r1, "tp", tp2, 1, 8);
  const std::string hashes = RandomHashes(3, 32, 4);
  ASSERT_TRUE(Put(r0, a.namespace_id(), "", hashes, {}).ok());
  EXPECT_TRUE(sink_.Take().empty());
  ASSERT_TRUE(Put(r1, a.namespace_id(), "", hashes.substr(0, 64), {}).ok());
  auto got = sink_.Take();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(std::get<BlockStored>(got[0].second).block_hashes,
            Split(hashes.substr(0, 64)));
}

}  // namespace
}  // namespace kvtier::daemon
