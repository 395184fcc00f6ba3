// FenceTracker: what a client process holds, for the fence protocol.
#include "client/fence_tracker.h"

#include <utility>

namespace kvtier::client {

uint64_t FenceTracker::Add(Item item) {
  absl::MutexLock lock(&mu_);
  const uint64_t token = next_++;
  items_.emplace(token, std::move(item));
  return token;
}

uint64_t FenceTracker::Remove(uint64_t token) {
  absl::MutexLock lock(&mu_);
  auto it = items_.find(token);
  if (it == items_.end()) return 0;
  const uint64_t hold = it->second.hold;
  items_.erase(it);
  return hold;
}

void FenceTracker::Abandon(uint64_t token) {
  absl::MutexLock lock(&mu_);
  auto it = items_.find(token);
  if (it != items_.end()) it->second.abandoned = true;
}

size_t FenceTracker::size() const {
  absl::MutexLock lock(&mu_);
  return items_.size();
}

std::vector<uint64_t> FenceTracker::Report(uint64_t epoch,
                                           v1::FenceRequest* request) {
  absl::MutexLock lock(&mu_);
  std::vector<uint64_t> tokens;
  for (auto& [token, item] : items_) {
    if (item.epoch >= epoch) continue;
    item.hold = 0;  // Holds of an earlier session end with it.
    v1::FenceItem* f = request->add_report();
    f->set_namespace_(item.ns_name);
    f->set_tp_rank(item.tp_rank);
    f->mutable_page_rows()->Assign(item.page_rows.begin(),
                                   item.page_rows.end());
    f->mutable_snapshot_rows()->Assign(item.snapshot_rows.begin(),
                                       item.snapshot_rows.end());
    f->set_lease_hash(item.lease_hash);
    tokens.push_back(token);
  }
  return tokens;
}

void FenceTracker::SetHolds(absl::Span<const uint64_t> tokens,
                            const v1::FenceResponse& response) {
  absl::MutexLock lock(&mu_);
  for (size_t i = 0; i < tokens.size() && i < size_t(response.holds_size());
       ++i) {
    auto it = items_.find(tokens[i]);
    if (it != items_.end()) it->second.hold = response.holds(i);
  }
}

}  // namespace kvtier::client
