// Test-only: a "node" of the cluster tier in one process — a TierCore over
// a private /dev/shm folder with its own ClusterTier on a shared, real Redis
// Cluster (tests/redis_cluster_fixture.h) — and helpers that write known
// bytes into committed rows and read them back
// (daemon/tier_cluster_test.cc, daemon/tier_cluster_fault_test.cc).
//
// Thread-safety: test code, one thread (the cores run their own).
#ifndef KVTIER_DAEMON_TIER_CLUSTER_TEST_UTIL_H_
#define KVTIER_DAEMON_TIER_CLUSTER_TEST_UTIL_H_

#include <stdlib.h>

#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/cluster_tier.h"
#include "daemon/redis_cluster.h"
#include "daemon/tier_core.h"
#include "daemon/tier_core_test_util.h"
#include "gtest/gtest.h"
#include "shm/segment.h"
#include "tests/redis_cluster_fixture.h"

namespace kvtier::daemon {

// The Redis key of page `page` of `hashes` (packed, 32 bytes each) at
// `rank` in namespace `ns` of `layout`.
inline std::string ClusterKeyOf(const std::string& ns, const v1::Layout& layout,
                                const std::string& hashes, uint32_t page,
                                uint32_t rank = 0) {
  return ClusterKeyName(
      ClusterKeyDigest(ns, LayoutFingerprint(NormalizeLayout(layout)),
                       hashes.substr(size_t{page} * 32, 32), rank));
}

inline ClusterKey TestClusterKey(char c = 'K') {
  return *ClusterKey::FromSecret(std::string(40, c));
}

// The byte at `offset` of bank `bank` of the page with hash index `page`
// of chain `chain`: every page, bank and rank differs.
inline uint8_t PatternByte(uint64_t chain, uint32_t page, uint32_t bank,
                           uint32_t rank, uint64_t offset) {
  uint64_t x = chain * 0x9e3779b97f4a7c15ull ^ (uint64_t{page} << 32) ^
               (uint64_t{bank} << 24) ^ (uint64_t{rank} << 20) ^ offset;
  x ^= x >> 29;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 32;
  return static_cast<uint8_t>(x);
}

// A ClusterNode's prefetch settings (ClusterTierOptions' fields), and
// whether its core keeps a journal (so that Restart() recovers it).
struct PrefetchTweaks {
  uint32_t slice_pages = 8;  // Several slices per prefix.
  uint32_t in_flight = 2;
  uint32_t check_threads = 0;
  bool journal = false;
};

class ClusterNode {
 public:
  // A core whose ClusterTier talks to `redis`; `write_through` as the flag.
  ClusterNode(const testing::RedisClusterFixture& redis, bool write_through,
              ClusterKey key = TestClusterKey(), uint64_t page_rows = 64,
              KvEventSink* kv_events = nullptr,
              const PrefetchTweaks& prefetch = {}) {
    char tmpl[] = "/dev/shm/kvtier-cluster-test-XXXXXX";
    EXPECT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    ClusterTierOptions co;
    // Every node as a seed, as an operator lists them: a daemon that starts
    // while its only seed is down has no slot map.
    auto seeds = ParseRedisSeeds(redis.Seeds());
    EXPECT_TRUE(seeds.ok()) << seeds.status();
    if (seeds.ok()) co.redis.seeds = *seeds;
    co.redis.user = redis.user();
    co.redis.password = redis.password();
    co.write_through = write_through;
    co.lookup_deadline = absl::Seconds(2);
    co.fetch_deadline = absl::Seconds(5);
    co.write_deadline = absl::Seconds(5);
    co.prefetch_slice_pages = prefetch.slice_pages;
    co.prefetch_in_flight = prefetch.in_flight;
    co.check_threads = prefetch.check_threads;
    co.kv_events = kv_events;
    auto cluster = ClusterTier::Create(co, std::move(key));
    EXPECT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = *std::move(cluster);
    TierOptions o;
    o.segments.shm_dir = dir_;
    o.segments.huge_pages = shm::HugePagePolicy::kOff;
    o.namespace_budget_bytes = 256 << 20;
    o.cluster = cluster_.get();
    o.kv_events = kv_events;
    if (prefetch.journal) o.state_dir = dir_ + "/state";
    options_ = o;
    core_ = std::make_unique<TierCore>(options_);
    if (prefetch.journal) {
      auto report = core_->Recover();
      EXPECT_TRUE(report.ok()) << report.status();
    }
    page_rows_ = page_rows;
  }
  // Stops the core and starts another on the same banks and journal, as a
  // restarted kvtierd does (the cluster tier stays); Attach again after.
  // `while_down`, when set, runs between the two (with no core): what a
  // crash left, e.g. a journal put back as it was at an earlier instant.
  void Restart(const std::function<void()>& while_down = nullptr) {
    segments_.clear();
    core_.reset();
    if (while_down) while_down();
    core_ = std::make_unique<TierCore>(options_);
    auto report = core_->Recover();
    EXPECT_TRUE(report.ok()) << report.status();
  }
  ~ClusterNode() {
    core_.reset();  // Before the cluster tier, as kvtierd does.
    cluster_.reset();
    std::filesystem::remove_all(dir_);
  }

