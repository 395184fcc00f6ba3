// kvtier_device_pool_engine: an engine-like process for the device pool
// tests (tests/gpu/device_pool_gpu_test.cc, tests/gpu/tp2_gpu_test.cc).
// Snapshots are deterministic byte patterns of (seed, rank, page).
//
//   kvtier_device_pool_engine fill SOCKET NS GPU RANK TP PAGES BYTES SNAPS
//       On GPU (a CUDA ordinal), attach NS at RANK of a TP group of TP
//       ranks (hybrid layout, BYTES per snapshot), open the device pool of
//       this GPU, and commit PAGES pages with a snapshot after each page in
//       SNAPS (comma-separated page indexes, or "all") into both the host
//       snapshot bank and the device pool. Prints "FILLED" and then waits to
//       be killed (so the test can SIGKILL an engine that holds the pool
//       open).
//   kvtier_device_pool_engine restore SOCKET NS GPU RANK TP PAGES BYTES MATCH
//       Attach again, look up the PAGES-page prefix with the device pool:
//       expects MATCH usable pages with the snapshot in the device pool;
//       restores it device-to-device and checks every byte, and (with
//       TP == 1) every snapshot of pages 0..PAGES-1 the same way, then times
//       restoring them all from the device pool and from the host tier
//       (best of 3, after a warm-up). Prints "RESTORED_OK" and the timings
//       as JSON, then waits for the daemon to stop and checks that every use
//       of the pool answers UNAVAILABLE without touching it: "STALE_OK",
//       exit 0. Any mismatch or error: exit 1.
//   kvtier_device_pool_engine late SOCKET NS GPU 0 1 1 BYTES -
//       Attach NS, reserve one device slot, and queue the copy of pattern
//       A into it behind a spin kernel (kernels/spin_wait.h) on a stream:
//       prints "ROW <slot>" and "QUEUED" (the copy is still pending); on
//       SIGUSR1 lets the stream run and prints "LANDED" once the copy has
//       landed; then waits to be killed, never releasing the slot.
//   kvtier_device_pool_engine claim SOCKET NS GPU 0 1 1 BYTES DROP
//       Force-drops namespace DROP (the engine socket's drop), attaches NS
//       and reserves device slots one at a time until the pool refuses:
//       prints "ROWS s,s,..."; writes pattern B into each and prints
//       "WRITTEN". On SIGUSR1 reads them back: "INTACT 1" when each still
//       holds pattern B, else "INTACT 0"; then "CHECKED". On a second
//       SIGUSR1 reserves one more slot, retrying for 30 s: "GOT <slot>" (or
//       "NONE"). Exit 0 when intact, 1 otherwise.
#include <cuda_runtime_api.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "client/device_pool_client.h"
#include "kernels/spin_wait_launch.h"
#include "tests/test_pattern.h"

namespace {

#define CUDA_OK(x)                                                 \
  do {                                                             \
    cudaError_t e = (x);                                           \
    if (e != cudaSuccess) {                                        \
      std::fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e)); \
      std::exit(1);                                                \
    }                                                              \
  } while (0)

int Die(const char* what, const absl::Status& s) {
  std::fprintf(stderr, "kvtier_device_pool_engine: %s: %s\n", what,
               s.ToString().c_str());
  return 1;
}

constexpr uint64_t kSeed = 0x5eed;

// Snapshot pattern of (rank, page), 8 bytes at a time (fast for tens of MB).
void FillSnapshot(uint8_t* p, uint64_t bytes, uint32_t rank, uint32_t page) {
  uint64_t state = kSeed ^ (uint64_t{rank} << 40) ^ (uint64_t{page} << 20);
  for (uint64_t i = 0; i + 8 <= bytes; i += 8) {
    const uint64_t v = kvtier::testing::SplitMix(state);
    std::memcpy(p + i, &v, 8);
  }
  for (uint64_t i = bytes / 8 * 8; i < bytes; ++i) {
    p[i] = static_cast<uint8_t>(kvtier::testing::SplitMix(state));
  }
}

