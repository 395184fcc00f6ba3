// GPU tests of TransferEngine's CUDA backend. Every test runs the same
// transfers on the CUDA backend (pool in cudaMalloc memory, host banks mmap'd
// and registered with cudaHostRegister as mapped, reached over UVA) and on
// the reference backend (pool and banks in host memory, same layout, same
// initial bytes), then compares banks and pools bit for bit. The round trips
// run on both CUDA paths (staged: gather + copy engine; direct: UVA kernel)
// and with tiny staging buffers (many slices, buffers reused within a call);
// further tests cover stream ordering across calls, both directions at once,
// graph capture (direct path) and the device memory the engine takes. Each
// test skips where no CUDA device is present.

#include <cuda_runtime_api.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "client/pool.h"
#include "client/transfer_engine.h"
#include "client/transfer_plan.h"
#include "gtest/gtest.h"
#include "kernels/page_copy.h"

namespace kvtier::client {
namespace {

bool HasDevice() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return n > 0;
}

#define SKIP_WITHOUT_DEVICE()                                   \
  do {                                                          \
    if (!HasDevice()) GTEST_SKIP() << "no CUDA device present"; \
  } while (0)

#define ASSERT_CUDA(expr)                                                      \
  do {                                                                         \
    const cudaError_t err_ = (expr);                                           \
    ASSERT_EQ(err_, cudaSuccess) << #expr << ": " << cudaGetErrorString(err_); \
  } while (0)

uint64_t RoundUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

// splitmix64: fast enough to fill GiBs of test data.
void FillRandom(uint8_t* p, size_t n, uint64_t seed) {
  uint64_t x = seed;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t z = (x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    std::memcpy(p + i, &z, 8);
  }
  for (; i < n; ++i) p[i] = static_cast<uint8_t>(i * 131 + seed);
}

class HostMem {
 public:
  HostMem() = default;
  explicit HostMem(size_t bytes)
      : bytes_(bytes),
        p_(static_cast<uint8_t*>(
            std::aligned_alloc(4096, RoundUp(bytes, 4096)))) {}
  uint8_t* data() const { return p_.get(); }
  size_t size() const { return bytes_; }

 private:
  struct Free {
    void operator()(uint8_t* p) const { std::free(p); }
  };
  size_t bytes_ = 0;
  std::unique_ptr<uint8_t, Free> p_;
};

class DeviceMem {
 public:
  DeviceMem() = default;
  DeviceMem(const DeviceMem&) = delete;
  DeviceMem& operator=(const DeviceMem&) = delete;
  ~DeviceMem() {
    if (p_ != nullptr) cudaFree(p_);
  }
  cudaError_t Allocate(size_t bytes) { return cudaMalloc(&p_, bytes); }
  uint8_t* data() const { return static_cast<uint8_t*>(p_); }

 private:
  void* p_ = nullptr;
};

// A host bank as libkvtier maps one: an mmap'd region registered with CUDA
// as mapped and portable, used through its device pointer.
class RegisteredBank {
 public:
  RegisteredBank() = default;
  RegisteredBank(const RegisteredBank&) = delete;
  RegisteredBank& operator=(const RegisteredBank&) = delete;
  ~RegisteredBank() {
    if (registered_) cudaHostUnregister(host_);
    if (host_ != nullptr) munmap(host_, bytes_);
  }
  cudaError_t Map(size_t bytes) {
    bytes_ = RoundUp(bytes, 4096);
    void* p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (p == MAP_FAILED) return cudaErrorMemoryAllocation;
    host_ = static_cast<uint8_t*>(p);
    cudaError_t err = cudaHostRegister(
        host_, bytes_, cudaHostRegisterMapped | cudaHostRegisterPortable);
    if (err != cudaSuccess) return err;
    registered_ = true;
    void* dev = nullptr;
    err = cudaHostGetDevicePointer(&dev, host_, 0);
    device_ = static_cast<uint8_t*>(dev);
    return err;
  }
  uint8_t* host() const { return host_; }
  uint8_t* device() const { return device_; }

