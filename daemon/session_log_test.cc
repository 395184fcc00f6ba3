// A session id is the capability of every RPC of its session: the daemon's
// logs, at every level, name sessions by a short tag (SessionTag), never by
// the whole id. Drives a session through open, credential binding, attach
// and close with spdlog capturing everything at trace level.
#include <filesystem>
#include <memory>
#include <sstream>
#include <string>

#include "absl/strings/str_format.h"
#include "daemon/tier_core.h"
#include "daemon/tier_namespace.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "spdlog/sinks/ostream_sink.h"
#include "spdlog/spdlog.h"

namespace kvtier::daemon {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(SessionLog, SessionIdsAreNeverLoggedInFull) {
  char tmpl[] = "/dev/shm/kvtier-session-log-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  std::ostringstream captured;
  auto previous = spdlog::default_logger();
  auto logger = std::make_shared<spdlog::logger>(
      "capture", std::make_shared<spdlog::sinks::ostream_sink_mt>(captured));
  logger->set_level(spdlog::level::trace);
  spdlog::set_default_logger(logger);
  uint64_t id = 0;
  {
    TierOptions o;
    o.segments.shm_dir = dir;
    o.segments.huge_pages = shm::HugePagePolicy::kOff;
    TierCore core(o);
    v1::Hello hello;
    hello.set_client_name("logged");
    auto opened = core.OpenSession(hello, PeerInfo{});
    ASSERT_TRUE(opened.ok());
    id = *opened;
    PeerInfo peer;
    peer.pid = getpid();
    peer.uid = getuid();
    peer.gid = getgid();
    peer.verified = true;
    ASSERT_TRUE(core.BindPeerCredentials(id, peer).ok());
    v1::AttachRequest req;
    req.set_session_id(id);
    req.set_namespace_("logged");
    auto* l = req.mutable_layout();
    l->set_model("m");
    l->set_tokens_per_page(16);
    l->set_num_layers(1);
    l->add_page_banks()->set_name("kv");
    l->mutable_page_banks(0)->set_row_bytes(1024);
    req.mutable_capacity()->set_page_rows(8);
    v1::AttachResponse resp;
    ASSERT_TRUE(core.Attach(req, &resp).ok());
    core.CloseSession(id);
  }
  spdlog::set_default_logger(previous);
  std::filesystem::remove_all(dir);
  const std::string log = captured.str();
  // The log did talk about the session, by its tag.
  EXPECT_THAT(log, HasSubstr("session " + SessionTag(id) + " opened"));
  EXPECT_THAT(log, HasSubstr("session " + SessionTag(id) + " attached"));
  for (const std::string& full :
       {absl::StrFormat("%016x", id), absl::StrFormat("%x", id),
        absl::StrFormat("%d", id)}) {
    EXPECT_THAT(log, Not(HasSubstr(full))) << "the whole id is in:\n" << log;
  }
}

}  // namespace
}  // namespace kvtier::daemon