kvtier::client::AttachOptions Options(const std::string& ns, uint32_t rank,
                                      uint32_t tp, uint32_t pages,
                                      uint64_t bytes) {
  kvtier::client::AttachOptions o;
  o.name = ns;
  o.layout.model = "device-pool-test";
  o.layout.tokens_per_page = 16;
  o.layout.num_layers = 1;
  o.layout.page_banks = {{"kv", 4096, "bf16"}};
  o.layout.snapshot_row_bytes = bytes;
  o.layout.tp_size = tp;
  o.tp_rank = rank;
  o.capacity.page_rows = 4 * pages + 16;
  o.capacity.snapshot_rows = pages + 4;
  return o;
}

// The device pool of the current GPU (matched by PCI bus id), or an error.
absl::StatusOr<
    std::pair<uint32_t, std::unique_ptr<kvtier::client::DevicePoolHandle>>>
OpenLocalPool(const kvtier::client::Namespace& ns) {
  absl::Status last = absl::NotFoundError(
      "the daemon exports no device pool (--device_pool_bytes)");
  for (uint32_t i = 0; i < ns.device_pools().size(); ++i) {
    auto h = kvtier::client::DevicePoolHandle::Open(ns, i);
    if (h.ok()) return std::make_pair(i, *std::move(h));
    last = h.status();
  }
  return last;
}

struct Args {
  std::string mode, socket, ns;
  int gpu = 0;
  uint32_t rank = 0, tp = 1, pages = 0;
  uint64_t bytes = 0;
  std::string last;
};

int Fill(const Args& a) {
  std::vector<uint32_t> snap_pages;
  if (a.last == "all") {
    for (uint32_t p = 0; p < a.pages; ++p) snap_pages.push_back(p);
  } else {
    for (absl::string_view s : absl::StrSplit(a.last, ',')) {
      uint32_t p = 0;
      if (!absl::SimpleAtoi(s, &p) || p >= a.pages) {
        std::fprintf(stderr, "bad snapshot page '%s'\n",
                     std::string(s).c_str());
        return 2;
      }
      snap_pages.push_back(p);
    }
  }
  auto client = kvtier::client::Client::Connect(
      {.socket = a.socket, .client_name = "devpool-fill"});
  if (!client.ok()) return Die("connect", client.status());
  auto ns = (*client)->Attach(Options(a.ns, a.rank, a.tp, a.pages, a.bytes));
  if (!ns.ok()) return Die("attach", ns.status());
  auto pool = OpenLocalPool(**ns);
  if (!pool.ok()) return Die("open device pool", pool.status());
  const kvtier::client::BankMapping* snap_bank = (*ns)->snapshot_bank();
  if (snap_bank == nullptr || !snap_bank->cuda_registered) {
    return Die("snapshot bank", absl::FailedPreconditionError("not mapped"));
  }
  const uint32_t n = static_cast<uint32_t>(snap_pages.size());
  auto res = (*ns)->Reserve(a.pages, n, n, pool->first);
  if (!res.ok()) return Die("reserve", res.status());
  const std::string hashes =
      (*ns)->hasher().HashChain(kvtier::testing::TestTokens(1, a.pages * 16));
  const uint32_t hb = (*ns)->hasher().hash_bytes();
  // KV pages: written straight into the mapped host rows.
  const kvtier::client::BankMapping& kv = (*ns)->page_banks()[0];
  for (uint32_t p = 0; p < a.pages; ++p) {
    kvtier::testing::FillPattern(kv.base + res->page_rows()[p] * kv.row_stride,
                                 kv.row_bytes, kSeed + a.rank, p, 0);
  }
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  void* src = nullptr;
  CUDA_OK(cudaMalloc(&src, a.bytes));
  std::vector<uint8_t> host(a.bytes);
  std::vector<kvtier::client::SnapshotPlacement> host_snaps, device_snaps;
  for (uint32_t i = 0; i < n; ++i) {
    const uint32_t page = snap_pages[i];
    FillSnapshot(host.data(), a.bytes, a.rank, page);
    CUDA_OK(cudaMemcpy(src, host.data(), a.bytes, cudaMemcpyHostToDevice));
    // The engine's snapshot goes to both tiers: the host bank over UVA and
    // the daemon's HBM slot device-to-device.
    CUDA_OK(cudaMemcpyAsync(
        snap_bank->base + res->snapshot_rows()[i] * snap_bank->row_stride, src,
        a.bytes, cudaMemcpyDefault, stream));
    if (absl::Status s = pool->second->SaveSnapshot(
            res->device_snapshot_rows()[i], src, a.bytes, stream);
        !s.ok()) {
      return Die("save snapshot", s);
    }
    CUDA_OK(cudaStreamSynchronize(stream));
    const std::string h = hashes.substr(page * hb, hb);
    host_snaps.push_back({i, h});
    device_snaps.push_back({i, h});
  }
  auto c = res->Commit("", hashes, host_snaps, device_snaps);
  if (!c.ok()) return Die("commit", c.status());
  std::printf("FILLED pages=%u snapshots=%u device_snapshots=%u\n", a.pages,
              c->committed_snapshots + c->deduplicated_snapshots, n);
  std::fflush(stdout);
  for (;;) pause();  // The test kills us: the pool must survive it.
}

