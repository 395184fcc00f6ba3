// libFuzzer harness over the daemon's request handlers (TierCore).
//
// One input is a program of up to kMaxSteps operations against a fresh
// TierCore: open and close sessions, bind peer credentials, attach, lookup
// (gRPC and fast-path entry points), reserve, commit, abort, release, drop,
// and the operator RPCs. Each operation takes its request either
// structurally (ids picked from the sessions, namespaces, reservations and
// leases the program created, hashes from a small alphabet so chains hit)
// or as a kvtier.v1 message parsed from raw fuzz bytes, with its ids
// sometimes replaced by live ones so parsed messages reach deep code.
//
// Oracles, beyond ASan/UBSan: after every operation CheckInvariants holds
// (each row free, reserved or committed, never two; reservations and leases
// of live sessions only); an operation that returns an error leaves the
// observable state (Stats without the clock) unchanged, a Reserve failing
// with RESOURCE_EXHAUSTED included (it is refused before anything is
// evicted, PrefixIndex::AllocateRows). A violation aborts.
//
// Banks live in a private temporary folder, are small and unpopulated; the
// namespace count and budgets are capped so no input can exhaust memory.
//
// Thread-safety: libFuzzer calls LLVMFuzzerTestOneInput from one thread.
#include <fuzzer/FuzzedDataProvider.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "daemon/tier_core.h"
#include "google/protobuf/stubs/logging.h"
#include "spdlog/spdlog.h"

namespace kvtier::daemon {
namespace {

constexpr int kMaxSteps = 48;
constexpr int kHashAlphabet = 6;

std::string* g_dir = nullptr;

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "tier_core_fuzzer: %s\n", what.c_str());
  std::abort();
}

v1::Layout MakeLayout(FuzzedDataProvider& in) {
  v1::Layout l;
  l.set_model("fuzz");
  l.set_tokens_per_page(16);
  l.set_num_layers(2);
  auto* kv = l.add_page_banks();
  kv->set_name("kv");
  kv->set_row_bytes(256);
  switch (in.ConsumeIntegralInRange<int>(0, 5)) {
    case 0:
      break;
    case 1: {  // fp8-style side bank.
      auto* s = l.add_page_banks();
      s->set_name("scale");
      s->set_row_bytes(40);
      break;
    }
    case 2:  // Hybrid.
      l.set_snapshot_row_bytes(128);
      break;
    case 3:  // TP group.
      l.set_tp_size(2);
      break;
    case 4:  // Replicated TP group, hybrid.
      l.set_tp_size(2);
      l.set_replicated(true);
      l.set_snapshot_row_bytes(64);
      break;
    case 5:  // 16-byte hashes.
      l.set_hash_kind(v1::HASH_KIND_XXH3_128);
      break;
  }
  return l;
}

class Program {
 public:
  Program(TierCore* core, FuzzedDataProvider* in) : core_(*core), in_(*in) {}

  void Run() {
    Prelude();
    for (int step = 0; step < kMaxSteps && in_.remaining_bytes() > 0; ++step) {
      const std::string before = State();
      const int op = in_.ConsumeIntegralInRange<int>(0, 15);
      absl::Status s = Step(op);
      // A reservation the bank cannot hold is refused before anything is
      // evicted (PrefixIndex::AllocateRows): every error changes nothing.
      if (!s.ok() && State() != before) {
        Fail("op " + std::to_string(op) + " failed (" + s.ToString() +
             ") yet changed the state");
      }
      if (absl::Status inv = core_.CheckInvariants(); !inv.ok()) {
        Fail("after op " + std::to_string(op) + ": " + inv.ToString());
      }
    }
    for (uint64_t s : sessions_) core_.CloseSession(s);
    if (absl::Status inv = core_.CheckInvariants(); !inv.ok()) {
      Fail("after closing every session: " + inv.ToString());
    }
    v1::StatsResponse stats;
    (void)core_.Stats({}, &stats);
    for (const auto& ns : stats.namespaces()) {
      if (ns.leases() != 0 || ns.reservations() != 0) {
        Fail("closed sessions left leases or reservations");
      }
      for (const auto& b : ns.banks()) {
        if (b.reserved_rows() != 0) Fail("closed sessions left reserved rows");
      }
      v1::DropRequest drop;
      drop.set_namespace_(ns.name());
      drop.set_force(true);
      v1::DropResponse resp;
      if (!core_.Drop(drop, &resp).ok()) Fail("cannot drop " + ns.name());
    }
  }

