// kvtier_fence_client: an engine-like process for the fence test
// (tests/fence_test.cc) whose copies are really queued: a spin on a flag
// goes first on its stream, then the copies, and only SIGUSR1 sets the
// flag, so the copies land whenever the test says, across daemon restarts.
// $KVTIER_FENCE_BACKEND picks the stream: "reference" (default) moves pages
// with the reference backend on a kvtier::client::ReferenceStream whose first
// item is SpinUntilReference; "cuda" with the CUDA backend on a cudaStream_t
// whose first kernel is the spin kernel (kernels/spin_wait.h), the pool in
// device memory. Namespaces use tests/test_pattern.h's layout with
// CAPACITY page rows; a prefix of seed S is the hash chain of
// TestTokens(S, PAGES * 16), and page i of bank b holds FillPattern(.., S,
// i, b). INSTANCE is 32 hex digits: the client instance (fence protocol).
//
//   write  SOCKET NS CAPACITY PAGES SEED INSTANCE THEN
//       reserves PAGES rows, queues the copy of SEED's pages into them on
//       the held stream, then THEN: "commit" queues CommitAfter, "abort"
//       AbortAfter, "drop" destroys the reservation (queued copies: its rows
//       stay fenced until this process exits). Prints "ROWS r,r,..." and
//       "QUEUED"; on SIGUSR1 resumes the stream, waits for it and prints
//       "LANDED <commit status code or -1>"; then sleeps until killed.
//   hold   SOCKET NS CAPACITY PAGES SEED INSTANCE
//       pinned lookup of SEED's prefix: prints "ROWS ..." and "PINNED
//       <matched>"; on SIGUSR1 releases the lease and prints "RELEASED";
//       then sleeps until killed.
//   read   SOCKET NS CAPACITY PAGES SEED INSTANCE ROWS
//       queues the copy of rows ROWS (r,r,...) into its pool on the held
//       stream and prints "QUEUED"; on SIGUSR1 resumes, waits and prints
//       "READ intact=<0|1>" (whether the pages hold SEED's bytes); then
//       sleeps until killed.
//   mirror SOCKET NS CAPACITY PAGES SEED INSTANCE
//       (reference backend only) creates a Mirror of PAGES logical pages
//       (options.reference) and queues the store of every token of SEED's
//       pages behind the spin; prints "ROWS ..." (the mirror's rows) and
//       "QUEUED"; on SIGUSR1 runs the stream and prints "STORED revoked=<0|1>
//       unchanged=<0|1>" (whether the mirror had been revoked, and whether
//       its rows kept their bytes); then sleeps until killed.
//   put    SOCKET NS CAPACITY PAGES SEED
//       reserves, writes and commits SEED's prefix, prints "COMMITTED
//       ROWS r,r,...", and exits.
//   fence  SOCKET NS CAPACITY PAGES SEED INSTANCE ROWS
//       a client that says what it likes: speaks the engine protocol by
//       hand (libkvtier reports only what it holds). Opens a session
//       presenting INSTANCE, attaches NS and prints "ATTACHED"; on SIGUSR1
//       (after a daemon restart, say) opens another, attaches, reports ROWS
//       (r,r,...) in NS with report_complete, then releases the holds it was
//       answered and every hold id from 1 to 4096. Prints "STOLE report=<code>
//       holds=<non-zero holds> release=<code> released=<n>" and "DONE";
//       then sleeps until killed.
//
// With --as=USER first, the process becomes USER (initgroups, setgid,
// setuid) before anything else, so kvtierd sees that user's SO_PEERCRED.
//
// Exit codes: 0 done, 1 a check failed, 2 usage, 3 could not connect/attach,
// 4 could not become USER.
#include <grp.h>
#include <pwd.h>
#include <signal.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "client/engine_link.h"
#include "client/mirror.h"
#include "client/reference_stream.h"
#include "client/transfer_engine.h"
#include "common/fast_lookup.h"
#include "kernels/spin_wait.h"
#include "kvtier/v1/tier.pb.h"
#include "tests/test_pattern.h"

