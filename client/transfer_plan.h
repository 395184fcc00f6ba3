// Transfer planning: validates an engine's GpuPoolDescriptor against the
// namespace's host banks once, turns it into the copy kernel's segment table,
// and cuts each transfer into slices, for either of the CUDA backend's paths:
// - direct: slices of at most kMaxSlicePages pages, one kernel parameter
//   block (kernels::PageCopyParams) per slice; the kernel reads and writes the
//   host rows over UVA.
// - staged: slices that fit one HBM staging buffer (StagedSlices). The same
//   kernel gathers a slice's pages into the staging buffer (or scatters them
//   out of it), and the copy engine moves the staging buffer's rows to or
//   from the host rows (StagedCopies, one cudaMemcpyBatchAsync per slice);
//   snapshots go through the copy engine segment by segment
//   (SnapshotCopies).
// - copy engine: no kernel; the copy engine moves each page's bytes straight
//   between the pool and the host rows, one copy per run of bytes that is
//   contiguous on both sides (PageRuns). For pools whose pages are long
//   contiguous runs (vLLM's block-first layouts): it needs no SMs, so it
//   keeps the link busy beside compute that holds them all.
//
// The plan holds no GPU resources: it only computes parameter blocks and
// copy lists. The staging layout (StagingLayout) mirrors the host banks: a
// buffer holds one region per page bank, item i of a slice at
// region + i * row_stride, so a run of consecutive rows of a bank is one
// contiguous copy on both sides.
//
// Thread-safety: a TransferPlan is immutable after Create; every const method
// may be called concurrently.

#ifndef KVTIER_CLIENT_TRANSFER_PLAN_H_
#define KVTIER_CLIENT_TRANSFER_PLAN_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "client/pool.h"
#include "kernels/page_copy.h"