 private:
  struct Res {
    uint64_t session, ns, id;
    uint32_t pages, snapshots;
  };
  struct LeaseRef {
    uint64_t session, ns, id;
  };
  struct Ns {
    uint64_t id;
    uint32_t hash_bytes;
  };

  // Two bound sessions (uids 0 and 1) attached to namespace "a", whose
  // layout the input picks, and one committed prefix: every program starts
  // where the interesting code is.
  void Prelude() {
    const v1::Layout layout = MakeLayout(in_);
    for (uint32_t i = 0; i < 2; ++i) {
      auto id = core_.OpenSession(v1::Hello(), PeerInfo{});
      if (!id.ok()) Fail("prelude open: " + id.status().ToString());
      PeerInfo peer;
      peer.uid = i;
      peer.gid = i;
      peer.verified = true;
      if (absl::Status s = core_.BindPeerCredentials(*id, peer); !s.ok()) {
        Fail("prelude bind: " + s.ToString());
      }
      sessions_.push_back(*id);
      v1::AttachRequest req;
      req.set_session_id(*id);
      req.set_namespace_("a");
      *req.mutable_layout() = layout;
      req.set_tp_rank(layout.tp_size() > 1 ? i : 0);
      req.mutable_capacity()->set_page_rows(12);
      if (layout.snapshot_row_bytes() > 0) {
        req.mutable_capacity()->set_snapshot_rows(3);
      }
      if (absl::Status s = AttachWith(req); !s.ok()) {
        Fail("prelude attach: " + s.ToString());
      }
    }
    const Ns& ns = namespaces_.front();
    v1::ReserveRequest rr;
    rr.set_session_id(sessions_[0]);
    rr.set_namespace_id(ns.id);
    rr.set_pages(3);
    v1::ReserveResponse rresp;
    if (absl::Status s = core_.Reserve(rr, &rresp); !s.ok()) {
      Fail("prelude reserve: " + s.ToString());
    }
    v1::CommitRequest cr;
    cr.set_session_id(sessions_[0]);
    cr.set_namespace_id(ns.id);
    cr.set_reservation_id(rresp.reservation_id());
    for (uint32_t i = 0; i < 3; ++i) {
      std::string h(ns.hash_bytes, 'a');
      h.back() = static_cast<char>(i);
      cr.mutable_hashes()->append(h);
    }
    v1::CommitResponse cresp;
    if (absl::Status s = core_.Commit(cr, &cresp); !s.ok()) {
      Fail("prelude commit: " + s.ToString());
    }
  }

  std::string State() {
    v1::StatsResponse stats;
    (void)core_.Stats({}, &stats);
    stats.clear_uptime_seconds();
    std::string out;
    stats.SerializeToString(&out);
    return out;
  }

  template <typename T>
  const T* Pick(const std::vector<T>& v) {
    if (v.empty()) return nullptr;
    return &v[in_.ConsumeIntegralInRange<size_t>(0, v.size() - 1)];
  }
  // A live id most of the time, else anything.
  uint64_t SessionId() {
    if (in_.ConsumeIntegralInRange<int>(0, 7) == 0 || sessions_.empty()) {
      return in_.ConsumeIntegral<uint64_t>();
    }
    return *Pick(sessions_);
  }
  const Ns* Namespace() { return Pick(namespaces_); }
  uint64_t NamespaceId() {
    const Ns* ns = Namespace();
    if (ns == nullptr || in_.ConsumeIntegralInRange<int>(0, 7) == 0) {
      return in_.ConsumeIntegralInRange<uint64_t>(0, 64);
    }
    return ns->id;
  }
  uint32_t HashBytes(uint64_t ns_id) {
    for (const Ns& ns : namespaces_) {
      if (ns.id == ns_id) return ns.hash_bytes;
    }
    return 32;
  }
  // A packed chain of `n` hashes from a small alphabet (so lookups hit and
  // commits collide), occasionally cut to a wrong length.
  std::string Hashes(uint32_t n, uint32_t hash_bytes) {
    std::string out;
    for (uint32_t i = 0; i < n; ++i) {
      const uint8_t sym = in_.ConsumeIntegralInRange<uint8_t>(0, kHashAlphabet);
      out += std::string(hash_bytes, static_cast<char>('a' + sym));
      out[out.size() - 1] = static_cast<char>(i);  // Position matters.
    }
    if (in_.ConsumeIntegralInRange<int>(0, 15) == 0 && !out.empty()) {
      out.resize(out.size() - 1);
    }
    return out;
  }
  std::string OneHash(uint64_t ns_id) {
    const uint32_t hb = HashBytes(ns_id);
    std::string h = Hashes(in_.ConsumeIntegralInRange<uint32_t>(1, 4), hb);
    return h.size() >= hb ? h.substr(h.size() - hb) : h;
  }
  std::string RawBytes() { return in_.ConsumeRandomLengthString(512); }

