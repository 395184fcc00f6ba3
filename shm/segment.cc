// Segment::Open, Find and Unlink, and the Segment handle itself: mapping an
// existing bank segment after checking the file can be trusted
// (shm/trusted_path.h) and validating its header (segment_format.cc). See
// segment.h for the layout; creation is in segment_create.cc.
//
// Thread-safety: the static functions are thread-safe (no shared state); a
// Segment is an immutable handle, see segment.h.

#include "shm/segment.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/types.h>
#include <unistd.h>

#include <atomic>
#include <cassert>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "shm/bank_header.h"
#include "shm/hugepages.h"
#include "shm/numa.h"
#include "shm/segment_internal.h"
#include "shm/trusted_path.h"

namespace kvtier::shm {
namespace {

using segment_internal::JoinPath;
using segment_internal::Quote;
using segment_internal::UniqueFd;
using segment_internal::UniqueMapping;
using segment_internal::ValidateHeader;

// statfs(2) f_type of hugetlbfs (linux/magic.h).
constexpr int64_t kHugeTlbfsMagic = 0x958458f6;

// Returns whether the file open at `fd` is on hugetlbfs.
absl::StatusOr<bool> OnHugeTlbfs(int fd, const std::string& path) {
  struct statfs fs;
  if (fstatfs(fd, &fs) != 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat("fstatfs '", path, "'"));
  }
  return static_cast<int64_t>(fs.f_type) == kHugeTlbfsMagic;
}

}  // namespace

absl::StatusOr<Segment> Segment::Open(const std::string& path, uid_t owner) {
  // O_NOFOLLOW: a symlink planted under a segment's name is refused, never
  // followed; O_NONBLOCK: a FIFO planted there cannot hang the open.
  UniqueFd fd(open(path.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK));
  if (fd.get() < 0) {
    if (errno == ENOENT) {
      return absl::NotFoundError(
          absl::StrCat("segment '", path, "' does not exist"));
    }
    if (errno == ELOOP) {
      return absl::FailedPreconditionError(absl::StrCat(
          "segment '", path,
          "' is a symlink: refused, never followed (another user may have "
          "planted it). Remove it"));
    }
    return absl::ErrnoToStatus(errno, absl::StrCat("open '", path, "'"));
  }
  struct stat st;
  if (fstat(fd.get(), &st) != 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat("fstat '", path, "'"));
  }
  if (absl::Status trusted = CheckTrustedFile(st, path, owner, "segment");
      !trusted.ok()) {
    return trusted;
  }
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  if (file_size < kHeaderBytes) {
    return absl::DataLossError(absl::StrCat(
        "segment '", path, "' is ", file_size, " bytes, shorter than its ",
        kHeaderBytes, "-byte header (truncated?)"));
  }
  absl::StatusOr<bool> huge = OnHugeTlbfs(fd.get(), path);
  if (!huge.ok()) return huge.status();
  absl::StatusOr<Segment> segment =
      MapAndValidate(fd.get(), file_size, path, *huge);
  if (segment.ok()) segment->inode_ = st.st_ino;
  return segment;
}

