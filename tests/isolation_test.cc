// Isolation against a real kvtierd and real users (issue 5, item 5).
//
// The test creates (if missing) the group `kvtier`, a team group and three
// users: A in kvtier and the team, B in kvtier only, C in neither. The
// daemon runs as root with --group=kvtier and an ACL that gives namespace
// "team" to the team group. Each actor is a child process that the test
// forks and turns into its user (initgroups, setgid, setuid) before it
// touches the daemon, so the daemon sees that user's SO_PEERCRED and the
// kernel applies that user's file permissions. Checked:
//   - sockets and segments are mode 0660 and group-owned (kvtier; "team"'s
//     segments by the team group);
//   - C can neither connect to the sockets nor open any segment;
//   - B reaches the daemon but cannot attach to "team" nor open its segments;
//   - a session that never bound its credentials cannot attach at all;
//   - A attaches, commits, and another process of A finds identical bytes;
//   - in a namespace two tenants share, identical prompts hash differently
//     under their salts: no cross-tenant hit, each finds only its own bytes.
//
// The test process itself never creates a gRPC object (forking a process
// that runs gRPC threads is unsafe), so every RPC happens in a child. Needs
// root (to create users and switch to them); skips otherwise. The users and
// groups are left in place for the next run.
//
// Thread-safety: single-threaded test.
#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "client/client.h"
#include "gmock/gmock.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "kvtier/v1/tier.grpc.pb.h"
#include "tests/daemon_process.h"
#include "tests/test_pattern.h"
#include "tests/test_users.h"

