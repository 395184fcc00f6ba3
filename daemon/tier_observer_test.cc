// Tests of the observer seam (daemon/tier_observer.h): an observer handed
// to TierCore in TierOptions::observers is told, over a fixed corpus of
// operations (engine commits of two TP ranks with snapshots, a mirror
// adoption, evictions of complete pages, of incomplete ones and of
// snapshots alone, a dropped prefix, a dropped namespace), exactly the
// commits and evictions that Stats reports, and the removals and clears
// that the KV events announce (the KV events are an observer of the same
// seam: both are compared).
#include "daemon/tier_observer.h"

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "daemon/kv_event_test_util.h"
#include "daemon/tier_core.h"
#include "daemon/tier_core_test_util.h"
#include "gtest/gtest.h"

namespace kvtier::daemon {
namespace {

#define ASSERT_OK(expr)              \
  do {                               \
    const absl::Status st_ = (expr); \
    ASSERT_TRUE(st_.ok()) << st_;    \
  } while (0)

// Counts what it is told, per namespace name.
class CountingObserver : public TierObserver {
 public:
  struct Counts {
    uint64_t commits = 0;
    uint64_t committed_pages = 0;
    uint64_t committed_snapshots = 0;
    uint64_t completed_pages = 0;
    uint64_t mirror_commits = 0;
    uint64_t evicted_pages = 0;
    uint64_t evicted_snapshots = 0;
    uint64_t evicted_incomplete = 0;
    uint64_t removed_keys = 0;
    uint64_t cleared = 0;
  };

  void OnCommitted(const TierNamespace& ns, const TierCommit& c) override {
    absl::MutexLock lock(&mu_);
    Counts& n = counts_[ns.name];
    ++n.commits;
    n.committed_pages += c.result->committed_pages;
    n.committed_snapshots += c.result->committed_snapshots;
    n.completed_pages += c.result->completed.size();
    n.mirror_commits += c.origin == TierCommit::Origin::kMirror;
  }
  void OnEvicting(const TierNamespace& ns,
                  const PrefixIndex::Eviction& e) override {
    absl::MutexLock lock(&mu_);
    Counts& n = counts_[ns.name];
    n.evicted_pages += e.page;
    n.evicted_snapshots += e.snapshot;
    n.evicted_incomplete += e.page && !e.complete;
  }
  void OnRemoved(const TierNamespace& ns,
                 absl::Span<const HashKey> keys) override {
    absl::MutexLock lock(&mu_);
    counts_[ns.name].removed_keys += keys.size();
  }
  void OnCleared(const std::string& name) override {
    absl::MutexLock lock(&mu_);
    ++counts_[name].cleared;
  }
  Counts Of(const std::string& name) {
    absl::MutexLock lock(&mu_);
    return counts_[name];
  }

 private:
  absl::Mutex mu_;
  std::map<std::string, Counts> counts_ ABSL_GUARDED_BY(mu_);
};

class TierObserverTest : public TierCoreTest {
 protected:
  void Configure(TierOptions* o) override {
    o->kv_events = &sink_;
    o->observers = {&counter_};
  }
  // Reserve + Commit of `hashes` (32-byte keys) under `parent`, with
  // snapshots at pages `snaps`.
  absl::Status Put(uint64_t s, uint64_t ns, const std::string& parent,
                   const std::string& hashes,
                   std::vector<uint32_t> snaps = {}) {
    auto r = Reserve(s, ns, hashes.size() / 32, snaps.size());
    if (!r.ok()) return r.status();
    std::vector<std::pair<uint32_t, std::string>> placed;
    // Snapshot row k of the reservation holds the state at page snaps[k].
    for (uint32_t k = 0; k < snaps.size(); ++k) {
      placed.push_back({k, HashAt(hashes, snaps[k], 32)});
    }
    return Commit(s, ns, r->reservation_id(), parent, hashes, placed);
  }
  v1::NamespaceInfo Info(const std::string& name) {
    v1::StatsResponse stats;
    EXPECT_TRUE(core_->Stats({}, &stats).ok());
    for (const auto& ns : stats.namespaces()) {
      if (ns.name() == name) return ns;
    }
    ADD_FAILURE() << "no namespace " << name;
    return {};
  }
  // BlockRemoved hashes and AllBlocksCleared events the KV sink got for
  // `topic` so far.
  std::pair<uint64_t, uint64_t> Withdrawn(const std::string& topic) {
    for (auto& [t, e] : sink_.Take()) {
      Sunk& s = sunk_[t];
      if (auto* r = std::get_if<BlockRemoved>(&e)) {
        s.removed += r->block_hashes.size();
      } else if (std::holds_alternative<AllBlocksCleared>(e)) {
        ++s.cleared;
      }
    }
    return {sunk_[topic].removed, sunk_[topic].cleared};
  }

