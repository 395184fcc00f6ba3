// Tests of the engine protocol's sessions and calls (common/fast_lookup.h)
// as FastLookupServer serves them on a real unix socket: an Open opens a
// session bound to the peer, which ends with its connection (after a
// Goodbye or not); a call connection of that session runs protobuf calls,
// refuses a request naming another session, a malformed request, an
// unknown method and an oversized call with an error reply (and stays
// usable), and closes on a framing error; DrainSessions reaches the session
// connection; a malformed Open opens nothing, and an Open past the served
// cap is refused with an OpenReply. Nothing here waits on a wall-clock bound:
// waits poll a condition for at most 30 s and fail if it never holds.
//
// Thread-safety: single-threaded tests (the server runs its own threads).
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "common/error_reason.h"
#include "common/fast_lookup.h"
#include "daemon/engine_socket_test_util.h"
#include "daemon/fast_lookup_server.h"
#include "daemon/tier_core.h"
#include "gtest/gtest.h"

namespace kvtier::daemon {
namespace {

using testing::Connect;

using namespace fastpath;  // NOLINT: the protocol's own names.

// Polls `done` until it holds, for at most 30 s.
bool Eventually(const std::function<bool()>& done) {
  const auto until =
      std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!done()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

// What came back for a call.
struct CallResult {
  bool answered = false;  // False: the connection ended instead.
  CallReply reply;
  std::string message;
  std::string payload;
};

CallResult SendCall(int fd, uint32_t method, const std::string& payload) {
  CallResult r;
  Call call;
  call.method = method;
  call.payload_bytes = static_cast<uint32_t>(payload.size());
  iovec iov[2] = {{&call, sizeof(call)},
                  {const_cast<char*>(payload.data()), payload.size()}};
  if (!WriteFullV(fd, iov, 2) || !ReadFull(fd, &r.reply, sizeof(r.reply)) ||
      r.reply.magic != kCallReplyMagic) {
    return r;
  }
  r.message.resize(r.reply.message_bytes);
  r.payload.resize(r.reply.payload_bytes);
  r.answered = ReadFull(fd, r.message.data(), r.message.size()) &&
               ReadFull(fd, r.payload.data(), r.payload.size());
  return r;
}

class EngineProtocolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/dev/shm/kvtier-engine-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    TierOptions o;
    o.segments.shm_dir = dir_;
    o.segments.huge_pages = shm::HugePagePolicy::kOff;
    core_ = std::make_unique<TierCore>(o);
    path_ = dir_ + "/engine.sock";
    server_ = std::make_unique<FastLookupServer>(core_.get());
    ASSERT_TRUE(server_->Start(path_).ok());
  }
  void TearDown() override {
    server_.reset();
    core_.reset();
    std::filesystem::remove_all(dir_);
  }

  // Sends an Open with `hello_bytes` (the serialized v1.Hello, or garbage)
  // and reads the reply into *reply and *message; false: no reply.
  bool SendOpen(int fd, const std::string& hello_bytes, OpenReply* reply,
                std::string* message) {
    Open open;
    open.hello_bytes = static_cast<uint32_t>(hello_bytes.size());
    iovec iov[2] = {
        {&open, sizeof(open)},
        {const_cast<char*>(hello_bytes.data()), hello_bytes.size()}};
    if (!WriteFullV(fd, iov, 2) || !ReadFull(fd, reply, sizeof(*reply)) ||
        reply->magic != kReplyMagic) {
      return false;
    }
    message->resize(reply->message_bytes);
    return ReadFull(fd, message->data(), message->size());
  }

  // Opens a session on a new session connection; returns its fd and sets
  // *session.
  int OpenSession(uint64_t* session) {
    const int fd = Connect(path_);
    v1::Hello hello;
    hello.set_client_name("engine-test");
    OpenReply reply;
    std::string message;
    EXPECT_TRUE(SendOpen(fd, hello.SerializeAsString(), &reply, &message));
    EXPECT_EQ(reply.code, 0) << message;
    *session = reply.session_id;
    return fd;
  }