  absl::Status Step(int op) {
    switch (op) {
      case 0:
        return OpenSession();
      case 1:
        return CloseSession();
      case 2:
        return BindPeer();
      case 3:
        return Attach();
      case 4:
        return Lookup();
      case 5:
        return Reserve();
      case 6:
        return Commit();
      case 7:
        return Abort();
      case 8:
        return Release();
      case 9:
        return Drop();
      case 10:
        return Operator();
      default:
        return Raw();
    }
  }

  absl::Status OpenSession() {
    v1::Hello hello;
    hello.set_client_name(in_.ConsumeRandomLengthString(300));
    PeerInfo peer;
    peer.pid = in_.ConsumeIntegral<int32_t>();
    auto id = core_.OpenSession(hello, peer);
    if (!id.ok()) return id.status();
    sessions_.push_back(*id);
    return absl::OkStatus();
  }

  absl::Status CloseSession() {
    if (sessions_.empty()) return absl::OkStatus();
    const size_t i =
        in_.ConsumeIntegralInRange<size_t>(0, sessions_.size() - 1);
    core_.CloseSession(sessions_[i]);
    sessions_.erase(sessions_.begin() + static_cast<long>(i));
    return absl::OkStatus();
  }

  absl::Status BindPeer() {
    PeerInfo peer;
    peer.pid = in_.ConsumeIntegral<int32_t>();
    peer.uid = in_.ConsumeIntegralInRange<uint32_t>(0, 3);
    peer.gid = in_.ConsumeIntegralInRange<uint32_t>(0, 3);
    peer.verified = in_.ConsumeIntegralInRange<int>(0, 7) != 0;
    return core_.BindPeerCredentials(SessionId(), peer);
  }

  absl::Status AttachWith(v1::AttachRequest& req) {
    v1::AttachResponse resp;
    absl::Status s = core_.Attach(req, &resp);
    if (s.ok()) {
      bool known = false;
      for (const Ns& ns : namespaces_) known |= ns.id == resp.namespace_id();
      if (!known)
        namespaces_.push_back({resp.namespace_id(), resp.hash_bytes()});
    }
    return s;
  }

  absl::Status Attach() {
    static const char* kNames[] = {"a", "b", "acl", "c.d"};
    v1::AttachRequest req;
    req.set_session_id(SessionId());
    req.set_namespace_(in_.ConsumeIntegralInRange<int>(0, 7) == 0
                           ? in_.ConsumeRandomLengthString(140)
                           : kNames[in_.ConsumeIntegralInRange<int>(0, 3)]);
    *req.mutable_layout() = MakeLayout(in_);
    req.set_tp_rank(in_.ConsumeIntegralInRange<uint32_t>(0, 2));
    req.mutable_capacity()->set_page_rows(
        in_.ConsumeIntegralInRange<uint64_t>(0, 24));
    if (req.layout().snapshot_row_bytes() > 0 || in_.ConsumeBool()) {
      req.mutable_capacity()->set_snapshot_rows(
          in_.ConsumeIntegralInRange<uint64_t>(0, 6));
    }
    req.mutable_capacity()->set_max_replay_tokens(
        in_.ConsumeIntegralInRange<uint32_t>(0, 64));
    req.set_tenant_salt(in_.ConsumeRandomLengthString(70));
    return AttachWith(req);
  }

