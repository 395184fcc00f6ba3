// TransferPlan::Create: validation of a pool descriptor against the host
// banks, and the plan built from them (segment tables, staging layout,
// path), one step at a time. The per-transfer work is in
// transfer_plan_slices.cc and transfer_plan_copies.cc.
//
// Thread-safety: see transfer_plan.h (immutable after Create).

#include "client/transfer_plan.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/types/span.h"
#include "client/pool.h"
#include "client/transfer_plan_groups.h"
#include "kernels/page_copy.h"

namespace kvtier::client {
namespace {

using kernels::PageCopySegment;

// A set of `count` equal-sized blocks `stride` apart: a pool tensor's pages,
// a snapshot segment's slots, or a host bank's rows.
struct Extent {
  std::string name;
  uint64_t base = 0;
  uint64_t stride = 0;
  uint64_t bytes = 0;
  uint64_t count = 0;
  uint64_t end = 0;       // one past the last byte of the last block
  bool snapshot = false;  // a snapshot segment (else a page bank's tensor)
};

// Returns the end of the extent, or nullopt on overflow of 64 bits.
std::optional<uint64_t> ExtentEnd(uint64_t base, uint64_t stride,
                                  uint64_t bytes, uint64_t count) {
  uint64_t span = 0;
  uint64_t end = 0;
  if (__builtin_mul_overflow(count - 1, stride, &span) ||
      __builtin_add_overflow(base, span, &end) ||
      __builtin_add_overflow(end, bytes, &end)) {
    return std::nullopt;
  }
  return end;
}

// True if some byte of `a` is also a byte of `b`. Exact for disjoint ranges,
// single blocks and equal strides (interleaved tensors); conservative
// (range intersection) otherwise. REQUIRES: each extent's blocks are
// disjoint (stride >= bytes when count > 1).
bool Overlaps(const Extent& a, const Extent& b) {
  if (a.end <= b.base || b.end <= a.base) return false;
  if (a.count > 1 && b.count > 1 && a.stride == b.stride) {
    const Extent& lo = a.base <= b.base ? a : b;
    const Extent& hi = a.base <= b.base ? b : a;
    const uint64_t d = (hi.base - lo.base) % lo.stride;
    // On the circle of one stride, lo occupies [0, lo.bytes) and hi
    // occupies [d, d + hi.bytes).
    return d < lo.bytes || d + hi.bytes > lo.stride;
  }
  return true;
}

absl::Status CheckHostBank(const std::string& what, const HostBankView& v,
                           std::vector<Extent>* extents) {
  if (v.base == 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": base is null"));
  }
  if (v.base % kPoolAlignment != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": base 0x", absl::Hex(v.base),
                     " is misaligned: it must be a multiple of 16"));
  }
  if (v.rows == 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": rows is 0"));
  }
  if (v.row_bytes == 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": row_bytes is 0"));
  }
  if (v.row_stride % kPoolAlignment != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": row_stride ", v.row_stride,
                     " is misaligned: it must be a multiple of 16"));
  }
  if (v.row_stride < v.row_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": row_stride ", v.row_stride,
                     " is smaller than row_bytes ", v.row_bytes));
  }
  const std::optional<uint64_t> end =
      ExtentEnd(v.base, v.row_stride, v.row_bytes, v.rows);
  if (!end) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": address range overflows"));
  }
  extents->push_back(
      Extent{what, v.base, v.row_stride, v.row_bytes, v.rows, *end});
  return absl::OkStatus();
}

