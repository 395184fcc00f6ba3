// Tests of MappedBanks: mapping, and the remap in place of a recreated bank
// while another thread reads the mappings and the rows (the race a review
// found; run under TSan by the sanitizer build). Segments are made in a
// private folder the way kvtierd makes them; no daemon, no GPU.
#include "client/bank_mapping.h"

#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <optional>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "shm/segment.h"

namespace kvtier::client {
namespace {

using ::testing::HasSubstr;

class MappedBanksTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kvtier-banks-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    options_.shm_dir = dir_;
    options_.huge_pages = shm::HugePagePolicy::kOff;
    options_.populate = false;
    options_.mode = 0600;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Creates bank `bank` (as the daemon would) and fills row 0..rows-1 with
  // `fill`. The caller keeps the daemon's mapping.
  shm::Segment Create(const std::string& bank, uint64_t rows,
                      uint64_t row_bytes, uint8_t fill) {
    shm::SegmentSpec spec;
    spec.file_name = "ns." + bank;
    spec.namespace_name = "ns";
    spec.bank = bank;
    spec.rows = rows;
    spec.row_bytes = row_bytes;
    auto seg = shm::Segment::Create(spec, options_);
    EXPECT_TRUE(seg.ok()) << seg.status();
    for (uint64_t r = 0; r < rows; ++r) {
      std::memset(seg->row(r), fill, row_bytes);
    }
    return *std::move(seg);
  }
  BankSegmentInfo Info(const shm::Segment& s, const std::string& bank) {
    return {bank, s.path(), s.rows(), s.row_bytes()};
  }

