// TierNamespace's operations on itself alone: its journal header, the
// recency updates that unpinned lookups queue, turning a journal append's
// outcome into a request's, and fence hold ids.
//
// Thread-safety: as annotated in tier_namespace.h (the caller holds mu
// where a method requires it).
#include "daemon/tier_namespace.h"

#include "absl/strings/str_cat.h"
#include "daemon/random_id.h"
#include "spdlog/spdlog.h"

namespace kvtier::daemon {

uint64_t TierNamespace::NewHoldId() const {
  for (;;) {
    const uint64_t id = RandomId();
    if (!holds.contains(id)) return id;
  }
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
