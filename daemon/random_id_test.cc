// Every id TierCore hands out that grants something (session, reservation,
// lease and fence hold ids) is drawn through getrandom(2): the test binary
// links with -Wl,--wrap=getrandom, so every call the daemon's library makes
// reaches __wrap_getrandom below, which records what the kernel returned.
#include <sys/types.h>

#include <cstdint>
#include <cstring>
#include <set>

#include "absl/synchronization/mutex.h"
#include "daemon/tier_core.h"
#include "daemon/tier_fence_test_util.h"
#include "gtest/gtest.h"

namespace {

absl::Mutex drawn_mu;
std::set<uint64_t>* drawn ABSL_GUARDED_BY(drawn_mu) = new std::set<uint64_t>;

}  // namespace

extern "C" ssize_t __real_getrandom(void* buf, size_t len, unsigned flags);
extern "C" ssize_t __wrap_getrandom(void* buf, size_t len, unsigned flags) {
  const ssize_t got = __real_getrandom(buf, len, flags);
  if (got == static_cast<ssize_t>(sizeof(uint64_t))) {
    uint64_t v = 0;
    std::memcpy(&v, buf, sizeof(v));
    absl::MutexLock lock(&drawn_mu);
    drawn->insert(v);
  }
  return got;
}

namespace kvtier::daemon {
namespace {

using testing::kInstance;
using testing::RandomHashes;
using testing::Sleeper;
using testing::TierFenceTest;

bool Drawn(uint64_t id) {
  absl::MutexLock lock(&drawn_mu);
  return drawn->contains(id);
}

TEST_F(TierFenceTest, EveryIdHandedOutIsDrawnThroughGetrandom) {
  Sleeper engine;
  const uint64_t s = Open(kInstance, engine.pid());
  ASSERT_NE(s, 0u);
  EXPECT_TRUE(Drawn(s)) << "session id " << s;
  const uint64_t ns = Attach(s);
  auto put = Reserve(s, ns, 4);
  ASSERT_TRUE(put.ok()) << put.status();
  EXPECT_TRUE(Drawn(put->reservation_id()))
      << "reservation id " << put->reservation_id();
  const std::string hashes = RandomHashes(4, 5);
  ASSERT_TRUE(Commit(s, ns, put->reservation_id(), hashes).ok());
  auto lease = Lookup(s, ns, hashes, /*pin=*/true);
  ASSERT_TRUE(lease.ok()) << lease.status();
  ASSERT_NE(lease->lease_id(), 0u);
  EXPECT_TRUE(Drawn(lease->lease_id())) << "lease id " << lease->lease_id();
  const uint64_t hold = FencedAbort(s, ns, 2);
  ASSERT_NE(hold, 0u);
  EXPECT_TRUE(Drawn(hold)) << "hold id " << hold;
  // The lease becomes a hold when the session ends; the process reports it
  // from a new session and gets the hold's id back.
  core_->CloseSession(s);
  const uint64_t again = Open(kInstance, engine.pid());
  EXPECT_TRUE(Drawn(again)) << "session id " << again;
  Attach(again);
  v1::FenceRequest report;
  v1::FenceItem* item = report.add_report();
  item->set_namespace_("ns");
  item->mutable_page_rows()->Assign(lease->rows().begin(), lease->rows().end());
  item->set_lease_hash(hashes.substr(3 * 32, 32));
  auto resp = Fence(again, report);
  ASSERT_TRUE(resp.ok()) << resp.status();
  ASSERT_EQ(resp->holds_size(), 1);
  ASSERT_NE(resp->holds(0), 0u);
  EXPECT_TRUE(Drawn(resp->holds(0))) << "hold id " << resp->holds(0);
}

}  // namespace
}  // namespace kvtier::daemon
