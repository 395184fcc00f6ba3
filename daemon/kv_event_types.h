// The KV events kvtierd's tiers emit (vLLM's BlockStored, BlockRemoved and
// AllBlocksCleared, vllm/distributed/kv_events.py) and the sink TierCore
// hands them to. The sink that puts them on the wire is KvEventPublisher
// (daemon/kv_events.h); TierCore needs only this header.
//
// Thread-safety: plain values; a KvEventSink must be thread-safe.
#ifndef KVTIER_DAEMON_KV_EVENT_TYPES_H_
#define KVTIER_DAEMON_KV_EVENT_TYPES_H_

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace kvtier::daemon {

// The media kvtierd reports (vLLM's BlockStored.medium): the host tier, and
// the cluster tier below it.
inline constexpr char kMediumCpu[] = "CPU";
inline constexpr char kMediumStorage[] = "STORAGE";

// Blocks now held, a chain: block_hashes[0]'s parent is parent_block_hash
// (none: a first page). token_ids: the blocks' tokens, block_size per block,
// or empty when the committer sent none.
struct BlockStored {
  std::vector<std::string> block_hashes;
  std::optional<std::string> parent_block_hash;
  std::vector<uint32_t> token_ids;
  uint32_t block_size = 0;
  std::string medium = kMediumCpu;
};
// Blocks no longer held.
struct BlockRemoved {
  std::vector<std::string> block_hashes;
  std::string medium = kMediumCpu;
};
// Everything of the topic is gone (a namespace dropped or cleared).
struct AllBlocksCleared {};

using KvEvent = std::variant<BlockStored, BlockRemoved, AllBlocksCleared>;

// Where TierCore sends its events: one batch per call, under `topic` (the
// namespace's name), in the order of the index changes. Must not block for
// long: it is called with a namespace's lock held.
class KvEventSink {
 public:
  virtual ~KvEventSink() = default;
  virtual void Publish(std::string topic, std::vector<KvEvent> events) = 0;
  // Batches sent, and batches dropped (queue full, send failed), for
  // /metrics.
  virtual uint64_t published() const = 0;
  virtual uint64_t dropped() const = 0;
};

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_KV_EVENT_TYPES_H_
