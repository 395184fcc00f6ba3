// RedisClusterFixture (tests/redis_cluster_fixture.h): the cluster's view of
// itself (CLUSTER NODES, CLUSTER INFO, INFO replication), the waits built on
// it, and slot migration by hand.
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "tests/redis_cluster_fixture.h"

namespace kvtier::testing {
namespace {

// One line of CLUSTER NODES.
struct NodeLine {
  std::string id;
  std::string address;  // ip:port, without the bus port
  std::vector<std::string> flags;
  std::string master_id;  // "-" for a master
  std::vector<std::pair<int, int>> slots;

  bool Has(absl::string_view flag) const {
    for (const std::string& f : flags) {
      if (f == flag) return true;
    }
    return false;
  }
  bool master() const { return Has("master"); }
  bool failed() const { return Has("fail") || Has("fail?"); }
  bool Serves(int slot) const {
    for (const auto& [lo, hi] : slots) {
      if (slot >= lo && slot <= hi) return true;
    }
    return false;
  }
};

std::vector<NodeLine> ParseClusterNodes(const std::string& text) {
  std::vector<NodeLine> lines;
  for (absl::string_view row : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    std::vector<std::string> f = absl::StrSplit(row, ' ', absl::SkipEmpty());
    if (f.size() < 8) continue;
    NodeLine line;
    line.id = f[0];
    line.address = f[1].substr(0, f[1].find('@'));
    line.flags = absl::StrSplit(f[2], ',');
    line.master_id = f[3];
    for (size_t i = 8; i < f.size(); ++i) {
      if (f[i].empty() || f[i][0] == '[') continue;  // [slot->-id] markers
      std::pair<std::string, std::string> range =
          absl::StrSplit(f[i], absl::MaxSplits('-', 1));
      int lo = 0, hi = 0;
      if (!absl::SimpleAtoi(range.first, &lo)) continue;
      if (range.second.empty()) {
        hi = lo;
      } else if (!absl::SimpleAtoi(range.second, &hi)) {
        continue;
      }
      line.slots.emplace_back(lo, hi);
    }
    lines.push_back(std::move(line));
  }
  return lines;
}

// The value of `field` in INFO / CLUSTER INFO text ("" when absent).
std::string InfoField(const std::string& text, absl::string_view field) {
  for (absl::string_view row : absl::StrSplit(text, '\n')) {
    row = absl::StripTrailingAsciiWhitespace(row);
    if (absl::ConsumePrefix(&row, field) && absl::ConsumePrefix(&row, ":")) {
      return std::string(row);
    }
  }
  return "";
}

}  // namespace

absl::StatusOr<std::string> RedisClusterFixture::NodeId(int i) {
  return Command(i, {"CLUSTER", "MYID"});
}

int RedisClusterFixture::FirstRunning() const {
  for (int i = 0; i < size(); ++i) {
    if (running(i)) return i;
  }
  return -1;
}

absl::StatusOr<int> RedisClusterFixture::IndexOf(
    const std::string& address) const {
  for (int i = 0; i < size(); ++i) {
    if (Address(i) == address) return i;
  }
  return absl::NotFoundError(absl::StrCat("no node at ", address));
}

absl::StatusOr<std::string> RedisClusterFixture::ClusterNodes(int ask) {
  if (ask < 0) ask = FirstRunning();
  if (ask < 0) return absl::FailedPreconditionError("no node running");
  return Command(ask, {"CLUSTER", "NODES"});
}

absl::StatusOr<int> RedisClusterFixture::MasterOfSlot(int slot, int ask) {
  absl::StatusOr<std::string> text = ClusterNodes(ask);
  if (!text.ok()) return text.status();
  for (const NodeLine& line : ParseClusterNodes(*text)) {
    if (line.master() && line.Serves(slot)) return IndexOf(line.address);
  }
  return absl::NotFoundError(absl::StrCat("no master serves slot ", slot));
}

absl::StatusOr<std::vector<int>> RedisClusterFixture::SlotOwners(int ask) {
  absl::StatusOr<std::string> text = ClusterNodes(ask);
  if (!text.ok()) return text.status();
  std::vector<int> owners(16384, -1);
  for (const NodeLine& line : ParseClusterNodes(*text)) {
    if (!line.master()) continue;
    absl::StatusOr<int> i = IndexOf(line.address);
    if (!i.ok()) return i.status();
    for (const auto& [lo, hi] : line.slots) {
      for (int s = lo; s <= hi && s < 16384; ++s) owners[s] = *i;
    }
  }
  return owners;
}

absl::StatusOr<std::vector<int>> RedisClusterFixture::Masters(int ask) {
  absl::StatusOr<std::string> text = ClusterNodes(ask);
  if (!text.ok()) return text.status();
  std::vector<int> masters;
  for (const NodeLine& line : ParseClusterNodes(*text)) {
    if (!line.master() || line.slots.empty()) continue;
    absl::StatusOr<int> i = IndexOf(line.address);
    if (!i.ok()) return i.status();
    masters.push_back(*i);
  }
  return masters;
}

absl::StatusOr<std::vector<int>> RedisClusterFixture::ReplicasOf(int master,
                                                                 int ask) {
  absl::StatusOr<std::string> text = ClusterNodes(ask);
  if (!text.ok()) return text.status();
  std::vector<NodeLine> lines = ParseClusterNodes(*text);
  std::string master_id;
  for (const NodeLine& line : lines) {
    if (line.address == Address(master)) master_id = line.id;
  }
  if (master_id.empty()) {
    return absl::NotFoundError(absl::StrCat("no node ", Address(master)));
  }
  std::vector<int> replicas;
  for (const NodeLine& line : lines) {
    if (line.master_id != master_id) continue;
    absl::StatusOr<int> i = IndexOf(line.address);
    if (!i.ok()) return i.status();
    replicas.push_back(*i);
  }
  return replicas;
}

absl::Status RedisClusterFixture::WaitHealthy(int polls,
                                              absl::Duration interval) {
  std::string why;
  for (int poll = 0; poll < polls; ++poll) {
    why.clear();
    for (int i = 0; i < size() && why.empty(); ++i) {
      if (!running(i)) continue;
      absl::StatusOr<std::string> info = Command(i, {"CLUSTER", "INFO"});
      if (!info.ok()) {
        why = info.status().ToString();
      } else if (InfoField(*info, "cluster_state") != "ok" ||
                 InfoField(*info, "cluster_slots_assigned") != "16384" ||
                 InfoField(*info, "cluster_slots_ok") != "16384" ||
                 InfoField(*info, "cluster_known_nodes") !=
                     absl::StrCat(size())) {
        why = absl::StrCat(Address(i), ":\n", *info);
      }
    }
    if (why.empty()) return absl::OkStatus();
    absl::SleepFor(interval);
  }
  return absl::DeadlineExceededError(
      absl::StrCat("cluster not healthy after ", polls, " polls: ", why));
}

absl::Status RedisClusterFixture::WaitReplicasSynced(int polls,
                                                     absl::Duration interval) {
  std::string why;
  for (int poll = 0; poll < polls; ++poll) {
    why.clear();
    for (int i = 0; i < size() && why.empty(); ++i) {
      if (!running(i)) continue;
      absl::StatusOr<std::string> info = Command(i, {"INFO", "replication"});
      if (!info.ok()) {
        why = info.status().ToString();
        break;
      }
      if (InfoField(*info, "role") == "slave") {
        if (InfoField(*info, "master_link_status") != "up") {
          why = absl::StrCat(Address(i), " link down");
        }
        continue;
      }
      const std::string offset = InfoField(*info, "master_repl_offset");
      int slaves = 0;
      if (!absl::SimpleAtoi(InfoField(*info, "connected_slaves"), &slaves)) {
        slaves = 0;
      }
      for (int s = 0; s < slaves; ++s) {
        std::string line = InfoField(*info, absl::StrCat("slave", s));
        if (line.find("state=online") == std::string::npos ||
            line.find(absl::StrCat("offset=", offset, ",")) ==
                std::string::npos) {
          why = absl::StrCat(Address(i), " master_repl_offset ", offset,
                             ", replica ", line);
        }
      }
    }
    if (why.empty()) return absl::OkStatus();
    absl::SleepFor(interval);
  }
  return absl::DeadlineExceededError(
      absl::StrCat("replicas not in sync after ", polls, " polls: ", why));
}

absl::StatusOr<int> RedisClusterFixture::WaitFailover(
    const std::vector<int>& replicas, int polls, absl::Duration interval) {
  for (int poll = 0; poll < polls; ++poll) {
    for (int r : replicas) {
      if (!running(r)) continue;
      bool everywhere = true;
      for (int i = 0; i < size() && everywhere; ++i) {
        if (!running(i)) continue;
        absl::StatusOr<std::string> text = ClusterNodes(i);
        if (!text.ok()) {
          everywhere = false;
          break;
        }
        bool promoted = false;
        for (const NodeLine& line : ParseClusterNodes(*text)) {
          if (line.address == Address(r)) {
            promoted = line.master() && !line.slots.empty();
          }
        }
        everywhere = promoted;
      }
      if (everywhere) return r;
    }
    absl::SleepFor(interval);
  }
  return absl::DeadlineExceededError(
      absl::StrCat("no replica promoted after ", polls, " polls"));
}

absl::Status RedisClusterFixture::BeginSlotMigration(int slot, int to) {
  absl::StatusOr<int> from = MasterOfSlot(slot);
  if (!from.ok()) return from.status();
  if (*from == to) {
    return absl::FailedPreconditionError(
        absl::StrCat("slot ", slot, " already on ", Address(to)));
  }
  absl::StatusOr<std::string> from_id = NodeId(*from);
  absl::StatusOr<std::string> to_id = NodeId(to);
  if (!from_id.ok()) return from_id.status();
  if (!to_id.ok()) return to_id.status();
  const std::string s = absl::StrCat(slot);
  absl::StatusOr<std::string> r =
      Command(to, {"CLUSTER", "SETSLOT", s, "IMPORTING", *from_id});
  if (!r.ok()) return r.status();
  r = Command(*from, {"CLUSTER", "SETSLOT", s, "MIGRATING", *to_id});
  return r.status();
}

absl::Status RedisClusterFixture::MigrateKeys(
    int slot, const std::vector<std::string>& keys, int to) {
  if (keys.empty()) return absl::OkStatus();
  absl::StatusOr<int> from = MasterOfSlot(slot);
  if (!from.ok()) return from.status();
  std::vector<std::string> argv = {"MIGRATE",
                                   nodes_[to].placement.bind_address,
                                   absl::StrCat(nodes_[to].port),
                                   "",
                                   "0",
                                   "10000",
                                   "AUTH",
                                   admin_password_,
                                   "KEYS"};
  argv.insert(argv.end(), keys.begin(), keys.end());
  return Command(*from, argv).status();
}

absl::Status RedisClusterFixture::FinishSlotMigration(int slot, int to) {
  absl::StatusOr<int> from = MasterOfSlot(slot);
  if (!from.ok()) return from.status();
  const std::string s = absl::StrCat(slot);
  for (int batch = 0; batch < 100000; ++batch) {
    absl::StatusOr<std::string> keys =
        Command(*from, {"CLUSTER", "GETKEYSINSLOT", s, "100"});
    if (!keys.ok()) return keys.status();
    if (keys->empty()) break;
    std::vector<std::string> list = absl::StrSplit(*keys, '\n');
    if (absl::Status st = MigrateKeys(slot, list, to); !st.ok()) return st;
  }
  absl::StatusOr<std::string> to_id = NodeId(to);
  if (!to_id.ok()) return to_id.status();
  absl::StatusOr<std::vector<int>> masters = Masters();
  if (!masters.ok()) return masters.status();
  // The new owner first, then the old one, then everyone else (as
  // redis-cli --cluster reshard does).
  std::vector<int> order = {to, *from};
  for (int m : *masters) {
    if (m != to && m != *from) order.push_back(m);
  }
  for (int m : order) {
    if (!running(m)) continue;
    absl::StatusOr<std::string> r =
        Command(m, {"CLUSTER", "SETSLOT", s, "NODE", *to_id});
    if (!r.ok()) return r.status();
  }
  return absl::OkStatus();
}

absl::Status RedisClusterFixture::MoveSlot(int slot, int to) {
  if (absl::Status s = BeginSlotMigration(slot, to); !s.ok()) return s;
  return FinishSlotMigration(slot, to);
}

}  // namespace kvtier::testing