// Checks one pool tensor (or snapshot segment) of `count` pages (or slots)
// named `what` and appends its extent.
absl::Status CheckTensor(const std::string& what, const PoolTensor& t,
                         uint64_t count, std::vector<Extent>* extents) {
  if (t.base == 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ".base is null"));
  }
  if (t.base % kPoolAlignment != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ".base 0x", absl::Hex(t.base),
        " is misaligned: base and page_stride must be multiples of 16"));
  }
  if (t.page_stride % kPoolAlignment != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ".page_stride ", t.page_stride,
        " is misaligned: base and page_stride must be multiples of 16"));
  }
  if (t.bytes_per_page == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ".bytes_per_page is 0"));
  }
  if (t.bytes_per_page > std::numeric_limits<uint32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ".bytes_per_page ", t.bytes_per_page,
                     " is too large: it must be below 4 GiB"));
  }
  if (count > 1 && t.page_stride < t.bytes_per_page) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": its pages overlap each other (page_stride ", t.page_stride,
        " < bytes_per_page ", t.bytes_per_page, ")"));
  }
  const std::optional<uint64_t> end =
      ExtentEnd(t.base, t.page_stride, t.bytes_per_page, count);
  if (!end) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": address range overflows"));
  }
  extents->push_back(
      Extent{what, t.base, t.page_stride, t.bytes_per_page, count, *end});
  return absl::OkStatus();
}

// Appends the segments of `tensors` (row offsets from `host_base`) to
// `segments`, continuing the chunk count `*chunks`.
void AppendSegments(absl::Span<const PoolTensor> tensors,
                    const HostBankView& bank,
                    std::vector<PageCopySegment>* segments, uint32_t* chunks) {
  uint64_t offset = 0;
  for (const PoolTensor& t : tensors) {
    PageCopySegment s;
    s.gpu_base = t.base;
    s.gpu_stride = t.page_stride;
    s.host_base = bank.base + offset;
    s.host_stride = bank.row_stride;
    s.bytes = static_cast<uint32_t>(t.bytes_per_page);
    s.chunk_begin = *chunks;
    segments->push_back(s);
    *chunks += static_cast<uint32_t>(
        (t.bytes_per_page + kernels::kChunkBytes - 1) / kernels::kChunkBytes);
    offset += t.bytes_per_page;
  }
}

// The page banks' names, ", "-separated, for messages.
std::string BankNames(absl::Span<const NamedHostBank> page_banks) {
  std::vector<std::string> names;
  for (const NamedHostBank& b : page_banks) names.push_back(b.first);
  return absl::StrJoin(names, ", ");
}

}  // namespace

struct TransferPlan::Extents {
  std::vector<Extent> tensors;  // pool tensors and snapshot segments
  std::vector<Extent> hosts;    // host banks
};

absl::StatusOr<TransferPlan> TransferPlan::Create(
    const GpuPoolDescriptor& pool, absl::Span<const NamedHostBank> page_banks,
    std::optional<HostBankView> snapshot_bank, const TransferOptions& options) {
  if (absl::Status s = CheckOptions(options); !s.ok()) return s;
  if (absl::Status s = CheckPoolShape(pool, page_banks); !s.ok()) return s;
  Extents extents;
  absl::StatusOr<std::vector<GroupedBank>> page_groups =
      CheckPageBanks(pool, page_banks, &extents);
  if (!page_groups.ok()) return page_groups.status();
  absl::StatusOr<GroupedBank> snapshot_groups =
      CheckSnapshotSegments(pool, snapshot_bank, &extents);
  if (!snapshot_groups.ok()) return snapshot_groups.status();
  if (absl::Status s = CheckOverlaps(extents); !s.ok()) return s;

  TransferPlan plan;
  plan.pool_ = pool;
  // The page banks as the plan addresses them: with page groups, each row's
  // groups are rows of their own (GroupRows).
  for (size_t i = 0; i < page_banks.size(); ++i) {
    plan.page_banks_.emplace_back(page_banks[i].first, (*page_groups)[i].view);
  }
  plan.snapshot_bank_ = snapshot_bank;
  plan.rows_ = plan.page_banks_[0].second.rows;
  plan.page_groups_ = page_groups->front().groups;
  plan.max_ctas_ = options.max_ctas;
  plan.options_ = options;
  plan.BuildPageSegments();
  if (absl::Status s = plan.BuildStaging(); !s.ok()) return s;
  plan.BuildStrided();
  plan.ChoosePath();
  if (snapshot_bank) plan.BuildSnapshotSegments(*snapshot_groups);
  return plan;
}