namespace kvtier::client {

struct GroupedBank;  // client/transfer_plan_groups.h

// Most pages one kernel launch copies. A transfer of N pages takes
// ceil(N / kMaxSlicePages) launches.
inline constexpr uint32_t kMaxSlicePages = 128;
// The most slots one snapshot row holds (TransferPlan::snapshot_groups).
inline constexpr uint32_t kMaxSnapshotGroups = 64;
// The most pool pages one page row holds (TransferPlan::page_groups).
inline constexpr uint32_t kMaxPageGroups = 64;
static_assert(kMaxSlicePages == kernels::kMaxCopyItems);
static_assert(kMaxPoolTensors == kernels::kMaxCopySegments);

// One mapped host bank as the copy sees it.
struct HostBankView {
  // Address of row 0: the device pointer of the registered mapping
  // (cudaHostGetDevicePointer; with UVA usually the host address) for the
  // CUDA backend, a plain host pointer for the reference backend.
  // 16-aligned, not null.
  uint64_t base = 0;
  uint64_t rows = 0;        // > 0
  uint64_t row_bytes = 0;   // bytes of one row's payload
  uint64_t row_stride = 0;  // bytes from row r to r + 1; multiple of 16,
                            // >= row_bytes
};

// A namespace's page bank: its name and its mapping.
using NamedHostBank = std::pair<std::string, HostBankView>;

// How the CUDA backend moves pages (the reference backend ignores it).
enum class TransferPath : uint32_t {
  // kStaged where the plan allows it (one page fits a staging buffer and the
  // staging buffers could be allocated), kDirect otherwise.
  kAuto = 0,
  // Gather into an HBM staging buffer with the copy kernel (a few CTAs, a
  // short burst per slice), then the copy engine crosses PCIe; the reverse
  // for rehydration. Two buffers per direction, double-buffered.
  kStaged = 1,
  // The copy kernel reads and writes host rows over UVA for the whole
  // transfer. Always used while the caller's stream is capturing a CUDA
  // graph (see TransferEngine).
  kDirect = 2,
  // No kernel: the copy engine copies each run of a page that is contiguous
  // in the pool and in the host row straight across PCIe (PageRuns), one
  // cudaMemcpyBatchAsync per transfer. kAuto takes it when a page's runs
  // average at least kMinCopyEngineRunBytes (block-first pools).
  kCopyEngine = 3,
};

// The mean run of a page (over all page banks) from which kAuto leaves the
// copy to the copy engine alone. Measured on the H200 beside an 8192^3 bf16
// GEMM (issue 16's probe and transfer_bench layout f): one descriptor per
// 2 MiB or 256 KiB page kept 54 / 46-47 GB/s with the GEMM slowed no more
// than by a contiguous copy, where the staged kernel path kept ~20 and
// descriptors of 4-32 KiB 5-31.
inline constexpr uint64_t kMinCopyEngineRunBytes = 256ull << 10;

// Default bytes of one staging buffer. On the H200 (issue 16, 2026-12-02),
// 64 MiB buffers keep 95-98 % of the contiguous copies' rate with both
// directions at once on 2 MiB rows, where 16 MiB ones kept 91-96 % (fewer
// slices, fewer hops between the copy and kernel streams); one direction
// alone is the same at 16-64 MiB (98-99 %), and the first slice, 2 MiB
// whatever the buffer (kAutoFirstSliceBytes), keeps small transfers as they
// were. 4 buffers per engine: 256 MiB of device memory.
inline constexpr uint64_t kDefaultStagingBytes = 64ull << 20;
inline constexpr uint64_t kMaxStagingBytes = 1ull << 30;
// The priority of the staged path's kernel streams.
enum class StagingPriority : uint32_t {
  kHighest = 0,  // the device's greatest stream priority (the default)
  kDefault = 1,  // the default priority, like the engine's own streams
};

// Default TransferOptions::copy_engine_share: none.
inline constexpr uint32_t kDefaultCopyEngineShare = 0;

// Default first staged slice (TransferOptions::first_slice_bytes): 0, i.e.
// kAutoFirstSliceBytes or the whole buffer if that is smaller.
inline constexpr uint64_t kDefaultFirstSliceBytes = 0;
inline constexpr uint64_t kAutoFirstSliceBytes = 2ull << 20;

// Default TransferOptions::edge_slice_ctas: the staged pipeline's first
// gather (an eviction's fill) and last scatter (a rehydration's drain) run on
// 32 CTAs, since nothing overlaps them; on the H200 this took ~8 us off a
// 16 MiB eviction of 4 KiB chunks (331 against 339 us) for a burst of a few
// microseconds on 32 SMs.
inline constexpr uint32_t kDefaultEdgeSliceCtas = 32;

// Default grid of the staged gather / scatter: at most 8 SMs, each busy for
// a short burst per slice.
inline constexpr uint32_t kDefaultStagingCtas = 8;

struct TransferOptions {
  // Most CTAs one direct copy launch uses, in [1, kernels::kMaxCtasLimit].
  // The copy is bound by the host link; a small grid leaves the engine its
  // SMs.
  uint32_t max_ctas = kernels::kDefaultMaxCtas;
  TransferPath path = TransferPath::kAuto;
  // Bytes of one staging buffer, in [1, kMaxStagingBytes]; the engine
  // allocates 4 (two per direction), each rounded down to whole pages (all
  // page banks' row strides) and to at most kMaxSlicePages pages.
  uint64_t staging_bytes = kDefaultStagingBytes;
  // CTAs of the staged gather / scatter, in [1, kernels::kMaxCtasLimit].
  uint32_t staging_ctas = kDefaultStagingCtas;
  // Priority of the staged path's kernel streams (the gathers / scatters).
  // Beside compute that holds every SM, neither priority lets a gather in
  // before the running kernel ends (issue 16's probe); it stays a knob for
  // the benchmark's frontier.
  StagingPriority staging_priority = StagingPriority::kHighest;
  // Bytes of the first staged slice of an eviction (the last of a
  // rehydration), rounded down to whole pages and at least one page: the
  // copy engine waits for that slice's gather before it starts, so a small
  // one shortens the pipeline's fill on small transfers; the next slices
  // double up to a full buffer. At most staging_bytes. 0:
  // kAutoFirstSliceBytes, or a whole buffer if that is smaller.
  uint64_t first_slice_bytes = kDefaultFirstSliceBytes;
  // CTAs of the first gather of an eviction and the last scatter of a
  // rehydration (the pipeline's fill and drain, which no copy overlaps), in
  // [0, kernels::kMaxCtasLimit]; the larger of this and staging_ctas is
  // used. 0: staging_ctas, like every other slice.
  uint32_t edge_slice_ctas = kDefaultEdgeSliceCtas;
  // Percent of a staged transfer's pages (the last ones) that the copy
  // engine moves straight between the pool and the rows, on a stream of its
  // own beside the staged pipeline, with 2D copies (PageCopies2D) or, where
  // a page is one run (page_runs() == 1: block-first pools), as one batch
  // of PageRuns, in [0, 100]. The copy engine needs no SMs, so that share
  // keeps moving while compute holds every SM and the gathers wait.
  uint32_t copy_engine_share = kDefaultCopyEngineShare;
};

// One copy-engine copy: `bytes` bytes between device address `device` (a
// staging buffer, or a snapshot slot) and host address `host` (the device
// pointer of a mapped host row). Which is the source depends on the
// transfer's direction.
struct EngineCopy {
  uint64_t device = 0;
  uint64_t host = 0;
  uint64_t bytes = 0;
};

// One 2D copy-engine copy (cudaMemcpy2DAsync): `lines` lines of `width`
// bytes, `device_pitch` apart on the device and `host_pitch` apart on the
// host, starting at `device` and `host` (the device pointer of a mapped host
// row). Which is the source depends on the transfer's direction.
struct EngineCopy2D {
  uint64_t device = 0;
  uint64_t host = 0;
  uint64_t width = 0;
  uint64_t lines = 0;
  uint64_t device_pitch = 0;
  uint64_t host_pitch = 0;
};

// Where a slice's rows sit in one staging buffer.
struct StagingLayout {
  uint32_t slice_pages = 0;   // most pages one buffer holds; 0: no staging
  uint64_t buffer_bytes = 0;  // slice_pages * page_bytes
  uint64_t page_bytes = 0;    // one page over all page banks (row strides)
  // Per page bank: offset of its region in the buffer; item i's row is at
  // region + i * (that bank's row_stride).
  std::vector<uint64_t> region;
};

class TransferPlan {
 public:
  // Validates `pool` against the namespace's page banks (`page_banks`, in
  // namespace order) and its snapshot bank, and builds the segment tables.
  // Returns INVALID_ARGUMENT naming the field and index when:
  // - the banks differ from the namespace's in number, order or name, or a
  //   namespace bank name repeats;
  // - num_pages is 0; a bank lists no tensors; more than kMaxPoolTensors
  //   tensors (all banks together) or snapshot segments;
  // - a tensor's base is null, base or page_stride is not a multiple of 16,
  //   bytes_per_page is 0 or >= 4 GiB, its pages overlap one another
  //   (page_stride < bytes_per_page with more than one page), its address
  //   range overflows, or it overlaps another tensor or a host bank. Tensors
  //   with the same page_stride may interleave (K and V of one page side by
  //   side) as long as their bytes do not overlap; otherwise two tensors'
  //   address ranges must be disjoint;
  // - a bank's tensors add up to neither its row_bytes nor a divisor of it
  //   (a row of page groups: see page_groups()), the banks hold different
  //   numbers of groups, or a row of several groups has padding;
  // - a host bank's base is null or not 16-aligned, its row_stride is not a
  //   multiple of 16 or is below row_bytes, it has no rows, or the page banks
  //   differ in row count;
  // - snapshot segments without slots or without a snapshot bank, or a
  //   snapshot bank or slots without segments; snapshot segments whose
  //   bytes_per_page do not add up to the snapshot bank's row_bytes or to a
  //   divisor of it (a row of snapshot groups: see snapshot_groups()), or
  //   a row of several groups whose row_stride is not its row_bytes;
  // - options.max_ctas, staging_ctas, staging_bytes or path is out of
  //   range, or path is kStaged and one page (the page banks' row strides
  //   together) does not fit staging_bytes.
  static absl::StatusOr<TransferPlan> Create(
      const GpuPoolDescriptor& pool, absl::Span<const NamedHostBank> page_banks,
      std::optional<HostBankView> snapshot_bank,
      const TransferOptions& options = {});

