// Hostile input against a real kvtierd (issue 5, item 4): bytes that are not
// protobuf sent to every method through a GenericStub, truncated and
// malformed streams (the Session stream, raw HTTP/2, the fast lookup
// socket), huge counts, wrong ids, double release and abort, and commits of
// another session's reservation. Every one must be answered with an error
// (or a closed connection), leave the daemon's observable state (Stats
// without the clock) unchanged, keep Verify ok, and leave the daemon alive
// and able to serve. Prints "HOSTILE bad_inputs=N".
//
// Thread-safety: single-threaded test.
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "common/fast_lookup.h"
#include "gmock/gmock.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/support/byte_buffer.h"
#include "gtest/gtest.h"
#include "kvtier/v1/tier.grpc.pb.h"
#include "tests/daemon_process.h"
#include "tests/test_pattern.h"

namespace kvtier::testing {
namespace {

using client::Client;
using client::Namespace;
using client::Reservation;
using ::testing::HasSubstr;

constexpr char kService[] = "/kvtier.v1.TierService/";

// Byte strings no protobuf parser accepts.
std::vector<std::string> NotProtobuf() {
  return {
      std::string("\xff", 1),  // Truncated tag varint.
      std::string("\x0a\x80\x01"
                  "abc",
                  6),          // Length 128, 3 bytes.
      std::string("\x0f", 1),  // Wire type 7.
      std::string("\x08\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", 12),
      std::string("\x0b", 1),       // Unterminated group.
      std::string(100000, '\x0b'),  // 100,000 nested groups.
      std::string("\x22\x05\x0a\x03"
                  "ab",
                  6),  // Truncated submessage.
  };
}

// `n` 32-byte hashes that are in no index.
std::string RandomLike(int n) {
  std::string out;
  for (int i = 0; i < n; ++i) {
    std::string h(32, 'r');
    h[0] = static_cast<char>(i);
    out += h;
  }
  return out;
}

int Connect(const std::string& path) {
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  timeval tv{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  return fd;
}

bool Send(int fd, const std::string& bytes) {
  iovec iov{const_cast<char*>(bytes.data()), bytes.size()};
  return fastpath::WriteFullV(fd, &iov, 1);
}

template <typename T>
std::string Bytes(const T& v) {
  return std::string(reinterpret_cast<const char*>(&v), sizeof(v));
}

// True when the peer closed `fd` (EOF) rather than answering.
bool ClosedByPeer(int fd) {
  char c;
  return read(fd, &c, 1) == 0;
}

class HostileInputTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(daemon_.Start().ok());
    channel_ = grpc::CreateChannel("unix:" + daemon_.socket(),
                                   grpc::InsecureChannelCredentials());
    stub_ = v1::TierService::NewStub(channel_);
    auto a = Client::Connect({.socket = daemon_.socket(), .client_name = "a"});
    auto b = Client::Connect({.socket = daemon_.socket(), .client_name = "b"});
    ASSERT_TRUE(a.ok() && b.ok());
    a_ = *std::move(a);
    b_ = *std::move(b);
    auto na = a_->Attach(TestAttachOptions("hostile"));
    auto nb = b_->Attach(TestAttachOptions("hostile"));
    ASSERT_TRUE(na.ok() && nb.ok()) << na.status() << nb.status();
    na_ = *std::move(na);
    nb_ = *std::move(nb);
    hashes_ = na_->hasher().HashChain(TestTokens(3, 4 * 16));
    auto r = na_->Reserve(4);
    ASSERT_TRUE(r.ok());
    ASSERT_TRUE(r->Commit("", hashes_).ok());
    // Open state that bad input must not disturb: a's pin and a's and b's
    // reservations.
    v1::LookupRequest lookup = Req<v1::LookupRequest>(*a_, *na_);
    lookup.set_hashes(hashes_);
    lookup.set_pin(true);
    v1::LookupResponse lresp;
    ASSERT_TRUE(Call(&v1::TierService::Stub::Lookup, lookup, &lresp).ok());
    ASSERT_EQ(lresp.usable_pages(), 4u);
    lease_ = lresp.lease_id();
    auto ra = na_->Reserve(2);
    auto rb = nb_->Reserve(2);
    ASSERT_TRUE(ra.ok() && rb.ok());
    res_a_ = *std::move(ra);
    res_b_ = *std::move(rb);
    before_ = State();
  }

