// RespReader and ValueArena (daemon/resp_reader.h): replies parsed from
// bytes fed in every split, bulk strings landing in the arena (or their
// own string), protocol errors sticky, and reads off a real socket pair.
#include "daemon/resp_reader.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace kvtier::daemon {
namespace {

using Type = RespReply::Type;

std::vector<RespReply> Drain(RespReader& reader) {
  std::vector<RespReply> out;
  RespReply r;
  while (reader.Next(&r)) out.push_back(std::move(r));
  return out;
}

std::string Bulk(const std::string& s) {
  return "$" + std::to_string(s.size()) + "\r\n" + s + "\r\n";
}

TEST(RespReaderTest, EveryReplyTypeInEverySplit) {
  const std::string big(100000, 'x');
  const std::string stream =
      "+OK\r\n-MOVED 3999 127.0.0.1:6381\r\n:1\r\n:-42\r\n" + Bulk("hello") +
      "$-1\r\n" + Bulk("") + Bulk(big);
  for (size_t step :
       {size_t{1}, size_t{2}, size_t{7}, size_t{4096}, stream.size()}) {
    SCOPED_TRACE(step);
    ValueArena arena;
    arena.Reset(1 << 20);
    RespReader reader(&arena);
    for (size_t at = 0; at < stream.size(); at += step) {
      ASSERT_TRUE(reader.Feed(absl::string_view(stream).substr(at, step)).ok());
    }
    const std::vector<RespReply> r = Drain(reader);
    ASSERT_EQ(r.size(), 8u);
    EXPECT_EQ(r[0].type, Type::kStatus);
    EXPECT_EQ(r[0].value, "OK");
    EXPECT_EQ(r[1].type, Type::kError);
    EXPECT_EQ(r[1].value, "MOVED 3999 127.0.0.1:6381");
    EXPECT_EQ(r[2].type, Type::kInteger);
    EXPECT_EQ(r[2].integer, 1);
    EXPECT_EQ(r[3].integer, -42);
    EXPECT_EQ(r[4].type, Type::kString);
    EXPECT_EQ(r[4].value, "hello");
    EXPECT_EQ(r[5].type, Type::kNil);
    EXPECT_EQ(r[6].type, Type::kString);
    EXPECT_EQ(r[6].value, "");
    EXPECT_EQ(r[7].value, big);
    EXPECT_EQ(arena.overflow_bytes(), 0u);
    EXPECT_TRUE(reader.idle());
  }
}

TEST(RespReaderTest, BulkStringsInTheArenaOrTheirOwnString) {
  ValueArena arena;
  arena.Reset(64);
  RespReader reader(&arena);
  const std::string big(3 << 20, 'b');  // Past the block (2 MiB).
  ASSERT_TRUE(reader.Feed(Bulk(std::string(10, 'a')) + Bulk(big)).ok());
  std::vector<RespReply> r = Drain(reader);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].value, std::string(10, 'a'));
  EXPECT_TRUE(r[0].owned.empty());  // In the arena.
  EXPECT_EQ(r[1].value, big);
  EXPECT_EQ(arena.overflow_bytes(), big.size());  // A block of its own.
  EXPECT_EQ(std::move(r[1]).TakeString(), big);

  RespReader no_arena(nullptr);
  ASSERT_TRUE(no_arena.Feed(Bulk("short")).ok());
  RespReply moved;
  ASSERT_TRUE(no_arena.Next(&moved));
  RespReply again = std::move(moved);  // The view follows the string (SSO).
  EXPECT_EQ(again.value, "short");
  EXPECT_EQ(again.value.data(), again.owned.data());
}

TEST(RespReaderTest, ProtocolErrorsAreSticky) {
  for (const std::string& bad : std::vector<std::string>{
           "*1\r\n", "$abc\r\n", "$-2\r\n", ":\r\n", ":12x\r\n", "+OK\n",
           "\r\n", "$3\r\nabcXY", "%1\r\n", "$99999999999\r\n",
           "+" + std::string(RespReader::kMaxLine + 1, 'a')}) {
    SCOPED_TRACE(bad.substr(0, 20));
    RespReader reader(nullptr);
    EXPECT_FALSE(reader.Feed(bad).ok());
    EXPECT_FALSE(reader.Feed("+OK\r\n").ok());
    EXPECT_FALSE(reader.idle());
  }
}

TEST(RespReaderTest, IdleOnlyWithNothingHeld) {
  RespReader reader(nullptr);
  EXPECT_TRUE(reader.idle());
  ASSERT_TRUE(reader.Feed("$5\r\nab").ok());
  EXPECT_FALSE(reader.idle());  // Mid-body.
  ASSERT_TRUE(reader.Feed("cde").ok());
  EXPECT_FALSE(reader.idle());  // CRLF due.
  ASSERT_TRUE(reader.Feed("\r\n:1").ok());
  EXPECT_FALSE(reader.idle());  // A reply waiting and a partial one.
  ASSERT_EQ(Drain(reader).size(), 1u);
  ASSERT_TRUE(reader.Feed("\r\n").ok());
  ASSERT_EQ(Drain(reader).size(), 1u);
  EXPECT_TRUE(reader.idle());
}