  // The path the CUDA backend takes outside graph capture: kStaged,
  // kDirect or kCopyEngine, never kAuto (kAuto resolved against the staging
  // layout and page_runs()).
  TransferPath path() const { return path_; }
  // Copies one page takes on the copy-engine path when nothing merges
  // across pages (PageRuns of page 0 into row 0); >= 1.
  uint32_t page_runs() const { return page_runs_; }
  const TransferOptions& options() const { return options_; }
  const StagingLayout& staging() const { return staging_; }

  // Returns OK if gpu_pages[i] -> rows[i] (kToHost) or rows[i] ->
  // gpu_pages[i] (kFromHost) is a valid transfer: equal lengths, every page
  // < num_pages, every row < the banks' rows, and no destination (rows for
  // kToHost, gpu_pages for kFromHost) repeated. Otherwise INVALID_ARGUMENT
  // naming the field and index.
  absl::Status CheckPages(kernels::CopyDirection direction,
                          absl::Span<const uint32_t> gpu_pages,
                          absl::Span<const uint32_t> rows) const;

  // Returns OK if the plan has a snapshot, slots.size() ==
  // snapshot_groups(), every slot < num_snapshot_slots and row < the
  // snapshot bank's rows; FAILED_PRECONDITION if the descriptor has no
  // snapshot; INVALID_ARGUMENT otherwise.
  absl::Status CheckSnapshot(absl::Span<const uint32_t> slots,
                             uint32_t row) const;

