// MappedBanks (client/bank_mapping.h): mapping at attach, CUDA registration,
// and the remap in place after a daemon restart.
#include "client/bank_mapping.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

#include "absl/strings/str_cat.h"
#include "client/cuda_host.h"

namespace kvtier::client {

absl::StatusOr<std::unique_ptr<MappedBanks>> MappedBanks::Map(
    const std::vector<BankSegmentInfo>& banks, uid_t owner) {
  std::unique_ptr<MappedBanks> m(new MappedBanks());
  for (const auto& seg : banks) {
    auto mapped = shm::Segment::Open(seg.path, owner);
    if (!mapped.ok()) {
      return absl::Status(mapped.status().code(),
                          absl::StrCat("mapping bank '", seg.bank,
                                       "': ", mapped.status().message()));
    }
    if (mapped->rows() != seg.rows || mapped->row_bytes() != seg.row_bytes) {
      return absl::DataLossError(
          absl::StrCat("bank '", seg.bank, "' at ", seg.path,
                       ": header disagrees with the daemon (rows ",
                       mapped->rows(), " vs ", seg.rows, ")"));
    }
    BankMapping b;
    b.name = seg.bank;
    b.base = mapped->row(0);
    b.rows = mapped->rows();
    b.row_bytes = mapped->row_bytes();
    b.row_stride = mapped->row_stride();
    b.huge_pages = mapped->huge_pages();
    b.path = seg.path;
    if (seg.bank == "snapshot") {
      m->snapshot_bank_ = std::move(b);
    } else {
      m->page_banks_.push_back(std::move(b));
    }
    m->segments_.push_back(std::make_unique<shm::Segment>(*std::move(mapped)));
  }
  absl::MutexLock lock(&m->mu_);
  m->registered_.assign(m->segments_.size(), false);
  return m;
}

MappedBanks::~MappedBanks() {
  absl::MutexLock lock(&mu_);
  for (size_t i = 0; i < segments_.size(); ++i) {
    if (registered_[i]) {
      UnregisterHostRange(segments_[i]->base(), segments_[i]->file_bytes());
    }
  }
}

absl::Status MappedBanks::RegisterWithCuda() {
  absl::MutexLock lock(&mu_);
  for (size_t i = 0; i < segments_.size(); ++i) {
    const auto& seg = segments_[i];
    if (absl::Status s = RegisterHostRange(seg->base(), seg->file_bytes());
        !s.ok()) {
      for (size_t j = 0; j < i; ++j) {
        UnregisterHostRange(segments_[j]->base(), segments_[j]->file_bytes());
        registered_[j] = false;
      }
      return absl::Status(
          s.code(),
          absl::StrCat("registering bank at ", seg->path(), ": ", s.message()));
    }
    registered_[i] = true;
  }
  // Before the banks are shared: these writes happen before any reader.
  cuda_at_attach_ = true;
  for (auto& b : page_banks_) b.cuda_registered = true;
  if (snapshot_bank_) snapshot_bank_->cuda_registered = true;
  cuda_registered_.store(true, std::memory_order_release);
  return absl::OkStatus();
}

absl::Status MappedBanks::Refresh(const std::vector<BankSegmentInfo>& banks,
                                  uid_t owner) {
  if (banks.size() != segments_.size()) {
    return absl::FailedPreconditionError(
        absl::StrCat("the daemon names ", banks.size(), " banks, ",
                     segments_.size(), " are mapped"));
  }
  absl::MutexLock lock(&mu_);
  for (size_t i = 0; i < segments_.size(); ++i) {
    const BankSegmentInfo& info = banks[i];
    const shm::Segment& mine = *segments_[i];
    if (info.path != mine.path()) {
      return absl::FailedPreconditionError(
          absl::StrCat("bank '", info.bank, "' moved from ", mine.path(),
                       " to ", info.path));
    }
    auto fresh = shm::Segment::Open(info.path, owner);
    if (!fresh.ok()) {
      return absl::Status(fresh.status().code(),
                          absl::StrCat("mapping bank '", info.bank,
                                       "': ", fresh.status().message()));
    }
    // mine.header() reads the mapped memory: after a remap, the header of
    // the segment mapped now.
    if (fresh->header().created_unix_ns == mine.header().created_unix_ns) {
      // The same segment: the mapping is right as it is, but an earlier
      // re-registration of it may have failed.
      if (cuda_at_attach_ && !registered_[i]) {
        if (absl::Status s = Reregister(i); !s.ok()) return s;
      }
      continue;
    }
    if (absl::Status s = RemapInPlace(i, *fresh); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status MappedBanks::Reregister(size_t i) {
  const shm::Segment& seg = *segments_[i];
  if (absl::Status s = RegisterHostRange(seg.base(), seg.file_bytes());
      !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("re-registering ", seg.path(),
                                               ": ", s.message()));
  }
  registered_[i] = true;
  bool all = true;
  for (bool r : registered_) all = all && r;
  cuda_registered_.store(all, std::memory_order_release);
  return absl::OkStatus();
}

absl::Status MappedBanks::RemapInPlace(size_t i, const shm::Segment& fresh) {
  const shm::Segment& mine = *segments_[i];
  // Everything a BankMapping says must stay true of the new segment.
  if (fresh.file_bytes() != mine.file_bytes() || fresh.rows() != mine.rows() ||
      fresh.row_bytes() != mine.row_bytes() ||
      fresh.row_stride() != mine.row_stride() ||
      fresh.data_offset() != mine.data_offset() ||
      fresh.huge_pages() != mine.huge_pages()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "bank at ", fresh.path(), " was recreated with another shape (",
        fresh.rows(), " rows of ", fresh.row_bytes(), " bytes, ",
        fresh.file_bytes(), " bytes", fresh.huge_pages() ? ", huge pages" : "",
        "; mapped: ", mine.rows(), " rows of ", mine.row_bytes(), " bytes, ",
        mine.file_bytes(), " bytes", mine.huge_pages() ? ", huge pages" : "",
        ")"));
  }
  const int fd = ::open(fresh.path().c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat("reopening ", fresh.path()));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || st.st_ino != fresh.inode()) {
    ::close(fd);
    return absl::FailedPreconditionError(absl::StrCat(
        "bank at ", fresh.path(), " changed while it was being remapped"));
  }
  if (registered_[i]) {
    // From here until it is registered again, cuda_registered() is false.
    cuda_registered_.store(false, std::memory_order_release);
    UnregisterHostRange(mine.base(), mine.file_bytes());
    registered_[i] = false;
  }
  void* p = ::mmap(mine.base(), mine.file_bytes(), PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_FIXED, fd, 0);
  const int mmap_errno = errno;
  ::close(fd);
  if (p == MAP_FAILED) {
    // Keep the range mapped (zeros) so stray pointers cannot fault.
    (void)::mmap(mine.base(), mine.file_bytes(), PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    return absl::ErrnoToStatus(
        mmap_errno, absl::StrCat("remapping ", fresh.path(), " in place"));
  }
  if (cuda_at_attach_) {
    if (absl::Status s = Reregister(i); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace kvtier::client
