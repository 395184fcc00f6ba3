// RedisCluster (daemon/redis_cluster.h): options, key slots, the node
// registry, state and the slot map. The connection pools are in
// redis_cluster_pool.cc, the pipelines in redis_cluster_pipeline.cc.
#include "daemon/redis_cluster.h"

#include <hiredis/hiredis.h>

#include <algorithm>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"

namespace kvtier::daemon {
namespace {

// How often the map is re-read when nothing asks for it sooner.
constexpr absl::Duration kRefreshPeriod = absl::Seconds(5);
// The least time between two refreshes asked for by MOVED replies.
constexpr absl::Duration kMovedRefreshGap = absl::Milliseconds(100);

// CRC16-CCITT (XMODEM): polynomial 0x1021, initial value 0, as Redis
// Cluster's keyHashSlot uses.
constexpr std::array<uint16_t, 256> MakeCrc16Table() {
  std::array<uint16_t, 256> table{};
  for (int i = 0; i < 256; ++i) {
    uint16_t crc = static_cast<uint16_t>(i << 8);
    for (int bit = 0; bit < 8; ++bit) {
      crc = (crc & 0x8000) ? static_cast<uint16_t>((crc << 1) ^ 0x1021)
                           : static_cast<uint16_t>(crc << 1);
    }
    table[i] = crc;
  }
  return table;
}
constexpr std::array<uint16_t, 256> kCrc16Table = MakeCrc16Table();

uint16_t Crc16(absl::string_view data) {
  uint16_t crc = 0;
  for (unsigned char c : data) {
    crc = static_cast<uint16_t>((crc << 8) ^ kCrc16Table[(crc >> 8) ^ c]);
  }
  return crc;
}

struct HostPort {
  std::string host;
  int port = 0;
};

// "host:port" or "[v6]:port".
absl::StatusOr<HostPort> SplitHostPort(absl::string_view entry) {
  HostPort out;
  absl::string_view port;
  if (absl::ConsumePrefix(&entry, "[")) {
    size_t close = entry.find(']');
    if (close == absl::string_view::npos || close == 0 ||
        entry.substr(close + 1, 1) != ":") {
      return absl::InvalidArgumentError("want [ipv6]:port");
    }
    out.host = std::string(entry.substr(0, close));
    port = entry.substr(close + 2);
  } else {
    size_t colon = entry.rfind(':');
    if (colon == absl::string_view::npos || colon == 0) {
      return absl::InvalidArgumentError("want host:port");
    }
    out.host = std::string(entry.substr(0, colon));
    if (absl::StrContains(out.host, ':')) {
      return absl::InvalidArgumentError("an IPv6 host goes in brackets");
    }
    port = entry.substr(colon + 1);
  }
  if (!absl::SimpleAtoi(port, &out.port) || out.port < 1 || out.port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("port \"", port, "\" is not in 1..65535"));
  }
  return out;
}

std::string FormatAddress(absl::string_view host, int port) {
  return absl::StrContains(host, ':') ? absl::StrCat("[", host, "]:", port)
                                      : absl::StrCat(host, ":", port);
}

}  // namespace

// One range of CLUSTER SLOTS: its master's and replicas' addresses.
struct RedisCluster::SlotRange {
  int first = 0, last = 0;
  std::string master;
  std::vector<std::string> replicas;
};

absl::StatusOr<std::vector<RedisCluster::SlotRange>>
RedisCluster::ParseClusterSlots(const redisReply* reply,
                                const std::string& host) {
  if (reply->type != REDIS_REPLY_ARRAY) {
    return absl::InternalError("CLUSTER SLOTS: not an array");
  }
  std::vector<SlotRange> ranges;
  for (size_t i = 0; i < reply->elements; ++i) {
    const redisReply* r = reply->element[i];
    if (r->type != REDIS_REPLY_ARRAY || r->elements < 3 ||
        r->element[0]->type != REDIS_REPLY_INTEGER ||
        r->element[1]->type != REDIS_REPLY_INTEGER) {
      return absl::InternalError("CLUSTER SLOTS: malformed range");
    }
    SlotRange range;
    range.first = static_cast<int>(r->element[0]->integer);
    range.last = static_cast<int>(r->element[1]->integer);
    if (range.first < 0 || range.last >= kSlots || range.first > range.last) {
      return absl::InternalError("CLUSTER SLOTS: slot out of range");
    }
    for (size_t n = 2; n < r->elements; ++n) {
      const redisReply* node = r->element[n];
      if (node->type != REDIS_REPLY_ARRAY || node->elements < 2 ||
          node->element[0]->type != REDIS_REPLY_STRING ||
          node->element[1]->type != REDIS_REPLY_INTEGER) {
        return absl::InternalError("CLUSTER SLOTS: malformed node");
      }
      std::string endpoint(node->element[0]->str, node->element[0]->len);
      if (endpoint == "?") continue;
      std::string address =
          FormatAddress(endpoint.empty() ? host : endpoint,
                        static_cast<int>(node->element[1]->integer));
      if (n == 2) {
        range.master = std::move(address);
      } else {
        range.replicas.push_back(std::move(address));
      }
    }
    ranges.push_back(std::move(range));
  }
  return ranges;
}

