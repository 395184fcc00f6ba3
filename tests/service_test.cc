// The daemon as a gRPC server, seen from raw stubs: the standard health
// service reports SERVING, server reflection lists and describes TierService
// (what grpcurl relies on), and the Session stream rejects bad input with a
// clear status.
#include <signal.h>

#include <memory>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "google/protobuf/descriptor.pb.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpc/reflection/v1alpha/reflection.grpc.pb.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "kvtier/v1/tier.grpc.pb.h"
#include "tests/daemon_process.h"

namespace kvtier::testing {
namespace {

using ::testing::Contains;
using ::testing::HasSubstr;

class ServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(daemon_.Start().ok());
    channel_ = grpc::CreateChannel("unix:" + daemon_.socket(),
                                   grpc::InsecureChannelCredentials());
  }
  void Deadline(grpc::ClientContext* ctx) {
    ctx->set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  }
  DaemonProcess daemon_;
  std::shared_ptr<grpc::Channel> channel_;
};

TEST_F(ServiceTest, HealthReportsServing) {
  auto stub = grpc::health::v1::Health::NewStub(channel_);
  grpc::ClientContext ctx;
  Deadline(&ctx);
  grpc::health::v1::HealthCheckRequest req;
  grpc::health::v1::HealthCheckResponse resp;
  ASSERT_TRUE(stub->Check(&ctx, req, &resp).ok());
  EXPECT_EQ(resp.status(), grpc::health::v1::HealthCheckResponse::SERVING);
}

TEST_F(ServiceTest, ReflectionListsAndDescribesTierService) {
  auto stub = grpc::reflection::v1alpha::ServerReflection::NewStub(channel_);
  grpc::ClientContext ctx;
  Deadline(&ctx);
  auto stream = stub->ServerReflectionInfo(&ctx);
  grpc::reflection::v1alpha::ServerReflectionRequest list;
  list.set_list_services("");
  grpc::reflection::v1alpha::ServerReflectionResponse resp;
  ASSERT_TRUE(stream->Write(list));
  ASSERT_TRUE(stream->Read(&resp));
  std::vector<std::string> names;
  for (const auto& s : resp.list_services_response().service()) {
    names.push_back(s.name());
  }
  EXPECT_THAT(names, Contains("kvtier.v1.TierService"));
  EXPECT_THAT(names, Contains("grpc.health.v1.Health"));

  grpc::reflection::v1alpha::ServerReflectionRequest describe;
  describe.set_file_containing_symbol("kvtier.v1.TierService");
  ASSERT_TRUE(stream->Write(describe));
  ASSERT_TRUE(stream->Read(&resp));
  ASSERT_GE(resp.file_descriptor_response().file_descriptor_proto_size(), 1);
  google::protobuf::FileDescriptorProto file;
  ASSERT_TRUE(file.ParseFromString(
      resp.file_descriptor_response().file_descriptor_proto(0)));
  EXPECT_EQ(file.name(), "kvtier/v1/tier.proto");
  ASSERT_EQ(file.service_size(), 1);
  std::vector<std::string> methods;
  for (const auto& m : file.service(0).method()) methods.push_back(m.name());
  for (const char* m :
       {"Session", "Attach", "Lookup", "Reserve", "Commit", "Abort", "Release",
        "Drop", "Stats", "ListNamespaces", "ListPrefixes"}) {
    EXPECT_THAT(methods, Contains(m));
  }
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
}

// Opens a Session stream, sends `messages`, and returns how it ended.
grpc::Status SessionWith(v1::TierService::Stub* stub,
                         const std::vector<v1::SessionRequest>& messages,
                         int* opened) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  auto stream = stub->Session(&ctx);
  for (const auto& m : messages) stream->Write(m);
  stream->WritesDone();
  v1::SessionEvent event;
  *opened = 0;
  while (stream->Read(&event)) {
    if (event.has_opened()) ++*opened;
  }
  return stream->Finish();
}

TEST_F(ServiceTest, SessionStreamRejectsBadInput) {
  auto stub = v1::TierService::NewStub(channel_);
  v1::SessionRequest hello;
  hello.mutable_hello()->set_client_name("t");
  int opened = 0;

  grpc::Status ok = SessionWith(stub.get(), {hello}, &opened);
  EXPECT_TRUE(ok.ok()) << ok.error_message();
  EXPECT_EQ(opened, 1);

  grpc::Status twice = SessionWith(stub.get(), {hello, hello}, &opened);
  EXPECT_EQ(twice.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(twice.error_message(), HasSubstr("hello"));

  grpc::Status empty = SessionWith(stub.get(), {v1::SessionRequest()}, &opened);
  EXPECT_EQ(empty.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(opened, 0);

  v1::SessionRequest future = hello;
  future.set_api_version(99);
  grpc::Status version = SessionWith(stub.get(), {future}, &opened);
  EXPECT_EQ(version.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(version.error_message(), HasSubstr("api_version"));

  v1::SessionRequest long_name = hello;
  long_name.mutable_hello()->set_client_name(std::string(300, 'x'));
  grpc::Status name = SessionWith(stub.get(), {long_name}, &opened);
  EXPECT_EQ(name.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(name.error_message(), HasSubstr("client_name"));

  // None of that left a session behind (OnDone may trail the status a bit).
  v1::StatsResponse stats;
  for (int i = 0; i < 200; ++i) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    ASSERT_TRUE(stub->Stats(&ctx, v1::StatsRequest(), &stats).ok());
    if (stats.sessions() == 0) break;
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(stats.sessions(), 0u);
}

TEST_F(ServiceTest, SigtermSendsDrainingToOpenSessions) {
  auto stub = v1::TierService::NewStub(channel_);
  grpc::ClientContext ctx;
  Deadline(&ctx);
  auto stream = stub->Session(&ctx);
  v1::SessionRequest hello;
  hello.mutable_hello()->set_client_name("drain");
  ASSERT_TRUE(stream->Write(hello));
  v1::SessionEvent event;
  ASSERT_TRUE(stream->Read(&event));
  ASSERT_TRUE(event.has_opened());
  daemon_.Signal(SIGTERM);
  ASSERT_TRUE(stream->Read(&event)) << "stream ended without Draining";
  EXPECT_TRUE(event.has_draining());
  // Then the stream ends: the engine reconnects to the next daemon.
  while (stream->Read(&event)) {
  }
  stream->Finish();
  EXPECT_TRUE(daemon_.Stop().ok());
}

}  // namespace
}  // namespace kvtier::testing
