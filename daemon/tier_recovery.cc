// TierCore's recovery: namespaces rebuilt from their journals at start,
// and the ones that cannot be, kept (journal and segments) and reported as
// unrecoverable until they can be reopened or an operator drops them; and,
// first, the temporary segment files of killed creators removed.
//
// Thread-safety: thread-safe (part of TierCore; lock order in tier_core.h).
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "daemon/tier_core.h"
#include "shm/hugepages.h"
#include "shm/segment_cleanup.h"
#include "shm/trusted_path.h"
#include "spdlog/spdlog.h"

namespace kvtier::daemon {

uint32_t TierCore::RemoveOrphanedTempSegments() {
  // The folders segments are made in: shm_dir, and the hugetlbfs folder
  // (configured, else the detected mount) whatever the policy now, since an
  // earlier run may have used it.
  std::vector<std::string> dirs = {options_.segments.shm_dir};
  if (!options_.segments.hugetlbfs_dir.empty()) {
    dirs.push_back(options_.segments.hugetlbfs_dir);
  } else if (auto huge = shm::DetectHugeTlbfs(""); huge.ok()) {
    dirs.push_back(huge->mount);
  }
  uint32_t removed = 0;
  for (const std::string& dir : dirs) {
    if (dir.empty()) continue;
    // Before this daemon creates any segment: temporaries of its own pid
    // are a previous process's (pid reuse, e.g. pid 1 in a container).
    auto scan = shm::RemoveTempSegments(dir, options_.segment_prefix,
                                        ::geteuid(), ::getpid());
    if (!scan.ok()) {
      SPDLOG_WARN("orphaned temporary segments: {}", scan.status().ToString());
      continue;
    }
    for (const std::string& path : scan->removed) {
      SPDLOG_INFO(
          "removed orphaned temporary segment {} (its creator was killed "
          "while creating it)",
          path);
    }
    for (const auto& kept : scan->kept) {
      SPDLOG_WARN("kept temporary segment {}: {}", kept.path, kept.reason);
    }
    removed += static_cast<uint32_t>(scan->removed.size());
  }
  return removed;
}

absl::StatusOr<TierCore::RecoveryReport> TierCore::Recover() {
  RecoveryReport report;
  if (options_.state_dir.empty()) {
    report.temp_segments_removed = RemoveOrphanedTempSegments();
    return report;
  }
  const absl::Time start = absl::Now();
  const std::string& dir = options_.state_dir;
  std::error_code ec;
  // Journals name every cached prefix's hashes and are replayed at start:
  // the daemon's eyes only, in a folder nobody else can write
  // (shm/trusted_path.h). A folder found owned by another uid or writable
  // by others is refused, its journals never read.
  const std::filesystem::path parent = std::filesystem::path(dir).parent_path();
  if (!parent.empty() && !std::filesystem::exists(parent, ec)) {
    std::filesystem::create_directories(parent, ec);
    if (ec) {
      return absl::FailedPreconditionError(absl::StrCat(
          "state_dir: cannot create ", parent.string(), ": ", ec.message()));
    }
  }
  if (absl::Status s = shm::EnsureTrustedDir(dir, 0700, "state_dir"); !s.ok()) {
    return s;
  }
  const std::string lock_path = dir + "/lock";
  const int lock_fd = ::open(lock_path.c_str(),
                             O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (lock_fd < 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "state_dir: cannot open ", lock_path, ": ", std::strerror(errno)));
  }
  if (::flock(lock_fd, LOCK_EX | LOCK_NB) != 0) {
    ::close(lock_fd);
    return absl::FailedPreconditionError(
        absl::StrCat("state_dir: ", dir, " is locked by another kvtierd (",
                     lock_path, "); give each daemon its own --state_dir"));
  }
  state_lock_fd_ = lock_fd;
  report.temp_segments_removed = RemoveOrphanedTempSegments();
  // The processes that held rows before the restart (fence_registry.h).
  auto waiting = fence_->Recover();
  if (!waiting.ok()) {
    SPDLOG_ERROR("recovery: {}", waiting.status().ToString());
  } else if (*waiting > 0) {
    SPDLOG_INFO(
        "recovery: {} processes that held rows before the restart are "
        "alive: rows from before it stay fenced until they report or exit",
        *waiting);
  }
  auto names = ListJournals(dir);
  if (!names.ok()) return names.status();
  for (const std::string& name : *names) {
    absl::Status s = RecoverNamespace(name, &report);
    if (s.ok()) continue;
    // Kept, journal and segments, for an operator or a later retry.
    const bool corrupt = s.code() == absl::StatusCode::kDataLoss;
    SPDLOG_ERROR(
        "recovery: namespace '{}' is unrecoverable: {}; its journal and "
        "segments are kept, nothing is served from it{}",
        name, std::string(s.message()),
        corrupt ? " until an operator drops it (kvtierctl drop --force)"
                : "; kvtierd retries reopening it");
    ++report.namespaces_unrecoverable;
    if (corrupt) ++report.journals_corrupt;
    absl::MutexLock lock(&mu_);
    unrecoverable_[name] =
        Unrecoverable{name, std::string(s.message()), corrupt, absl::Now()};
  }
  report.elapsed = absl::Now() - start;
  return report;
}