#if KVTIER_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "kernels/spin_wait_launch.h"
#endif

namespace {

using kvtier::testing::CheckPattern;
using kvtier::testing::FillPattern;
using kvtier::testing::TestAttachOptions;
using kvtier::testing::TestTokens;

void Say(const std::string& line) {
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

int Die(const std::string& what, const absl::Status& s) {
  std::fprintf(stderr, "kvtier_fence_client: %s: %s\n", what.c_str(),
               s.ToString().c_str());
  return 3;
}

// SIGUSR1 is blocked in every thread (main blocks it before libkvtier
// starts any) and taken here.
void AwaitGo() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGUSR1);
  int sig = 0;
  while (sigwait(&set, &sig) != 0 || sig != SIGUSR1) {
  }
}

void SleepForever() {
  for (;;) pause();
}

// The engine's pool and stream: host memory and a ReferenceStream, or
// device memory and a CUDA stream. Page p of bank b is at
// base[b] + p * stride[b] on the pool's side.
class Pool {
 public:
  Pool(const kvtier::client::Namespace& ns, uint32_t pages, bool cuda)
      : cuda_(cuda), pages_(pages) {
    descriptor.num_pages = pages;
    for (const auto& bank : ns.page_banks()) {
      const uint64_t stride = (bank.row_bytes + 15) & ~uint64_t{15};
      strides_.push_back(stride);
      row_bytes_.push_back(bank.row_bytes);
      uint8_t* base = nullptr;
      if (!cuda_) {
        host_.emplace_back(stride * pages + 16);
        base = host_.back().data();
        base += (16 - reinterpret_cast<uintptr_t>(base) % 16) % 16;
      } else {
#if KVTIER_HAVE_CUDA
        void* p = nullptr;
        if (cudaMalloc(&p, stride * pages) != cudaSuccess) std::abort();
        base = static_cast<uint8_t*>(p);
#endif
      }
      bases_.push_back(base);
      descriptor.banks.push_back(
          {bank.name,
           {{reinterpret_cast<uint64_t>(base), stride, bank.row_bytes}}});
    }
#if KVTIER_HAVE_CUDA
    if (cuda_) {
      void* flag = nullptr;
      void* device_flag = nullptr;
      if (cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking) !=
              cudaSuccess ||
          cudaHostAlloc(&flag, sizeof(uint32_t), cudaHostAllocMapped) !=
              cudaSuccess ||
          cudaHostGetDevicePointer(&device_flag, flag, 0) != cudaSuccess) {
        std::abort();
      }
      flag_ = static_cast<volatile uint32_t*>(flag);
      device_flag_ = static_cast<uint32_t*>(device_flag);
    }
#endif
    if (!cuda_) flag_ = &host_flag_;
  }

  kvtier::client::Backend backend() const {
    return cuda_ ? kvtier::client::Backend::kCuda
                 : kvtier::client::Backend::kReference;
  }
  void* stream() {
#if KVTIER_HAVE_CUDA
    if (cuda_) return stream_;
#endif
    return reference_.handle();
  }
  // Puts the spin first on the stream: what follows waits for Go().
  void Hold() {
    *flag_ = 0;
#if KVTIER_HAVE_CUDA
    if (cuda_) {
      if (!kvtier::kernels::LaunchSpinUntil(device_flag_, stream_).ok()) {
        std::abort();
      }
      return;
    }
#endif
    volatile uint32_t* f = flag_;
    reference_.Enqueue([f] { kvtier::kernels::SpinUntilReference(f); });
  }
  // Lets the stream run, and waits until it has.
  void Go() {
    __atomic_store_n(flag_, 1, __ATOMIC_RELEASE);  // The spin reads it.
#if KVTIER_HAVE_CUDA
    if (cuda_) {
      cudaStreamSynchronize(stream_);
      return;
    }
#endif
    reference_.Synchronize();
  }
  // Writes seed's pattern into the pool's pages.
  void Fill(uint64_t seed) {
    for (size_t b = 0; b < bases_.size(); ++b) {
      std::vector<uint8_t> page(strides_[b]);
      for (uint32_t i = 0; i < pages_; ++i) {
        FillPattern(page.data(), row_bytes_[b], seed, i, b);
        Put(bases_[b] + uint64_t{i} * strides_[b], page.data(), row_bytes_[b]);
      }
    }
  }
  // Whether the pool's pages hold seed's pattern.
  bool Holds(uint64_t seed) {
    for (size_t b = 0; b < bases_.size(); ++b) {
      std::vector<uint8_t> page(strides_[b]);
      for (uint32_t i = 0; i < pages_; ++i) {
        Get(page.data(), bases_[b] + uint64_t{i} * strides_[b], row_bytes_[b]);
        if (!CheckPattern(page.data(), row_bytes_[b], seed, i, b)) return false;
      }
    }
    return true;
  }

  kvtier::client::GpuPoolDescriptor descriptor;

 private:
  void Put(uint8_t* dst, const uint8_t* src, uint64_t n) {
#if KVTIER_HAVE_CUDA
    if (cuda_) {
      cudaMemcpy(dst, src, n, cudaMemcpyHostToDevice);
      return;
    }
#endif
    std::memcpy(dst, src, n);
  }
  void Get(uint8_t* dst, const uint8_t* src, uint64_t n) {
#if KVTIER_HAVE_CUDA
    if (cuda_) {
      cudaMemcpy(dst, src, n, cudaMemcpyDeviceToHost);
      return;
    }
#endif
    std::memcpy(dst, src, n);
  }

  const bool cuda_;
  const uint32_t pages_;
  std::vector<std::vector<uint8_t>> host_;
  std::vector<uint8_t*> bases_;
  std::vector<uint64_t> strides_, row_bytes_;
  kvtier::client::ReferenceStream reference_;
  volatile uint32_t host_flag_ = 0;
  volatile uint32_t* flag_ = nullptr;