  // A call connection of `session`.
  int JoinSession(uint64_t session) {
    const int fd = Connect(path_);
    Hello hello;
    hello.session_id = session;
    iovec iov{&hello, sizeof(hello)};
    HelloReply reply;
    EXPECT_TRUE(WriteFullV(fd, &iov, 1));
    EXPECT_TRUE(ReadFull(fd, &reply, sizeof(reply)));
    EXPECT_EQ(reply.code, 0);
    return fd;
  }

  std::string dir_;
  std::string path_;
  std::unique_ptr<TierCore> core_;
  std::unique_ptr<FastLookupServer> server_;
};

TEST_F(EngineProtocolTest, OpenOpensASessionThatEndsWithItsConnection) {
  uint64_t session = 0;
  const int fd = OpenSession(&session);
  ASSERT_NE(session, 0u);
  EXPECT_TRUE(core_->SessionOpen(session));
  EXPECT_EQ(core_->session_count(), 1u);
  // Bound to this process at once: a call connection of ours joins it.
  const int calls = JoinSession(session);
  ::close(calls);
  // A Goodbye, then the end of the connection, closes the session.
  Control bye{.kind = static_cast<uint32_t>(ControlKind::kGoodbye), .arg = 1};
  iovec iov{&bye, sizeof(bye)};
  ASSERT_TRUE(WriteFullV(fd, &iov, 1));
  ::close(fd);
  EXPECT_TRUE(Eventually([&] { return !core_->SessionOpen(session); }));

  // Without a Goodbye too (the engine was killed).
  const int other = OpenSession(&session);
  ASSERT_TRUE(core_->SessionOpen(session));
  ::close(other);
  EXPECT_TRUE(Eventually([&] { return core_->session_count() == 0; }));
}

TEST_F(EngineProtocolTest, CallsRunForTheConnectionsSessionOnly) {
  uint64_t session = 0;
  const int sfd = OpenSession(&session);
  const int fd = JoinSession(session);

  // An empty fence report is answered with a (parseable) response.
  v1::FenceRequest fence;
  fence.set_api_version(1);
  fence.set_report_complete(true);
  CallResult ok = SendCall(fd, static_cast<uint32_t>(Method::kFence),
                           fence.SerializeAsString());
  ASSERT_TRUE(ok.answered);
  EXPECT_EQ(ok.reply.code, 0) << ok.message;
  v1::FenceResponse fence_resp;
  EXPECT_TRUE(fence_resp.ParseFromString(ok.payload));

  // A daemon error keeps its code and ErrorReason: a Lookup in a namespace
  // that does not exist.
  v1::LookupRequest lookup;
  lookup.set_namespace_id(424242);
  lookup.set_hashes(std::string(32, 'h'));
  CallResult missing = SendCall(fd, static_cast<uint32_t>(Method::kLookup),
                                lookup.SerializeAsString());
  ASSERT_TRUE(missing.answered);
  EXPECT_EQ(missing.reply.code, static_cast<int>(absl::StatusCode::kNotFound))
      << missing.message;
  EXPECT_EQ(missing.reply.reason,
            static_cast<uint32_t>(ErrorReason::kNamespaceUnknown));
  EXPECT_TRUE(missing.payload.empty());

  // Naming another session is refused, whatever that session is.
  fence.set_session_id(session + 1);
  CallResult stolen = SendCall(fd, static_cast<uint32_t>(Method::kFence),
                               fence.SerializeAsString());
  ASSERT_TRUE(stolen.answered);
  EXPECT_EQ(stolen.reply.code,
            static_cast<int>(absl::StatusCode::kPermissionDenied));

  // A malformed request and an unknown method are errors, not closes.
  CallResult garbage =
      SendCall(fd, static_cast<uint32_t>(Method::kCommit), "\xff\xff\xff");
  ASSERT_TRUE(garbage.answered);
  EXPECT_EQ(garbage.reply.code,
            static_cast<int>(absl::StatusCode::kInvalidArgument));
  CallResult unknown = SendCall(fd, kLastMethod + 1, "");
  ASSERT_TRUE(unknown.answered);
  EXPECT_EQ(unknown.reply.code,
            static_cast<int>(absl::StatusCode::kUnimplemented));
  // Still usable.
  fence.set_session_id(session);
  ok = SendCall(fd, static_cast<uint32_t>(Method::kFence),
                fence.SerializeAsString());
  ASSERT_TRUE(ok.answered);
  EXPECT_EQ(ok.reply.code, 0) << ok.message;

  // A call larger than the limit is read, dropped and refused with an
  // answer; the connection stays usable.
  const std::string huge(FastLookupOptions().max_call_bytes + 1, 'x');
  CallResult refused =
      SendCall(fd, static_cast<uint32_t>(Method::kCommit), huge);
  ASSERT_TRUE(refused.answered);
  EXPECT_EQ(refused.reply.code,
            static_cast<int>(absl::StatusCode::kResourceExhausted))
      << refused.message;
  ok = SendCall(fd, static_cast<uint32_t>(Method::kFence),
                fence.SerializeAsString());
  ASSERT_TRUE(ok.answered);
  EXPECT_EQ(ok.reply.code, 0) << ok.message;

  // Reserved fields must be zero: anything else is a framing error.
  Call odd;
  odd.method = static_cast<uint32_t>(Method::kFence);
  odd.reserved = 1;
  iovec iov{&odd, sizeof(odd)};
  ASSERT_TRUE(WriteFullV(fd, &iov, 1));
  char c;
  EXPECT_LE(::recv(fd, &c, 1, 0), 0);
  ::close(fd);
  ::close(sfd);
}

TEST_F(EngineProtocolTest, DrainSessionsReachesTheSessionConnection) {
  uint64_t session = 0;
  const int fd = OpenSession(&session);
  // The session connection is registered once its reply is written.
  Control got;
  bool drained = false;
  ASSERT_TRUE(Eventually([&] {
    server_->DrainSessions();
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 20) != 1) return false;
    drained = ReadFull(fd, &got, sizeof(got));
    return true;
  }));
  ASSERT_TRUE(drained);
  EXPECT_EQ(got.magic, kControlMagic);
  EXPECT_EQ(got.kind, static_cast<uint32_t>(ControlKind::kDraining));
  ::close(fd);
}