int Restore(const Args& a) {
  uint32_t expect = 0;
  if (!absl::SimpleAtoi(a.last, &expect)) return 2;
  CUDA_OK(cudaSetDevice(a.gpu));
  auto client = kvtier::client::Client::Connect(
      {.socket = a.socket, .client_name = "devpool-restore"});
  if (!client.ok()) return Die("connect", client.status());
  auto ns = (*client)->Attach(Options(a.ns, a.rank, a.tp, a.pages, a.bytes));
  if (!ns.ok()) return Die("attach", ns.status());
  auto pool = OpenLocalPool(**ns);
  if (!pool.ok()) return Die("open device pool", pool.status());
  const uint32_t pool_index = pool->first;
  kvtier::client::DevicePoolHandle& dp = *pool->second;
  const std::string hashes =
      (*ns)->hasher().HashChain(kvtier::testing::TestTokens(1, a.pages * 16));
  const uint32_t hb = (*ns)->hasher().hash_bytes();
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  void* dst = nullptr;
  CUDA_OK(cudaMalloc(&dst, a.bytes));
  std::vector<uint8_t> want(a.bytes), got(a.bytes);

  auto check = [&](const kvtier::client::Lease& lease, uint32_t page,
                   const char* what) -> bool {
    CUDA_OK(cudaMemset(dst, 0, a.bytes));
    if (absl::Status s = dp.RestoreSnapshot(lease, dst, a.bytes, stream);
        !s.ok()) {
      Die(what, s);
      return false;
    }
    CUDA_OK(cudaStreamSynchronize(stream));
    CUDA_OK(cudaMemcpy(got.data(), dst, a.bytes, cudaMemcpyDeviceToHost));
    FillSnapshot(want.data(), a.bytes, a.rank, page);
    if (std::memcmp(got.data(), want.data(), a.bytes) != 0) {
      std::fprintf(stderr, "%s: snapshot of page %u differs\n", what, page);
      return false;
    }
    return true;
  };

  // The whole prefix: the group's answer.
  {
    auto lease = (*ns)->LookupWithDevice(hashes, pool_index);
    if (!lease.ok()) return Die("lookup", lease.status());
    std::printf("lookup matched=%u usable=%u device=%d\n",
                lease->matched_pages(), lease->usable_pages(),
                lease->has_device_snapshot());
    if (lease->usable_pages() != expect || !lease->has_device_snapshot()) {
      std::fprintf(stderr, "expected %u usable pages served from HBM\n",
                   expect);
      return 1;
    }
    if (!check(*lease, expect - 1, "restore (device)")) return 1;
    const kvtier::client::BankMapping& kv = (*ns)->page_banks()[0];
    for (uint32_t p = 0; p < expect; ++p) {
      if (!kvtier::testing::CheckPattern(
              kv.base + lease->rows()[p] * kv.row_stride, kv.row_bytes,
              kSeed + a.rank, p, 0)) {
        std::fprintf(stderr, "kv page %u differs\n", p);
        return 1;
      }
    }
  }
  if (a.tp == 1) {
    // Every snapshot, from each tier, and the timing of both.
    std::vector<kvtier::client::Lease> dev, host;
    for (uint32_t p = 0; p < a.pages; ++p) {
      auto d = (*ns)->LookupWithDevice(
          std::string_view(hashes).substr(0, (p + 1) * hb), pool_index);
      auto h = (*ns)->Lookup(std::string_view(hashes).substr(0, (p + 1) * hb));
      if (!d.ok() || !h.ok())
        return Die("lookup", d.ok() ? h.status() : d.status());
      if (!d->has_device_snapshot() || h->has_device_snapshot() ||
          !h->has_snapshot() || d->usable_pages() != p + 1) {
        std::fprintf(stderr, "page %u: not in both tiers\n", p);
        return 1;
      }
      if (!check(*d, p, "restore (device)") ||
          !check(*h, p, "restore (host)")) {
        return 1;
      }
      dev.push_back(*std::move(d));
      host.push_back(*std::move(h));
    }
    // Restore all of them into the same destination back to back.
    cudaEvent_t t0, t1;
    CUDA_OK(cudaEventCreate(&t0));
    CUDA_OK(cudaEventCreate(&t1));
    auto time =
        [&](const std::vector<kvtier::client::Lease>& leases) -> double {
      double best = 1e30;
      for (int rep = 0; rep < 4; ++rep) {
        CUDA_OK(cudaEventRecord(t0, stream));
        for (const auto& l : leases) {
          if (!dp.RestoreSnapshot(l, dst, a.bytes, stream).ok()) return -1;
        }
        CUDA_OK(cudaEventRecord(t1, stream));
        CUDA_OK(cudaEventSynchronize(t1));
        float ms = 0;
        CUDA_OK(cudaEventElapsedTime(&ms, t0, t1));
        if (rep > 0 && ms < best) best = ms;  // rep 0 warms up.
      }
      return best;
    };
    const double dev_ms = time(dev), host_ms = time(host);
    const double gb = static_cast<double>(a.bytes) * a.pages / 1e9;
    std::printf(
        "{\"snapshots\": %u, \"snapshot_bytes\": %llu, "
        "\"device_restore_ms\": %.3f, \"host_restore_ms\": %.3f, "
        "\"device_GBps\": %.1f, \"host_GBps\": %.1f}\n",
        a.pages, static_cast<unsigned long long>(a.bytes), dev_ms, host_ms,
        gb / (dev_ms / 1e3), gb / (host_ms / 1e3));
  }
  std::printf("RESTORED_OK\n");
  std::fflush(stdout);

  // Now the test stops the daemon: its GPU memory goes with it.
  auto lease = (*ns)->LookupWithDevice(hashes, pool_index, /*pin=*/false);
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while ((*client)->session_alive() && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  if ((*client)->session_alive()) {
    std::fprintf(stderr, "the daemon did not stop\n");
    return 1;
  }
  const absl::Status checked = dp.Check();
  auto slot = dp.Slot(0);
  const absl::Status restored =
      lease.ok() ? dp.RestoreSnapshot(*lease, dst, a.bytes, stream)
                 : lease.status();
  auto res = (*ns)->Reserve(0, 0, 1, pool_index);
  auto miss = (*ns)->LookupWithDevice(hashes, pool_index);
  std::printf("after stop: check=%s slot=%s restore=%s reserve=%s\n",
              checked.ToString().c_str(), slot.status().ToString().c_str(),
              restored.ToString().c_str(), res.status().ToString().c_str());
  if (checked.code() != absl::StatusCode::kUnavailable ||
      slot.status().code() != absl::StatusCode::kUnavailable ||
      restored.code() != absl::StatusCode::kUnavailable ||
      res.status().code() != absl::StatusCode::kUnavailable || !miss.ok() ||
      miss->has_device_snapshot()) {
    return 1;
  }
  std::printf("STALE_OK\n");
  std::fflush(stdout);
  return 0;
}

// SIGUSR1 is blocked in every thread (main blocks it before CUDA or
// libkvtier starts any) and taken here.
void AwaitGo() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGUSR1);
  int sig = 0;
  while (sigwait(&set, &sig) != 0 || sig != SIGUSR1) {
  }
}

