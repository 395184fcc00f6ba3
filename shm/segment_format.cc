// The rules of a bank segment's on-disk format and of the specs and options
// that create one: ValidateSpec, ValidateFileName and RowStride (segment.h),
// and the checks segment_internal.h declares: a mapped header against
// BankHeader's invariants and the file's size, an existing segment against
// the spec that asks for it, and SegmentOptions. Every error names the
// field at fault and what was found.
//
// Thread-safety: stateless functions, thread-safe.

#include <sys/types.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "shm/bank_header.h"
#include "shm/numa.h"
#include "shm/segment.h"
#include "shm/segment_internal.h"

namespace kvtier::shm {
namespace segment_internal {

std::string Quote(absl::string_view text) {
  return absl::StrCat("'", absl::CHexEscape(text), "'");
}

// Returns OK if the directories are absolute and mode is plain permission
// bits that let the owner reopen the file; INVALID_ARGUMENT otherwise.
absl::Status ValidateOptions(const SegmentOptions& options) {
  if (options.shm_dir.empty() || options.shm_dir.front() != '/') {
    return absl::InvalidArgumentError(absl::StrCat(
        "shm_dir ", Quote(options.shm_dir), " must be an absolute path"));
  }
  if (!options.hugetlbfs_dir.empty() && options.hugetlbfs_dir.front() != '/') {
    return absl::InvalidArgumentError(
        absl::StrCat("hugetlbfs_dir ", Quote(options.hugetlbfs_dir),
                     " must be empty or an absolute path"));
  }
  if (options.numa_node < -1 || options.numa_node > kMaxNumaNode) {
    return absl::InvalidArgumentError(
        absl::StrCat("numa_node ", options.numa_node,
                     " must be -1 (none) or 0..", kMaxNumaNode));
  }
  if (options.sysfs_root.empty() || options.sysfs_root.front() != '/') {
    return absl::InvalidArgumentError(absl::StrCat(
        "sysfs_root ", Quote(options.sysfs_root), " must be an absolute path"));
  }
  if ((options.mode & ~static_cast<mode_t>(0777)) != 0 ||
      (options.mode & 0600) != 0600) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "mode 0%03o invalid: permission bits only, including owner rw (0600)",
        static_cast<unsigned>(options.mode)));
  }
  return absl::OkStatus();
}

// Returns FAILED_PRECONDITION naming the first identity field in which the
// existing segment differs from `spec`.
absl::Status CompareWithSpec(const Segment& segment, const SegmentSpec& spec) {
  const BankHeader& h = segment.header();
  auto differs = [&](absl::string_view field, absl::string_view have,
                     absl::string_view want) {
    return absl::FailedPreconditionError(
        absl::StrCat("segment '", segment.path(), "' already exists with ",
                     field, "=", have, ", but the spec asks for ", field, "=",
                     want, "; the file was left untouched"));
  };
  if (h.rows != spec.rows) {
    return differs("rows", absl::StrCat(h.rows), absl::StrCat(spec.rows));
  }
  if (h.row_bytes != spec.row_bytes) {
    return differs("row_bytes", absl::StrCat(h.row_bytes),
                   absl::StrCat(spec.row_bytes));
  }
  if (h.rank != spec.rank) {
    return differs("rank", absl::StrCat(h.rank), absl::StrCat(spec.rank));
  }
  if (spec.bank != h.bank) {
    return differs("bank", Quote(h.bank), Quote(spec.bank));
  }
  if (spec.namespace_name != h.namespace_name) {
    return differs("namespace_name", Quote(h.namespace_name),
                   Quote(spec.namespace_name));
  }
  if (std::memcmp(h.layout_fingerprint, spec.layout_fingerprint.data(),
                  sizeof(h.layout_fingerprint)) != 0) {
    auto hex = [](const uint8_t* p) {
      return absl::BytesToHexString(
          absl::string_view(reinterpret_cast<const char*>(p),
                            sizeof(BankHeader::layout_fingerprint)));
    };
    return differs("layout_fingerprint", hex(h.layout_fingerprint),
                   hex(spec.layout_fingerprint.data()));
  }
  return absl::OkStatus();
}

