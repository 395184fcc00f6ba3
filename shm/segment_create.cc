// Segment::Create: finding or building a bank segment. A new segment is
// built under a private temporary name in its target directory (sized,
// populated, header written, state set to ready last) and published with
// link(2), so the final name never shows a half-built segment; see
// segment.h for the protocol and the huge-page placement rules.
//
// Thread-safety: thread-safe; the only shared state is the temporary-name
// counter, an atomic.

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <new>
#include <string>

#include "absl/cleanup/cleanup.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "shm/bank_header.h"
#include "shm/hugepages.h"
#include "shm/numa.h"
#include "shm/segment.h"
#include "shm/segment_internal.h"

namespace kvtier::shm {
namespace {

using segment_internal::CompareWithSpec;
using segment_internal::FileBytes;
using segment_internal::JoinPath;
using segment_internal::UniqueFd;
using segment_internal::UniqueMapping;
using segment_internal::ValidateOptions;

// Returns the wall clock in nanoseconds since the Unix epoch.
uint64_t UnixNanos() {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull +
         static_cast<uint64_t>(ts.tv_nsec);
}

// Makes temporary names unique among this process's threads.
std::atomic<uint64_t> temp_counter{0};

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14.
#endif

// Faults in every page of a fresh mapping for writing: MADV_POPULATE_WRITE,
// or on older kernels one write per page (the file is zero, and so is what
// is written).
absl::Status PopulateWrite(void* addr, uint64_t bytes, bool huge_pages) {
  if (madvise(addr, bytes, MADV_POPULATE_WRITE) == 0) return absl::OkStatus();
  if (errno != EINVAL) {
    return absl::ErrnoToStatus(
        errno,
        absl::StrCat("populate ", bytes, " bytes (MADV_POPULATE_WRITE)"));
  }
  const uint64_t step = huge_pages ? kHugePageBytes : 4096;
  auto* p = static_cast<volatile uint8_t*>(addr);
  for (uint64_t off = 0; off < bytes; off += step) p[off] = 0;
  return absl::OkStatus();
}

// Creates a file for `file_name` in `dir` under a fresh temporary name
// (O_EXCL, mode 0600, close-on-exec), trying another name while one is
// taken, 100 times at most. Returns its descriptor and sets *temp_path to
// its path, also on failure (the last name tried).
absl::StatusOr<int> CreateTempFile(const std::string& dir,
                                   const std::string& file_name,
                                   std::string* temp_path) {
  int raw_fd = -1;
  for (int attempt = 0; raw_fd < 0; ++attempt) {
    *temp_path = JoinPath(
        dir, TempSegmentName(file_name, getpid(), temp_counter.fetch_add(1)));
    raw_fd =
        open(temp_path->c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (raw_fd < 0 && (errno != EEXIST || attempt >= 100)) {
      return absl::ErrnoToStatus(errno,
                                 absl::StrCat("create '", *temp_path, "'"));
    }
  }
  return raw_fd;
}

// Gives the fresh file `fd` (at `path`) options.mode, options.group unless
// that is -1, and a size of `file_bytes`.
absl::Status SetModeAndSize(int fd, const std::string& path,
                            uint64_t file_bytes,
                            const SegmentOptions& options) {
  // fchmod rather than open's mode: the umask must not weaken 0660.
  if (fchmod(fd, options.mode) != 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat("fchmod '", path, "'"));
  }
  if (options.group != static_cast<gid_t>(-1) &&
      fchown(fd, static_cast<uid_t>(-1), options.group) != 0) {
    return absl::ErrnoToStatus(
        errno, absl::StrCat("fchown '", path, "' to group ", options.group));
  }
  if (ftruncate(fd, static_cast<off_t>(file_bytes)) != 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat("ftruncate '", path, "' to ",
                                                   file_bytes, " bytes"));
  }
  return absl::OkStatus();
}

// Binds the mapping [addr, addr + file_bytes) of `fd` (at `path`) to
// options.numa_node (if >= 0) and, with options.populate, allocates every
// page of the file and faults it into the mapping.
absl::Status PlacePages(int fd, void* addr, const std::string& path,
                        uint64_t file_bytes, bool huge_pages,
                        const SegmentOptions& options) {
  if (options.numa_node >= 0) {
    if (absl::Status st = BindToNode(addr, file_bytes, options.numa_node,
                                     /*move=*/false);
        !st.ok()) {
      return absl::Status(st.code(),
                          absl::StrCat("'", path, "': ", st.message()));
    }
  }
  if (!options.populate) return absl::OkStatus();
  // Allocates every page now (on hugetlbfs: takes them from the pool, of the
  // bound node), so lack of memory is an error here rather than a SIGBUS in
  // an engine.
  int rc;
  do {
    rc = fallocate(fd, 0, 0, static_cast<off_t>(file_bytes));
  } while (rc != 0 && errno == EINTR);
  if (rc != 0 && errno != EOPNOTSUPP && errno != ENOSYS) {
    return absl::ErrnoToStatus(
        errno,
        absl::StrCat("fallocate ", file_bytes, " bytes for '", path, "'",
                     options.numa_node >= 0
                         ? absl::StrCat(" on NUMA node ", options.numa_node)
                         : ""));
  }
  // Faults every page into this mapping (and, where fallocate was not
  // supported, allocates it).
  if (absl::Status st = PopulateWrite(addr, file_bytes, huge_pages); !st.ok()) {
    return absl::Status(st.code(),
                        absl::StrCat("'", path, "': ", st.message()));
  }
  return absl::OkStatus();
}

// Writes the bank header of `spec` at `base`, the start of a zero-filled
// mapping of the whole file, with state set to ready last (release), after
// every other field.
void WriteHeader(uint8_t* base, const SegmentSpec& spec, uint64_t row_stride,
                 uint64_t file_bytes, bool huge_pages) {
  // The file is zero-filled; value-initialisation writes state=initialising.
  auto* header = ::new (base) BankHeader{};
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
}

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
  absl::StatusOr<int> raw_fd = CreateTempFile(dir, spec.file_name, &temp_path);
  if (!raw_fd.ok()) return raw_fd.status();
  UniqueFd fd(*raw_fd);
  absl::Cleanup remove_temp = [&temp_path] { unlink(temp_path.c_str()); };

