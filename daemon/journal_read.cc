// The namespace journal's reading side (journal.h): ReadJournal maps the
// file, checks its header and replays its records through a ReplayModel
// (journal_replay.h); RestoreIndex fills a fresh index with the result.
//
// Thread-safety: both functions are thread-safe (they share no state).
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "daemon/journal.h"
#include "daemon/journal_format.h"
#include "daemon/journal_replay.h"
#include "daemon/namespace_layout.h"

namespace kvtier::daemon {

using journal_internal::Cursor;
using journal_internal::DecodeHeader;
using journal_internal::Errno;
using journal_internal::kFrameBytes;
using journal_internal::kHeader;
using journal_internal::kMagic;
using journal_internal::NextRecord;
using journal_internal::NextStatus;
using journal_internal::ReplayModel;
using journal_internal::StoredRanks;

namespace {

// Whether the record at `at`, which NextRecord did not frame, can be what a
// crash left (the rule of journal.h, "How a replay ends"): fewer bytes than
// a frame are left, its length runs past the end of the file, or every
// byte from `at` on is zero. A record wholly inside the file cannot be
// torn, whatever follows it: a cut record is short of its length.
bool CanBeTorn(const uint8_t* data, size_t size, size_t at) {
  const size_t left = size - at;
  if (left < kFrameBytes + 1) return true;
  uint32_t length;
  std::memcpy(&length, data + at, 4);
  if (length > left - kFrameBytes) return true;
  return std::all_of(data + at, data + size, [](uint8_t b) { return b == 0; });
}

}  // namespace

absl::StatusOr<JournalContents> ReadJournal(const std::string& path) {
  // O_NOFOLLOW, then the owner check below: only the daemon's own journal
  // is replayed (shm/trusted_path.h).
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) {
    if (errno == ENOENT) {
      return absl::NotFoundError(absl::StrCat("journal: no file ", path));
    }
    return Errno("cannot open", path);
  }
  absl::Cleanup close_fd = [fd] { ::close(fd); };
  struct stat st;
  if (::fstat(fd, &st) != 0) return Errno("cannot stat", path);
  if (!S_ISREG(st.st_mode) || st.st_uid != ::geteuid()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "journal ", path, ": not a regular file of kvtierd's uid ", ::geteuid(),
        " (uid ", st.st_uid, "): refused, never replayed"));
  }
  const size_t size = static_cast<size_t>(st.st_size);
  if (size < sizeof(kMagic)) {
    return absl::DataLossError(absl::StrCat("journal ", path, ": ", size,
                                            " bytes, shorter than its magic"));
  }
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  if (map == MAP_FAILED) return Errno("cannot map", path);
  absl::Cleanup unmap = [map, size] { ::munmap(map, size); };
  const uint8_t* data = static_cast<const uint8_t*>(map);
  if (std::memcmp(data, kMagic, sizeof(kMagic)) != 0) {
    return absl::DataLossError(
        absl::StrCat("journal ", path, ": bad magic (not a kvtier journal)"));
  }

  JournalContents out;
  out.file_bytes = size;
  size_t pos = sizeof(kMagic);
  uint8_t type = 0;
  Cursor payload(nullptr, 0);
  std::string why;
  if (NextRecord(data, size, &pos, &type, &payload, &why) !=
          NextStatus::kRecord ||
      type != kHeader) {
    return absl::DataLossError(
        absl::StrCat("journal ", path, ": no readable header",
                     why.empty() ? "" : absl::StrCat(" (", why, ")")));
  }
  if (absl::Status s = DecodeHeader(payload, &out.header); !s.ok()) {
    return absl::DataLossError(
        absl::StrCat("journal ", path, ": ", s.message()));
  }
  out.hash_bytes = HashBytes(out.header.layout.hash_kind());
  out.ranks = StoredRanks(out.header.layout);
  out.records = 1;
  out.valid_bytes = pos;
  ReplayModel model(out.header, out.hash_bytes, out.ranks, size);
  // Every node came with at least a hash and a row in some record.
  model.Reserve(std::min<uint64_t>(out.ranks * out.header.page_rows,
                                   size / (out.hash_bytes + 4)));
  for (;;) {
    const size_t at = pos;
    const NextStatus next = NextRecord(data, size, &pos, &type, &payload, &why);
    if (next == NextStatus::kEnd) break;
    if (next != NextStatus::kRecord) {
      out.corrupt = next == NextStatus::kCorrupt;
      out.stopped = why;
      if (next == NextStatus::kTorn && !CanBeTorn(data, size, at)) {
        out.corrupt = true;
        out.stopped = absl::StrCat(
            "corrupt record at offset ", at, ": CRC mismatch in a record ",
            "wholly inside the file (", size - at,
            " bytes from its start to the end; a torn write leaves a record "
            "short of its length)");
      }
      break;
    }
    // A record whose CRC matches was written whole: a bad field in it is
    // corruption wherever it is (no crash writes one).
    if (absl::Status s = model.Apply(type, payload); !s.ok()) {
      out.corrupt = true;
      out.stopped =
          absl::StrCat("corrupt record at offset ", at, ": ", s.message());
      break;
    }
    ++out.records;
    out.valid_bytes = pos;
  }
  model.Export(&out);
  return out;
}

