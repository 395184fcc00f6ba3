// FastLookupServer's serving threads (daemon/fast_lookup_server.h): a
// session connection's open, control frames and close; a call connection's
// lookups and calls. One thread per served connection, blocked in read()
// until a frame starts (a call connection at most its idle timeout), then
// reading the frame by its deadline.
//
// Thread-safety: each serving thread owns its fd; what they share with the
// acceptor and Stop is under mu_.
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/error_reason.h"
#include "daemon/engine_calls.h"
#include "daemon/fast_lookup_server.h"
#include "daemon/metrics.h"
#include "daemon/peer_credentials.h"
#include "spdlog/spdlog.h"

namespace kvtier::daemon {
namespace {

using namespace fastpath;  // NOLINT: the protocol's own names.

// A payload buffer grows from this as bytes arrive, doubling.
constexpr size_t kFirstChunk = 64 << 10;
// Buffers above this are given back once their request is answered.
constexpr size_t kKeepBytes = 1 << 20;
// How long a reply may wait for room in the peer's socket buffer.
constexpr absl::Duration kSendTimeout = absl::Seconds(10);

// Fills the error fields shared by the replies: code, reason and the message
// (cut at kMaxMessageBytes) in *message.
template <typename R>
void SetError(const absl::Status& s, R* reply, std::string* message) {
  reply->code = static_cast<int>(s.code());
  reply->reason = static_cast<uint32_t>(GetErrorReason(s));
  *message = std::string(s.message().substr(0, kMaxMessageBytes));
  reply->message_bytes = static_cast<uint32_t>(message->size());
}

// RESOURCE_EXHAUSTED for a `what` of `bytes` bytes: over `limit`, or (when
// `fits`) over what the daemon holds for all connections at once.
absl::Status TooLarge(const char* what, uint32_t bytes, uint32_t limit,
                      bool fits) {
  return absl::ResourceExhaustedError(
      fits ? absl::StrCat(what, ": ", bytes,
                          " bytes do not fit in what kvtierd holds for "
                          "requests in flight now; retry")
           : absl::StrCat(what, ": ", bytes, " bytes, more than the ", limit,
                          " this kvtierd accepts"));
}

using Clock = std::chrono::steady_clock;

// Waits until `fd` is readable (or hung up) or `end` passes; false with
// errno ETIMEDOUT at `end`, or poll's errno.
bool WaitReadable(int fd, Clock::time_point end) {
  for (;;) {
    const Clock::time_point now = Clock::now();
    if (now >= end) {
      errno = ETIMEDOUT;
      return false;
    }
    // Rounded up: waking early would only loop.
    const auto ms =
        std::chrono::ceil<std::chrono::milliseconds>(end - now).count();
    pollfd p{fd, POLLIN, 0};
    const int r = ::poll(&p, 1,
                         static_cast<int>(std::min<int64_t>(
                             ms, std::numeric_limits<int>::max())));
    if (r > 0) return true;
    if (r < 0 && errno != EINTR) return false;
  }
}

// Reads exactly `n` bytes into `p` by `end`: what has arrived at once, then
// waiting for the rest. False when the peer left (errno 0), the connection
// broke, or `end` passed (errno ETIMEDOUT).
bool ReadFullBy(int fd, void* p, size_t n, Clock::time_point end) {
  char* out = static_cast<char*>(p);
  while (n > 0) {
    const ssize_t r = ::recv(fd, out, n, MSG_DONTWAIT);
    if (r > 0) {
      out += r;
      n -= static_cast<size_t>(r);
      continue;
    }
    if (r == 0) {
      errno = 0;
      return false;
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return false;
    if (!WaitReadable(fd, end)) return false;
  }
  return true;
}

// Counts the close of a connection whose frame missed its end (errno
// ETIMEDOUT after a failed read); nothing for a peer that left.
void CountIfLate() {
  if (errno == ETIMEDOUT) CountFastLookupClose(FastLookupClose::kFrameDeadline);
}

}  // namespace

bool FastLookupServer::ReadHeader(int fd, void* header, size_t bytes,
                                  Clock::time_point* frame_end) const {
  char* out = static_cast<char*>(header);
  ssize_t r;
  do {
    // Blocks for the frame's first bytes, within SO_RCVTIMEO if set.
    r = ::recv(fd, out, bytes, 0);
  } while (r < 0 && errno == EINTR);
  if (r <= 0) {
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      CountFastLookupClose(FastLookupClose::kIdle);
    }
    return false;
  }
  *frame_end =
      Clock::now() + absl::ToChronoNanoseconds(options_.frame_deadline);
  const size_t got = static_cast<size_t>(r);
  if (got < bytes && !ReadFullBy(fd, out + got, bytes - got, *frame_end)) {
    CountIfLate();
    return false;
  }
  return true;
}

bool FastLookupServer::TakePayload(int fd, uint32_t bytes, uint32_t limit,
                                   bool fits, Clock::time_point end,
                                   const char* what, std::string* payload,
                                   absl::Status* refused) {
  *refused = absl::OkStatus();
  bool ok;
  if (bytes <= limit && fits) {
    ok = ReadPayload(fd, bytes, end, payload);
  } else {
    // Refused with an answer, the connection kept: the bytes are read and
    // dropped, never held.
    *refused = TooLarge(what, bytes, limit, bytes <= limit);
    ok = Discard(fd, bytes, end);
  }
  if (!ok) CountIfLate();
  return ok;
}

bool FastLookupServer::Discard(int fd, uint32_t bytes, Clock::time_point end) {
  char sink[64 << 10];
  while (bytes > 0) {
    const uint32_t n = std::min<uint32_t>(bytes, sizeof(sink));
    if (!ReadFullBy(fd, sink, n, end)) return false;
    bytes -= n;
  }
  return true;
}

FastLookupServer::PayloadBudget::PayloadBudget(FastLookupServer* server,
                                               uint64_t bytes)
    : server_(server), bytes_(bytes) {
  const uint64_t before = server_->inflight_bytes_.fetch_add(bytes_);
  if (before + bytes_ > server_->options_.max_inflight_bytes) {
    server_->inflight_bytes_.fetch_sub(bytes_);
    bytes_ = 0;
    ok_ = false;
  }
}

FastLookupServer::PayloadBudget::~PayloadBudget() {
  server_->inflight_bytes_.fetch_sub(bytes_);
}

bool FastLookupServer::ReadPayload(int fd, uint32_t bytes,
                                   Clock::time_point end, std::string* buf) {
  buf->clear();
  while (buf->size() < bytes) {
    const size_t have = buf->size();
    const size_t chunk =
        std::min<size_t>(bytes - have, std::max(kFirstChunk, have));
    buf->resize(have + chunk);
    if (!ReadFullBy(fd, buf->data() + have, chunk, end)) return false;
  }
  return true;
}

void FastLookupServer::Serve(uint64_t id, int fd, uid_t uid, Hello first,
                             Clock::time_point first_end) {
  // A peer that stops reading its replies loses the connection rather than
  // holding this thread (and what its last request pinned).
  const timeval send_limit = absl::ToTimeval(kSendTimeout);
  (void)::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &send_limit,
                     sizeof(send_limit));
  if (first.magic == kOpenMagic) {
    Open open;
    std::memcpy(static_cast<void*>(&open), &first, sizeof(open));
    ServeSession(fd, uid, open, first_end);
  } else {
    ServeCalls(fd, uid, first);
  }
  {
    // Forget the fd before closing it, so Stop never shuts down a number
    // the kernel has handed to someone else.
    absl::MutexLock lock(&mu_);
    connections_.erase(fd);
    sessions_.erase(fd);
    if (--served_per_uid_[uid] <= 0) served_per_uid_.erase(uid);
    finished_.push_back(id);
  }
  AddFastLookupConnections(0, -1);
  ::close(fd);
}