// A bulk string over the reader's cap: refused before anything is
// allocated for it, drained (the replies after it still parse, the reader
// ends idle), and reported with its size.
TEST(RespReaderTest, BulkOverTheCapIsDrainedNotStored) {
  const std::string big(5000, 'x');
  const std::string stream = Bulk("fits") + Bulk(big) + ":7\r\n" + Bulk("ok");
  for (size_t step : {size_t{1}, size_t{13}, size_t{4096}, stream.size()}) {
    SCOPED_TRACE(step);
    ValueArena arena;
    arena.Reset(1);
    for (ValueArena* use : {&arena, static_cast<ValueArena*>(nullptr)}) {
      arena.Reset(1);
      const uint64_t allocated = ValueArena::TotalAllocatedBytes();
      RespReader reader(use, /*max_bulk=*/1000);
      for (size_t at = 0; at < stream.size(); at += step) {
        ASSERT_TRUE(
            reader.Feed(absl::string_view(stream).substr(at, step)).ok());
      }
      const std::vector<RespReply> r = Drain(reader);
      ASSERT_EQ(r.size(), 4u);
      EXPECT_EQ(r[0].value, "fits");
      EXPECT_EQ(r[1].type, Type::kTooLarge);
      EXPECT_EQ(r[1].integer, 5000);
      EXPECT_TRUE(r[1].value.empty());
      EXPECT_TRUE(r[1].owned.empty());
      EXPECT_EQ(r[2].integer, 7);
      EXPECT_EQ(r[3].value, "ok");
      EXPECT_EQ(arena.overflow_bytes(), 0u);
      EXPECT_EQ(ValueArena::TotalAllocatedBytes(), allocated);
      EXPECT_TRUE(reader.idle());
    }
  }
  // At the cap exactly: stored.
  RespReader reader(nullptr, /*max_bulk=*/4);
  ASSERT_TRUE(reader.Feed(Bulk("four") + Bulk("fiver")).ok());
  const std::vector<RespReply> r = Drain(reader);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].value, "four");
  EXPECT_EQ(r[1].type, Type::kTooLarge);
}

// Off a socket, a 512 MiB header (the protocol's limit) over a small cap:
// nothing is allocated when the header is read, and the body's bytes are
// read into the reader's own buffer and dropped (the reader never asks the
// socket for more than that buffer at once).
TEST(RespReaderTest, HugeBulkHeaderOverTheCapAllocatesNothing) {
  int fds[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  const size_t body = 8 << 20;
  ValueArena arena;
  arena.Reset(1);
  const uint64_t allocated = ValueArena::TotalAllocatedBytes();
  RespReader reader(&arena, /*max_bulk=*/1 << 20);
  // The header of the largest value the protocol allows, and a bit of it.
  const std::string header =
      "$" + std::to_string(RespReader::kMaxBulk) + "\r\n" + "abc";
  ASSERT_EQ(write(fds[1], header.data(), header.size()),
            static_cast<ssize_t>(header.size()));
  ASSERT_TRUE(reader.ReadFrom(fds[0]).ok());
  EXPECT_EQ(ValueArena::TotalAllocatedBytes(), allocated);
  EXPECT_FALSE(reader.idle());
  RespReply none;
  EXPECT_FALSE(reader.Next(&none));
  close(fds[0]);
  close(fds[1]);

  // A whole over-cap value, then a reply, off a socket.
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  const std::string stream = Bulk(std::string(body, 'z')) + ":9\r\n";
  std::thread writer([&] {
    for (size_t at = 0; at < stream.size();) {
      const ssize_t n = write(fds[1], stream.data() + at,
                              std::min<size_t>(stream.size() - at, 100000));
      ASSERT_GT(n, 0);
      at += static_cast<size_t>(n);
    }
    close(fds[1]);
  });
  RespReader drained(&arena, /*max_bulk=*/1 << 20);
  std::vector<RespReply> got;
  absl::Status status;
  while ((status = drained.ReadFrom(fds[0])).ok()) {
    for (RespReply& r : Drain(drained)) got.push_back(std::move(r));
  }
  writer.join();
  close(fds[0]);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);  // EOF.
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].type, Type::kTooLarge);
  EXPECT_EQ(got[0].integer, static_cast<int64_t>(body));
  EXPECT_EQ(got[1].integer, 9);
  EXPECT_TRUE(drained.idle());
  EXPECT_EQ(ValueArena::TotalAllocatedBytes(), allocated);
}

TEST(RespReaderTest, ReadsBigValuesOffASocket) {
  int fds[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  std::string stream;
  std::vector<std::string> values;
  for (int i = 0; i < 8; ++i) {
    values.push_back(std::string((3 << 20) + i, static_cast<char>('a' + i)));
    stream += Bulk(values.back()) + ":" + std::to_string(i) + "\r\n";
  }
  std::thread writer([&] {
    for (size_t at = 0; at < stream.size();) {
      const ssize_t n = write(fds[1], stream.data() + at,
                              std::min<size_t>(stream.size() - at, 100000));
      ASSERT_GT(n, 0);
      at += static_cast<size_t>(n);
    }
    close(fds[1]);
  });
  ValueArena arena;
  arena.Reset(4 << 20);  // Values past the first overflow.
  RespReader reader(&arena);
  std::vector<RespReply> got;
  absl::Status status;
  while ((status = reader.ReadFrom(fds[0])).ok()) {
    for (RespReply& r : Drain(reader)) got.push_back(std::move(r));
  }
  writer.join();
  close(fds[0]);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);  // EOF.
  ASSERT_EQ(got.size(), 16u);
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(got[2 * i].value, values[i]) << i;
    EXPECT_EQ(got[2 * i + 1].integer, i);
  }
  EXPECT_TRUE(reader.idle());
}

}  // namespace
}  // namespace kvtier::daemon