namespace kvtier::testing {
namespace {

using client::AttachOptions;
using client::Client;
using ::testing::HasSubstr;

constexpr char kGroup[] = "kvtier";
constexpr char kTeamGroup[] = "kvtier-iso-team";

// Notes `s` in the child's report and returns `code` (its exit code).
int Failed(std::string* out, const absl::Status& s, int code) {
  *out += s.ToString() + "\n";
  return code;
}

constexpr uint32_t kPages = 8;

// Attaches to `ns` with `salt`, commits kPages pages of `seed`'s tokens with
// `pattern_seed`'s bytes, prints the hash chain (hex).
int Commit(const std::string& socket, const std::string& ns,
           const std::string& salt, uint64_t pattern_seed, std::string* out) {
  auto client = Client::Connect({.socket = socket, .client_name = "iso"});
  if (!client.ok()) return Failed(out, client.status(), 10);
  AttachOptions o = TestAttachOptions(ns);
  o.tenant_salt = salt;
  auto n = (*client)->Attach(o);
  if (!n.ok()) return Failed(out, n.status(), 11);
  const std::string hashes =
      (*n)->hasher().HashChain(TestTokens(1, kPages * 16));
  auto res = (*n)->Reserve(kPages);
  if (!res.ok()) return Failed(out, res.status(), 12);
  for (uint32_t i = 0; i < kPages; ++i) {
    for (size_t b = 0; b < (*n)->page_banks().size(); ++b) {
      const auto& bank = (*n)->page_banks()[b];
      FillPattern(bank.base + uint64_t{res->page_rows()[i]} * bank.row_stride,
                  bank.row_bytes, pattern_seed, i, b);
    }
  }
  auto c = res->Commit("", hashes);
  if (!c.ok()) return Failed(out, c.status(), 13);
  *out += absl::StrCat("CHAIN ", absl::BytesToHexString(hashes), "\n");
  return 0;
}

// Attaches to `ns` with `salt` and looks the same prompt up (pinned):
// prints "MATCHED n" and, when n == kPages, whether the bytes are
// `pattern_seed`'s ("BYTES ok" / "BYTES differ").
int Find(const std::string& socket, const std::string& ns,
         const std::string& salt, uint64_t pattern_seed, std::string* out) {
  auto client = Client::Connect({.socket = socket, .client_name = "iso"});
  if (!client.ok()) return Failed(out, client.status(), 10);
  AttachOptions o = TestAttachOptions(ns);
  o.tenant_salt = salt;
  auto n = (*client)->Attach(o);
  if (!n.ok()) return Failed(out, n.status(), 11);
  const std::string hashes =
      (*n)->hasher().HashChain(TestTokens(1, kPages * 16));
  auto lease = (*n)->Lookup(hashes, /*pin=*/true);
  if (!lease.ok()) return Failed(out, lease.status(), 12);
  *out += absl::StrCat("MATCHED ", lease->matched_pages(), "\n");
  if (lease->matched_pages() == kPages) {
    bool same = true;
    for (uint32_t i = 0; i < kPages; ++i) {
      for (size_t b = 0; b < (*n)->page_banks().size(); ++b) {
        const auto& bank = (*n)->page_banks()[b];
        same &= CheckPattern(
            bank.base + uint64_t{lease->rows()[i]} * bank.row_stride,
            bank.row_bytes, pattern_seed, i, b);
      }
    }
    *out += same ? "BYTES ok\n" : "BYTES differ\n";
  }
  return 0;
}

std::string ChainOf(const std::string& output) {
  for (absl::string_view line : absl::StrSplit(output, '\n')) {
    if (absl::ConsumePrefix(&line, "CHAIN ")) return std::string(line);
  }
  return "";
}

class IsolationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const std::string why = CannotCreateUsers(); !why.empty()) {
      if (UsersRequired()) FAIL() << why << " (KVTIER_REQUIRE_USERS=1)";
      GTEST_SKIP() << why;
    }
    auto g = EnsureGroup(kGroup);
    ASSERT_TRUE(g.ok()) << g.status();
    group_ = *g;
    auto t = EnsureGroup(kTeamGroup);
    ASSERT_TRUE(t.ok()) << t.status();
    team_ = *t;
    auto a = EnsureUser("kvtier-iso-a", absl::StrCat(kGroup, ",", kTeamGroup));
    auto b = EnsureUser("kvtier-iso-b", kGroup);
    auto c = EnsureUser("kvtier-iso-c", "");
    ASSERT_TRUE(a.ok() && b.ok() && c.ok())
        << a.status() << b.status() << c.status();
    a_ = *a;
    b_ = *b;
    c_ = *c;
    ASSERT_TRUE(
        daemon_
            .Start({absl::StrCat("--group=", kGroup),
                    absl::StrCat("--namespace_acl=team=group:", kTeamGroup)})
            .ok());
    // Only the files' own modes guard them: the folders are open to all.
    ASSERT_EQ(chmod(daemon_.dir().c_str(), 0755), 0);
    ASSERT_EQ(chmod(daemon_.shm_dir().c_str(), 0755), 0);
  }

  // Segment files of namespace `ns` in the daemon's shm dir.
  std::vector<std::string> Segments(const std::string& ns) {
    std::vector<std::string> out;
    for (const auto& e :
         std::filesystem::directory_iterator(daemon_.shm_dir())) {
      const std::string name = e.path().filename().string();
      if (name.rfind("kvtier." + ns + ".", 0) == 0) {
        out.push_back(e.path().string());
      }
    }
    return out;
  }

  DaemonProcess daemon_;
  gid_t group_ = 0, team_ = 0;
  User a_, b_, c_;
};

