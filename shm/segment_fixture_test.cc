// The bank segment format, pinned by a checked-in file: testdata/
// segment_v1.segment is a small bank (4 rows of 100 bytes, known contents)
// that Segment::Create and the header of kHeaderVersion 1 wrote. These tests
// check that it still opens through the normal Segment::Open path (from a
// private trusted folder, with the owner check), that Create adopts it, that
// its bytes are exactly the image the format documents (built here field by
// field at the offsets bank_header.h pins, independently of BankHeader), and
// that today's writer still writes the same bytes. So an accidental change
// to the on-disk format fails here.
//
// The fixture is data: never regenerate it to make a failing test pass (that
// would test nothing). For a deliberate format change (a new
// kHeaderVersion), write a new fixture beside it (segment_v2.segment):
//   KVTIER_WRITE_SEGMENT_FIXTURE=$PWD/shm/testdata/segment_v2.segment
//     build/shm/segment_fixture_test
//     --gtest_filter=SegmentFixtureTest.WriteFixture
// (one command line),
// which writes FixtureSpec() with FillFixtureRows() and prints its
// created_unix_ns for the new test's constant. segment_v1.segment was
// written that way by the shm/ code of commit 07a59f1 (before segment.cc
// was split into segment_{format,create}.cc; these tests pass on both).
//
// Thread-safety: single-threaded tests; each works in its own mkdtemp folder.

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "shm/bank_header.h"
#include "shm/segment.h"

