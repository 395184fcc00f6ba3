// TierCore's namespace creation: for Attach, CreateNamespace and Recover's
// reopening (and the pending names Drop uses, tier_attach.cc).
//
// Creating a namespace populates its banks (tens of seconds for 64 GiB on
// 4 KiB pages) and writes its journal's first checkpoint; none of that
// happens under TierCore::mu_, which every request (and the watchdog's
// Stats) takes:
//  1. Under mu_, the request is validated completely and sized, and the
//     name is reserved with a PendingName in pending_. It counts against
//     --max_namespaces, and the creator's --uid_budget_bytes charge is
//     taken now, so two creations cannot both fit where only one does.
//  2. mu_ is released; BuildNamespace makes index, segments and journal.
//     A failure unlinks the segments that this creation made.
//  3. mu_ is retaken: the namespace is published in by_name_ and by_id_,
//     or, on failure, the charge is refunded. The PendingName goes, marked
//     done with the outcome.
// A request for a pending name (Attach, CreateNamespace, Drop) waits with
// mu_.Await, which releases mu_, then looks again: it finds the namespace,
// or returns the failed creation's error (Attach, CreateNamespace). Drop
// works the same way round: the namespace leaves the maps under mu_, and its
// journal and segments are unlinked with mu_ released while the name is
// pending, so no new namespace of that name creates files the drop would
// then remove.
//
// Attach (tier_attach.cc) looks its session up again after a creation: one
// that closed meanwhile gets NOT_FOUND, and the namespace it made stays,
// with no session attached (as if made by CreateNamespace); Drop removes it
// as any other.
//
// Thread-safety: thread-safe (part of TierCore; lock order in tier_core.h).
#include <sys/types.h>

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/tier_core.h"
#include "daemon/tier_request.h"
#include "spdlog/spdlog.h"

