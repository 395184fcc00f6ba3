// Tests of the cluster tier through TierCore (daemon/cluster_bridge.h,
// daemon/prefetch_job.h): two "nodes" (cores with their own banks) share a
// real three-master Redis Cluster; what one commits or evicts, the other
// finds with a remote lookup and prefetches, bit for bit. Values that fail
// their checks are misses.
//
// Thread-safety: single-threaded tests (the cores run their own threads).
#include <filesystem>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/cluster_value.h"
#include "daemon/kv_event_test_util.h"
#include "daemon/redis_cluster.h"
#include "daemon/tier_cluster_test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvtier::daemon {
namespace {

using testing::RedisClusterFixture;

class TierClusterTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!RedisClusterFixture::Available().ok()) return;
    redis_ = new RedisClusterFixture();
    absl::Status s = redis_->Start();
    if (!s.ok()) {
      delete redis_;
      redis_ = nullptr;
      start_error_ = new std::string(s.ToString());
    }
  }
  static void TearDownTestSuite() {
    delete redis_;
    redis_ = nullptr;
  }
  void SetUp() override {
    KVTIER_REDIS_OR_SKIP();
    ASSERT_NE(redis_, nullptr) << (start_error_ ? *start_error_ : "");
  }

  // SET `value` under `key` as the administrator, on the slot's master.
  static void Plant(const std::string& key, const std::string& value) {
    auto master = redis_->MasterOfSlot(RedisKeySlot(key));
    ASSERT_TRUE(master.ok()) << master.status();
    auto r = redis_->Command(*master, {"SET", key, value});
    ASSERT_TRUE(r.ok()) << r.status();
  }
  static std::string Fetch(const std::string& key) {
    auto master = redis_->MasterOfSlot(RedisKeySlot(key));
    EXPECT_TRUE(master.ok()) << master.status();
    auto r = redis_->Command(*master, {"GET", key});
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : "";
  }
  // Flips one byte of the value under `key` (inside its rows) in Redis;
  // the value before goes to `original` when not null.
  static void Corrupt(const std::string& key, std::string* original) {
    std::string value = Fetch(key);
    ASSERT_GT(value.size(), 200u);
    if (original != nullptr) *original = value;
    value[150] ^= 1;
    Plant(key, value);
  }

  static RedisClusterFixture* redis_;
  static std::string* start_error_;
};
RedisClusterFixture* TierClusterTest::redis_ = nullptr;
std::string* TierClusterTest::start_error_ = nullptr;

TEST_F(TierClusterTest, WrittenThroughOnOneNodePrefetchedOnAnotherBitForBit) {
  ClusterNode a(*redis_, /*write_through=*/true);
  ClusterNode b(*redis_, /*write_through=*/true);
  const v1::Layout layout = HybridLayout();
  a.Attach("wt", layout);
  b.Attach("wt", layout);
  const std::string hashes = RandomHashes(20, 32, 101);
  a.WritePages(1, "", hashes.substr(0, 12 * 32), 0);
  a.WritePages(1, HashAt(hashes, 11, 32), hashes.substr(12 * 32), 12,
               /*snapshot_last=*/true);
  a.WaitSpilled(20);
  // B holds nothing; the cluster tier holds all 20 pages.
  v1::LookupResponse r = b.Lookup(hashes, /*remote=*/true);
  EXPECT_EQ(r.matched_pages(), 0u);
  EXPECT_EQ(r.remote_pages(), 20u);
  EXPECT_EQ(r.prefetching_pages(), 0u);
  // Without remote, nothing is asked of Redis.
  EXPECT_EQ(b.Lookup(hashes, false).remote_pages(), 0u);
  auto p = b.Prefetch(hashes);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->local_pages(), 0u);
  EXPECT_EQ(p->remote_pages() + p->prefetching_pages(), 20u);
  EXPECT_EQ(b.WaitPrefetched(hashes), 20u);
  b.ExpectPages(1, hashes, 20, /*snapshot_page=*/19);
  EXPECT_EQ(b.Lookup(hashes, true).usable_pages(), 20u);
  EXPECT_TRUE(b.core().CheckInvariants().ok());
  const ClusterCounters c = b.cluster().Counters();
  EXPECT_EQ(c.prefetched_pages, 20u);
  EXPECT_EQ(c.rejected_values, 0u);
  EXPECT_EQ(c.prefetches_cut, 0u);
  // A prefix held locally needs no prefetch.
  auto again = b.Prefetch(hashes);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->local_pages(), 20u);
  EXPECT_EQ(again->remote_pages(), 0u);
}