TEST_F(EngineProtocolTest, MalformedOpenOpensNothing) {
  OpenReply reply;
  std::string message;
  const int fd = Connect(path_);
  ASSERT_TRUE(SendOpen(fd, "\xff\xff\xff\xff", &reply, &message));
  EXPECT_EQ(reply.code, static_cast<int>(absl::StatusCode::kInvalidArgument))
      << message;
  EXPECT_EQ(reply.session_id, 0u);
  ::close(fd);

  // Too long a Hello is refused before it is read.
  const int big = Connect(path_);
  Open open;
  open.hello_bytes = kMaxOpenBytes + 1;
  iovec iov{&open, sizeof(open)};
  ASSERT_TRUE(WriteFullV(big, &iov, 1));
  ASSERT_TRUE(ReadFull(big, &reply, sizeof(reply)));
  EXPECT_EQ(reply.code, static_cast<int>(absl::StatusCode::kInvalidArgument));
  ::close(big);

  // A Hello the core refuses (a client name over 256 bytes).
  v1::Hello hello;
  hello.set_client_name(std::string(300, 'n'));
  const int named = Connect(path_);
  ASSERT_TRUE(SendOpen(named, hello.SerializeAsString(), &reply, &message));
  EXPECT_EQ(reply.code, static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_NE(message.find("client_name"), std::string::npos) << message;
  ::close(named);
  EXPECT_EQ(core_->session_count(), 0u);
}

TEST_F(EngineProtocolTest, OpenPastTheServedCapGetsAnOpenReply) {
  server_.reset();
  FastLookupOptions o;
  o.max_connections = 1;
  server_ = std::make_unique<FastLookupServer>(core_.get(), o);
  ASSERT_TRUE(server_->Start(path_).ok());
  uint64_t session = 0;
  const int first = OpenSession(&session);
  ASSERT_NE(session, 0u);
  v1::Hello hello;
  OpenReply reply;
  std::string message;
  const int second = Connect(path_);
  ASSERT_TRUE(SendOpen(second, hello.SerializeAsString(), &reply, &message));
  EXPECT_EQ(reply.code, static_cast<int>(absl::StatusCode::kResourceExhausted));
  EXPECT_EQ(reply.session_id, 0u);
  ::close(second);
  ::close(first);
}

}  // namespace
}  // namespace kvtier::daemon
