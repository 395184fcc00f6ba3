// FenceTracker: the pinned leases and open reservations of one client
// process, for the fence protocol (proto/kvtier/v1/tier.proto, "fence").
//
// The daemon fences the rows of a session that ended while its process
// lives, and after a restart every row from before it, until the process
// reports what it still holds. The tracker is that report: each Lease and
// Reservation handle registers its rows while it holds them; after a new
// session opens, every item of an earlier session is reported and gets the
// daemon's fence hold, which the handle releases (Fence.release) once its
// queued work is done.
//
// Thread-safety: thread-safe.
#ifndef KVTIER_CLIENT_FENCE_TRACKER_H_
#define KVTIER_CLIENT_FENCE_TRACKER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "kvtier/v1/tier.pb.h"

namespace kvtier::client {

class FenceTracker {
 public:
  struct Item {
    uint64_t epoch = 0;  // The session (Connection::epoch) that took it.
    std::string ns_name;
    uint32_t tp_rank = 0;
    std::vector<uint32_t> page_rows;
    std::vector<uint32_t> snapshot_rows;
    std::string lease_hash;  // Leases: the last usable page's hash.
    uint64_t hold = 0;       // The daemon's hold, once reported.
    // Given up with copies maybe still queued: reported after every
    // reconnection and never released, so the daemon keeps the rows fenced
    // until this process exits.
    bool abandoned = false;
  };

  // Registers an item; returns its token (never 0).
  uint64_t Add(Item item);
  // Forgets the item; returns its hold (0: none, or an unknown token).
  uint64_t Remove(uint64_t token);
  // Keeps the item for good (Item::abandoned).
  void Abandon(uint64_t token);
  size_t size() const;

  // The items of sessions before `epoch` as a report (filling `request`),
  // and their tokens in report order, for SetHolds.
  std::vector<uint64_t> Report(uint64_t epoch, v1::FenceRequest* request);
  // Stores the holds the daemon answered for Report's tokens.
  void SetHolds(absl::Span<const uint64_t> tokens,
                const v1::FenceResponse& response);

 private:
  mutable absl::Mutex mu_;
  uint64_t next_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<uint64_t, Item> items_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvtier::client

#endif  // KVTIER_CLIENT_FENCE_TRACKER_H_