absl::StatusOr<Segment> Segment::MapAndValidate(int fd, uint64_t file_size,
                                                const std::string& path,
                                                bool huge_pages) {
  // Mapping the whole file is cheap (nothing is faulted in) and lets the
  // header be read through the same mapping the caller will use.
  void* addr =
      mmap(nullptr, file_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (addr == MAP_FAILED) {
    return absl::ErrnoToStatus(
        errno, absl::StrCat("mmap ", file_size, " bytes of '", path, "'"));
  }
  UniqueMapping mapping(addr, file_size);
  const auto* header = reinterpret_cast<const BankHeader*>(mapping.get());
  const uint32_t state = header->state.load(std::memory_order_acquire);
  if (absl::Status st = ValidateHeader(*header, state, file_size, path);
      !st.ok()) {
    return st;
  }
  Segment segment;
  segment.path_ = path;
  segment.base_ = mapping.release();
  segment.map_bytes_ = file_size;
  segment.rows_ = header->rows;
  segment.row_bytes_ = header->row_bytes;
  segment.row_stride_ = header->row_stride;
  segment.data_offset_ = header->data_offset;
  segment.file_bytes_ = header->file_bytes;
  segment.huge_pages_ = huge_pages;
  segment.created_ = false;
  return segment;
}

absl::StatusOr<std::string> Segment::Find(const std::string& file_name,
                                          const SegmentOptions& options) {
  if (absl::Status st = ValidateFileName(file_name); !st.ok()) return st;
  std::string huge_dir = options.hugetlbfs_dir;
  if (huge_dir.empty()) {
    absl::StatusOr<HugeTlbInfo> info = DetectHugeTlbfs("");
    if (info.ok()) huge_dir = info->mount;
  }
  std::string searched;
  for (const std::string* dir :
       std::initializer_list<const std::string*>{&huge_dir, &options.shm_dir}) {
    if (dir->empty()) continue;
    const std::string path = JoinPath(*dir, file_name);
    struct stat st;
    if (lstat(path.c_str(), &st) == 0) return path;  // Open checks what.
    if (errno != ENOENT && errno != ENOTDIR) {
      return absl::ErrnoToStatus(errno, absl::StrCat("stat '", path, "'"));
    }
    absl::StrAppend(&searched, searched.empty() ? "" : " nor ", "'", *dir, "'");
  }
  return absl::NotFoundError(absl::StrCat("segment file ", Quote(file_name),
                                          " is in neither ", searched));
}

absl::Status Segment::Unlink(const std::string& path) {
  if (unlink(path.c_str()) != 0) {
    if (errno == ENOENT) {
      return absl::NotFoundError(
          absl::StrCat("segment '", path, "' does not exist"));
    }
    return absl::ErrnoToStatus(errno, absl::StrCat("unlink '", path, "'"));
  }
  return absl::OkStatus();
}

Segment::Segment(Segment&& other) noexcept
    : path_(std::move(other.path_)),
      base_(std::exchange(other.base_, nullptr)),
      map_bytes_(std::exchange(other.map_bytes_, 0)),
      rows_(std::exchange(other.rows_, 0)),
      row_bytes_(std::exchange(other.row_bytes_, 0)),
      row_stride_(std::exchange(other.row_stride_, 0)),
      data_offset_(std::exchange(other.data_offset_, 0)),
      file_bytes_(std::exchange(other.file_bytes_, 0)),
      huge_pages_(std::exchange(other.huge_pages_, false)),
      created_(std::exchange(other.created_, false)),
      inode_(std::exchange(other.inode_, 0)) {}

Segment& Segment::operator=(Segment&& other) noexcept {
  if (this != &other) {
    if (base_ != nullptr) munmap(base_, map_bytes_);
    path_ = std::move(other.path_);
    base_ = std::exchange(other.base_, nullptr);
    map_bytes_ = std::exchange(other.map_bytes_, 0);
    rows_ = std::exchange(other.rows_, 0);
    row_bytes_ = std::exchange(other.row_bytes_, 0);
    row_stride_ = std::exchange(other.row_stride_, 0);
    data_offset_ = std::exchange(other.data_offset_, 0);
    file_bytes_ = std::exchange(other.file_bytes_, 0);
    huge_pages_ = std::exchange(other.huge_pages_, false);
    created_ = std::exchange(other.created_, false);
    inode_ = std::exchange(other.inode_, 0);
  }
  return *this;
}

Segment::~Segment() {
  if (base_ != nullptr) munmap(base_, map_bytes_);
}

absl::StatusOr<int> Segment::NumaNode() const { return BoundNode(base_); }

absl::Status Segment::MoveToNode(int node) const {
  return BindToNode(base_, map_bytes_, node, /*move=*/true);
}

uint8_t* Segment::row(uint64_t i) const {
  assert(i < rows_);
  return base_ + data_offset_ + i * row_stride_;
}

}  // namespace kvtier::shm