TEST_F(TierClusterTest, EvictedPagesAreSpilledAndFoundElsewhere) {
  // A's bank holds 16 pages and does not write through: only eviction
  // spills. The first prefix is evicted by the next two.
  ClusterNode a(*redis_, /*write_through=*/false, TestClusterKey(),
                /*page_rows=*/16);
  ClusterNode b(*redis_, /*write_through=*/false);
  const v1::Layout layout = AttentionLayout();
  a.Attach("spill", layout);
  b.Attach("spill", layout);
  const std::string first = RandomHashes(8, 32, 201);
  a.WritePages(7, "", first, 0);
  EXPECT_EQ(a.cluster().Counters().spill_queue_bytes, 0u);
  EXPECT_EQ(b.Lookup(first, true).remote_pages(), 0u);  // Not spilled yet.
  a.WritePages(8, "", RandomHashes(8, 32, 202), 0);
  a.WritePages(9, "", RandomHashes(8, 32, 203), 0);  // Evicts `first`.
  EXPECT_EQ(a.Lookup(first, false).matched_pages(), 0u);
  a.WaitSpilled(8);
  EXPECT_EQ(b.Lookup(first, true).remote_pages(), 8u);
  ASSERT_TRUE(b.Prefetch(first).ok());
  EXPECT_EQ(b.WaitPrefetched(first), 8u);
  b.ExpectPages(7, first, 8);
  // A finds its own evicted prefix there too.
  EXPECT_EQ(a.Lookup(first, true).remote_pages(), 8u);
}

TEST_F(TierClusterTest, ACorruptValueIsAMissAndEndsThePrefetchThere) {
  ClusterNode a(*redis_, true);
  ClusterNode b(*redis_, true);
  const v1::Layout layout = AttentionLayout();
  a.Attach("corrupt", layout);
  b.Attach("corrupt", layout);
  const std::string hashes = RandomHashes(10, 32, 301);
  a.WritePages(3, "", hashes, 0);
  a.WaitSpilled(10);
  // Flip one byte of page 6's rows in Redis.
  ASSERT_NO_FATAL_FAILURE(
      Corrupt(ClusterKeyOf("corrupt", layout, hashes, 6), nullptr));
  ASSERT_TRUE(b.Prefetch(hashes).ok());
  EXPECT_EQ(b.WaitPrefetched(hashes), 6u);  // Pages 0-5, never 6.
  b.ExpectPages(3, hashes, 6);
  const ClusterCounters c = b.cluster().Counters();
  EXPECT_GE(c.rejected_values, 1u);
  EXPECT_EQ(c.prefetches_cut, 1u);
  EXPECT_TRUE(b.core().CheckInvariants().ok());
}