  absl::Status Lookup() {
    const uint64_t ns = NamespaceId();
    const std::string hashes =
        Hashes(in_.ConsumeIntegralInRange<uint32_t>(0, 8), HashBytes(ns));
    const bool pin = in_.ConsumeBool();
    const uint64_t session = SessionId();
    uint64_t lease = 0;
    absl::Status s;
    if (in_.ConsumeBool()) {  // The gRPC handler.
      v1::LookupRequest req;
      req.set_session_id(session);
      req.set_namespace_id(ns);
      req.set_hashes(hashes);
      req.set_pin(pin);
      v1::LookupResponse resp;
      s = core_.Lookup(req, &resp);
      lease = resp.lease_id();
    } else {  // The fast path's entry point.
      TierCore::LookupOutcome out;
      s = core_.LookupHashes(session, ns, hashes, pin, &out);
      lease = out.lease_id;
    }
    if (s.ok() && lease != 0) leases_.push_back({session, ns, lease});
    return s;
  }

  absl::Status Reserve() {
    v1::ReserveRequest req;
    req.set_session_id(SessionId());
    req.set_namespace_id(NamespaceId());
    req.set_pages(in_.ConsumeIntegralInRange<int>(0, 15) == 0
                      ? in_.ConsumeIntegral<uint32_t>()
                      : in_.ConsumeIntegralInRange<uint32_t>(0, 8));
    req.set_snapshots(in_.ConsumeIntegralInRange<uint32_t>(0, 3));
    v1::ReserveResponse resp;
    absl::Status s = core_.Reserve(req, &resp);
    if (s.ok()) {
      reservations_.push_back(
          {req.session_id(), req.namespace_id(), resp.reservation_id(),
           static_cast<uint32_t>(resp.page_rows_size()),
           static_cast<uint32_t>(resp.snapshot_rows_size())});
    }
    return s;
  }

  absl::Status Commit() {
    const Res* r = Pick(reservations_);
    v1::CommitRequest req;
    uint32_t pages = in_.ConsumeIntegralInRange<uint32_t>(0, 4);
    uint32_t snaps = in_.ConsumeIntegralInRange<uint32_t>(0, 2);
    if (r != nullptr && in_.ConsumeIntegralInRange<int>(0, 7) != 0) {
      req.set_session_id(in_.ConsumeIntegralInRange<int>(0, 7) == 0
                             ? SessionId()  // Maybe another session's.
                             : r->session);
      req.set_namespace_id(r->ns);
      req.set_reservation_id(r->id);
      pages = r->pages;
      snaps = r->snapshots;
    } else {
      req.set_session_id(SessionId());
      req.set_namespace_id(NamespaceId());
      req.set_reservation_id(in_.ConsumeIntegral<uint64_t>());
    }
    const uint32_t hb = HashBytes(req.namespace_id());
    if (in_.ConsumeBool()) req.set_parent_hash(OneHash(req.namespace_id()));
    req.set_hashes(Hashes(pages, hb));
    const uint32_t placements =
        in_.ConsumeIntegralInRange<uint32_t>(0, snaps + 1);
    for (uint32_t i = 0; i < placements; ++i) {
      auto* p = req.add_snapshots();
      p->set_index(in_.ConsumeIntegralInRange<uint32_t>(0, snaps));
      p->set_hash(
          in_.ConsumeBool() && pages > 0
              ? req.hashes().substr(
                    in_.ConsumeIntegralInRange<uint32_t>(0, pages - 1) * hb, hb)
              : OneHash(req.namespace_id()));
    }
    v1::CommitResponse resp;
    absl::Status s = core_.Commit(req, &resp);
    if (s.ok()) Forget(reservations_, req.reservation_id());
    return s;
  }

  template <typename T>
  static void Forget(std::vector<T>& v, uint64_t id) {
    for (size_t i = 0; i < v.size(); ++i) {
      if (v[i].id == id) {
        v.erase(v.begin() + static_cast<long>(i));
        return;
      }
    }
  }