absl::StatusOr<std::vector<std::string>> ParseRedisSeeds(
    absl::string_view list) {
  std::vector<std::string> seeds;
  int n = 0;
  for (absl::string_view entry : absl::StrSplit(list, ',')) {
    ++n;
    entry = absl::StripAsciiWhitespace(entry);
    absl::StatusOr<HostPort> hp = SplitHostPort(entry);
    if (!hp.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("redis seed ", n, " \"", entry, "\" in \"", list,
                       "\": ", hp.status().message()));
    }
    seeds.push_back(FormatAddress(hp->host, hp->port));
  }
  return seeds;
}

uint16_t RedisKeySlot(absl::string_view key) {
  size_t open = key.find('{');
  if (open != absl::string_view::npos) {
    size_t close = key.find('}', open + 1);
    if (close != absl::string_view::npos && close > open + 1) {
      key = key.substr(open + 1, close - open - 1);
    }
  }
  return Crc16(key) & (RedisCluster::kSlots - 1);
}

void RedisCluster::ReplyDeleter::operator()(redisReply* reply) const {
  freeReplyObject(reply);
}

absl::Status RedisCluster::ErrorReplyStatus(absl::string_view address,
                                            absl::string_view error) {
  std::string message = absl::StrCat("redis ", address, ": ", error);
  absl::string_view code = error.substr(0, error.find(' '));
  if (code == "NOAUTH" || code == "WRONGPASS") {
    return absl::UnauthenticatedError(message);
  }
  if (code == "NOPERM") return absl::PermissionDeniedError(message);
  if (code == "OOM") return absl::ResourceExhaustedError(message);
  if (code == "CLUSTERDOWN" || code == "TRYAGAIN" || code == "LOADING" ||
      code == "MASTERDOWN" || code == "BUSY" || code == "MOVED" ||
      code == "ASK") {
    return absl::UnavailableError(message);
  }
  if (code == "WRONGTYPE") return absl::FailedPreconditionError(message);
  return absl::InternalError(message);
}

// --- Creation and state ---------------------------------------------------

absl::StatusOr<std::unique_ptr<RedisCluster>> RedisCluster::Create(
    RedisClusterOptions options) {
  if (options.seeds.empty()) {
    return absl::InvalidArgumentError("seeds: at least one host:port");
  }
  for (std::string& seed : options.seeds) {
    absl::StatusOr<std::vector<std::string>> parsed = ParseRedisSeeds(seed);
    if (!parsed.ok()) return parsed.status();
    if (parsed->size() != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("seeds: \"", seed, "\" is not one host:port"));
    }
    seed = (*parsed)[0];
  }
  if (!options.user.empty() && options.password.empty()) {
    return absl::InvalidArgumentError("user: an ACL user needs a password");
  }
  if (options.connect_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("connect_timeout must be positive");
  }
  if (options.io_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("io_timeout must be positive");
  }
  if (options.node_retry < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("node_retry must not be negative");
  }
  if (options.connections_per_node < 1) {
    return absl::InvalidArgumentError("connections_per_node must be >= 1");
  }
  return std::unique_ptr<RedisCluster>(new RedisCluster(std::move(options)));
}

RedisCluster::RedisCluster(RedisClusterOptions options)
    : options_(std::move(options)) {
  {
    absl::MutexLock lock(&mu_);
    for (const std::string& seed : options_.seeds) GetNodeLocked(seed);
  }
  prober_ = std::thread([this] { ProbeLoop(); });
}

