// UidSessions: the sessions each uid holds bound on the engine socket, for
// kvtierd's --max_sessions_per_uid (FastLookupOptions::max_sessions_per_uid).
//
// A session counts against the uid whose credentials the engine socket bound
// to it: at its Open (a session connection, forgotten when that connection
// ends), or at the first call connection's Hello that names a session opened
// elsewhere (a gRPC Session stream, forgotten once TierCore no longer has
// it). Sessions that closed are looked for only when a uid is at its cap, so
// the count costs nothing below it. Without such a cap one uid could open
// sessions up to its served-connection cap, each allowed its own reserved
// rows, leases and reservations.
//
// Thread-safety: thread-safe. `is_open` is called with this object's lock
// held: it must not call back into it.
#ifndef KVTIER_DAEMON_UID_SESSIONS_H_
#define KVTIER_DAEMON_UID_SESSIONS_H_

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace kvtier::daemon {

class UidSessions {
 public:
  // `max_per_uid` sessions per uid (at least 1); `is_open` says whether a
  // session still exists (TierCore::SessionOpen).
  UidSessions(int max_per_uid, std::function<bool(uint64_t)> is_open)
      : max_per_uid_(max_per_uid < 1 ? 1 : max_per_uid),
        is_open_(std::move(is_open)) {}

  // OK when `uid` has room for one more session (those that closed are
  // forgotten first); RESOURCE_EXHAUSTED naming --max_sessions_per_uid
  // otherwise. A check before opening one; Admit decides.
  absl::Status CheckRoom(uid_t uid) ABSL_LOCKS_EXCLUDED(mu_);
  // Counts `session` against `uid`: true when newly counted, false when
  // counted already; RESOURCE_EXHAUSTED (as CheckRoom) when `uid` has no
  // room. A newly counted session is the caller's to Release if it does not
  // keep it.
  absl::StatusOr<bool> Admit(uid_t uid, uint64_t session)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Forgets `session` of `uid`; idempotent.
  void Release(uid_t uid, uint64_t session) ABSL_LOCKS_EXCLUDED(mu_);
  // The sessions counted against `uid` now (closed ones included until
  // the uid next reaches its cap).
  int count(uid_t uid) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // OK when `uid` has room, after forgetting its sessions that closed.
  absl::Status RoomLocked(uid_t uid) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Immutable after construction.
  const int max_per_uid_;
  const std::function<bool(uint64_t)> is_open_;

  mutable absl::Mutex mu_;
  absl::flat_hash_map<uid_t, absl::flat_hash_set<uint64_t>> by_uid_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_UID_SESSIONS_H_
