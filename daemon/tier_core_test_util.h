// The TierCore test fixture: a core over a private /dev/shm directory, and
// one-line helpers for the calls (daemon/tier_core_test.cc,
// daemon/tier_lookup_test.cc). Test-only.
#ifndef KVTIER_DAEMON_TIER_CORE_TEST_UTIL_H_
#define KVTIER_DAEMON_TIER_CORE_TEST_UTIL_H_

#include <stdlib.h>

#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "daemon/tier_core.h"
#include "gtest/gtest.h"

namespace kvtier::daemon {

inline std::string RandomHashes(size_t n, uint32_t hash_bytes, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string out(n * hash_bytes, '\0');
  for (auto& c : out) c = static_cast<char>(rng());
  return out;
}

inline std::string HashAt(const std::string& packed, size_t i,
                          uint32_t hash_bytes) {
  return packed.substr(i * hash_bytes, hash_bytes);
}

inline v1::Layout AttentionLayout() {
  v1::Layout l;
  l.set_model("test-model");
  l.set_tokens_per_page(16);
  l.set_num_layers(2);
  auto* kv = l.add_page_banks();
  kv->set_name("kv");
  kv->set_row_bytes(1024);
  auto* sc = l.add_page_banks();
  sc->set_name("scale");
  sc->set_row_bytes(100);  // Odd on purpose: stride rounds to 112.
  return l;
}

inline v1::Layout HybridLayout() {
  v1::Layout l = AttentionLayout();
  l.set_snapshot_row_bytes(4096);
  return l;
}

class TierCoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/dev/shm/kvtier-core-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    TierOptions o;
    o.segments.shm_dir = dir_;
    o.segments.huge_pages = shm::HugePagePolicy::kOff;
    o.default_namespace_bytes = 1 << 20;
    o.namespace_budget_bytes = 64 << 20;
    Configure(&o);
    core_ = std::make_unique<TierCore>(o);
  }
  // The options hook: a fixture that needs other options (a KV event sink,
  // observers, caps) changes them here, before the core is made.
  virtual void Configure(TierOptions* options) {}
  void TearDown() override {
    core_.reset();
    std::filesystem::remove_all(dir_);
  }

  uint64_t Open(const std::string& name = "engine") {
    v1::Hello hello;
    hello.set_client_name(name);
    auto id = core_->OpenSession(hello, PeerInfo{});
    EXPECT_TRUE(id.ok()) << id.status();
    return *id;
  }

  v1::AttachResponse Attach(uint64_t session, const std::string& ns,
                            const v1::Layout& layout, uint32_t rank = 0,
                            uint64_t page_rows = 64,
                            uint64_t snapshot_rows = 0) {
    v1::AttachRequest req;
    req.set_session_id(session);
    req.set_namespace_(ns);
    *req.mutable_layout() = layout;
    req.set_tp_rank(rank);
    req.mutable_capacity()->set_page_rows(page_rows);
    req.mutable_capacity()->set_snapshot_rows(snapshot_rows);
    v1::AttachResponse resp;
    absl::Status s = core_->Attach(req, &resp);
    EXPECT_TRUE(s.ok()) << s;
    return resp;
  }

  absl::StatusOr<v1::ReserveResponse> Reserve(uint64_t session, uint64_t ns,
                                              uint32_t pages,
                                              uint32_t snaps = 0) {
    v1::ReserveRequest req;
    req.set_session_id(session);
    req.set_namespace_id(ns);
    req.set_pages(pages);
    req.set_snapshots(snaps);
    v1::ReserveResponse resp;
    absl::Status s = core_->Reserve(req, &resp);
    if (!s.ok()) return s;
    return resp;
  }

  absl::Status Commit(
      uint64_t session, uint64_t ns, uint64_t reservation,
      const std::string& parent, const std::string& hashes,
      std::vector<std::pair<uint32_t, std::string>> snaps = {}) {
    v1::CommitRequest req;
    req.set_session_id(session);
    req.set_namespace_id(ns);
    req.set_reservation_id(reservation);
    req.set_parent_hash(parent);
    req.set_hashes(hashes);
    for (auto& [i, h] : snaps) {
      auto* p = req.add_snapshots();
      p->set_index(i);
      p->set_hash(h);
    }
    v1::CommitResponse resp;
    return core_->Commit(req, &resp);
  }

  v1::LookupResponse Lookup(uint64_t session, uint64_t ns,
                            const std::string& hashes, bool pin = false) {
    v1::LookupRequest req;
    req.set_session_id(session);
    req.set_namespace_id(ns);
    req.set_hashes(hashes);
    req.set_pin(pin);
    v1::LookupResponse resp;
    absl::Status s = core_->Lookup(req, &resp);
    EXPECT_TRUE(s.ok()) << s;
    return resp;
  }

  // The observable state: Stats without the clock.
  std::string State() {
    v1::StatsResponse stats;
    EXPECT_TRUE(core_->Stats({}, &stats).ok());
    stats.clear_uptime_seconds();
    std::string out;
    stats.SerializeToString(&out);
    return out;
  }

  std::string dir_;
  std::unique_ptr<TierCore> core_;
};

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_TIER_CORE_TEST_UTIL_H_