  if (absl::Status st =
          SetModeAndSize(fd.get(), temp_path, file_bytes, options);
      !st.ok()) {
    return st;
  }
  // Mapped before anything is allocated, so that a NUMA binding is in place
  // for every page fallocate and population allocate.
  void* addr = mmap(nullptr, file_bytes, PROT_READ | PROT_WRITE, MAP_SHARED,
                    fd.get(), 0);
  if (addr == MAP_FAILED) {
    return absl::ErrnoToStatus(
        errno,
        absl::StrCat("mmap ", file_bytes, " bytes of '", temp_path, "'"));
  }
  UniqueMapping mapping(addr, file_bytes);
  if (absl::Status st = PlacePages(fd.get(), addr, temp_path, file_bytes,
                                   huge_pages, options);
      !st.ok()) {
    return st;
  }
  WriteHeader(mapping.get(), spec, row_stride, file_bytes, huge_pages);

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
      // Bound to a node, the pages must come from that node's pool.
      uint64_t free_pages = info->free_pages;
      std::string where = absl::StrCat("'", info->mount, "' (of ",
                                       info->total_pages, " in the pool)");
      if (options.numa_node >= 0) {
        absl::StatusOr<uint64_t> node_free =
            NodeFreeHugePages(options.sysfs_root, options.numa_node);
        free_pages = node_free.ok() ? std::min(free_pages, *node_free) : 0;
        where = absl::StrCat("NUMA node ", options.numa_node, " for '",
                             info->mount, "'");
      }
      if (free_pages >= need_pages) {
        absl::StatusOr<Segment> segment =
            SegmentCreator::CreateIn(info->mount, true, spec, options);
        if (segment.ok()) return segment;
        huge_status = segment.status();
      } else {
        huge_status = absl::ResourceExhaustedError(absl::StrCat(
            "'", spec.file_name, "' needs ", need_pages, " free 2 MiB pages; ",
            free_pages, " available on ", where));
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
  if (options.numa_node >= 0 && options.populate) {
    // Bound to a node that cannot hold it, population would end in the
    // kernel's OOM handling (the daemon a likely victim): refuse it here.
    const uint64_t need =
        FileBytes(spec.rows, RowStride(spec.row_bytes), false);
    absl::StatusOr<uint64_t> avail =
        NodeAvailableBytes(options.sysfs_root, options.numa_node);
    if (avail.ok() && *avail < need) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "'", spec.file_name, "' needs ", need, " bytes on NUMA node ",
          options.numa_node, ", which has ", *avail,
          " free or reclaimable (--bank_numa_node=none lifts the binding)"));
    }
  }
  return SegmentCreator::CreateIn(options.shm_dir, false, spec, options);
}

}  // namespace kvtier::shm
