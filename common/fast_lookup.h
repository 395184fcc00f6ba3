// The engine protocol: a framed binary protocol on the daemon's engine unix
// socket (<socket>.lookup), beside gRPC. libkvtier speaks nothing else, so it
// needs no gRPC: every call an engine makes travels here, the hot one (Lookup
// of a long prefix) as a binary frame, the rest as protobuf messages of
// kvtier.v1 in a call frame. gRPC stays on the daemon's main and operator
// sockets for kvtierctl and any gRPC tool.
//
// Why a framed protocol: over gRPC a 1,536-hash lookup costs ~230 us on the
// H200's host, almost all of it HTTP/2 and thread hand-offs, against ~20 us
// of actual work. Here a daemon thread per engine connection blocks in
// read(), runs TierCore, and writes the answer: two wake-ups per call.
//
// Two kinds of connection, told apart by their first frame (16 bytes):
//
// A session connection opens a session and IS it: the session ends when the
// connection does (the engine exited, was killed, or the daemon stopped).
//   client -> daemon  Open{magic, version, hello_bytes} + a v1.Hello
//   daemon -> client  OpenReply{...} + message_bytes of message on error
//   then
//   client -> daemon  Control{kGoodbye, quiescent} (optional, at a clean close)
//   daemon -> client  Control{kDraining}           (the daemon is stopping)
// The peer's SO_PEERCRED becomes the session's identity at once.
//
// A call connection joins an open session and carries its calls:
//   client -> daemon  Hello{magic, version, session_id}
//   daemon -> client  HelloReply{magic, code}       (code: absl status code)
//   then any number of either
//   client -> daemon  Request{...} + hash_bytes bytes of packed hashes
//   daemon -> client  Reply{...} + usable_pages * uint32 rows, or on error
//                     the message (Reply::code and Reply::reason: the status)
//   or
//   client -> daemon  Call{method, payload_bytes} + the method's v1 request
//   daemon -> client  CallReply{code, reason, message_bytes, payload_bytes}
//                     + the message, then the method's v1 response (on OK)
// The session id (an unguessable 64-bit capability from OpenReply, or from
// the gRPC Session stream of a gRPC client) authorises the connection, whose
// peer must have the session's uid and gid; every call acts for that session
// whatever session_id its request names (another one is PERMISSION_DENIED).
//
// A connection is closed on any framing error, and one that sends no first
// frame within the daemon's deadline (1 s by default) is closed too: a
// client sends it right after connect and connects again if the connection
// ends before the reply. A reply code of RESOURCE_EXHAUSTED means the daemon
// serves as many connections as it may. Pins taken belong to the session and
// die with it.
//
// Host byte order: both ends are on one machine.
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
#include <type_traits>

namespace kvtier::fastpath {

inline constexpr uint32_t kHelloMagic = 0x4c48564bu;      // "KVHL"
inline constexpr uint32_t kRequestMagic = 0x5152564bu;    // "KVRQ"
inline constexpr uint32_t kReplyMagic = 0x5052564bu;      // "KVRP"
inline constexpr uint32_t kOpenMagic = 0x504f564bu;       // "KVOP"
inline constexpr uint32_t kControlMagic = 0x5443564bu;    // "KVCT"
inline constexpr uint32_t kCallMagic = 0x4c43564bu;       // "KVCL"
inline constexpr uint32_t kCallReplyMagic = 0x5243564bu;  // "KVCR"
inline constexpr uint32_t kVersion = 1;
inline constexpr uint32_t kFlagPin = 1;
// The largest request that can be valid: the most pages a lookup may name
// (daemon kMaxLookupPages, 1 << 20) times the longest hash (32 bytes).
inline constexpr uint32_t kMaxLookupHashes = 1u << 20;
inline constexpr uint32_t kMaxHashBytes = 32;
inline constexpr uint32_t kMaxRequestBytes = kMaxLookupHashes * kMaxHashBytes;

// The most bytes of a v1.Hello in an Open frame.
inline constexpr uint32_t kMaxOpenBytes = 64 << 10;
// The most bytes of a call's request or response (the daemon may accept
// fewer: --grpc_max_message_bytes bounds both transports).
inline constexpr uint32_t kMaxCallBytes = 256u << 20;
// The most bytes of an error message in a reply.
inline constexpr uint32_t kMaxMessageBytes = 1 << 20;

// The first frame of a call connection.
struct Hello {
  uint32_t magic = kHelloMagic;
  uint32_t version = kVersion;
  uint64_t session_id = 0;
};

// The first frame of a session connection, the same size as Hello.
struct Open {
  uint32_t magic = kOpenMagic;
  uint32_t version = kVersion;
  uint32_t hello_bytes = 0;  // Bytes of the serialized v1.Hello that follow.
  uint32_t reserved = 0;
};
static_assert(sizeof(Open) == sizeof(Hello));

// The answer to an Open: the session's id, or on error the status (code,
// ErrorReason and message_bytes of message after it).
struct OpenReply {
  uint32_t magic = kReplyMagic;
  int32_t code = 0;
  uint64_t session_id = 0;
  uint32_t reason = 0;
  uint32_t message_bytes = 0;
};

// A session connection's later frames, both ways.
enum class ControlKind : uint32_t {
  kGoodbye = 1,   // Client: a clean close; arg = 1 when nothing is held.
  kDraining = 2,  // Daemon: stopping; finish and reconnect to the next one.
};
struct Control {
  uint32_t magic = kControlMagic;
  uint32_t kind = 0;  // ControlKind.
  uint32_t arg = 0;
  uint32_t reserved = 0;
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

// The engine calls that travel as protobuf (request and response: the
// v1.<Method>Request and v1.<Method>Response messages of kvtier/v1).
enum class Method : uint32_t {
  kAttach = 1,
  kLookup = 2,
  kReserve = 3,
  kCommit = 4,
  kAbort = 5,
  kRelease = 6,
  kFence = 7,
  kDrop = 8,
  kPrefetch = 9,
};
inline constexpr uint32_t kLastMethod = 9;

// A call, the same size as Request: a call connection reads a Request-sized
// header and tells the two apart by the magic.
struct Call {
  uint32_t magic = kCallMagic;
  uint32_t method = 0;         // Method.
  uint32_t payload_bytes = 0;  // Bytes of the request that follow.
  uint32_t reserved = 0;
  uint64_t reserved2 = 0;
};

struct CallReply {
  uint32_t magic = kCallReplyMagic;
  int32_t code = 0;     // absl::StatusCode.
  uint32_t reason = 0;  // kvtier::ErrorReason of the status (on error).
  uint32_t message_bytes = 0;
  uint32_t payload_bytes = 0;  // The response's bytes (OK only).
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

static_assert(sizeof(Call) == sizeof(Request));
// The wire layout, without implicit padding, the same on both ends.
static_assert(sizeof(Hello) == 16 && sizeof(HelloReply) == 8 &&
              sizeof(Open) == 16 && sizeof(OpenReply) == 24 &&
              sizeof(Control) == 16 && sizeof(Request) == 24 &&
              sizeof(Call) == 24 && sizeof(CallReply) == 24 &&
              sizeof(Reply) == 40);
static_assert(std::is_trivially_copyable_v<Hello> &&
              std::is_trivially_copyable_v<Open> &&
              std::is_trivially_copyable_v<OpenReply> &&
              std::is_trivially_copyable_v<Control> &&
              std::is_trivially_copyable_v<Request> &&
              std::is_trivially_copyable_v<Call> &&
              std::is_trivially_copyable_v<CallReply> &&
              std::is_trivially_copyable_v<Reply>);

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
