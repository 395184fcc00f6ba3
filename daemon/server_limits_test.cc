// Tests of the server limits: RaiseFileLimit lifts a lowered soft limit to
// the hard one, and a gRPC server built with ApplyServerLimits refuses a
// message above the cap and closes a connection that never speaks HTTP/2
// at the handshake deadline (the delay is printed, not asserted).
//
// Thread-safety: single-threaded tests (gRPC runs its own threads).
#include "daemon/server_limits.h"

#include <sys/resource.h>
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

#include "grpcpp/create_channel.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "kvtier/v1/tier.grpc.pb.h"

namespace kvtier::daemon {
namespace {

TEST(RaiseFileLimitTest, RaisesTheSoftLimitToTheHardOne) {
  rlimit saved{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &saved), 0);
  if (saved.rlim_max != RLIM_INFINITY && saved.rlim_max <= 256) {
    GTEST_SKIP() << "hard limit " << saved.rlim_max << " leaves no room";
  }
  rlimit low = saved;
  low.rlim_cur = 256;
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &low), 0);
  auto limit = RaiseFileLimit();
  ASSERT_TRUE(limit.ok()) << limit.status();
  EXPECT_EQ(limit->before, 256u);
  EXPECT_EQ(limit->hard, saved.rlim_max);
  EXPECT_GT(limit->after, 256u);
  if (saved.rlim_max != RLIM_INFINITY) {
    EXPECT_EQ(limit->after, saved.rlim_max);
  }
  rlimit now{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &now), 0);
  EXPECT_EQ(now.rlim_cur, limit->after);
  // Already there: nothing changes.
  auto again = RaiseFileLimit();
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->before, again->after);
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &saved), 0);
}

class ServerLimitsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kvtier-limits-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    socket_ = dir_ + "/grpc.sock";
  }
  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown();
    server_.reset();
    std::filesystem::remove_all(dir_);
  }

  // Starts a server of the tier's service (every method UNIMPLEMENTED)
  // with `limits`.
  void StartServer(const ServerLimits& limits) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("unix:" + socket_,
                             grpc::InsecureServerCredentials());
    builder.RegisterService(&service_);
    ApplyServerLimits(&builder, limits);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
  }

  std::string dir_;
  std::string socket_;
  v1::TierService::CallbackService service_;
  std::unique_ptr<grpc::Server> server_;
};

TEST_F(ServerLimitsTest, MessagesAboveTheCapAreRefused) {
  ServerLimits limits;
  limits.max_message_bytes = 1 << 20;
  StartServer(limits);
  grpc::ChannelArguments args;
  args.SetMaxSendMessageSize(-1);
  auto stub = v1::TierService::NewStub(grpc::CreateCustomChannel(
      "unix:" + socket_, grpc::InsecureChannelCredentials(), args));
  for (const auto& [bytes, code] :
       {std::pair<size_t, grpc::StatusCode>{1024, grpc::UNIMPLEMENTED},
        {2 << 20, grpc::RESOURCE_EXHAUSTED}}) {
    v1::LookupRequest req;
    req.set_hashes(std::string(bytes, 'h'));
    v1::LookupResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(30));
    EXPECT_EQ(stub->Lookup(&ctx, req, &resp).error_code(), code) << bytes;
  }
}

TEST_F(ServerLimitsTest, SilentConnectionIsClosedAtTheHandshakeDeadline) {
  ServerLimits limits;
  limits.handshake_timeout = absl::Milliseconds(300);
  StartServer(limits);
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, socket_.c_str(), socket_.size() + 1);
  const timeval tv{30, 0};  // gRPC's own default would be 120 s.
  ASSERT_EQ(setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)), 0);
  const auto start = std::chrono::steady_clock::now();
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  // The server speaks first (its SETTINGS); then it closes. EOF or reset
  // means closed; EAGAIN means it was still open after 30 s.
  char buf[4096];
  ssize_t r;
  while ((r = recv(fd, buf, sizeof(buf), 0)) > 0) {
  }
  const int err = errno;
  const double ms = std::chrono::duration<double, std::milli>(
                        std::chrono::steady_clock::now() - start)
                        .count();
  std::printf("silent gRPC connection closed after %.1f ms (deadline 300)\n",
              ms);
  RecordProperty("closed_after_ms", std::to_string(ms));
  EXPECT_TRUE(r == 0 || err == ECONNRESET) << strerror(err);
  close(fd);
}

}  // namespace
}  // namespace kvtier::daemon
