// MappedBanks: a namespace's banks as this process maps them: one
// shm::Segment per bank, the BankMapping the API hands out for each, their
// CUDA registration, and the remap in place after a daemon restart.
//
// The remap contract. A daemon that restarts may recreate a bank (same path,
// same shape, new file). Refresh then maps the new file over the old mapping
// with MAP_FIXED, at the same address and length, so the range is never
// without a mapping (but see RemapInPlace for a failed mmap): every pointer
// an engine holds (a BankMapping's base, a TransferEngine's bank views, a
// kernel's segment table) stays valid and now reaches the daemon's new
// segment. So that engine threads may read the BankMappings while the
// session thread remaps, nothing they read is ever written after
// publication:
//  - page_banks(), snapshot_bank() and every BankMapping field are
//    immutable once Map (and RegisterWithCuda, which runs before the banks
//    are shared) returned. A recreated bank of another shape, size, data
//    offset or page kind (huge or not) is refused rather than remapped.
//    BankMapping::cuda_registered says the bank was registered at attach.
//  - cuda_registered() (an atomic) says whether every bank still is: a
//    remap unregisters the range and registers it again; while it is not,
//    or when that failed (the namespace then stays stale, and the next
//    Refresh tries again), it reads false.
// The bytes under the mapping are another matter: the old segment's rows
// were lost with the old daemon, and its leases and reservations are void.
// REQUIRES of the engine (as for any void row): no copy into or out of the
// bank is in flight across the remap. A CPU copy that runs anyway touches
// either segment's pages; a GPU copy may fault, since the range is
// unregistered and registered again under it.
//
// Thread-safety: the accessors are thread-safe. Refresh is called by one
// thread (the session thread) at a time; RegisterWithCuda before the banks
// are shared. The destructor unregisters what is registered.
#ifndef KVTIER_CLIENT_BANK_MAPPING_H_
#define KVTIER_CLIENT_BANK_MAPPING_H_

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "client/client.h"
#include "shm/segment.h"

namespace kvtier::client {

// A bank as the daemon names it in an AttachResponse.
struct BankSegmentInfo {
  std::string bank;  // "snapshot" is the snapshot bank; the rest page banks.
  std::string path;
  uint64_t rows = 0;
  uint64_t row_bytes = 0;
};

class MappedBanks {
 public:
  // Maps every bank of `banks` (in order; the segments must be `owner`'s:
  // shm::Segment::Open) and checks each header against the daemon's answer
  // (DATA_LOSS when they disagree). Errors name the bank.
  static absl::StatusOr<std::unique_ptr<MappedBanks>> Map(
      const std::vector<BankSegmentInfo>& banks, uid_t owner);
  ~MappedBanks();
  MappedBanks(const MappedBanks&) = delete;
  MappedBanks& operator=(const MappedBanks&) = delete;

  // Registers every bank with CUDA (mapped, so its base is also the device
  // address); on failure unregisters what it registered. REQUIRES: called
  // at most once, before the banks are shared with other threads.
  absl::Status RegisterWithCuda();

  const std::vector<BankMapping>& page_banks() const { return page_banks_; }
  // nullptr when the namespace has no snapshot bank.
  const BankMapping* snapshot_bank() const {
    return snapshot_bank_ ? &*snapshot_bank_ : nullptr;
  }
  // True while every bank is registered with CUDA.
  bool cuda_registered() const {
    return cuda_registered_.load(std::memory_order_acquire);
  }

  // After a re-attach: checks `banks` (the daemon's answer) against the
  // mapped ones, in number, order and path (FAILED_PRECONDITION otherwise),
  // keeps the mappings of segments that are the same (same creation time),
  // and remaps recreated ones in place. On error the namespace must be
  // treated as stale: banks before the failing one may have been remapped.
  absl::Status Refresh(const std::vector<BankSegmentInfo>& banks, uid_t owner);

 private:
  MappedBanks() = default;
  // Maps the recreated segment `fresh` over mapping i at the same address.
  // CUDA registration, if any, is redone. If mmap fails the range is
  // replaced with anonymous zeros so stray pointers cannot fault (between
  // the failure and that replacement a CPU access can: Linux may have
  // unmapped the range already).
  absl::Status RemapInPlace(size_t i, const shm::Segment& fresh)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Registers segment i with CUDA again and republishes cuda_registered().
  absl::Status Reregister(size_t i) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Immutable after Map and RegisterWithCuda.
  std::vector<std::unique_ptr<shm::Segment>> segments_;  // Banks in order.
  std::vector<BankMapping> page_banks_;
  std::optional<BankMapping> snapshot_bank_;
  bool cuda_at_attach_ = false;  // RegisterWithCuda succeeded.

  std::atomic<bool> cuda_registered_{false};
  // Serialises Refresh (and the destructor) over the registration state.
  absl::Mutex mu_;
  // Which segments are registered with CUDA now.
  std::vector<bool> registered_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvtier::client

#endif  // KVTIER_CLIENT_BANK_MAPPING_H_
