// Tests of shm/numa.h and of NUMA-bound segments: PCI ids and sysfs lookups
// against a fake sysfs tree, and bindings on real mappings read back with
// get_mempolicy (placement itself cannot be seen on a one-node host, the
// policy can).
#include "shm/numa.h"

#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "shm/hugepages.h"
#include "shm/segment.h"

namespace kvtier::shm {
namespace {

using ::testing::HasSubstr;

// A scratch directory holding a fake sysfs tree.
class FakeSysfs {
 public:
  FakeSysfs() {
    char tmpl[] = "/tmp/kvtier-sysfs-XXXXXX";
    EXPECT_NE(mkdtemp(tmpl), nullptr);
    root_ = tmpl;
  }
  ~FakeSysfs() { std::filesystem::remove_all(root_); }
  void Write(const std::string& rel, const std::string& text) {
    const std::filesystem::path p = root_ + "/" + rel;
    std::filesystem::create_directories(p.parent_path());
    std::ofstream(p) << text;
  }
  void Gpu(const std::string& id, const std::string& node) {
    Write(absl::StrCat("bus/pci/devices/", id, "/numa_node"), node + "\n");
  }
  const std::string& root() const { return root_; }

 private:
  std::string root_;
};

TEST(NumaTest, PciBusIdsNormalize) {
  EXPECT_EQ(*NormalizePciBusId("0000:3b:00.0"), "0000:3b:00.0");
  EXPECT_EQ(*NormalizePciBusId("00000000:3B:00.0"), "0000:3b:00.0");
  EXPECT_EQ(*NormalizePciBusId("3B:00.1"), "0000:3b:00.1");
  EXPECT_EQ(*NormalizePciBusId("0001:c1:1f.7"), "0001:c1:1f.7");
  for (const char* bad :
       {"", "3b", "0000:3b:00", "0000:3b:00.8", "0000:3g:00.0",
        "0000:3b:00.0.0", "../../etc:00.0", "0000:3b:000.0", "12345:3b:00.0",
        "00010000:3b:00.0"}) {
    auto id = NormalizePciBusId(bad);
    EXPECT_EQ(id.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

TEST(NumaTest, GpuNodeComesFromSysfs) {
  FakeSysfs sys;
  sys.Gpu("0000:3b:00.0", "0");
  sys.Gpu("0000:86:00.0", "1");
  sys.Gpu("0000:01:00.0", "-1");
  sys.Gpu("0000:02:00.0", "many");
  EXPECT_EQ(*PciDeviceNumaNode(sys.root(), "0000:3b:00.0"), 0);
  EXPECT_EQ(*PciDeviceNumaNode(sys.root(), "00000000:86:00.0"), 1);
  EXPECT_EQ(*PciDeviceNumaNode(sys.root(), "0000:01:00.0"), -1);
  EXPECT_EQ(PciDeviceNumaNode(sys.root(), "0000:02:00.0").status().code(),
            absl::StatusCode::kInternal);
  auto missing = PciDeviceNumaNode(sys.root(), "0000:99:00.0");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("0000:99:00.0"));
  EXPECT_EQ(PciDeviceNumaNode(sys.root(), "nope").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(NumaTest, NodeHugePagesComeFromSysfs) {
  FakeSysfs sys;
  sys.Write(
      "devices/system/node/node1/hugepages/hugepages-2048kB/free_hugepages",
      "17\n");
  EXPECT_EQ(*NodeFreeHugePages(sys.root(), 1), 17u);
  EXPECT_EQ(NodeFreeHugePages(sys.root(), 0).status().code(),
            absl::StatusCode::kNotFound);
}

TEST(NumaTest, NodeMemoryComesFromSysfs) {
  FakeSysfs sys;
  sys.Write("devices/system/node/node0/meminfo",
            "Node 0 MemTotal:        7300856 kB\n"
            "Node 0 MemFree:            1000 kB\n"
            "Node 0 Active(anon):       1548 kB\n"
            "Node 0 Active(file):        200 kB\n"
            "Node 0 Inactive(file):       24 kB\n");
  EXPECT_EQ(*NodeAvailableBytes(sys.root(), 0), 1224u * 1024);
  EXPECT_EQ(NodeAvailableBytes(sys.root(), 1).status().code(),
            absl::StatusCode::kNotFound);
  sys.Write("devices/system/node/node2/meminfo", "Node 2 MemFree: x kB\n");
  EXPECT_EQ(NodeAvailableBytes(sys.root(), 2).status().code(),
            absl::StatusCode::kInternal);
}

TEST(NumaTest, BindingShowsInThePolicy) {
  const size_t bytes = 1 << 20;
  void* a = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(a, MAP_FAILED);
  EXPECT_EQ(*BoundNode(a), -1);  // Default policy: first touch.
  ASSERT_TRUE(BindToNode(a, bytes, 0, /*move=*/false).ok());
  EXPECT_EQ(*BoundNode(a), 0);
  EXPECT_TRUE(BindToNode(a, bytes, 0, /*move=*/true).ok());
  // A node the kernel does not have: a clear error, the policy unchanged.
  absl::Status st = BindToNode(a, bytes, kMaxNumaNode, false);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("no such node"));
  EXPECT_EQ(BindToNode(a, bytes, kMaxNumaNode + 1, false).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(BindToNode(a, bytes, -1, false).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(*BoundNode(a), 0);
  munmap(a, bytes);
}

class NumaSegmentTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/dev/shm/kvtier-numa-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    options_.shm_dir = dir_;
    options_.huge_pages = HugePagePolicy::kOff;
    spec_.file_name = "bank";
    spec_.namespace_name = "ns";
    spec_.bank = "kv";
    spec_.rows = 64;
    spec_.row_bytes = 4096;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string dir_;
  SegmentOptions options_;
  SegmentSpec spec_;
};

// The binding is the file's shared policy: every mapping of it, in any
// process, sees it, and so does a reopen after the creator is gone.
TEST_F(NumaSegmentTest, ABoundSegmentKeepsItsNodeAcrossMappings) {
  options_.numa_node = 0;
  {
    auto seg = Segment::Create(spec_, options_);
    ASSERT_TRUE(seg.ok()) << seg.status();
    EXPECT_EQ(*seg->NumaNode(), 0);
  }
  auto again = Segment::Open(dir_ + "/bank");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again->NumaNode(), 0);
}

TEST_F(NumaSegmentTest, AnUnboundSegmentHasNoNode) {
  auto seg = Segment::Create(spec_, options_);
  ASSERT_TRUE(seg.ok()) << seg.status();
  EXPECT_EQ(*seg->NumaNode(), -1);
  // Moved later (a rank's engine turned out to be on node 0).
  ASSERT_TRUE(seg->MoveToNode(0).ok());
  EXPECT_EQ(*Segment::Open(dir_ + "/bank")->NumaNode(), 0);
}

TEST_F(NumaSegmentTest, AnAbsentNodeIsAClearErrorAndLeavesNoFile) {
  options_.numa_node = kMaxNumaNode;
  auto seg = Segment::Create(spec_, options_);
  EXPECT_EQ(seg.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(seg.status().message(), HasSubstr("NUMA node"));
  EXPECT_TRUE(std::filesystem::is_empty(dir_));
  options_.numa_node = -2;
  EXPECT_EQ(Segment::Create(spec_, options_).status().code(),
            absl::StatusCode::kInvalidArgument);
  options_.numa_node = 0;
  options_.sysfs_root = "relative";
  EXPECT_EQ(Segment::Create(spec_, options_).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(std::filesystem::is_empty(dir_));
}

// A bank bound to a node without room for it is refused before anything is
// allocated (never the kernel's OOM handling at population).
TEST_F(NumaSegmentTest, ANodeWithoutRoomIsRefused) {
  FakeSysfs sys;
  sys.Write("devices/system/node/node0/meminfo",
            "Node 0 MemFree:             100 kB\n"
            "Node 0 Active(file):          0 kB\n"
            "Node 0 Inactive(file):        0 kB\n");
  options_.numa_node = 0;
  options_.sysfs_root = sys.root();
  auto seg = Segment::Create(spec_, options_);
  EXPECT_EQ(seg.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(seg.status().message(), HasSubstr("NUMA node 0"));
  EXPECT_TRUE(std::filesystem::is_empty(dir_));
}

// Huge pages bound to a node whose pool is empty: refused before any file
// exists (kRequire), or placed on tmpfs of the same node (kAuto), never a
// SIGBUS later. Needs a 2 MiB hugetlbfs mount to reach the check.
TEST_F(NumaSegmentTest, HugePagesOnANodeWithoutFreePagesAreRefused) {
  auto info = DetectHugeTlbfs("");
  if (!info.ok()) GTEST_SKIP() << "no hugetlbfs mount: " << info.status();
  FakeSysfs sys;
  sys.Write(
      "devices/system/node/node0/hugepages/hugepages-2048kB/free_hugepages",
      "0\n");
  options_.numa_node = 0;
  options_.sysfs_root = sys.root();
  options_.huge_pages = HugePagePolicy::kRequire;
  spec_.file_name = absl::StrCat("kvtier-numa-test-", getpid());
  auto seg = Segment::Create(spec_, options_);
  EXPECT_EQ(seg.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(seg.status().message(), HasSubstr("NUMA node 0"));
  options_.huge_pages = HugePagePolicy::kAuto;
  auto fallback = Segment::Create(spec_, options_);
  ASSERT_TRUE(fallback.ok()) << fallback.status();
  EXPECT_FALSE(fallback->huge_pages());
  EXPECT_EQ(*fallback->NumaNode(), 0);
}

}  // namespace
}  // namespace kvtier::shm