  std::string dir_;
  shm::SegmentOptions options_;
};

TEST_F(MappedBanksTest, MapsEveryBankAndTheSnapshotBank) {
  shm::Segment kv = Create("kv", 8, 4096, 0x11);
  shm::Segment snap = Create("snapshot", 2, 100, 0x22);
  auto banks =
      MappedBanks::Map({Info(kv, "kv"), Info(snap, "snapshot")}, ::geteuid());
  ASSERT_TRUE(banks.ok()) << banks.status();
  ASSERT_EQ((*banks)->page_banks().size(), 1u);
  const BankMapping& b = (*banks)->page_banks()[0];
  EXPECT_EQ(b.name, "kv");
  EXPECT_EQ(b.rows, 8u);
  EXPECT_EQ(b.row_bytes, 4096u);
  EXPECT_EQ(b.base[0], 0x11);
  EXPECT_FALSE(b.cuda_registered);
  ASSERT_NE((*banks)->snapshot_bank(), nullptr);
  EXPECT_EQ((*banks)->snapshot_bank()->base[0], 0x22);
  EXPECT_FALSE((*banks)->cuda_registered());
}

TEST_F(MappedBanksTest, HeaderThatDisagreesWithTheDaemonIsDataLoss) {
  shm::Segment kv = Create("kv", 8, 4096, 0);
  BankSegmentInfo info = Info(kv, "kv");
  info.rows = 9;
  auto banks = MappedBanks::Map({info}, ::geteuid());
  EXPECT_EQ(banks.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(banks.status().message()), HasSubstr("'kv'"));
}

TEST_F(MappedBanksTest, SameSegmentKeepsItsMapping) {
  shm::Segment kv = Create("kv", 4, 256, 0x33);
  auto banks = MappedBanks::Map({Info(kv, "kv")}, ::geteuid());
  ASSERT_TRUE(banks.ok()) << banks.status();
  uint8_t* base = (*banks)->page_banks()[0].base;
  base[0] = 0x44;  // Written through the client's mapping...
  ASSERT_TRUE((*banks)->Refresh({Info(kv, "kv")}, ::geteuid()).ok());
  EXPECT_EQ((*banks)->page_banks()[0].base, base);
  EXPECT_EQ(kv.row(0)[0], 0x44);  // ...still reaches the daemon's segment.
}

// The daemon restarted and recreated the bank while an engine thread kept
// reading its BankMapping and rows: the remap keeps every field and the
// address, and the rows now reach the new segment.
TEST_F(MappedBanksTest, RemapInPlaceWhileAnotherThreadReads) {
  constexpr uint64_t kRows = 64, kRowBytes = 4096;
  std::optional<shm::Segment> old_daemon(Create("kv", kRows, kRowBytes, 0xaa));
  auto mapped = MappedBanks::Map({Info(*old_daemon, "kv")}, ::geteuid());
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  MappedBanks& banks = **mapped;
  uint8_t* const base = banks.page_banks()[0].base;

  std::atomic<bool> stop{false};
  std::atomic<uint64_t> reads{0}, torn{0}, changed{0}, saw_new{0};
  std::thread engine([&] {
    while (!stop.load()) {
      const BankMapping& b = banks.page_banks()[0];
      if (b.base != base || b.rows != kRows || b.row_bytes != kRowBytes ||
          b.name != "kv" || b.cuda_registered || banks.cuda_registered()) {
        changed.fetch_add(1);
      }
      // Either segment's bytes, never anything else (and never a fault).
      for (uint64_t r = 0; r < kRows; r += 7) {
        const uint8_t v = b.base[r * b.row_stride];
        if (v != 0xaa && v != 0xbb) torn.fetch_add(1);
        if (v == 0xbb) saw_new.fetch_add(1);
      }
      reads.fetch_add(1);
    }
  });
  while (reads.load() < 100) std::this_thread::yield();

  // The old daemon is gone; a new one recreates the bank under its name.
  const std::string path = old_daemon->path();
  old_daemon.reset();
  ASSERT_TRUE(shm::Segment::Unlink(path).ok());
  shm::Segment new_daemon = Create("kv", kRows, kRowBytes, 0xbb);
  ASSERT_TRUE(banks.Refresh({Info(new_daemon, "kv")}, ::geteuid()).ok());

  while (saw_new.load() == 0) std::this_thread::yield();
  stop = true;
  engine.join();
  EXPECT_EQ(changed.load(), 0u);
  EXPECT_EQ(torn.load(), 0u);
  EXPECT_EQ(banks.page_banks()[0].base, base);
  EXPECT_EQ(base[0], 0xbb);
  base[1] = 0xcc;  // The client's writes reach the new segment.
  EXPECT_EQ(new_daemon.row(0)[1], 0xcc);
  // And a later refresh against the same new segment leaves it alone.
  ASSERT_TRUE(banks.Refresh({Info(new_daemon, "kv")}, ::geteuid()).ok());
  EXPECT_EQ(base[1], 0xcc);
}

TEST_F(MappedBanksTest, RecreatedWithAnotherShapeIsRefusedAndKeepsMapping) {
  std::optional<shm::Segment> old_daemon(Create("kv", 8, 4096, 0xaa));
  auto banks = MappedBanks::Map({Info(*old_daemon, "kv")}, ::geteuid());
  ASSERT_TRUE(banks.ok()) << banks.status();
  const std::string path = old_daemon->path();
  old_daemon.reset();
  ASSERT_TRUE(shm::Segment::Unlink(path).ok());
  shm::Segment bigger = Create("kv", 16, 4096, 0xbb);
  absl::Status s = (*banks)->Refresh({Info(bigger, "kv")}, ::geteuid());
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()), HasSubstr("another shape"));
  EXPECT_EQ((*banks)->page_banks()[0].base[0], 0xaa);  // The old pages.
}

TEST_F(MappedBanksTest, RefreshRefusesMovedOrMissingBanks) {
  shm::Segment kv = Create("kv", 8, 4096, 0);
  shm::Segment other = Create("scale", 8, 64, 0);
  auto banks = MappedBanks::Map({Info(kv, "kv")}, ::geteuid());
  ASSERT_TRUE(banks.ok()) << banks.status();
  EXPECT_THAT(
      std::string(
          (*banks)->Refresh({Info(other, "kv")}, ::geteuid()).message()),
      HasSubstr("moved"));
  EXPECT_EQ((*banks)
                ->Refresh({Info(kv, "kv"), Info(other, "scale")}, ::geteuid())
                .code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace kvtier::client