  TierCore& core() { return *core_; }
  // The journal of namespace `ns` (PrefetchTweaks::journal).
  std::string JournalOf(const std::string& ns) const {
    return JournalPath(options_.state_dir, ns);
  }
  ClusterTier& cluster() { return *cluster_; }

  // Opens a session and attaches it to `ns` at `rank`.
  void Attach(const std::string& ns, const v1::Layout& layout,
              uint32_t rank = 0) {
    v1::Hello hello;
    hello.set_client_name("engine");
    auto id = core_->OpenSession(hello, PeerInfo{});
    ASSERT_TRUE(id.ok()) << id.status();
    session_ = *id;
    v1::AttachRequest req;
    req.set_session_id(session_);
    req.set_namespace_(ns);
    *req.mutable_layout() = layout;
    req.set_tp_rank(rank);
    req.mutable_capacity()->set_page_rows(page_rows_);
    req.mutable_capacity()->set_snapshot_rows(
        layout.snapshot_row_bytes() > 0 ? page_rows_ : 0);
    attach_.Clear();  // Attach appends to what it is given.
    ASSERT_TRUE(core_->Attach(req, &attach_).ok());
    rank_ = rank;
    segments_.clear();
    for (const v1::Segment& s : attach_.segments()) {
      auto seg = shm::Segment::Open(s.path());
      ASSERT_TRUE(seg.ok()) << seg.status();
      segments_.push_back(std::make_unique<shm::Segment>(*std::move(seg)));
    }
  }
  uint64_t ns_id() const { return attach_.namespace_id(); }

  // Reserves rows for `hashes` (packed) after `parent`, fills every bank's
  // row of page i with PatternByte(chain, first_page + i, ...) and, when
  // `snapshot_last`, a snapshot after the last page; commits.
  void WritePages(uint64_t chain, const std::string& parent,
                  const std::string& hashes, uint32_t first_page,
                  bool snapshot_last = false,
                  const std::vector<uint32_t>& token_ids = {}) {
    const uint32_t hb = 32;
    const uint32_t n = static_cast<uint32_t>(hashes.size() / hb);
    v1::ReserveRequest rr;
    rr.set_session_id(session_);
    rr.set_namespace_id(ns_id());
    rr.set_pages(n);
    rr.set_snapshots(snapshot_last ? 1 : 0);
    v1::ReserveResponse res;
    ASSERT_TRUE(core_->Reserve(rr, &res).ok());
    for (uint32_t i = 0; i < n; ++i) {
      Fill(chain, first_page + i, res.page_rows(i), /*snapshot=*/false);
    }
    v1::CommitRequest cr;
    cr.set_session_id(session_);
    cr.set_namespace_id(ns_id());
    cr.set_reservation_id(res.reservation_id());
    cr.set_parent_hash(parent);
    cr.set_hashes(hashes);
    cr.mutable_token_ids()->Assign(token_ids.begin(), token_ids.end());
    if (snapshot_last) {
      Fill(chain, first_page + n - 1, res.snapshot_rows(0), /*snapshot=*/true);
      auto* p = cr.add_snapshots();
      p->set_index(0);
      p->set_hash(hashes.substr((n - 1) * hb, hb));
    }
    v1::CommitResponse cresp;
    ASSERT_TRUE(core_->Commit(cr, &cresp).ok());
  }

