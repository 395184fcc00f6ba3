// Tests of the journal's record format as a reader meets it (journal_format.h,
// journal_read.cc): records crafted byte by byte as the format documents
// them, so that torn tails (a cut record, a zero-filled tail) read as torn,
// bad fields and damage (a flipped bit in the last record or a length
// field mid-file included) as corrupt, and absurd counts as errors that
// size no allocation.
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "daemon/journal.h"
#include "daemon/journal_test_util.h"
#include "daemon/test_keys.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvtier::daemon {
namespace {

using ::testing::HasSubstr;

using testing::Chain;
using testing::HeaderFor;
using testing::Journaled;
using testing::JournalTest;
using testing::Key;

// ------------------------------------------- torn, corrupt and absurd --

// Record types and framing as daemon/journal.h documents them, for crafting
// records by hand.
constexpr uint8_t kHeaderRecord = 1, kNodesRecord = 2, kReserveRecord = 3,
                  kCommitRecord = 4, kDropRecord = 5;

void PutLe32(std::string* out, uint32_t v) {
  out->append(reinterpret_cast<const char*>(&v), 4);
}
void PutLe64(std::string* out, uint64_t v) {
  out->append(reinterpret_cast<const char*>(&v), 8);
}

// A record with a valid frame (length and CRC-32C) around `payload`.
std::string Framed(uint8_t type, const std::string& payload) {
  const std::string body = std::string(1, static_cast<char>(type)) + payload;
  std::string out;
  PutLe32(&out, static_cast<uint32_t>(body.size()));
  PutLe32(&out, Crc32c(body.data(), body.size()));
  return out + body;
}

void AppendBytes(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::app);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A header record's payload for `h`, with counts optionally overridden.
struct HeaderOverrides {
  std::optional<uint32_t> name_length, layout_length, segment_count,
      path_length;
};
std::string HeaderPayload(const JournalHeader& h,
                          const HeaderOverrides& o = {}) {
  std::string out, layout;
  h.layout.SerializeToString(&layout);
  PutLe32(&out, o.name_length.value_or(h.name.size()));
  out += h.name;
  PutLe32(&out, o.layout_length.value_or(layout.size()));
  out += layout;
  PutLe64(&out, h.page_rows);
  PutLe64(&out, h.snapshot_rows);
  PutLe32(&out, h.max_replay_tokens);
  PutLe32(&out, o.segment_count.value_or(h.segments.size()));
  for (const JournalSegment& s : h.segments) {
    PutLe32(&out, s.bank.size());
    out += s.bank;
    PutLe32(&out, s.rank);
    PutLe32(&out, o.path_length.value_or(s.path.size()));
    out += s.path;
    PutLe64(&out, s.created_unix_ns);
  }
  return out;
}

// Writes a journal of just a header record holding `payload`.
void WriteHeaderOnly(const std::string& path, const std::string& payload) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  const std::string bytes = "KVTJRNL1" + Framed(kHeaderRecord, payload);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Overwrites the byte at `offset` of `path` with itself XOR `mask`.
void FlipByte(const std::string& path, uint64_t offset, uint8_t mask = 0x5a) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(offset));
  const int c = f.get();
  f.seekp(static_cast<std::streamoff>(offset));
  f.put(static_cast<char>(c ^ mask));
}

// Overwrites the u32 at `offset` of `path` with `v`; returns what was there.
uint32_t PutU32At(const std::string& path, uint64_t offset, uint32_t v) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  uint32_t old = 0;
  f.seekg(static_cast<std::streamoff>(offset));
  f.read(reinterpret_cast<char*>(&old), 4);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(reinterpret_cast<const char*>(&v), 4);
  return old;
}

