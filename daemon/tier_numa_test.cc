// Tests of the banks' NUMA placement through TierCore (TierOptions::
// bank_numa_node, AttachRequest.pci_bus_id), against a fake sysfs tree that
// says which node each GPU hangs off. The policy is read back with
// get_mempolicy on a fresh mapping of each bank file (placement itself
// cannot be seen on a one-node host; the binding can).
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "daemon/tier_core.h"
#include "daemon/tier_core_test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "shm/segment.h"

namespace kvtier::daemon {
namespace {

using ::testing::HasSubstr;

class TierNumaTest : public TierCoreTest {
 protected:
  void SetUp() override {
    TierCoreTest::SetUp();
    char tmpl[] = "/tmp/kvtier-sysfs-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    sysfs_ = tmpl;
    Gpu("0000:3b:00.0", "0");
    Gpu("0000:86:00.0", "-1");
    Gpu("0000:c1:00.0", "7");
    Start(kBankNumaAuto);
  }
  void TearDown() override {
    TierCoreTest::TearDown();
    std::filesystem::remove_all(sysfs_);
  }
  void Gpu(const std::string& id, const std::string& node) {
    const std::string dir = absl::StrCat(sysfs_, "/bus/pci/devices/", id);
    std::filesystem::create_directories(dir);
    std::ofstream(dir + "/numa_node") << node << "\n";
  }
  void Start(int bank_numa_node) {
    core_.reset();
    TierOptions o;
    o.segments.shm_dir = dir_;
    o.segments.huge_pages = shm::HugePagePolicy::kOff;
    o.segments.sysfs_root = sysfs_;
    o.default_namespace_bytes = 1 << 20;
    o.namespace_budget_bytes = 64 << 20;
    o.bank_numa_node = bank_numa_node;
    core_ = std::make_unique<TierCore>(o);
  }
  absl::StatusOr<v1::AttachResponse> TryAttach(uint64_t session,
                                               const std::string& ns,
                                               const v1::Layout& layout,
                                               uint32_t rank,
                                               const std::string& pci) {
    v1::AttachRequest req;
    req.set_session_id(session);
    req.set_namespace_(ns);
    *req.mutable_layout() = layout;
    req.set_tp_rank(rank);
    req.mutable_capacity()->set_page_rows(64);
    req.set_pci_bus_id(pci);
    v1::AttachResponse resp;
    if (absl::Status s = core_->Attach(req, &resp); !s.ok()) return s;
    return resp;
  }
  // The node every bank of `rank` is bound to, read through a mapping of
  // its own; -2 when they disagree.
  int BankNode(const v1::AttachResponse& a) {
    int node = -3;
    for (const auto& seg : a.segments()) {
      auto opened = shm::Segment::Open(seg.path());
      EXPECT_TRUE(opened.ok()) << opened.status();
      if (!opened.ok()) return -2;
      const int n = *opened->NumaNode();
      node = node == -3 || node == n ? n : -2;
    }
    return node;
  }
  // The nodes Stats reports for the banks of `rank`; -2 when they disagree.
  int StatsNode(uint32_t rank) {
    v1::StatsResponse stats;
    EXPECT_TRUE(core_->Stats({}, &stats).ok());
    int node = -3;
    for (const auto& b : stats.namespaces(0).banks()) {
      if (b.rank() != rank) continue;
      node = node == -3 || node == b.numa_node() ? b.numa_node() : -2;
    }
    return node;
  }
  std::string sysfs_;
};

TEST_F(TierNumaTest, TheCreatorsBanksGoToItsGpusNode) {
  const uint64_t s = Open();
  // CUDA's form of the id (8-digit domain, capitals) is accepted.
  auto a = TryAttach(s, "llama", AttentionLayout(), 0, "00000000:3B:00.0");
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_GT(a->segments_size(), 0);
  EXPECT_EQ(BankNode(*a), 0);
  EXPECT_EQ(StatsNode(0), 0);
}

TEST_F(TierNumaTest, NoKnownNodeLeavesBanksToFirstTouch) {
  const uint64_t s = Open();
  auto unknown = TryAttach(s, "a", AttentionLayout(), 0, "0000:86:00.0");
  ASSERT_TRUE(unknown.ok()) << unknown.status();
  EXPECT_EQ(BankNode(*unknown), -1);
  auto absent = TryAttach(s, "b", AttentionLayout(), 0, "0000:99:00.0");
  ASSERT_TRUE(absent.ok()) << absent.status();  // Not in sysfs: warned.
  EXPECT_EQ(BankNode(*absent), -1);
  auto none = TryAttach(s, "c", AttentionLayout(), 0, "");
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(BankNode(*none), -1);
}

TEST_F(TierNumaTest, AMalformedPciIdIsRefusedAndCreatesNothing) {
  const uint64_t s = Open();
  const std::string before = State();
  for (const char* bad : {"zz", "../../../etc", "0000:3b:00.9"}) {
    auto a = TryAttach(s, "llama", AttentionLayout(), 0, bad);
    EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(a.status().message(), HasSubstr("pci_bus_id")) << bad;
  }
  EXPECT_EQ(State(), before);
  EXPECT_TRUE(std::filesystem::is_empty(dir_));
}

// A TP group across sockets: rank 0's GPU has no node, rank 1's is on node
// 0. Rank 1's first Attach moves its banks there; rank 0's stay.
TEST_F(TierNumaTest, EachRanksBanksFollowItsOwnGpu) {
  v1::Layout tp2 = AttentionLayout();
  tp2.set_tp_size(2);
  const uint64_t r0 = Open("rank0");
  auto a0 = TryAttach(r0, "tp", tp2, 0, "0000:86:00.0");
  ASSERT_TRUE(a0.ok()) << a0.status();
  const uint64_t r1 = Open("rank1");
  auto a1 = TryAttach(r1, "tp", tp2, 1, "0000:3b:00.0");
  ASSERT_TRUE(a1.ok()) << a1.status();
  EXPECT_EQ(BankNode(*a0), -1);
  EXPECT_EQ(BankNode(*a1), 0);
  EXPECT_EQ(StatsNode(0), -1);
  EXPECT_EQ(StatsNode(1), 0);
  // A later engine of rank 0 elsewhere does not move what is in use.
  const uint64_t again = Open("rank0-again");
  auto a2 = TryAttach(again, "tp", tp2, 0, "0000:3b:00.0");
  ASSERT_TRUE(a2.ok()) << a2.status();
  EXPECT_EQ(BankNode(*a2), -1);
}

TEST_F(TierNumaTest, AGpuOnANodeTheHostLacksIsAClearError) {
  if (std::filesystem::exists("/sys/devices/system/node/node7")) {
    GTEST_SKIP() << "this host has a NUMA node 7";
  }
  const uint64_t s = Open();
  auto a = TryAttach(s, "llama", AttentionLayout(), 0, "0000:c1:00.0");
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(a.status().message(), HasSubstr("NUMA node 7"));
  EXPECT_TRUE(std::filesystem::is_empty(dir_));
  // Nothing half-made stays: the next Attach creates it afresh.
  auto b = TryAttach(s, "llama", AttentionLayout(), 0, "0000:3b:00.0");
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_TRUE(b->created());
}

TEST_F(TierNumaTest, AnOperatorsNodeOverridesTheGpus) {
  Start(0);
  const uint64_t s = Open();
  auto a = TryAttach(s, "llama", AttentionLayout(), 0, "0000:86:00.0");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(BankNode(*a), 0);
  Start(kBankNumaNone);
  const uint64_t t = Open();
  auto b = TryAttach(t, "other", AttentionLayout(), 0, "0000:3b:00.0");
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(BankNode(*b), -1);
}

}  // namespace
}  // namespace kvtier::daemon
