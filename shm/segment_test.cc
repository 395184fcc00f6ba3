// Tests of kvtier::shm::Segment: creation, validation, sharing across
// mappings and processes, and failure modes. Each test works in its own
// temporary directory under /dev/shm with huge pages off unless it tests
// huge-page placement.

#include "shm/segment.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "shm/bank_header.h"
#include "shm/hugepages.h"

namespace kvtier::shm {
namespace {

using ::testing::HasSubstr;

// Returns a fresh directory made by mkdtemp under /dev/shm (or /tmp).
std::string MakeTempDir() {
  std::string templ = std::filesystem::exists("/dev/shm")
                          ? "/dev/shm/kvtier_shm_test.XXXXXX"
                          : "/tmp/kvtier_shm_test.XXXXXX";
  char* dir = mkdtemp(templ.data());
  EXPECT_NE(dir, nullptr) << "mkdtemp " << templ << ": " << strerror(errno);
  return templ;
}

// Returns the names in `dir`.
std::vector<std::string> ListDir(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    names.push_back(entry.path().filename().string());
  }
  return names;
}

std::string ReadWholeFile(const std::string& path) {
  std::string out;
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  EXPECT_GE(fd, 0) << path;
  char buf[65536];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) out.append(buf, n);
  close(fd);
  return out;
}

// Overwrites `size` bytes at `offset` of the file at `path`.
void PatchFile(const std::string& path, uint64_t offset, const void* data,
               size_t size) {
  int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_GE(fd, 0) << path;
  ASSERT_EQ(pwrite(fd, data, size, static_cast<off_t>(offset)),
            static_cast<ssize_t>(size));
  close(fd);
}

class SegmentTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir();
    options_.shm_dir = dir_;
    options_.huge_pages = HugePagePolicy::kOff;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  static SegmentSpec MakeSpec(const std::string& file_name) {
    SegmentSpec spec;
    spec.file_name = file_name;
    spec.namespace_name = "qwen3-next/tp2/salt";
    spec.bank = "kv";
    spec.rank = 1;
    spec.rows = 8;
    spec.row_bytes = 100;
    for (size_t i = 0; i < spec.layout_fingerprint.size(); ++i) {
      spec.layout_fingerprint[i] = static_cast<uint8_t>(i * 7 + 1);
    }
    return spec;
  }

  std::string dir_;
  SegmentOptions options_;
};

TEST_F(SegmentTest, CreateThenOpenRoundTrip) {
  const SegmentSpec spec = MakeSpec("bank-a");
  absl::StatusOr<Segment> created = Segment::Create(spec, options_);
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_TRUE(created->created());
  EXPECT_FALSE(created->huge_pages());
  EXPECT_EQ(created->path(), dir_ + "/bank-a");
  EXPECT_EQ(created->rows(), 8u);
  EXPECT_EQ(created->row_bytes(), 100u);
  EXPECT_EQ(created->row_stride(), 112u);
  EXPECT_EQ(created->data_offset(), kHeaderBytes);
  EXPECT_EQ(created->file_bytes(), kHeaderBytes + 8 * 112);

  const BankHeader& h = created->header();
  EXPECT_EQ(h.magic, kMagic);
  EXPECT_EQ(std::memcmp(created->base(), "KVTIERB1", 8), 0);
  EXPECT_EQ(h.version, kHeaderVersion);
  EXPECT_EQ(h.header_bytes, kHeaderBytes);
  EXPECT_EQ(h.rank, 1u);
  EXPECT_EQ(h.flags, 0u);
  EXPECT_GT(h.created_unix_ns, 0u);
  EXPECT_STREQ(h.namespace_name, "qwen3-next/tp2/salt");
  EXPECT_STREQ(h.bank, "kv");
  EXPECT_EQ(
      std::memcmp(h.layout_fingerprint, spec.layout_fingerprint.data(), 32), 0);
  EXPECT_EQ(h.state.load(), kStateReady);

  struct stat st;
  ASSERT_EQ(stat(created->path().c_str(), &st), 0);
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), created->file_bytes());

  absl::StatusOr<Segment> opened = Segment::Open(created->path());
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_FALSE(opened->created());
  EXPECT_EQ(opened->rows(), created->rows());
  EXPECT_EQ(opened->row_bytes(), created->row_bytes());
  EXPECT_EQ(opened->row_stride(), created->row_stride());
  EXPECT_EQ(opened->file_bytes(), created->file_bytes());
  EXPECT_EQ(opened->header().created_unix_ns, h.created_unix_ns);
  EXPECT_STREQ(opened->header().bank, "kv");
  // Only the published name remains: the temporary was removed.
  EXPECT_THAT(ListDir(dir_), ::testing::ElementsAre("bank-a"));
}