// A torn write leaves the last record short of its length; a last record
// that is all there but fails its CRC was damaged after it was written.
TEST_F(JournalTest, FlippedLastRecordIsCorruptNotTorn) {
  Journaled j(path_, {});
  auto r = j.Reserve(0, 3);
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(j.Commit(0, nullptr, Chain(1, 3), *r).ok());
  const uint64_t before = j.journal().bytes();
  ASSERT_TRUE(j.Drop(Key(1, 2)).ok());
  const uint64_t whole = j.journal().bytes();
  // Its CRC, its type, its payload's first and last byte.
  for (uint64_t at : {before + 4, before + 8, before + 9, whole - 1}) {
    SCOPED_TRACE(at);
    FlipByte(path_, at);
    auto read = ReadJournal(path_);
    ASSERT_TRUE(read.ok()) << read.status();
    EXPECT_TRUE(read->corrupt) << read->stopped;
    EXPECT_THAT(read->stopped, HasSubstr("corrupt"));
    EXPECT_THAT(read->stopped, HasSubstr("CRC mismatch"));
    EXPECT_THAT(read->stopped, HasSubstr(absl::StrCat("offset ", before)));
    EXPECT_EQ(read->valid_bytes, before);
    EXPECT_EQ(read->keys.size(), 3u);  // What precedes it is still returned.
    // Followed by zeros (the file system extended the file): the same.
    std::filesystem::resize_file(path_, whole + 100);
    read = ReadJournal(path_);
    ASSERT_TRUE(read.ok()) << read.status();
    EXPECT_TRUE(read->corrupt) << read->stopped;
    EXPECT_EQ(read->valid_bytes, before);
    std::filesystem::resize_file(path_, whole);
    FlipByte(path_, at);
  }
  auto read = ReadJournal(path_);  // Put back: whole again.
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_FALSE(read->corrupt);
  EXPECT_TRUE(read->stopped.empty()) << read->stopped;
  EXPECT_EQ(read->valid_bytes, whole);
}

// A length field damaged in the middle of the file: corrupt when the frame
// it makes ends inside the file (its CRC cannot match), wherever it ends,
// the end of the file included. One that runs past the end reads as a
// torn tail (journal.h: framing cannot tell it from a cut record).
TEST_F(JournalTest, DamagedLengthMidFileIsCorruptUnlessItRunsPastTheEnd) {
  Journaled j(path_, {});
  auto r = j.Reserve(0, 3);
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(j.Commit(0, nullptr, Chain(1, 3), *r).ok());
  const uint64_t before = j.journal().bytes();  // The second reserve.
  auto r2 = j.Reserve(0, 3);
  ASSERT_TRUE(r2.ok());
  ASSERT_TRUE(j.Commit(0, nullptr, Chain(2, 3), *r2).ok());
  const uint64_t size = j.journal().bytes();
  const uint32_t to_end = static_cast<uint32_t>(size - before - 8);
  const uint32_t length = PutU32At(path_, before, 0);
  PutU32At(path_, before, length);
  const struct {
    uint32_t length;
    bool corrupt;
  } cases[] = {
      {length + 1, true},        // Inside the next record.
      {length - 1, true},        // Inside its own payload.
      {to_end - 1, true},        // One byte of the file after it.
      {to_end, true},            // Exactly at the end of the file.
      {to_end + 1, false},       // Past the end: reads as torn.
      {0, true},                 // Out of range.
      {(256u << 20) + 1, true},  // Over the limit.
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.length);
    PutU32At(path_, before, c.length);
    auto read = ReadJournal(path_);
    ASSERT_TRUE(read.ok()) << read.status();
    EXPECT_EQ(read->corrupt, c.corrupt) << read->stopped;
    EXPECT_THAT(read->stopped, HasSubstr(c.corrupt ? "corrupt" : "torn"));
    EXPECT_THAT(read->stopped, HasSubstr(absl::StrCat("offset ", before)));
    EXPECT_EQ(read->valid_bytes, before);
    EXPECT_EQ(read->keys.size(), 3u);
  }
}

TEST_F(JournalTest, TruncatedLastRecordIsATornTail) {
  Journaled j(path_, {});
  auto r = j.Reserve(0, 3);
  ASSERT_TRUE(r.ok());
  const uint64_t before = j.journal().bytes();
  ASSERT_TRUE(j.Commit(0, nullptr, Chain(1, 3), *r).ok());
  // Cut inside the frame and inside the payload.
  for (uint64_t cut : {j.journal().bytes() - 1, before + 8, before + 3}) {
    std::filesystem::resize_file(path_, cut);
    auto read = ReadJournal(path_);
    ASSERT_TRUE(read.ok()) << read.status();
    EXPECT_FALSE(read->corrupt) << cut;
    EXPECT_THAT(read->stopped, HasSubstr("torn"));
    EXPECT_EQ(read->valid_bytes, before);
    EXPECT_EQ(read->keys.size(), 0u);
  }
}