absl::Status TransferPlan::CheckOptions(const TransferOptions& options) {
  if (options.max_ctas == 0 || options.max_ctas > kernels::kMaxCtasLimit) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_ctas ", options.max_ctas, " is not in [1, ",
                     kernels::kMaxCtasLimit, "]"));
  }
  if (options.staging_ctas == 0 ||
      options.staging_ctas > kernels::kMaxCtasLimit) {
    return absl::InvalidArgumentError(
        absl::StrCat("staging_ctas ", options.staging_ctas, " is not in [1, ",
                     kernels::kMaxCtasLimit, "]"));
  }
  if (options.staging_bytes == 0 || options.staging_bytes > kMaxStagingBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("staging_bytes ", options.staging_bytes, " is not in [1, ",
                     kMaxStagingBytes, "]"));
  }
  if (options.copy_engine_share > 100) {
    return absl::InvalidArgumentError(
        absl::StrCat("copy_engine_share ", options.copy_engine_share,
                     " is not a percentage in [0, 100]"));
  }
  if (options.first_slice_bytes > options.staging_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("first_slice_bytes ", options.first_slice_bytes,
                     " exceeds staging_bytes ", options.staging_bytes));
  }
  if (options.edge_slice_ctas > kernels::kMaxCtasLimit) {
    return absl::InvalidArgumentError(
        absl::StrCat("edge_slice_ctas ", options.edge_slice_ctas,
                     " is not in [0, ", kernels::kMaxCtasLimit, "]"));
  }
  if (options.staging_priority != StagingPriority::kHighest &&
      options.staging_priority != StagingPriority::kDefault) {
    return absl::InvalidArgumentError(absl::StrCat(
        "staging_priority ", static_cast<uint32_t>(options.staging_priority),
        " is not a StagingPriority"));
  }
  if (options.path != TransferPath::kAuto &&
      options.path != TransferPath::kStaged &&
      options.path != TransferPath::kDirect &&
      options.path != TransferPath::kCopyEngine) {
    return absl::InvalidArgumentError(
        absl::StrCat("path ", static_cast<uint32_t>(options.path),
                     " is not a TransferPath"));
  }
  return absl::OkStatus();
}

absl::Status TransferPlan::CheckPoolShape(
    const GpuPoolDescriptor& pool, absl::Span<const NamedHostBank> page_banks) {
  if (pool.num_pages == 0) {
    return absl::InvalidArgumentError("num_pages is 0");
  }
  if (page_banks.empty()) {
    return absl::InvalidArgumentError("the namespace has no page banks");
  }
  for (size_t i = 0; i < page_banks.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      if (page_banks[i].first == page_banks[j].first) {
        return absl::InvalidArgumentError(
            absl::StrCat("page bank name '", page_banks[i].first,
                         "' appears twice (banks ", j, " and ", i, ")"));
      }
    }
  }
  if (pool.banks.size() != page_banks.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the descriptor describes ", pool.banks.size(),
                     " banks; the namespace has ", page_banks.size(),
                     " page banks (", BankNames(page_banks), ")"));
  }
  size_t num_tensors = 0;
  for (const BankPool& b : pool.banks) num_tensors += b.tensors.size();
  if (num_tensors > kMaxPoolTensors) {
    return absl::InvalidArgumentError(
        absl::StrCat("the descriptor lists ", num_tensors, " tensors; at most ",
                     kMaxPoolTensors, " are supported"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<GroupedBank>> TransferPlan::CheckPageBanks(
    const GpuPoolDescriptor& pool, absl::Span<const NamedHostBank> page_banks,
    Extents* extents) {
  std::vector<GroupedBank> page_groups;  // of each page bank
  for (size_t i = 0; i < page_banks.size(); ++i) {
    const BankPool& b = pool.banks[i];
    const std::string what = absl::StrCat("banks[", i, "]");
    if (b.bank != page_banks[i].first) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ".bank is '", b.bank, "'; the namespace's page bank ", i,
          " is '", page_banks[i].first,
          "' (banks must be in namespace order: ", BankNames(page_banks), ")"));
    }
    const HostBankView& view = page_banks[i].second;
    if (absl::Status s = CheckHostBank(absl::StrCat("page bank '", b.bank, "'"),
                                       view, &extents->hosts);
        !s.ok()) {
      return s;
    }
    if (view.rows != page_banks[0].second.rows) {
      return absl::InvalidArgumentError(absl::StrCat(
          "page bank '", b.bank, "' has ", view.rows, " rows, page bank '",
          page_banks[0].first, "' has ", page_banks[0].second.rows,
          ": every page bank must have the same rows"));
    }
    if (b.tensors.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " ('", b.bank, "') lists no tensors"));
    }
    uint64_t sum = 0;
    for (size_t j = 0; j < b.tensors.size(); ++j) {
      if (absl::Status s =
              CheckTensor(absl::StrCat(what, ".tensors[", j, "]"), b.tensors[j],
                          pool.num_pages, &extents->tensors);
          !s.ok()) {
        return s;
      }
      sum += b.tensors[j].bytes_per_page;
    }
    absl::StatusOr<GroupedBank> grouped = GroupRows(
        absl::StrCat(what, " ('", b.bank, "')"), view, sum, kMaxPageGroups);
    if (!grouped.ok()) return grouped.status();
    if (i > 0 && grouped->groups != page_groups.front().groups) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " ('", b.bank, "') holds ", grouped->groups,
                       " page group(s) a row; page bank 0 holds ",
                       page_groups.front().groups));
    }
    page_groups.push_back(*std::move(grouped));
  }
  return page_groups;
}

