// A reflection client calls every method of TierService, knowing nothing of
// kvtier at build time — what grpcurl does: it fetches the service's
// FileDescriptorProto through server reflection, builds a DescriptorPool,
// turns JSON into DynamicMessages, and calls methods by name through
// grpc::GenericStub with raw bytes. Every unary method answers an empty
// request with OK or a validation error (never UNIMPLEMENTED), and a whole
// engine's flow (Session, Attach, Reserve, Commit, Lookup, Release, Abort,
// Fence, Stats, ListNamespaces, ListPrefixes, Verify, Drop) succeeds from JSON.
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/descriptor.pb.h"
#include "google/protobuf/descriptor_database.h"
#include "google/protobuf/dynamic_message.h"
#include "google/protobuf/util/json_util.h"
#include "grpc/reflection/v1alpha/reflection.grpc.pb.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/support/byte_buffer.h"
#include "gtest/gtest.h"
#include "tests/daemon_process.h"

namespace kvtier::testing {
namespace {

namespace pb = ::google::protobuf;
using ::testing::HasSubstr;

constexpr char kService[] = "kvtier.v1.TierService";

grpc::ByteBuffer ToBuffer(const pb::Message& m) {
  const std::string bytes = m.SerializeAsString();
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

std::string FromBuffer(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  std::string out;
  if (!buffer.Dump(&slices).ok()) return out;
  for (const auto& s : slices) {
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return out;
}

// A client that knows TierService only through the daemon's reflection.
class ReflectionClient {
 public:
  explicit ReflectionClient(std::shared_ptr<grpc::Channel> channel)
      : channel_(std::move(channel)), generic_(channel_) {}

  // Lists the server's services and loads the file that defines kService
  // (with whatever it imports) into the pool.
  absl::Status Load() {
    auto stub = grpc::reflection::v1alpha::ServerReflection::NewStub(channel_);
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    auto stream = stub->ServerReflectionInfo(&ctx);
    grpc::reflection::v1alpha::ServerReflectionRequest req;
    grpc::reflection::v1alpha::ServerReflectionResponse resp;
    req.set_list_services("");
    if (!stream->Write(req) || !stream->Read(&resp)) {
      return absl::UnavailableError("reflection: list_services");
    }
    for (const auto& s : resp.list_services_response().service()) {
      services_.push_back(s.name());
    }
    req.set_file_containing_symbol(kService);
    if (!stream->Write(req) || !stream->Read(&resp)) {
      return absl::UnavailableError("reflection: file_containing_symbol");
    }
    if (resp.has_error_response()) {
      return absl::NotFoundError(resp.error_response().error_message());
    }
    for (const std::string& bytes :
         resp.file_descriptor_response().file_descriptor_proto()) {
      pb::FileDescriptorProto file;
      if (!file.ParseFromString(bytes) || !database_.Add(file)) {
        return absl::DataLossError("reflection: bad FileDescriptorProto");
      }
    }
    stream->WritesDone();
    grpc::Status s = stream->Finish();
    if (!s.ok()) return absl::InternalError(s.error_message());
    service_ = pool_.FindServiceByName(kService);
    if (service_ == nullptr) {
      return absl::NotFoundError("reflection: no descriptor of the service");
    }
    return absl::OkStatus();
  }

  const std::vector<std::string>& services() const { return services_; }
  const pb::ServiceDescriptor* service() const { return service_; }

  // Returns an empty DynamicMessage of `type`.
  std::unique_ptr<pb::Message> New(const pb::Descriptor* type) {
    return std::unique_ptr<pb::Message>(factory_.GetPrototype(type)->New());
  }

  // Builds `method`'s request from `json` (proto field names), calls it, and
  // returns the answer as a DynamicMessage, or the call's status.
  absl::StatusOr<std::unique_ptr<pb::Message>> Call(const std::string& method,
                                                    const std::string& json,
                                                    grpc::StatusCode* code) {
    const pb::MethodDescriptor* m = service_->FindMethodByName(method);
    if (m == nullptr) return absl::NotFoundError("no method " + method);
    std::unique_ptr<pb::Message> request = New(m->input_type());
    if (auto s = pb::util::JsonStringToMessage(json, request.get()); !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("JSON for ", method, ": ", s.ToString()));
    }
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    grpc::ByteBuffer in = ToBuffer(*request), out;
    grpc::Status status;
    absl::Notification done;
    generic_.UnaryCall(&ctx, absl::StrCat("/", kService, "/", method),
                       grpc::StubOptions(), &in, &out, [&](grpc::Status s) {
                         status = std::move(s);
                         done.Notify();
                       });
    done.WaitForNotification();
    *code = status.error_code();
    if (!status.ok()) {
      return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                          status.error_message());
    }
    std::unique_ptr<pb::Message> response = New(m->output_type());
    if (!response->ParseFromString(FromBuffer(out))) {
      return absl::DataLossError(method + ": answer does not parse");
    }
    return response;
  }

  grpc::GenericStub& generic() { return generic_; }

 private:
  std::shared_ptr<grpc::Channel> channel_;
  grpc::GenericStub generic_;
  pb::SimpleDescriptorDatabase database_;
  pb::DescriptorPool pool_{&database_};
  pb::DynamicMessageFactory factory_{&pool_};
  const pb::ServiceDescriptor* service_ = nullptr;
  std::vector<std::string> services_;
};

// Field access on DynamicMessages by name (what a generic client does).
uint64_t U64(const pb::Message& m, const std::string& field) {
  const pb::FieldDescriptor* f = m.GetDescriptor()->FindFieldByName(field);
  EXPECT_NE(f, nullptr) << field;
  if (f == nullptr) return 0;
  switch (f->cpp_type()) {
    case pb::FieldDescriptor::CPPTYPE_UINT64:
      return m.GetReflection()->GetUInt64(m, f);
    case pb::FieldDescriptor::CPPTYPE_UINT32:
      return m.GetReflection()->GetUInt32(m, f);
    case pb::FieldDescriptor::CPPTYPE_BOOL:
      return m.GetReflection()->GetBool(m, f);
    default:
      ADD_FAILURE() << field << " is not an unsigned integer";
      return 0;
  }
}

std::string Json(const pb::Message& m) {
  std::string out;
  pb::util::JsonPrintOptions opts;
  opts.preserve_proto_field_names = true;
  (void)pb::util::MessageToJsonString(m, &out, opts);
  return out;
}

class ReflectionCallTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Attach over plain gRPC: no peer credentials bound on the fast path.
    ASSERT_TRUE(
        daemon_
            .Start({"--require_peer_credentials=false", "--metrics_address="})
            .ok());
    channel_ = grpc::CreateChannel("unix:" + daemon_.socket(),
                                   grpc::InsecureChannelCredentials());
    client_ = std::make_unique<ReflectionClient>(channel_);
    ASSERT_TRUE(client_->Load().ok());
  }
  DaemonProcess daemon_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<ReflectionClient> client_;
};

