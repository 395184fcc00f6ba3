// The namespace journal's writing side (journal.h): NamespaceJournal's
// checkpoints and appends, and the journal files of a state folder.
//
// Thread-safety: a NamespaceJournal is not thread-safe: its owner's pointer
// to it is ABSL_GUARDED_BY(Namespace::mu) (tier_namespace.h), which also
// orders the records as the index's changes. JournalPath and ListJournals
// are thread-safe.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "daemon/journal.h"
#include "daemon/journal_format.h"
#include "daemon/namespace_layout.h"

namespace kvtier::daemon {
namespace {

using journal_internal::EncodeHeader;
using journal_internal::EncodeReserve;
using journal_internal::Errno;
using journal_internal::Frame;
using journal_internal::kCommit;
using journal_internal::kDrop;
using journal_internal::kHeader;
using journal_internal::kMagic;
using journal_internal::kNodes;
using journal_internal::kNodesPerRecord;
using journal_internal::kRelease;
using journal_internal::kReserve;
using journal_internal::kRowsPerReserveRecord;
using journal_internal::PutHash;
using journal_internal::PutU32;
using journal_internal::PutU64;
using journal_internal::PutU8;
using journal_internal::StoredRanks;

// Write the checkpoint in pieces of about this size.
constexpr size_t kWriteChunk = 4u << 20;

// Writes all of `data` to `fd` (retrying short writes and EINTR).
bool WriteAll(int fd, absl::string_view data) {
  while (!data.empty()) {
    const ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

std::string Dirname(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

std::string Basename(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

}  // namespace

std::string JournalPath(const std::string& state_dir, const std::string& name) {
  return absl::StrCat(state_dir, "/ns.", name, ".journal");
}

absl::StatusOr<std::vector<std::string>> ListJournals(
    const std::string& state_dir) {
  std::error_code ec;
  std::filesystem::directory_iterator it(state_dir, ec);
  if (ec) {
    if (ec == std::errc::no_such_file_or_directory) {
      return absl::NotFoundError(
          absl::StrCat("journal: no folder ", state_dir));
    }
    return absl::InternalError(
        absl::StrCat("journal: listing ", state_dir, ": ", ec.message()));
  }
  std::vector<std::string> names;
  constexpr absl::string_view kPrefix = "ns.", kSuffix = ".journal";
  for (; it != std::filesystem::directory_iterator(); it.increment(ec)) {
    const std::string file = it->path().filename().string();
    if (absl::StartsWith(file, ".ns.") && absl::EndsWith(file, ".tmp")) {
      std::error_code ignored;
      std::filesystem::remove(it->path(), ignored);  // A checkpoint cut short.
      continue;
    }
    if (file.size() <= kPrefix.size() + kSuffix.size() ||
        !absl::StartsWith(file, kPrefix) || !absl::EndsWith(file, kSuffix)) {
      continue;
    }
    std::string name = file.substr(
        kPrefix.size(), file.size() - kPrefix.size() - kSuffix.size());
    if (ValidateNamespaceName(name).ok()) names.push_back(std::move(name));
  }
  if (ec) {
    return absl::InternalError(
        absl::StrCat("journal: listing ", state_dir, ": ", ec.message()));
  }
  std::sort(names.begin(), names.end());
  return names;
}

NamespaceJournal::NamespaceJournal(std::string path, JournalHeader header,
                                   const JournalOptions& options)
    : path_(std::move(path)),
      header_(std::move(header)),
      options_(options),
      hash_bytes_(HashBytes(header_.layout.hash_kind())),
      ranks_(StoredRanks(header_.layout)),
      hybrid_(header_.snapshot_rows > 0) {}

NamespaceJournal::~NamespaceJournal() {
  if (fd_ >= 0) ::close(fd_);
}

absl::StatusOr<std::unique_ptr<NamespaceJournal>> NamespaceJournal::Create(
    const std::string& path, const JournalHeader& header,
    const PrefixIndex& index, const JournalOptions& options) {
  std::unique_ptr<NamespaceJournal> journal(
      new NamespaceJournal(path, header, options));
  if (absl::Status s = journal->Checkpoint(index); !s.ok()) return s;
  return journal;
}

NamespaceJournal::PendingCheckpoint::~PendingCheckpoint() {
  if (fd >= 0) ::close(fd);
  if (!renamed && fd >= 0) ::unlink(tmp.c_str());
}

absl::Status NamespaceJournal::Checkpoint(const PrefixIndex& index) {
  AbandonCheckpoint();
  std::unique_ptr<PendingCheckpoint> p = EncodeCheckpoint(index);
  if (absl::Status s = WriteCheckpoint(*p); !s.ok()) {
    AbandonCheckpoint();
    return s;
  }
  absl::Status s = FinishCheckpoint(std::move(p));
  if (s.ok()) broken_ = false;
  return s;
}

std::unique_ptr<NamespaceJournal::PendingCheckpoint>
NamespaceJournal::StartCheckpoint(const PrefixIndex& index) {
  // A broken journal is mended by Checkpoint.
  if (pending_ != nullptr || broken_ || fd_ < 0) return nullptr;
  return EncodeCheckpoint(index);
}

std::unique_ptr<NamespaceJournal::PendingCheckpoint>
NamespaceJournal::EncodeCheckpoint(const PrefixIndex& index) {
  // A name of its own: an abandoned one may still be writing its file.
  static std::atomic<uint64_t> serial{0};
  auto p = std::make_unique<PendingCheckpoint>();
  p->journal = this;
  p->fsync = options_.fsync;
  p->tmp = absl::StrCat(Dirname(path_), "/.", Basename(path_), ".",
                        serial.fetch_add(1), ".tmp");
  std::string& out = p->head;
  out.assign(kMagic, sizeof(kMagic));
  Frame(&out, kHeader, EncodeHeader(header_));
  // Checkpoint ordinals: node id -> position in the checkpoint. Node ids
  // are dense (a pool), so a vector indexes them.
  std::vector<uint32_t> ordinal;
  uint32_t next_ordinal = 0;
  std::string batch;
  uint32_t in_batch = 0;
  auto flush = [&] {
    if (in_batch == 0) return;
    std::string payload;
    PutU32(&payload, in_batch);
    payload += batch;
    Frame(&out, kNodes, payload);
    batch.clear();
    in_batch = 0;
  };
  index.ForEachNode([&](const PrefixIndex::NodeView& v) {
    if (v.id >= ordinal.size()) ordinal.resize(v.id + v.id / 2 + 1024, kNoNode);
    ordinal[v.id] = next_ordinal++;
    PutU32(&batch, v.parent == kNoNode ? kNoNode : ordinal[v.parent]);
    PutHash(&batch, *v.key, hash_bytes_);
    PutU64(&batch, v.last_use_tick);
    for (uint32_t row : v.page_rows) PutU32(&batch, row);
    if (hybrid_) {
      for (uint32_t row : v.snapshot_rows) PutU32(&batch, row);
    }
    if (++in_batch == kNodesPerRecord) flush();
  });
  flush();
  // Then the reservations outstanding now: one record per rank (more when
  // very large), after the nodes.
  for (uint32_t r = 0; r < ranks_; ++r) {
    const std::vector<uint32_t> pages = index.AllocatedPageRows(r);
    const std::vector<uint32_t> snaps =
        hybrid_ ? index.AllocatedSnapshotRows(r) : std::vector<uint32_t>();
    for (size_t i = 0; i < std::max(pages.size(), snaps.size());
         i += kRowsPerReserveRecord) {
      auto chunk = [&](const std::vector<uint32_t>& rows) {
        const size_t from = std::min(i, rows.size());
        return absl::MakeConstSpan(rows).subspan(
            from, std::min(kRowsPerReserveRecord, rows.size() - from));
      };
      std::string payload;
      EncodeReserve(&payload, r, chunk(pages), chunk(snaps));
      Frame(&out, kReserve, payload);
    }
  }
  p->head_bytes = out.size();
  pending_ = p.get();
  return p;
}

absl::Status NamespaceJournal::WriteCheckpoint(PendingCheckpoint& p) {
  p.fd = ::open(p.tmp.c_str(),
                O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0600);
  if (p.fd < 0) return Errno("cannot create", p.tmp);
  absl::string_view data = p.head;
  while (!data.empty()) {
    const size_t n = std::min(data.size(), kWriteChunk);
    if (!WriteAll(p.fd, data.substr(0, n))) {
      return Errno("cannot write", p.tmp);
    }
    data.remove_prefix(n);
  }
  std::string().swap(p.head);
  if (p.fsync && ::fdatasync(p.fd) != 0) return Errno("cannot sync", p.tmp);
  return absl::OkStatus();
}

absl::Status NamespaceJournal::FinishCheckpoint(
    std::unique_ptr<PendingCheckpoint> p, int* retired_fd) {
  if (p == nullptr || p.get() != pending_ || p->abandoned || p->fd < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("journal: ", path_,
                     ": the checkpoint was abandoned (a failed append or "
                     "another checkpoint) and is discarded"));
  }
  pending_ = nullptr;
  // The records appended since the start, then the file takes the
  // journal's place.
  if (!p->tail.empty() && !WriteAll(p->fd, p->tail)) {
    return Errno("cannot write", p->tmp);
  }
  if (p->fsync && !p->tail.empty() && ::fdatasync(p->fd) != 0) {
    return Errno("cannot sync", p->tmp);
  }
  if (::rename(p->tmp.c_str(), path_.c_str()) != 0) {
    return Errno("cannot rename to", path_);
  }
  p->renamed = true;
  if (p->fsync) {
    const int dfd =
        ::open(Dirname(path_).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
      (void)::fsync(dfd);
      ::close(dfd);
    }
  }
  // The old file is unlinked now: closing it frees its blocks, which can
  // take milliseconds; the caller may do that after its lock.
  if (retired_fd != nullptr) {
    *retired_fd = fd_;
  } else if (fd_ >= 0) {
    ::close(fd_);
  }
  fd_ = p->fd;
  p->fd = -1;
  checkpoint_bytes_ = p->head_bytes;
  bytes_ = p->head_bytes + p->tail.size();
  return absl::OkStatus();
}

void NamespaceJournal::DiscardCheckpoint(
    std::unique_ptr<PendingCheckpoint> pending) {
  if (pending != nullptr && pending.get() == pending_) pending_ = nullptr;
}

void NamespaceJournal::AbandonCheckpoint() {
  if (pending_ == nullptr) return;
  pending_->abandoned = true;
  pending_ = nullptr;
}

bool NamespaceJournal::NeedsCheckpoint() const {
  if (broken_) return true;
  const double limit =
      std::max<double>(static_cast<double>(options_.min_compact_bytes),
                       options_.compact_factor * checkpoint_bytes_);
  return static_cast<double>(bytes_ - checkpoint_bytes_) > limit;
}

absl::Status NamespaceJournal::Append(uint8_t type) {
  if (fd_ < 0) {
    return absl::InternalError(absl::StrCat("journal: ", path_, " is closed"));
  }
  if (broken_) {
    return absl::InternalError(absl::StrCat(
        "journal: ", path_, " failed a write and awaits a checkpoint"));
  }
  record_.clear();
  Frame(&record_, type, payload_);
  if (!WriteAll(fd_, record_)) {
    const absl::Status error = Errno("cannot append to", path_);
    broken_ = true;
    AbandonCheckpoint();  // Its tail would lack the record.
    // Cut a partial record off, so nothing after it is ever hidden by it.
    if (::ftruncate(fd_, static_cast<off_t>(bytes_)) != 0) {
      return absl::InternalError(absl::StrCat(
          error.message(), "; and cannot truncate: ", std::strerror(errno)));
    }
    return error;
  }
  bytes_ += record_.size();
  if (pending_ != nullptr) pending_->tail += record_;
  if (options_.fsync && ::fdatasync(fd_) != 0) {
    broken_ = true;
    AbandonCheckpoint();
    return Errno("cannot sync", path_);
  }
  return absl::OkStatus();
}

absl::Status NamespaceJournal::AppendReserve(
    uint32_t rank, absl::Span<const uint32_t> page_rows,
    absl::Span<const uint32_t> snapshot_rows) {
  payload_.clear();
  EncodeReserve(&payload_, rank, page_rows, snapshot_rows);
  return Append(kReserve);
}

absl::Status NamespaceJournal::AppendRelease(
    uint32_t rank, absl::Span<const uint32_t> page_rows,
    absl::Span<const uint32_t> snapshot_rows) {
  payload_.clear();
  EncodeReserve(&payload_, rank, page_rows, snapshot_rows);
  return Append(kRelease);
}

absl::Status NamespaceJournal::AppendCommit(
    uint32_t rank, const HashKey* parent, absl::Span<const HashKey> hashes,
    absl::Span<const uint32_t> rows,
    absl::Span<const PrefixIndex::SnapshotPlacement> snapshots,
    absl::Span<const uint32_t> freed_page_rows,
    absl::Span<const uint32_t> freed_snapshot_rows) {
  if (rows.size() != hashes.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rows: ", rows.size(), " rows for ", hashes.size(), " hashes"));
  }
  const absl::flat_hash_set<uint32_t> freed_pages(freed_page_rows.begin(),
                                                  freed_page_rows.end());
  const absl::flat_hash_set<uint32_t> freed_snaps(freed_snapshot_rows.begin(),
                                                  freed_snapshot_rows.end());
  payload_.clear();
  payload_.reserve(16 + (hashes.size() + snapshots.size()) * (hash_bytes_ + 4));
  PutU32(&payload_, rank);
  PutU8(&payload_, parent != nullptr ? 1 : 0);
  if (parent != nullptr) PutHash(&payload_, *parent, hash_bytes_);
  PutU32(&payload_, static_cast<uint32_t>(hashes.size()));
  for (size_t i = 0; i < hashes.size(); ++i) {
    PutHash(&payload_, hashes[i], hash_bytes_);
    PutU32(&payload_, freed_pages.contains(rows[i]) ? kNoRow : rows[i]);
  }
  PutU32(&payload_, static_cast<uint32_t>(snapshots.size()));
  for (const auto& s : snapshots) {
    PutHash(&payload_, s.hash, hash_bytes_);
    PutU32(&payload_, freed_snaps.contains(s.row) ? kNoRow : s.row);
  }
  return Append(kCommit);
}

absl::Status NamespaceJournal::AppendDrop(const HashKey& hash) {
  payload_.clear();
  PutHash(&payload_, hash, hash_bytes_);
  return Append(kDrop);
}

absl::Status NamespaceJournal::Remove() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  if (::unlink(path_.c_str()) != 0 && errno != ENOENT) {
    return Errno("cannot remove", path_);
  }
  return absl::OkStatus();
}

}  // namespace kvtier::daemon
