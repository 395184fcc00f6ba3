// What one session and one uid may hold by default, against a real kvtierd
// with no flags (issue 27, item 5): one session may not hold a whole bank
// reserved (--max_session_reserved_rows; a max_model_len prompt of the
// vLLM tests still reserves, and another session takes rows beside it), and
// one uid may not open sessions without end (--max_sessions_per_uid: the
// next Open is refused RESOURCE_EXHAUSTED naming the flag, and a closed
// session makes room again; a session opened over gRPC counts once a call
// connection binds it). Before, both were unlimited: one session could
// reserve every row of a namespace and one uid open sessions up to its
// served-connection cap, each allowed that much.
//
// Thread-safety: single-threaded tests.
#include <unistd.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "client/client.h"
#include "gmock/gmock.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "kvtier/v1/tier.grpc.pb.h"
#include "tests/daemon_process.h"
#include "tests/raw_sockets.h"
#include "tests/test_pattern.h"

namespace kvtier::testing {
namespace {

using client::Client;
using ::testing::HasSubstr;

// A bank larger than one session may hold reserved by default.
constexpr uint32_t kBankRows = 20000;
// A max_model_len prompt of the vLLM tests: 2048 tokens of 16-token pages.
constexpr uint32_t kPromptPages = 2048 / 16;
// The most sessions the test opens before it expects a refusal.
constexpr int kMostSessions = 1000;

absl::StatusOr<std::unique_ptr<Client>> Connect(const DaemonProcess& d,
                                                const std::string& name) {
  return Client::Connect({.socket = d.socket(),
                          .client_name = name,
                          .timeout = absl::Seconds(30),
                          .reconnect = false});
}

TEST(SessionCapTest, OneSessionCannotReserveAWholeBank) {
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.Start().ok());
  auto a = Connect(daemon, "hoarder");
  ASSERT_TRUE(a.ok()) << a.status();
  client::AttachOptions options = TestAttachOptions("caps");
  options.capacity.page_rows = kBankRows;
  auto ns = (*a)->Attach(options);
  ASSERT_TRUE(ns.ok()) << ns.status();

  auto whole = (*ns)->Reserve(kBankRows);
  EXPECT_EQ(whole.status().code(), absl::StatusCode::kResourceExhausted)
      << whole.status();
  EXPECT_THAT(std::string(whole.status().message()),
              HasSubstr("--max_session_reserved_rows"));

  auto prompt = (*ns)->Reserve(kPromptPages);
  ASSERT_TRUE(prompt.ok()) << prompt.status();

  // Another session reserves beside it.
  auto b = Connect(daemon, "neighbour");
  ASSERT_TRUE(b.ok()) << b.status();
  auto other = (*b)->Attach(options);
  ASSERT_TRUE(other.ok()) << other.status();
  auto beside = (*other)->Reserve(kPromptPages);
  EXPECT_TRUE(beside.ok()) << beside.status();
}

TEST(SessionCapTest, OneUidsSessionsAreCapped) {
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.Start().ok());
  const std::string lookup = daemon.socket() + ".lookup";
  std::vector<RawSession> open;
  RawSession refused;
  for (int i = 0; i < kMostSessions; ++i) {
    RawSession s = OpenRawSession(lookup, "many");
    ASSERT_TRUE(s.answered) << "session " << i << " got no answer";
    if (s.reply.code != 0) {
      refused = std::move(s);
      break;
    }
    open.push_back(std::move(s));
  }
  std::printf("opened %zu sessions of one uid before a refusal\n", open.size());
  ASSERT_GE(refused.fd, 0) << "one uid opened " << kMostSessions
                           << " sessions and none was refused";
  EXPECT_EQ(static_cast<absl::StatusCode>(refused.reply.code),
            absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.message, HasSubstr("--max_sessions_per_uid"));
  ::close(refused.fd);

  // A session that ends makes room (the daemon sees the close on its own
  // time: a bounded number of attempts).
  ASSERT_FALSE(open.empty());
  ::close(open.back().fd);
  open.pop_back();
  bool admitted = false;
  for (int attempt = 0; attempt < 600 && !admitted; ++attempt) {
    RawSession s = OpenRawSession(lookup, "room");
    admitted = s.answered && s.reply.code == 0;
    if (admitted) {
      open.push_back(std::move(s));
    } else {
      if (s.fd >= 0) ::close(s.fd);
      ::usleep(100 * 1000);
    }
  }
  EXPECT_TRUE(admitted) << "no session admitted after one closed";
  for (RawSession& s : open) ::close(s.fd);
}

// A session opened over gRPC counts against the uid that binds it on the
// engine socket: at the cap, the call connection's Hello that would bind
// one more is refused RESOURCE_EXHAUSTED (a HelloReply carries no message).
TEST(SessionCapTest, SessionsOpenedOverGrpcCountWhenBound) {
  DaemonProcess daemon;
  // Served connections are not what stops this uid.
  ASSERT_TRUE(daemon
                  .Start({"--fast_lookup_max_connections=2048",
                          "--fast_lookup_max_connections_per_uid=2048"})
                  .ok());
  const std::string lookup = daemon.socket() + ".lookup";
  std::vector<RawSession> open;
  for (int i = 0; i < kMostSessions; ++i) {
    RawSession s = OpenRawSession(lookup, "many");
    ASSERT_TRUE(s.answered) << "session " << i << " got no answer";
    if (s.reply.code != 0) {
      ::close(s.fd);
      break;
    }
    open.push_back(std::move(s));
  }
  ASSERT_LT(open.size(), static_cast<size_t>(kMostSessions))
      << "one uid opened " << kMostSessions << " sessions and none was refused";

  auto stub = v1::TierService::NewStub(grpc::CreateChannel(
      "unix:" + daemon.socket(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  auto stream = stub->Session(&ctx);
  v1::SessionRequest hello;
  hello.mutable_hello()->set_client_name("over-grpc");
  ASSERT_TRUE(stream->Write(hello));
  v1::SessionEvent opened;
  ASSERT_TRUE(stream->Read(&opened));
  ASSERT_TRUE(opened.has_opened());
  // Unbound, it could not attach; binding it would be one session more.
  const int calls = DialUnix(lookup);
  ASSERT_GE(calls, 0);
  fastpath::Hello bind;
  bind.session_id = opened.opened().session_id();
  fastpath::HelloReply reply;
  ASSERT_TRUE(SendAll(calls, &bind, sizeof(bind)));
  ASSERT_TRUE(fastpath::ReadFull(calls, &reply, sizeof(reply)));
  EXPECT_EQ(static_cast<absl::StatusCode>(reply.code),
            absl::StatusCode::kResourceExhausted);
  ::close(calls);
  // Its own sessions' call connections still bind.
  const int own = RawCallConnection(lookup, open.front().reply.session_id);
  EXPECT_GE(own, 0);
  if (own >= 0) ::close(own);
  ctx.TryCancel();
  for (RawSession& s : open) ::close(s.fd);
}

}  // namespace
}  // namespace kvtier::testing