#if KVTIER_HAVE_CUDA
  cudaStream_t stream_ = nullptr;
  uint32_t* device_flag_ = nullptr;
#endif
};
struct Engine {
  std::unique_ptr<kvtier::client::Client> client;
  std::unique_ptr<kvtier::client::Namespace> ns;
  uint32_t pages = 0;
  std::string Hashes(uint64_t seed) const {
    return ns->hasher().HashChain(TestTokens(seed, pages * 16));
  }
};

absl::Status Open(const std::string& socket, const std::string& ns,
                  uint64_t capacity, uint32_t pages,
                  const std::string& instance, Engine* e) {
  auto client = kvtier::client::Client::Connect({.socket = socket,
                                                 .client_name = "fence-client",
                                                 .timeout = absl::Seconds(10),
                                                 .instance_id = instance});
  if (!client.ok()) return client.status();
  auto o = TestAttachOptions(ns);
  o.capacity.page_rows = capacity;
  auto attached = (*client)->Attach(o);
  if (!attached.ok()) return attached.status();
  e->client = *std::move(client);
  e->ns = *std::move(attached);
  e->pages = pages;
  return absl::OkStatus();
}

std::string Rows(absl::Span<const uint32_t> rows) {
  return absl::StrJoin(rows, ",");
}

// Becomes user `name` (its groups, gid and uid); false when it cannot.
bool BecomeUser(const std::string& name) {
  const passwd* pw = getpwnam(name.c_str());
  return pw != nullptr && initgroups(name.c_str(), pw->pw_gid) == 0 &&
         setgid(pw->pw_gid) == 0 && setuid(pw->pw_uid) == 0;
}

// A session opened by hand over the engine protocol (common/fast_lookup.h),
// attached to a namespace of tests/test_pattern.h's layout. It lives while
// `fd` is open (until the process exits).
struct RawSession {
  int fd = -1;
  uint64_t id = 0;
  kvtier::client::EngineLink link;
};