  // How many slots a snapshot row holds, one after the other: the
  // snapshot bank's row_bytes over the snapshot segments' bytes (1 when
  // they are equal). vLLM's hybrid models with several Mamba groups keep
  // one state block per group at a page boundary; group g's slot goes to
  // bytes [g * S, (g + 1) * S) of the row, S the segments' bytes.
  uint32_t snapshot_groups() const { return snapshot_groups_; }

  // How many pool pages a page row holds, one after the other in every page
  // bank (vLLM's sliding-window groups beside full attention: one block of
  // each group per page). With K > 1 the plan addresses group g of row r as
  // row r * K + g: CheckPages, Evict and Rehydrate take those indices, and
  // rows() counts them.
  uint32_t page_groups() const { return page_groups_; }

  // Number of launches a transfer of `num_pages` pages takes.
  static size_t NumSlices(size_t num_pages) {
    return (num_pages + kMaxSlicePages - 1) / kMaxSlicePages;
  }

  // Fills `*params` with slice `slice` of the transfer: pages
  // [slice * kMaxSlicePages, +kMaxSlicePages) of gpu_pages/rows.
  // REQUIRES: CheckPages(direction, gpu_pages, rows).ok(),
  // slice < NumSlices(gpu_pages.size()).
  void FillPageSlice(kernels::CopyDirection direction,
                     absl::Span<const uint32_t> gpu_pages,
                     absl::Span<const uint32_t> rows, size_t slice,
                     kernels::PageCopyParams* params) const;

  // Fills `*params` with the copy between snapshot slots `slots` (one per
  // group) and snapshot row `row`. REQUIRES: CheckSnapshot(slots, row).ok().
  void FillSnapshot(kernels::CopyDirection direction,
                    absl::Span<const uint32_t> slots, uint32_t row,
                    kernels::PageCopyParams* params) const;

  // Sizes of the staged slices of a transfer of `num_pages` pages, in
  // transfer order; they add up to num_pages, each <= staging().slice_pages.
  // Eviction ramps up (the first slices are small, so the copy engine starts
  // after a short gather) and rehydration ramps down (the last scatter, which
  // nothing overlaps, is short). REQUIRES: staging().slice_pages > 0.
  std::vector<uint32_t> StagedSlices(kernels::CopyDirection direction,
                                     size_t num_pages) const;

  // Fills `*params` with the staged kernel of one slice: pages
  // gpu_pages[begin, begin + count) gathered into (kToHost) or scattered from
  // (kFromHost) items 0..count-1 of the staging buffer at `staging_base`, on
  // a grid of at most options().staging_ctas CTAs -- or, for the
  // pipeline's `edge` slice (an eviction's first, a rehydration's last), of
  // the larger of that and options().edge_slice_ctas.
  // REQUIRES: CheckPages(...).ok() for the whole transfer,
  // count <= staging().slice_pages, begin + count <= gpu_pages.size().
  void FillStagedSlice(kernels::CopyDirection direction,
                       absl::Span<const uint32_t> gpu_pages, size_t begin,
                       size_t count, uint64_t staging_base,
                       kernels::PageCopyParams* params,
                       bool edge = false) const;