TEST_F(JournalTest, ZeroFilledTailIsATornTail) {
  Journaled j(path_, {});
  auto r = j.Reserve(0, 3);
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(j.Commit(0, nullptr, Chain(1, 3), *r).ok());
  const uint64_t whole = j.journal().bytes();
  // The file system extended the file but never wrote it.
  std::filesystem::resize_file(path_, whole + 300);
  auto read = ReadJournal(path_);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_FALSE(read->corrupt);
  EXPECT_THAT(read->stopped, HasSubstr("zeros"));
  EXPECT_EQ(read->keys.size(), 3u);
  // Zeros from a record's first byte on, within a frame's length of the
  // end: torn too.
  std::filesystem::resize_file(path_, whole + 5);
  read = ReadJournal(path_);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_FALSE(read->corrupt);
  EXPECT_THAT(read->stopped, HasSubstr("torn"));
  EXPECT_EQ(read->valid_bytes, whole);
  // A last record cut short, its written part ending in zeros: torn (its
  // frame runs past the end). Whole but for zeros, it is corrupt instead
  // (FlippedLastRecordIsCorruptNotTorn).
  std::filesystem::resize_file(path_, whole);
  ASSERT_TRUE(j.Drop(Key(1, 2)).ok());
  std::filesystem::resize_file(path_, whole + 12);
  std::filesystem::resize_file(path_, j.journal().bytes() - 1);
  read = ReadJournal(path_);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_FALSE(read->corrupt);
  EXPECT_THAT(read->stopped, HasSubstr("torn"));
  EXPECT_EQ(read->valid_bytes, whole);
  // Zeros followed by anything else are not a tail.
  std::filesystem::resize_file(path_, whole + 300);
  AppendBytes(path_, "x");
  read = ReadJournal(path_);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_TRUE(read->corrupt);
  EXPECT_EQ(read->valid_bytes, whole);
}

TEST_F(JournalTest, ValidRecordWithBadFieldsIsCorruptEvenAtTheEnd) {
  const HashKey k = Key(1, 0);
  const std::string hash(reinterpret_cast<const char*>(k.bytes.data()), 32);
  std::string bad_rank;
  PutLe32(&bad_rank, 7);  // Rank 7 of 1.
  PutLe32(&bad_rank, 0);
  PutLe32(&bad_rank, 0);
  std::string bad_row;
  PutLe32(&bad_row, 0);
  PutLe32(&bad_row, 1);
  PutLe32(&bad_row, 64);  // Of 64 rows.
  PutLe32(&bad_row, 0);
  const struct {
    std::string record;
    const char* field;
  } cases[] = {
      {Framed(kDropRecord, hash + "x"), "drop"},
      {Framed(9, hash), "unknown record type 9"},
      {Framed(kReserveRecord, bad_rank), "reserve.rank"},
      {Framed(kReserveRecord, bad_row), "reserve.page_rows[0]"},
  };
  for (const auto& c : cases) {
    std::filesystem::remove(path_);
    Journaled j(path_, {});
    auto r = j.Reserve(0, 3);
    ASSERT_TRUE(r.ok());
    ASSERT_TRUE(j.Commit(0, nullptr, Chain(1, 3), *r).ok());
    const uint64_t whole = j.journal().bytes();
    AppendBytes(path_, c.record);
    auto read = ReadJournal(path_);
    ASSERT_TRUE(read.ok()) << read.status();
    EXPECT_TRUE(read->corrupt) << c.field;
    EXPECT_THAT(read->stopped, HasSubstr(c.field));
    EXPECT_THAT(read->stopped, HasSubstr(absl::StrCat("offset ", whole)));
    EXPECT_EQ(read->valid_bytes, whole);
    EXPECT_EQ(read->keys.size(), 3u);
  }
}

TEST_F(JournalTest, AbsurdHeaderCountsAreDataLossNamingTheField) {
  const JournalHeader h = HeaderFor({.tp_size = 2});
  const struct {
    HeaderOverrides o;
    const char* field;
  } cases[] = {
      {{.segment_count = 0xffffffffu}, "header.segments"},
      {{.segment_count = 3}, "header.segments"},  // Only 2 written.
      {{.name_length = 0xfffffff0u}, "header.name"},
      {{.layout_length = 0x7fffffffu}, "header.layout"},
      {{.path_length = 0xffffff00u}, "header.segments[0].path"},
  };
  for (const auto& c : cases) {
    WriteHeaderOnly(path_, HeaderPayload(h, c.o));
    auto read = ReadJournal(path_);
    EXPECT_EQ(read.status().code(), absl::StatusCode::kDataLoss) << c.field;
    EXPECT_THAT(std::string(read.status().message()), HasSubstr(c.field));
  }
  JournalHeader zero = h;
  zero.page_rows = 0;
  WriteHeaderOnly(path_, HeaderPayload(zero));
  auto read = ReadJournal(path_);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(read.status().message()),
              HasSubstr("header.page_rows"));
  // The crafted header itself is fine.
  WriteHeaderOnly(path_, HeaderPayload(h));
  read = ReadJournal(path_);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->header.segments.size(), 2u);
}