// One slice out at a time, and many (slices of 2 pages, 4 out at once, 3
// check threads): the same bytes; with slices fetched past a corrupt page,
// nothing after it is committed and the job ends cleanly.
TEST_F(TierClusterTest, SlicesInFlightChangeNothingButTheOverlap) {
  ClusterNode a(*redis_, true);
  const v1::Layout layout = HybridLayout();
  a.Attach("inflight", layout);
  const std::string hashes = RandomHashes(20, 32, 351);
  a.WritePages(2, "", hashes, 0, /*snapshot_last=*/true);
  a.WaitSpilled(20);
  for (const PrefetchTweaks& t :
       {PrefetchTweaks{2, 1, 0}, PrefetchTweaks{2, 4, 3}}) {
    SCOPED_TRACE(absl::StrCat("in flight ", t.in_flight));
    ClusterNode b(*redis_, true, TestClusterKey(), 64, nullptr, t);
    b.Attach("inflight", layout);
    ASSERT_TRUE(b.Prefetch(hashes).ok());
    EXPECT_EQ(b.WaitPrefetched(hashes), 20u);
    b.ExpectPages(2, hashes, 20, /*snapshot_page=*/19);
    const ClusterCounters c = b.cluster().Counters();
    EXPECT_EQ(c.prefetched_pages, 20u);
    EXPECT_EQ(c.fetches, 10u);  // One per slice of 2 pages.
    EXPECT_EQ(c.prefetches_cut, 0u);
    EXPECT_GT(c.prefetch_check_seconds, 0);
    EXPECT_TRUE(b.core().CheckInvariants().ok());
  }
  // Page 9 corrupt: pages 0-8 arrive, never 9 or any after it, although
  // slices past it were already fetched.
  const std::string key = ClusterKeyOf("inflight", layout, hashes, 9);
  std::string good9;
  ASSERT_NO_FATAL_FAILURE(Corrupt(key, &good9));
  {
    ClusterNode b(*redis_, true, TestClusterKey(), 64, nullptr,
                  PrefetchTweaks{2, 4, 3});
    b.Attach("inflight", layout);
    ASSERT_TRUE(b.Prefetch(hashes).ok());
    EXPECT_EQ(b.WaitPrefetched(hashes), 9u);
    b.ExpectPages(2, hashes, 9);
    const ClusterCounters c = b.cluster().Counters();
    EXPECT_EQ(c.prefetched_pages, 9u);
    EXPECT_EQ(c.prefetches_cut, 1u);
    EXPECT_GE(c.rejected_values, 1u);
    EXPECT_TRUE(b.core().CheckInvariants().ok());
  }
  // Page 9 mended, the last page (the one with the snapshot) corrupt: its
  // page and snapshot rows, taken before the check, go back; every row is
  // accounted for (CheckInvariants) and a second prefetch finds the same.
  Plant(key, good9);
  ASSERT_NO_FATAL_FAILURE(
      Corrupt(ClusterKeyOf("inflight", layout, hashes, 19), nullptr));
  ClusterNode b(*redis_, true, TestClusterKey(), 64, nullptr,
                PrefetchTweaks{2, 4, 3});
  b.Attach("inflight", layout);
  for (int round = 0; round < 2; ++round) {
    ASSERT_TRUE(b.Prefetch(hashes).ok());
    EXPECT_EQ(b.WaitPrefetched(hashes), 19u);
    b.ExpectPages(2, hashes, 19);
    EXPECT_FALSE(b.Lookup(hashes, false).has_snapshot());
    EXPECT_TRUE(b.core().CheckInvariants().ok());
  }
  EXPECT_EQ(b.cluster().Counters().prefetched_pages, 19u);
}