RedisCluster::~RedisCluster() {
  {
    absl::MutexLock lock(&probe_mu_);
    stop_ = true;
  }
  prober_.join();
  absl::MutexLock lock(&mu_);
  for (auto& [address, node] : nodes_) {
    absl::MutexLock node_lock(&node->mu);
    for (redisContext* c : node->idle) redisFree(c);
    node->idle.clear();
  }
}

RedisCluster::State RedisCluster::GetState() const {
  State state;
  state.moved = moved_.load();
  state.asked = asked_.load();
  state.node_failures = node_failures_.load();
  absl::MutexLock lock(&mu_);
  state.slot_map_refreshes = refreshes_;
  std::map<const Node*, SlotMap::Entry> roles;
  if (map_ != nullptr) {
    state.covered_slots = map_->covered;
    for (const SlotMap::Entry& e : map_->nodes) roles[e.node] = e;
  }
  for (const auto& [address, node] : nodes_) {
    NodeState ns;
    ns.address = address;
    auto role = roles.find(node.get());
    ns.master = role != roles.end() && role->second.master;
    ns.slots = role != roles.end() ? role->second.slots : 0;
    absl::MutexLock node_lock(&node->mu);
    ns.up = !node->down;
    if (!node->last_error.ok()) ns.last_error = node->last_error.ToString();
    state.nodes.push_back(std::move(ns));
  }
  return state;
}

// --- Nodes and their pools --------------------------------------------------

RedisCluster::Node* RedisCluster::GetNode(const std::string& address) {
  absl::MutexLock lock(&mu_);
  return GetNodeLocked(address);
}

RedisCluster::Node* RedisCluster::GetNodeLocked(const std::string& address) {
  auto it = nodes_.find(address);
  if (it != nodes_.end()) return it->second.get();
  absl::StatusOr<HostPort> hp = SplitHostPort(address);
  // Addresses come from ParseRedisSeeds or FormatAddress; a bad one from a
  // server still gets a node, which fails to connect.
  std::string host = hp.ok() ? hp->host : address;
  int port = hp.ok() ? hp->port : 0;
  auto node = std::make_unique<Node>(address, std::move(host), port,
                                     options_.connections_per_node);
  Node* raw = node.get();
  nodes_.emplace(address, std::move(node));
  return raw;
}

// --- The slot map -----------------------------------------------------------

bool RedisCluster::RefreshDue(absl::Time now) const {
  const absl::Duration since = now - last_attempt_;
  return map_ == nullptr || (moved_pending_ && since >= kMovedRefreshGap) ||
         (down_pending_ && since >= options_.node_retry) ||
         since >= kRefreshPeriod;
}

void RedisCluster::RequestRefresh(RefreshReason reason) {
  absl::MutexLock lock(&mu_);
  (reason == RefreshReason::kMoved ? moved_pending_ : down_pending_) = true;
}

std::shared_ptr<const RedisCluster::SlotMap> RedisCluster::CurrentMap(
    absl::Time deadline, absl::Status* error) {
  {
    absl::ReaderMutexLock lock(&mu_);
    if (!RefreshDue(absl::Now())) return map_;
  }
  std::vector<Node*> candidates;
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = absl::Now();
    if (!RefreshDue(now)) return map_;
    if (refreshing_) return AwaitOtherRefresh(deadline, error);
    refreshing_ = true;
    last_attempt_ = now;
    moved_pending_ = false;
    down_pending_ = false;
    candidates = RefreshCandidates();
  }

  // Ask one node after another, without holding mu_.
  absl::StatusOr<std::vector<SlotRange>> ranges =
      FetchSlotRanges(candidates, deadline);

  absl::MutexLock lock(&mu_);
  refreshing_ = false;
  if (!ranges.ok()) {
    refresh_error_ = ranges.status();
    if (map_ == nullptr) *error = refresh_error_;
    return map_;
  }
  InstallMap(*ranges);
  return map_;
}

std::shared_ptr<const RedisCluster::SlotMap> RedisCluster::AwaitOtherRefresh(
    absl::Time deadline, absl::Status* error) {
  if (map_ != nullptr) return map_;  // the stale map will do meanwhile
  if (!mu_.AwaitWithDeadline(
          absl::Condition(this, &RedisCluster::NotRefreshing), deadline)) {
    *error = absl::DeadlineExceededError(
        "no redis slot map yet (another call is fetching it)");
  } else if (map_ == nullptr) {
    *error = refresh_error_;
  }
  return map_;
}

