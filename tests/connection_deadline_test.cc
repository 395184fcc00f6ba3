// The engine socket's deadlines against a real kvtierd (issue 27, item 5):
// a served call connection that sends nothing is closed once it has been
// idle for --fast_lookup_idle_timeout_ms (the client dials again on its next
// call); a frame must arrive whole, however steadily its bytes trickle: an
// Open's v1.Hello within --fast_lookup_hello_deadline_ms of the connect, a
// call's header and payload within --fast_lookup_frame_deadline_ms of its
// first byte. A session connection is never idle-closed (the session lives
// as long as it). Before, a served connection blocked its thread in read()
// forever and each read had its own timeout, so one byte a second held an
// Open, and one byte at any pace a call, for as long as the peer liked.
//
// The flags are small; each wait is a bounded loop of 100 ms polls that
// fails when the daemon never closes the connection. No duration is
// asserted.
//
// Thread-safety: single-threaded tests.
#include <unistd.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "common/fast_lookup.h"
#include "gtest/gtest.h"
#include "tests/daemon_process.h"
#include "tests/raw_sockets.h"

namespace kvtier::testing {
namespace {

// Polls a connection the daemon should close: 600 x 100 ms at most.
constexpr int kPolls = 600;

TEST(ConnectionDeadlineTest, IdleCallConnectionIsClosedAndSessionIsKept) {
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.Start({"--fast_lookup_idle_timeout_ms=200"}).ok());
  const std::string lookup = daemon.socket() + ".lookup";
  RawSession session = OpenRawSession(lookup, "idle");
  ASSERT_TRUE(session.answered);
  ASSERT_EQ(session.reply.code, 0) << session.message;
  const int calls = RawCallConnection(lookup, session.reply.session_id);
  ASSERT_GE(calls, 0);

  EXPECT_TRUE(ClosedWithinPolls(calls, kPolls))
      << "an idle call connection was still open after " << kPolls
      << " polls (--fast_lookup_idle_timeout_ms=200)";
  // Sessions stay: an engine between requests holds its session
  // connection silent for as long as it runs.
  EXPECT_FALSE(PeerClosed(session.fd, 0));
  // And the session still answers on a new call connection.
  const int again = RawCallConnection(lookup, session.reply.session_id);
  EXPECT_GE(again, 0);
  if (again >= 0) ::close(again);
  ::close(calls);
  ::close(session.fd);
}

TEST(ConnectionDeadlineTest, TrickledFramesAreClosed) {
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.Start({"--fast_lookup_frame_deadline_ms=300"}).ok());
  const std::string lookup = daemon.socket() + ".lookup";

  // An Open whose v1.Hello comes a byte per poll
  // (--fast_lookup_hello_deadline_ms keeps its default, 1 s: before, each byte
  // restarted it).
  const int open = DialUnix(lookup);
  ASSERT_GE(open, 0);
  fastpath::Open header;
  header.hello_bytes = 60000;
  ASSERT_TRUE(SendAll(open, &header, sizeof(header)));

  // A call whose header and payload come a byte per poll on a bound call
  // connection.
  RawSession session = OpenRawSession(lookup, "trickle");
  ASSERT_TRUE(session.answered);
  ASSERT_EQ(session.reply.code, 0) << session.message;
  const int calls = RawCallConnection(lookup, session.reply.session_id);
  ASSERT_GE(calls, 0);
  fastpath::Call call;
  call.method = static_cast<uint32_t>(fastpath::Method::kReserve);
  call.payload_bytes = 60000;
  std::string frame(reinterpret_cast<const char*>(&call), sizeof(call));
  frame += std::string(call.payload_bytes, '\0');

  bool open_closed = false;
  bool call_closed = false;
  for (size_t i = 0; i < kPolls && !(open_closed && call_closed); ++i) {
    const char zero = 0;
    open_closed =
        open_closed || !SendAll(open, &zero, 1) || PeerClosed(open, 50);
    call_closed =
        call_closed || !SendAll(calls, &frame[i], 1) || PeerClosed(calls, 50);
  }
  EXPECT_TRUE(open_closed) << "an Open trickled a byte per poll was still "
                              "open after "
                           << kPolls << " bytes";
  EXPECT_TRUE(call_closed) << "a call trickled a byte per poll was still "
                              "open after "
                           << kPolls << " bytes";
  // The session itself is untouched.
  EXPECT_FALSE(PeerClosed(session.fd, 0));
  ::close(open);
  ::close(calls);
  ::close(session.fd);
}

}  // namespace
}  // namespace kvtier::testing
