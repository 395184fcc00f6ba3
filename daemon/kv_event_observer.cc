// KvEventObserver (daemon/kv_event_observer.h): index changes into vLLM's
// KV events.
//
// Thread-safety: thread-safe (the sink is; no state of its own).
#include "daemon/kv_event_observer.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/types/span.h"
#include "daemon/tier_namespace.h"

namespace kvtier::daemon {

void KvEventObserver::OnCommitted(const TierNamespace& ns,
                                  const TierCommit& commit) {
  const absl::Span<const uint32_t> completed = commit.result->completed;
  if (completed.empty()) return;
  const absl::Span<const HashKey> keys = commit.keys;
  const uint32_t per_page = ns.layout.tokens_per_page();
  const bool tokens = commit.token_ids.size() == keys.size() * per_page;
  std::vector<KvEvent> events;
  for (size_t k = 0; k < completed.size();) {
    // A run of consecutive pages: one chain.
    size_t end = k + 1;
    while (end < completed.size() && completed[end] == completed[end - 1] + 1) {
      ++end;
    }
    const uint32_t first = completed[k];
    BlockStored e;
    e.block_size = per_page;
    if (first > 0) {
      e.parent_block_hash = KeyString(keys[first - 1], ns.hash_bytes);
    } else if (commit.parent != nullptr) {
      e.parent_block_hash = KeyString(*commit.parent, ns.hash_bytes);
    }
    for (size_t i = k; i < end; ++i) {
      e.block_hashes.push_back(KeyString(keys[completed[i]], ns.hash_bytes));
      if (tokens) {
        const auto page =
            commit.token_ids.subspan(completed[i] * per_page, per_page);
        e.token_ids.insert(e.token_ids.end(), page.begin(), page.end());
      }
    }
    events.push_back(std::move(e));
    k = end;
  }
  sink_->Publish(ns.name, std::move(events));
}

void KvEventObserver::OnRemoved(const TierNamespace& ns,
                                absl::Span<const HashKey> keys) {
  BlockRemoved e;
  e.block_hashes.reserve(keys.size());
  for (const HashKey& k : keys) {
    e.block_hashes.push_back(KeyString(k, ns.hash_bytes));
  }
  sink_->Publish(ns.name, {std::move(e)});
}

void KvEventObserver::OnCleared(const std::string& name) {
  sink_->Publish(name, {AllBlocksCleared{}});
}

}  // namespace kvtier::daemon
