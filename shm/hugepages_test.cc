// Tests of the hugetlbfs discovery helpers on sample /proc/mounts and
// /proc/meminfo text, so they do not depend on the host's configuration.

#include "shm/hugepages.h"

#include <stdlib.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "shm/bank_header.h"

namespace kvtier::shm {
namespace {

using ::testing::HasSubstr;

constexpr char kMounts[] =
    "sysfs /sys sysfs rw,nosuid,nodev,noexec,relatime 0 0\n"
    "proc /proc proc rw,nosuid,nodev,noexec,relatime 0 0\n"
    "tmpfs /dev/shm tmpfs rw,nosuid,nodev,inode64 0 0\n"
    "none /mnt/huge\\0401g hugetlbfs rw,relatime,pagesize=1024M 0 0\n"
    "hugetlbfs /dev/hugepages hugetlbfs rw,relatime,pagesize=2M 0 0\n"
    "nodefault /mnt/hdef/ hugetlbfs rw,relatime 0 0\n"
    "limited /mnt/lim hugetlbfs rw,relatime,pagesize=2M,size=64M 0 0\n";

constexpr char kMeminfo[] =
    "MemTotal:       263855012 kB\n"
    "MemFree:        200000000 kB\n"
    "AnonHugePages:         0 kB\n"
    "HugePages_Total:    1024\n"
    "HugePages_Free:     1000\n"
    "HugePages_Rsvd:       10\n"
    "HugePages_Surp:        0\n"
    "Hugepagesize:       2048 kB\n"
    "Hugetlb:         2097152 kB\n";

HugePagePool Pool() {
  HugePagePool pool;
  pool.page_bytes = kHugePageBytes;
  pool.total_pages = 1024;
  pool.free_pages = 1000;
  pool.reserved_pages = 10;
  return pool;
}

TEST(HugePagesTest, ParseSizeUnderstandsKernelSuffixes) {
  EXPECT_EQ(ParseSize("2M").value(), 2ull << 20);
  EXPECT_EQ(ParseSize("1G").value(), 1ull << 30);
  EXPECT_EQ(ParseSize("1024M").value(), 1ull << 30);
  EXPECT_EQ(ParseSize("2048k").value(), 2ull << 20);
  EXPECT_EQ(ParseSize("2097152").value(), 2ull << 20);
  EXPECT_EQ(ParseSize("4t").value(), 4ull << 40);
  for (const char* bad : {"", "M", "2X", "-1", "1.5G", "99999999999999G"}) {
    EXPECT_EQ(ParseSize(bad).status().code(),
              absl::StatusCode::kInvalidArgument)
        << bad;
  }
}

TEST(HugePagesTest, ParseMountsFindsHugeTlbfsMounts) {
  absl::StatusOr<std::vector<HugeTlbMount>> mounts =
      ParseMounts(kMounts, kHugePageBytes);
  ASSERT_TRUE(mounts.ok()) << mounts.status();
  ASSERT_EQ(mounts->size(), 4u);
  EXPECT_EQ((*mounts)[0].mount, "/mnt/huge 1g");  // \040 decoded
  EXPECT_EQ((*mounts)[0].page_bytes, 1ull << 30);
  EXPECT_EQ((*mounts)[1].mount, "/dev/hugepages");
  EXPECT_EQ((*mounts)[1].page_bytes, kHugePageBytes);
  EXPECT_EQ((*mounts)[1].size_limit_bytes, 0u);
  EXPECT_EQ((*mounts)[2].mount, "/mnt/hdef");          // trailing '/' dropped
  EXPECT_EQ((*mounts)[2].page_bytes, kHugePageBytes);  // the default
  EXPECT_EQ((*mounts)[3].size_limit_bytes, 64ull << 20);

  // Without a pagesize= option the caller's default applies.
  absl::StatusOr<std::vector<HugeTlbMount>> with_1g_default =
      ParseMounts(kMounts, 1ull << 30);
  ASSERT_TRUE(with_1g_default.ok());
  EXPECT_EQ((*with_1g_default)[2].page_bytes, 1ull << 30);
}

TEST(HugePagesTest, ParseMountsWithoutHugeTlbfsIsEmpty) {
  absl::StatusOr<std::vector<HugeTlbMount>> mounts =
      ParseMounts("tmpfs /dev/shm tmpfs rw 0 0\n\ngarbage\n", kHugePageBytes);
  ASSERT_TRUE(mounts.ok());
  EXPECT_TRUE(mounts->empty());
}

TEST(HugePagesTest, ParseMountsRejectsABadPagesize) {
  absl::StatusOr<std::vector<HugeTlbMount>> mounts = ParseMounts(
      "h /dev/hugepages hugetlbfs rw,pagesize=huge 0 0\n", kHugePageBytes);
  ASSERT_FALSE(mounts.ok());
  EXPECT_EQ(mounts.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(mounts.status().message(), HasSubstr("pagesize"));
}

TEST(HugePagesTest, ParseMeminfoReadsThePool) {
  absl::StatusOr<HugePagePool> pool = ParseMeminfo(kMeminfo);
  ASSERT_TRUE(pool.ok()) << pool.status();
  EXPECT_EQ(pool->page_bytes, kHugePageBytes);
  EXPECT_EQ(pool->total_pages, 1024u);
  EXPECT_EQ(pool->free_pages, 1000u);
  EXPECT_EQ(pool->reserved_pages, 10u);
  EXPECT_EQ(pool->surplus_pages, 0u);
}

TEST(HugePagesTest, ParseMeminfoRejectsMissingAndBadFields) {
  absl::StatusOr<HugePagePool> missing =
      ParseMeminfo("MemTotal: 1 kB\nHugePages_Total: 4\n");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("HugePages_Free"));

  std::string bad = kMeminfo;
  bad.replace(bad.find("1000"), 4, "lots");
  absl::StatusOr<HugePagePool> unparsable = ParseMeminfo(bad);
  ASSERT_FALSE(unparsable.ok());
  EXPECT_EQ(unparsable.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(unparsable.status().message(), HasSubstr("HugePages_Free"));
}

TEST(HugePagesTest, ParseCounterReadsSysfsValues) {
  EXPECT_EQ(ParseCounter("123\n").value(), 123u);
  EXPECT_EQ(ParseCounter("0").value(), 0u);
  EXPECT_FALSE(ParseCounter("").ok());
  EXPECT_FALSE(ParseCounter("-3\n").ok());
}

TEST(HugePagesTest, SelectPicksTheFirst2MiBMount) {
  std::vector<HugeTlbMount> mounts =
      ParseMounts(kMounts, kHugePageBytes).value();
  absl::StatusOr<HugeTlbInfo> info = SelectHugeTlbfs(mounts, Pool(), "");
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->mount, "/dev/hugepages");  // not the 1 GiB one before it
  EXPECT_EQ(info->page_bytes, kHugePageBytes);
  EXPECT_EQ(info->total_pages, 1024u);
  EXPECT_EQ(info->free_pages, 990u);  // free minus reserved
}

TEST(HugePagesTest, SelectHonoursADirectoryOnAMount) {
  std::vector<HugeTlbMount> mounts =
      ParseMounts(kMounts, kHugePageBytes).value();
  absl::StatusOr<HugeTlbInfo> sub =
      SelectHugeTlbfs(mounts, Pool(), "/dev/hugepages/kvtier/");
  ASSERT_TRUE(sub.ok()) << sub.status();
  EXPECT_EQ(sub->mount, "/dev/hugepages/kvtier");

  absl::StatusOr<HugeTlbInfo> limited =
      SelectHugeTlbfs(mounts, Pool(), "/mnt/lim");
  ASSERT_TRUE(limited.ok()) << limited.status();
  EXPECT_EQ(limited->free_pages, 32u);  // size=64M caps the pool's 990

  for (const char* not_huge : {"/tmp", "/dev/hugepagesX", "/dev"}) {
    absl::StatusOr<HugeTlbInfo> info =
        SelectHugeTlbfs(mounts, Pool(), not_huge);
    ASSERT_FALSE(info.ok()) << not_huge;
    EXPECT_EQ(info.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(info.status().message(), HasSubstr("not on a hugetlbfs"));
  }
  absl::StatusOr<HugeTlbInfo> gig =
      SelectHugeTlbfs(mounts, Pool(), "/mnt/huge 1g/banks");
  ASSERT_FALSE(gig.ok());
  EXPECT_EQ(gig.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(gig.status().message(), HasSubstr("1073741824-byte pages"));
}

TEST(HugePagesTest, SelectWithoutA2MiBMountIsNotFound) {
  std::vector<HugeTlbMount> only_1g = {{"/mnt/huge1g", 1ull << 30, 0}};
  absl::StatusOr<HugeTlbInfo> info = SelectHugeTlbfs(only_1g, Pool(), "");
  ASSERT_FALSE(info.ok());
  EXPECT_EQ(info.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(SelectHugeTlbfs({}, Pool(), "").status().code(),
            absl::StatusCode::kNotFound);
}

TEST(HugePagesTest, SelectNeverReportsMoreFreeThanExist) {
  HugePagePool pool = Pool();
  pool.free_pages = 5;
  pool.reserved_pages = 9;  // more reserved than free: nothing left
  std::vector<HugeTlbMount> mounts = {{"/dev/hugepages", kHugePageBytes, 0}};
  absl::StatusOr<HugeTlbInfo> info = SelectHugeTlbfs(mounts, pool, "");
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->free_pages, 0u);
}

TEST(HugePagesTest, DetectRejectsADirectoryNotOnHugeTlbfs) {
  std::string dir = "/tmp/kvtier_hugepages_test.XXXXXX";
  ASSERT_NE(mkdtemp(dir.data()), nullptr);
  absl::StatusOr<HugeTlbInfo> info = DetectHugeTlbfs(dir);
  std::filesystem::remove_all(dir);
  ASSERT_FALSE(info.ok());
  // NOT_FOUND where the kernel has no hugetlb support at all.
  EXPECT_THAT(info.status().code(),
              ::testing::AnyOf(absl::StatusCode::kFailedPrecondition,
                               absl::StatusCode::kNotFound))
      << info.status();
  EXPECT_FALSE(DetectHugeTlbfs("/nonexistent/kvtier/dir").ok());
}

TEST(HugePagesTest, DetectOnThisHostIsConsistent) {
  absl::StatusOr<HugeTlbInfo> info = DetectHugeTlbfs("");
  if (!info.ok()) GTEST_SKIP() << "no hugetlbfs here: " << info.status();
  EXPECT_EQ(info->page_bytes, kHugePageBytes);
  EXPECT_TRUE(std::filesystem::is_directory(info->mount)) << info->mount;
  EXPECT_LE(info->free_pages, info->total_pages);  // surplus is in Total
}

}  // namespace
}  // namespace kvtier::shm