  // Appends to `*copies` the copy-engine copies that move a staged slice's
  // rows between the staging buffer at `staging_base` (items 0..n-1) and
  // host rows `rows` (n = rows.size()): per page bank, one copy per run of
  // consecutive rows where the bank's rows have no padding (row_stride ==
  // row_bytes), one per row otherwise (padding bytes are never written).
  void StagedCopies(absl::Span<const uint32_t> rows, uint64_t staging_base,
                    std::vector<EngineCopy>* copies) const;

  // Appends to `*copies` the copy-engine copies of the copy-engine path:
  // page gpu_pages[i] <-> row rows[i] of every page bank, one copy per run of
  // bytes contiguous both in the pool and in the host rows (a page's tensors,
  // and consecutive pages and rows, merge where they are adjacent on both
  // sides). Padding bytes of a row are never written.
  // REQUIRES: CheckPages(...).ok().
  void PageRuns(absl::Span<const uint32_t> gpu_pages,
                absl::Span<const uint32_t> rows,
                std::vector<EngineCopy>* copies) const;

  // Appends to `*copies` the 2D copies of page gpu_pages[i] <-> row rows[i]
  // of every page bank: per page, one per run of a bank's tensors that are
  // equally sized, equally spaced in the pool (one pitch, < 2 GiB) and back
  // to back in the host row (vLLM's layer-first buffer, or per-layer
  // tensors allocated back to back: one copy per page and bank), else one
  // line per tensor. REQUIRES: CheckPages(...).ok().
  void PageCopies2D(absl::Span<const uint32_t> gpu_pages,
                    absl::Span<const uint32_t> rows,
                    std::vector<EngineCopy2D>* copies) const;
  // 2D copies per page (PageCopies2D of one page); >= 1.
  uint32_t page_copies_2d() const {
    return static_cast<uint32_t>(std::max<size_t>(strided_.size(), 1));
  }
  // Pages of a staged transfer of `num_pages` pages that go through the
  // copy engine directly (options().copy_engine_share).
  size_t CopyEngineSharePages(size_t num_pages) const {
    return num_pages * options_.copy_engine_share / 100;
  }

  // Appends to `*copies` the copy-engine copies between snapshot slots
  // `slots` and snapshot row `row`: one per segment and group, adjacent
  // segments that are contiguous on the device as well merged. REQUIRES:
  // CheckSnapshot(slots, row).ok().
  void SnapshotCopies(absl::Span<const uint32_t> slots, uint32_t row,
                      std::vector<EngineCopy>* copies) const;

  const GpuPoolDescriptor& pool() const { return pool_; }
  const std::vector<NamedHostBank>& page_banks() const { return page_banks_; }
  const std::optional<HostBankView>& snapshot_bank() const {
    return snapshot_bank_;
  }
  bool has_snapshot() const { return !pool_.snapshot.empty(); }
  // Rows of every page bank.
  uint64_t rows() const { return rows_; }

 private:
  TransferPlan() = default;

  // Create's steps (transfer_plan.cc), in the order it takes them. Each
  // check returns the first of Create's INVALID_ARGUMENT errors that its part
  // of the input gives; the builders fill a plan whose inputs passed every
  // check.
  struct Extents;  // address ranges checked so far (transfer_plan.cc)