TEST_F(IsolationTest, OtherUsersCanNeitherAttachNorMapSegments) {
  const std::string sock = daemon_.socket();
  // A creates the team namespace and commits into it.
  Outcome wrote = RunAs(
      &a_, [&](std::string* out) { return Commit(sock, "team", "", 7, out); });
  ASSERT_EQ(wrote.code, 0) << wrote.output;
  const std::vector<std::string> team_segs = Segments("team");
  ASSERT_EQ(team_segs.size(), 2u);  // kv and scale.

  // Modes and owners.
  for (const std::string& path : {sock, sock + ".lookup"}) {
    struct stat st;
    ASSERT_EQ(stat(path.c_str(), &st), 0) << path;
    EXPECT_TRUE(S_ISSOCK(st.st_mode)) << path;
    EXPECT_EQ(st.st_mode & 0777, 0660u) << path;
    EXPECT_EQ(st.st_gid, group_) << path;
  }
  for (const std::string& path : team_segs) {
    struct stat st;
    ASSERT_EQ(stat(path.c_str(), &st), 0) << path;
    EXPECT_EQ(st.st_mode & 0777, 0660u) << path;
    EXPECT_EQ(st.st_gid, team_) << path;
  }

  // C, in no group: no socket, no segment.
  Outcome c = RunAs(&c_, [&](std::string* out) {
    int bad = 0;
    for (const std::string& path : {sock, sock + ".lookup"}) {
      const int err = ConnectErrno(path);
      *out += absl::StrCat("connect ", path, ": ", strerror(err), "\n");
      if (err != EACCES) ++bad;
    }
    for (const std::string& path : team_segs) {
      const int err = OpenErrno(path);
      *out += absl::StrCat("open ", path, ": ", strerror(err), "\n");
      if (err != EACCES) ++bad;
    }
    auto client =
        Client::Connect({.socket = sock, .timeout = absl::Seconds(1)});
    *out += "Client::Connect: " + client.status().ToString() + "\n";
    if (client.ok()) ++bad;
    return bad;
  });
  EXPECT_EQ(c.code, 0) << c.output;

  // B, in kvtier but not the team: reaches the daemon, is refused at
  // attach, and cannot open the team's segments.
  Outcome b = RunAs(&b_, [&](std::string* out) {
    int bad = 0;
    if (ConnectErrno(sock) != 0) ++bad;
    for (const std::string& path : team_segs) {
      const int err = OpenErrno(path);
      *out += absl::StrCat("open ", path, ": ", strerror(err), "\n");
      if (err != EACCES) ++bad;
    }
    auto client = Client::Connect({.socket = sock, .client_name = "b"});
    if (!client.ok()) return Failed(out, client.status(), 50);
    auto ns = (*client)->Attach(TestAttachOptions("team"));
    *out += "Attach(team): " + ns.status().ToString() + "\n";
    if (ns.status().code() != absl::StatusCode::kPermissionDenied) ++bad;
    // A namespace nobody restricted is open to B.
    if (!(*client)->Attach(TestAttachOptions("b-own")).ok()) ++bad;
    return bad;
  });
  EXPECT_EQ(b.code, 0) << b.output;
  EXPECT_THAT(b.output, HasSubstr("may not attach to namespace 'team'"));

  // A session that never bound its credentials (no fast lookup Hello)
  // cannot attach, even as root.
  Outcome unbound = RunAs(nullptr, [&](std::string* out) {
    auto channel =
        grpc::CreateChannel("unix:" + sock, grpc::InsecureChannelCredentials());
    auto stub = v1::TierService::NewStub(channel);
    grpc::ClientContext sctx;
    auto stream = stub->Session(&sctx);
    v1::SessionRequest hello;
    hello.mutable_hello()->set_client_name("unbound");
    v1::SessionEvent opened;
    if (!stream->Write(hello) || !stream->Read(&opened)) return 60;
    v1::AttachRequest req;
    req.set_session_id(opened.opened().session_id());
    req.set_namespace_("root-ns");
    auto* l = req.mutable_layout();
    l->set_model("m");
    l->set_tokens_per_page(16);
    l->set_num_layers(1);
    l->add_page_banks()->set_name("kv");
    l->mutable_page_banks(0)->set_row_bytes(4096);
    req.mutable_capacity()->set_page_rows(8);
    v1::AttachResponse resp;
    grpc::ClientContext ctx;
    grpc::Status s = stub->Attach(&ctx, req, &resp);
    *out +=
        absl::StrCat("Attach: ", s.error_code(), " ", s.error_message(), "\n");
    sctx.TryCancel();
    return s.error_code() == grpc::StatusCode::FAILED_PRECONDITION ? 0 : 61;
  });
  EXPECT_EQ(unbound.code, 0) << unbound.output;
  EXPECT_THAT(unbound.output, HasSubstr("peer credentials"));

  // Another process of A finds the team's bytes.
  Outcome found = RunAs(
      &a_, [&](std::string* out) { return Find(sock, "team", "", 7, out); });
  EXPECT_EQ(found.code, 0) << found.output;
  EXPECT_THAT(found.output, HasSubstr("MATCHED 8\nBYTES ok"));
}