TEST_F(JournalTest, HugeBankRowCountsDoNotSizeTheReplay) {
  // 64 ranks of 2^32 - 2 page and snapshot rows: a dense owner table would
  // take terabytes. The records name only a few of the rows.
  JournalHeader h = HeaderFor(
      {.page_rows = 0xfffffffe, .snapshot_rows = 0xfffffffe, .tp_size = 64});
  WriteHeaderOnly(path_, HeaderPayload(h));
  std::string reserve;
  PutLe32(&reserve, 63);
  PutLe32(&reserve, 2);
  PutLe32(&reserve, 0xfffffffd);
  PutLe32(&reserve, 12);
  PutLe32(&reserve, 1);
  PutLe32(&reserve, 0xfffffff0);
  AppendBytes(path_, Framed(kReserveRecord, reserve));
  auto read = ReadJournal(path_);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->stopped, "");
  EXPECT_EQ(read->ranks, 64u);
  EXPECT_EQ(read->outstanding_page_rows[63],
            (std::vector<uint32_t>{12, 0xfffffffd}));
  EXPECT_EQ(read->outstanding_snapshot_rows[63],
            (std::vector<uint32_t>{0xfffffff0}));
}

TEST_F(JournalTest, CountsThatCannotFitTheirRecordAreCorruptNotAllocated) {
  const HashKey k = Key(1, 0);
  const std::string hash(reinterpret_cast<const char*>(k.bytes.data()), 32);
  std::string nodes;  // A checkpoint record claiming 2^32 - 1 nodes.
  PutLe32(&nodes, 0xffffffffu);
  PutLe32(&nodes, kNoNode);
  nodes += hash;
  PutLe64(&nodes, 1);
  PutLe32(&nodes, 0);
  std::string few_nodes = nodes;  // 2 claimed, 1 written.
  few_nodes.replace(0, 4, std::string("\x02\0\0\0", 4));
  std::string commit;  // 2^32 - 1 pages.
  PutLe32(&commit, 0);
  commit += '\0';
  PutLe32(&commit, 0xffffffffu);
  commit += hash;
  PutLe32(&commit, 5);
  std::string snapshots = commit;  // 1 page, then 2^32 - 1 snapshots.
  snapshots.replace(5, 4, std::string("\x01\0\0\0", 4));
  PutLe32(&snapshots, 0xffffffffu);
  std::string reserve;  // 2^32 - 1 rows.
  PutLe32(&reserve, 0);
  PutLe32(&reserve, 0xffffffffu);
  PutLe32(&reserve, 1);
  const struct {
    std::string record;
    const char* field;
  } cases[] = {
      {Framed(kNodesRecord, nodes), "nodes.count"},
      {Framed(kNodesRecord, few_nodes), "nodes.count"},
      {Framed(kCommitRecord, commit), "commit.pages"},
      {Framed(kCommitRecord, snapshots), "commit.snapshots"},
      {Framed(kReserveRecord, reserve), "reserve.page_rows"},
  };
  for (const auto& c : cases) {
    for (bool followed : {false, true}) {
      std::filesystem::remove(path_);
      Journaled j(path_, {});
      auto r = j.Reserve(0, 2);
      ASSERT_TRUE(r.ok());
      ASSERT_TRUE(j.Commit(0, nullptr, Chain(1, 2), *r).ok());
      const uint64_t whole = j.journal().bytes();
      AppendBytes(path_, c.record);
      if (followed) AppendBytes(path_, Framed(kDropRecord, hash));
      auto read = ReadJournal(path_);
      ASSERT_TRUE(read.ok()) << read.status();
      EXPECT_TRUE(read->corrupt) << c.field;
      EXPECT_THAT(read->stopped, HasSubstr(c.field));
      EXPECT_EQ(read->valid_bytes, whole);
      EXPECT_EQ(read->keys.size(), 2u);
    }
  }
}

}  // namespace
}  // namespace kvtier::daemon
