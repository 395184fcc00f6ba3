// libFuzzer harness over the fast lookup path's framing parser
// (daemon/fast_lookup_server.cc), end to end through a real unix socket.
//
// A FastLookupServer over a TierCore with one namespace (a few committed
// prefixes) serves a socket in a private folder. Each input opens a session,
// connects, and sends the input's bytes — after a valid Hello for that
// session when the first byte says so, else raw, so both the Hello and the
// request framing (magic, flags, namespace id, hash_bytes, the hashes) are
// fuzzed (raw bytes may also be an Open, which opens a session of its own,
// or call frames); or, as the first byte also may say, requests built from
// the input for the real namespace, so lookups hit and pin, or call frames
// with raw protobuf requests — then half-closes and reads until the server
// closes. The session
// is closed afterwards, releasing any pins the input took.
//
// Oracles, beyond ASan/UBSan: the server closes every connection once its
// input ends (a hang is a libFuzzer timeout); CheckInvariants holds after
// every input.
//
// Thread-safety: libFuzzer calls LLVMFuzzerTestOneInput from one thread;
// the server's threads are its own.
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>

#include "common/fast_lookup.h"
#include "daemon/fast_lookup_server.h"
#include "daemon/tier_core.h"
#include "spdlog/spdlog.h"

namespace kvtier::daemon {
namespace {

struct World {
  std::string dir;
  std::string socket;
  std::unique_ptr<TierCore> core;
  std::unique_ptr<FastLookupServer> server;
  uint64_t namespace_id = 0;
};

World* g_world = nullptr;

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "fast_lookup_fuzzer: %s\n", what.c_str());
  std::abort();
}

void Check(const absl::Status& s, const char* what) {
  if (!s.ok()) Fail(std::string(what) + ": " + s.ToString());
}

