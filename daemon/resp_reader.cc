// RespReader and ValueArena: see resp_reader.h.
#include "daemon/resp_reader.h"

#include <sys/mman.h>
#include <sys/uio.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace kvtier::daemon {
namespace {

// The reader's buffer: headers, small replies and the first bytes of a
// bulk string; the rest of a bulk string is read past it.
constexpr size_t kBufferBytes = 64 << 10;
static_assert(kBufferBytes > RespReader::kMaxLine + 2);

constexpr size_t kHugePage = 2 << 20;

// ValueArena::TotalAllocatedBytes.
std::atomic<uint64_t> arena_allocated_bytes{0};

// A RESP integer: an optional '-' and 1 to 18 digits, nothing else.
bool ParseInteger(absl::string_view s, int64_t* out) {
  const bool negative = !s.empty() && s[0] == '-';
  if (negative) s.remove_prefix(1);
  if (s.empty() || s.size() > 18) return false;
  int64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + (c - '0');
  }
  *out = negative ? -v : v;
  return true;
}

}  // namespace

ValueArena::~ValueArena() {
  if (block_ != nullptr) munmap(block_, capacity_);
}

void ValueArena::Reset(size_t bytes) {
  extra_.clear();
  used_ = 0;
  overflow_bytes_ = 0;
  if (bytes <= capacity_) return;
  if (block_ != nullptr) munmap(block_, capacity_);  // Never two at once.
  block_ = nullptr;
  capacity_ = 0;
  const size_t size = (bytes + kHugePage - 1) / kHugePage * kHugePage;
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return;  // Every value then gets a block of its own.
  (void)madvise(p, size, MADV_HUGEPAGE);  // Advice: EINVAL without THP.
  block_ = static_cast<char*>(p);
  capacity_ = size;
  arena_allocated_bytes.fetch_add(size, std::memory_order_relaxed);
}

uint64_t ValueArena::TotalAllocatedBytes() {
  return arena_allocated_bytes.load(std::memory_order_relaxed);
}

char* ValueArena::Allocate(size_t size) {
  const size_t rounded = (size + kAlign - 1) / kAlign * kAlign;
  if (rounded <= capacity_ - used_) {
    char* p = block_ + used_;
    used_ += rounded;
    return p;
  }
  extra_.emplace_back(new char[std::max<size_t>(size, 1)]);
  overflow_bytes_ += size;
  arena_allocated_bytes.fetch_add(size, std::memory_order_relaxed);
  return extra_.back().get();
}

RespReply& RespReply::operator=(RespReply&& other) noexcept {
  if (this == &other) return *this;
  const bool in_owned = other.value.data() == other.owned.data();
  type = other.type;
  integer = other.integer;
  owned = std::move(other.owned);
  value = in_owned ? absl::string_view(owned) : other.value;
  other.value = {};
  return *this;
}

std::string RespReply::TakeString() && {
  if (value.data() == owned.data() && value.size() == owned.size()) {
    value = {};
    return std::move(owned);
  }
  return std::string(value);
}

RespReader::RespReader(ValueArena* arena, size_t max_bulk)
    : arena_(arena),
      max_bulk_(std::min(max_bulk, kMaxBulk)),
      buffer_(kBufferBytes) {}

bool RespReader::Next(RespReply* reply) {
  if (done_.empty()) return false;
  *reply = std::move(done_.front());
  done_.pop_front();
  return true;
}

bool RespReader::idle() const {
  return error_.ok() && begin_ == end_ && !in_body_ && !want_crlf_ &&
         done_.empty();
}

absl::Status RespReader::ReadFrom(int fd) {
  if (!error_.ok()) return error_;
  if (begin_ == end_) {
    begin_ = end_ = 0;
  } else if (begin_ > 0 && buffer_.size() - end_ < RespReader::kMaxLine) {
    std::memmove(buffer_.data(), buffer_.data() + begin_, end_ - begin_);
    end_ -= begin_;
    begin_ = 0;
  }
  // Parse() leaves no buffered byte while a body is due: the socket's next
  // bytes are the body's, then whatever follows it. A body being dropped
  // is read into the buffer, which Parse() then empties.
  const size_t body_room =
      in_body_ && body_data_ != nullptr ? body_size_ - body_got_ : 0;
  iovec iov[2];
  int count = 0;
  if (body_room > 0) iov[count++] = {body_data_ + body_got_, body_room};
  if (end_ < buffer_.size()) {
    iov[count++] = {buffer_.data() + end_, buffer_.size() - end_};
  }
  ssize_t n;
  do {
    n = readv(fd, iov, count);
  } while (n < 0 && errno == EINTR);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
    return absl::OkStatus();
  }
  if (n == 0) return absl::UnavailableError("Server closed the connection");
  if (n < 0) return absl::UnavailableError(std::strerror(errno));
  const size_t to_body = std::min(static_cast<size_t>(n), body_room);
  body_got_ += to_body;
  end_ += static_cast<size_t>(n) - to_body;
  return Parse();
}