absl::Status TierCore::RecoverNamespace(const std::string& name,
                                        RecoveryReport* report) {
  const std::string path = JournalPath(options_.state_dir, name);
  auto contents = ReadJournal(path);
  if (!contents.ok()) {
    if (contents.status().code() == absl::StatusCode::kNotFound) {
      return absl::OkStatus();  // Dropped meanwhile.
    }
    ++report->journals_unreadable;
    return absl::DataLossError(contents.status().message());
  }
  report->journal_bytes += contents->file_bytes;
  if (contents->corrupt) {
    if (!options_.corrupt_journal_empty) {
      return absl::DataLossError(
          absl::StrCat("journal ", path, " is corrupt (", contents->stopped,
                       "): its pages cannot be vouched for"));
    }
  } else if (!contents->stopped.empty()) {
    ++report->journals_torn;
    SPDLOG_WARN(
        "recovery: namespace '{}': replay stopped after {} records: "
        "{} ({} of {} bytes used)",
        name, contents->records, contents->stopped, contents->valid_bytes,
        contents->file_bytes);
  }
  if (contents->inconsistent != 0) {
    SPDLOG_WARN(
        "recovery: namespace '{}': {} commit records disagreed with "
        "the replayed state and were applied in part",
        name, contents->inconsistent);
  }
  const JournalHeader& h = contents->header;
  v1::Capacity capacity;
  capacity.set_page_rows(h.page_rows);
  capacity.set_snapshot_rows(h.snapshot_rows);
  capacity.set_max_replay_tokens(h.max_replay_tokens);
  absl::StatusOr<std::shared_ptr<Namespace>> ns_or;
  {
    // Writes no journal: the old one is still being read.
    absl::MutexLock lock(&mu_);
    bool created = false;
    ns_or = CreateOrOpenLocked(h.name, h.layout, capacity, "", &created,
                               /*creator=*/nullptr, /*recovering=*/true);
  }
  if (!ns_or.ok()) {
    return absl::UnavailableError(
        absl::StrCat("cannot be reopened: ", ns_or.status().message()));
  }
  Namespace& ns = **ns_or;
  // Vouch for the bytes only when every segment is the one the journal
  // describes: same path, same creation stamp, and not just recreated.
  std::string doubt;
  if (contents->corrupt) {
    doubt = absl::StrCat("the journal is corrupt (", contents->stopped,
                         ") and --corrupt_journal=empty");
  }
  if (doubt.empty()) doubt = ns.SegmentsDoubt(h);
  absl::ReleasableMutexLock lock(&ns.mu);
  if (doubt.empty()) {
    auto restored = RestoreIndex(*contents, ns.index.get());
    if (restored.ok()) {
      report->pages += *restored;
    } else {
      doubt = std::string(restored.status().message());
      ns.index->Clear();
    }
  }
  // What the replay removed was never announced by this process.
  ns.removed_keys.clear();
  // Only the holders recorded in this namespace put its fence up.
  if (fence_->RestartWaiting(ns.name) > 0) {
    InstallRestartFenceLocked(ns, *contents, /*emptied=*/!doubt.empty());
  }
  if (!doubt.empty()) {
    ++report->namespaces_emptied;
    SPDLOG_WARN(
        "recovery: namespace '{}' reopened empty: {}; its {} "
        "journaled pages are not served",
        name, doubt, contents->keys.size());
  }
  auto journal = NamespaceJournal::Create(path, ns.MakeJournalHeader(),
                                          *ns.index, options_.journal);
  if (!journal.ok()) {
    // Not served without a journal: forget the half-opened namespace (its
    // segments and old journal stay) and report it unrecoverable.
    std::shared_ptr<Namespace> keep = *ns_or;
    lock.Release();  // Lock order: TierCore::mu_ before Namespace::mu.
    {
      absl::MutexLock core(&mu_);
      by_name_.erase(name);
      by_id_.erase(keep->id);
    }
    return absl::UnavailableError(absl::StrCat(
        "its journal cannot be rewritten: ", journal.status().message()));
  }
  ns.journal = *std::move(journal);
  ++report->namespaces;
  SPDLOG_INFO("recovery: namespace '{}': {} pages from {} records", name,
              ns.index->GetUsage().nodes, contents->records);
  return absl::OkStatus();
}