TEST_F(SegmentTest, WritesAreVisibleThroughASecondMapping) {
  absl::StatusOr<Segment> a = Segment::Create(MakeSpec("shared"), options_);
  ASSERT_TRUE(a.ok()) << a.status();
  for (uint64_t i = 0; i < a->rows(); ++i) {
    std::memset(a->row(i), static_cast<int>(0x40 + i), a->row_bytes());
  }
  absl::StatusOr<Segment> b = Segment::Open(a->path());
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_NE(a->base(), b->base());
  for (uint64_t i = 0; i < b->rows(); ++i) {
    EXPECT_EQ(std::memcmp(a->row(i), b->row(i), b->row_bytes()), 0) << i;
    EXPECT_EQ(b->row(i)[b->row_bytes() - 1], 0x40 + i);
  }
  b->row(3)[0] = 0xEE;
  EXPECT_EQ(a->row(3)[0], 0xEE);
}

TEST_F(SegmentTest, ForkedChildSeesAndWritesTheSameMemory) {
  absl::StatusOr<Segment> parent = Segment::Create(MakeSpec("fork"), options_);
  ASSERT_TRUE(parent.ok()) << parent.status();
  std::memset(parent->row(0), 0x5A, parent->row_bytes());
  const std::string path = parent->path();

  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // Child: a fresh mapping through Open, as an engine would.
    absl::StatusOr<Segment> child = Segment::Open(path);
    if (!child.ok()) _exit(2);
    for (uint64_t b = 0; b < child->row_bytes(); ++b) {
      if (child->row(0)[b] != 0x5A) _exit(3);
    }
    std::memset(child->row(7), 0xC3, child->row_bytes());
    _exit(0);
  }
  int wstatus = 0;
  ASSERT_EQ(waitpid(pid, &wstatus, 0), pid);
  ASSERT_TRUE(WIFEXITED(wstatus));
  ASSERT_EQ(WEXITSTATUS(wstatus), 0) << "2: open failed, 3: data mismatch";
  for (uint64_t b = 0; b < parent->row_bytes(); ++b) {
    ASSERT_EQ(parent->row(7)[b], 0xC3) << b;
  }
  // The row padding (row_bytes..row_stride) was not written.
  EXPECT_EQ(parent->row(7)[parent->row_bytes()], 0);
}

TEST_F(SegmentTest, CreateIsIdempotentForTheSameSpec) {
  absl::StatusOr<Segment> first = Segment::Create(MakeSpec("idem"), options_);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(first->created());
  first->row(5)[0] = 0x77;

  absl::StatusOr<Segment> second = Segment::Create(MakeSpec("idem"), options_);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_FALSE(second->created());
  EXPECT_EQ(second->path(), first->path());
  EXPECT_EQ(second->row(5)[0], 0x77);
  EXPECT_EQ(second->header().created_unix_ns, first->header().created_unix_ns);
}

TEST_F(SegmentTest, MismatchedSpecIsFailedPreconditionAndFileUntouched) {
  absl::StatusOr<Segment> original =
      Segment::Create(MakeSpec("mismatch"), options_);
  ASSERT_TRUE(original.ok()) << original.status();
  original->row(2)[9] = 0x99;
  const std::string before = ReadWholeFile(original->path());

  struct Case {
    std::string field;
    std::function<void(SegmentSpec&)> mutate;
  };
  const std::vector<Case> cases = {
      {"rows", [](SegmentSpec& s) { s.rows = 9; }},
      {"row_bytes", [](SegmentSpec& s) { s.row_bytes = 101; }},
      {"rank", [](SegmentSpec& s) { s.rank = 0; }},
      {"bank", [](SegmentSpec& s) { s.bank = "scale"; }},
      {"namespace_name", [](SegmentSpec& s) { s.namespace_name = "other"; }},
      {"layout_fingerprint",
       [](SegmentSpec& s) { s.layout_fingerprint[31] ^= 1; }},
  };
  for (const Case& c : cases) {
    SegmentSpec spec = MakeSpec("mismatch");
    c.mutate(spec);
    absl::StatusOr<Segment> again = Segment::Create(spec, options_);
    ASSERT_FALSE(again.ok()) << c.field;
    EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition)
        << again.status();
    EXPECT_THAT(again.status().message(), HasSubstr(c.field + "="))
        << again.status();
    EXPECT_EQ(ReadWholeFile(original->path()), before) << c.field;
  }
  EXPECT_EQ(original->row(2)[9], 0x99);
  EXPECT_THAT(ListDir(dir_), ::testing::ElementsAre("mismatch"));
}

