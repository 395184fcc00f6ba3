// kvtierd's gRPC socket behind its gate, against a real kvtierd (issue 27,
// item 5): a uid holding --grpc_max_connections_per_uid connections has its
// next one closed at accept, before the server says a byte (before, gRPC
// took every connection of any uid); a connection that carries no call is
// closed after --grpc_max_connection_idle_s, one that never sends the HTTP/2
// preface after --grpc_handshake_timeout_ms, and either frees its place
// under the cap; calls work throughout.
//
// The flags are small; each wait is a bounded loop of 100 ms polls that
// fails when the daemon never closes the connection. No duration is
// asserted.
//
// Thread-safety: single-threaded test (gRPC runs its own threads).
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "kvtier/v1/tier.grpc.pb.h"
#include "tests/daemon_process.h"
#include "tests/raw_sockets.h"

namespace kvtier::testing {
namespace {

constexpr int kPerUid = 4;
constexpr int kPolls = 600;

// How a connection the daemon ended went: closed before the server sent a
// byte (refused at accept), or after (served, then closed); open after
// `polls` polls.
constexpr char kRefused[] = "refused";
constexpr char kServedThenClosed[] = "served, then closed";
constexpr char kOpen[] = "open";

std::string Watch(int fd, int polls) {
  bool heard = false;
  for (int i = 0; i < polls; ++i) {
    pollfd p{fd, POLLIN | POLLRDHUP, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    char buf[4096];
    for (;;) {
      const ssize_t r = ::recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
      if (r > 0) {
        heard = true;
        continue;
      }
      if (r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) {
        return heard ? kServedThenClosed : kRefused;
      }
      break;
    }
  }
  return kOpen;
}

// Stats over a fresh channel; its status.
grpc::Status Stats(const std::string& socket) {
  auto stub = v1::TierService::NewStub(grpc::CreateChannel(
      "unix:" + socket, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  v1::StatsResponse resp;
  return stub->Stats(&ctx, v1::StatsRequest(), &resp);
}

TEST(GrpcGateTest, PerUidCapIdleAndSilentConnections) {
  DaemonProcess daemon;
  ASSERT_TRUE(daemon
                  .Start({"--grpc_max_connections_per_uid=4",
                          "--grpc_max_connection_idle_s=1",
                          "--grpc_handshake_timeout_ms=300"})
                  .ok());
  // The uid's whole allowance, held by connections that say their preface
  // and carry no call.
  std::vector<int> held;
  for (int i = 0; i < kPerUid; ++i) {
    const int fd = RawHttp2Connection(daemon.socket());
    ASSERT_GE(fd, 0);
    held.push_back(fd);
  }
  // Each is served: the server answers its preface with SETTINGS.
  for (int fd : held) {
    pollfd p{fd, POLLIN, 0};
    EXPECT_EQ(::poll(&p, 1, 20000), 1) << "no SETTINGS from the server";
  }
  // One more of the same uid is closed without a byte.
  const int extra = RawHttp2Connection(daemon.socket());
  ASSERT_GE(extra, 0);
  EXPECT_EQ(Watch(extra, kPolls), kRefused)
      << "a connection past --grpc_max_connections_per_uid=" << kPerUid
      << " was served";
  ::close(extra);

  // Idle ones are closed (GOAWAY, then the close) and make room: a call
  // gets through once they are gone.
  for (int fd : held) {
    EXPECT_EQ(Watch(fd, kPolls), kServedThenClosed)
        << "an idle gRPC connection was still open after " << kPolls
        << " polls (--grpc_max_connection_idle_s=1)";
    ::close(fd);
  }
  const grpc::Status after_idle = Stats(daemon.socket());
  EXPECT_TRUE(after_idle.ok()) << after_idle.error_message();

  // A connection that never speaks HTTP/2 is closed at the preface deadline.
  const int silent = DialUnix(daemon.socket());
  ASSERT_GE(silent, 0);
  EXPECT_NE(Watch(silent, kPolls), kOpen);
  ::close(silent);
  const grpc::Status after_silent = Stats(daemon.socket());
  EXPECT_TRUE(after_silent.ok()) << after_silent.error_message();
}

}  // namespace
}  // namespace kvtier::testing