size_t TierCore::RetryUnrecoverable() {
  std::vector<std::string> names;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [name, u] : unrecoverable_) {
      if (!u.corrupt) names.push_back(name);
    }
  }
  size_t reopened = 0;
  for (const std::string& name : names) {
    RecoveryReport report;
    absl::Status s = RecoverNamespace(name, &report);
    absl::MutexLock lock(&mu_);
    if (s.ok()) {
      unrecoverable_.erase(name);
      ++reopened;
      SPDLOG_INFO("namespace '{}' reopened ({} pages)", name, report.pages);
    } else if (auto it = unrecoverable_.find(name);
               it != unrecoverable_.end()) {
      it->second.reason = std::string(s.message());
      it->second.corrupt = s.code() == absl::StatusCode::kDataLoss;
    }
  }
  return reopened;
}

std::vector<TierCore::Unrecoverable> TierCore::UnrecoverableNamespaces() {
  absl::MutexLock lock(&mu_);
  std::vector<Unrecoverable> out;
  for (const auto& [name, u] : unrecoverable_) out.push_back(u);
  std::sort(out.begin(), out.end(),
            [](const auto& a, const auto& b) { return a.name < b.name; });
  return out;
}

absl::Status TierCore::DropUnrecoverableLocked(const std::string& name) {
  auto it = unrecoverable_.find(name);
  if (it == unrecoverable_.end()) {
    return absl::NotFoundError(
        absl::StrCat("namespace: no namespace '", name, "'"));
  }
  // Forgotten now; its files are removed with mu_ released, the name
  // pending so that no namespace of that name is made meanwhile.
  unrecoverable_.erase(it);
  const std::shared_ptr<PendingName> pending =
      StartPendingLocked(name, /*creating=*/false);
  mu_.Unlock();
  // The segments: those the journal names when it can be read, else every
  // file of the namespace's name pattern in the shm folder.
  const std::string path = JournalPath(options_.state_dir, name);
  std::vector<std::string> segments;
  if (auto contents = ReadJournal(path); contents.ok()) {
    for (const JournalSegment& s : contents->header.segments) {
      segments.push_back(s.path);
    }
  } else {
    const std::string prefix =
        absl::StrCat(options_.segment_prefix, ".", name, ".");
    std::error_code ec;
    for (const std::string& dir :
         {options_.segments.shm_dir, options_.segments.hugetlbfs_dir}) {
      if (dir.empty()) continue;
      for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
        const std::string file = e.path().filename().string();
        // "<prefix>.<name>.<bank>.r<rank>": a bank name has no '.', so a
        // namespace "a" never takes "a.b"'s files.
        absl::string_view rest = file;
        if (!absl::ConsumePrefix(&rest, prefix)) continue;
        const size_t dot = rest.find('.');
        if (dot == absl::string_view::npos || dot == 0 ||
            rest.find('.', dot + 1) != absl::string_view::npos ||
            rest.substr(dot + 1, 1) != "r" ||
            rest.substr(0, dot).find_first_not_of(
                "abcdefghijklmnopqrstuvwxyz0123456789_") !=
                absl::string_view::npos) {
          continue;
        }
        segments.push_back(e.path());
      }
    }
  }
  for (const std::string& seg : segments) {
    if (absl::Status s = shm::Segment::Unlink(seg); !s.ok()) {
      SPDLOG_WARN("dropping unrecoverable '{}': {}", name, s.ToString());
    }
  }
  std::error_code ec;
  std::filesystem::remove(path, ec);
  SPDLOG_INFO("unrecoverable namespace '{}' dropped ({} segments)", name,
              segments.size());
  mu_.Lock();
  EndPendingLocked(name, *pending);
  return absl::OkStatus();
}

}  // namespace kvtier::daemon