namespace kvtier::shm {
namespace {

// What testdata/segment_v1.segment holds.
constexpr uint64_t kRows = 4;
constexpr uint64_t kRowBytes = 100;
constexpr uint64_t kRowStride = 112;  // round_up(100, 16)
constexpr uint64_t kFileBytes = 4096 + kRows * kRowStride;
constexpr uint32_t kRank = 1;
constexpr char kNamespace[] = "fixture-ns/tp2/salt";
constexpr char kBank[] = "kv";
// The wall clock when the fixture was written (2026-12-01T19:56:27Z).
constexpr uint64_t kCreatedUnixNs = 1796154987858931733;

// The spec the fixture was created with.
SegmentSpec FixtureSpec(const std::string& file_name) {
  SegmentSpec spec;
  spec.file_name = file_name;
  spec.namespace_name = kNamespace;
  spec.bank = kBank;
  spec.rank = kRank;
  spec.rows = kRows;
  spec.row_bytes = kRowBytes;
  for (size_t i = 0; i < spec.layout_fingerprint.size(); ++i) {
    spec.layout_fingerprint[i] = static_cast<uint8_t>(0xF0 - i * 5);
  }
  return spec;
}

// Byte j of row i of the fixture: distinct per row, never all zero.
uint8_t RowByte(uint64_t i, uint64_t j) {
  return static_cast<uint8_t>(0xA5 ^ (i * 37 + j * 11 + 1));
}

void FillFixtureRows(const Segment& segment) {
  for (uint64_t i = 0; i < segment.rows(); ++i) {
    for (uint64_t j = 0; j < segment.row_bytes(); ++j) {
      segment.row(i)[j] = RowByte(i, j);
    }
  }
}

// Stores `value` little-endian in `bytes` bytes at `offset` of `image`.
void PutLe(std::string& image, size_t offset, uint64_t value, size_t bytes) {
  for (size_t k = 0; k < bytes; ++k) {
    image[offset + k] = static_cast<char>((value >> (8 * k)) & 0xff);
  }
}

// The whole file the format documents for the fixture, created at
// `created_unix_ns`: the header at the offsets bank_header.h pins (every
// other header byte zero), then each row's bytes and zero padding.
std::string ExpectedImage(uint64_t created_unix_ns) {
  std::string image(kFileBytes, '\0');
  std::memcpy(image.data(), "KVTIERB1", 8);  // magic
  PutLe(image, 8, 1, 4);                     // version
  PutLe(image, 12, 4096, 4);                 // header_bytes
  PutLe(image, 16, kRows, 8);                // rows
  PutLe(image, 24, kRowBytes, 8);            // row_bytes
  PutLe(image, 32, kRowStride, 8);           // row_stride
  PutLe(image, 40, 4096, 8);                 // data_offset
  PutLe(image, 48, kFileBytes, 8);           // file_bytes
  PutLe(image, 56, kRank, 4);                // rank
  PutLe(image, 60, 0, 4);                    // flags: not on huge pages
  PutLe(image, 64, created_unix_ns, 8);      // created_unix_ns
  const SegmentSpec spec = FixtureSpec("x");
  std::memcpy(image.data() + 72, spec.layout_fingerprint.data(), 32);
  std::memcpy(image.data() + 104, kNamespace, sizeof(kNamespace) - 1);
  std::memcpy(image.data() + 233, kBank, sizeof(kBank) - 1);
  PutLe(image, 268, 1, 4);  // state: ready
  for (uint64_t i = 0; i < kRows; ++i) {
    for (uint64_t j = 0; j < kRowBytes; ++j) {
      image[4096 + i * kRowStride + j] = static_cast<char>(RowByte(i, j));
    }
  }
  return image;
}

std::string ReadWholeFile(const std::string& path) {
  std::string out;
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  EXPECT_GE(fd, 0) << path << ": " << strerror(errno);
  if (fd < 0) return out;
  char buf[65536];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) out.append(buf, n);
  close(fd);
  return out;
}

// Writes `bytes` to a new file `path` of mode `mode` (set with fchmod, so
// the umask cannot change it).
void WriteNewFile(const std::string& path, const std::string& bytes,
                  mode_t mode) {
  const int fd =
      open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  ASSERT_GE(fd, 0) << path << ": " << strerror(errno);
  ASSERT_EQ(write(fd, bytes.data(), bytes.size()),
            static_cast<ssize_t>(bytes.size()));
  ASSERT_EQ(fchmod(fd, mode), 0);
  ASSERT_EQ(close(fd), 0);
}

std::string FixturePath() {
  return std::string(KVTIER_TESTDATA_DIR) + "/segment_v1.segment";
}

class SegmentFixtureTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // A private folder (mkdtemp: 0700, ours), as the daemon's --shm_dir must
    // be.
    std::string templ = std::filesystem::exists("/dev/shm")
                            ? "/dev/shm/kvtier_fixture_test.XXXXXX"
                            : "/tmp/kvtier_fixture_test.XXXXXX";
    ASSERT_NE(mkdtemp(templ.data()), nullptr) << strerror(errno);
    dir_ = templ;
    options_.shm_dir = dir_;
    options_.huge_pages = HugePagePolicy::kOff;
  }
  void TearDown() override {
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  // Copies the fixture into dir_ as `file_name`, mode 0660 like a bank the
  // daemon made; returns its path.
  std::string InstallFixture(const std::string& file_name) {
    const std::string bytes = ReadWholeFile(FixturePath());
    const std::string path = dir_ + "/" + file_name;
    WriteNewFile(path, bytes, 0660);
    return path;
  }

  std::string dir_;
  SegmentOptions options_;
};

TEST_F(SegmentFixtureTest, TheFixtureIsTheDocumentedImage) {
  const std::string bytes = ReadWholeFile(FixturePath());
  ASSERT_EQ(bytes.size(), kFileBytes);
  const std::string want = ExpectedImage(kCreatedUnixNs);
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(static_cast<uint8_t>(bytes[i]), static_cast<uint8_t>(want[i]))
        << "first difference at byte " << i;
  }
}