  absl::Status Abort() {
    const Res* r = Pick(reservations_);
    v1::AbortRequest req;
    req.set_session_id(r != nullptr && in_.ConsumeBool() ? r->session
                                                         : SessionId());
    req.set_namespace_id(r != nullptr ? r->ns : NamespaceId());
    req.set_reservation_id(r != nullptr && in_.ConsumeIntegralInRange<int>(0, 7)
                               ? r->id
                               : in_.ConsumeIntegral<uint64_t>());
    v1::AbortResponse resp;
    absl::Status s = core_.Abort(req, &resp);
    if (s.ok()) Forget(reservations_, req.reservation_id());
    return s;
  }

  absl::Status Release() {
    const LeaseRef* l = Pick(leases_);
    v1::ReleaseRequest req;
    req.set_session_id(l != nullptr && in_.ConsumeBool() ? l->session
                                                         : SessionId());
    req.set_namespace_id(l != nullptr ? l->ns : NamespaceId());
    req.set_lease_id(l != nullptr && in_.ConsumeIntegralInRange<int>(0, 7)
                         ? l->id
                         : in_.ConsumeIntegral<uint64_t>());
    v1::ReleaseResponse resp;
    absl::Status s = core_.Release(req, &resp);
    if (s.ok()) Forget(leases_, req.lease_id());
    return s;
  }

  absl::Status Drop() {
    static const char* kNames[] = {"a", "b", "acl", "c.d"};
    v1::DropRequest req;
    req.set_namespace_(kNames[in_.ConsumeIntegralInRange<int>(0, 3)]);
    if (in_.ConsumeBool()) req.set_hash(OneHash(NamespaceId()));
    req.set_force(in_.ConsumeBool());
    v1::DropResponse resp;
    // A dropped namespace's reservations and leases stay in the lists:
    // using them later must be a clean NOT_FOUND.
    return core_.Drop(req, &resp);
  }

  absl::Status Operator() {
    switch (in_.ConsumeIntegralInRange<int>(0, 3)) {
      case 0: {
        v1::StatsResponse resp;
        return core_.Stats({}, &resp);
      }
      case 1: {
        v1::ListNamespacesResponse resp;
        return core_.ListNamespaces({}, &resp);
      }
      case 2: {
        v1::ListPrefixesRequest req;
        req.set_namespace_(in_.ConsumeBool() ? "a" : "b");
        req.set_order(static_cast<v1::ListPrefixesRequest::Order>(
            in_.ConsumeIntegralInRange<int>(0, 3)));
        req.set_limit(in_.ConsumeIntegralInRange<uint32_t>(0, 10002));
        v1::ListPrefixesResponse resp;
        return core_.ListPrefixes(req, &resp);
      }
      default: {
        v1::VerifyResponse resp;
        absl::Status s = core_.Verify({}, &resp);
        if (s.ok() && !resp.ok()) Fail("Verify: " + resp.violation());
        return s;
      }
    }
  }

  // A request parsed from raw bytes; its ids replaced by live ones now and
  // then, so that the parsed fields reach past id resolution.
  template <typename Req>
  bool Parse(Req* req) {
    if (!req->ParseFromString(RawBytes())) return false;
    if (in_.ConsumeBool()) {
      if constexpr (requires { req->set_session_id(0); }) {
        req->set_session_id(SessionId());
      }
      if constexpr (requires { req->set_namespace_id(0); }) {
        req->set_namespace_id(NamespaceId());
      }
      if constexpr (requires { req->set_api_version(0); }) {
        req->set_api_version(in_.ConsumeIntegralInRange<uint32_t>(0, 2));
      }
    }
    return true;
  }

