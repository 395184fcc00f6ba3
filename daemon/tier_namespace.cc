// TierNamespace's operations on itself alone: its journal header, the
// recency updates that unpinned lookups queue, turning a journal append's
// outcome into a request's, fence hold ids, and telling its observers what
// its index did.
//
// Thread-safety: as annotated in tier_namespace.h (the caller holds mu
// where a method requires it).
#include "daemon/tier_namespace.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/random_id.h"
#include "daemon/tier_observer.h"
#include "spdlog/spdlog.h"

namespace kvtier::daemon {

uint64_t TierNamespace::NewHoldId() const {
  for (;;) {
    const uint64_t id = RandomId();
    if (!holds.contains(id)) return id;
  }
}

void TierNamespace::DescribeAttach(uint32_t tp_rank,
                                   const std::string& tenant_salt,
                                   v1::AttachResponse* resp) const {
  resp->set_namespace_id(id);
  resp->set_layout_fingerprint(std::string(
      reinterpret_cast<const char*>(fingerprint.data()), fingerprint.size()));
  resp->set_hash_seed(
      DeriveHashSeed(name, fingerprint, tenant_salt, hash_bytes));
  resp->set_hash_bytes(hash_bytes);
  for (const auto& seg : segment_info[StorageRank(tp_rank)]) {
    *resp->add_segments() = seg;
  }
  resp->set_page_rows(page_rows);
  resp->set_snapshot_rows(snapshot_rows);
  resp->set_max_replay_tokens(max_replay_tokens);
}

TierNamespace::Forgotten TierNamespace::ForgetAll() {
  Forgotten f;
  f.holds = holds.size();
  holds.clear();
  f.restart_fence = restart_fence.has_value();
  restart_fence.reset();
  leases.clear();
  session_leases.clear();
  reservations.clear();
  use.clear();
  reserved_page_rows = 0;
  reserved_snapshot_rows = 0;
  index->Clear();
  removed_keys.clear();
  dropped = true;
  prefetch_pins = 0;
  prefetch_page_rows.assign(prefetch_page_rows.size(), 0);
  prefetch_snapshot_rows.assign(prefetch_snapshot_rows.size(), 0);
  f.journal = std::move(journal);
  return f;
}

void TierNamespace::RemoveFiles(
    std::unique_ptr<NamespaceJournal> removed) const {
  if (removed != nullptr) {
    if (absl::Status s = removed->Remove(); !s.ok()) {
      SPDLOG_WARN("dropping '{}': {}", name, s.ToString());
    }
    removed.reset();
  }
  for (const auto& rank : segment_info) {
    for (const auto& seg : rank) {
      if (absl::Status s = shm::Segment::Unlink(seg.path()); !s.ok()) {
        SPDLOG_WARN("dropping '{}': {}", name, s.ToString());
      }
    }
  }
}

absl::Status TierNamespace::AddSegment(const std::string& segment_prefix,
                                       uint32_t rank, const std::string& bank,
                                       uint64_t rows, uint64_t row_bytes,
                                       const shm::SegmentOptions& options,
                                       std::vector<std::string>* made) {
  shm::SegmentSpec spec;
  spec.file_name =
      absl::StrCat(segment_prefix, ".", name, ".", bank, ".r", rank);
  spec.namespace_name = name;
  spec.bank = bank;
  spec.rank = rank;
  spec.rows = rows;
  spec.row_bytes = row_bytes;
  spec.layout_fingerprint = fingerprint;
  auto seg = shm::Segment::Create(spec, options);
  if (!seg.ok()) {
    return absl::Status(seg.status().code(),
                        absl::StrCat("bank '", bank, "' rank ", rank, ": ",
                                     seg.status().message()));
  }
  auto owned = std::make_unique<shm::Segment>(*std::move(seg));
  if (owned->created()) made->push_back(owned->path());
  v1::Segment info;
  info.set_bank(bank);
  info.set_rank(rank);
  info.set_path(owned->path());
  info.set_rows(owned->rows());
  info.set_row_bytes(owned->row_bytes());
  info.set_row_stride(owned->row_stride());
  info.set_data_offset(owned->data_offset());
  info.set_file_bytes(owned->file_bytes());
  info.set_huge_pages(owned->huge_pages());
  SPDLOG_INFO("namespace '{}': bank '{}' rank {} {} ({} rows x {} B{})", name,
              bank, rank, owned->created() ? "created" : "reopened", rows,
              row_bytes, owned->huge_pages() ? ", 2 MiB pages" : "");
  segments[rank].push_back(std::move(owned));
  segment_info[rank].push_back(std::move(info));
  return absl::OkStatus();
}

std::string TierNamespace::SegmentsDoubt(const JournalHeader& h) const {
  for (uint32_t r = 0; r < segments.size(); ++r) {
    for (size_t i = 0; i < segments[r].size(); ++i) {
      const shm::Segment& seg = *segments[r][i];
      const std::string& bank = segment_info[r][i].bank();
      auto known = std::find_if(h.segments.begin(), h.segments.end(),
                                [&](const JournalSegment& j) {
                                  return j.rank == r && j.bank == bank;
                                });
      if (known == h.segments.end()) {
        return absl::StrCat("bank '", bank, "' rank ", r,
                            " is not in the journal");
      }
      if (seg.created()) {
        return absl::StrCat(seg.path(), " was missing and is recreated");
      }
      if (known->path != seg.path() ||
          known->created_unix_ns != seg.header().created_unix_ns) {
        return absl::StrCat(seg.path(), " is not the segment the journal ",
                            "describes (recreated since)");
      }
    }
  }
  return "";
}

JournalHeader TierNamespace::MakeJournalHeader() const {
  JournalHeader h;
  h.name = name;
  h.layout = layout;
  h.page_rows = page_rows;
  h.snapshot_rows = snapshot_rows;
  h.max_replay_tokens = max_replay_tokens;
  for (uint32_t r = 0; r < segments.size(); ++r) {
    for (size_t i = 0; i < segments[r].size(); ++i) {
      h.segments.push_back({segment_info[r][i].bank(), r,
                            segments[r][i]->path(),
                            segments[r][i]->header().created_unix_ns});
    }
  }
  return h;
}

void TierNamespace::WatchIndex() {
  index->SetRemovalLog(&removed_keys);
  // The index dies with its namespace, and so does the function.
  index->SetEvictionObserver([this](const PrefixIndex::Eviction& e)
                                 ABSL_NO_THREAD_SAFETY_ANALYSIS {
                                   // Eviction runs under mu, held exclusively.
                                   observers->Evicting(*this, e);
                                 });
}

void TierNamespace::Committed(const TierCommit& commit) {
  committed_pages += commit.result->committed_pages;
  committed_snapshots += commit.result->committed_snapshots;
  observers->Committed(*this, commit);
}

void TierNamespace::TellRemoved() {
  if (removed_keys.empty()) return;
  observers->Removed(*this, removed_keys);
  removed_keys.clear();
}

absl::Status TierNamespace::CheckLeaseCap(uint64_t session,
                                          uint32_t max_leases) const {
  if (max_leases == 0) return absl::OkStatus();
  auto u = session_leases.find(session);
  if (u != session_leases.end() && u->second >= max_leases) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "pin: this session holds ", u->second, " leases in namespace '", name,
        "', the most one session may (--max_session_leases); release some"));
  }
  return absl::OkStatus();
}