// Rights (issue 14, item 2): B, in the socket's group but not the team's,
// can neither drop nor list the team's namespace, nor see it in Stats, nor
// reach the operator socket; A, who may attach to it, may list it; the
// operator socket (root here, or --admin_group) may do everything.
TEST_F(IsolationTest, GroupMembersCannotDropOrListWhatTheyMayNotAttach) {
  const std::string sock = daemon_.socket();
  const std::string admin = daemon_.admin_socket();
  Outcome wrote = RunAs(
      &a_, [&](std::string* out) { return Commit(sock, "team", "", 9, out); });
  ASSERT_EQ(wrote.code, 0) << wrote.output;
  const std::string chain = absl::HexStringToBytes(ChainOf(wrote.output));
  ASSERT_FALSE(chain.empty());
  const std::string leaf = chain.substr(chain.size() - 32);

  // Runs `body` with a raw stub on `socket` and a bound session of this
  // user (a kvtier::client::Client's).
  auto with_session =
      [](const std::string& socket, const std::string& engine, std::string* out,
         const std::function<int(v1::TierService::Stub&, Client&)>& body) {
        auto client =
            Client::Connect({.socket = engine, .client_name = "rights"});
        if (!client.ok()) return Failed(out, client.status(), 70);
        auto stub = v1::TierService::NewStub(grpc::CreateChannel(
            "unix:" + socket, grpc::InsecureChannelCredentials()));
        return body(*stub, **client);
      };

  Outcome b = RunAs(&b_, [&](std::string* out) {
    return with_session(
        sock, sock, out, [&](v1::TierService::Stub& stub, Client& client) {
          int bad = 0;
          // Drop through libkvtier (its session's credentials).
          auto dropped = client.Drop("team", "", /*force=*/true);
          *out += "Drop(team): " + dropped.status().ToString() + "\n";
          if (dropped.status().code() != absl::StatusCode::kPermissionDenied) {
            ++bad;
          }
          // Testing whether a guessed prompt is cached: ListPrefixes.
          v1::ListPrefixesRequest lp;
          lp.set_namespace_("team");
          lp.set_session_id(client.session_id());
          v1::ListPrefixesResponse lpr;
          grpc::ClientContext c1;
          grpc::Status listed = stub.ListPrefixes(&c1, lp, &lpr);
          *out += absl::StrCat("ListPrefixes(team): ", listed.error_code(), " ",
                               listed.error_message(), "\n");
          if (listed.error_code() != grpc::StatusCode::PERMISSION_DENIED) ++bad;
          // Stats and ListNamespaces do not show it.
          v1::StatsRequest st;
          st.set_session_id(client.session_id());
          v1::StatsResponse str;
          grpc::ClientContext c2;
          if (!stub.Stats(&c2, st, &str).ok()) ++bad;
          for (const auto& ns : str.namespaces()) {
            if (ns.name() == "team") {
              *out += "Stats shows team\n";
              ++bad;
            }
          }
          // Verify is an operator's; the operator socket is out of reach.
          v1::VerifyResponse vr;
          grpc::ClientContext c3;
          if (stub.Verify(&c3, {}, &vr).error_code() !=
              grpc::StatusCode::PERMISSION_DENIED) {
            ++bad;
          }
          const int err = ConnectErrno(admin);
          *out += absl::StrCat("connect ", admin, ": ", strerror(err), "\n");
          if (err != EACCES) ++bad;
          return bad;
        });
  });
  EXPECT_EQ(b.code, 0) << b.output;
  EXPECT_THAT(b.output, HasSubstr("lacks the right to drop namespace 'team'"));
  EXPECT_THAT(b.output, HasSubstr("lacks the right to list namespace 'team'"));

  // A may list the team's prefixes (and sees them in Stats).
  Outcome a = RunAs(&a_, [&](std::string* out) {
    return with_session(
        sock, sock, out, [&](v1::TierService::Stub& stub, Client& client) {
          v1::ListPrefixesRequest lp;
          lp.set_namespace_("team");
          lp.set_session_id(client.session_id());
          v1::ListPrefixesResponse lpr;
          grpc::ClientContext c1;
          grpc::Status listed = stub.ListPrefixes(&c1, lp, &lpr);
          *out += absl::StrCat("ListPrefixes: ", listed.error_message(), " ",
                               lpr.total_prefixes(), "\n");
          return listed.ok() && lpr.total_prefixes() >= 1 ? 0 : 1;
        });
  });
  EXPECT_EQ(a.code, 0) << a.output;

  // The operator socket: the team's prefixes are there, and Drop works.
  Outcome op = RunAs(nullptr, [&](std::string* out) {
    auto stub = v1::TierService::NewStub(grpc::CreateChannel(
        "unix:" + admin, grpc::InsecureChannelCredentials()));
    v1::ListPrefixesRequest lp;
    lp.set_namespace_("team");
    v1::ListPrefixesResponse lpr;
    grpc::ClientContext c1;
    if (!stub->ListPrefixes(&c1, lp, &lpr).ok()) return 80;
    bool found = false;
    for (const auto& p : lpr.prefixes()) found |= p.leaf_hash() == leaf;
    if (!found) return 81;
    v1::VerifyResponse vr;
    grpc::ClientContext c2;
    if (!stub->Verify(&c2, {}, &vr).ok() || !vr.ok()) return 82;
    v1::DropRequest d;
    d.set_namespace_("team");
    d.set_force(true);
    v1::DropResponse dr;
    grpc::ClientContext c3;
    grpc::Status s = stub->Drop(&c3, d, &dr);
    *out += absl::StrCat("Drop: ", s.error_message(), "\n");
    return s.ok() ? 0 : 83;
  });
  EXPECT_EQ(op.code, 0) << op.output;
}