namespace kvtier::daemon {
namespace {

uint64_t RoundUp16(uint64_t n) { return (n + 15) & ~uint64_t{15}; }

}  // namespace

// A name whose namespace is being created, or whose dropped namespace's
// journal and segments are being removed, with TierCore::mu_ released. It
// is in TierCore::pending_ meanwhile; a request for the name waits
// (mu_.Await) until `done`. A creation counts against --max_namespaces and
// holds its --uid_budget_bytes charge from the start. Every field is
// guarded by TierCore::mu_.
struct TierCore::PendingName {
  enum class Kind : uint8_t { kCreating, kDropping };
  Kind kind = Kind::kCreating;
  bool done = false;
  // kCreating, once done: OK (published) or why it failed, which the
  // requests that waited for it return too.
  absl::Status status;
};

// What CreateOrOpenLocked decided, under mu_, about a namespace to create:
// BuildNamespace makes it without locks.
struct TierCore::NamespacePlan {
  std::string name;
  v1::Layout layout;  // Normalized.
  uint32_t stored_ranks = 1;
  uint64_t page_rows = 0;
  uint64_t snapshot_rows = 0;
  uint32_t max_replay_tokens = 0;
  uint64_t bank_bytes = 0;
  bool charged = false;  // bank_bytes charged to creator_uid.
  uid_t creator_uid = static_cast<uid_t>(-1);
  shm::SegmentOptions segment_options;
  // Reopening from a journal (Recover): no journal is written, and segments
  // are never unlinked on failure.
  bool recovering = false;
};

std::shared_ptr<TierCore::PendingName> TierCore::StartPendingLocked(
    const std::string& name, bool creating) {
  auto pending = std::make_shared<PendingName>();
  pending->kind =
      creating ? PendingName::Kind::kCreating : PendingName::Kind::kDropping;
  pending_[name] = pending;
  return pending;
}

void TierCore::EndPendingLocked(const std::string& name, PendingName& pending,
                                absl::Status status) {
  pending_.erase(name);
  pending.done = true;
  pending.status = std::move(status);
}

void TierCore::RefundLocked(uid_t uid, uint64_t bytes) {
  auto used = uid_bytes_.find(uid);
  if (used == uid_bytes_.end()) return;
  used->second -= std::min(used->second, bytes);
  if (used->second == 0) uid_bytes_.erase(used);
}

bool TierCore::WaitPendingLocked(const std::string& name,
                                 absl::Status* failed) {
  auto it = pending_.find(name);
  if (it == pending_.end()) return false;
  const std::shared_ptr<PendingName> pending = it->second;
  Hook("namespace:wait");
  mu_.Await(absl::Condition(&pending->done));
  if (pending->kind == PendingName::Kind::kCreating && !pending->status.ok()) {
    *failed = pending->status;
  }
  return true;
}

absl::StatusOr<std::shared_ptr<TierCore::Namespace>>
TierCore::CreateOrOpenLocked(const std::string& name, const v1::Layout& raw,
                             const v1::Capacity& capacity,
                             const std::string& tenant_salt, bool* created,
                             const PeerInfo* creator, bool recovering,
                             int numa_node) {
  *created = false;
  if (absl::Status s = ValidateNamespaceName(name); !s.ok()) return s;
  if (absl::Status s = ValidateLayout(raw); !s.ok()) return s;
  if (tenant_salt.size() > kMaxTenantSalt) {
    return absl::InvalidArgumentError(
        absl::StrCat("tenant_salt: at most ", kMaxTenantSalt, " bytes, got ",
                     tenant_salt.size()));
  }
  const v1::Layout layout = NormalizeLayout(raw);
  for (;;) {
    if (auto u = unrecoverable_.find(name);
        u != unrecoverable_.end() && !recovering) {
      return absl::FailedPreconditionError(absl::StrCat(
          "namespace '", name, "' could not be recovered (", u->second.reason,
          "); its journal and segments are kept and nothing is served from it",
          u->second.corrupt ? "" : " until kvtierd can reopen it",
          ": an operator may drop it (kvtierctl drop --force ", name, ")"));
    }
    if (auto it = by_name_.find(name); it != by_name_.end()) {
      const std::string diff =
          DescribeLayoutDifference(it->second->layout, layout);
      if (!diff.empty()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "namespace '", name, "' exists with a different layout: ", diff));
      }
      return it->second;
    }
    absl::Status failed;
    if (!WaitPendingLocked(name, &failed)) break;
    if (!failed.ok()) return failed;
    if (recovering) {
      // Only RetryUnrecoverable meets a pending name (Recover runs before
      // any request): the name was dropped or changed meanwhile, and the
      // journal read before may be gone. The next retry looks again.
      return absl::AbortedError(absl::StrCat(
          "namespace '", name, "' was dropped or created meanwhile"));
    }
  }

  NamespacePlan plan;
  if (absl::Status s =
          PlanNamespaceLocked(name, layout, capacity, creator, &plan);
      !s.ok()) {
    return s;
  }
  plan.recovering = recovering;
  plan.segment_options.numa_node = numa_node;
  const std::shared_ptr<PendingName> pending =
      StartPendingLocked(name, /*creating=*/true);
  if (plan.charged) uid_bytes_[plan.creator_uid] += plan.bank_bytes;

  mu_.Unlock();
  absl::StatusOr<std::shared_ptr<Namespace>> ns = BuildNamespace(plan);
  mu_.Lock();

  EndPendingLocked(name, *pending, ns.status());
  if (!ns.ok()) {
    if (plan.charged) RefundLocked(plan.creator_uid, plan.bank_bytes);
    return ns.status();
  }
  by_name_[name] = *ns;
  by_id_[(*ns)->id] = *ns;
  *created = true;
  return ns;
}