// What a prefetch committed is journaled like any commit, and only that:
// rows it took for a page whose value was refused went back without a
// journal record, so a restart restores the prefix as far as it was good,
// fences no row (the invariants count every allocated row), and the rest
// can be prefetched later.
TEST_F(TierClusterTest, APrefetchSurvivesARestartAndLeavesNoRowFenced) {
  ClusterNode a(*redis_, true);
  const v1::Layout layout = HybridLayout();
  a.Attach("journaled", layout);
  const std::string hashes = RandomHashes(20, 32, 451);
  a.WritePages(4, "", hashes, 0, /*snapshot_last=*/true);
  a.WaitSpilled(20);
  const std::string key = ClusterKeyOf("journaled", layout, hashes, 13);
  std::string good;
  ASSERT_NO_FATAL_FAILURE(Corrupt(key, &good));
  PrefetchTweaks t{4, 4, 3};
  t.journal = true;
  ClusterNode b(*redis_, true, TestClusterKey(), 64, nullptr, t);
  b.Attach("journaled", layout);
  ASSERT_TRUE(b.Prefetch(hashes).ok());
  EXPECT_EQ(b.WaitPrefetched(hashes), 13u);  // Slice 12-15 cut at 13.
  b.Restart();
  b.Attach("journaled", layout);
  b.ExpectPages(4, hashes, 13);
  EXPECT_TRUE(b.core().CheckInvariants().ok());
  EXPECT_EQ(b.core().GetFenceCounters().fenced_page_rows, 0u);
  EXPECT_EQ(b.core().GetFenceCounters().fenced_snapshot_rows, 0u);
  // Mended: the rest comes in, snapshot included, and survives too.
  Plant(key, good);
  ASSERT_TRUE(b.Prefetch(hashes).ok());
  EXPECT_EQ(b.WaitPrefetched(hashes), 20u);
  b.Restart();
  b.Attach("journaled", layout);
  b.ExpectPages(4, hashes, 20, /*snapshot_page=*/19);
  EXPECT_TRUE(b.core().CheckInvariants().ok());
  EXPECT_EQ(b.core().GetFenceCounters().fenced_page_rows, 0u);
}

// A full bank: the prefetch's rows come from evicting committed pages. Its
// reservation must reach the journal before it copies anything into them,
// and the rows it gives back after a refused value must be recorded too,
// or a restart restores the evicted pages over rows that hold another
// prefix's bytes (issue 27, item 1). `kX` fills B's bank; Y, prefetched,
// evicts X's tail.
class PrefetchEvictsTest : public TierClusterTest {
 protected:
  static constexpr uint64_t kX = 30, kY = 31;
  void SetUp() override {
    TierClusterTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    ClusterNode a(*redis_, true);
    a.Attach(ns_, layout_);
    a.WritePages(kY, "", y_, 0);
    a.WaitSpilled(8);
    PrefetchTweaks t;  // Y is one slice of 8 pages.
    t.journal = true;
    b_ = std::make_unique<ClusterNode>(*redis_, true, TestClusterKey(),
                                       /*page_rows=*/16, nullptr, t);
  }
  // After a restart: X is a miss or X's own bytes, never Y's.
  void ExpectXIntact() {
    const uint32_t x_pages = b_->Lookup(x_, false).matched_pages();
    if (x_pages > 0) b_->ExpectPages(kX, x_, x_pages);
    EXPECT_TRUE(b_->core().CheckInvariants().ok())
        << b_->core().CheckInvariants();
  }

  const std::string ns_ = "evicts";
  const v1::Layout layout_ = AttentionLayout();
  const std::string x_ = RandomHashes(16, 32, 801);
  const std::string y_ = RandomHashes(8, 32, 802);
  std::unique_ptr<ClusterNode> b_;
};

// (a) No crash: Y's first value is refused, the seven after it were
// copied into X's old rows (check and copy run in parallel), and every row
// goes back.
TEST_F(PrefetchEvictsTest, ARefusedValueLeavesNoOlderOwnerOverItsRows) {
  ASSERT_NO_FATAL_FAILURE(Corrupt(ClusterKeyOf(ns_, layout_, y_, 0), nullptr));
  b_->Attach(ns_, layout_);
  b_->WritePages(kX, "", x_, 0);
  ASSERT_TRUE(b_->Prefetch(y_).ok());
  EXPECT_EQ(b_->WaitPrefetched(y_), 0u);
  ASSERT_LT(b_->Lookup(x_, false).matched_pages(), 16u) << "nothing evicted";
  b_->Restart();
  b_->Attach(ns_, layout_);
  ExpectXIntact();
  EXPECT_EQ(b_->Lookup(y_, false).matched_pages(), 0u);
  // The rows given back were recorded: nothing to fence.
  EXPECT_EQ(b_->core().GetFenceCounters().fenced_page_rows, 0u);
}