uint64_t TierNamespace::AddLease(const Lease& lease) {
  uint64_t id = 0;
  do {
    id = RandomId();
  } while (leases.contains(id));
  index->Pin(lease.node);
  leases[id] = lease;
  ChargeLease(lease.session, 1);
  return id;
}

bool TierNamespace::QueueTouch(uint32_t node, const HashKey& key) {
  absl::MutexLock touch(&touch_mu);
  pending_touches.emplace_back(node, key);
  return pending_touches.size() >= kMaxPendingTouches;
}

void TierNamespace::CountLookup(const PrefixIndex::LookupResult& found,
                                size_t asked) {
  lookups.fetch_add(1, std::memory_order_relaxed);
  hit_pages.fetch_add(found.usable_pages, std::memory_order_relaxed);
  miss_pages.fetch_add(asked - found.usable_pages, std::memory_order_relaxed);
  if (found.has_snapshot) snapshot_hits.fetch_add(1, std::memory_order_relaxed);
}

void TierNamespace::ApplyPendingTouches() {
  std::vector<std::pair<uint32_t, HashKey>> touches;
  {
    absl::MutexLock touch(&touch_mu);
    touches.swap(pending_touches);
  }
  for (const auto& [node, key] : touches) {
    // An id evicted and reused since the lookup is another node now.
    if (index->NodeHasKey(node, key)) index->Touch(node);
  }
}

absl::Status TierNamespace::Journal(absl::Status appended) {
  if (journal == nullptr) return absl::OkStatus();
  if (appended.ok() && !journal->NeedsCheckpoint()) return appended;
  if (appended.ok() && checkpointer != nullptr) {
    // Compaction can wait: written off this lock (checkpointer.h).
    if (!journal->checkpointing() && !checkpoint_queued) {
      checkpoint_queued = true;
      checkpointer->Request(self);
    }
    return appended;
  }
  if (!appended.ok()) {
    SPDLOG_WARN("namespace '{}': {}; writing a checkpoint instead", name,
                appended.ToString());
  }
  const absl::Time start = absl::Now();
  const uint64_t before = journal->bytes();
  if (checkpointer != nullptr) checkpointer->Hook("checkpoint:writing");
  if (absl::Status s = journal->Checkpoint(*index); !s.ok()) {
    SPDLOG_ERROR("namespace '{}': checkpoint failed: {}", name, s.ToString());
    if (appended.ok()) return absl::OkStatus();  // Compaction can wait.
    return absl::UnavailableError(absl::StrCat(
        "namespace '", name, "': the journal cannot record this change (",
        appended.message(), "; checkpoint: ", s.message(), ")"));
  }
  SPDLOG_INFO("namespace '{}': journal checkpoint {} -> {} bytes in {}", name,
              before, journal->bytes(),
              absl::FormatDuration(absl::Now() - start));
  return absl::OkStatus();
}

}  // namespace kvtier::daemon