std::vector<RedisCluster::Node*> RedisCluster::RefreshCandidates() {
  // Nodes up first: the current map's masters, then its replicas, then
  // the seeds and every other node ever named.
  std::vector<Node*> ordered;
  if (map_ != nullptr) {
    for (const SlotMap::Entry& e : map_->nodes) {
      if (e.master) ordered.push_back(e.node);
    }
    for (const SlotMap::Entry& e : map_->nodes) {
      if (!e.master) ordered.push_back(e.node);
    }
  }
  for (const std::string& seed : options_.seeds) {
    ordered.push_back(GetNodeLocked(seed));
  }
  for (const auto& [address, node] : nodes_) ordered.push_back(node.get());
  std::vector<Node*> candidates;
  std::vector<Node*> down;
  for (Node* node : ordered) {
    if (std::find(candidates.begin(), candidates.end(), node) !=
            candidates.end() ||
        std::find(down.begin(), down.end(), node) != down.end()) {
      continue;
    }
    absl::MutexLock node_lock(&node->mu);
    (node->down ? down : candidates).push_back(node);
  }
  candidates.insert(candidates.end(), down.begin(), down.end());
  return candidates;
}

absl::StatusOr<std::vector<RedisCluster::SlotRange>>
RedisCluster::FetchSlotRanges(absl::Span<Node* const> candidates,
                              absl::Time deadline) {
  std::vector<std::string> errors;
  absl::StatusCode code = absl::StatusCode::kUnavailable;
  for (Node* node : candidates) {
    if (absl::Now() >= deadline) {
      errors.push_back("deadline passed");
      if (code == absl::StatusCode::kUnavailable) {
        code = absl::StatusCode::kDeadlineExceeded;
      }
      break;
    }
    absl::StatusOr<std::vector<SlotRange>> ranges = AskSlots(node, deadline);
    if (ranges.ok() && !ranges->empty()) return ranges;
    if (ranges.ok()) {
      errors.push_back(absl::StrCat(node->address, ": no slots assigned"));
      continue;
    }
    errors.push_back(std::string(ranges.status().message()));
    const absl::StatusCode c = ranges.status().code();
    if (c == absl::StatusCode::kUnauthenticated ||
        c == absl::StatusCode::kPermissionDenied) {
      code = c;
    }
  }
  return absl::Status(
      code, absl::StrCat("no redis slot map from any of ", candidates.size(),
                         " nodes: ", absl::StrJoin(errors, "; ")));
}

absl::StatusOr<std::vector<RedisCluster::SlotRange>> RedisCluster::AskSlots(
    Node* node, absl::Time deadline) {
  absl::StatusOr<Lease> lease = Acquire(node, deadline);
  absl::StatusOr<ReplyPtr> reply =
      lease.ok() ? RunCommand(*lease, {"CLUSTER", "SLOTS"}, deadline)
                 : absl::StatusOr<ReplyPtr>(lease.status());
  if (!reply.ok()) return reply.status();
  if ((*reply)->type == REDIS_REPLY_ERROR) {
    // The reply's own code ("NOPERM ...") decides the status.
    const absl::Status status = ErrorReplyStatus(
        node->address, absl::string_view((*reply)->str, (*reply)->len));
    return absl::Status(status.code(),
                        absl::StrCat("CLUSTER SLOTS on ", status.message()));
  }
  return ParseClusterSlots(reply->get(), node->host);
}

void RedisCluster::InstallMap(absl::Span<const SlotRange> ranges) {
  auto map = std::make_shared<SlotMap>();
  std::map<Node*, size_t> entry_of;
  // The index in map->nodes of the node at `address`.
  auto entry = [&](const std::string& address,
                   bool master) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Node* node = GetNodeLocked(address);
    auto [it, inserted] = entry_of.emplace(node, map->nodes.size());
    if (inserted) map->nodes.push_back({node, master, 0});
    if (master) map->nodes[it->second].master = true;
    return it->second;
  };
  for (const SlotRange& range : ranges) {
    if (range.master.empty()) continue;
    SlotMap::Entry& master = map->nodes[entry(range.master, true)];
    master.slots += static_cast<uint32_t>(range.last - range.first + 1);
    for (int s = range.first; s <= range.last; ++s) {
      if (map->master[s] == nullptr) ++map->covered;
      map->master[s] = master.node;
    }
    for (const std::string& replica : range.replicas) entry(replica, false);
  }
  map_ = std::move(map);
  refresh_error_ = absl::OkStatus();
  ++refreshes_;
}

}  // namespace kvtier::daemon
