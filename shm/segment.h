// Named shared-memory segments ("banks") of fixed-size rows: the memory the
// daemon owns and every engine on the node maps. A segment is one file in
// /dev/shm (tmpfs, 4 KiB pages) or on a 2 MiB hugetlbfs mount, holding a
// BankHeader at offset 0 and `rows` rows of `row_stride` bytes from
// data_offset on.
//
// Layout decision: data_offset is kHeaderBytes (4096) on both file systems,
// so readers have one rule; on hugetlbfs only the file size is rounded up to
// a multiple of kHugePageBytes (hugetlbfs cannot size or map a file in
// smaller units), which wastes less than 2 MiB per bank. file_bytes is
// exactly data_offset + rows * row_stride on tmpfs.
//
// Creation is crash-safe and race-safe: the creator builds the segment under
// a private temporary name in the target directory (sized, populated, header
// written, state set to ready last), then publishes it with link(2), which
// fails atomically if the name exists. So a file under its final name is
// always complete; a creator that loses the race discards its copy and opens
// the winner's. A creator killed part-way leaves only a dot-prefixed
// temporary ("." + file_name + ".<pid>.<n>.tmp") that never matches a name.
// The exclusion is per directory: two creators that pick different
// directories (hugetlbfs and shm_dir, e.g. when huge pages run out mid-race)
// could both publish. kvtierd is the only creator on a node, so that takes
// two daemons.
//
// This uses plain POSIX (open, ftruncate, fallocate, mmap, fchmod, fchown)
// rather than Boost.Interprocess, which can neither place a file on
// hugetlbfs, nor pass MAP_POPULATE, nor fallocate.
//
// Thread-safety: the static functions are thread-safe. A Segment is an
// immutable handle (its accessors are const and safe to call concurrently);
// the memory it maps is shared with other processes and has no
// synchronisation of its own: row contents are coordinated by the daemon's
// reservations and leases.

#ifndef KVTIER_SHM_SEGMENT_H_
#define KVTIER_SHM_SEGMENT_H_

#include <sys/types.h>

#include <array>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "shm/bank_header.h"
#include "shm/trusted_path.h"

namespace kvtier::shm {

// Identity and shape of one bank.
struct SegmentSpec {
  std::string file_name;       // [A-Za-z0-9._-]{1,200}, not "." or ".."
  std::string namespace_name;  // 1..128 bytes, no NUL
  std::string bank;            // 1..32 bytes, no NUL
  uint32_t rank = 0;
  uint64_t rows = 0;       // >= 1
  uint64_t row_bytes = 0;  // >= 1; row_stride = round_up(row_bytes, kRowAlign)
  std::array<uint8_t, 32> layout_fingerprint{};
};

enum class HugePagePolicy {
  kAuto,     // hugetlbfs when a 2 MiB mount has enough free pages, else shm_dir
  kOff,      // always shm_dir
  kRequire,  // hugetlbfs or fail
};

// Where and how segments are created.
struct SegmentOptions {
  std::string shm_dir = "/dev/shm";  // absolute
  // Absolute directory on a 2 MiB hugetlbfs mount. Empty: autodetect one from
  // /proc/mounts. When set, it must be on hugetlbfs (unless huge_pages is
  // kOff), else Create fails with FAILED_PRECONDITION rather than silently
  // ignoring the setting.
  std::string hugetlbfs_dir;
  HugePagePolicy huge_pages = HugePagePolicy::kAuto;
  // Fault every page in at creation (fallocate, then MAP_POPULATE), so that
  // the daemon pays for population and engines only map and register.
  bool populate = true;
  mode_t mode = 0660;  // permission bits only; must include 0600
  gid_t group = static_cast<gid_t>(-1);  // -1: leave the group alone
  // NUMA node the memory is bound to (MPOL_BIND, set before any page is
  // allocated, shm/numa.h); -1: none, pages come from wherever the
  // populating thread runs. On hugetlbfs the node's own free pages must
  // suffice (checked under sysfs_root before creating).
  int numa_node = -1;
  std::string sysfs_root = "/sys";  // absolute; tests point it elsewhere
};

// The private name (in the target directory) a creator builds segment
// `file_name` under before publishing it: "." + file_name + "." + pid + "."
// + counter + ".tmp", pid and counter decimal. Only a creator killed
// part-way leaves one behind; shm/segment_cleanup.h removes those.
inline std::string TempSegmentName(absl::string_view file_name, pid_t pid,
                                   uint64_t counter) {
  return absl::StrCat(".", file_name, ".", pid, ".", counter, ".tmp");
}

// Returns round_up(row_bytes, kRowAlign).
// REQUIRES: row_bytes <= kMaxDataBytes.
uint64_t RowStride(uint64_t row_bytes);

// Returns OK if every field of `spec` is within its documented range and
// rows * row_stride <= kMaxDataBytes; INVALID_ARGUMENT naming the first
// offending field otherwise.
absl::Status ValidateSpec(const SegmentSpec& spec);

// Returns OK if `file_name` is [A-Za-z0-9._-]{1,200} and not "." or "..";
// INVALID_ARGUMENT otherwise.
absl::Status ValidateFileName(const std::string& file_name);

// A move-only RAII mapping (MAP_SHARED, read-write) of one segment file.
class Segment {
 public:
  // Returns the segment named spec.file_name, creating it if needed.
  //
  // If a file of that name exists in the hugetlbfs dir or shm_dir (see Find),
  // it is opened and validated; it must be this process's own (Open with
  // geteuid(): a file another user pre-created or a symlink is refused,
  // never adopted), and with the same rows, row_bytes, rank, bank,
  // namespace_name and layout_fingerprint it is returned with
  // created() == false; otherwise FAILED_PRECONDITION names the first field
  // that differs and the file is left untouched. Under kRequire an existing
  // segment that is not on huge pages is FAILED_PRECONDITION too.
  //
  // Otherwise the file is created with mode options.mode (set with fchmod,
  // so the umask cannot weaken it) and options.group, sized, populated when
  // options.populate, its header written and state set to ready last, and
  // it is returned with created() == true. Placement: kAuto uses hugetlbfs
  // when a mount is found and enough 2 MiB pages are free, falling back to
  // shm_dir if that fails for lack of pages; kRequire fails with
  // FAILED_PRECONDITION (no usable mount) or RESOURCE_EXHAUSTED (too few free
  // pages). A creation that fails part-way removes its file. Two processes
  // racing on one name both succeed on the same file, exactly one with
  // created() == true. INVALID_ARGUMENT for a bad spec or options.
  static absl::StatusOr<Segment> Create(const SegmentSpec& spec,
                                        const SegmentOptions& options);

