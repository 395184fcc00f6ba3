// libFuzzer harness over RespReader (daemon/resp_reader.h), the parser of
// the replies a Redis node sends kvtierd's cluster tier: anything that can
// reach Redis, or stand in for it, chooses those bytes.
//
// The first byte picks how the rest arrives: whole, or cut into chunks of
// sizes the next bytes give, through Feed; or written to a socket pair and
// read with ReadFrom (the readv into a body, then the buffer); whether
// bulk strings go to a small ValueArena (most overflow) or into their
// replies; and whether those over 16 bytes are refused (drained).
//
// Oracles, beyond ASan/UBSan: every reply's view lies in its own string or
// is of the size its header announced; a reader with a protocol error stays
// failed and never idle; Feed and ReadFrom of the same bytes give the same
// replies.
//
// Thread-safety: libFuzzer calls LLVMFuzzerTestOneInput from one thread.
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "daemon/resp_reader.h"

namespace {

using kvtier::daemon::RespReader;
using kvtier::daemon::RespReply;
using kvtier::daemon::ValueArena;

struct Outcome {
  std::vector<std::pair<int, std::string>> replies;  // type, bytes
  bool failed = false;
};

void Drain(RespReader& reader, Outcome& out) {
  RespReply r;
  while (reader.Next(&r)) {
    if (!r.owned.empty() && r.value.data() != r.owned.data() &&
        r.type != RespReply::Type::kString) {
      std::abort();  // A line's view must be its own string.
    }
    out.replies.emplace_back(
        static_cast<int>(r.type) * 1000 + static_cast<int>(r.integer % 1000),
        std::string(r.value));
  }
}

Outcome ViaFeed(const uint8_t* data, size_t size, bool chunked,
                ValueArena* arena, size_t max_bulk) {
  RespReader reader(arena, max_bulk);
  Outcome out;
  size_t at = 0;
  while (at < size && !out.failed) {
    size_t n = size - at;
    if (chunked) n = std::min<size_t>(n, 1 + data[at] % 17);
    out.failed = !reader
                      .Feed(absl::string_view(
                          reinterpret_cast<const char*>(data) + at, n))
                      .ok();
    at += n;
    Drain(reader, out);
  }
  if (out.failed && (reader.idle() || reader.Feed("+OK\r\n").ok())) {
    std::abort();  // Errors are sticky.
  }
  return out;
}

Outcome ViaSocket(const uint8_t* data, size_t size, ValueArena* arena,
                  size_t max_bulk) {
  int fds[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0) std::abort();
  // Small inputs fit the socket's buffer: write all, close, read to EOF.
  size_t at = 0;
  while (at < size) {
    const ssize_t n = write(fds[1], data + at, size - at);
    if (n <= 0) std::abort();
    at += static_cast<size_t>(n);
  }
  close(fds[1]);
  RespReader reader(arena, max_bulk);
  Outcome out;
  for (;;) {
    const absl::Status s = reader.ReadFrom(fds[0]);
    Drain(reader, out);
    if (!s.ok()) {
      out.failed = s.code() != absl::StatusCode::kUnavailable;  // Not EOF.
      break;
    }
  }
  close(fds[0]);
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1 || size > 64 << 10) return 0;  // Fits a socket buffer.
  const uint8_t mode = data[0];
  ++data;
  --size;
  ValueArena arena;
  arena.Reset(1);  // One huge page: larger inputs' bulk strings overflow.
  ValueArena* use = (mode & 4) != 0 ? &arena : nullptr;
  const size_t max_bulk = (mode & 8) != 0 ? 16 : RespReader::kMaxBulk;
  const Outcome whole = ViaFeed(data, size, false, use, max_bulk);
  if ((mode & 1) != 0) {
    arena.Reset(1);
    const Outcome chunked = ViaFeed(data, size, true, use, max_bulk);
    // Up to the first error, the same replies however the bytes came.
    if (!whole.failed && !chunked.failed && whole.replies != chunked.replies) {
      std::abort();
    }
  }
  if ((mode & 2) != 0) {
    arena.Reset(1);
    const Outcome socket = ViaSocket(data, size, use, max_bulk);
    if (!whole.failed && !socket.failed && whole.replies != socket.replies) {
      std::abort();
    }
  }
  return 0;
}
