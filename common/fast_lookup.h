// The fast lookup path: a framed binary protocol on a second unix socket,
// beside gRPC, for the one latency-critical call (Lookup of a long prefix).
//
// Why: over gRPC a 1,536-hash lookup costs ~230 µs on the H200's host, almost
// all of it HTTP/2 and thread hand-offs, against ~20 µs of actual work. Here
// a daemon thread per engine connection blocks in read(), runs the same
// TierCore::LookupHashes, and writes the answer: two wake-ups per lookup.
//
// Protocol (host byte order; both ends are on one machine):
//   client -> daemon  Hello{magic, version, session_id}
//   daemon -> client  HelloReply{magic, code}       (code: absl status code)
//   then any number of
//   client -> daemon  Request{...} + hash_bytes bytes of packed hashes
//   daemon -> client  Reply{...} + usable_pages * uint32 rows, or on error
//                     the message (Reply::code and Reply::reason: the status)
// The session id (an unguessable 64-bit capability from the gRPC Session
// stream) authorises the connection; a connection is closed on any framing
// error, and one that sends no Hello within the daemon's deadline (1 s by
// default) is closed too: a client sends its Hello right after connect and
// connects again if the connection ends before the reply. A HelloReply code
// of RESOURCE_EXHAUSTED means the daemon serves as many connections as it
// may. Pins taken here belong to the session and die with it.
//
// Thread-safety: plain structs and stateless helpers.
#ifndef KVTIER_COMMON_FAST_LOOKUP_H_
#define KVTIER_COMMON_FAST_LOOKUP_H_

#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>

namespace kvtier::fastpath {

inline constexpr uint32_t kHelloMagic = 0x4c48564bu;    // "KVHL"
inline constexpr uint32_t kRequestMagic = 0x5152564bu;  // "KVRQ"
inline constexpr uint32_t kReplyMagic = 0x5052564bu;    // "KVRP"
inline constexpr uint32_t kVersion = 1;
inline constexpr uint32_t kFlagPin = 1;
// The largest request that can be valid: the most pages a lookup may name
// (daemon kMaxLookupPages, 1 << 20) times the longest hash (32 bytes).
inline constexpr uint32_t kMaxLookupHashes = 1u << 20;
inline constexpr uint32_t kMaxHashBytes = 32;
inline constexpr uint32_t kMaxRequestBytes = kMaxLookupHashes * kMaxHashBytes;

struct Hello {
  uint32_t magic = kHelloMagic;
  uint32_t version = kVersion;
  uint64_t session_id = 0;
};

struct HelloReply {
  uint32_t magic = kReplyMagic;
  int32_t code = 0;
};

struct Request {
  uint32_t magic = kRequestMagic;
  uint32_t flags = 0;
  uint64_t namespace_id = 0;
  uint32_t hash_bytes = 0;  // Bytes of packed hashes that follow.
  uint32_t reserved = 0;
};

struct Reply {
  uint32_t magic = kReplyMagic;
  int32_t code = 0;  // absl::StatusCode; on error only message follows.
  uint32_t matched_pages = 0;
  uint32_t usable_pages = 0;
  uint32_t has_snapshot = 0;
  uint32_t snapshot_row = 0;
  uint64_t lease_id = 0;
  uint32_t message_bytes = 0;
  // On error, the kvtier::ErrorReason of the status (common/error_reason.h);
  // 0 (none) from daemons that predate it, which sent 0 here.
  uint32_t reason = 0;
};

// Reads exactly n bytes; false on EOF or error.
inline bool ReadFull(int fd, void* p, size_t n) {
  auto* b = static_cast<char*>(p);
  while (n > 0) {
    const ssize_t r = ::read(fd, b, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    b += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

// Writes every byte of the iovecs to socket `fd`; false on error. Never
// raises SIGPIPE (a library must not kill its engine when the daemon dies).
// Modifies `iov`.
inline bool WriteFullV(int fd, iovec* iov, int count) {
  while (count > 0) {
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(count);
    const ssize_t w = ::sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return false;
    size_t left = static_cast<size_t>(w);
    while (count > 0 && left >= iov->iov_len) {
      left -= iov->iov_len;
      ++iov;
      --count;
    }
    if (count > 0) {
      iov->iov_base = static_cast<char*>(iov->iov_base) + left;
      iov->iov_len -= left;
    }
  }
  return true;
}

}  // namespace kvtier::fastpath

#endif  // KVTIER_COMMON_FAST_LOOKUP_H_
