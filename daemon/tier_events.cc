// TierCore's KV events (daemon/kv_event_types.h): what a commit made
// complete (BlockStored), what eviction and Drop removed (BlockRemoved), a
// dropped namespace (AllBlocksCleared), each under the namespace's name as
// the topic and in the order of the index changes (published under the
// namespace's lock). A page is announced once every stored rank holds it
// and withdrawn only if it was announced. Medium "CPU": the host tier.
//
// Thread-safety: thread-safe (part of TierCore; the sink is thread-safe).
#include <string>
#include <utility>
#include <vector>

#include "absl/types/span.h"
#include "daemon/kv_event_types.h"
#include "daemon/tier_core.h"

namespace kvtier::daemon {
void TierCore::PublishStored(Namespace& ns, const HashKey* parent,
                             absl::Span<const HashKey> keys,
                             absl::Span<const uint32_t> completed,
                             absl::Span<const uint32_t> token_ids) {
  if (options_.kv_events == nullptr || completed.empty()) return;
  const uint32_t per_page = ns.layout.tokens_per_page();
  const bool tokens = token_ids.size() == keys.size() * per_page;
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
    } else if (parent != nullptr) {
      e.parent_block_hash = KeyString(*parent, ns.hash_bytes);
    }
    for (size_t i = k; i < end; ++i) {
      e.block_hashes.push_back(KeyString(keys[completed[i]], ns.hash_bytes));
      if (tokens) {
        const auto page = token_ids.subspan(completed[i] * per_page, per_page);
        e.token_ids.insert(e.token_ids.end(), page.begin(), page.end());
      }
    }
    events.push_back(std::move(e));
    k = end;
  }
  options_.kv_events->Publish(ns.name, std::move(events));
}

void TierCore::PublishRemoved(Namespace& ns) {
  if (options_.kv_events == nullptr || ns.removed_keys.empty()) return;
  BlockRemoved e;
  e.block_hashes.reserve(ns.removed_keys.size());
  for (const HashKey& k : ns.removed_keys) {
    e.block_hashes.push_back(KeyString(k, ns.hash_bytes));
  }
  ns.removed_keys.clear();
  options_.kv_events->Publish(ns.name, {std::move(e)});
}

void TierCore::PublishCleared(const std::string& name) {
  if (options_.kv_events == nullptr) return;
  options_.kv_events->Publish(name, {AllBlocksCleared{}});
}

}  // namespace kvtier::daemon