// (b) A crash between the copy and the commit: the journal as it was when
// the values had been copied into X's old rows, the banks as they are.
TEST_F(PrefetchEvictsTest, ACrashAfterTheCopyLeavesNoOlderOwnerOverItsRows) {
  const std::string journal = b_->JournalOf(ns_);
  const std::string at_crash = journal + ".at-crash";
  b_->core().SetTestHook([&](const char* point) {
    if (std::string(point) == "prefetch:copied") {
      std::filesystem::copy_file(
          journal, at_crash, std::filesystem::copy_options::overwrite_existing);
    }
  });
  b_->Attach(ns_, layout_);
  b_->WritePages(kX, "", x_, 0);
  ASSERT_TRUE(b_->Prefetch(y_).ok());
  EXPECT_EQ(b_->WaitPrefetched(y_), 8u);
  ASSERT_TRUE(std::filesystem::exists(at_crash)) << "the hook never ran";
  b_->Restart([&] { std::filesystem::rename(at_crash, journal); });
  b_->Attach(ns_, layout_);
  ExpectXIntact();
  // Y was never committed as far as the journal knows: a miss, and its
  // rows are fenced (the conservative side).
  EXPECT_EQ(b_->Lookup(y_, false).matched_pages(), 0u);
}

TEST(ClusterTierOptionsTest, BadPrefetchSettingsAreRefusedByName) {
  for (const auto& [in_flight, check_threads, flag] :
       {std::tuple<uint32_t, uint32_t, const char*>{
            0, 0, "--cluster_prefetch_in_flight"},
        {9, 0, "--cluster_prefetch_in_flight"},
        {2, 65, "--cluster_check_threads"}}) {
    ClusterTierOptions o;
    o.redis.seeds = {"127.0.0.1:1"};  // Never reached.
    o.prefetch_in_flight = in_flight;
    o.check_threads = check_threads;
    auto tier = ClusterTier::Create(o, TestClusterKey());
    EXPECT_EQ(tier.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(tier.status().message().find(flag), absl::string_view::npos)
        << tier.status();
  }
}

TEST_F(TierClusterTest, AValuePlantedWithoutTheClusterKeyIsAMiss) {
  // Someone who can reach Redis but lacks the key writes a well-formed
  // value, with valid sizes and a MAC under their own secret.
  ClusterNode b(*redis_, true);
  const v1::Layout layout = AttentionLayout();
  b.Attach("planted", layout);
  const std::string hashes = RandomHashes(1, 32, 401);
  const std::string key = ClusterKeyOf("planted", layout, hashes, 0);
  ClusterValueShape shape;
  shape.fingerprint = LayoutFingerprint(NormalizeLayout(layout));
  shape.digest = ClusterKeyDigest("planted", shape.fingerprint, hashes, 0);
  shape.bank_bytes = {1024, 100};
  const std::string kv(1024, 'x'), scale(100, 'y');
  std::vector<absl::string_view> banks = {kv, scale};
  auto forged = EncodeClusterValue(TestClusterKey('Z'), shape, banks, nullptr);
  ASSERT_TRUE(forged.ok());
  Plant(key, *forged);
  EXPECT_EQ(b.Lookup(hashes, true).remote_pages(), 1u);  // It exists...
  ASSERT_TRUE(b.Prefetch(hashes).ok());
  EXPECT_EQ(b.WaitPrefetched(hashes), 0u);  // ...and is never served.
  EXPECT_EQ(b.cluster().Counters().rejected_values, 1u);
  // The same value under the right key would have been accepted.
  auto real = EncodeClusterValue(TestClusterKey(), shape, banks, nullptr);
  ASSERT_TRUE(real.ok());
  Plant(key, *real);
  ASSERT_TRUE(b.Prefetch(hashes).ok());
  EXPECT_EQ(b.WaitPrefetched(hashes), 1u);
}

TEST_F(TierClusterTest, OtherLayoutsAndNamespacesDoNotMatch) {
  ClusterNode a(*redis_, true);
  ClusterNode b(*redis_, true);
  a.Attach("same-name", AttentionLayout());
  v1::Layout other = AttentionLayout();
  other.set_model("another-model");
  b.Attach("same-name", other);
  const std::string hashes = RandomHashes(4, 32, 501);
  a.WritePages(5, "", hashes, 0);
  a.WaitSpilled(4);
  EXPECT_EQ(b.Lookup(hashes, true).remote_pages(), 0u);
  ClusterNode c(*redis_, true);
  c.Attach("other-name", AttentionLayout());
  EXPECT_EQ(c.Lookup(hashes, true).remote_pages(), 0u);
}

// What the cluster tier holds is announced with medium STORAGE once written
// (beside the host tier's CPU events): write-through pages with the
// commit's tokens and their chain; spilled pages with their parent.
TEST_F(TierClusterTest, WrittenPagesAreAnnouncedAsStorage) {
  RecordingSink events;
  auto storage = [&events] {
    std::vector<BlockStored> out;
    for (auto& [topic, e] : events.Take()) {
      EXPECT_EQ(topic, "ev");
      if (auto* s = std::get_if<BlockStored>(&e);
          s != nullptr && s->medium == kMediumStorage) {
        out.push_back(*s);
      }
    }
    return out;
  };
  {
    ClusterNode a(*redis_, true, TestClusterKey(), 64, &events);
    a.Attach("ev", AttentionLayout());
    const std::string hashes = RandomHashes(3, 32, 801);
    std::vector<uint32_t> tokens;
    for (uint32_t t = 0; t < 48; ++t) tokens.push_back(7000 + t);
    a.WritePages(1, "", hashes, 0, false, tokens);
    a.WaitSpilled(3);
    const std::vector<BlockStored> got = storage();
    ASSERT_EQ(got.size(), 3u);
    for (uint32_t i = 0; i < 3; ++i) {
      EXPECT_EQ(got[i].block_hashes,
                std::vector<std::string>{HashAt(hashes, i, 32)});
      EXPECT_EQ(got[i].parent_block_hash.value_or("none"),
                i == 0 ? "none" : HashAt(hashes, i - 1, 32));
      EXPECT_EQ(got[i].token_ids,
                std::vector<uint32_t>(tokens.begin() + 16 * i,
                                      tokens.begin() + 16 * (i + 1)));
      EXPECT_EQ(got[i].block_size, 16u);
    }
  }
  {
    // Spilled at eviction: no tokens (the daemon keeps none), the parent
    // from the index.
    ClusterNode a(*redis_, false, TestClusterKey(), 4, &events);
    a.Attach("ev", AttentionLayout());
    const std::string old = RandomHashes(2, 32, 802);
    a.WritePages(2, "", old, 0);
    a.WritePages(3, "", RandomHashes(4, 32, 803), 0);  // Evicts `old`.
    a.WaitSpilled(2);
    std::vector<BlockStored> got = storage();
    ASSERT_EQ(got.size(), 2u);
    // Leaf first: page 1 (parent page 0), then page 0 (a first page).
    EXPECT_EQ(got[0].block_hashes[0], HashAt(old, 1, 32));
    EXPECT_EQ(got[0].parent_block_hash.value_or("none"), HashAt(old, 0, 32));
    EXPECT_EQ(got[1].block_hashes[0], HashAt(old, 0, 32));
    EXPECT_FALSE(got[1].parent_block_hash.has_value());
    EXPECT_TRUE(got[1].token_ids.empty());
  }
}

TEST_F(TierClusterTest, AHitLargerThanTheFreeRowsEvictsInsteadOfStopping) {
  ClusterNode a(*redis_, true);
  // B's bank: 32 rows, 24 of them used by older prefixes.
  ClusterNode b(*redis_, true, TestClusterKey(), /*page_rows=*/32);
  const v1::Layout layout = AttentionLayout();
  a.Attach("big", layout);
  b.Attach("big", layout);
  for (int i = 0; i < 3; ++i) {
    b.WritePages(20 + i, "", RandomHashes(8, 32, 600 + i), 0);
  }
  const std::string hashes = RandomHashes(28, 32, 699);
  a.WritePages(11, "", hashes, 0);
  a.WaitSpilled(28);
  ASSERT_TRUE(b.Prefetch(hashes).ok());
  EXPECT_EQ(b.WaitPrefetched(hashes), 28u);  // Not cut at the 8 free rows.
  b.ExpectPages(11, hashes, 28);
  EXPECT_TRUE(b.core().CheckInvariants().ok());
  // Larger than the whole bank: as much as fits, the chain's own start
  // kept (pinned while the prefetch runs), never a wrong page.
  const std::string huge = RandomHashes(48, 32, 700);
  a.WritePages(12, "", huge, 0);
  a.WaitSpilled(28 + 48);
  ASSERT_TRUE(b.Prefetch(huge).ok());
  const uint32_t got = b.WaitPrefetched(huge);
  EXPECT_GE(got, 24u);
  EXPECT_LE(got, 32u);
  b.ExpectPages(12, huge, got);
  EXPECT_GE(b.cluster().Counters().prefetches_cut, 1u);
  EXPECT_TRUE(b.core().CheckInvariants().ok());
}

TEST_F(TierClusterTest, PrefetchNeedsAClusterTierAndGoodHashes) {
  ClusterNode b(*redis_, true);
  b.Attach("args", AttentionLayout());
  auto empty = b.Prefetch("");
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kInvalidArgument);
  auto ragged = b.Prefetch(std::string(33, 'x'));
  EXPECT_EQ(ragged.status().code(), absl::StatusCode::kInvalidArgument);
}