absl::Status TierCore::PlanNamespaceLocked(const std::string& name,
                                           const v1::Layout& layout,
                                           const v1::Capacity& capacity,
                                           const PeerInfo* creator,
                                           NamespacePlan* plan) {
  const size_t creating = static_cast<size_t>(
      std::count_if(pending_.begin(), pending_.end(), [](const auto& p) {
        return p.second->kind == PendingName::Kind::kCreating;
      }));
  if (by_name_.size() + creating >= options_.max_namespaces) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "namespace '", name, "': the daemon already holds ",
        by_name_.size() + creating, " namespaces (--max_namespaces)"));
  }

  const bool hybrid = layout.snapshot_row_bytes() > 0;
  const uint32_t stored_ranks = layout.replicated() ? 1 : layout.tp_size();
  uint64_t page_stride = 0;
  for (const auto& b : layout.page_banks())
    page_stride += RoundUp16(b.row_bytes());
  const uint64_t snap_stride = RoundUp16(layout.snapshot_row_bytes());
  if (!hybrid && capacity.snapshot_rows() != 0) {
    return absl::InvalidArgumentError(
        "capacity.snapshot_rows: the layout has no snapshots "
        "(snapshot_row_bytes is 0)");
  }
  const uint64_t per_rank_default = options_.default_namespace_bytes;
  uint64_t snapshot_rows = capacity.snapshot_rows();
  if (hybrid && snapshot_rows == 0) {
    snapshot_rows = std::max<uint64_t>(
        1, static_cast<uint64_t>(per_rank_default *
                                 options_.default_snapshot_share) /
               snap_stride);
  }
  uint64_t page_rows = capacity.page_rows();
  if (page_rows == 0) {
    const uint64_t used = snapshot_rows * snap_stride;
    page_rows = std::max<uint64_t>(
        1,
        used < per_rank_default ? (per_rank_default - used) / page_stride : 0);
  }
  if (page_rows >= kNoRow || snapshot_rows >= kNoRow) {
    return absl::InvalidArgumentError(
        "capacity: at most 4,294,967,294 rows per bank");
  }
  const unsigned __int128 total =
      static_cast<unsigned __int128>(stored_ranks) *
      (static_cast<unsigned __int128>(page_rows) * page_stride +
       static_cast<unsigned __int128>(snapshot_rows) * snap_stride);
  if (total > options_.namespace_budget_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "capacity: namespace '", name, "' would take ",
        static_cast<uint64_t>(total),
        " bytes of banks, over the "
        "per-namespace budget of ",
        options_.namespace_budget_bytes, " bytes (--namespace_budget_bytes)"));
  }
  const bool charge =
      creator != nullptr && creator->verified && options_.uid_budget_bytes > 0;
  if (charge) {
    auto used = uid_bytes_.find(creator->uid);
    const uint64_t before = used == uid_bytes_.end() ? 0 : used->second;
    if (before + total > options_.uid_budget_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "capacity: namespace '", name, "' would take ",
          static_cast<uint64_t>(total), " bytes of banks; uid ", creator->uid,
          "'s namespaces hold ", before, " of its ", options_.uid_budget_bytes,
          " bytes (--uid_budget_bytes)"));
    }
  }
  plan->name = name;
  plan->layout = layout;
  plan->stored_ranks = stored_ranks;
  plan->page_rows = page_rows;
  plan->snapshot_rows = snapshot_rows;
  plan->max_replay_tokens = capacity.max_replay_tokens() != 0
                                ? capacity.max_replay_tokens()
                                : options_.default_max_replay_tokens;
  plan->bank_bytes = static_cast<uint64_t>(total);
  plan->charged = charge;
  if (charge) plan->creator_uid = creator->uid;
  // A namespace under an ACL naming a group keeps its segments in that
  // group, so only the ACL's members can map them.
  plan->segment_options = options_.segments;
  if (const NamespaceAclEntry* acl = options_.namespace_acl.Find(name);
      acl != nullptr && acl->segment_group().has_value()) {
    plan->segment_options.group = *acl->segment_group();
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<TierCore::Namespace>> TierCore::BuildNamespace(
    const NamespacePlan& plan) {
  const std::string& name = plan.name;
  const v1::Layout& layout = plan.layout;
  auto ns = std::make_shared<Namespace>();
  ns->checkpointer = checkpointer_.get();
  ns->self = ns;
  ns->id = next_id_.fetch_add(1);
  ns->name = name;
  ns->layout = layout;
  ns->fingerprint = LayoutFingerprint(layout);
  ns->hash_bytes = HashBytes(layout.hash_kind());
  ns->stored_ranks = plan.stored_ranks;
  ns->page_rows = plan.page_rows;
  ns->snapshot_rows = plan.snapshot_rows;
  ns->max_replay_tokens = plan.max_replay_tokens;
  ns->bank_bytes = plan.bank_bytes;
  ns->charged = plan.charged;
  ns->creator_uid = plan.creator_uid;

  IndexConfig config;
  config.hash_bytes = ns->hash_bytes;
  config.tokens_per_page = layout.tokens_per_page();
  config.tp_size = layout.tp_size();
  config.replicated = layout.replicated();
  config.page_rows = plan.page_rows;
  config.snapshot_rows = plan.snapshot_rows;
  config.max_replay_tokens = ns->max_replay_tokens;
  auto index = PrefixIndex::Create(config);
  if (!index.ok()) return index.status();

  // A failure from here on unlinks the segments this creation made (never
  // those it reopened, nor any while recovering: recovery destroys nothing).
  std::vector<std::string> made;
  auto fail = [&](absl::Status s) -> absl::Status {
    if (!plan.recovering) {
      for (const std::string& path : made) {
        if (absl::Status u = shm::Segment::Unlink(path); !u.ok()) {
          SPDLOG_WARN("namespace '{}': {}", name, u.ToString());
        }
      }
    }
    return s;
  };
  ns->segments.resize(plan.stored_ranks);
  ns->segment_info.resize(plan.stored_ranks);
  auto make_segment = [&](uint32_t rank, const std::string& bank, uint64_t rows,
                          uint64_t row_bytes) {
    return ns->AddSegment(options_.segment_prefix, rank, bank, rows, row_bytes,
                          plan.segment_options, &made);
  };
  Hook("attach:populating");
  for (uint32_t r = 0; r < plan.stored_ranks; ++r) {
    for (const auto& b : layout.page_banks()) {
      if (absl::Status s =
              make_segment(r, b.name(), plan.page_rows, b.row_bytes());
          !s.ok()) {
        return fail(s);
      }
    }
    if (ns->hybrid()) {
      if (absl::Status s = make_segment(r, "snapshot", plan.snapshot_rows,
                                        layout.snapshot_row_bytes());
          !s.ok()) {
        return fail(s);
      }
    }
  }
  // Unpublished: nobody else can reach ns->mu yet.
  absl::MutexLock lock(&ns->mu);
  ns->index = *std::move(index);
  ns->observers = &observers_;
  ns->WatchIndex();
  ns->prefetch_page_rows.assign(ns->stored_ranks, 0);
  ns->prefetch_snapshot_rows.assign(ns->stored_ranks, 0);
  // A rank whose banks existed already (recovery, or files a daemon without
  // a journal left) keeps its placement: engines may map them.
  ns->numa_placed.assign(plan.stored_ranks, false);
  for (uint32_t r = 0; r < plan.stored_ranks; ++r) {
    for (const auto& seg : ns->segments[r]) {
      if (!seg->created()) ns->numa_placed[r] = true;
    }
  }
  if (!options_.state_dir.empty() && !plan.recovering) {
    auto journal = NamespaceJournal::Create(
        JournalPath(options_.state_dir, name), ns->MakeJournalHeader(),
        *ns->index, options_.journal);
    if (!journal.ok()) {
      return fail(absl::UnavailableError(absl::StrCat(
          "namespace '", name, "': ", journal.status().message())));
    }
    ns->journal = *std::move(journal);
  }
  return ns;
}

absl::Status TierCore::CreateNamespace(const std::string& name,
                                       const v1::Layout& layout,
                                       const v1::Capacity& capacity) {
  absl::MutexLock lock(&mu_);
  bool created = false;
  return CreateOrOpenLocked(name, layout, capacity, "", &created,
                            /*creator=*/nullptr, /*recovering=*/false,
                            std::max(options_.bank_numa_node, -1))
      .status();
}

}  // namespace kvtier::daemon