  v1::LookupResponse Lookup(const std::string& hashes, bool remote,
                            bool pin = false) {
    v1::LookupRequest req;
    req.set_session_id(session_);
    req.set_namespace_id(ns_id());
    req.set_hashes(hashes);
    req.set_remote(remote);
    req.set_pin(pin);
    v1::LookupResponse resp;
    absl::Status s = core_->Lookup(req, &resp);
    EXPECT_TRUE(s.ok()) << s;
    return resp;
  }

  absl::StatusOr<v1::PrefetchResponse> Prefetch(const std::string& hashes) {
    v1::PrefetchRequest req;
    req.set_session_id(session_);
    req.set_namespace_id(ns_id());
    req.set_hashes(hashes);
    v1::PrefetchResponse resp;
    absl::Status s = core_->Prefetch(req, &resp);
    if (!s.ok()) return s;
    return resp;
  }

  // Polls (bounded by count) until no prefetch of `hashes` runs; returns
  // the local match then.
  uint32_t WaitPrefetched(const std::string& hashes) {
    v1::LookupResponse r;
    for (int i = 0; i < 3000; ++i) {
      r = Lookup(hashes, /*remote=*/true);
      if (r.prefetching_pages() == 0 &&
          cluster_->Counters().prefetches >= prefetches_seen_ + 1) {
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    prefetches_seen_ = cluster_->Counters().prefetches;
    return Lookup(hashes, /*remote=*/false).matched_pages();
  }

  // Polls (bounded by count) until the spill queue is empty and at least
  // `values` values were written in all.
  void WaitSpilled(uint64_t values) {
    for (int i = 0; i < 3000; ++i) {
      const ClusterCounters c = cluster_->Counters();
      if (c.spill_queue_bytes == 0 && c.spilled_pages >= values) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ADD_FAILURE() << "spilled " << cluster_->Counters().spilled_pages
                  << " values, not " << values;
  }

  // Checks that the first `pages` pages of `hashes` are held with the
  // pattern of `chain` in every bank (and the snapshot after the last page
  // of `snapshot_page`, when >= 0), row for row: the bytes are identical.
  void ExpectPages(uint64_t chain, const std::string& hashes, uint32_t pages,
                   int snapshot_page = -1) {
    const v1::LookupResponse r =
        Lookup(hashes.substr(0, size_t{pages} * 32), false);
    ASSERT_EQ(r.matched_pages(), pages);
    ASSERT_EQ(r.rows_size(), static_cast<int>(r.usable_pages()));
    for (int i = 0; i < r.rows_size(); ++i) {
      ExpectRow(chain, i, r.rows(i), /*snapshot=*/false);
    }
    if (snapshot_page >= 0) {
      ASSERT_TRUE(r.has_snapshot());
      ExpectRow(chain, snapshot_page, r.snapshot_row(), /*snapshot=*/true);
    }
  }

 private:
  void Fill(uint64_t chain, uint32_t page, uint32_t row, bool snapshot) {
    for (size_t b = 0; b < segments_.size(); ++b) {
      const bool is_snapshot = attach_.segments(b).bank() == "snapshot";
      if (is_snapshot != snapshot) continue;
      uint8_t* p = segments_[b]->row(row);
      for (uint64_t o = 0; o < attach_.segments(b).row_bytes(); ++o) {
        p[o] = PatternByte(chain, page, b, rank_, o);
      }
    }
  }
  void ExpectRow(uint64_t chain, uint32_t page, uint32_t row, bool snapshot) {
    for (size_t b = 0; b < segments_.size(); ++b) {
      const bool is_snapshot = attach_.segments(b).bank() == "snapshot";
      if (is_snapshot != snapshot) continue;
      const uint8_t* p = segments_[b]->row(row);
      for (uint64_t o = 0; o < attach_.segments(b).row_bytes(); ++o) {
        if (p[o] != PatternByte(chain, page, b, rank_, o)) {
          ADD_FAILURE() << "page " << page << " bank " << b << " byte " << o
                        << " differs";
          return;
        }
      }
    }
  }

  std::string dir_;
  std::unique_ptr<ClusterTier> cluster_;
  TierOptions options_;
  std::unique_ptr<TierCore> core_;
  uint64_t page_rows_ = 64;
  uint64_t session_ = 0;
  uint32_t rank_ = 0;
  uint64_t prefetches_seen_ = 0;
  v1::AttachResponse attach_;
  std::vector<std::unique_ptr<shm::Segment>> segments_;
};

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_TIER_CLUSTER_TEST_UTIL_H_