// The snapshot patterns of the late copy and of the claiming engine.
constexpr uint32_t kLateSeed = 0xa;
constexpr uint32_t kClaimSeed = 0xb;

int Late(const Args& a) {
  auto client = kvtier::client::Client::Connect(
      {.socket = a.socket, .client_name = "devpool-late"});
  if (!client.ok()) return Die("connect", client.status());
  auto ns = (*client)->Attach(Options(a.ns, 0, 1, 1, a.bytes));
  if (!ns.ok()) return Die("attach", ns.status());
  auto pool = OpenLocalPool(**ns);
  if (!pool.ok()) return Die("open device pool", pool.status());
  auto res = (*ns)->Reserve(0, 0, 1, pool->first);
  if (!res.ok()) return Die("reserve", res.status());
  const uint32_t row = res->device_snapshot_rows()[0];
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  void* flag = nullptr;
  void* device_flag = nullptr;
  CUDA_OK(cudaHostAlloc(&flag, sizeof(uint32_t), cudaHostAllocMapped));
  CUDA_OK(cudaHostGetDevicePointer(&device_flag, flag, 0));
  *static_cast<volatile uint32_t*>(flag) = 0;
  void* src = nullptr;
  CUDA_OK(cudaMalloc(&src, a.bytes));
  std::vector<uint8_t> host(a.bytes);
  FillSnapshot(host.data(), a.bytes, kLateSeed, 0);
  CUDA_OK(cudaMemcpy(src, host.data(), a.bytes, cudaMemcpyHostToDevice));
  if (absl::Status s = kvtier::kernels::LaunchSpinUntil(
          static_cast<const uint32_t*>(device_flag), stream);
      !s.ok()) {
    return Die("spin", s);
  }
  if (absl::Status s = pool->second->SaveSnapshot(row, src, a.bytes, stream);
      !s.ok()) {
    return Die("save snapshot", s);
  }
  if (cudaStreamQuery(stream) != cudaErrorNotReady) {
    std::fprintf(stderr, "the copy is not held behind the spin\n");
    return 1;
  }
  std::printf("ROW %u\nQUEUED\n", row);
  std::fflush(stdout);
  AwaitGo();
  __atomic_store_n(static_cast<uint32_t*>(flag), 1, __ATOMIC_RELEASE);
  CUDA_OK(cudaStreamSynchronize(stream));
  std::printf("LANDED\n");
  std::fflush(stdout);
  for (;;) pause();  // Holding the slot until the test kills us.
}