// Squatting: a bank another user pre-created under the predictable name,
// valid header and all, is refused, never adopted, and left as it is.
TEST_F(SegmentTest, APreCreatedSegmentOfAnotherUidIsRefused) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to chown";
  absl::StatusOr<Segment> planted =
      Segment::Create(MakeSpec("squat"), options_);
  ASSERT_TRUE(planted.ok()) << planted.status();
  const std::string path = planted->path();
  ASSERT_EQ(chown(path.c_str(), 54321, 54321), 0);
  const std::string before = ReadWholeFile(path);
  absl::StatusOr<Segment> again = Segment::Create(MakeSpec("squat"), options_);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(again.status().message(), HasSubstr("belongs to uid 54321"));
  EXPECT_EQ(ReadWholeFile(path), before);
  // A client that requires the daemon's uid refuses it too.
  EXPECT_FALSE(Segment::Open(path, geteuid()).ok());
  EXPECT_TRUE(Segment::Open(path, 54321).ok());
}

TEST_F(SegmentTest, ASymlinkUnderASegmentNameIsRefusedNotFollowed) {
  absl::StatusOr<Segment> real = Segment::Create(MakeSpec("real"), options_);
  ASSERT_TRUE(real.ok()) << real.status();
  const std::string link = dir_ + "/link";
  ASSERT_EQ(symlink(real->path().c_str(), link.c_str()), 0);
  absl::StatusOr<Segment> via = Segment::Create(MakeSpec("link"), options_);
  EXPECT_EQ(via.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(via.status().message(), HasSubstr("is a symlink"));
  EXPECT_EQ(Segment::Open(link).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(SegmentTest, ModeIs0660WhateverTheUmask) {
  const mode_t old_umask = umask(0077);
  absl::StatusOr<Segment> segment = Segment::Create(MakeSpec("mode"), options_);
  umask(old_umask);
  ASSERT_TRUE(segment.ok()) << segment.status();
  struct stat st;
  ASSERT_EQ(stat(segment->path().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0660u);
  EXPECT_TRUE(S_ISREG(st.st_mode));

  SegmentOptions private_options = options_;
  private_options.mode = 0600;
  absl::StatusOr<Segment> other =
      Segment::Create(MakeSpec("mode-private"), private_options);
  ASSERT_TRUE(other.ok()) << other.status();
  ASSERT_EQ(stat(other->path().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
}

TEST_F(SegmentTest, GroupIsAppliedWhenGiven) {
  // Root may give any group; others only one of their own.
  const gid_t group = geteuid() == 0 ? 4242 : getegid();
  SegmentOptions options = options_;
  options.group = group;
  absl::StatusOr<Segment> segment = Segment::Create(MakeSpec("group"), options);
  ASSERT_TRUE(segment.ok()) << segment.status();
  struct stat st;
  ASSERT_EQ(stat(segment->path().c_str(), &st), 0);
  EXPECT_EQ(st.st_gid, group);
}

TEST_F(SegmentTest, RowsAreAlignedTo16Bytes) {
  const std::vector<std::pair<uint64_t, uint64_t>> strides = {
      {1, 16}, {15, 16}, {16, 16}, {17, 32}, {100, 112}, {4096, 4096}};
  for (const auto& [row_bytes, stride] : strides) {
    EXPECT_EQ(RowStride(row_bytes), stride) << row_bytes;
    SegmentSpec spec = MakeSpec(absl::StrCat("align-", row_bytes));
    spec.rows = 5;
    spec.row_bytes = row_bytes;
    absl::StatusOr<Segment> segment = Segment::Create(spec, options_);
    ASSERT_TRUE(segment.ok()) << segment.status();
    EXPECT_EQ(segment->row_stride(), stride);
    EXPECT_EQ(segment->file_bytes(), kHeaderBytes + 5 * stride);
    for (uint64_t i = 0; i < segment->rows(); ++i) {
      const auto addr = reinterpret_cast<uintptr_t>(segment->row(i));
      EXPECT_EQ(addr % kRowAlign, 0u) << row_bytes << " row " << i;
      EXPECT_EQ(segment->row(i) - segment->base(),
                static_cast<ptrdiff_t>(kHeaderBytes + i * stride));
    }
    EXPECT_EQ(reinterpret_cast<uintptr_t>(segment->row(0)) % 4096, 0u);
  }
}

TEST_F(SegmentTest, RejectsEveryBadSpecField) {
  struct Case {
    std::string name;
    std::function<void(SegmentSpec&)> mutate;
    std::string field;  // expected in the message
  };
  const std::vector<Case> cases = {
      {"empty file_name", [](SegmentSpec& s) { s.file_name = ""; },
       "file_name"},
      {"long file_name",
       [](SegmentSpec& s) { s.file_name = std::string(201, 'f'); },
       "file_name"},
      {"slash", [](SegmentSpec& s) { s.file_name = "a/b"; }, "file_name"},
      {"dot", [](SegmentSpec& s) { s.file_name = "."; }, "file_name"},
      {"dotdot", [](SegmentSpec& s) { s.file_name = ".."; }, "file_name"},
      {"space", [](SegmentSpec& s) { s.file_name = "a b"; }, "file_name"},
      {"empty namespace", [](SegmentSpec& s) { s.namespace_name = ""; },
       "namespace_name"},
      {"long namespace",
       [](SegmentSpec& s) { s.namespace_name = std::string(129, 'n'); },
       "namespace_name"},
      {"NUL namespace",
       [](SegmentSpec& s) { s.namespace_name = std::string("a\0b", 3); },
       "namespace_name"},
      {"empty bank", [](SegmentSpec& s) { s.bank = ""; }, "bank"},
      {"long bank", [](SegmentSpec& s) { s.bank = std::string(33, 'b'); },
       "bank"},
      {"zero rows", [](SegmentSpec& s) { s.rows = 0; }, "rows"},
      {"zero row_bytes", [](SegmentSpec& s) { s.row_bytes = 0; }, "row_bytes"},
      {"overflow",
       [](SegmentSpec& s) {
         s.rows = UINT64_MAX / 8;
         s.row_bytes = 64;
       },
       "rows="},
      {"huge row_bytes", [](SegmentSpec& s) { s.row_bytes = UINT64_MAX; },
       "row_bytes="},
      {"over 16 TiB",
       [](SegmentSpec& s) {
         s.rows = kMaxDataBytes / 16 + 1;
         s.row_bytes = 16;
       },
       "TiB"},
  };
  for (const Case& c : cases) {
    SegmentSpec spec = MakeSpec("bad");
    c.mutate(spec);
    EXPECT_EQ(ValidateSpec(spec).code(), absl::StatusCode::kInvalidArgument)
        << c.name;
    absl::StatusOr<Segment> segment = Segment::Create(spec, options_);
    ASSERT_FALSE(segment.ok()) << c.name;
    EXPECT_EQ(segment.status().code(), absl::StatusCode::kInvalidArgument)
        << c.name << ": " << segment.status();
    EXPECT_THAT(segment.status().message(), HasSubstr(c.field))
        << c.name << ": " << segment.status();
  }
  EXPECT_TRUE(ListDir(dir_).empty());
}

TEST_F(SegmentTest, AcceptsNamesAtTheirMaximumLength) {
  SegmentSpec spec = MakeSpec(std::string(200, 'F'));
  spec.namespace_name = std::string(128, 'n');
  spec.bank = std::string(32, 'b');
  absl::StatusOr<Segment> segment = Segment::Create(spec, options_);
  ASSERT_TRUE(segment.ok()) << segment.status();
  EXPECT_EQ(std::string(segment->header().namespace_name), spec.namespace_name);
  EXPECT_EQ(std::string(segment->header().bank), spec.bank);
  absl::StatusOr<Segment> again = Segment::Create(spec, options_);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_FALSE(again->created());
}

TEST_F(SegmentTest, RejectsBadOptions) {
  SegmentOptions relative = options_;
  relative.shm_dir = "dev/shm";
  EXPECT_EQ(Segment::Create(MakeSpec("o"), relative).status().code(),
            absl::StatusCode::kInvalidArgument);
  SegmentOptions read_only = options_;
  read_only.mode = 0440;
  absl::Status st = Segment::Create(MakeSpec("o"), read_only).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("mode 0440"));
  SegmentOptions setuid = options_;
  setuid.mode = 04660;
  EXPECT_EQ(Segment::Create(MakeSpec("o"), setuid).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(ListDir(dir_).empty());
}

TEST_F(SegmentTest, OpenRejectsTruncatedAndExtendedFiles) {
  absl::StatusOr<Segment> segment =
      Segment::Create(MakeSpec("trunc"), options_);
  ASSERT_TRUE(segment.ok()) << segment.status();
  const std::string path = segment->path();
  const uint64_t file_bytes = segment->file_bytes();

  for (uint64_t size :
       {uint64_t{0}, uint64_t{100}, file_bytes - 1, file_bytes + 4096}) {
    ASSERT_EQ(truncate(path.c_str(), static_cast<off_t>(size)), 0);
    absl::StatusOr<Segment> opened = Segment::Open(path);
    ASSERT_FALSE(opened.ok()) << size;
    EXPECT_EQ(opened.status().code(), absl::StatusCode::kDataLoss)
        << size << ": " << opened.status();
    EXPECT_THAT(opened.status().message(), HasSubstr(path));
    // Restore the size; a shrink lost the header, so only test the sizes
    // that keep it from here on.
    if (size < kHeaderBytes) {
      segment = absl::NotFoundError("gone");
      ASSERT_TRUE(Segment::Unlink(path).ok());
      absl::StatusOr<Segment> fresh =
          Segment::Create(MakeSpec("trunc"), options_);
      ASSERT_TRUE(fresh.ok()) << fresh.status();
      segment = std::move(fresh);
    } else {
      ASSERT_EQ(truncate(path.c_str(), static_cast<off_t>(file_bytes)), 0);
    }
  }
  EXPECT_TRUE(Segment::Open(path).ok());
}

TEST_F(SegmentTest, OpenRejectsBadMagic) {
  absl::StatusOr<Segment> segment =
      Segment::Create(MakeSpec("magic"), options_);
  ASSERT_TRUE(segment.ok()) << segment.status();
  PatchFile(segment->path(), 0, "NOTABANK", 8);
  absl::StatusOr<Segment> opened = Segment::Open(segment->path());
  ASSERT_FALSE(opened.ok());
  EXPECT_EQ(opened.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(opened.status().message(), HasSubstr("bad magic"));

  // Create over a file of that name refuses to touch it.
  const std::string before = ReadWholeFile(segment->path());
  absl::StatusOr<Segment> created =
      Segment::Create(MakeSpec("magic"), options_);
  ASSERT_FALSE(created.ok());
  EXPECT_EQ(created.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(ReadWholeFile(segment->path()), before);
}

TEST_F(SegmentTest, OpenRejectsAFileThatIsNotABank) {
  const std::string path = dir_ + "/zeros";
  int fd = open(path.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 8192), 0);
  close(fd);
  absl::StatusOr<Segment> opened = Segment::Open(path);
  ASSERT_FALSE(opened.ok());
  EXPECT_EQ(opened.status().code(), absl::StatusCode::kDataLoss);
}

TEST_F(SegmentTest, OpenRejectsWrongVersion) {
  absl::StatusOr<Segment> segment = Segment::Create(MakeSpec("ver"), options_);
  ASSERT_TRUE(segment.ok()) << segment.status();
  const uint32_t version = kHeaderVersion + 1;
  PatchFile(segment->path(), offsetof(BankHeader, version), &version,
            sizeof(version));
  absl::StatusOr<Segment> opened = Segment::Open(segment->path());
  ASSERT_FALSE(opened.ok());
  EXPECT_EQ(opened.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(opened.status().message(), HasSubstr("version 2"));
}

TEST_F(SegmentTest, OpenRejectsASegmentThatIsNotReady) {
  absl::StatusOr<Segment> segment =
      Segment::Create(MakeSpec("state"), options_);
  ASSERT_TRUE(segment.ok()) << segment.status();
  const uint32_t state = kStateInitialising;
  PatchFile(segment->path(), offsetof(BankHeader, state), &state,
            sizeof(state));
  absl::StatusOr<Segment> opened = Segment::Open(segment->path());
  ASSERT_FALSE(opened.ok());
  EXPECT_EQ(opened.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(opened.status().message(), HasSubstr("not ready"));
}

TEST_F(SegmentTest, OpenRejectsInconsistentSizes) {
  absl::StatusOr<Segment> segment =
      Segment::Create(MakeSpec("sizes"), options_);
  ASSERT_TRUE(segment.ok()) << segment.status();
  const std::string pristine = ReadWholeFile(segment->path());
  struct Patch {
    size_t offset;
    uint64_t value;
    std::string expect;
  };
  const std::vector<Patch> patches = {
      {offsetof(BankHeader, row_stride), 100, "row_stride"},
      {offsetof(BankHeader, rows), 9, "file_bytes"},
      {offsetof(BankHeader, rows), 0, "rows=0"},
      {offsetof(BankHeader, data_offset), 8192, "data_offset"},
      {offsetof(BankHeader, file_bytes), 1 << 20, "file_bytes"},
  };
  for (const Patch& p : patches) {
    PatchFile(segment->path(), 0, pristine.data(), pristine.size());
    PatchFile(segment->path(), p.offset, &p.value, sizeof(p.value));
    absl::StatusOr<Segment> opened = Segment::Open(segment->path());
    ASSERT_FALSE(opened.ok()) << p.expect;
    EXPECT_EQ(opened.status().code(), absl::StatusCode::kDataLoss)
        << opened.status();
    EXPECT_THAT(opened.status().message(), HasSubstr(p.expect));
  }
}

TEST_F(SegmentTest, OpenOfAMissingFileIsNotFound) {
  absl::StatusOr<Segment> opened = Segment::Open(dir_ + "/absent");
  ASSERT_FALSE(opened.ok());
  EXPECT_EQ(opened.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(opened.status().message(), HasSubstr("absent"));
}

TEST_F(SegmentTest, UnlinkRemovesTheNameButNotLiveMappings) {
  absl::StatusOr<Segment> segment = Segment::Create(MakeSpec("gone"), options_);
  ASSERT_TRUE(segment.ok()) << segment.status();
  segment->row(0)[0] = 0x11;
  ASSERT_TRUE(Segment::Unlink(segment->path()).ok());
  EXPECT_TRUE(ListDir(dir_).empty());
  EXPECT_EQ(segment->row(0)[0], 0x11);  // still mapped
  segment->row(7)[0] = 0x22;            // and writable
  EXPECT_EQ(Segment::Unlink(segment->path()).code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(Segment::Open(segment->path()).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(Segment::Find("gone", options_).status().code(),
            absl::StatusCode::kNotFound);
  // The name is free again for a new segment.
  absl::StatusOr<Segment> fresh = Segment::Create(MakeSpec("gone"), options_);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  EXPECT_TRUE(fresh->created());
  EXPECT_EQ(fresh->row(0)[0], 0);
}

TEST_F(SegmentTest, FindSearchesTheHugeTlbfsDirThenShmDir) {
  absl::StatusOr<std::string> missing = Segment::Find("findme", options_);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr(dir_));

  absl::StatusOr<Segment> segment =
      Segment::Create(MakeSpec("findme"), options_);
  ASSERT_TRUE(segment.ok()) << segment.status();
  absl::StatusOr<std::string> found = Segment::Find("findme", options_);
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(*found, dir_ + "/findme");

  // A file of the same name in the (configured) hugetlbfs dir wins.
  const std::string huge_dir = MakeTempDir();
  const std::string shadow = huge_dir + "/findme";
  close(open(shadow.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600));
  SegmentOptions with_huge = options_;
  with_huge.hugetlbfs_dir = huge_dir;
  found = Segment::Find("findme", with_huge);
  std::filesystem::remove_all(huge_dir);
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(*found, shadow);

  EXPECT_EQ(Segment::Find("../etc", options_).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(SegmentTest, RequireWithoutHugeTlbfsFails) {
  // A configured directory that is not on hugetlbfs.
  const std::string not_huge = MakeTempDir();
  SegmentOptions options = options_;
  options.huge_pages = HugePagePolicy::kRequire;
  options.hugetlbfs_dir = not_huge;
  absl::StatusOr<Segment> segment = Segment::Create(MakeSpec("req"), options);
  std::filesystem::remove_all(not_huge);
  ASSERT_FALSE(segment.ok());
  EXPECT_EQ(segment.status().code(), absl::StatusCode::kFailedPrecondition)
      << segment.status();
  EXPECT_THAT(segment.status().message(), HasSubstr("huge pages unavailable"));
  EXPECT_TRUE(ListDir(dir_).empty());

  // kAuto does not silently ignore a configured directory either.
  options.huge_pages = HugePagePolicy::kAuto;
  options.hugetlbfs_dir = dir_;
  EXPECT_EQ(Segment::Create(MakeSpec("req"), options).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(ListDir(dir_).empty());

  // Autodetection, where this host has no usable 2 MiB mount.
  if (!DetectHugeTlbfs("").ok()) {
    options.hugetlbfs_dir.clear();
    options.huge_pages = HugePagePolicy::kRequire;
    EXPECT_EQ(Segment::Create(MakeSpec("req"), options).status().code(),
              absl::StatusCode::kFailedPrecondition);
    EXPECT_TRUE(ListDir(dir_).empty());
  }
}

TEST_F(SegmentTest, RequireRefusesAnExistingSegmentWithoutHugePages) {
  ASSERT_TRUE(Segment::Create(MakeSpec("plain"), options_).ok());
  SegmentOptions options = options_;
  options.huge_pages = HugePagePolicy::kRequire;
  absl::StatusOr<Segment> segment = Segment::Create(MakeSpec("plain"), options);
  ASSERT_FALSE(segment.ok());
  EXPECT_EQ(segment.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(segment.status().message(), HasSubstr("without huge pages"));
}

TEST_F(SegmentTest, AutoPlacesOnHugeTlbfsOnlyWhenAvailable) {
  SegmentOptions options = options_;
  options.huge_pages = HugePagePolicy::kAuto;
  absl::StatusOr<HugeTlbInfo> info = DetectHugeTlbfs("");
  absl::StatusOr<Segment> segment = Segment::Create(MakeSpec("auto"), options);
  ASSERT_TRUE(segment.ok()) << segment.status();
  if (segment->huge_pages()) {
    ASSERT_TRUE(info.ok());
    EXPECT_EQ(segment->path(), info->mount + "/auto");
    EXPECT_TRUE(Segment::Unlink(segment->path()).ok());
  } else {
    EXPECT_EQ(segment->path(), dir_ + "/auto");
    EXPECT_EQ(segment->file_bytes(), kHeaderBytes + 8 * 112);
  }
}

TEST_F(SegmentTest, UsesHugePagesWhereTheHostHasThem) {
  absl::StatusOr<HugeTlbInfo> info = DetectHugeTlbfs("");
  if (!info.ok() || info->free_pages < 2) {
    GTEST_SKIP() << "no 2 MiB hugetlbfs mount with 2 free pages: "
                 << (info.ok() ? "too few pages" : info.status().ToString());
  }
  SegmentOptions options = options_;
  options.huge_pages = HugePagePolicy::kRequire;
  SegmentSpec spec = MakeSpec(absl::StrCat("kvtier-shm-test-", getpid()));
  spec.rows = 1000;
  spec.row_bytes = 1000;  // 4 KiB + 1 MB: rounds up to one 2 MiB page
  absl::StatusOr<Segment> segment = Segment::Create(spec, options);
  ASSERT_TRUE(segment.ok()) << segment.status();
  const std::string path = segment->path();
  EXPECT_TRUE(segment->huge_pages());
  EXPECT_EQ(segment->header().flags & kFlagHugePages, kFlagHugePages);
  EXPECT_EQ(segment->data_offset(), kHeaderBytes);
  EXPECT_EQ(segment->file_bytes(), kHugePageBytes);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(segment->base()) % kHugePageBytes, 0u);
  segment->row(999)[999] = 0xAB;
  absl::StatusOr<Segment> opened = Segment::Open(path);
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_TRUE(opened->huge_pages());
  EXPECT_EQ(opened->row(999)[999], 0xAB);
  absl::StatusOr<std::string> found = Segment::Find(spec.file_name, options);
  EXPECT_TRUE(found.ok() && *found == path) << found.status();
  EXPECT_TRUE(Segment::Unlink(path).ok());
}

TEST_F(SegmentTest, TooFewHugePagesFailsOrFallsBack) {
  absl::StatusOr<HugeTlbInfo> info = DetectHugeTlbfs("");
  if (!info.ok()) GTEST_SKIP() << "no hugetlbfs here: " << info.status();
  // One page more than the pool can give (a header page is added on top).
  SegmentSpec spec = MakeSpec(absl::StrCat("kvtier-shm-test-big-", getpid()));
  spec.rows = info->free_pages + 1;
  spec.row_bytes = kHugePageBytes;
  SegmentOptions options = options_;
  options.populate = false;  // the kAuto fallback must not fill /dev/shm
  options.huge_pages = HugePagePolicy::kRequire;
  absl::StatusOr<Segment> required = Segment::Create(spec, options);
  ASSERT_FALSE(required.ok());
  EXPECT_EQ(required.status().code(), absl::StatusCode::kResourceExhausted)
      << required.status();
  EXPECT_THAT(required.status().message(), HasSubstr("free 2 MiB pages"));
  EXPECT_FALSE(Segment::Find(spec.file_name, options).ok());

  options.huge_pages = HugePagePolicy::kAuto;
  absl::StatusOr<Segment> automatic = Segment::Create(spec, options);
  ASSERT_TRUE(automatic.ok()) << automatic.status();
  EXPECT_FALSE(automatic->huge_pages());
  EXPECT_EQ(automatic->path(), dir_ + "/" + spec.file_name);
}

TEST_F(SegmentTest, ConcurrentCreatorsAgreeOnOneSegment) {
  constexpr int kProcs = 8;
  SegmentSpec spec = MakeSpec("race");
  spec.rows = 256;
  spec.row_bytes = 16 << 10;  // 4 MiB: creation takes long enough to overlap
  // The children start together when the parent closes the pipe.
  int gate[2];
  ASSERT_EQ(pipe(gate), 0);
  std::vector<pid_t> pids;
  for (int p = 0; p < kProcs; ++p) {
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      close(gate[1]);
      char c;
      (void)!read(gate[0], &c, 1);
      absl::StatusOr<Segment> segment = Segment::Create(spec, options_);
      if (!segment.ok()) _exit(1);
      if (segment->rows() != 256) _exit(2);
      _exit(segment->created() ? 10 : 11);
    }
    pids.push_back(pid);
  }
  close(gate[0]);
  close(gate[1]);
  int created = 0, opened = 0;
  for (pid_t pid : pids) {
    int wstatus = 0;
    ASSERT_EQ(waitpid(pid, &wstatus, 0), pid);
    ASSERT_TRUE(WIFEXITED(wstatus));
    const int code = WEXITSTATUS(wstatus);
    ASSERT_TRUE(code == 10 || code == 11) << "child exit " << code;
    (code == 10 ? created : opened)++;
  }
  EXPECT_EQ(created, 1);
  EXPECT_EQ(opened, kProcs - 1);
  // One published file; every loser removed its temporary.
  EXPECT_THAT(ListDir(dir_), ::testing::ElementsAre("race"));
  EXPECT_TRUE(Segment::Open(dir_ + "/race").ok());
}

TEST_F(SegmentTest, CreateWithoutPopulateIsUsable) {
  SegmentOptions options = options_;
  options.populate = false;
  SegmentSpec spec = MakeSpec("lazy");
  spec.rows = 1024;
  spec.row_bytes = 4096;
  absl::StatusOr<Segment> segment = Segment::Create(spec, options);
  ASSERT_TRUE(segment.ok()) << segment.status();
  struct stat st;
  ASSERT_EQ(stat(segment->path().c_str(), &st), 0);
  // Sparse: only the header page was touched.
  EXPECT_LT(static_cast<uint64_t>(st.st_blocks) * 512, segment->file_bytes());
  EXPECT_EQ(segment->row(1023)[4095], 0);
  segment->row(1023)[4095] = 1;
  absl::StatusOr<Segment> opened = Segment::Open(segment->path());
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_EQ(opened->row(1023)[4095], 1);
}

TEST_F(SegmentTest, PopulateAllocatesEveryPage) {
  SegmentSpec spec = MakeSpec("populated");
  spec.rows = 256;
  spec.row_bytes = 4096;
  absl::StatusOr<Segment> segment = Segment::Create(spec, options_);
  ASSERT_TRUE(segment.ok()) << segment.status();
  struct stat st;
  ASSERT_EQ(stat(segment->path().c_str(), &st), 0);
  // st_blocks counts 512-byte units actually allocated: fallocate filled it.
  EXPECT_GE(static_cast<uint64_t>(st.st_blocks) * 512, segment->file_bytes());
}

TEST_F(SegmentTest, MovesTransferTheMapping) {
  absl::StatusOr<Segment> made = Segment::Create(MakeSpec("move"), options_);
  ASSERT_TRUE(made.ok()) << made.status();
  uint8_t* base = made->base();
  Segment a = std::move(*made);
  EXPECT_EQ(a.base(), base);
  EXPECT_EQ(made->base(), nullptr);
  absl::StatusOr<Segment> other = Segment::Open(a.path());
  ASSERT_TRUE(other.ok());
  Segment b = std::move(*other);
  b = std::move(a);  // unmaps b's own mapping, takes a's
  EXPECT_EQ(b.base(), base);
  EXPECT_EQ(b.rows(), 8u);
  b.row(1)[0] = 3;
  EXPECT_EQ(base[kHeaderBytes + 112], 3);
}

}  // namespace
}  // namespace kvtier::shm