absl::StatusOr<GroupedBank> TransferPlan::CheckSnapshotSegments(
    const GpuPoolDescriptor& pool,
    const std::optional<HostBankView>& snapshot_bank, Extents* extents) {
  if (pool.snapshot.empty()) {
    if (pool.num_snapshot_slots != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("num_snapshot_slots is ", pool.num_snapshot_slots,
                       " but the descriptor lists no snapshot segments"));
    }
    if (snapshot_bank) {
      return absl::InvalidArgumentError(
          "a snapshot bank is given but the descriptor lists no snapshot "
          "segments");
    }
    return GroupedBank{};
  }
  if (pool.snapshot.size() > kMaxPoolTensors) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the descriptor lists ", pool.snapshot.size(),
        " snapshot segments; at most ", kMaxPoolTensors, " are supported"));
  }
  if (pool.num_snapshot_slots == 0) {
    return absl::InvalidArgumentError(
        "num_snapshot_slots is 0 but the descriptor lists snapshot "
        "segments");
  }
  if (!snapshot_bank) {
    return absl::InvalidArgumentError(
        "the descriptor lists snapshot segments but no snapshot bank is "
        "given");
  }
  if (absl::Status s =
          CheckHostBank("snapshot bank", *snapshot_bank, &extents->hosts);
      !s.ok()) {
    return s;
  }
  uint64_t sum = 0;
  for (size_t k = 0; k < pool.snapshot.size(); ++k) {
    if (absl::Status s =
            CheckTensor(absl::StrCat("snapshot[", k, "]"), pool.snapshot[k],
                        pool.num_snapshot_slots, &extents->tensors);
        !s.ok()) {
      return s;
    }
    extents->tensors.back().snapshot = true;
    sum += pool.snapshot[k].bytes_per_page;
  }
  return GroupRows("snapshot", *snapshot_bank, sum, kMaxSnapshotGroups);
}