 private:
  size_t bytes_ = 0;
  uint8_t* host_ = nullptr;
  uint8_t* device_ = nullptr;
  bool registered_ = false;
};

struct TensorSpec {
  uint64_t bytes;
  uint64_t stride;  // ignored for page-major pools
};
struct BankSpec {
  std::string name;
  std::vector<TensorSpec> tensors;
};

// bf16: 32 layers x (K, V), 16 tokens x 8 KV heads x 128 dims x 2 bytes =
// 32 KiB per tensor per page, 2 MiB per row.
std::vector<BankSpec> Bf16Layout(int layers) {
  BankSpec kv{"kv", {}};
  for (int i = 0; i < 2 * layers; ++i) kv.tensors.push_back({32768, 32768});
  return {kv};
}

// fp8 K/V (16 KiB per tensor per page) and a "scale" bank of per-token fp32
// scales (16 tokens x 4 bytes) per layer and K/V.
std::vector<BankSpec> Fp8Layout(int layers) {
  BankSpec kv{"kv", {}};
  BankSpec scale{"scale", {}};
  for (int i = 0; i < 2 * layers; ++i) {
    kv.tensors.push_back({16384, 16384});
    scale.tensors.push_back({64, 64});
  }
  return {kv, scale};
}

// Odd sizes: rows of 194 and 3 bytes; tensors at odd offsets of the row
// take the 4-byte and byte paths of the kernel.
std::vector<BankSpec> OddLayout() {
  return {
      BankSpec{"kv", {{100, 112}, {37, 48}, {7, 16}, {50, 64}, {40000, 40000}}},
      BankSpec{"scale", {{3, 16}}}};
}

// Two recurrent layers: 32 heads x 128 x 128 fp32 state (2 MiB) and an
// odd-sized conv state each.
std::vector<TensorSpec> SnapshotLayout() {
  return {
      {2 << 20, 2 << 20}, {12300, 12304}, {2 << 20, 2 << 20}, {12300, 12304}};
}

struct Options {
  uint64_t num_pages = 0;
  uint64_t rows = 0;
  // Page-major pool: every tensor shares one page stride (all of a page's
  // tensors side by side), so page offsets exceed 4 GiB in big pools.
  bool page_major = false;
  std::vector<TensorSpec> snapshot;
  uint64_t slots = 0;
  uint64_t snapshot_rows = 0;
};

Options PoolOf(uint64_t num_pages, uint64_t rows, bool page_major = false) {
  Options o;
  o.num_pages = num_pages;
  o.rows = rows;
  o.page_major = page_major;
  return o;
}

// The same pool and banks twice: on the device (CUDA backend) and in host
// memory (reference backend), with identical initial bytes.
struct Twin {
  std::vector<BankSpec> spec;
  Options opt;
  uint64_t pool_bytes = 0;
  GpuPoolDescriptor layout;  // addresses relative to the pool start
  std::vector<uint64_t> row_bytes, row_stride;
  uint64_t snapshot_row_bytes = 0, snapshot_row_stride = 0;

  DeviceMem dpool;
  HostMem mirror;
  std::vector<std::unique_ptr<RegisteredBank>> dbanks;
  std::vector<HostMem> rbanks;
  RegisteredBank dsnap;
  HostMem rsnap;
  // What the CUDA engine was created from, to create more.
  GpuPoolDescriptor dpool_desc;
  std::vector<NamedHostBank> dviews;
  std::optional<HostBankView> dsnap_view;
  std::unique_ptr<TransferEngine> cuda, ref;
  cudaStream_t stream = nullptr;

  ~Twin() {
    if (stream != nullptr) cudaStreamDestroy(stream);
  }

