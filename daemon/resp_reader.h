// RespReader: the replies of a pipeline of GET, EXISTS, SET, DEL and ASKING
// commands, read off a socket straight into where they are wanted
// (daemon/redis_cluster_pipeline.cc; issue 17).
//
// hiredis 0.14 copies a reply three times before the caller sees it (its
// reader's buffer, a fresh redisReply, then the caller's own string, each
// a fresh allocation whose pages fault in). A prefetch moves GiBs of
// values of a few MiB each, so here a bulk string goes from the socket to
// its final place with one readv(2): the kernel's copy only. Its place is
// the caller's ValueArena, reused from call to call, so its pages are
// faulted in once.
//
// Only the reply types of those commands are understood (RESP2 simple
// strings, errors, integers, bulk strings and the null bulk string); an
// array, a RESP3 type or a malformed header is a protocol error, and the
// connection must then be closed. Lines (all but bulk bodies) are at most
// kMaxLine bytes and bulk strings at most kMaxBulk (Redis's own
// proto-max-bulk-len default): a server cannot make the reader buffer
// more than that. A reader may be given a smaller cap, the largest value
// its caller expects (a prefetch: the size of a value of its layout): a
// bulk string over it is refused before anything is allocated for it,
// and drained, not stored (its bytes still cross the network, within the
// caller's deadline), so that the connection stays in step and a value
// planted in Redis costs no memory.
//
// Thread-safety: RespReader and ValueArena are not thread-safe; one thread
// reads a connection at a time.
#ifndef KVTIER_DAEMON_RESP_READER_H_
#define KVTIER_DAEMON_RESP_READER_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace kvtier::daemon {

// Memory for bulk strings: one block, handed out front to back, kept and
// reused across Resets; what does not fit gets a block of its own, freed
// at the next Reset. The block is mapped with transparent huge pages where
// the kernel allows them (madvise): a 64 MiB block faults in 32 times, not
// 16,384.
class ValueArena {
 public:
  // Each allocation starts at a multiple of this (a cache line): reserve
  // up to kAlign - 1 bytes more per value.
  static constexpr size_t kAlign = 64;

  ValueArena() = default;
  ~ValueArena();
  ValueArena(const ValueArena&) = delete;
  ValueArena& operator=(const ValueArena&) = delete;

  // Forgets everything allocated (the views into it dangle) and makes the
  // main block at least `bytes` long.
  void Reset(size_t bytes);
  // `size` bytes, uninitialised, valid until the next Reset.
  char* Allocate(size_t size);
  // Bytes handed out since the last Reset that did not fit the main block.
  size_t overflow_bytes() const { return overflow_bytes_; }
  // Bytes every ValueArena of the process has mapped (main blocks) or
  // allocated (blocks of their own) so far: a counter that only grows, so
  // that a test can see that a value was never stored.
  static uint64_t TotalAllocatedBytes();

 private:
  char* block_ = nullptr;  // mmap'd, capacity_ bytes
  size_t capacity_ = 0, used_ = 0;
  std::vector<std::unique_ptr<char[]>> extra_;
  size_t overflow_bytes_ = 0;
};

struct RespReply {
  // kTooLarge: a bulk string over the reader's max_bulk, drained unstored.
  enum class Type { kStatus, kError, kInteger, kNil, kString, kTooLarge };
  Type type = Type::kNil;
  int64_t integer = 0;      // kInteger; kTooLarge: the bulk string's size
  absl::string_view value;  // kStatus, kError: the line; kString: the bytes
  std::string owned;        // what `value` views when not in an arena

  RespReply() = default;
  RespReply(RespReply&& other) noexcept { *this = std::move(other); }
  RespReply& operator=(RespReply&& other) noexcept;
  // The bytes of `value` as a string (moved out of `owned` when there).
  std::string TakeString() &&;
};

class RespReader {
 public:
  static constexpr size_t kMaxLine = 16 << 10;
  static constexpr size_t kMaxBulk = 512ull << 20;

  // Bulk strings go to `arena` (outlives the reader), or into their reply's
  // own string when it is null; one over `max_bulk` bytes (at most
  // kMaxBulk: a larger cap counts as that) is a kTooLarge reply instead.
  explicit RespReader(ValueArena* arena, size_t max_bulk = kMaxBulk);
  RespReader(const RespReader&) = delete;
  RespReader& operator=(const RespReader&) = delete;

  // One readv(2) of `fd` (non-blocking or known readable): into the bulk
  // string being read, then the reader's buffer; then every reply complete
  // in it is parsed. OK when it read bytes or would block; UNAVAILABLE on
  // EOF or a read error (the message names it); INTERNAL on a protocol
  // error.
  absl::Status ReadFrom(int fd);
  // Parses bytes as if read (for tests); same errors as ReadFrom.
  absl::Status Feed(absl::string_view bytes);
  // Moves the oldest complete reply into *reply; false when there is none.
  bool Next(RespReply* reply);
  // No byte held and no reply waiting: the connection can be reused.
  bool idle() const;

 private:
  absl::Status Parse();
  absl::Status ParseLine(absl::string_view line);

  ValueArena* const arena_;
  const size_t max_bulk_;
  std::vector<char> buffer_;
  size_t begin_ = 0, end_ = 0;  // Unparsed bytes: buffer_[begin_, end_).
  // The bulk string being read: its reply, where it goes (nullptr: its
  // bytes are dropped, as one over max_bulk_'s are), how much came.
  bool in_body_ = false;
  RespReply body_;
  char* body_data_ = nullptr;
  size_t body_size_ = 0, body_got_ = 0;
  bool want_crlf_ = false;  // The CRLF after a complete body is due.
  std::deque<RespReply> done_;
  absl::Status error_;  // Sticky: the first protocol error.
};

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_RESP_READER_H_