TEST_F(SegmentFixtureTest, V1StillOpens) {
  const std::string path = InstallFixture("fixture.kv.r1");
  absl::StatusOr<Segment> segment = Segment::Open(path, geteuid());
  ASSERT_TRUE(segment.ok()) << segment.status();
  EXPECT_EQ(segment->path(), path);
  EXPECT_FALSE(segment->created());
  EXPECT_FALSE(segment->huge_pages());
  EXPECT_EQ(segment->rows(), kRows);
  EXPECT_EQ(segment->row_bytes(), kRowBytes);
  EXPECT_EQ(segment->row_stride(), kRowStride);
  EXPECT_EQ(segment->data_offset(), kHeaderBytes);
  EXPECT_EQ(segment->file_bytes(), kFileBytes);
  struct stat st;
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(segment->inode(), st.st_ino);

  const BankHeader& h = segment->header();
  EXPECT_EQ(h.magic, kMagic);
  EXPECT_EQ(h.version, 1u);
  EXPECT_EQ(h.header_bytes, kHeaderBytes);
  EXPECT_EQ(h.rows, kRows);
  EXPECT_EQ(h.row_bytes, kRowBytes);
  EXPECT_EQ(h.row_stride, kRowStride);
  EXPECT_EQ(h.data_offset, kHeaderBytes);
  EXPECT_EQ(h.file_bytes, kFileBytes);
  EXPECT_EQ(h.rank, kRank);
  EXPECT_EQ(h.flags, 0u);
  EXPECT_EQ(h.created_unix_ns, kCreatedUnixNs);
  const SegmentSpec spec = FixtureSpec("x");
  EXPECT_EQ(std::memcmp(h.layout_fingerprint, spec.layout_fingerprint.data(),
                        sizeof(h.layout_fingerprint)),
            0);
  EXPECT_STREQ(h.namespace_name, kNamespace);
  EXPECT_STREQ(h.bank, kBank);
  EXPECT_EQ(h.state.load(std::memory_order_acquire), kStateReady);
  for (uint64_t i = 0; i < kRows; ++i) {
    for (uint64_t j = 0; j < kRowStride; ++j) {
      ASSERT_EQ(segment->row(i)[j], j < kRowBytes ? RowByte(i, j) : 0)
          << "row " << i << " byte " << j;
    }
  }
}

TEST_F(SegmentFixtureTest, CreateAdoptsTheFixtureForItsSpec) {
  const std::string path = InstallFixture("fixture.kv.r1");
  absl::StatusOr<Segment> segment =
      Segment::Create(FixtureSpec("fixture.kv.r1"), options_);
  ASSERT_TRUE(segment.ok()) << segment.status();
  EXPECT_FALSE(segment->created());
  EXPECT_EQ(segment->path(), path);
  EXPECT_EQ(segment->header().created_unix_ns, kCreatedUnixNs);
  EXPECT_EQ(segment->row(kRows - 1)[kRowBytes - 1],
            RowByte(kRows - 1, kRowBytes - 1));
}

TEST_F(SegmentFixtureTest, TheCurrentWriterWritesTheFixtureBytes) {
  absl::StatusOr<Segment> fresh =
      Segment::Create(FixtureSpec("fresh.kv.r1"), options_);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  ASSERT_TRUE(fresh->created());
  FillFixtureRows(*fresh);
  const uint64_t created = fresh->header().created_unix_ns;
  EXPECT_NE(created, 0u);
  const std::string bytes = ReadWholeFile(fresh->path());
  // Only created_unix_ns (bytes 64..71) may differ from the fixture.
  std::string want = ReadWholeFile(FixturePath());
  ASSERT_EQ(bytes.size(), want.size());
  std::memcpy(want.data() + 64, bytes.data() + 64, 8);
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(static_cast<uint8_t>(bytes[i]), static_cast<uint8_t>(want[i]))
        << "first difference at byte " << i;
  }
}

// Writes a new fixture where KVTIER_WRITE_SEGMENT_FIXTURE names (see the
// file comment); skipped otherwise.
TEST_F(SegmentFixtureTest, WriteFixture) {
  const char* out = std::getenv("KVTIER_WRITE_SEGMENT_FIXTURE");
  if (out == nullptr || *out == '\0') {
    GTEST_SKIP() << "set KVTIER_WRITE_SEGMENT_FIXTURE=<path> to write one";
  }
  absl::StatusOr<Segment> segment =
      Segment::Create(FixtureSpec("fixture.kv.r1"), options_);
  ASSERT_TRUE(segment.ok()) << segment.status();
  FillFixtureRows(*segment);
  const std::string bytes = ReadWholeFile(segment->path());
  std::filesystem::remove(out);
  WriteNewFile(out, bytes, 0644);
  std::printf(
      "wrote %s: %zu bytes, created_unix_ns %llu\n", out, bytes.size(),
      static_cast<unsigned long long>(segment->header().created_unix_ns));
}

}  // namespace
}  // namespace kvtier::shm