  absl::Status Raw() {
    switch (in_.ConsumeIntegralInRange<int>(0, 9)) {
      case 0: {
        v1::AttachRequest req;
        if (!Parse(&req)) return absl::OkStatus();
        return AttachWith(req);
      }
      case 1: {
        v1::LookupRequest req;
        if (!Parse(&req)) return absl::OkStatus();
        v1::LookupResponse resp;
        absl::Status s = core_.Lookup(req, &resp);
        if (s.ok() && resp.lease_id() != 0) {
          leases_.push_back(
              {req.session_id(), req.namespace_id(), resp.lease_id()});
        }
        return s;
      }
      case 2: {
        v1::ReserveRequest req;
        if (!Parse(&req)) return absl::OkStatus();
        if (req.pages() > 64) req.set_pages(req.pages() % 64);
        v1::ReserveResponse resp;
        absl::Status s = core_.Reserve(req, &resp);
        if (s.ok()) {
          reservations_.push_back(
              {req.session_id(), req.namespace_id(), resp.reservation_id(),
               static_cast<uint32_t>(resp.page_rows_size()),
               static_cast<uint32_t>(resp.snapshot_rows_size())});
        }
        return s;
      }
      case 3: {
        v1::CommitRequest req;
        if (!Parse(&req)) return absl::OkStatus();
        if (const Res* r = Pick(reservations_);
            r != nullptr && in_.ConsumeBool()) {
          req.set_reservation_id(r->id);
        }
        v1::CommitResponse resp;
        absl::Status s = core_.Commit(req, &resp);
        if (s.ok()) Forget(reservations_, req.reservation_id());
        return s;
      }
      case 4: {
        v1::AbortRequest req;
        if (!Parse(&req)) return absl::OkStatus();
        v1::AbortResponse resp;
        absl::Status s = core_.Abort(req, &resp);
        if (s.ok()) Forget(reservations_, req.reservation_id());
        return s;
      }
      case 5: {
        v1::ReleaseRequest req;
        if (!Parse(&req)) return absl::OkStatus();
        v1::ReleaseResponse resp;
        absl::Status s = core_.Release(req, &resp);
        if (s.ok()) Forget(leases_, req.lease_id());
        return s;
      }
      case 6: {
        v1::DropRequest req;
        if (!Parse(&req)) return absl::OkStatus();
        v1::DropResponse resp;
        return core_.Drop(req, &resp);
      }
      case 7: {
        v1::ListPrefixesRequest req;
        if (!Parse(&req)) return absl::OkStatus();
        v1::ListPrefixesResponse resp;
        return core_.ListPrefixes(req, &resp);
      }
      case 8: {
        v1::Hello hello;
        if (!hello.ParseFromString(RawBytes())) return absl::OkStatus();
        auto id = core_.OpenSession(hello, PeerInfo{});
        if (!id.ok()) return id.status();
        sessions_.push_back(*id);
        return absl::OkStatus();
      }
      default: {
        v1::StatsRequest req;
        if (!Parse(&req)) return absl::OkStatus();
        v1::StatsResponse resp;
        return core_.Stats(req, &resp);
      }
    }
  }

  TierCore& core_;
  FuzzedDataProvider& in_;
  std::vector<uint64_t> sessions_;
  std::vector<Ns> namespaces_;
  std::vector<Res> reservations_;
  std::vector<LeaseRef> leases_;
};

}  // namespace
}  // namespace kvtier::daemon

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  spdlog::set_level(spdlog::level::off);
  // Parsing fuzz bytes makes protobuf log every invalid UTF-8 string.
  google::protobuf::SetLogHandler(
      [](google::protobuf::LogLevel, const char*, int, const std::string&) {});
  char tmpl[] = "/dev/shm/kvtier-fuzz-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) kvtier::daemon::Fail("mkdtemp");
  kvtier::daemon::g_dir = new std::string(tmpl);
  std::atexit([] {
    std::error_code ec;
    std::filesystem::remove_all(*kvtier::daemon::g_dir, ec);
  });
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvtier::daemon;  // NOLINT: harness entry point.
  FuzzedDataProvider in(data, size);
  TierOptions o;
  o.segments.shm_dir = *g_dir;
  o.segments.huge_pages = kvtier::shm::HugePagePolicy::kOff;
  o.segments.populate = false;
  o.default_namespace_bytes = 16 << 10;
  o.namespace_budget_bytes = 256 << 10;
  o.max_namespaces = 3;
  o.require_peer_credentials = in.ConsumeBool();
  auto acl = NamespaceAcl::Parse("acl=uid:1+gid:2");
  if (!acl.ok()) Fail("acl");
  o.namespace_acl = *acl;
  o.uid_budget_bytes = in.ConsumeBool() ? 0 : 96 << 10;
  {
    TierCore core(o);
    Program(&core, &in).Run();
  }
  // Whatever the program left (a namespace Drop could not remove).
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(*g_dir, ec)) {
    std::filesystem::remove_all(e.path(), ec);
  }
  return 0;
}
