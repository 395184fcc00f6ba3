// Tests of FastLookupServer against real unix sockets: a connection that
// sends no Hello is closed at the deadline, a uid at its pending cap loses
// its oldest pending connection, a Hello (even in pieces) is served and
// binds, the served cap refuses with RESOURCE_EXHAUSTED, an oversized
// request is answered RESOURCE_EXHAUSTED and malformed Hellos close the
// connection. Delays are printed, never
// asserted.
//
// Thread-safety: single-threaded tests (the server runs its own threads).
#include "daemon/fast_lookup_server.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>

#include "common/fast_lookup.h"
#include "daemon/engine_socket_test_util.h"
#include "daemon/metrics.h"
#include "daemon/tier_core.h"
#include "gtest/gtest.h"

namespace kvtier::daemon {
namespace {

using testing::Connect;
using testing::WaitClosed;

using Clock = std::chrono::steady_clock;

// True when `fd` is neither readable nor hung up right now.
bool StillOpen(int fd) {
  pollfd p{fd, POLLIN | POLLRDHUP, 0};
  return ::poll(&p, 1, 0) == 0;
}

// Sends Hello{session} and returns the reply's code (-1: no reply).
int Hello(int fd, uint64_t session) {
  fastpath::Hello hello;
  hello.session_id = session;
  iovec iov{&hello, sizeof(hello)};
  fastpath::HelloReply reply;
  if (!fastpath::WriteFullV(fd, &iov, 1) ||
      !fastpath::ReadFull(fd, &reply, sizeof(reply)) ||
      reply.magic != fastpath::kReplyMagic) {
    return -1;
  }
  return reply.code;
}

class FastLookupServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/dev/shm/kvtier-fast-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    TierOptions o;
    o.segments.shm_dir = dir_;
    o.segments.huge_pages = shm::HugePagePolicy::kOff;
    core_ = std::make_unique<TierCore>(o);
    path_ = dir_ + "/lookup.sock";
  }
  void TearDown() override {
    server_.reset();
    core_.reset();
    std::filesystem::remove_all(dir_);
  }

  void StartServer(const FastLookupOptions& options) {
    server_ = std::make_unique<FastLookupServer>(core_.get(), options);
    ASSERT_TRUE(server_->Start(path_).ok());
  }

  uint64_t OpenSession() {
    v1::Hello hello;
    hello.set_client_name("fast-test");
    auto id = core_->OpenSession(hello, PeerInfo{});
    EXPECT_TRUE(id.ok()) << id.status();
    return id.ok() ? *id : 0;
  }

  std::string dir_;
  std::string path_;
  std::unique_ptr<TierCore> core_;
  std::unique_ptr<FastLookupServer> server_;
};

TEST_F(FastLookupServerTest, SilentConnectionIsClosedAtTheHelloDeadline) {
  FastLookupOptions o;
  o.hello_deadline = absl::Milliseconds(200);
  StartServer(o);
  const uint64_t before = FastLookupClosed(FastLookupClose::kHelloDeadline);
  const Clock::time_point start = Clock::now();
  const int fd = Connect(path_);
  ASSERT_GE(fd, 0);
  EXPECT_TRUE(WaitClosed(fd));
  const double ms =
      std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  std::printf("silent connection closed after %.1f ms (deadline 200 ms)\n", ms);
  RecordProperty("closed_after_ms", std::to_string(ms));
  EXPECT_EQ(FastLookupClosed(FastLookupClose::kHelloDeadline), before + 1);
  EXPECT_EQ(server_->served_connections(), 0);
  ::close(fd);
}

TEST_F(FastLookupServerTest, UidAtItsPendingCapLosesItsOldest) {
  FastLookupOptions o;
  o.hello_deadline = absl::Seconds(60);  // Only the cap closes here.
  o.max_pending_per_uid = 3;
  StartServer(o);
  const uint64_t before = FastLookupClosed(FastLookupClose::kUidCap);
  int fds[5];
  for (int i = 0; i < 4; ++i) {
    fds[i] = Connect(path_);
    ASSERT_GE(fds[i], 0);
  }
  // The fourth made room by closing the first; the others wait on.
  EXPECT_TRUE(WaitClosed(fds[0]));
  EXPECT_TRUE(StillOpen(fds[1]));
  EXPECT_TRUE(StillOpen(fds[2]));
  EXPECT_TRUE(StillOpen(fds[3]));
  fds[4] = Connect(path_);
  ASSERT_GE(fds[4], 0);
  EXPECT_TRUE(WaitClosed(fds[1]));
  EXPECT_TRUE(StillOpen(fds[2]));
  EXPECT_EQ(FastLookupClosed(FastLookupClose::kUidCap), before + 2);
  // A pending connection that sends its Hello is served whatever the flood.
  EXPECT_EQ(Hello(fds[4], OpenSession()), 0);
  EXPECT_EQ(server_->served_connections(), 1);
  for (int fd : fds) ::close(fd);
}