  void TearDown() override {
    if (HasFatalFailure() || IsSkipped()) return;
    // Still serving, still consistent.
    v1::VerifyResponse verify;
    {
      // Verify is an operator's RPC: the operator socket.
      auto admin = v1::TierService::NewStub(
          grpc::CreateChannel("unix:" + daemon_.admin_socket(),
                              grpc::InsecureChannelCredentials()));
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
      ASSERT_TRUE(admin->Verify(&ctx, v1::VerifyRequest(), &verify).ok());
    }
    EXPECT_TRUE(verify.ok()) << verify.violation();
    auto lease = na_->Lookup(hashes_, /*pin=*/false);
    ASSERT_TRUE(lease.ok()) << lease.status();
    EXPECT_EQ(lease->matched_pages(), 4u);
    std::printf("HOSTILE bad_inputs=%d\n", tried_);
  }

  template <typename R>
  R Req(const Client& c, const Namespace& ns) {
    R r;
    r.set_session_id(c.session_id());
    r.set_namespace_id(ns.id());
    return r;
  }

  template <typename Method, typename Q, typename A>
  grpc::Status Call(Method m, const Q& req, A* resp) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    return ((*stub_).*m)(&ctx, req, resp);
  }

  // Stats without the clock and without the lookup counters, which
  // successful lookups (TearDown's) move.
  std::string State() {
    v1::StatsResponse stats;
    grpc::Status s =
        Call(&v1::TierService::Stub::Stats, v1::StatsRequest(), &stats);
    EXPECT_TRUE(s.ok()) << s.error_message();
    stats.clear_uptime_seconds();
    std::string out;
    stats.SerializeToString(&out);
    return out;
  }

  // Expects an error with `code` whose message names `field`, and no
  // change of state.
  void ExpectRejected(const grpc::Status& s, grpc::StatusCode code,
                      const std::string& field) {
    ++tried_;
    EXPECT_EQ(s.error_code(), code) << field << ": " << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr(field));
    EXPECT_EQ(State(), before_) << field << " changed the state";
  }

  grpc::Status RawUnary(const std::string& method, const std::string& bytes) {
    grpc::GenericStub generic(channel_);
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    grpc::Slice slice(bytes);
    grpc::ByteBuffer request(&slice, 1), response;
    std::promise<grpc::Status> done;
    generic.UnaryCall(&ctx, kService + method, grpc::StubOptions(), &request,
                      &response,
                      [&done](grpc::Status s) { done.set_value(s); });
    return done.get_future().get();
  }

  // Sends `messages` (raw bytes) on a Session stream, half-closes, reads
  // everything; returns the final status and counts the events received.
  grpc::Status RawSession(const std::vector<std::string>& messages,
                          int* events) {
    grpc::GenericStub generic(channel_);
    grpc::CompletionQueue cq;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    auto call =
        generic.PrepareCall(&ctx, std::string(kService) + "Session", &cq);
    void* tag;
    bool ok;
    call->StartCall(reinterpret_cast<void*>(1));
    cq.Next(&tag, &ok);
    for (const auto& m : messages) {
      grpc::Slice slice(m);
      grpc::ByteBuffer buf(&slice, 1);
      call->Write(buf, reinterpret_cast<void*>(2));
      cq.Next(&tag, &ok);
      if (!ok) break;
    }
    call->WritesDone(reinterpret_cast<void*>(3));
    cq.Next(&tag, &ok);
    *events = 0;
    for (;;) {
      grpc::ByteBuffer in;
      call->Read(&in, reinterpret_cast<void*>(4));
      cq.Next(&tag, &ok);
      if (!ok) break;
      ++*events;
    }
    grpc::Status status;
    call->Finish(&status, reinterpret_cast<void*>(5));
    cq.Next(&tag, &ok);
    cq.Shutdown();
    while (cq.Next(&tag, &ok)) {
    }
    return status;
  }

  DaemonProcess daemon_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::TierService::Stub> stub_;
  std::unique_ptr<Client> a_, b_;
  std::unique_ptr<Namespace> na_, nb_;
  std::string hashes_;
  uint64_t lease_ = 0;
  Reservation res_a_, res_b_;
  std::string before_;
  int tried_ = 0;
};