// Returns the header fields' consistency with each other and with the
// file's size; see BankHeader's invariants. `state` was loaded with acquire.
absl::Status ValidateHeader(const BankHeader& h, uint32_t state,
                            uint64_t file_size, const std::string& path) {
  auto data_loss = [&](absl::string_view what) {
    return absl::DataLossError(absl::StrCat("segment '", path, "': ", what));
  };
  if (h.magic != kMagic) {
    return data_loss(absl::StrCat("bad magic 0x", absl::Hex(h.magic),
                                  ", expected 0x", absl::Hex(kMagic),
                                  " (\"KVTIERB1\"): not a kvtier bank"));
  }
  if (h.version != kHeaderVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat("segment '", path, "': header version ", h.version,
                     ", this build reads version ", kHeaderVersion));
  }
  if (state != kStateReady) {
    return absl::FailedPreconditionError(absl::StrCat(
        "segment '", path, "': state=", state,
        ", not ready: its creator did not finish initialising it"));
  }
  if ((h.flags & ~kKnownFlags) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("segment '", path, "': unknown flags 0x",
                     absl::Hex(h.flags & ~kKnownFlags)));
  }
  if (h.header_bytes != kHeaderBytes) {
    return data_loss(absl::StrCat("header_bytes=", h.header_bytes,
                                  ", expected ", kHeaderBytes));
  }
  if (h.data_offset != kHeaderBytes) {
    return data_loss(absl::StrCat("data_offset=", h.data_offset, ", expected ",
                                  kHeaderBytes));
  }
  if (h.rows == 0) return data_loss("rows=0");
  if (h.row_bytes == 0 || h.row_bytes > kMaxDataBytes) {
    return data_loss(absl::StrCat("row_bytes=", h.row_bytes, " out of range"));
  }
  if (h.row_stride != RowStride(h.row_bytes)) {
    return data_loss(absl::StrCat("row_stride=", h.row_stride,
                                  " but row_bytes=", h.row_bytes, " needs ",
                                  RowStride(h.row_bytes)));
  }
  if (h.rows > kMaxDataBytes / h.row_stride) {
    return data_loss(absl::StrCat("rows=", h.rows, " * row_stride=",
                                  h.row_stride, " exceeds ", kMaxDataBytes));
  }
  const bool huge = (h.flags & kFlagHugePages) != 0;
  const uint64_t want_bytes = FileBytes(h.rows, h.row_stride, huge);
  if (h.file_bytes != want_bytes) {
    return data_loss(absl::StrCat(
        "file_bytes=", h.file_bytes, " but rows=", h.rows, ", row_stride=",
        h.row_stride, huge ? " on huge pages" : "", " need ", want_bytes));
  }
  if (file_size != h.file_bytes) {
    return data_loss(absl::StrCat("the file is ", file_size,
                                  " bytes but its header says file_bytes=",
                                  h.file_bytes, " (truncated or extended)"));
  }
  if (strnlen(h.namespace_name, sizeof(h.namespace_name)) == 0 ||
      strnlen(h.namespace_name, sizeof(h.namespace_name)) ==
          sizeof(h.namespace_name)) {
    return data_loss("namespace_name is empty or not NUL-terminated");
  }
  if (strnlen(h.bank, sizeof(h.bank)) == 0 ||
      strnlen(h.bank, sizeof(h.bank)) == sizeof(h.bank)) {
    return data_loss("bank is empty or not NUL-terminated");
  }
  return absl::OkStatus();
}

}  // namespace segment_internal

namespace {

using segment_internal::kMaxFileNameBytes;
using segment_internal::Quote;
using segment_internal::RoundUp;

// Returns OK if `value` is 1..max_bytes bytes without NUL (it is stored
// NUL-terminated); INVALID_ARGUMENT naming `field` otherwise.
absl::Status ValidateName(absl::string_view field, const std::string& value,
                          size_t max_bytes) {
  if (value.empty() || value.size() > max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " must be 1..", max_bytes, " bytes, got ",
                     value.size(), " (", Quote(value.substr(0, 64)), ")"));
  }
  if (value.find('\0') != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " ", Quote(value), " contains a NUL byte"));
  }
  return absl::OkStatus();
}

}  // namespace

uint64_t RowStride(uint64_t row_bytes) { return RoundUp(row_bytes, kRowAlign); }

absl::Status ValidateFileName(const std::string& file_name) {
  if (file_name.empty() || file_name.size() > kMaxFileNameBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("file_name must be 1..", kMaxFileNameBytes,
                     " characters, got ", file_name.size()));
  }
  if (file_name == "." || file_name == "..") {
    return absl::InvalidArgumentError(
        absl::StrCat("file_name ", Quote(file_name), " is not a file name"));
  }
  for (char c : file_name) {
    const bool ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
                    (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
    if (!ok) {
      return absl::InvalidArgumentError(absl::StrCat(
          "file_name ", Quote(file_name), " contains ",
          Quote(absl::string_view(&c, 1)), "; only [A-Za-z0-9._-] allowed"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateSpec(const SegmentSpec& spec) {
  if (absl::Status st = ValidateFileName(spec.file_name); !st.ok()) return st;
  if (absl::Status st = ValidateName("namespace_name", spec.namespace_name,
                                     kNamespaceNameCapacity - 1);
      !st.ok()) {
    return st;
  }
  if (absl::Status st = ValidateName("bank", spec.bank, kBankNameCapacity - 1);
      !st.ok()) {
    return st;
  }
  if (spec.rows == 0) return absl::InvalidArgumentError("rows must be >= 1");
  if (spec.row_bytes == 0) {
    return absl::InvalidArgumentError("row_bytes must be >= 1");
  }
  if (spec.row_bytes > kMaxDataBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("row_bytes=", spec.row_bytes, " exceeds the ",
                     kMaxDataBytes >> 40, " TiB limit of one bank"));
  }
  if (spec.rows > kMaxDataBytes / RowStride(spec.row_bytes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rows=", spec.rows, " * row_stride=", RowStride(spec.row_bytes),
        " exceeds the ", kMaxDataBytes >> 40, " TiB limit of one bank"));
  }
  return absl::OkStatus();
}

}  // namespace kvtier::shm