TEST_F(FastLookupServerTest, HelloInPiecesIsServedAndBindsTheSession) {
  StartServer(FastLookupOptions());
  const uint64_t session = OpenSession();
  const int fd = Connect(path_);
  ASSERT_GE(fd, 0);
  fastpath::Hello hello;
  hello.session_id = session;
  const char* bytes = reinterpret_cast<const char*>(&hello);
  ASSERT_EQ(::send(fd, bytes, 5, MSG_NOSIGNAL), 5);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_EQ(::send(fd, bytes + 5, sizeof(hello) - 5, MSG_NOSIGNAL),
            static_cast<ssize_t>(sizeof(hello) - 5));
  fastpath::HelloReply reply;
  ASSERT_TRUE(fastpath::ReadFull(fd, &reply, sizeof(reply)));
  EXPECT_EQ(reply.code, 0);
  // Bound: a second binding by the same uid is accepted, the session is
  // known to be this process's.
  const int again = Connect(path_);
  EXPECT_EQ(Hello(again, session), 0);
  ::close(again);
  // A request is answered (no such namespace: an error reply).
  fastpath::Request req;
  req.namespace_id = 12345;
  req.hash_bytes = 32;
  std::string hashes(32, 'h');
  iovec iov[2] = {{&req, sizeof(req)}, {hashes.data(), hashes.size()}};
  ASSERT_TRUE(fastpath::WriteFullV(fd, iov, 2));
  fastpath::Reply r;
  ASSERT_TRUE(fastpath::ReadFull(fd, &r, sizeof(r)));
  EXPECT_NE(r.code, 0);
  std::string message(r.message_bytes, '\0');
  ASSERT_TRUE(fastpath::ReadFull(fd, message.data(), message.size()));
  EXPECT_FALSE(message.empty());
  ::close(fd);

  // An unknown session is NOT_FOUND, and the connection ends.
  const int stranger = Connect(path_);
  EXPECT_EQ(Hello(stranger, session + 1),
            static_cast<int>(absl::StatusCode::kNotFound));
  EXPECT_TRUE(WaitClosed(stranger));
  ::close(stranger);
}

TEST_F(FastLookupServerTest, ServedCapRefusesWithResourceExhausted) {
  FastLookupOptions o;
  o.max_connections = 1;
  StartServer(o);
  const uint64_t before = FastLookupClosed(FastLookupClose::kServedCap);
  const int first = Connect(path_);
  ASSERT_EQ(Hello(first, OpenSession()), 0);
  const int second = Connect(path_);
  EXPECT_EQ(Hello(second, OpenSession()),
            static_cast<int>(absl::StatusCode::kResourceExhausted));
  EXPECT_TRUE(WaitClosed(second));
  EXPECT_EQ(FastLookupClosed(FastLookupClose::kServedCap), before + 1);
  ::close(second);
  ::close(first);
  // Once the first is gone there is room again.
  for (int i = 0; i < 3000 && server_->served_connections() > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const int third = Connect(path_);
  EXPECT_EQ(Hello(third, OpenSession()), 0);
  ::close(third);
}

TEST_F(FastLookupServerTest, OversizedRequestIsRefusedBadHelloCloses) {
  FastLookupOptions o;
  o.max_request_bytes = 1024;
  StartServer(o);
  const int fd = Connect(path_);
  ASSERT_EQ(Hello(fd, OpenSession()), 0);
  // Read, dropped and answered RESOURCE_EXHAUSTED; the connection stays.
  for (int round = 0; round < 2; ++round) {
    fastpath::Request req;
    req.hash_bytes = 1025;
    std::string hashes(req.hash_bytes, 'h');
    iovec iov[2] = {{&req, sizeof(req)}, {hashes.data(), hashes.size()}};
    ASSERT_TRUE(fastpath::WriteFullV(fd, iov, 2));
    fastpath::Reply r;
    ASSERT_TRUE(fastpath::ReadFull(fd, &r, sizeof(r)));
    EXPECT_EQ(r.code, static_cast<int>(absl::StatusCode::kResourceExhausted));
    std::string message(r.message_bytes, '\0');
    ASSERT_TRUE(fastpath::ReadFull(fd, message.data(), message.size()));
    EXPECT_NE(message.find("1024"), std::string::npos) << message;
  }
  EXPECT_TRUE(StillOpen(fd));
  ::close(fd);

  const uint64_t before = FastLookupClosed(FastLookupClose::kBadHello);
  const int bad = Connect(path_);
  fastpath::Hello hello;
  hello.magic = 0x12345678;
  iovec hiov{&hello, sizeof(hello)};
  ASSERT_TRUE(fastpath::WriteFullV(bad, &hiov, 1));
  EXPECT_TRUE(WaitClosed(bad));
  EXPECT_EQ(FastLookupClosed(FastLookupClose::kBadHello), before + 1);
  ::close(bad);
}

TEST_F(FastLookupServerTest, StopClosesPendingAndServedConnections) {
  StartServer(FastLookupOptions());
  const int served = Connect(path_);
  ASSERT_EQ(Hello(served, OpenSession()), 0);
  const int pending = Connect(path_);
  ASSERT_GE(pending, 0);
  server_->Stop();
  EXPECT_TRUE(WaitClosed(served));
  EXPECT_TRUE(WaitClosed(pending));
  EXPECT_FALSE(std::filesystem::exists(path_));
  ::close(served);
  ::close(pending);
}

}  // namespace
}  // namespace kvtier::daemon
