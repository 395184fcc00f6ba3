// Internals shared by the files that implement shm/segment.h: descriptor
// and mapping owners, the size and path arithmetic, and the validation of a
// header, of options and of an existing segment against a spec. Not part of
// the shm API: only shm/segment*.cc include it.
//
//   segment_format.cc  the header's and the spec's rules (validation)
//   segment_create.cc  Segment::Create and the publish-by-link protocol
//   segment.cc         Segment::Open, Find, Unlink and the handle itself
//
// Thread-safety: stateless functions and single-owner RAII types; the
// functions are thread-safe, each object belongs to one thread at a time.

#ifndef KVTIER_SHM_SEGMENT_INTERNAL_H_
#define KVTIER_SHM_SEGMENT_INTERNAL_H_

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "shm/bank_header.h"
#include "shm/segment.h"

namespace kvtier::shm::segment_internal {

// Longest file_name a spec may carry.
inline constexpr size_t kMaxFileNameBytes = 200;

// Closes the descriptor it owns.
class UniqueFd {
 public:
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() {
    if (fd_ >= 0) close(fd_);
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

// Unmaps the region it owns unless released.
class UniqueMapping {
 public:
  UniqueMapping(void* base, uint64_t bytes) : base_(base), bytes_(bytes) {}
  UniqueMapping(const UniqueMapping&) = delete;
  UniqueMapping& operator=(const UniqueMapping&) = delete;
  ~UniqueMapping() {
    if (base_ != nullptr) munmap(base_, bytes_);
  }
  uint8_t* get() const { return static_cast<uint8_t*>(base_); }
  uint8_t* release() {
    return static_cast<uint8_t*>(std::exchange(base_, nullptr));
  }

 private:
  void* base_;
  uint64_t bytes_;
};

// Returns the smallest multiple of `align` >= `value`. REQUIRES: no overflow.
inline uint64_t RoundUp(uint64_t value, uint64_t align) {
  return (value + align - 1) / align * align;
}

// Returns dir + "/" + name without doubling a trailing slash.
inline std::string JoinPath(absl::string_view dir, absl::string_view name) {
  if (!dir.empty() && dir.back() == '/') return absl::StrCat(dir, name);
  return absl::StrCat(dir, "/", name);
}

// Returns the bytes of the file: kHeaderBytes + data, rounded up to a huge
// page on hugetlbfs. REQUIRES: ValidateSpec-style bounds on rows, row_bytes.
inline uint64_t FileBytes(uint64_t rows, uint64_t row_stride, bool huge_pages) {
  const uint64_t bytes = kHeaderBytes + rows * row_stride;
  return huge_pages ? RoundUp(bytes, kHugePageBytes) : bytes;
}

// Returns "'<text>'" with non-printable bytes escaped, for error messages.
std::string Quote(absl::string_view text);

// Returns OK if the directories are absolute and mode is plain permission
// bits that let the owner reopen the file; INVALID_ARGUMENT otherwise.
absl::Status ValidateOptions(const SegmentOptions& options);

// Returns FAILED_PRECONDITION naming the first identity field in which the
// existing segment differs from `spec`; OK if none does.
absl::Status CompareWithSpec(const Segment& segment, const SegmentSpec& spec);

// Returns the header fields' consistency with each other and with the
// file's size (see BankHeader's invariants): DATA_LOSS or
// FAILED_PRECONDITION naming `path` and the first broken rule. `state` was
// loaded with acquire order.
absl::Status ValidateHeader(const BankHeader& h, uint32_t state,
                            uint64_t file_size, const std::string& path);

}  // namespace kvtier::shm::segment_internal

#endif  // KVTIER_SHM_SEGMENT_INTERNAL_H_