void FastLookupServer::ServeSession(int fd, uid_t uid, const Open& open,
                                    Clock::time_point open_end) {
  OpenReply reply;
  std::string message;
  uint64_t session = 0;
  {
    std::string bytes;
    v1::Hello hello;
    absl::Status s;
    if (open.reserved != 0) {
      return;  // A framing error: the connection is closed.
    }
    if (open.hello_bytes > kMaxOpenBytes) {
      s = absl::InvalidArgumentError(absl::StrCat(
          "open: hello_bytes ", open.hello_bytes, " > ", kMaxOpenBytes));
    } else if (!ReadPayload(fd, open.hello_bytes, open_end, &bytes)) {
      // The peer left, or the first frame was not whole by its deadline.
      if (errno == ETIMEDOUT) {
        CountFastLookupClose(FastLookupClose::kHelloDeadline);
      }
      return;
    } else if (!hello.ParseFromString(bytes)) {
      s = absl::InvalidArgumentError("open: not a well-formed kvtier.v1.Hello");
    } else {
      // Refused before a session is opened at all, in the common case.
      s = uid_sessions_.CheckRoom(uid);
    }
    // The kernel's record of this peer is the session's identity
    // (daemon/peer_credentials.h) from the start, as if a call connection's
    // Hello had bound it at once.
    absl::StatusOr<PeerInfo> peer =
        s.ok() ? ReadPeerCredentials(fd) : absl::StatusOr<PeerInfo>(s);
    if (!peer.ok()) {
      s = peer.status();
    } else {
      PeerInfo said;
      said.pid = peer->pid;
      absl::StatusOr<uint64_t> id = core_->OpenSession(hello, said);
      if (id.ok()) {
        // Counted against the uid before its credentials make it usable.
        absl::StatusOr<bool> admitted = uid_sessions_.Admit(uid, *id);
        s = admitted.ok() ? core_->BindPeerCredentials(*id, *peer)
                          : admitted.status();
        if (s.ok()) {
          session = *id;
        } else {
          if (admitted.ok()) uid_sessions_.Release(uid, *id);
          core_->CloseSession(*id);
        }
      } else {
        s = id.status();
      }
    }
    if (s.ok()) {
      reply.session_id = session;
    } else {
      SetError(s, &reply, &message);
    }
  }
  iovec iov[2] = {{&reply, sizeof(reply)}, {message.data(), message.size()}};
  const bool sent = WriteFullV(fd, iov, 2);
  if (session == 0) return;
  if (sent) {
    absl::MutexLock lock(&mu_);
    if (!stopping_) sessions_.insert(fd);
  }
  // The session lives as long as its connection, however quiet (no receive
  // timeout); a Goodbye may come first.
  Control c;
  Clock::time_point frame_end;
  while (sent && ReadHeader(fd, &c, sizeof(c), &frame_end) &&
         c.magic == kControlMagic) {
    if (c.kind == static_cast<uint32_t>(ControlKind::kGoodbye)) {
      core_->SessionGoodbye(session, c.arg != 0);
    }
  }
  {
    absl::MutexLock lock(&mu_);
    sessions_.erase(fd);
  }
  core_->CloseSession(session);
  uid_sessions_.Release(uid, session);
}

