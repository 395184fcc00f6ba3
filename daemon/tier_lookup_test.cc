// Tests of TierCore's read path under concurrency: pinned lookups and
// releases run under the namespace's lock held shared, beside each other and
// beside evicting writers (daemon/tier_lookup.cc). What they must keep: a
// leased prefix is never evicted while its lease lives, the per-session
// lease cap holds however many threads pin at once, a lease ends once, and
// every pin belongs to a lease (TierCore::CheckInvariants counts them).
#include <atomic>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/tier_core.h"
#include "daemon/tier_core_test_util.h"
#include "gtest/gtest.h"

namespace kvtier::daemon {
namespace {

class TierLookupTest : public TierCoreTest {
 protected:
  absl::StatusOr<v1::LookupResponse> TryLookup(uint64_t session, uint64_t ns,
                                               const std::string& hashes,
                                               bool pin) {
    v1::LookupRequest req;
    req.set_session_id(session);
    req.set_namespace_id(ns);
    req.set_hashes(hashes);
    req.set_pin(pin);
    v1::LookupResponse resp;
    if (absl::Status s = core_->Lookup(req, &resp); !s.ok()) return s;
    return resp;
  }
  absl::Status Release(uint64_t session, uint64_t ns, uint64_t lease) {
    v1::ReleaseRequest req;
    req.set_session_id(session);
    req.set_namespace_id(ns);
    req.set_lease_id(lease);
    v1::ReleaseResponse resp;
    return core_->Release(req, &resp);
  }
  // Reserves and commits `hashes` as one prefix.
  void Put(uint64_t session, uint64_t ns, const std::string& hashes) {
    auto r = Reserve(session, ns, hashes.size() / 32);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_TRUE(Commit(session, ns, r->reservation_id(), "", hashes).ok());
  }
  uint64_t Leases() {
    v1::StatsResponse stats;
    EXPECT_TRUE(core_->Stats({}, &stats).ok());
    return stats.namespaces(0).leases();
  }
  uint64_t Evicted() {
    v1::StatsResponse stats;
    EXPECT_TRUE(core_->Stats({}, &stats).ok());
    return stats.namespaces(0).evicted_pages();
  }
};

// Readers pin and release prefixes while a writer keeps the bank full, so
// that every Reserve evicts. Whatever a reader holds a lease on must still
// be there, on the same rows, until it releases.
TEST_F(TierLookupTest, LeasedPrefixesSurviveConcurrentEviction) {
  const uint64_t s = Open();
  v1::AttachResponse a = Attach(s, "busy", AttentionLayout(), 0, 64);
  const uint64_t ns = a.namespace_id();
  const std::string held = RandomHashes(8, 32, 1);
  Put(s, ns, held);
  v1::LookupResponse held_lease = Lookup(s, ns, held, /*pin=*/true);
  ASSERT_NE(held_lease.lease_id(), 0u);
  ASSERT_EQ(held_lease.usable_pages(), 8u);

  constexpr int kReaders = 4;
  constexpr int kRounds = 400;
  std::vector<std::string> shared(kReaders);
  for (int i = 0; i < kReaders; ++i) {
    shared[i] = RandomHashes(4, 32, 100 + i);
    Put(s, ns, shared[i]);
  }
  // Counted, never timed: the readers go on for kRounds and until the
  // writer has written kWrites prefixes (4 bank-fulls), and the writer starts
  // once every reader holds a lease.
  constexpr uint64_t kWrites = 64;
  std::atomic<bool> done{false};
  std::atomic<int> failures{0};
  std::atomic<uint64_t> leased{0}, writes{0};
  std::thread writer([&] {
    while (leased.load() < kReaders && !done.load()) std::this_thread::yield();
    // Fills the bank with fresh 4-page prefixes until the readers finish:
    // each Reserve beyond the first few evicts the least recent leaves.
    for (uint64_t seed = 1000; !done.load(); ++seed) {
      auto r = Reserve(s, ns, 4);
      if (!r.ok()) {
        failures.fetch_add(1);
        ADD_FAILURE() << r.status();
        return;
      }
      if (!Commit(s, ns, r->reservation_id(), "", RandomHashes(4, 32, seed))
               .ok()) {
        failures.fetch_add(1);
        return;
      }
      writes.fetch_add(1);
    }
  });
  std::vector<std::thread> readers;
  for (int t = 0; t < kReaders; ++t) {
    readers.emplace_back([&, t] {
      const uint64_t me = Open(absl::StrCat("reader", t));
      Attach(me, "busy", AttentionLayout(), 0, 64);
      for (int i = 0; i < kRounds || writes.load() < kWrites; ++i) {
        if (failures.load() > 100) break;  // Enough said; end the test.
        // The held prefix: always all there, on its rows.
        auto h = TryLookup(me, ns, held, /*pin=*/true);
        if (!h.ok() || h->usable_pages() != 8 ||
            std::vector<uint32_t>(h->rows().begin(), h->rows().end()) !=
                std::vector<uint32_t>(held_lease.rows().begin(),
                                      held_lease.rows().end())) {
          failures.fetch_add(1);
          continue;
        }
        // A shared prefix, maybe partly evicted already: what the lease
        // covers stays, on the same rows, while it lives.
        // (Round 0 leases the reader's own prefix, all there before the
        // writer starts.)
        auto p = TryLookup(me, ns, shared[(t + i) % kReaders], /*pin=*/true);
        if (!p.ok()) {
          failures.fetch_add(1);
          continue;
        }
        if (p->lease_id() != 0) {
          leased.fetch_add(1);
          std::this_thread::yield();  // Let the writer evict meanwhile.
          auto again =
              TryLookup(me, ns, shared[(t + i) % kReaders], /*pin=*/false);
          if (!again.ok() || again->usable_pages() < p->usable_pages()) {
            failures.fetch_add(1);
          } else {
            for (uint32_t k = 0; k < p->usable_pages(); ++k) {
              if (again->rows(k) != p->rows(k)) failures.fetch_add(1);
            }
          }
          if (!Release(me, ns, p->lease_id()).ok()) failures.fetch_add(1);
        }
        if (!Release(me, ns, h->lease_id()).ok()) failures.fetch_add(1);
      }
      core_->SessionGoodbye(me, /*quiescent=*/true);
      core_->CloseSession(me);
    });
  }
  for (auto& r : readers) r.join();
  done.store(true);
  writer.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_GE(leased.load(), uint64_t{kReaders});  // Shared prefixes leased...
  EXPECT_GE(writes.load(), kWrites);             // ...while the writer
  EXPECT_GT(Evicted(), 64u);                     // really evicted.
  EXPECT_EQ(Leases(), 1u);                       // Only the held lease is left,
  EXPECT_TRUE(core_->CheckInvariants().ok()) << core_->CheckInvariants();
  EXPECT_EQ(Lookup(s, ns, held).usable_pages(), 8u);  // and it still holds.
  ASSERT_TRUE(Release(s, ns, held_lease.lease_id()).ok());
  EXPECT_EQ(Leases(), 0u);
  EXPECT_TRUE(core_->CheckInvariants().ok());
}

// A core whose sessions may hold at most 5 leases per namespace.
class TierLookupCapTest : public TierLookupTest {
 protected:
  void Configure(TierOptions* o) override { o->max_session_leases = 5; }
};

TEST_F(TierLookupCapTest, LeaseCapHoldsAgainstConcurrentPins) {
  const uint64_t s = Open();
  v1::AttachResponse a = Attach(s, "cap", AttentionLayout(), 0, 64);
  const std::string hashes = RandomHashes(4, 32, 7);
  Put(s, a.namespace_id(), hashes);
  constexpr int kThreads = 8;
  constexpr int kEach = 4;
  std::atomic<int> granted{0}, refused{0}, other{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kEach; ++i) {
        auto r = TryLookup(s, a.namespace_id(), hashes, /*pin=*/true);
        if (r.ok() && r->lease_id() != 0) {
          granted.fetch_add(1);
        } else if (r.status().code() == absl::StatusCode::kResourceExhausted) {
          refused.fetch_add(1);
        } else {
          other.fetch_add(1);
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(granted.load(), 5);
  EXPECT_EQ(refused.load(), kThreads * kEach - 5);
  EXPECT_EQ(other.load(), 0);
  EXPECT_EQ(Leases(), 5u);
  EXPECT_TRUE(core_->CheckInvariants().ok()) << core_->CheckInvariants();
}

TEST_F(TierLookupTest, ALeaseEndsOnceHoweverManyRelease) {
  const uint64_t s = Open();
  v1::AttachResponse a = Attach(s, "once", AttentionLayout(), 0, 16);
  const uint64_t ns = a.namespace_id();
  const std::string hashes = RandomHashes(16, 32, 9);
  Put(s, ns, hashes);
  constexpr int kLeases = 50;
  constexpr int kThreads = 4;
  std::vector<uint64_t> leases;
  for (int i = 0; i < kLeases; ++i) {
    leases.push_back(Lookup(s, ns, hashes, /*pin=*/true).lease_id());
    ASSERT_NE(leases.back(), 0u);
  }
  // Pinned: the bank is full and nothing may be evicted.
  EXPECT_EQ(Reserve(s, ns, 1).status().code(),
            absl::StatusCode::kResourceExhausted);
  std::atomic<int> ok{0}, not_found{0}, other{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (uint64_t lease : leases) {
        absl::Status st = Release(s, ns, lease);
        if (st.ok()) {
          ok.fetch_add(1);
        } else if (st.code() == absl::StatusCode::kNotFound) {
          not_found.fetch_add(1);
        } else {
          other.fetch_add(1);
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), kLeases);
  EXPECT_EQ(not_found.load(), kLeases * (kThreads - 1));
  EXPECT_EQ(other.load(), 0);
  EXPECT_EQ(Leases(), 0u);
  EXPECT_TRUE(core_->CheckInvariants().ok()) << core_->CheckInvariants();
  // Every pin is gone: the prefix can be evicted again.
  auto r = Reserve(s, ns, 1);
  EXPECT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(Lookup(s, ns, hashes).matched_pages(), 15u);
}

}  // namespace
}  // namespace kvtier::daemon