int Claim(const Args& a) {
  auto client = kvtier::client::Client::Connect(
      {.socket = a.socket, .client_name = "devpool-claim"});
  if (!client.ok()) return Die("connect", client.status());
  auto dropped = (*client)->Drop(a.last, {}, /*force=*/true);
  if (!dropped.ok()) return Die("drop", dropped.status());
  auto ns = (*client)->Attach(Options(a.ns, 0, 1, 1, a.bytes));
  if (!ns.ok()) return Die("attach", ns.status());
  auto pool = OpenLocalPool(**ns);
  if (!pool.ok()) return Die("open device pool", pool.status());
  kvtier::client::DevicePoolHandle& dp = *pool->second;
  std::vector<kvtier::client::Reservation> held;
  std::vector<uint32_t> rows;
  for (;;) {
    auto r = (*ns)->Reserve(0, 0, 1, pool->first);
    if (!r.ok()) {
      if (r.status().code() != absl::StatusCode::kResourceExhausted) {
        return Die("reserve", r.status());
      }
      break;
    }
    rows.push_back(r->device_snapshot_rows()[0]);
    held.push_back(*std::move(r));
  }
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  void* src = nullptr;
  CUDA_OK(cudaMalloc(&src, a.bytes));
  std::vector<uint8_t> want(a.bytes), got(a.bytes);
  for (uint32_t i = 0; i < rows.size(); ++i) {
    FillSnapshot(want.data(), a.bytes, kClaimSeed, i);
    CUDA_OK(cudaMemcpy(src, want.data(), a.bytes, cudaMemcpyHostToDevice));
    if (absl::Status s = dp.SaveSnapshot(rows[i], src, a.bytes, stream);
        !s.ok()) {
      return Die("save snapshot", s);
    }
    CUDA_OK(cudaStreamSynchronize(stream));
  }
  std::printf("ROWS %s\nWRITTEN\n", absl::StrJoin(rows, ",").c_str());
  std::fflush(stdout);
  AwaitGo();
  bool intact = true;
  for (uint32_t i = 0; i < rows.size(); ++i) {
    auto slot = dp.Slot(rows[i]);
    if (!slot.ok()) return Die("slot", slot.status());
    CUDA_OK(cudaMemcpy(got.data(), *slot, a.bytes, cudaMemcpyDeviceToHost));
    FillSnapshot(want.data(), a.bytes, kClaimSeed, i);
    if (std::memcmp(got.data(), want.data(), a.bytes) != 0) {
      std::fprintf(stderr, "slot %u lost its bytes\n", rows[i]);
      intact = false;
    }
  }
  std::printf("INTACT %d\nCHECKED\n", intact ? 1 : 0);
  std::fflush(stdout);
  AwaitGo();
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  for (;;) {
    auto r = (*ns)->Reserve(0, 0, 1, pool->first);
    if (r.ok()) {
      std::printf("GOT %u\n", r->device_snapshot_rows()[0]);
      break;
    }
    if (absl::Now() > deadline) {
      std::printf("NONE %s\n", r.status().ToString().c_str());
      break;
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  std::fflush(stdout);
  return intact ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  // Before CUDA and libkvtier start threads: they all inherit the block.
  sigset_t usr1;
  sigemptyset(&usr1);
  sigaddset(&usr1, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &usr1, nullptr);
  if (argc != 10) {
    std::fprintf(stderr,
                 "usage: %s fill|restore|late|claim SOCKET NS GPU RANK TP "
                 "PAGES BYTES SNAPS|MATCH|-|DROP\n",
                 argv[0]);
    return 2;
  }
  Args a;
  a.mode = argv[1];
  a.socket = argv[2];
  a.ns = argv[3];
  if (!absl::SimpleAtoi(argv[4], &a.gpu) ||
      !absl::SimpleAtoi(argv[5], &a.rank) ||
      !absl::SimpleAtoi(argv[6], &a.tp) ||
      !absl::SimpleAtoi(argv[7], &a.pages) ||
      !absl::SimpleAtoi(argv[8], &a.bytes) || a.pages == 0 || a.bytes == 0) {
    std::fprintf(stderr, "bad numeric argument\n");
    return 2;
  }
  a.last = argv[9];
  CUDA_OK(cudaSetDevice(a.gpu));
  if (a.mode == "fill") return Fill(a);
  if (a.mode == "restore") return Restore(a);
  if (a.mode == "late") return Late(a);
  if (a.mode == "claim") return Claim(a);
  std::fprintf(stderr, "unknown mode %s\n", a.mode.c_str());
  return 2;
}