  // Maps the existing segment at `path` (absolute) and validates its header:
  // NOT_FOUND if the file does not exist; DATA_LOSS for a bad magic, a
  // truncated file or inconsistent sizes; FAILED_PRECONDITION for another
  // header version, unknown flags or a segment whose state is not ready.
  // The file is opened with O_NOFOLLOW and checked before it is mapped
  // (shm/trusted_path.h): a symlink, a file that is not regular, one
  // writable by every user, or one not owned by `owner` (unless kAnyOwner)
  // is FAILED_PRECONDITION. The daemon passes its own uid, clients the
  // daemon's. Does not populate: the caller's first touch (or
  // cudaHostRegister) faults pages in. The result has created() == false.
  static absl::StatusOr<Segment> Open(const std::string& path,
                                      uid_t owner = kAnyOwner);

  // Returns the path of `file_name` in the hugetlbfs dir (options'
  // hugetlbfs_dir, else the autodetected mount, if any) or else in
  // options.shm_dir, whatever the huge-page policy. NOT_FOUND if it is in
  // neither; INVALID_ARGUMENT for a bad file name.
  static absl::StatusOr<std::string> Find(const std::string& file_name,
                                          const SegmentOptions& options);

  // Removes the name `path`. Existing mappings (in any process) stay valid;
  // the memory is freed when the last one goes. NOT_FOUND if it does not
  // exist.
  static absl::Status Unlink(const std::string& path);

  Segment(Segment&& other) noexcept;
  Segment& operator=(Segment&& other) noexcept;
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;
  // Unmaps the segment. Never unlinks it.
  ~Segment();

  // The validated header at offset 0 of the mapping. Valid while *this is.
  const BankHeader& header() const {
    return *reinterpret_cast<const BankHeader*>(base_);
  }
  // The absolute path the segment was created or opened at.
  const std::string& path() const { return path_; }
  // Start of the mapping (the header); file_bytes() long. Not owned by the
  // caller; valid while *this is.
  uint8_t* base() const { return base_; }
  // Start of row `i`: base() + data_offset() + i * row_stride(), 16-byte
  // aligned. REQUIRES: i < rows().
  uint8_t* row(uint64_t i) const;

  uint64_t rows() const { return rows_; }
  uint64_t row_bytes() const { return row_bytes_; }
  uint64_t row_stride() const { return row_stride_; }
  uint64_t data_offset() const { return data_offset_; }
  uint64_t file_bytes() const { return file_bytes_; }
  // True if the file lives on hugetlbfs (its pages are 2 MiB).
  bool huge_pages() const { return huge_pages_; }
  // True if this call to Create made the file; false if it existed.
  bool created() const { return created_; }
  // The file's inode number, to tell it from a file put under its name
  // later.
  ino_t inode() const { return inode_; }
  // The NUMA node the file's memory policy binds it to, -1 when none, as
  // the kernel reports it now (get_mempolicy on the mapping).
  absl::StatusOr<int> NumaNode() const;
  // Binds the file's memory to `node` and moves the pages it has there
  // (those no other process maps; shm/numa.h BindToNode). For a bank whose
  // user turned out to sit on another node than the one it was created on.
  absl::Status MoveToNode(int node) const;

 private:
  Segment() = default;

  // Maps the validated segment open at `fd` of `file_size` bytes.
  static absl::StatusOr<Segment> MapAndValidate(int fd, uint64_t file_size,
                                                const std::string& path,
                                                bool huge_pages);

  // Immutable after construction (reset only by moves).
  std::string path_;
  uint8_t* base_ = nullptr;
  uint64_t map_bytes_ = 0;
  uint64_t rows_ = 0;
  uint64_t row_bytes_ = 0;
  uint64_t row_stride_ = 0;
  uint64_t data_offset_ = 0;
  uint64_t file_bytes_ = 0;
  bool huge_pages_ = false;
  bool created_ = false;
  ino_t inode_ = 0;

  // Creation internals in segment_create.cc fill in the members directly.
  friend class SegmentCreator;
};

}  // namespace kvtier::shm

#endif  // KVTIER_SHM_SEGMENT_H_