TEST_F(ReflectionCallTest, EveryUnaryMethodAnswersAnEmptyRequest) {
  EXPECT_THAT(client_->services(), ::testing::Contains(kService));
  const pb::ServiceDescriptor* service = client_->service();
  int unary = 0;
  for (int i = 0; i < service->method_count(); ++i) {
    const pb::MethodDescriptor* m = service->method(i);
    if (m->client_streaming() || m->server_streaming()) continue;
    ++unary;
    grpc::StatusCode code = grpc::StatusCode::UNKNOWN;
    auto answer = client_->Call(m->name(), "{}", &code);
    std::printf("%-15s {} -> %s\n", m->name().c_str(),
                answer.ok() ? "OK" : answer.status().ToString().c_str());
    EXPECT_NE(code, grpc::StatusCode::UNIMPLEMENTED) << m->name();
    if (answer.ok()) continue;
    if (m->name() == "Verify") {
      // An operator's RPC: refused on the engine socket, naming the other.
      EXPECT_EQ(code, grpc::StatusCode::PERMISSION_DENIED);
      EXPECT_THAT(std::string(answer.status().message()),
                  HasSubstr("operator socket"));
      continue;
    }
    // A validation error that says which field is wrong.
    EXPECT_THAT(code, ::testing::AnyOf(grpc::StatusCode::INVALID_ARGUMENT,
                                       grpc::StatusCode::NOT_FOUND,
                                       grpc::StatusCode::FAILED_PRECONDITION))
        << m->name() << ": " << answer.status();
    EXPECT_THAT(std::string(answer.status().message()),
                ::testing::ContainsRegex("session_id|namespace|api_version"))
        << m->name();
  }
  EXPECT_GE(unary, 11);  // Every rpc of tier.proto but the Session stream.
}