  RecordingSink sink_;
  CountingObserver counter_;
  struct Sunk {
    uint64_t removed = 0, cleared = 0;
  };
  std::map<std::string, Sunk> sunk_;
};

TEST_F(TierObserverTest, SeesExactlyTheCommitsAndEvictionsStatsReports) {
  // An attention namespace of 12 rows: chains that outgrow it, a mirror
  // adoption, a dropped prefix.
  const uint64_t s = Open("engine");
  const uint64_t att =
      Attach(s, "att", AttentionLayout(), 0, 12).namespace_id();
  const std::string a = RandomHashes(8, 32, 1), b = RandomHashes(4, 32, 2);
  ASSERT_OK(Put(s, att, "", a));
  ASSERT_OK(Put(s, att, "", b));
  // Evicts a's tail (the least recently used) to extend b.
  ASSERT_OK(Put(s, att, HashAt(b, 3, 32), RandomHashes(6, 32, 3)));
  {
    // A mirror of 3 rows, 2 of them adopted under new hashes.
    auto m = Reserve(s, att, 3);
    ASSERT_TRUE(m.ok()) << m.status();
    v1::CommitRequest req;
    req.set_session_id(s);
    req.set_namespace_id(att);
    req.set_reservation_id(m->reservation_id());
    req.set_hashes(RandomHashes(2, 32, 4));
    req.add_mirror_indices(0);
    req.add_mirror_indices(2);
    v1::CommitResponse resp;
    ASSERT_TRUE(core_->Commit(req, &resp).ok());
  }
  ASSERT_OK(Put(s, att, "", RandomHashes(5, 32, 5)));
  const std::string c = RandomHashes(3, 32, 6);
  ASSERT_OK(Put(s, att, "", c));
  {
    v1::DropRequest drop;
    drop.set_namespace_("att");
    drop.set_hash(HashAt(c, 1, 32));
    v1::DropResponse resp;
    ASSERT_TRUE(core_->Drop(drop, &resp).ok());
  }

  // A hybrid TP=2 namespace: both ranks commit with snapshots; a chain only
  // rank 0 commits (incomplete); few snapshot rows, so snapshots go alone.
  v1::Layout tp2 = HybridLayout();
  tp2.set_tp_size(2);
  const uint64_t r0 = Open("rank0"), r1 = Open("rank1");
  const uint64_t hyb = Attach(r0, "hyb", tp2, 0, 10, 3).namespace_id();
  ASSERT_EQ(Attach(r1, "hyb", tp2, 1, 10, 3).namespace_id(), hyb);
  // Rank 0 only, and the least recently used: evicted first.
  ASSERT_OK(Put(r0, hyb, "", RandomHashes(3, 32, 9)));
  const std::string x = RandomHashes(4, 32, 7), y = RandomHashes(4, 32, 8);
  for (const uint64_t r : {r0, r1}) {
    ASSERT_OK(Put(r, hyb, "", x, {1, 3}));
    ASSERT_OK(Put(r, hyb, "", y, {3}));
  }
  for (const uint64_t r : {r0, r1}) {
    ASSERT_OK(Put(r, hyb, "", RandomHashes(5, 32, 10), {2, 4}));
  }

  for (const std::string name : {"att", "hyb"}) {
    SCOPED_TRACE(name);
    const v1::NamespaceInfo info = Info(name);
    const CountingObserver::Counts n = counter_.Of(name);
    // The corpus evicts, or the comparison below could not fail.
    EXPECT_GT(info.evicted_pages(), 0u);
    EXPECT_GT(info.committed_pages(), 0u);
    EXPECT_EQ(n.committed_pages, info.committed_pages());
    EXPECT_EQ(n.evicted_pages, info.evicted_pages());
    EXPECT_EQ(n.evicted_snapshots, info.evicted_snapshots());
    // The KV events, told through the same seam, withdrew what was told.
    EXPECT_EQ(n.removed_keys, Withdrawn(name).first);
  }
  EXPECT_EQ(counter_.Of("att").mirror_commits, 1u);
  EXPECT_GT(counter_.Of("hyb").committed_snapshots, 0u);
  EXPECT_GT(counter_.Of("hyb").evicted_snapshots, 0u);
  EXPECT_GT(counter_.Of("hyb").evicted_incomplete, 0u);
  EXPECT_GT(counter_.Of("att").removed_keys, 0u);

  // A dropped namespace is cleared, for the observer as for the KV events.
  v1::DropRequest drop;
  drop.set_namespace_("hyb");
  drop.set_force(true);
  v1::DropResponse resp;
  ASSERT_TRUE(core_->Drop(drop, &resp).ok());
  EXPECT_EQ(counter_.Of("hyb").cleared, 1u);
  EXPECT_EQ(Withdrawn("hyb").second, 1u);
  EXPECT_TRUE(core_->CheckInvariants().ok());
}

}  // namespace
}  // namespace kvtier::daemon