absl::Status RespReader::Feed(absl::string_view bytes) {
  while (!bytes.empty()) {
    if (!error_.ok()) return error_;
    if (begin_ == end_) begin_ = end_ = 0;
    if (end_ == buffer_.size()) {
      std::memmove(buffer_.data(), buffer_.data() + begin_, end_ - begin_);
      end_ -= begin_;
      begin_ = 0;
    }
    const size_t n = std::min(bytes.size(), buffer_.size() - end_);
    std::memcpy(buffer_.data() + end_, bytes.data(), n);
    end_ += n;
    bytes.remove_prefix(n);
    if (absl::Status s = Parse(); !s.ok()) return s;
  }
  return error_;
}

absl::Status RespReader::Parse() {
  while (error_.ok()) {
    if (in_body_) {
      const size_t take = std::min(end_ - begin_, body_size_ - body_got_);
      if (take > 0) {
        if (body_data_ != nullptr) {
          std::memcpy(body_data_ + body_got_, buffer_.data() + begin_, take);
        }
        begin_ += take;
        body_got_ += take;
      }
      if (body_got_ < body_size_) return absl::OkStatus();
      in_body_ = false;
      want_crlf_ = true;
    }
    if (want_crlf_) {
      if (end_ - begin_ < 2) return absl::OkStatus();
      if (buffer_[begin_] != '\r' || buffer_[begin_ + 1] != '\n') {
        error_ = absl::InternalError(
            "redis protocol error: a bulk string not followed by CRLF");
        break;
      }
      begin_ += 2;
      want_crlf_ = false;
      done_.push_back(std::move(body_));
      body_ = RespReply();
    }
    const char* start = buffer_.data() + begin_;
    const void* nl = std::memchr(start, '\n', end_ - begin_);
    if (nl == nullptr) {
      if (end_ - begin_ > kMaxLine) {
        error_ = absl::InternalError("redis protocol error: line too long");
        break;
      }
      return absl::OkStatus();
    }
    const size_t len = static_cast<const char*>(nl) - start;
    if (len == 0 || start[len - 1] != '\r' || len - 1 > kMaxLine) {
      error_ = absl::InternalError("redis protocol error: bad line");
      break;
    }
    begin_ += len + 1;
    error_ = ParseLine(absl::string_view(start, len - 1));
  }
  return error_;
}

absl::Status RespReader::ParseLine(absl::string_view line) {
  if (line.empty()) {
    return absl::InternalError("redis protocol error: empty line");
  }
  const char type = line[0];
  line.remove_prefix(1);
  RespReply reply;
  switch (type) {
    case '+':
    case '-':
      reply.type =
          type == '+' ? RespReply::Type::kStatus : RespReply::Type::kError;
      reply.owned = std::string(line);
      reply.value = reply.owned;
      done_.push_back(std::move(reply));
      return absl::OkStatus();
    case ':':
      if (!ParseInteger(line, &reply.integer)) break;
      reply.type = RespReply::Type::kInteger;
      done_.push_back(std::move(reply));
      return absl::OkStatus();
    case '$': {
      int64_t size = 0;
      if (!ParseInteger(line, &size) || size < -1 ||
          size > static_cast<int64_t>(kMaxBulk)) {
        break;
      }
      if (size == -1) {
        reply.type = RespReply::Type::kNil;
        done_.push_back(std::move(reply));
        return absl::OkStatus();
      }
      body_ = RespReply();
      body_.type = RespReply::Type::kString;
      body_size_ = static_cast<size_t>(size);
      body_got_ = 0;
      in_body_ = true;
      if (body_size_ > max_bulk_) {
        // Refused before anything is allocated for it: drained.
        body_.type = RespReply::Type::kTooLarge;
        body_.integer = size;
        body_data_ = nullptr;
        return absl::OkStatus();
      }
      if (arena_ != nullptr) {
        body_data_ = arena_->Allocate(body_size_);
        body_.value = absl::string_view(body_data_, body_size_);
      } else {
        body_.owned.resize(body_size_);
        body_data_ = body_.owned.data();
        body_.value = body_.owned;
      }
      return absl::OkStatus();
    }
    default:
      return absl::InternalError(
          absl::StrCat("redis protocol error: unexpected reply type '",
                       absl::CHexEscape(absl::string_view(&type, 1)), "'"));
  }
  return absl::InternalError(absl::StrCat("redis protocol error: bad header '",
                                          absl::CHexEscape(line.substr(0, 64)),
                                          "'"));
}

}  // namespace kvtier::daemon