  // Returns OK if every field of `options` is in range (Create's last
  // bullet, but for the page fitting staging_bytes: BuildStaging).
  static absl::Status CheckOptions(const TransferOptions& options);
  // Returns OK if `pool` has pages and as many banks as `page_banks` (which
  // is not empty and repeats no name), and lists at most kMaxPoolTensors
  // tensors over all banks. Says nothing of the banks themselves
  // (CheckPageBanks).
  static absl::Status CheckPoolShape(
      const GpuPoolDescriptor& pool,
      absl::Span<const NamedHostBank> page_banks);
  // Checks page bank i against pool.banks[i], for each i in order: its name,
  // its host view, its rows against bank 0's, then its tensors (each of
  // num_pages pages), which must add up to its row_bytes or a divisor of it
  // (GroupRows) with as many groups as bank 0. Appends the bank's and its
  // tensors' address ranges to `*extents`. Returns each bank as the plan
  // addresses it: a row of K page groups seen as K rows.
  // REQUIRES: CheckPoolShape(pool, page_banks).ok().
  static absl::StatusOr<std::vector<GroupedBank>> CheckPageBanks(
      const GpuPoolDescriptor& pool, absl::Span<const NamedHostBank> page_banks,
      Extents* extents);
  // Checks that snapshot segments, slots and a snapshot bank come all
  // together or not at all; with them, the bank's view and each segment (of
  // num_snapshot_slots slots), whose bytes must add up to the bank's
  // row_bytes or a divisor of it (GroupRows). Appends their address ranges
  // to `*extents`. Returns the snapshot bank as the plan addresses it (a row
  // of K snapshot groups seen as K rows), or a default GroupedBank when the
  // pool has no snapshot.
  static absl::StatusOr<GroupedBank> CheckSnapshotSegments(
      const GpuPoolDescriptor& pool,
      const std::optional<HostBankView>& snapshot_bank, Extents* extents);
  // Returns OK if no two of `extents` share a byte: pool tensors against
  // tensors of their own kind (pages, or snapshot segments: those two may
  // overlay each other) and against every host bank, host banks against one
  // another.
  static absl::Status CheckOverlaps(const Extents& extents);

  // Fills page_segments_ and page_chunks_: pool_'s tensors against
  // page_banks_, chunk numbers running on across banks.
  void BuildPageSegments();
  // Fills staging_ and staged_segments_ from page_banks_, pool_ and
  // options_: one region per bank, as many pages as fit staging_bytes (at
  // most kMaxSlicePages and num_pages). Where not one page fits, leaves
  // staging_ empty (slice_pages 0), or returns INVALID_ARGUMENT if
  // options_.path is kStaged. REQUIRES: BuildPageSegments() ran.
  absl::Status BuildStaging();
  // Groups page_segments_ into strided_ (transfer_plan_copies.cc).
  void BuildStrided();
  // Sets page_runs_ (the copy-engine runs of page 0 into row 0) and path_:
  // kAuto resolved to kCopyEngine where those runs average at least
  // kMinCopyEngineRunBytes, else to kStaged where staging_ holds a page,
  // else to kDirect. REQUIRES: BuildStaging() and BuildStrided() ran.
  void ChoosePath();
  // Fills snapshot_segments_, snapshot_chunks_ and snapshot_groups_ against
  // `snapshot`, the snapshot bank as CheckSnapshotSegments returned it.
  void BuildSnapshotSegments(const GroupedBank& snapshot);

  // Immutable after Create.
  GpuPoolDescriptor pool_;
  std::vector<NamedHostBank> page_banks_;
  std::optional<HostBankView> snapshot_bank_;
  uint64_t rows_ = 0;
  uint32_t max_ctas_ = kernels::kDefaultMaxCtas;
  TransferOptions options_;
  TransferPath path_ = TransferPath::kDirect;
  StagingLayout staging_;
  std::vector<kernels::PageCopySegment> page_segments_;
  uint32_t page_chunks_ = 0;  // chunks per page, over all segments
  uint32_t page_runs_ = 1;    // see page_runs()
  // page_segments_ with host_base relative to a staging buffer's start and
  // host_stride the bank's row stride (empty without staging).
  std::vector<kernels::PageCopySegment> staged_segments_;
  // Snapshot segments against a view of the snapshot bank whose rows are
  // the groups' parts (row r's group g is sub-row r * groups + g).
  std::vector<kernels::PageCopySegment> snapshot_segments_;
  uint32_t snapshot_chunks_ = 0;
  uint32_t snapshot_groups_ = 1;
  uint32_t page_groups_ = 1;
  // PageCopies2D's runs of page_segments_: the first segment, how many, and
  // the device pitch between them.
  struct Strided {
    size_t first = 0;
    uint64_t lines = 0;
    uint64_t pitch = 0;
  };
  std::vector<Strided> strided_;
};

}  // namespace kvtier::client

#endif  // KVTIER_CLIENT_TRANSFER_PLAN_H_