  static GpuPoolDescriptor Rebase(const GpuPoolDescriptor& d, uint64_t base) {
    GpuPoolDescriptor out = d;
    for (auto& b : out.banks) {
      for (auto& t : b.tensors) t.base += base;
    }
    for (auto& t : out.snapshot) t.base += base;
    return out;
  }
};

void Build(const std::vector<BankSpec>& spec, const Options& opt, Twin* t,
           const TransferOptions& cuda_options = {}) {
  t->spec = spec;
  t->opt = opt;
  GpuPoolDescriptor& d = t->layout;
  d.device = 0;
  d.num_pages = opt.num_pages;
  uint64_t offset = 0;
  if (opt.page_major) {
    uint64_t page = 0;
    for (const BankSpec& b : spec) {
      for (const TensorSpec& ts : b.tensors) page += RoundUp(ts.bytes, 16);
    }
    uint64_t in_page = 0;
    for (const BankSpec& b : spec) {
      BankPool bp{b.name, {}};
      for (const TensorSpec& ts : b.tensors) {
        bp.tensors.push_back(PoolTensor{in_page, page, ts.bytes});
        in_page += RoundUp(ts.bytes, 16);
      }
      d.banks.push_back(bp);
    }
    offset = page * opt.num_pages;
  } else {
    for (const BankSpec& b : spec) {
      BankPool bp{b.name, {}};
      for (const TensorSpec& ts : b.tensors) {
        bp.tensors.push_back(PoolTensor{offset, ts.stride, ts.bytes});
        offset = RoundUp(offset + ts.stride * opt.num_pages, 256);
      }
      d.banks.push_back(bp);
    }
  }
  for (const TensorSpec& ts : opt.snapshot) {
    d.snapshot.push_back(PoolTensor{offset, ts.stride, ts.bytes});
    offset = RoundUp(offset + ts.stride * opt.slots, 256);
    t->snapshot_row_bytes += ts.bytes;
  }
  d.num_snapshot_slots = opt.slots;
  t->pool_bytes = offset;
  for (const BankSpec& b : spec) {
    uint64_t sum = 0;
    for (const TensorSpec& ts : b.tensors) sum += ts.bytes;
    t->row_bytes.push_back(sum);
    t->row_stride.push_back(RoundUp(sum, 16));
  }
  t->snapshot_row_stride = RoundUp(t->snapshot_row_bytes, 16);

  // Pools: random bytes, identical on both sides (padding included).
  ASSERT_CUDA(t->dpool.Allocate(t->pool_bytes));
  t->mirror = HostMem(t->pool_bytes);
  FillRandom(t->mirror.data(), t->pool_bytes, 1);
  ASSERT_CUDA(cudaMemcpy(t->dpool.data(), t->mirror.data(), t->pool_bytes,
                         cudaMemcpyHostToDevice));

  // Banks: a fixed pattern on both sides, so untouched rows compare equal.
  std::vector<NamedHostBank> dviews, rviews;
  for (size_t b = 0; b < spec.size(); ++b) {
    const uint64_t bytes = t->row_stride[b] * opt.rows;
    t->dbanks.push_back(std::make_unique<RegisteredBank>());
    ASSERT_CUDA(t->dbanks.back()->Map(bytes));
    t->rbanks.emplace_back(bytes);
    std::memset(t->dbanks.back()->host(), 0x5a, bytes);
    std::memset(t->rbanks.back().data(), 0x5a, bytes);
    dviews.push_back(
        {spec[b].name,
         HostBankView{reinterpret_cast<uint64_t>(t->dbanks.back()->device()),
                      opt.rows, t->row_bytes[b], t->row_stride[b]}});
    rviews.push_back(
        {spec[b].name,
         HostBankView{reinterpret_cast<uint64_t>(t->rbanks.back().data()),
                      opt.rows, t->row_bytes[b], t->row_stride[b]}});
  }
  std::optional<HostBankView> dsnap, rsnap;
  if (!opt.snapshot.empty()) {
    const uint64_t bytes = t->snapshot_row_stride * opt.snapshot_rows;
    ASSERT_CUDA(t->dsnap.Map(bytes));
    t->rsnap = HostMem(bytes);
    std::memset(t->dsnap.host(), 0x33, bytes);
    std::memset(t->rsnap.data(), 0x33, bytes);
    dsnap = HostBankView{reinterpret_cast<uint64_t>(t->dsnap.device()),
                         opt.snapshot_rows, t->snapshot_row_bytes,
                         t->snapshot_row_stride};
    rsnap = HostBankView{reinterpret_cast<uint64_t>(t->rsnap.data()),
                         opt.snapshot_rows, t->snapshot_row_bytes,
                         t->snapshot_row_stride};
  }

  t->dpool_desc = Twin::Rebase(d, reinterpret_cast<uint64_t>(t->dpool.data()));
  t->dviews = dviews;
  t->dsnap_view = dsnap;
  auto cuda = TransferEngine::Create(Backend::kCuda, t->dpool_desc, dviews,
                                     dsnap, cuda_options);
  ASSERT_TRUE(cuda.ok()) << cuda.status();
  t->cuda = *std::move(cuda);
  auto ref = TransferEngine::Create(
      Backend::kReference,
      Twin::Rebase(d, reinterpret_cast<uint64_t>(t->mirror.data())), rviews,
      rsnap);
  ASSERT_TRUE(ref.ok()) << ref.status();
  t->ref = *std::move(ref);
  ASSERT_CUDA(cudaStreamCreateWithFlags(&t->stream, cudaStreamNonBlocking));
}

// Compares n bytes; on a mismatch reports its offset (and row, if row_stride).
void ExpectSameBytes(const uint8_t* got, const uint8_t* want, size_t n,
                     const std::string& what, uint64_t row_stride = 0) {
  if (std::memcmp(got, want, n) == 0) return;
  size_t i = 0;
  while (got[i] == want[i]) ++i;
  ADD_FAILURE() << what << " differs at byte " << i
                << (row_stride
                        ? " (row " + std::to_string(i / row_stride) +
                              ", offset " + std::to_string(i % row_stride) + ")"
                        : std::string())
                << ": got " << int{got[i]} << ", want " << int{want[i]};
}

void ExpectBanksMatch(const Twin& t) {
  for (size_t b = 0; b < t.spec.size(); ++b) {
    ExpectSameBytes(t.dbanks[b]->host(), t.rbanks[b].data(),
                    t.row_stride[b] * t.opt.rows,
                    "bank '" + t.spec[b].name + "'", t.row_stride[b]);
  }
  if (!t.opt.snapshot.empty()) {
    ExpectSameBytes(t.dsnap.host(), t.rsnap.data(),
                    t.snapshot_row_stride * t.opt.snapshot_rows,
                    "snapshot bank", t.snapshot_row_stride);
  }
}

void ExpectPoolsMatch(const Twin& t) {
  constexpr size_t kChunk = 256 << 20;
  HostMem scratch(std::min<size_t>(kChunk, t.pool_bytes));
  for (size_t off = 0; off < t.pool_bytes; off += kChunk) {
    const size_t n = std::min<size_t>(kChunk, t.pool_bytes - off);
    ASSERT_CUDA(cudaMemcpy(scratch.data(), t.dpool.data() + off, n,
                           cudaMemcpyDeviceToHost));
    ExpectSameBytes(scratch.data(), t.mirror.data() + off, n,
                    "pool bytes from offset " + std::to_string(off));
  }
}

std::vector<uint32_t> Shuffled(uint32_t below, uint32_t seed) {
  std::vector<uint32_t> v(below);
  std::iota(v.begin(), v.end(), 0);
  std::mt19937 rng(seed);
  std::shuffle(v.begin(), v.end(), rng);
  return v;
}

TransferOptions Staged(uint64_t staging_bytes = kDefaultStagingBytes) {
  TransferOptions o;
  o.path = TransferPath::kStaged;
  o.staging_bytes = staging_bytes;
  return o;
}

TransferOptions Direct() {
  TransferOptions o;
  o.path = TransferPath::kDirect;
  return o;
}

TransferOptions CopyEngine() {
  TransferOptions o;
  o.path = TransferPath::kCopyEngine;
  return o;
}

// Evicts n random pages to random rows and rehydrates the rows into a
// disjoint page set, on both backends, comparing after each step. The
// engine must take `expect` (default: direct when asked, else staged).
void RoundTrip(const std::vector<BankSpec>& spec, Options opt, uint32_t n,
               const TransferOptions& options,
               std::optional<TransferPath> expect = std::nullopt) {
  Twin t;
  ASSERT_NO_FATAL_FAILURE(Build(spec, opt, &t, options));
  EXPECT_EQ(t.cuda->path(),
            expect.value_or(options.path == TransferPath::kDirect
                                ? TransferPath::kDirect
                                : TransferPath::kStaged));
  const std::vector<uint32_t> pages =
      Shuffled(static_cast<uint32_t>(opt.num_pages), 11);
  const std::vector<uint32_t> src(pages.begin(), pages.begin() + n);
  const std::vector<uint32_t> dst(pages.begin() + n, pages.begin() + 2 * n);
  // A run of n / 4 consecutive rows first (the staged copies merge it), then
  // random distinct rows.
  const uint32_t run = n / 4;
  const uint32_t r0 = static_cast<uint32_t>(opt.rows - run) / 3;
  std::vector<uint32_t> rows;
  for (uint32_t i = 0; i < run; ++i) rows.push_back(r0 + i);
  for (uint32_t r : Shuffled(static_cast<uint32_t>(opt.rows), 12)) {
    if (rows.size() == n) break;
    if (r < r0 || r >= r0 + run) rows.push_back(r);
  }
  ASSERT_EQ(rows.size(), n);

  ASSERT_TRUE(t.cuda->Evict(src, rows, t.stream).ok());
  ASSERT_TRUE(t.ref->Evict(src, rows, nullptr).ok());
  ASSERT_CUDA(cudaStreamSynchronize(t.stream));
  ExpectBanksMatch(t);

  ASSERT_TRUE(t.cuda->Rehydrate(dst, rows, t.stream).ok());
  ASSERT_TRUE(t.ref->Rehydrate(dst, rows, nullptr).ok());
  ASSERT_CUDA(cudaStreamSynchronize(t.stream));
  ExpectPoolsMatch(t);
  const uint64_t slices =
      t.cuda->SlicesFor(kernels::CopyDirection::kToHost, n) +
      t.cuda->SlicesFor(kernels::CopyDirection::kFromHost, n);
  EXPECT_EQ(t.cuda->slices_launched(), slices);

  // A bad call enqueues nothing.
  rows[n - 1] = static_cast<uint32_t>(opt.rows);
  absl::Status st = t.cuda->Evict(src, rows, t.stream);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(t.cuda->slices_launched(), slices);
  ASSERT_CUDA(cudaStreamSynchronize(t.stream));
  ExpectBanksMatch(t);
}

// Default options (staged), the direct path, and staging buffers of three
// pages (many slices per call, each buffer reused within the call).
void RoundTripAllPaths(const std::vector<BankSpec>& spec, Options opt,
                       uint32_t n) {
  uint64_t page = 0;
  for (const BankSpec& b : spec) {
    uint64_t sum = 0;
    for (const TensorSpec& ts : b.tensors) sum += ts.bytes;
    page += RoundUp(sum, 16);
  }
  SCOPED_TRACE("default options");
  ASSERT_NO_FATAL_FAILURE(RoundTrip(spec, opt, n, TransferOptions{}));
  SCOPED_TRACE("direct");
  ASSERT_NO_FATAL_FAILURE(RoundTrip(spec, opt, n, Direct()));
  SCOPED_TRACE("staged, 3-page buffers");
  ASSERT_NO_FATAL_FAILURE(RoundTrip(spec, opt, n, Staged(3 * page)));
  // One-page first slices and kernel streams at the default priority: the
  // benchmark's knobs move the same bytes.
  SCOPED_TRACE("staged, one-page first slice, default priority");
  TransferOptions knobs = Staged(8 * page);
  knobs.first_slice_bytes = page;
  knobs.staging_priority = StagingPriority::kDefault;
  ASSERT_NO_FATAL_FAILURE(RoundTrip(spec, opt, n, knobs));
  // 40 % of the pages straight through the copy engine (2D copies on the
  // lane's side stream), the rest staged.
  SCOPED_TRACE("staged with a 40 % copy-engine share");
  TransferOptions share = Staged(3 * page);
  share.copy_engine_share = 40;
  ASSERT_NO_FATAL_FAILURE(RoundTrip(spec, opt, n, share));
}

TEST(TransferEngineGpu, Bf16RoundTripMatchesReference) {
  SKIP_WITHOUT_DEVICE();
  RoundTripAllPaths(Bf16Layout(32), PoolOf(320, 200), 150);
}

TEST(TransferEngineGpu, Fp8WithScaleBankRoundTripMatchesReference) {
  SKIP_WITHOUT_DEVICE();
  RoundTripAllPaths(Fp8Layout(32), PoolOf(320, 200), 150);
}

TEST(TransferEngineGpu, OddRowSizesRoundTripMatchesReference) {
  SKIP_WITHOUT_DEVICE();
  RoundTripAllPaths(OddLayout(), PoolOf(4096, 2048), 1500);
}

TEST(TransferEngineGpu, PageMajorPoolRoundTripMatchesReference) {
  SKIP_WITHOUT_DEVICE();
  RoundTripAllPaths(Fp8Layout(4), PoolOf(512, 256, /*page_major=*/true), 200);
}

// vLLM's block-first pools: a page of 8 x 32 KiB is one contiguous 256 KiB
// run in the pool and in the row, so kAuto leaves it to the copy engine (no
// kernel); the bytes are the reference's. Asked for, the copy engine also
// moves a tensor-major pool of two banks (one copy per tensor and page).
// Under graph capture the block-first engine records kernel nodes instead.
TEST(TransferEngineGpu, BlockFirstPoolsGoThroughTheCopyEngine) {
  SKIP_WITHOUT_DEVICE();
  {
    SCOPED_TRACE("block-first, default options");
    ASSERT_NO_FATAL_FAILURE(
        RoundTrip(Bf16Layout(4), PoolOf(256, 128, /*page_major=*/true), 100,
                  TransferOptions{}, TransferPath::kCopyEngine));
  }
  {
    SCOPED_TRACE("tensor-major, copy engine asked for");
    ASSERT_NO_FATAL_FAILURE(RoundTrip(Fp8Layout(4), PoolOf(320, 200), 150,
                                      CopyEngine(), TransferPath::kCopyEngine));
  }
  {
    // Staged with 60 % of the pages in one copy-engine batch beside it.
    SCOPED_TRACE("block-first, staged with a 60 % copy-engine share");
    TransferOptions share;
    share.path = TransferPath::kStaged;
    share.copy_engine_share = 60;
    ASSERT_NO_FATAL_FAILURE(RoundTrip(Bf16Layout(4),
                                      PoolOf(256, 128, /*page_major=*/true),
                                      100, share, TransferPath::kStaged));
  }
  Twin t;
  ASSERT_NO_FATAL_FAILURE(
      Build(Bf16Layout(4), PoolOf(256, 128, /*page_major=*/true), &t));
  ASSERT_EQ(t.cuda->path(), TransferPath::kCopyEngine);
  EXPECT_EQ(t.cuda->plan().page_runs(), 1u);
  const std::vector<uint32_t> pages = Shuffled(256, 41);
  const std::vector<uint32_t> src(pages.begin(), pages.begin() + 100);
  std::vector<uint32_t> rows = Shuffled(128, 42);
  rows.resize(100);
  cudaGraph_t graph = nullptr;
  ASSERT_CUDA(cudaStreamBeginCapture(t.stream, cudaStreamCaptureModeGlobal));
  const absl::Status st = t.cuda->Evict(src, rows, t.stream);
  ASSERT_CUDA(cudaStreamEndCapture(t.stream, &graph));
  ASSERT_TRUE(st.ok()) << st;
  size_t nodes = 0;
  ASSERT_CUDA(cudaGraphGetNodes(graph, nullptr, &nodes));
  EXPECT_EQ(nodes, 1u);  // 100 pages: one direct slice, one kernel node.
  cudaGraphExec_t exec = nullptr;
  ASSERT_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  ASSERT_CUDA(cudaGraphLaunch(exec, t.stream));
  ASSERT_CUDA(cudaStreamSynchronize(t.stream));
  ASSERT_TRUE(t.ref->Evict(src, rows, nullptr).ok());
  ExpectBanksMatch(t);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

// Many calls of both directions on one stream with no synchronisation in
// between, each reading what the one before wrote (rows evicted, then
// rehydrated; pages rehydrated, then evicted), with buffers reused across
// calls: the caller's stream orders staged transfers like kernel launches.
TEST(TransferEngineGpu, BackToBackCallsKeepStreamOrder) {
  SKIP_WITHOUT_DEVICE();
  uint64_t page = 0;
  for (const BankSpec& b : Fp8Layout(4)) {
    uint64_t sum = 0;
    for (const TensorSpec& ts : b.tensors) sum += ts.bytes;
    page += RoundUp(sum, 16);
  }
  Twin t;
  ASSERT_NO_FATAL_FAILURE(
      Build(Fp8Layout(4), PoolOf(1024, 512), &t, Staged(5 * page)));
  std::mt19937 rng(41);
  for (int step = 0; step < 24; ++step) {
    const uint32_t n = 1 + rng() % 40;
    std::vector<uint32_t> pages = Shuffled(1024, 100 + step);
    std::vector<uint32_t> rows = Shuffled(64, 200 + step);  // rows overlap
    pages.resize(2 * n);
    rows.resize(n);
    const std::vector<uint32_t> a(pages.begin(), pages.begin() + n);
    const std::vector<uint32_t> b(pages.begin() + n, pages.end());
    ASSERT_TRUE(t.cuda->Evict(a, rows, t.stream).ok());
    ASSERT_TRUE(t.ref->Evict(a, rows, nullptr).ok());
    ASSERT_TRUE(t.cuda->Rehydrate(b, rows, t.stream).ok());
    ASSERT_TRUE(t.ref->Rehydrate(b, rows, nullptr).ok());
  }
  ASSERT_CUDA(cudaStreamSynchronize(t.stream));
  ExpectBanksMatch(t);
  ExpectPoolsMatch(t);
}

// An eviction and a rehydration at the same time, from two threads on two
// streams (separate lanes: buffers, copy streams), each repeated.
TEST(TransferEngineGpu, EvictAndRehydrateAtOnceOnTwoStreams) {
  SKIP_WITHOUT_DEVICE();
  Twin t;
  ASSERT_NO_FATAL_FAILURE(Build(Bf16Layout(8), PoolOf(2048, 1024), &t));
  cudaStream_t other = nullptr;
  ASSERT_CUDA(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
  const std::vector<uint32_t> pages = Shuffled(2048, 51);
  const std::vector<uint32_t> rows = Shuffled(1024, 52);
  // Rows [0, 300) of `rows` are evicted into; [300, 600) are rehydrated from
  // (first filled by an eviction of other pages).
  const std::vector<uint32_t> out_pages(pages.begin(), pages.begin() + 300);
  const std::vector<uint32_t> out_rows(rows.begin(), rows.begin() + 300);
  const std::vector<uint32_t> seed_pages(pages.begin() + 300,
                                         pages.begin() + 600);
  const std::vector<uint32_t> in_rows(rows.begin() + 300, rows.begin() + 600);
  const std::vector<uint32_t> in_pages(pages.begin() + 600,
                                       pages.begin() + 900);
  ASSERT_TRUE(t.cuda->Evict(seed_pages, in_rows, t.stream).ok());
  ASSERT_TRUE(t.ref->Evict(seed_pages, in_rows, nullptr).ok());
  ASSERT_CUDA(cudaStreamSynchronize(t.stream));
  absl::Status evict_status, rehydrate_status;
  std::thread evictor([&] {
    for (int i = 0; i < 4 && evict_status.ok(); ++i) {
      evict_status = t.cuda->Evict(out_pages, out_rows, t.stream);
    }
  });
  std::thread rehydrator([&] {
    for (int i = 0; i < 4 && rehydrate_status.ok(); ++i) {
      rehydrate_status = t.cuda->Rehydrate(in_pages, in_rows, other);
    }
  });
  evictor.join();
  rehydrator.join();
  ASSERT_TRUE(evict_status.ok()) << evict_status;
  ASSERT_TRUE(rehydrate_status.ok()) << rehydrate_status;
  ASSERT_CUDA(cudaStreamSynchronize(t.stream));
  ASSERT_CUDA(cudaStreamSynchronize(other));
  ASSERT_TRUE(t.ref->Evict(out_pages, out_rows, nullptr).ok());
  ASSERT_TRUE(t.ref->Rehydrate(in_pages, in_rows, nullptr).ok());
  ExpectBanksMatch(t);
  ExpectPoolsMatch(t);
  cudaStreamDestroy(other);
}

// A 2,000-page prefix of random pages of a 4 GiB page-major pool (page
// offsets beyond 4 GiB) evicted and rehydrated by an engine that takes no
// more device memory than 128 pages' worth, counting everything from before
// its Create (staging buffers, streams, events) to the end of the transfers.
TEST(TransferEngineGpu, TwoThousandRandomPagesOfFourGiBPoolInBoundedMemory) {
  SKIP_WITHOUT_DEVICE();
  Twin t;
  ASSERT_NO_FATAL_FAILURE(
      Build(Bf16Layout(32), PoolOf(2048, 2000, /*page_major=*/true), &t));
  ASSERT_GE(t.pool_bytes, 4ull << 30);
  const uint64_t page_bytes = t.row_bytes[0];
  const std::vector<uint32_t> src = [] {
    auto v = Shuffled(2048, 21);
    v.resize(2000);
    return v;
  }();
  const std::vector<uint32_t> dst = [] {
    auto v = Shuffled(2048, 22);
    v.resize(2000);
    return v;
  }();
  const std::vector<uint32_t> rows = Shuffled(2000, 23);

  for (const TransferOptions& options : {TransferOptions{}, Direct()}) {
    SCOPED_TRACE(options.path == TransferPath::kDirect ? "direct" : "default");
    ASSERT_CUDA(cudaDeviceSynchronize());
    size_t free0 = 0, free1 = 0, free2 = 0, free3 = 0, total = 0;
    ASSERT_CUDA(cudaMemGetInfo(&free0, &total));
    auto engine = TransferEngine::Create(Backend::kCuda, t.dpool_desc, t.dviews,
                                         t.dsnap_view, options);
    ASSERT_TRUE(engine.ok()) << engine.status();
    TransferEngine& e = **engine;
    ASSERT_TRUE(e.Evict(src, rows, t.stream).ok());
    ASSERT_CUDA(cudaMemGetInfo(&free1, &total));  // in flight
    ASSERT_CUDA(cudaStreamSynchronize(t.stream));
    EXPECT_EQ(e.slices_launched(),
              e.SlicesFor(kernels::CopyDirection::kToHost, 2000));
    ASSERT_TRUE(t.ref->Evict(src, rows, nullptr).ok());
    ExpectBanksMatch(t);
    ASSERT_TRUE(e.Rehydrate(dst, rows, t.stream).ok());
    ASSERT_CUDA(cudaMemGetInfo(&free2, &total));  // in flight
    ASSERT_CUDA(cudaStreamSynchronize(t.stream));
    ASSERT_CUDA(cudaMemGetInfo(&free3, &total));
    ASSERT_TRUE(t.ref->Rehydrate(dst, rows, nullptr).ok());
    ExpectPoolsMatch(t);
    const int64_t extra = static_cast<int64_t>(free0) -
                          static_cast<int64_t>(std::min({free1, free2, free3}));
    std::printf(
        "%s path: extra device memory %lld bytes (staging buffers %llu; "
        "bound: 128 pages = %llu bytes)\n",
        e.path() == TransferPath::kStaged ? "staged" : "direct",
        static_cast<long long>(extra),
        static_cast<unsigned long long>(
            e.path() == TransferPath::kStaged
                ? 4 * e.plan().staging().buffer_bytes
                : 0),
        static_cast<unsigned long long>(128 * page_bytes));
    EXPECT_LE(extra, static_cast<int64_t>(128 * page_bytes));
  }
}

TEST(TransferEngineGpu, EvictAndRehydrateCaptureInACudaGraph) {
  SKIP_WITHOUT_DEVICE();
  Twin t;
  ASSERT_NO_FATAL_FAILURE(Build(Fp8Layout(8), PoolOf(1024, 512), &t));
  const std::vector<uint32_t> pages = Shuffled(1024, 31);
  const std::vector<uint32_t> src(pages.begin(), pages.begin() + 300);
  const std::vector<uint32_t> dst(pages.begin() + 300, pages.begin() + 600);
  std::vector<uint32_t> rows = Shuffled(512, 32);
  rows.resize(300);

  auto capture = [&](bool evict, cudaGraph_t* graph) {
    ASSERT_CUDA(cudaStreamBeginCapture(t.stream, cudaStreamCaptureModeGlobal));
    const absl::Status st = evict ? t.cuda->Evict(src, rows, t.stream)
                                  : t.cuda->Rehydrate(dst, rows, t.stream);
    ASSERT_CUDA(cudaStreamEndCapture(t.stream, graph));
    ASSERT_TRUE(st.ok()) << st;
    size_t nodes = 0;
    ASSERT_CUDA(cudaGraphGetNodes(*graph, nullptr, &nodes));
    EXPECT_EQ(nodes, 3u);  // 300 pages = 3 slices = 3 kernel nodes
  };
  cudaGraph_t evict_graph = nullptr, rehydrate_graph = nullptr;
  ASSERT_NO_FATAL_FAILURE(capture(true, &evict_graph));
  ASSERT_NO_FATAL_FAILURE(capture(false, &rehydrate_graph));
  cudaGraphExec_t evict_exec = nullptr, rehydrate_exec = nullptr;
  ASSERT_CUDA(cudaGraphInstantiate(&evict_exec, evict_graph, 0));
  ASSERT_CUDA(cudaGraphInstantiate(&rehydrate_exec, rehydrate_graph, 0));
  EXPECT_EQ(t.cuda->slices_launched(), 6u);

  // Capturing ran nothing.
  ASSERT_CUDA(cudaStreamSynchronize(t.stream));
  ExpectBanksMatch(t);

  ASSERT_CUDA(cudaGraphLaunch(evict_exec, t.stream));
  ASSERT_CUDA(cudaStreamSynchronize(t.stream));
  ASSERT_TRUE(t.ref->Evict(src, rows, nullptr).ok());
  ExpectBanksMatch(t);

  // New pool contents; a replay copies the new bytes.
  FillRandom(t.mirror.data(), t.pool_bytes, 2);
  ASSERT_CUDA(cudaMemcpy(t.dpool.data(), t.mirror.data(), t.pool_bytes,
                         cudaMemcpyHostToDevice));
  ASSERT_CUDA(cudaGraphLaunch(evict_exec, t.stream));
  ASSERT_CUDA(cudaGraphLaunch(rehydrate_exec, t.stream));
  ASSERT_CUDA(cudaStreamSynchronize(t.stream));
  ASSERT_TRUE(t.ref->Evict(src, rows, nullptr).ok());
  ASSERT_TRUE(t.ref->Rehydrate(dst, rows, nullptr).ok());
  ExpectBanksMatch(t);
  ExpectPoolsMatch(t);
  EXPECT_EQ(t.cuda->slices_launched(), 6u);

  // Outside capture the same engine stages again, ordered after the replays.
  ASSERT_EQ(t.cuda->path(), TransferPath::kStaged);
  ASSERT_CUDA(cudaGraphLaunch(evict_exec, t.stream));
  ASSERT_TRUE(t.cuda->Rehydrate(src, rows, t.stream).ok());
  ASSERT_CUDA(cudaStreamSynchronize(t.stream));
  ASSERT_TRUE(t.ref->Evict(src, rows, nullptr).ok());
  ASSERT_TRUE(t.ref->Rehydrate(src, rows, nullptr).ok());
  ExpectPoolsMatch(t);
  EXPECT_EQ(t.cuda->slices_launched(),
            6u + t.cuda->SlicesFor(kernels::CopyDirection::kFromHost, 300));

  cudaGraphExecDestroy(evict_exec);
  cudaGraphExecDestroy(rehydrate_exec);
  cudaGraphDestroy(evict_graph);
  cudaGraphDestroy(rehydrate_graph);
}

TEST(TransferEngineGpu, SnapshotSaveAndRestoreMatchReference) {
  SKIP_WITHOUT_DEVICE();
  for (const TransferOptions& options : {TransferOptions{}, Direct()}) {
    SCOPED_TRACE(options.path == TransferPath::kDirect ? "direct" : "default");
    Twin t;
    Options opt = PoolOf(16, 8);
    opt.snapshot = SnapshotLayout();
    opt.slots = 4;
    opt.snapshot_rows = 3;
    ASSERT_NO_FATAL_FAILURE(Build(Fp8Layout(2), opt, &t, options));
    for (TransferEngine* e : {t.cuda.get(), t.ref.get()}) {
      void* stream = e == t.cuda.get() ? t.stream : nullptr;
      ASSERT_TRUE(e->SaveSnapshot(2, 1, stream).ok());
      ASSERT_TRUE(e->SaveSnapshot(3, 0, stream).ok());
      ASSERT_TRUE(e->RestoreSnapshot(0, 1, stream).ok());
      ASSERT_TRUE(e->RestoreSnapshot(1, 0, stream).ok());
      // Restore what was just saved, then save it elsewhere: stream order.
      ASSERT_TRUE(e->SaveSnapshot(0, 2, stream).ok());
      ASSERT_TRUE(e->RestoreSnapshot(2, 2, stream).ok());
    }
    ASSERT_CUDA(cudaStreamSynchronize(t.stream));
    ExpectBanksMatch(t);
    ExpectPoolsMatch(t);
    EXPECT_EQ(t.cuda->slices_launched(), 6u);
    // Slot 0 now holds slot 2's state, byte for byte.
    const PoolTensor& seg = t.layout.snapshot[0];
    ExpectSameBytes(t.mirror.data() + seg.base,
                    t.mirror.data() + seg.base + 2 * seg.page_stride,
                    seg.bytes_per_page, "slot 0 vs slot 2");
  }
}

TEST(TransferEngineGpu, CreateRejectsMemoryTheDeviceCannotReach) {
  SKIP_WITHOUT_DEVICE();
  DeviceMem pool;
  ASSERT_CUDA(pool.Allocate(1 << 20));
  RegisteredBank bank;
  ASSERT_CUDA(bank.Map(1 << 20));
  HostMem plain(1 << 20);
  const uint64_t dev = reinterpret_cast<uint64_t>(pool.data());
  GpuPoolDescriptor d;
  d.num_pages = 16;
  d.banks = {BankPool{"kv", {PoolTensor{dev, 4096, 4096}}}};
  const HostBankView good{reinterpret_cast<uint64_t>(bank.device()), 16, 4096,
                          4096};
  ASSERT_TRUE(
      TransferEngine::Create(Backend::kCuda, d, {{"kv", good}}, std::nullopt)
          .ok());

  // Pool in host memory.
  GpuPoolDescriptor host_pool = d;
  host_pool.banks[0].tensors[0].base = reinterpret_cast<uint64_t>(plain.data());
  auto e = TransferEngine::Create(Backend::kCuda, host_pool, {{"kv", good}},
                                  std::nullopt);
  EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(e.status().message().find("not memory of CUDA device 0"),
            std::string::npos)
      << e.status();

  // Bank in unregistered host memory.
  HostBankView unregistered = good;
  unregistered.base = reinterpret_cast<uint64_t>(plain.data());
  e = TransferEngine::Create(Backend::kCuda, d, {{"kv", unregistered}},
                             std::nullopt);
  EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(e.status().message().find("not host memory registered"),
            std::string::npos)
      << e.status();

  // Pool larger than its allocation: the last byte is not device memory
  // (or belongs to another allocation, which is still not this pool's).
  GpuPoolDescriptor too_long = d;
  too_long.num_pages = 1ull << 30;
  HostBankView big = good;
  big.rows = 1;
  e = TransferEngine::Create(Backend::kCuda, too_long, {{"kv", big}},
                             std::nullopt);
  EXPECT_FALSE(e.ok());

  GpuPoolDescriptor bad_device = d;
  bad_device.device = 99;
  e = TransferEngine::Create(Backend::kCuda, bad_device, {{"kv", good}},
                             std::nullopt);
  EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(e.status().message().find("not a CUDA device ordinal"),
            std::string::npos)
      << e.status();

  int current = -1;
  ASSERT_CUDA(cudaGetDevice(&current));
  EXPECT_EQ(current, 0);
}

}  // namespace
}  // namespace kvtier::client
