// UidSessions (daemon/uid_sessions.h).
#include "daemon/uid_sessions.h"

#include <vector>

#include "absl/strings/str_cat.h"

namespace kvtier::daemon {

absl::Status UidSessions::RoomLocked(uid_t uid) {
  auto it = by_uid_.find(uid);
  if (it == by_uid_.end() ||
      it->second.size() < static_cast<size_t>(max_per_uid_)) {
    return absl::OkStatus();
  }
  std::vector<uint64_t> closed;
  for (uint64_t s : it->second) {
    if (!is_open_(s)) closed.push_back(s);
  }
  for (uint64_t s : closed) it->second.erase(s);
  if (it->second.size() < static_cast<size_t>(max_per_uid_)) {
    return absl::OkStatus();
  }
  return absl::ResourceExhaustedError(
      absl::StrCat("session: uid ", uid, " holds ", it->second.size(),
                   " sessions on this kvtierd, the most one uid may "
                   "(--max_sessions_per_uid); close one first"));
}

absl::Status UidSessions::CheckRoom(uid_t uid) {
  absl::MutexLock lock(&mu_);
  return RoomLocked(uid);
}

absl::StatusOr<bool> UidSessions::Admit(uid_t uid, uint64_t session) {
  absl::MutexLock lock(&mu_);
  if (auto it = by_uid_.find(uid);
      it != by_uid_.end() && it->second.contains(session)) {
    return false;
  }
  if (absl::Status s = RoomLocked(uid); !s.ok()) return s;
  by_uid_[uid].insert(session);
  return true;
}

void UidSessions::Release(uid_t uid, uint64_t session) {
  absl::MutexLock lock(&mu_);
  auto it = by_uid_.find(uid);
  if (it == by_uid_.end()) return;
  it->second.erase(session);
  if (it->second.empty()) by_uid_.erase(it);
}

int UidSessions::count(uid_t uid) const {
  absl::MutexLock lock(&mu_);
  auto it = by_uid_.find(uid);
  return it == by_uid_.end() ? 0 : static_cast<int>(it->second.size());
}

}  // namespace kvtier::daemon
