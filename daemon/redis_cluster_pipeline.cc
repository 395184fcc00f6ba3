// RedisCluster (daemon/redis_cluster.h): the pipelines. A call's requests
// are grouped by node; each group's commands are appended to one leased
// connection and written out, every group before any reply is read; the
// replies of all groups are then read as they arrive (poll), by a
// RespReader per connection (daemon/resp_reader.h: bulk strings straight
// into the caller's ValueArena, not through hiredis's reader). MOVED and
// ASK replies send their request to the named node in a second round.
#include <hiredis/hiredis.h>
#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <numeric>
#include <optional>
#include <string_view>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "daemon/redis_cluster.h"
#include "daemon/resp_reader.h"

namespace kvtier::daemon {

struct RedisCluster::Request {
  uint16_t slot = 0;
  std::array<std::string_view, 5> argv;  // views of the caller's data
  int argc = 0;
  Node* redirect = nullptr;        // the next round's node (MOVED / ASK)
  bool asking = false;             // send ASKING first (an ASK redirection)
  Node* served_by = nullptr;       // the node that sent `reply`
  std::optional<RespReply> reply;  // the reply, when one came
  absl::Status status;             // why there is no reply
};

struct RedisCluster::Batch {
  explicit Batch(Node* node) : node(node) {}
  Node* node;
  std::vector<size_t> items;  // request indices
  Lease lease;
  std::unique_ptr<RespReader> reader;  // while replies are due
  std::vector<ptrdiff_t> expect;  // per reply due: its request, -1: ASKING's
  size_t next = 0;                // replies read
  bool active = false;            // replies still due
  absl::Time last_progress;
};

namespace {

constexpr ptrdiff_t kAskingReply = -1;

// The address in "MOVED 3999 127.0.0.1:6381" / "ASK ...": Redis formats it
// as ip:port without brackets, and with an empty ip for "the node you
// asked".
std::string RedirectAddress(absl::string_view error,
                            absl::string_view asked_host) {
  absl::string_view target = error.substr(error.rfind(' ') + 1);
  const size_t colon = target.rfind(':');
  absl::string_view host = target.substr(0, colon);
  absl::string_view port = target.substr(colon + 1);
  if (colon == absl::string_view::npos) return std::string(target);
  if (host.empty()) host = asked_host;
  return absl::StrContains(host, ':') ? absl::StrCat("[", host, "]:", port)
                                      : absl::StrCat(host, ":", port);
}

int PollMillis(absl::Duration d) {
  if (d <= absl::ZeroDuration()) return 0;
  return static_cast<int>(std::min<int64_t>(
      absl::ToInt64Milliseconds(absl::Ceil(d, absl::Milliseconds(1))),
      60 * 1000));
}

}  // namespace

void RedisCluster::Execute(std::vector<Request>& requests, absl::Time deadline,
                           ValueArena* arena, size_t max_bulk) {
  std::vector<size_t> todo(requests.size());
  std::iota(todo.begin(), todo.end(), 0);
  bool refresh_now = false;
  for (int round = 0; round < 2 && !todo.empty(); ++round) {
    if (absl::Now() >= deadline) {
      for (size_t i : todo) {
        requests[i].status = absl::DeadlineExceededError(
            "deadline passed before the redis command was sent");
      }
      return;
    }
    const bool need_map =
        refresh_now || std::any_of(todo.begin(), todo.end(), [&](size_t i) {
          return requests[i].redirect == nullptr;
        });
    absl::Status map_error;
    std::shared_ptr<const SlotMap> map;
    if (need_map) map = CurrentMap(deadline, &map_error);

    std::vector<Batch> batches;
    bool unserved = false;
    for (size_t i : todo) {
      Request& r = requests[i];
      Node* node = r.redirect;
      if (node == nullptr && map != nullptr) node = map->master[r.slot];
      if (node == nullptr) {
        r.status = map != nullptr
                       ? absl::UnavailableError(absl::StrCat(
                             "no redis master known for slot ", r.slot))
                       : map_error;
        if (map != nullptr) unserved = true;
        continue;
      }
      auto it = std::find_if(batches.begin(), batches.end(),
                             [&](const Batch& b) { return b.node == node; });
      if (it == batches.end()) it = batches.emplace(batches.end(), node);
      it->items.push_back(i);
    }
    if (unserved) RequestRefresh(RefreshReason::kNodeDown);
    RunRound(batches, requests, deadline, arena, max_bulk);

    std::vector<size_t> retry;
    refresh_now = false;
    for (const Batch& batch : batches) {
      for (size_t i : batch.items) {
        Request& r = requests[i];
        if (!r.reply || r.reply->type != RespReply::Type::kError) continue;
        const absl::string_view error = r.reply->value;
        const bool moved = absl::StartsWith(error, "MOVED ");
        const bool ask = absl::StartsWith(error, "ASK ");
        if (!moved && !ask) continue;
        if (round > 0) {
          r.status = absl::UnavailableError(absl::StrCat(
              "redis ", batch.node->address, ": redirected twice: ", error));
          r.reply.reset();
          continue;
        }
        r.redirect = GetNode(RedirectAddress(error, batch.node->host));
        r.asking = ask;
        r.reply.reset();
        (moved ? moved_ : asked_).fetch_add(1);
        refresh_now |= moved;
        retry.push_back(i);
      }
    }
    if (refresh_now) RequestRefresh(RefreshReason::kMoved);
    todo = std::move(retry);
  }
}

void RedisCluster::FailBatch(Batch& batch, std::vector<Request>& requests,
                             const absl::Status& status, bool node_failed) {
  if (batch.expect.empty()) {
    for (size_t i : batch.items) requests[i].status = status;
  }
  for (size_t k = batch.next; k < batch.expect.size(); ++k) {
    if (batch.expect[k] != kAskingReply) {
      requests[batch.expect[k]].status = status;
    }
  }
  batch.expect.clear();
  batch.next = 0;
  batch.active = false;
  batch.lease.Release();  // closed: replies may still be due on it
  if (node_failed) NodeFailed(batch.node, status);
}

void RedisCluster::RunRound(std::vector<Batch>& batches,
                            std::vector<Request>& requests, absl::Time deadline,
                            ValueArena* arena, size_t max_bulk) {
  // Connect and queue every node's commands. A call holds one connection
  // per node while it waits for the next node's, so every call takes them
  // in the same order (by address): no two calls wait on each other.
  std::sort(batches.begin(), batches.end(), [](const Batch& a, const Batch& b) {
    return a.node->address < b.node->address;
  });
  for (Batch& batch : batches) {
    if (absl::Now() >= deadline) {
      FailBatch(batch, requests,
                absl::DeadlineExceededError(
                    absl::StrCat("deadline passed before reaching redis node ",
                                 batch.node->address)),
                false);
      continue;
    }
    absl::StatusOr<Lease> lease = Acquire(batch.node, deadline);
    if (!lease.ok()) {
      FailBatch(batch, requests, lease.status(), false);
      // A node down (failing fast) may have been replaced by a replica.
      if (!absl::IsDeadlineExceeded(lease.status())) {
        RequestRefresh(RefreshReason::kNodeDown);
      }
      continue;
    }
    batch.lease = std::move(*lease);
    redisContext* c = batch.lease.get();
    bool queued = true;
    for (size_t i : batch.items) {
      Request& r = requests[i];
      r.served_by = batch.node;
      if (r.asking) {
        const char* asking = "ASKING";
        const size_t len = 6;
        if (redisAppendCommandArgv(c, 1, &asking, &len) != REDIS_OK) {
          queued = false;
          break;
        }
        batch.expect.push_back(kAskingReply);
      }
      const char* argv[5];
      size_t lens[5];
      for (int a = 0; a < r.argc; ++a) {
        argv[a] = r.argv[a].data();
        lens[a] = r.argv[a].size();
      }
      if (redisAppendCommandArgv(c, r.argc, argv, lens) != REDIS_OK) {
        queued = false;
        break;
      }
      batch.expect.push_back(static_cast<ptrdiff_t>(i));
    }
    if (!queued) {
      batch.expect.clear();
      FailBatch(
          batch, requests,
          absl::ResourceExhaustedError("out of memory queueing redis commands"),
          false);
      continue;
    }
    batch.reader = std::make_unique<RespReader>(arena, max_bulk);
    batch.active = true;
  }

  // Write everything out. Each write blocks io_timeout at most.
  {
    SigpipeBlock block;
    for (Batch& batch : batches) {
      int done = 0;
      while (batch.active && !done) {
        if (absl::Now() >= deadline) {
          FailBatch(batch, requests,
                    absl::DeadlineExceededError(
                        absl::StrCat("deadline passed writing to redis node ",
                                     batch.node->address)),
                    false);
        } else if (redisBufferWrite(batch.lease.get(), &done) != REDIS_OK) {
          FailBatch(batch, requests,
                    absl::UnavailableError(absl::StrCat(
                        "writing to redis node ", batch.node->address, ": ",
                        batch.lease.get()->errstr)),
                    true);
        }
      }
    }
  }
  ReadReplies(batches, requests, deadline);
}

void RedisCluster::ReadReplies(std::vector<Batch>& batches,
                               std::vector<Request>& requests,
                               absl::Time deadline) {
  std::vector<Batch*> live;
  const absl::Time start = absl::Now();
  for (Batch& batch : batches) {
    if (!batch.active) continue;
    batch.last_progress = start;
    live.push_back(&batch);
  }
  std::vector<pollfd> fds;
  RespReply reply;
  while (true) {
    // Take every complete reply already read.
    for (Batch* batch : live) {
      while (batch->active && batch->next < batch->expect.size() &&
             batch->reader->Next(&reply)) {
        const ptrdiff_t i = batch->expect[batch->next++];
        if (i != kAskingReply) requests[i].reply = std::move(reply);
      }
      if (batch->active && batch->next == batch->expect.size()) {
        batch->active = false;
        // A byte past the last reply due: the connection is out of step.
        if (batch->reader->idle()) batch->lease.Keep();
        batch->lease.Release();
        batch->reader.reset();
      }
    }
    live.erase(std::remove_if(live.begin(), live.end(),
                              [](const Batch* b) { return !b->active; }),
               live.end());
    if (live.empty()) return;

    absl::Time now = absl::Now();
    if (now >= deadline) {
      for (Batch* batch : live) {
        FailBatch(*batch, requests,
                  absl::DeadlineExceededError(
                      absl::StrCat("redis node ", batch->node->address,
                                   " did not reply before the deadline")),
                  false);
      }
      return;
    }
    absl::Time wake = deadline;
    fds.clear();
    for (Batch* batch : live) {
      wake = std::min(wake, batch->last_progress + options_.io_timeout);
      fds.push_back({batch->lease.get()->fd, POLLIN, 0});
    }
    const int n = poll(fds.data(), fds.size(), PollMillis(wake - now));
    if (n < 0 && errno != EINTR) {
      for (Batch* batch : live) {
        FailBatch(*batch, requests,
                  absl::InternalError(absl::StrCat("poll: errno ", errno)),
                  false);
      }
      return;
    }
    now = absl::Now();
    for (size_t k = 0; k < live.size(); ++k) {
      Batch* batch = live[k];
      if (n > 0 && fds[k].revents != 0) {
        if (absl::Status read = batch->reader->ReadFrom(fds[k].fd);
            !read.ok()) {
          FailBatch(*batch, requests,
                    absl::UnavailableError(absl::StrCat(
                        "reading from redis node ", batch->node->address, ": ",
                        read.message())),
                    true);
        } else {
          batch->last_progress = now;
        }
      } else if (now - batch->last_progress >= options_.io_timeout &&
                 now < deadline) {
        FailBatch(*batch, requests,
                  absl::UnavailableError(
                      absl::StrCat("redis node ", batch->node->address,
                                   " sent nothing for io_timeout ",
                                   absl::FormatDuration(options_.io_timeout))),
                  true);
      }
    }
  }
}

// --- The calls
// ----------------------------------------------------------------

namespace {

// The status of a request that got no usable reply.
absl::Status NoReply(const absl::Status& status) {
  return status.ok() ? absl::InternalError("redis request got no reply")
                     : status;
}

}  // namespace

std::vector<absl::StatusOr<absl::string_view>> RedisCluster::Get(
    absl::Span<const std::string> keys, absl::Time deadline, ValueArena* arena,
    std::vector<std::string>* owned, size_t max_value_bytes) {
  std::vector<Request> requests(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    requests[i].slot = RedisKeySlot(keys[i]);
    requests[i].argv = {"GET", keys[i]};
    requests[i].argc = 2;
  }
  Execute(requests, deadline, arena, max_value_bytes);
  std::vector<absl::StatusOr<absl::string_view>> out;
  out.reserve(keys.size());
  if (owned != nullptr) owned->assign(keys.size(), std::string());
  for (size_t i = 0; i < requests.size(); ++i) {
    Request& r = requests[i];
    if (!r.reply) {
      out.push_back(NoReply(r.status));
      continue;
    }
    RespReply& reply = *r.reply;
    switch (reply.type) {
      case RespReply::Type::kString:
        if (owned != nullptr) {
          (*owned)[i] = std::move(reply).TakeString();
          out.push_back(absl::string_view((*owned)[i]));
        } else {
          out.push_back(reply.value);  // In the arena.
        }
        break;
      case RespReply::Type::kNil:
        out.push_back(absl::NotFoundError("no such redis key"));
        break;
      case RespReply::Type::kError:
        out.push_back(ErrorReplyStatus(r.served_by->address, reply.value));
        break;
      case RespReply::Type::kTooLarge:
        out.push_back(absl::OutOfRangeError(
            absl::StrCat("redis ", r.served_by->address, ": a value of ",
                         reply.integer, " bytes, over the ", max_value_bytes,
                         " expected: refused, not stored")));
        break;
      default:
        out.push_back(absl::InternalError(
            absl::StrCat("redis GET: unexpected reply type ",
                         static_cast<int>(reply.type))));
    }
  }
  return out;
}

std::vector<absl::StatusOr<std::string>> RedisCluster::Get(
    absl::Span<const std::string> keys, absl::Time deadline) {
  std::vector<std::string> owned;
  std::vector<absl::StatusOr<absl::string_view>> views =
      Get(keys, deadline, nullptr, &owned);
  std::vector<absl::StatusOr<std::string>> out;
  out.reserve(views.size());
  for (size_t i = 0; i < views.size(); ++i) {
    if (views[i].ok()) {
      out.push_back(std::move(owned[i]));
    } else {
      out.push_back(views[i].status());
    }
  }
  return out;
}

std::vector<absl::StatusOr<bool>> RedisCluster::Exists(
    absl::Span<const std::string> keys, absl::Time deadline) {
  std::vector<Request> requests(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    requests[i].slot = RedisKeySlot(keys[i]);
    requests[i].argv = {"EXISTS", keys[i]};
    requests[i].argc = 2;
  }
  Execute(requests, deadline, nullptr);
  std::vector<absl::StatusOr<bool>> out;
  out.reserve(keys.size());
  for (Request& r : requests) {
    if (!r.reply) {
      out.push_back(NoReply(r.status));
    } else if (r.reply->type == RespReply::Type::kInteger) {
      out.push_back(r.reply->integer > 0);
    } else if (r.reply->type == RespReply::Type::kError) {
      out.push_back(ErrorReplyStatus(r.served_by->address, r.reply->value));
    } else {
      out.push_back(absl::InternalError(
          absl::StrCat("redis EXISTS: unexpected reply type ",
                       static_cast<int>(r.reply->type))));
    }
  }
  return out;
}

std::vector<absl::Status> RedisCluster::Statuses(
    const std::vector<Request>& requests, RespReply::Type ok_type,
    absl::string_view command) {
  std::vector<absl::Status> out;
  out.reserve(requests.size());
  for (const Request& r : requests) {
    if (!r.reply) {
      out.push_back(NoReply(r.status));
    } else if (r.reply->type == ok_type) {
      out.push_back(absl::OkStatus());
    } else if (r.reply->type == RespReply::Type::kError) {
      out.push_back(ErrorReplyStatus(r.served_by->address, r.reply->value));
    } else {
      out.push_back(absl::InternalError(
          absl::StrCat("redis ", command, ": unexpected reply type ",
                       static_cast<int>(r.reply->type))));
    }
  }
  return out;
}

std::vector<absl::Status> RedisCluster::Set(absl::Span<const KeyValue> items,
                                            absl::Duration ttl,
                                            absl::Time deadline) {
  if (ttl < absl::ZeroDuration()) {
    return std::vector<absl::Status>(
        items.size(), absl::InvalidArgumentError("ttl must not be negative"));
  }
  const std::string px = ttl > absl::ZeroDuration()
                             ? absl::StrCat(absl::ToInt64Milliseconds(
                                   absl::Ceil(ttl, absl::Milliseconds(1))))
                             : "";
  std::vector<Request> requests(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    requests[i].slot = RedisKeySlot(
        absl::string_view(items[i].key.data(), items[i].key.size()));
    requests[i].argv = {"SET", items[i].key, items[i].value, "PX", px};
    requests[i].argc = px.empty() ? 3 : 5;
  }
  Execute(requests, deadline, nullptr);
  return Statuses(requests, RespReply::Type::kStatus, "SET");
}

std::vector<absl::Status> RedisCluster::Del(absl::Span<const std::string> keys,
                                            absl::Time deadline) {
  std::vector<Request> requests(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    requests[i].slot = RedisKeySlot(keys[i]);
    requests[i].argv = {"DEL", keys[i]};
    requests[i].argc = 2;
  }
  Execute(requests, deadline, nullptr);
  return Statuses(requests, RespReply::Type::kInteger, "DEL");
}

}  // namespace kvtier::daemon