absl::Status OpenRaw(const std::string& socket, const std::string& ns,
                     uint64_t capacity, const std::string& instance,
                     RawSession* s) {
  namespace fastpath = kvtier::fastpath;
  kvtier::v1::Hello hello;
  hello.set_client_name("fence-raw");
  hello.set_pid(static_cast<uint32_t>(getpid()));
  hello.set_instance_id(instance);
  hello.set_connection_id(0x7e57);  // The same one for each session.
  hello.set_fence_version(1);
  const std::string bytes = hello.SerializeAsString();
  fastpath::Open open;
  open.hello_bytes = static_cast<uint32_t>(bytes.size());
  const iovec frame[2] = {{&open, sizeof(open)},
                          {const_cast<char*>(bytes.data()), bytes.size()}};
  fastpath::OpenReply reply;
  std::string why;
  const std::string engine = socket + ".lookup";
  s->fd = kvtier::client::DialEngineSocket(
      engine, frame, 2, &reply, sizeof(reply), absl::Now() + absl::Seconds(10),
      /*wait_for_daemon=*/true, &why);
  if (s->fd < 0) return absl::UnavailableError(why);
  if (reply.magic != fastpath::kReplyMagic || reply.code != 0 ||
      reply.session_id == 0) {
    return absl::UnavailableError(
        absl::StrCat("session refused, code ", reply.code));
  }
  s->id = reply.session_id;
  if (absl::Status b = s->link.Bind(engine, s->id, absl::Seconds(10));
      !b.ok()) {
    return b;
  }
  const kvtier::client::AttachOptions o = TestAttachOptions(ns);
  kvtier::v1::AttachRequest req;
  req.set_api_version(1);
  req.set_session_id(s->id);
  req.set_namespace_(ns);
  kvtier::v1::Layout* l = req.mutable_layout();
  l->set_model(o.layout.model);
  l->set_tokens_per_page(o.layout.tokens_per_page);
  l->set_num_layers(o.layout.num_layers);
  for (const auto& b : o.layout.page_banks) {
    auto* pb = l->add_page_banks();
    pb->set_name(b.name);
    pb->set_row_bytes(b.row_bytes);
    pb->set_dtype(b.dtype);
  }
  req.mutable_capacity()->set_page_rows(capacity);
  kvtier::v1::AttachResponse resp;
  return s->link.Call(s->id, fastpath::Method::kAttach, "Attach", req, &resp,
                      absl::Seconds(30));
}

