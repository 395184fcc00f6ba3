// Creation, validation and mapping of bank segments. See segment.h for the
// layout and the publish-by-link protocol.
//
// Thread-safety: no shared mutable state; the temporary-name counter is an
// atomic.

#include "shm/segment.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cassert>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <new>
#include <string>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "shm/bank_header.h"
#include "shm/hugepages.h"

namespace kvtier::shm {
namespace {

// statfs(2) f_type of hugetlbfs (linux/magic.h).
constexpr int64_t kHugeTlbfsMagic = 0x958458f6;
constexpr size_t kMaxFileNameBytes = 200;

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
uint64_t RoundUp(uint64_t value, uint64_t align) {
  return (value + align - 1) / align * align;
}

// Returns dir + "/" + name without doubling a trailing slash.
std::string JoinPath(absl::string_view dir, absl::string_view name) {
  if (!dir.empty() && dir.back() == '/') return absl::StrCat(dir, name);
  return absl::StrCat(dir, "/", name);
}

// Returns "'<text>'" with non-printable bytes escaped, for error messages.
std::string Quote(absl::string_view text) {
  return absl::StrCat("'", absl::CHexEscape(text), "'");
}

// Returns the bytes of the file: kHeaderBytes + data, rounded up to a huge
// page on hugetlbfs. REQUIRES: ValidateSpec-style bounds on rows, row_bytes.
uint64_t FileBytes(uint64_t rows, uint64_t row_stride, bool huge_pages) {
  const uint64_t bytes = kHeaderBytes + rows * row_stride;
  return huge_pages ? RoundUp(bytes, kHugePageBytes) : bytes;
}

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

// Returns the wall clock in nanoseconds since the Unix epoch.
uint64_t UnixNanos() {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull +
         static_cast<uint64_t>(ts.tv_nsec);
}

// Returns whether the file open at `fd` is on hugetlbfs.
absl::StatusOr<bool> OnHugeTlbfs(int fd, const std::string& path) {
  struct statfs fs;
  if (fstatfs(fd, &fs) != 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat("fstatfs '", path, "'"));
  }
  return static_cast<int64_t>(fs.f_type) == kHugeTlbfsMagic;
}

// Makes temporary names unique among this process's threads.
std::atomic<uint64_t> temp_counter{0};

}  // namespace

// Creation steps that need Segment's private members.
class SegmentCreator {
 public:
  // Builds the segment in `dir` under a temporary name and publishes it as
  // dir/spec.file_name. If that name appeared meanwhile, opens and validates
  // it instead. REQUIRES: spec and options validated.
  static absl::StatusOr<Segment> CreateIn(const std::string& dir,
                                          bool huge_pages,
                                          const SegmentSpec& spec,
                                          const SegmentOptions& options);

  // Opens the segment at `path` and checks it against `spec` and `policy`.
  static absl::StatusOr<Segment> OpenExisting(const std::string& path,
                                              const SegmentSpec& spec,
                                              HugePagePolicy policy);
};

absl::StatusOr<Segment> SegmentCreator::OpenExisting(const std::string& path,
                                                     const SegmentSpec& spec,
                                                     HugePagePolicy policy) {
  // Only a file of this process's uid is adopted: one that another user
  // pre-created under the predictable name is refused.
  absl::StatusOr<Segment> segment = Segment::Open(path, geteuid());
  if (!segment.ok()) {
    return absl::Status(
        segment.status().code(),
        absl::StrCat("existing segment: ", segment.status().message()));
  }
  if (absl::Status st = CompareWithSpec(*segment, spec); !st.ok()) return st;
  if (policy == HugePagePolicy::kRequire && !segment->huge_pages()) {
    return absl::FailedPreconditionError(
        absl::StrCat("segment '", path,
                     "' already exists without huge pages, but huge_pages is "
                     "kRequire"));
  }
  return segment;
}