// A core without a cluster tier answers Prefetch and remote lookups with
// the local match and nothing remote (an unknown session is still refused).
class NoClusterTest : public TierCoreTest {};

TEST_F(NoClusterTest, PrefetchAndRemoteLookupFindNothingRemote) {
  const uint64_t s = Open();
  const v1::AttachResponse a = Attach(s, "plain", AttentionLayout());
  const std::string hashes = RandomHashes(3, 32, 7);
  auto res = Reserve(s, a.namespace_id(), 2);
  ASSERT_TRUE(res.ok());
  ASSERT_TRUE(Commit(s, a.namespace_id(), res->reservation_id(), "",
                     hashes.substr(0, 64))
                  .ok());
  v1::PrefetchRequest req;
  req.set_session_id(s);
  req.set_namespace_id(a.namespace_id());
  req.set_hashes(hashes);
  v1::PrefetchResponse resp;
  ASSERT_TRUE(core_->Prefetch(req, &resp).ok());
  EXPECT_EQ(resp.local_pages(), 2u);
  EXPECT_EQ(resp.remote_pages(), 0u);
  EXPECT_EQ(resp.prefetching_pages(), 0u);
  v1::LookupRequest lr;
  lr.set_session_id(s);
  lr.set_namespace_id(a.namespace_id());
  lr.set_hashes(hashes);
  lr.set_remote(true);
  v1::LookupResponse look;
  ASSERT_TRUE(core_->Lookup(lr, &look).ok());
  EXPECT_EQ(look.matched_pages(), 2u);
  EXPECT_EQ(look.remote_pages(), 0u);
  req.set_session_id(s + 1);
  EXPECT_EQ(core_->Prefetch(req, &resp).code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace kvtier::daemon