// The "fence" mode (see the top of the file).
int RawFence(const std::string& socket, const std::string& ns,
             uint64_t capacity, const std::string& instance,
             const std::string& rows_arg) {
  namespace fastpath = kvtier::fastpath;
  std::vector<uint32_t> rows;
  for (absl::string_view r : absl::StrSplit(rows_arg, ',')) {
    uint32_t row = 0;
    if (!absl::SimpleAtoi(r, &row)) return 2;
    rows.push_back(row);
  }
  RawSession first;
  if (absl::Status s = OpenRaw(socket, ns, capacity, instance, &first);
      !s.ok()) {
    return Die("open", s);
  }
  Say("ATTACHED");
  AwaitGo();
  RawSession second;
  if (absl::Status s = OpenRaw(socket, ns, capacity, instance, &second);
      !s.ok()) {
    return Die("reopen", s);
  }
  kvtier::v1::FenceRequest report;
  report.set_api_version(1);
  report.set_session_id(second.id);
  report.set_report_complete(true);
  kvtier::v1::FenceItem* item = report.add_report();
  item->set_namespace_(ns);
  item->mutable_page_rows()->Assign(rows.begin(), rows.end());
  kvtier::v1::FenceResponse reported;
  const absl::Status r =
      second.link.Call(second.id, fastpath::Method::kFence, "Fence", report,
                       &reported, absl::Seconds(10));
  kvtier::v1::FenceRequest release;
  release.set_api_version(1);
  release.set_session_id(second.id);
  int holds = 0;
  for (uint64_t h : reported.holds()) {
    if (h == 0) continue;
    ++holds;
    release.add_release(h);
  }
  for (uint64_t guess = 1; guess <= 4096; ++guess) release.add_release(guess);
  kvtier::v1::FenceResponse released;
  const absl::Status d =
      second.link.Call(second.id, fastpath::Method::kFence, "Fence", release,
                       &released, absl::Seconds(10));
  Say(absl::StrCat("STOLE report=", static_cast<int>(r.code()),
                   " holds=", holds, " release=", static_cast<int>(d.code()),
                   " released=", released.released()));
  Say("DONE");
  SleepForever();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  if (argc > 1 && absl::StartsWith(argv[1], "--as=")) {
    if (!BecomeUser(argv[1] + 5)) {
      std::fprintf(stderr, "kvtier_fence_client: cannot become %s\n",
                   argv[1] + 5);
      return 4;
    }
    ++argv;
    --argc;
  }
  if (argc < 7) {
    std::fprintf(stderr,
                 "usage: kvtier_fence_client MODE SOCKET NS CAPACITY PAGES "
                 "SEED [INSTANCE ...]\n");
    return 2;
  }
  const std::string mode = argv[1];
  uint64_t capacity = 0, seed = 0;
  uint32_t pages = 0;
  if (!absl::SimpleAtoi(argv[4], &capacity) ||
      !absl::SimpleAtoi(argv[5], &pages) || !absl::SimpleAtoi(argv[6], &seed)) {
    std::fprintf(stderr, "kvtier_fence_client: bad number\n");
    return 2;
  }
  const char* backend = std::getenv("KVTIER_FENCE_BACKEND");
  const bool cuda = backend != nullptr && std::string(backend) == "cuda";
  if (cuda && !KVTIER_HAVE_CUDA) {
    std::fprintf(stderr, "kvtier_fence_client: built without CUDA\n");
    return 2;
  }
  // The spin kernel keeps running while the copies are queued behind it;
  // CUDA's lazy module loading would load the copy kernels at their first
  // launch, which waits for running kernels: load them all up front.
  if (cuda) setenv("CUDA_MODULE_LOADING", "EAGER", 1);
  std::string instance;
  if (argc > 7 && std::strlen(argv[7]) == 32) {
    instance = absl::HexStringToBytes(argv[7]);
  }
  if (mode == "fence" && argc == 9) {
    return RawFence(argv[2], argv[3], capacity, instance, argv[8]);
  }
  Engine e;
  if (absl::Status s = Open(argv[2], argv[3], capacity, pages, instance, &e);
      !s.ok()) {
    return Die("open", s);
  }
  Pool pool(*e.ns, pages, cuda);
  auto engine = e.ns->CreateTransferEngine(pool.backend(), pool.descriptor);
  if (!engine.ok()) return Die("transfer engine", engine.status());
  std::vector<uint32_t> gpu_pages(pages);
  for (uint32_t i = 0; i < pages; ++i) gpu_pages[i] = i;

  if (mode == "put") {
    auto r = e.ns->Reserve(pages);
    if (!r.ok()) return Die("reserve", r.status());
    pool.Fill(seed);
    const std::vector<uint32_t> rows(r->page_rows().begin(),
                                     r->page_rows().end());
    if (absl::Status s = (*engine)->Evict(gpu_pages, rows, pool.stream());
        !s.ok()) {
      return Die("evict", s);
    }
    pool.Go();
    auto c = r->Commit("", e.Hashes(seed));
    if (!c.ok()) return Die("commit", c.status());
    Say(absl::StrCat("COMMITTED ROWS ", Rows(rows)));
    return 0;
  }

  if (mode == "write" && argc == 9) {
    const std::string then = argv[8];
    auto r = e.ns->Reserve(pages);
    if (!r.ok()) return Die("reserve", r.status());
    pool.Fill(seed);
    pool.Hold();
    const std::vector<uint32_t> rows(r->page_rows().begin(),
                                     r->page_rows().end());
    if (absl::Status s = (*engine)->Evict(gpu_pages, rows, pool.stream());
        !s.ok()) {
      return Die("evict", s);
    }
    std::future<absl::StatusOr<kvtier::client::CommitResult>> committed;
    if (then == "commit") {
      committed = r->CommitAfter(pool.stream(), "", e.Hashes(seed));
    } else if (then == "abort") {
      r->AbortAfter(pool.stream());
    } else if (then == "drop") {
      *r = kvtier::client::Reservation();  // Destroyed with the copy queued.
    } else {
      std::fprintf(stderr, "kvtier_fence_client: THEN: %s\n", then.c_str());
      return 2;
    }
    Say(absl::StrCat("ROWS ", Rows(rows)));
    Say("QUEUED");
    AwaitGo();
    pool.Go();
    int code = -1;
    if (committed.valid()) {
      auto result = committed.get();
      code = static_cast<int>(result.status().code());
    }
    Say(absl::StrCat("LANDED ", code));
    SleepForever();
  }
  if (mode == "mirror" && !cuda) {
    pool.Fill(seed);
    auto mirror =
        kvtier::client::Mirror::Create(*e.ns, pool.descriptor,
                                       {.logical_pages = pages,
                                        .gpu_slots = pages,
                                        .max_batch = 1,
                                        .max_selected = pages,
                                        .max_store_entries = pages * 16,
                                        .reference = true},
                                       nullptr);
    if (!mirror.ok()) return Die("mirror", mirror.status());
    std::vector<kvtier::client::MirrorStoreEntry> entries;
    for (uint32_t i = 0; i < pages; ++i) {
      for (int32_t t = 0; t < 16; ++t) {
        entries.push_back({.logical = static_cast<int32_t>(i),
                           .slot = static_cast<int32_t>(i),
                           .token = t});
      }
    }
    const uint32_t count = static_cast<uint32_t>(entries.size());
    // The rows' bytes before the store, to tell whether it wrote.
    std::vector<uint8_t> before;
    auto rows_bytes = [&] {
      std::vector<uint8_t> out;
      for (uint32_t row : (*mirror)->rows()) {
        for (const auto& bank : e.ns->page_banks()) {
          const uint8_t* p = bank.base + uint64_t{row} * bank.row_stride;
          out.insert(out.end(), p, p + bank.row_bytes);
        }
      }
      return out;
    };
    before = rows_bytes();
    pool.Hold();
    if (absl::Status s =
            (*mirror)->Store(entries.data(), &count, pool.stream());
        !s.ok()) {
      return Die("mirror store", s);
    }
    Say(absl::StrCat("ROWS ", Rows((*mirror)->rows())));
    Say("QUEUED");
    AwaitGo();
    const bool revoked = (*mirror)->revoked();
    pool.Go();
    Say(absl::StrCat("STORED revoked=", revoked ? 1 : 0,
                     " unchanged=", rows_bytes() == before ? 1 : 0));
    SleepForever();
  }
  if (mode == "hold") {
    auto lease = e.ns->Lookup(e.Hashes(seed), /*pin=*/true);
    if (!lease.ok()) return Die("lookup", lease.status());
    Say(absl::StrCat("ROWS ", Rows(lease->rows())));
    Say(absl::StrCat("PINNED ", lease->matched_pages()));
    AwaitGo();
    (void)lease->Release();
    Say("RELEASED");
    SleepForever();
  }
  if (mode == "read" && argc == 9) {
    std::vector<uint32_t> rows;
    for (absl::string_view r : absl::StrSplit(argv[8], ',')) {
      uint32_t row = 0;
      if (!absl::SimpleAtoi(r, &row)) return 2;
      rows.push_back(row);
    }
    if (rows.size() != pages) return 2;
    pool.Hold();
    if (absl::Status s = (*engine)->Rehydrate(gpu_pages, rows, pool.stream());
        !s.ok()) {
      return Die("rehydrate", s);
    }
    Say("QUEUED");
    AwaitGo();
    pool.Go();
    Say(absl::StrCat("READ intact=", pool.Holds(seed) ? 1 : 0));
    SleepForever();
  }
  std::fprintf(stderr, "kvtier_fence_client: unknown mode %s\n", mode.c_str());
  return 2;
}