TEST_F(HostileInputTest, BytesThatAreNotProtobufToEveryMethod) {
  for (const char* method :
       {"Attach", "Lookup", "Reserve", "Commit", "Abort", "Release", "Drop",
        "Stats", "ListNamespaces", "ListPrefixes", "Verify"}) {
    for (const std::string& bytes : NotProtobuf()) {
      grpc::Status s = RawUnary(method, bytes);
      ++tried_;
      EXPECT_FALSE(s.ok()) << method << " accepted " << bytes.size()
                           << " bytes of garbage";
      EXPECT_EQ(State(), before_) << method;
    }
  }
  // The Session stream: garbage instead of Hello opens nothing.
  for (const std::string& bytes : NotProtobuf()) {
    int events = 0;
    RawSession({bytes}, &events);
    ++tried_;
    EXPECT_EQ(events, 0) << "a garbage Hello opened a session";
  }
  // Garbage after a good Hello ends that session.
  v1::SessionRequest hello;
  hello.mutable_hello()->set_client_name("then-garbage");
  int events = 0;
  RawSession({hello.SerializeAsString(), NotProtobuf()[1]}, &events);
  ++tried_;
  EXPECT_LE(events, 1);
  // No session of all that stays behind (OnDone may trail the status).
  for (int i = 0; i < 200 && State() != before_; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(State(), before_);
}

TEST_F(HostileInputTest, TruncatedAndMalformedStreams) {
  const std::string preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
  // HTTP/2 frame headers: 3 bytes length, type, flags, 4 bytes stream.
  auto frame = [](uint32_t len, uint8_t type, uint8_t flags, uint32_t stream) {
    std::string f(9, '\0');
    f[0] = static_cast<char>(len >> 16);
    f[1] = static_cast<char>(len >> 8);
    f[2] = static_cast<char>(len);
    f[3] = static_cast<char>(type);
    f[4] = static_cast<char>(flags);
    f[5] = static_cast<char>(stream >> 24);
    f[6] = static_cast<char>(stream >> 16);
    f[7] = static_cast<char>(stream >> 8);
    f[8] = static_cast<char>(stream);
    return f;
  };
  const std::vector<std::string> streams = {
      preface.substr(0, 10),                               // Cut preface.
      "GET / HTTP/1.1\r\nHost: x\r\n\r\n",                 // Not HTTP/2.
      preface + frame(100, 4, 0, 0) + std::string(10, 0),  // Cut SETTINGS.
      preface + frame(0, 4, 0, 0) + frame(1000, 1, 4, 1) + "\x82\x86",
      preface + frame(0, 4, 0, 0) + frame(16, 0, 0, 1) + std::string(5, 0),
      preface + frame(0, 4, 0, 0) + frame(0xffffff, 0, 0, 1),  // Huge DATA.
      preface + std::string(4096, '\xff'),  // Garbage frames.
  };
  for (const std::string& bytes : streams) {
    const int fd = Connect(daemon_.socket());
    ASSERT_GE(fd, 0);
    Send(fd, bytes);
    shutdown(fd, SHUT_WR);
    char buf[4096];
    while (read(fd, buf, sizeof(buf)) > 0) {
    }
    close(fd);
    ++tried_;
  }
  EXPECT_EQ(State(), before_);

  // The fast lookup socket: a cut Hello, a bad magic, a Hello for a session
  // that does not exist.
  const std::string fast = daemon_.socket() + ".lookup";
  {
    const int fd = Connect(fast);
    Send(fd, Bytes(fastpath::Hello()).substr(0, 5));
    shutdown(fd, SHUT_WR);
    EXPECT_TRUE(ClosedByPeer(fd));
    close(fd);
    ++tried_;
  }
  {
    fastpath::Hello hello;
    hello.magic = 0xdeadbeef;
    hello.session_id = a_->session_id();
    const int fd = Connect(fast);
    Send(fd, Bytes(hello));
    EXPECT_TRUE(ClosedByPeer(fd));
    close(fd);
    ++tried_;
  }
  {
    fastpath::Hello hello;
    hello.session_id = 12345;
    const int fd = Connect(fast);
    Send(fd, Bytes(hello));
    fastpath::HelloReply reply;
    ASSERT_TRUE(fastpath::ReadFull(fd, &reply, sizeof(reply)));
    EXPECT_EQ(reply.code, static_cast<int>(absl::StatusCode::kNotFound));
    EXPECT_TRUE(ClosedByPeer(fd));
    close(fd);
    ++tried_;
  }
  // Requests on a good connection of session a.
  auto open = [&]() {
    fastpath::Hello hello;
    hello.session_id = a_->session_id();
    const int fd = Connect(fast);
    Send(fd, Bytes(hello));
    fastpath::HelloReply reply;
    EXPECT_TRUE(fastpath::ReadFull(fd, &reply, sizeof(reply)));
    EXPECT_EQ(reply.code, 0);
    return fd;
  };
  auto request = [&](uint32_t magic, uint64_t ns, uint32_t bytes) {
    fastpath::Request r;
    r.magic = magic;
    r.namespace_id = ns;
    r.hash_bytes = bytes;
    return Bytes(r);
  };
  struct Framing {
    std::string bytes;
    const char* what;
  };
  const std::vector<Framing> closes = {
      {request(0x1234, na_->id(), 32), "bad request magic"},
      {request(fastpath::kRequestMagic, na_->id(),
               fastpath::kMaxRequestBytes + 1),
       "hash_bytes over the limit"},
      {request(fastpath::kRequestMagic, na_->id(), 0xffffffffu),
       "hash_bytes 4 GiB"},
      {request(fastpath::kRequestMagic, na_->id(), 1 << 20) + "short",
       "truncated hashes"},
      {request(fastpath::kRequestMagic, na_->id(), 0).substr(0, 7),
       "truncated request"},
  };
  for (const Framing& f : closes) {
    const int fd = open();
    Send(fd, f.bytes);
    shutdown(fd, SHUT_WR);
    EXPECT_TRUE(ClosedByPeer(fd)) << f.what;
    close(fd);
    ++tried_;
  }
  // Well framed but wrong: answered with an error naming the field, and
  // the connection stays usable.
  struct Wrong {
    std::string bytes;
    absl::StatusCode code;
    const char* field;
  };
  const std::vector<Wrong> wrongs = {
      {request(fastpath::kRequestMagic, na_->id(), 33) + std::string(33, 'h'),
       absl::StatusCode::kInvalidArgument, "hashes"},
      {request(fastpath::kRequestMagic, 999999, 32) + std::string(32, 'h'),
       absl::StatusCode::kNotFound, "namespace_id"},
  };
  const int fd = open();
  for (const Wrong& w : wrongs) {
    Send(fd, w.bytes);
    fastpath::Reply reply;
    ASSERT_TRUE(fastpath::ReadFull(fd, &reply, sizeof(reply)));
    EXPECT_EQ(reply.code, static_cast<int>(w.code)) << w.field;
    std::string message(reply.message_bytes, '\0');
    ASSERT_TRUE(fastpath::ReadFull(fd, message.data(), message.size()));
    EXPECT_THAT(message, HasSubstr(w.field));
    ++tried_;
  }
  // Huge count: 1,048,576 hashes, the most one request may name (32 MiB,
  // the fast path's request cap), is read and answered (here: no such
  // namespace, so nothing changes). One more hash is a framing error that
  // closes the connection ("hash_bytes over the limit" above); over gRPC it
  // is INVALID_ARGUMENT (HugeCountsWrongIdsAndDoubleOperations).
  const uint32_t most = 1u << 20;
  Send(fd, request(fastpath::kRequestMagic, 999999, most * 32) +
               std::string(size_t{most} * 32, 'h'));
  fastpath::Reply reply;
  ASSERT_TRUE(fastpath::ReadFull(fd, &reply, sizeof(reply)));
  EXPECT_EQ(reply.code, static_cast<int>(absl::StatusCode::kNotFound));
  std::string message(reply.message_bytes, '\0');
  ASSERT_TRUE(fastpath::ReadFull(fd, message.data(), message.size()));
  EXPECT_THAT(message, HasSubstr("namespace_id"));
  ++tried_;
  close(fd);
  EXPECT_EQ(State(), before_);
}

TEST_F(HostileInputTest, HugeCountsWrongIdsAndDoubleOperations) {
  using Stub = v1::TierService::Stub;
  const grpc::StatusCode kInvalid = grpc::StatusCode::INVALID_ARGUMENT;
  const grpc::StatusCode kNotFound = grpc::StatusCode::NOT_FOUND;
  // Huge counts.
  {
    auto r = Req<v1::ReserveRequest>(*a_, *na_);
    r.set_pages(0xffffffffu);
    v1::ReserveResponse resp;
    ExpectRejected(Call(&Stub::Reserve, r, &resp), kInvalid, "pages");
    r.set_pages(1);
    r.set_snapshots(0xffffffffu);
    ExpectRejected(Call(&Stub::Reserve, r, &resp), kInvalid, "snapshots");
  }
  {
    auto l = Req<v1::LookupRequest>(*a_, *na_);
    l.set_hashes(std::string(size_t{(1u << 20) + 1} * 32, 'h'));
    v1::LookupResponse resp;
    ExpectRejected(Call(&Stub::Lookup, l, &resp), kInvalid, "hashes");
  }
  {
    auto c = Req<v1::CommitRequest>(*a_, *na_);
    c.set_reservation_id(res_a_.id());
    c.set_hashes(std::string(size_t{(1u << 20) + 1} * 32, 'h'));
    v1::CommitResponse resp;
    ExpectRejected(Call(&Stub::Commit, c, &resp), kInvalid, "hashes");
    for (int i = 0; i < 100000; ++i) {
      auto* p = c.add_snapshots();
      p->set_index(static_cast<uint32_t>(i));
    }
    c.set_hashes(hashes_.substr(0, 64));
    ExpectRejected(Call(&Stub::Commit, c, &resp), kInvalid, "snapshots[0]");
  }
  {
    v1::AttachRequest a;
    a.set_session_id(a_->session_id());
    a.set_namespace_("huge");
    auto* l = a.mutable_layout();
    l->set_model("m");
    l->set_tokens_per_page(16);
    l->set_num_layers(1);
    for (int i = 0; i < 100000; ++i) {
      auto* b = l->add_page_banks();
      b->set_name(absl::StrCat("b", i));
      b->set_row_bytes(16);
    }
    v1::AttachResponse resp;
    ExpectRejected(Call(&Stub::Attach, a, &resp), kInvalid, "page_banks");
    l->mutable_page_banks()->DeleteSubrange(1, 99999);
    a.mutable_capacity()->set_page_rows(1ull << 62);
    ExpectRejected(Call(&Stub::Attach, a, &resp), kInvalid, "capacity");
    a.mutable_capacity()->set_page_rows(16);
    l->set_tp_size(0xffffffffu);
    ExpectRejected(Call(&Stub::Attach, a, &resp), kInvalid, "tp_size");
  }
  {
    v1::ListPrefixesRequest lp;
    lp.set_namespace_("hostile");
    lp.set_limit(0xffffffffu);
    v1::ListPrefixesResponse resp;
    ExpectRejected(Call(&Stub::ListPrefixes, lp, &resp), kInvalid, "limit");
  }
  // Wrong ids: a lease id where a reservation id goes and back, ids of no
  // one, a namespace the session is not attached to.
  {
    auto c = Req<v1::CommitRequest>(*a_, *na_);
    c.set_reservation_id(lease_);
    c.set_hashes(hashes_.substr(0, 64));
    v1::CommitResponse resp;
    ExpectRejected(Call(&Stub::Commit, c, &resp), kNotFound, "reservation_id");
    auto r = Req<v1::ReleaseRequest>(*a_, *na_);
    r.set_lease_id(res_a_.id());
    v1::ReleaseResponse rresp;
    ExpectRejected(Call(&Stub::Release, r, &rresp), kNotFound, "lease_id");
    auto ab = Req<v1::AbortRequest>(*a_, *na_);
    ab.set_reservation_id(0xfffffffffffffull);
    v1::AbortResponse aresp;
    ExpectRejected(Call(&Stub::Abort, ab, &aresp), kNotFound, "reservation_id");
    ab.set_namespace_id(na_->id() + 1000);
    ExpectRejected(Call(&Stub::Abort, ab, &aresp), kNotFound, "namespace_id");
    ab.set_namespace_id(na_->id());
    ab.set_session_id(a_->session_id() ^ 1);
    ExpectRejected(Call(&Stub::Abort, ab, &aresp), kNotFound, "session_id");
    auto snap = Req<v1::CommitRequest>(*a_, *na_);
    snap.set_reservation_id(res_a_.id());
    snap.set_hashes(RandomLike(2));
    snap.add_snapshots()->set_index(0);  // The namespace has no snapshots.
    ExpectRejected(Call(&Stub::Commit, snap, &resp), kInvalid,
                   "snapshots[0].index");
    snap.clear_snapshots();
    snap.set_hashes(RandomLike(3));  // Three hashes for two rows.
    ExpectRejected(Call(&Stub::Commit, snap, &resp), kInvalid, "hashes");
  }
  // Another session's reservation and lease: neither b's commit, abort nor
  // release touches a's, and a's cannot touch b's.
  {
    auto c = Req<v1::CommitRequest>(*b_, *nb_);
    c.set_reservation_id(res_a_.id());
    c.set_hashes(RandomLike(2));
    v1::CommitResponse resp;
    ExpectRejected(Call(&Stub::Commit, c, &resp), kNotFound, "reservation_id");
    auto c2 = Req<v1::CommitRequest>(*a_, *na_);
    c2.set_reservation_id(res_b_.id());
    c2.set_hashes(RandomLike(2));
    ExpectRejected(Call(&Stub::Commit, c2, &resp), kNotFound, "reservation_id");
    auto ab = Req<v1::AbortRequest>(*b_, *nb_);
    ab.set_reservation_id(res_a_.id());
    v1::AbortResponse aresp;
    ExpectRejected(Call(&Stub::Abort, ab, &aresp), kNotFound, "reservation_id");
    auto r = Req<v1::ReleaseRequest>(*b_, *nb_);
    r.set_lease_id(lease_);
    v1::ReleaseResponse rresp;
    ExpectRejected(Call(&Stub::Release, r, &rresp), kNotFound, "lease_id");
  }
  // Double release, double abort, commit after abort, double commit: the
  // first succeeds, every repeat is NOT_FOUND and changes nothing.
  {
    auto r = Req<v1::ReleaseRequest>(*a_, *na_);
    r.set_lease_id(lease_);
    v1::ReleaseResponse rresp;
    ASSERT_TRUE(Call(&Stub::Release, r, &rresp).ok());
    before_ = State();
    ExpectRejected(Call(&Stub::Release, r, &rresp), kNotFound, "lease_id");

    const uint64_t id = res_a_.id();
    ASSERT_TRUE(res_a_.Abort().ok());
    before_ = State();
    auto ab = Req<v1::AbortRequest>(*a_, *na_);
    ab.set_reservation_id(id);
    v1::AbortResponse aresp;
    ExpectRejected(Call(&Stub::Abort, ab, &aresp), kNotFound, "reservation_id");
    auto c = Req<v1::CommitRequest>(*a_, *na_);
    c.set_reservation_id(id);
    c.set_hashes(RandomLike(2));
    v1::CommitResponse cresp;
    ExpectRejected(Call(&Stub::Commit, c, &cresp), kNotFound, "reservation_id");

    const uint64_t bid = res_b_.id();
    auto done = res_b_.Commit("", RandomLike(2));
    ASSERT_TRUE(done.ok()) << done.status();
    before_ = State();
    auto again = Req<v1::CommitRequest>(*b_, *nb_);
    again.set_reservation_id(bid);
    again.set_hashes(RandomLike(2));
    ExpectRejected(Call(&Stub::Commit, again, &cresp), kNotFound,
                   "reservation_id");
  }
}

}  // namespace
}  // namespace kvtier::testing