void FastLookupServer::ServeCalls(int fd, uid_t uid, const Hello& hello) {
  HelloReply hello_reply;
  {
    // The kernel's record of this peer must match the session's identity
    // (daemon/peer_credentials.h); an unknown session is NOT_FOUND. A
    // session opened over gRPC counts against the uid that binds it here
    // (one opened on this socket, or bound already, counts once).
    auto peer = ReadPeerCredentials(fd);
    absl::StatusOr<bool> admitted =
        peer.ok() ? uid_sessions_.Admit(uid, hello.session_id)
                  : absl::StatusOr<bool>(peer.status());
    absl::Status bound =
        admitted.ok() ? core_->BindPeerCredentials(hello.session_id, *peer)
                      : admitted.status();
    if (!bound.ok() && admitted.ok() && *admitted) {
      uid_sessions_.Release(uid, hello.session_id);
    }
    hello_reply.code = static_cast<int>(bound.code());
  }
  iovec hello_iov{&hello_reply, sizeof(hello_reply)};
  bool ok = WriteFullV(fd, &hello_iov, 1) && hello_reply.code == 0;
  // Between requests a read waits at most the idle timeout.
  if (ok && options_.idle_timeout != absl::InfiniteDuration()) {
    const timeval idle =
        absl::ToTimeval(std::max(options_.idle_timeout, absl::Milliseconds(1)));
    ok = ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &idle, sizeof(idle)) == 0;
  }
  std::string payload;
  std::string response;
  TierCore::LookupOutcome out;
  while (ok) {
    Request req;
    Clock::time_point frame_end;
    if (!ReadHeader(fd, &req, sizeof(req), &frame_end)) break;
    std::string message;
    if (req.magic == kCallMagic) {
      Call call;
      std::memcpy(static_cast<void*>(&call), &req, sizeof(call));
      if (call.reserved != 0 || call.reserved2 != 0) break;  // Framing.
      CallReply reply;
      absl::Status s;
      {
        PayloadBudget budget(this, call.payload_bytes);
        if (!TakePayload(fd, call.payload_bytes, options_.max_call_bytes,
                         budget.ok(), frame_end, "call", &payload, &s)) {
          break;
        }
        if (s.ok()) {
          s = RunEngineCall(core_, hello.session_id, call.method, payload,
                            &response);
        }
      }
      if (s.ok() && response.size() > options_.max_call_bytes) {
        s = absl::ResourceExhaustedError(absl::StrCat(
            "call: the response (", response.size(), " bytes) is larger than ",
            options_.max_call_bytes, " bytes (--grpc_max_message_bytes)"));
      }
      if (s.ok()) {
        reply.payload_bytes = static_cast<uint32_t>(response.size());
      } else {
        SetError(s, &reply, &message);
        response.clear();
      }
      iovec iov[3] = {{&reply, sizeof(reply)},
                      {message.data(), message.size()},
                      {response.data(), response.size()}};
      ok = WriteFullV(fd, iov, 3);
    } else if (req.magic == kRequestMagic) {
      PayloadBudget budget(this, req.hash_bytes);
      absl::Status s;
      if (!TakePayload(fd, req.hash_bytes, options_.max_request_bytes,
                       budget.ok(), frame_end, "lookup", &payload, &s)) {
        break;
      }
      if (s.ok()) {
        OpTimer timer(TimedOp::kLookup, Transport::kEngine);
        s = core_->LookupHashes(hello.session_id, req.namespace_id, payload,
                                (req.flags & kFlagPin) != 0, &out);
        timer.Done(s.ok());
      }
      Reply reply;
      iovec iov[2];
      iov[0] = {&reply, sizeof(reply)};
      if (s.ok()) {
        reply.matched_pages = out.matched_pages;
        reply.usable_pages = out.usable_pages;
        reply.has_snapshot = out.has_snapshot;
        reply.snapshot_row = out.snapshot_row;
        reply.lease_id = out.lease_id;
        iov[1] = {out.rows.data(), out.rows.size() * sizeof(uint32_t)};
      } else {
        SetError(s, &reply, &message);
        iov[1] = {message.data(), message.size()};
      }
      ok = WriteFullV(fd, iov, 2);
    } else {
      break;  // A framing error: the connection is closed.
    }
    // Memory per connection stays small between requests.
    if (payload.capacity() > kKeepBytes) std::string().swap(payload);
    if (response.capacity() > kKeepBytes) std::string().swap(response);
    if (out.rows.capacity() * sizeof(uint32_t) > kKeepBytes) {
      std::vector<uint32_t>().swap(out.rows);
    }
  }
}

}  // namespace kvtier::daemon
