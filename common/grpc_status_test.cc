// Tests of the one absl <-> gRPC status mapping (common/grpc_status.h) and
// of the ErrorReason payload it carries (common/error_reason.h).
#include "common/grpc_status.h"

#include "common/error_reason.h"
#include "gtest/gtest.h"

namespace kvtier {
namespace {

TEST(GrpcStatusTest, OkMapsToOk) {
  EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok());
  EXPECT_TRUE(FromGrpcStatus(grpc::Status::OK, "Lookup").ok());
}

TEST(GrpcStatusTest, KeepsCodeAndMessage) {
  const grpc::Status g = ToGrpcStatus(absl::InvalidArgumentError("hashes: 33"));
  EXPECT_EQ(g.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(g.error_message(), "hashes: 33");
  EXPECT_TRUE(g.error_details().empty());  // No payload, no details.
  const absl::Status a = FromGrpcStatus(g);
  EXPECT_EQ(a, absl::InvalidArgumentError("hashes: 33"));
  EXPECT_EQ(FromGrpcStatus(g, "Lookup").message(), "Lookup: hashes: 33");
}

TEST(GrpcStatusTest, PayloadsTravelInTheDetails) {
  absl::Status s = SessionUnknownError(42);
  s.SetPayload("type.example/other", absl::Cord(std::string("\0\x01\xff", 3)));
  const grpc::Status g = ToGrpcStatus(s);
  EXPECT_EQ(g.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_FALSE(g.error_details().empty());
  const absl::Status back = FromGrpcStatus(g, "Reserve");
  EXPECT_EQ(back.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(back.message(), "Reserve: session_id: no open session 42");
  EXPECT_EQ(GetErrorReason(back), ErrorReason::kSessionUnknown);
  EXPECT_EQ(back.GetPayload("type.example/other"),
            absl::Cord(std::string("\0\x01\xff", 3)));
}

// The details are a google.rpc.Status: code 5, the message, one Any.
TEST(GrpcStatusTest, DetailsAreAGoogleRpcStatus) {
  const grpc::Status g = ToGrpcStatus(WithErrorReason(
      absl::NotFoundError("m"), ErrorReason::kNamespaceUnknown));
  const std::string url = kErrorReasonTypeUrl;
  const std::string any = std::string("\x0a") + char(url.size()) + url +
                          std::string("\x12\x01") + "2";
  const std::string want =
      std::string("\x08\x05\x12\x01m\x1a", 6) + char(any.size()) + any;
  EXPECT_EQ(g.error_details(), want);
}

TEST(GrpcStatusTest, DamagedDetailsKeepCodeAndMessage) {
  for (const std::string& details :
       {std::string("\xff\xff\xff"), std::string("\x1a\x7f", 2),
        std::string("\x1a\x02\x0a\x09", 4), std::string("\x0b", 1)}) {
    const absl::Status a = FromGrpcStatus(
        grpc::Status(grpc::StatusCode::NOT_FOUND, "gone", details));
    EXPECT_EQ(a.code(), absl::StatusCode::kNotFound);
    EXPECT_EQ(a.message(), "gone");
    EXPECT_EQ(GetErrorReason(a), ErrorReason::kNone);
  }
}

TEST(ErrorReasonTest, SetReadAndClear) {
  absl::Status s = absl::NotFoundError("x");
  EXPECT_EQ(GetErrorReason(s), ErrorReason::kNone);
  s = WithErrorReason(s, ErrorReason::kDaemonUnreachable);
  EXPECT_EQ(GetErrorReason(s), ErrorReason::kDaemonUnreachable);
  s = WithErrorReason(s, ErrorReason::kNone);
  EXPECT_EQ(GetErrorReason(s), ErrorReason::kNone);
  EXPECT_TRUE(
      WithErrorReason(absl::OkStatus(), ErrorReason::kSessionUnknown).ok());
  // A reason this build does not know (a newer daemon's) reads as none.
  s.SetPayload(kErrorReasonTypeUrl, absl::Cord("99"));
  EXPECT_EQ(GetErrorReason(s), ErrorReason::kNone);
}

}  // namespace
}  // namespace kvtier