TEST_F(ReflectionCallTest, AnEnginesWholeFlowFromJson) {
  const pb::ServiceDescriptor* service = client_->service();
  const pb::MethodDescriptor* session = service->FindMethodByName("Session");
  ASSERT_NE(session, nullptr);
  ASSERT_TRUE(session->client_streaming() && session->server_streaming());

  // Session: a generic bidi stream carrying a Hello built from JSON.
  grpc::CompletionQueue cq;
  grpc::ClientContext stream_ctx;
  auto stream = client_->generic().PrepareCall(
      &stream_ctx, absl::StrCat("/", kService, "/Session"), &cq);
  ASSERT_NE(stream, nullptr);
  auto next = [&cq](intptr_t want) {
    void* tag = nullptr;
    bool ok = false;
    EXPECT_TRUE(cq.Next(&tag, &ok));
    EXPECT_EQ(reinterpret_cast<intptr_t>(tag), want);
    return ok;
  };
  stream->StartCall(reinterpret_cast<void*>(1));
  ASSERT_TRUE(next(1));
  auto hello = client_->New(session->input_type());
  ASSERT_TRUE(
      pb::util::JsonStringToMessage(
          R"({"hello": {"client_name": "reflection", "pid": 1}})", hello.get())
          .ok());
  stream->Write(ToBuffer(*hello), reinterpret_cast<void*>(2));
  ASSERT_TRUE(next(2));
  grpc::ByteBuffer event_bytes;
  stream->Read(&event_bytes, reinterpret_cast<void*>(3));
  ASSERT_TRUE(next(3));
  auto event = client_->New(session->output_type());
  ASSERT_TRUE(event->ParseFromString(FromBuffer(event_bytes)));
  const pb::FieldDescriptor* opened =
      event->GetDescriptor()->FindFieldByName("opened");
  ASSERT_NE(opened, nullptr);
  const uint64_t sid =
      U64(event->GetReflection()->GetMessage(*event, opened), "session_id");
  ASSERT_NE(sid, 0u) << Json(*event);

  std::set<std::string> called;
  grpc::StatusCode code;
  auto call = [&](const std::string& method, const std::string& json) {
    auto r = client_->Call(method, json, &code);
    EXPECT_TRUE(r.ok()) << method << " " << json << ": " << r.status();
    if (r.ok()) called.insert(method);
    return r.ok()
               ? *std::move(r)
               : client_->New(service->FindMethodByName(method)->output_type());
  };
  const std::string s = absl::StrCat("\"session_id\": \"", sid, "\"");

  auto attached = call("Attach", absl::StrCat("{", s, R"(,
      "namespace": "reflected",
      "layout": {"model": "m", "tokens_per_page": 16, "num_layers": 1,
                 "page_banks": [{"name": "kv", "row_bytes": 4096}]},
      "capacity": {"page_rows": 16}})"));
  const uint64_t ns = U64(*attached, "namespace_id");
  ASSERT_NE(ns, 0u);
  EXPECT_EQ(U64(*attached, "hash_bytes"), 32u);
  const std::string n = absl::StrCat(s, ", \"namespace_id\": \"", ns, "\"");

  auto reserved = call("Reserve", absl::StrCat("{", n, R"(, "pages": 2})"));
  const uint64_t reservation = U64(*reserved, "reservation_id");
  ASSERT_NE(reservation, 0u);
  // Two 32-byte hashes, base64 in JSON as proto3 writes bytes.
  const std::string hashes =
      absl::Base64Escape(std::string(32, 'a') + std::string(32, 'b'));
  auto committed = call(
      "Commit", absl::StrCat("{", n, ", \"reservation_id\": \"", reservation,
                             "\", \"hashes\": \"", hashes, "\"}"));
  EXPECT_EQ(U64(*committed, "committed_pages"), 2u);
  auto found = call("Lookup", absl::StrCat("{", n, ", \"hashes\": \"", hashes,
                                           "\", \"pin\": true}"));
  EXPECT_EQ(U64(*found, "usable_pages"), 2u);
  // Without a cluster tier (--cluster_redis) a prefetch has nothing to
  // bring: the local match, nothing remote.
  auto prefetched =
      call("Prefetch", absl::StrCat("{", n, ", \"hashes\": \"", hashes, "\"}"));
  EXPECT_EQ(U64(*prefetched, "local_pages"), 2u);
  EXPECT_EQ(U64(*prefetched, "remote_pages"), 0u);
  const uint64_t lease = U64(*found, "lease_id");
  ASSERT_NE(lease, 0u);
  call("Release", absl::StrCat("{", n, ", \"lease_id\": \"", lease, "\"}"));
  auto second = call("Reserve", absl::StrCat("{", n, R"(, "pages": 1})"));
  call("Abort", absl::StrCat("{", n, ", \"reservation_id\": \"",
                             U64(*second, "reservation_id"), "\"}"));
  // A reservation given up while copies may be queued stays fenced until
  // the holder releases the hold.
  auto third = call("Reserve", absl::StrCat("{", n, R"(, "pages": 1})"));
  auto fenced = call("Abort", absl::StrCat("{", n, ", \"reservation_id\": \"",
                                           U64(*third, "reservation_id"),
                                           "\", \"fenced\": true}"));
  const uint64_t hold = U64(*fenced, "fence_hold");
  ASSERT_NE(hold, 0u) << Json(*fenced);
  auto freed =
      call("Fence", absl::StrCat("{", s, ", \"release\": [\"", hold, "\"]}"));
  EXPECT_EQ(U64(*freed, "released"), 1u) << Json(*freed);
  auto stats = call("Stats", "{}");
  EXPECT_THAT(Json(*stats), HasSubstr("\"name\":\"reflected\""));
  auto listed = call("ListNamespaces", "{}");
  EXPECT_THAT(Json(*listed), HasSubstr("\"used_rows\":\"2\""));
  auto prefixes = call("ListPrefixes", R"({"namespace": "reflected"})");
  EXPECT_EQ(U64(*prefixes, "total_prefixes"), 1u);
  // Verify is an operator's: through the operator socket, as grpcurl or
  // grpc_cli would reach it.
  {
    ReflectionClient admin(grpc::CreateChannel(
        "unix:" + daemon_.admin_socket(), grpc::InsecureChannelCredentials()));
    ASSERT_TRUE(admin.Load().ok());
    auto verified = admin.Call("Verify", "{}", &code);
    ASSERT_TRUE(verified.ok()) << verified.status();
    EXPECT_EQ(U64(**verified, "ok"), 1u) << Json(**verified);
    called.insert("Verify");
  }
  auto dropped = call("Drop", R"({"namespace": "reflected", "force": true})");
  EXPECT_EQ(U64(*dropped, "dropped_pages"), 2u);

  // Every unary method was called and answered OK.
  for (int i = 0; i < service->method_count(); ++i) {
    const pb::MethodDescriptor* m = service->method(i);
    if (m->client_streaming() || m->server_streaming()) continue;
    EXPECT_TRUE(called.contains(m->name())) << m->name() << " not called";
  }

  stream->WritesDone(reinterpret_cast<void*>(4));
  ASSERT_TRUE(next(4));
  grpc::Status finished;
  stream->Finish(&finished, reinterpret_cast<void*>(5));
  ASSERT_TRUE(next(5));
  EXPECT_TRUE(finished.ok()) << finished.error_message();
  cq.Shutdown();
  void* tag;
  bool ok;
  while (cq.Next(&tag, &ok)) {
  }
}

}  // namespace
}  // namespace kvtier::testing