absl::StatusOr<uint64_t> RestoreIndex(const JournalContents& contents,
                                      PrefixIndex* index) {
  const size_t n = contents.keys.size();
  const uint32_t ranks = contents.ranks;
  const bool hybrid = !contents.snapshot_rows.empty();
  uint64_t restored = 0;
  std::vector<bool> included(n), has_child(n), inserted(n);
  std::vector<uint32_t> leaves, path, rows, snaps;
  std::vector<HashKey> hashes;
  std::vector<PrefixIndex::SnapshotPlacement> placements;
  index->ReserveNodes(n);
  for (uint32_t r = 0; r < ranks; ++r) {
    std::fill(has_child.begin(), has_child.end(), false);
    std::fill(inserted.begin(), inserted.end(), false);
    rows.clear();
    snaps.clear();
    for (size_t i = 0; i < n; ++i) {
      const uint32_t p = contents.parents[i];
      included[i] = contents.page_rows[i * ranks + r] != kNoRow &&
                    (p == kNoNode || included[p]);
      if (!included[i]) continue;
      if (p != kNoNode) has_child[p] = true;
      rows.push_back(contents.page_rows[i * ranks + r]);
      if (hybrid && contents.snapshot_rows[i * ranks + r] != kNoRow) {
        snaps.push_back(contents.snapshot_rows[i * ranks + r]);
      }
    }
    if (absl::Status s = index->ClaimPageRows(r, rows); !s.ok()) {
      return absl::InternalError(
          absl::StrCat("rank ", r, ": claiming page rows: ", s.message()));
    }
    if (absl::Status s = index->ClaimSnapshotRows(r, snaps); !s.ok()) {
      return absl::InternalError(
          absl::StrCat("rank ", r, ": claiming snapshot rows: ", s.message()));
    }
    leaves.clear();
    for (size_t i = 0; i < n; ++i) {
      if (included[i] && !has_child[i])
        leaves.push_back(static_cast<uint32_t>(i));
    }
    // Least recent first: each commit is more recent than the one before.
    std::stable_sort(leaves.begin(), leaves.end(), [&](uint32_t a, uint32_t b) {
      return contents.seq[a] < contents.seq[b];
    });
    for (uint32_t leaf : leaves) {
      path.clear();
      uint32_t x = leaf;
      while (x != kNoNode && !inserted[x]) {
        path.push_back(x);
        x = contents.parents[x];
      }
      std::reverse(path.begin(), path.end());
      hashes.clear();
      rows.clear();
      placements.clear();
      for (uint32_t i : path) {
        hashes.push_back(contents.keys[i]);
        rows.push_back(contents.page_rows[i * ranks + r]);
        if (hybrid && contents.snapshot_rows[i * ranks + r] != kNoRow) {
          placements.push_back(
              {contents.snapshot_rows[i * ranks + r], contents.keys[i]});
        }
        inserted[i] = true;
      }
      auto result = index->Commit(r, x == kNoNode ? nullptr : &contents.keys[x],
                                  hashes, rows, placements);
      if (!result.ok()) {
        return absl::InternalError(
            absl::StrCat("rank ", r, ": restoring a path of ", path.size(),
                         " pages: ", result.status().message()));
      }
      if (result->deduplicated_pages != 0 ||
          result->deduplicated_snapshots != 0) {
        return absl::InternalError(absl::StrCat(
            "rank ", r, ": a restored path deduplicated ",
            result->deduplicated_pages, " pages (a hash held twice)"));
      }
      restored += path.size();
    }
  }
  return restored;
}

}  // namespace kvtier::daemon