void Setup() {
  auto* w = new World;
  char tmpl[] = "/dev/shm/kvtier-fuzz-fast-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) Fail("mkdtemp");
  w->dir = tmpl;
  w->socket = w->dir + "/kvtierd.sock.lookup";
  TierOptions o;
  o.segments.shm_dir = w->dir;
  o.segments.huge_pages = shm::HugePagePolicy::kOff;
  o.segments.populate = false;
  o.default_namespace_bytes = 64 << 10;
  w->core = std::make_unique<TierCore>(o);
  v1::Layout l;
  l.set_model("fuzz");
  l.set_tokens_per_page(16);
  l.set_num_layers(1);
  l.add_page_banks()->set_name("kv");
  l.mutable_page_banks(0)->set_row_bytes(64);
  l.set_snapshot_row_bytes(64);
  auto session = w->core->OpenSession(v1::Hello(), PeerInfo{});
  Check(session.status(), "open");
  v1::AttachRequest attach;
  attach.set_session_id(*session);
  attach.set_namespace_("fast");
  *attach.mutable_layout() = l;
  attach.mutable_capacity()->set_page_rows(64);
  attach.mutable_capacity()->set_snapshot_rows(8);
  v1::AttachResponse resp;
  Check(w->core->Attach(attach, &resp), "attach");
  w->namespace_id = resp.namespace_id();
  // Prefixes whose hashes are 32 copies of 'a'..'d' with the page index in
  // the last byte, so a fuzzer that learns the pattern gets hits.
  for (char c = 'a'; c <= 'd'; ++c) {
    v1::ReserveRequest rr;
    rr.set_session_id(*session);
    rr.set_namespace_id(w->namespace_id);
    rr.set_pages(4);
    rr.set_snapshots(1);
    v1::ReserveResponse rresp;
    Check(w->core->Reserve(rr, &rresp), "reserve");
    v1::CommitRequest cr;
    cr.set_session_id(*session);
    cr.set_namespace_id(w->namespace_id);
    cr.set_reservation_id(rresp.reservation_id());
    std::string hashes;
    for (int i = 0; i < 4; ++i) {
      std::string h(32, c);
      h[31] = static_cast<char>(i);
      hashes += h;
    }
    cr.set_hashes(hashes);
    auto* p = cr.add_snapshots();
    p->set_index(0);
    p->set_hash(hashes.substr(64, 32));
    v1::CommitResponse cresp;
    Check(w->core->Commit(cr, &cresp), "commit");
  }
  w->core->CloseSession(*session);
  w->server = std::make_unique<FastLookupServer>(w->core.get());
  Check(w->server->Start(w->socket), "start");
  g_world = w;
}

}  // namespace
}  // namespace kvtier::daemon

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  spdlog::set_level(spdlog::level::off);
  kvtier::daemon::Setup();
  std::atexit([] {
    auto* w = kvtier::daemon::g_world;
    w->server->Stop();
    std::error_code ec;
    std::filesystem::remove_all(w->dir, ec);
  });
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvtier;  // NOLINT: harness entry point.
  daemon::World& w = *daemon::g_world;
  auto session = w.core->OpenSession(v1::Hello(), daemon::PeerInfo{});
  daemon::Check(session.status(), "open");
  v1::AttachRequest attach;
  attach.set_session_id(*session);
  attach.set_namespace_("fast");
  v1::StatsResponse stats;
  // Attach with the namespace's own layout (from Stats).
  daemon::Check(w.core->Stats({}, &stats), "stats");
  *attach.mutable_layout() = stats.namespaces(0).layout();
  v1::AttachResponse resp;
  daemon::Check(w.core->Attach(attach, &resp), "attach");

  std::string bytes;
  if (size > 0 && (data[0] & 1) != 0) {
    fastpath::Hello hello;
    hello.session_id = *session;
    bytes.assign(reinterpret_cast<const char*>(&hello), sizeof(hello));
    if ((data[0] & 6) == 6) {
      // Structured calls: (method, n, n bytes of request) each, the method
      // mostly one the daemon knows, the request raw protobuf.
      size_t i = 1;
      while (i + 2 <= size) {
        const uint32_t method = data[i] % (fastpath::kLastMethod + 2);
        const size_t n = std::min<size_t>(data[i + 1], size - i - 2);
        i += 2;
        fastpath::Call call;
        call.method = method;
        call.payload_bytes = static_cast<uint32_t>(n);
        bytes.append(reinterpret_cast<const char*>(&call), sizeof(call));
        bytes.append(reinterpret_cast<const char*>(data) + i, n);
        i += n;
      }
    } else if ((data[0] & 2) != 0) {
      // Structured: the fuzzer cannot guess the namespace id or a chain's
      // hashes byte by byte, so the rest is a list of requests, each
      // (flags, n, n symbols): flags bit 0 pins, bit 1 cuts the hashes
      // short, bit 2 uses a wrong namespace id; symbol s at page k is the
      // hash 32 x ('a' + s % 5) with k in its last byte, so chains of one
      // letter 'a'..'d' hit the committed prefixes.
      size_t i = 1;
      while (i + 2 <= size) {
        const uint8_t flags = data[i], n = data[i + 1] % 16;
        i += 2;
        std::string hashes;
        for (uint8_t k = 0; k < n && i < size; ++k, ++i) {
          std::string h(32, static_cast<char>('a' + data[i] % 5));
          h[31] = static_cast<char>(k);
          hashes += h;
        }
        if ((flags & 2) != 0 && !hashes.empty()) hashes.pop_back();
        fastpath::Request req;
        req.flags = flags & 1;
        req.namespace_id = (flags & 4) != 0 ? flags : w.namespace_id;
        req.hash_bytes = static_cast<uint32_t>(hashes.size());
        bytes.append(reinterpret_cast<const char*>(&req), sizeof(req));
        bytes += hashes;
      }
    } else {
      bytes.append(reinterpret_cast<const char*>(data) + 1, size - 1);
    }
  } else {
    bytes.assign(reinterpret_cast<const char*>(data), size);
  }

  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, w.socket.c_str(), sizeof(addr.sun_path) - 1);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    daemon::Fail("connect");
  }
  iovec iov{bytes.data(), bytes.size()};
  // A write may fail once the server closed on a framing error: fine.
  (void)fastpath::WriteFullV(fd, &iov, 1);
  ::shutdown(fd, SHUT_WR);
  char buf[4096];
  while (::read(fd, buf, sizeof(buf)) > 0) {
  }
  ::close(fd);
  w.core->CloseSession(*session);
  daemon::Check(w.core->CheckInvariants(), "invariants");
  return 0;
}