TEST_F(IsolationTest, TenantSaltsKeepIdenticalPromptsApart) {
  const std::string sock = daemon_.socket();
  Outcome a = RunAs(&a_, [&](std::string* out) {
    return Commit(sock, "shared", "tenant-a", 100, out);
  });
  ASSERT_EQ(a.code, 0) << a.output;
  // B's tenant, same prompt: a miss, never A's rows.
  Outcome b_miss = RunAs(&b_, [&](std::string* out) {
    return Find(sock, "shared", "tenant-b", 200, out);
  });
  ASSERT_EQ(b_miss.code, 0) << b_miss.output;
  EXPECT_THAT(b_miss.output, HasSubstr("MATCHED 0\n"));
  Outcome b = RunAs(&b_, [&](std::string* out) {
    return Commit(sock, "shared", "tenant-b", 200, out);
  });
  ASSERT_EQ(b.code, 0) << b.output;
  ASSERT_FALSE(ChainOf(a.output).empty());
  EXPECT_NE(ChainOf(a.output), ChainOf(b.output))
      << "same tokens, different salts must hash differently";
  // Each tenant finds exactly its own bytes.
  Outcome a_find = RunAs(&a_, [&](std::string* out) {
    return Find(sock, "shared", "tenant-a", 100, out);
  });
  EXPECT_EQ(a_find.code, 0) << a_find.output;
  EXPECT_THAT(a_find.output, HasSubstr("MATCHED 8\nBYTES ok"));
  Outcome b_find = RunAs(&b_, [&](std::string* out) {
    return Find(sock, "shared", "tenant-b", 200, out);
  });
  EXPECT_EQ(b_find.code, 0) << b_find.output;
  EXPECT_THAT(b_find.output, HasSubstr("MATCHED 8\nBYTES ok"));
  // The shared namespace's segments belong to the daemon's group.
  for (const std::string& path : Segments("shared")) {
    struct stat st;
    ASSERT_EQ(stat(path.c_str(), &st), 0);
    EXPECT_EQ(st.st_gid, group_) << path;
    EXPECT_EQ(st.st_mode & 0777, 0660u) << path;
  }
}

}  // namespace
}  // namespace kvtier::testing