absl::StatusOr<Segment> SegmentCreator::CreateIn(
    const std::string& dir, bool huge_pages, const SegmentSpec& spec,
    const SegmentOptions& options) {
  const std::string final_path = JoinPath(dir, spec.file_name);
  const uint64_t row_stride = RowStride(spec.row_bytes);
  const uint64_t file_bytes = FileBytes(spec.rows, row_stride, huge_pages);

  // A private name: nobody opens a segment that is still being built.
  std::string temp_path;
  int raw_fd = -1;
  for (int attempt = 0; raw_fd < 0; ++attempt) {
    temp_path = JoinPath(dir, TempSegmentName(spec.file_name, getpid(),
                                              temp_counter.fetch_add(1)));
    raw_fd =
        open(temp_path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (raw_fd < 0 && (errno != EEXIST || attempt >= 100)) {
      return absl::ErrnoToStatus(errno,
                                 absl::StrCat("create '", temp_path, "'"));
    }
  }
  UniqueFd fd(raw_fd);
  absl::Cleanup remove_temp = [&temp_path] { unlink(temp_path.c_str()); };

  // fchmod rather than open's mode: the umask must not weaken 0660.
  if (fchmod(fd.get(), options.mode) != 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat("fchmod '", temp_path, "'"));
  }
  if (options.group != static_cast<gid_t>(-1) &&
      fchown(fd.get(), static_cast<uid_t>(-1), options.group) != 0) {
    return absl::ErrnoToStatus(
        errno,
        absl::StrCat("fchown '", temp_path, "' to group ", options.group));
  }
  if (ftruncate(fd.get(), static_cast<off_t>(file_bytes)) != 0) {
    return absl::ErrnoToStatus(
        errno,
        absl::StrCat("ftruncate '", temp_path, "' to ", file_bytes, " bytes"));
  }
  if (options.populate) {
    // Allocates every page now (on hugetlbfs: takes them from the pool), so
    // lack of memory is an error here rather than a SIGBUS in an engine.
    int rc;
    do {
      rc = fallocate(fd.get(), 0, 0, static_cast<off_t>(file_bytes));
    } while (rc != 0 && errno == EINTR);
    if (rc != 0 && errno != EOPNOTSUPP && errno != ENOSYS) {
      return absl::ErrnoToStatus(
          errno, absl::StrCat("fallocate ", file_bytes, " bytes for '",
                              temp_path, "'"));
    }
    // EOPNOTSUPP: MAP_POPULATE below faults the pages in instead.
  }
  void* addr =
      mmap(nullptr, file_bytes, PROT_READ | PROT_WRITE,
           MAP_SHARED | (options.populate ? MAP_POPULATE : 0), fd.get(), 0);
  if (addr == MAP_FAILED) {
    return absl::ErrnoToStatus(
        errno,
        absl::StrCat("mmap ", file_bytes, " bytes of '", temp_path, "'"));
  }
  UniqueMapping mapping(addr, file_bytes);

  // The file is zero-filled; value-initialisation writes state=initialising.
  auto* header = ::new (mapping.get()) BankHeader{};
  header->magic = kMagic;
  header->version = kHeaderVersion;
  header->header_bytes = kHeaderBytes;
  header->rows = spec.rows;
  header->row_bytes = spec.row_bytes;
  header->row_stride = row_stride;
  header->data_offset = kHeaderBytes;
  header->file_bytes = file_bytes;
  header->rank = spec.rank;
  header->flags = huge_pages ? kFlagHugePages : 0;
  header->created_unix_ns = UnixNanos();
  std::memcpy(header->layout_fingerprint, spec.layout_fingerprint.data(),
              sizeof(header->layout_fingerprint));
  std::memcpy(header->namespace_name, spec.namespace_name.data(),
              spec.namespace_name.size());
  std::memcpy(header->bank, spec.bank.data(), spec.bank.size());
  // Last write, after population and every other field.
  header->state.store(kStateReady, std::memory_order_release);

  // Publish: link(2) fails with EEXIST if the name exists, so exactly one
  // racing creator wins and the name never shows a half-built segment.
  if (link(temp_path.c_str(), final_path.c_str()) != 0) {
    if (errno == EEXIST) {
      return OpenExisting(final_path, spec, options.huge_pages);
    }
    return absl::ErrnoToStatus(
        errno, absl::StrCat("link '", temp_path, "' to '", final_path, "'"));
  }
  // remove_temp now drops the temporary name; the file lives on as
  // final_path.

  Segment segment;
  segment.path_ = final_path;
  segment.base_ = mapping.release();
  segment.map_bytes_ = file_bytes;
  segment.rows_ = spec.rows;
  segment.row_bytes_ = spec.row_bytes;
  segment.row_stride_ = row_stride;
  segment.data_offset_ = kHeaderBytes;
  segment.file_bytes_ = file_bytes;
  segment.huge_pages_ = huge_pages;
  segment.created_ = true;
  struct stat st;
  if (fstat(fd.get(), &st) == 0) segment.inode_ = st.st_ino;
  return segment;
}

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

absl::StatusOr<Segment> Segment::Create(const SegmentSpec& spec,
                                        const SegmentOptions& options) {
  if (absl::Status st = ValidateSpec(spec); !st.ok()) return st;
  if (absl::Status st = ValidateOptions(options); !st.ok()) return st;

  absl::StatusOr<std::string> existing = Find(spec.file_name, options);
  if (existing.ok()) {
    return SegmentCreator::OpenExisting(*existing, spec, options.huge_pages);
  }
  if (!absl::IsNotFound(existing.status())) return existing.status();

  if (options.huge_pages != HugePagePolicy::kOff) {
    absl::StatusOr<HugeTlbInfo> info = DetectHugeTlbfs(options.hugetlbfs_dir);
    if (!info.ok()) {
      // Without a configured directory, kAuto quietly uses shm_dir; a
      // configured one that is unusable is a configuration error.
      if (options.huge_pages == HugePagePolicy::kRequire ||
          !options.hugetlbfs_dir.empty()) {
        return absl::FailedPreconditionError(
            absl::StrCat("huge pages unavailable for '", spec.file_name,
                         "': ", info.status().message()));
      }
    } else {
      const uint64_t need_pages =
          FileBytes(spec.rows, RowStride(spec.row_bytes), true) /
          kHugePageBytes;
      absl::Status huge_status;
      if (info->free_pages >= need_pages) {
        absl::StatusOr<Segment> segment =
            SegmentCreator::CreateIn(info->mount, true, spec, options);
        if (segment.ok()) return segment;
        huge_status = segment.status();
      } else {
        huge_status = absl::ResourceExhaustedError(absl::StrCat(
            "'", spec.file_name, "' needs ", need_pages, " free 2 MiB pages; ",
            info->free_pages, " available for '", info->mount, "' (of ",
            info->total_pages, " in the pool)"));
      }
      // A racing creator may have taken the pages and the name.
      if (absl::StatusOr<std::string> raced = Find(spec.file_name, options);
          raced.ok()) {
        return SegmentCreator::OpenExisting(*raced, spec, options.huge_pages);
      }
      if (options.huge_pages == HugePagePolicy::kRequire ||
          !absl::IsResourceExhausted(huge_status)) {
        return huge_status;
      }
    }
  }
  return SegmentCreator::CreateIn(options.shm_dir, false, spec, options);
}

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

uint8_t* Segment::row(uint64_t i) const {
  assert(i < rows_);
  return base_ + data_offset_ + i * row_stride_;
}

}  // namespace kvtier::shm