absl::Status TransferPlan::CheckOverlaps(const Extents& extents) {
  const std::vector<Extent>& tensors = extents.tensors;
  const std::vector<Extent>& hosts = extents.hosts;
  // Pairwise: at most ~1.5k extents, once per attach. Snapshot slots may
  // share memory with pages (vLLM's hybrid manager overlays its Mamba and
  // attention groups on one allocation; a block belongs to one group at a
  // time), so only tensors of the same kind are checked against each other.
  for (size_t i = 0; i < tensors.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      if (tensors[i].snapshot == tensors[j].snapshot &&
          Overlaps(tensors[i], tensors[j])) {
        return absl::InvalidArgumentError(absl::StrCat(
            tensors[i].name, " overlaps ", tensors[j].name, " (0x",
            absl::Hex(tensors[i].base), "..0x", absl::Hex(tensors[i].end),
            " and 0x", absl::Hex(tensors[j].base), "..0x",
            absl::Hex(tensors[j].end), ")"));
      }
    }
    for (const Extent& h : hosts) {
      if (Overlaps(tensors[i], h)) {
        return absl::InvalidArgumentError(
            absl::StrCat(tensors[i].name, " overlaps ", h.name));
      }
    }
  }
  for (size_t i = 0; i < hosts.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      if (Overlaps(hosts[i], hosts[j])) {
        return absl::InvalidArgumentError(
            absl::StrCat(hosts[i].name, " overlaps ", hosts[j].name));
      }
    }
  }
  return absl::OkStatus();
}

void TransferPlan::BuildPageSegments() {
  for (size_t i = 0; i < pool_.banks.size(); ++i) {
    AppendSegments(pool_.banks[i].tensors, page_banks_[i].second,
                   &page_segments_, &page_chunks_);
  }
}

absl::Status TransferPlan::BuildStaging() {
  // One region per bank, rows at the bank's own row stride, so a tensor sits
  // at the same offset (and alignment) in a staged row as in a host row.
  StagingLayout& st = staging_;
  for (const NamedHostBank& b : page_banks_)
    st.page_bytes += b.second.row_stride;
  const uint64_t fit = options_.staging_bytes / st.page_bytes;
  st.slice_pages = static_cast<uint32_t>(
      std::min<uint64_t>({fit, kMaxSlicePages, pool_.num_pages}));
  if (st.slice_pages == 0) {
    if (options_.path == TransferPath::kStaged) {
      return absl::InvalidArgumentError(
          absl::StrCat("staging_bytes ", options_.staging_bytes,
                       " cannot hold one page: a page takes ", st.page_bytes,
                       " bytes over all page banks (row strides)"));
    }
    st = StagingLayout{};
    return absl::OkStatus();
  }
  st.buffer_bytes = st.slice_pages * st.page_bytes;
  uint64_t region = 0;
  for (size_t i = 0; i < page_banks_.size(); ++i) {
    const HostBankView& bank = page_banks_[i].second;
    st.region.push_back(region);
    const HostBankView staged{region, st.slice_pages, bank.row_bytes,
                              bank.row_stride};
    uint32_t chunks = 0;
    AppendSegments(pool_.banks[i].tensors, staged, &staged_segments_, &chunks);
    region += st.slice_pages * bank.row_stride;
  }
  // chunk_begin continues across banks, as in page_segments_.
  for (size_t k = 0; k < staged_segments_.size(); ++k) {
    staged_segments_[k].chunk_begin = page_segments_[k].chunk_begin;
  }
  return absl::OkStatus();
}

void TransferPlan::ChoosePath() {
  std::vector<EngineCopy> runs;
  const uint32_t first = 0;
  PageRuns(absl::MakeConstSpan(&first, 1), absl::MakeConstSpan(&first, 1),
           &runs);
  page_runs_ = static_cast<uint32_t>(std::max<size_t>(runs.size(), 1));
  uint64_t page_bytes = 0;
  for (const EngineCopy& r : runs) page_bytes += r.bytes;
  if (options_.path == TransferPath::kCopyEngine ||
      (options_.path == TransferPath::kAuto &&
       page_bytes / page_runs_ >= kMinCopyEngineRunBytes)) {
    path_ = TransferPath::kCopyEngine;
  } else {
    path_ = options_.path == TransferPath::kDirect || staging_.slice_pages == 0
                ? TransferPath::kDirect
                : TransferPath::kStaged;
  }
}

void TransferPlan::BuildSnapshotSegments(const GroupedBank& snapshot) {
  AppendSegments(pool_.snapshot, snapshot.view, &snapshot_segments_,
                 &snapshot_chunks_);
  snapshot_groups_ = snapshot.groups;
}

}  // namespace kvtier::client
