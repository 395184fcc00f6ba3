// RedisCluster (daemon/redis_cluster.h): the nodes' connection pools. A
// connection is taken for one pipeline and comes back only when every reply
// was read; a node that fails is marked down and fails fast for node_retry.
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <ctime>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "daemon/redis_cluster.h"
#include "spdlog/spdlog.h"

namespace kvtier::daemon {

// A connect cut short by the caller's deadline after this long marks its
// node down anyway (see Acquire).
constexpr absl::Duration kSuspectWait = absl::Milliseconds(10);
namespace {

// A node that keeps failing is logged at most this often.
constexpr absl::Duration kNodeLogPeriod = absl::Seconds(30);

timeval TimevalOf(absl::Duration d) {
  if (d < absl::Milliseconds(1)) d = absl::Milliseconds(1);
  return absl::ToTimeval(d);
}

// Runs one command on `c` and waits for its reply, each system call bounded
// by io_timeout or by what is left until `deadline`, whichever is shorter.
// Null with *cut set when the deadline cut a failed wait short.
// REQUIRES: SIGPIPE blocked (RedisCluster::SigpipeBlock).
redisReply* BlockingCommand(redisContext* c,
                            const std::vector<std::string_view>& argv,
                            absl::Duration io_timeout, absl::Time deadline,
                            bool* cut) {
  std::vector<const char*> ptrs;
  std::vector<size_t> lens;
  for (std::string_view a : argv) {
    ptrs.push_back(a.data());
    lens.push_back(a.size());
  }
  const absl::Duration left = deadline - absl::Now();
  const bool shortened = left < io_timeout;
  if (shortened) redisSetTimeout(c, TimevalOf(left));
  void* reply = redisCommandArgv(c, static_cast<int>(ptrs.size()), ptrs.data(),
                                 lens.data());
  *cut = reply == nullptr && shortened && absl::Now() >= deadline;
  if (shortened && reply != nullptr) redisSetTimeout(c, TimevalOf(io_timeout));
  return static_cast<redisReply*>(reply);
}

}  // namespace

RedisCluster::SigpipeBlock::SigpipeBlock() {
  sigemptyset(&pipe_);
  sigaddset(&pipe_, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe_, &old_);
  sigset_t pending;
  sigemptyset(&pending);
  sigpending(&pending);
  was_pending_ = sigismember(&pending, SIGPIPE) == 1;
}

RedisCluster::SigpipeBlock::~SigpipeBlock() {
  if (!was_pending_) {
    const timespec zero{};
    while (sigtimedwait(&pipe_, nullptr, &zero) == SIGPIPE) {
    }
  }
  pthread_sigmask(SIG_SETMASK, &old_, nullptr);
}

RedisCluster::Lease& RedisCluster::Lease::operator=(Lease&& other) noexcept {
  if (this != &other) {
    Release();
    owner_ = std::exchange(other.owner_, nullptr);
    node_ = std::exchange(other.node_, nullptr);
    context_ = std::exchange(other.context_, nullptr);
    reusable_ = std::exchange(other.reusable_, false);
  }
  return *this;
}

void RedisCluster::Lease::Release() {
  if (context_ == nullptr) return;
  owner_->Return(node_, std::exchange(context_, nullptr), reusable_);
  reusable_ = false;
}

absl::StatusOr<RedisCluster::Lease> RedisCluster::Acquire(Node* node,
                                                          absl::Time deadline) {
  while (true) {
    redisContext* idle = nullptr;
    {
      absl::MutexLock lock(&node->mu);
      const absl::Time now = absl::Now();
      if (node->down) {
        if (now < node->retry_at) {
          // A refused AUTH keeps its code: retrying will not fix it.
          const absl::StatusCode last = node->last_error.code();
          const absl::StatusCode code =
              last == absl::StatusCode::kUnauthenticated ||
                      last == absl::StatusCode::kPermissionDenied
                  ? last
                  : absl::StatusCode::kUnavailable;
          return absl::Status(
              code,
              absl::StrCat("redis node ", node->address,
                           " is down (next attempt in ",
                           absl::FormatDuration(absl::Trunc(
                               node->retry_at - now, absl::Milliseconds(1))),
                           "): ", node->last_error.message()));
        }
        // This caller tries the node; the others keep failing fast. One
        // that cannot wait for a connect leaves it to the prober.
        node->retry_at = now + options_.node_retry;
        if (deadline - now < options_.connect_timeout) {
          node->probe_wanted = true;
          WantProbe();  // probe_mu_ is a leaf: taken under node->mu.
          return absl::UnavailableError(
              absl::StrCat("redis node ", node->address,
                           " is down (retried in the background): ",
                           node->last_error.message()));
        }
      }
      if (!node->idle.empty()) {
        idle = node->idle.back();
        node->idle.pop_back();
      } else if (node->open < node->max_open) {
        ++node->open;
      } else {
        if (!node->mu.AwaitWithDeadline(absl::Condition(node, &Node::CanTake),
                                        deadline)) {
          return absl::DeadlineExceededError(absl::StrCat(
              "all ", node->max_open, " connections to redis node ",
              node->address, " stayed busy until the deadline"));
        }
        continue;
      }
    }
    if (idle != nullptr) {
      // A connection the server closed (a restart, a kill) reads as
      // readable or hung up while idle: drop it and take another.
      pollfd p{idle->fd, POLLIN, 0};
      if (idle->err == 0 && poll(&p, 1, 0) == 0) {
        return Lease(this, node, idle);
      }
      Return(node, idle, /*reusable=*/false);
      continue;
    }
    bool cut = false;
    const absl::Time connect_start = absl::Now();
    absl::StatusOr<redisContext*> context = Connect(*node, deadline, &cut);
    if (!context.ok()) {
      {
        absl::MutexLock lock(&node->mu);
        --node->open;
      }
      // A node is not to blame for a deadline shorter than its timeouts,
      // unless it kept us waiting far longer than a node on the same
      // network takes to answer: a host gone off the wire (connects time
      // out, none is refused) would otherwise cost every call its whole
      // deadline, never marked down.
      if (cut && absl::Now() - connect_start >= kSuspectWait) {
        NodeFailed(node,
                   absl::DeadlineExceededError(absl::StrCat(
                       "no answer from redis node ", node->address, " within ",
                       absl::FormatDuration(absl::Now() - connect_start), ": ",
                       context.status().message())));
        return absl::DeadlineExceededError(
            absl::StrCat("deadline passed: ", context.status().message()));
      }
      if (cut) {
        return absl::DeadlineExceededError(
            absl::StrCat("deadline passed: ", context.status().message()));
      }
      NodeFailed(node, context.status());
      return context.status();
    }
    bool recovered = false;
    {
      absl::MutexLock lock(&node->mu);
      recovered = node->down;
      node->down = false;
      node->unlogged = 0;
    }
    if (recovered) spdlog::info("redis node {} is back", node->address);
    return Lease(this, node, *context);
  }
}

absl::StatusOr<redisContext*> RedisCluster::Connect(const Node& node,
                                                    absl::Time deadline,
                                                    bool* cut) {
  const absl::Duration left = deadline - absl::Now();
  redisContext* c = redisConnectWithTimeout(
      node.host.c_str(), node.port,
      TimevalOf(std::min(options_.connect_timeout, left)));
  if (c == nullptr) {
    return absl::ResourceExhaustedError("cannot allocate a redis context");
  }
  std::unique_ptr<redisContext, void (*)(redisContext*)> owned(c, redisFree);
  if (c->err != 0) {
    *cut = left < options_.connect_timeout && absl::Now() >= deadline;
    return absl::UnavailableError(
        absl::StrCat("connect to redis node ", node.address, ": ", c->errstr));
  }
  int one = 1;
  setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  // hiredis 0.14 frees an empty input buffer over 16 KiB and grows it
  // again for the next reply. Its reader now only reads RunCommand's
  // replies (AUTH, CLUSTER SLOTS; the pipelines' go through RespReader),
  // so this matters little; kept so a large slot map does not pay it.
  c->reader->maxbuf = 0;
  if (redisSetTimeout(c, TimevalOf(options_.io_timeout)) != REDIS_OK) {
    return absl::InternalError(
        absl::StrCat("redis node ", node.address, ": cannot set io_timeout"));
  }
  if (!options_.password.empty()) {
    std::vector<std::string_view> argv = {"AUTH"};
    if (!options_.user.empty()) argv.push_back(options_.user);
    argv.push_back(options_.password);
    ReplyPtr reply;
    {
      SigpipeBlock block;
      reply.reset(BlockingCommand(c, argv, options_.io_timeout, deadline, cut));
    }
    const std::string who =
        options_.user.empty() ? "" : absl::StrCat(" as user ", options_.user);
    if (reply == nullptr) {
      return absl::UnavailableError(absl::StrCat(
          "redis node ", node.address, ": AUTH", who, ": ", c->errstr));
    }
    if (reply->type == REDIS_REPLY_ERROR) {
      return absl::UnauthenticatedError(
          absl::StrCat("redis node ", node.address, " refused AUTH", who, ": ",
                       absl::string_view(reply->str, reply->len)));
    }
  }
  return owned.release();
}

absl::StatusOr<RedisCluster::ReplyPtr> RedisCluster::RunCommand(
    Lease& lease, const std::vector<std::string_view>& argv,
    absl::Time deadline) {
  bool cut = false;
  ReplyPtr reply;
  {
    SigpipeBlock block;
    reply.reset(BlockingCommand(lease.get(), argv, options_.io_timeout,
                                deadline, &cut));
  }
  if (reply != nullptr) {
    lease.Keep();
    return reply;
  }
  const absl::Status status = absl::UnavailableError(
      absl::StrCat("redis node ", lease.node()->address, ": ",
                   absl::string_view(argv[0].data(), argv[0].size()), ": ",
                   lease.get()->errstr));
  Node* node = lease.node();
  lease.Release();
  if (cut) {
    return absl::DeadlineExceededError(
        absl::StrCat("deadline passed: ", status.message()));
  }
  NodeFailed(node, status);
  return status;
}

void RedisCluster::WantProbe() {
  absl::MutexLock lock(&probe_mu_);
  probe_pending_ = true;
}

void RedisCluster::ProbeLoop() {
  auto wake = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(probe_mu_) {
    return stop_ || probe_pending_;
  };
  for (;;) {
    {
      absl::MutexLock lock(&probe_mu_);
      probe_mu_.Await(absl::Condition(&wake));
      if (stop_) return;
      probe_pending_ = false;
    }
    std::vector<Node*> wanted;
    {
      absl::MutexLock lock(&mu_);
      for (const auto& [address, node] : nodes_) {
        absl::MutexLock node_lock(&node->mu);
        if (std::exchange(node->probe_wanted, false)) {
          node->retry_at = absl::InfinitePast();  // Due now, for the prober.
          wanted.push_back(node.get());
        }
      }
    }
    for (Node* node : wanted) {
      // A full connect and AUTH: up again (a pooled connection), or down
      // for another node_retry.
      const absl::Time deadline =
          absl::Now() + options_.connect_timeout + options_.io_timeout;
      (void)Acquire(node, deadline);  // The lease returns it to the pool.
    }
  }
}

void RedisCluster::Return(Node* node, redisContext* context, bool reusable) {
  if (reusable && context->err == 0) {
    absl::MutexLock lock(&node->mu);
    if (!node->down) {
      node->idle.push_back(context);
      return;
    }
  }
  redisFree(context);
  absl::MutexLock lock(&node->mu);
  --node->open;
}

void RedisCluster::NodeFailed(Node* node, const absl::Status& status) {
  node_failures_.fetch_add(1);
  std::vector<redisContext*> idle;
  bool log = false, was_down = false;
  uint64_t unlogged = 0;
  {
    absl::MutexLock lock(&node->mu);
    const absl::Time now = absl::Now();
    was_down = node->down;
    node->down = true;
    node->retry_at = now + options_.node_retry;
    node->last_error = status;
    idle.swap(node->idle);
    node->open -= static_cast<int>(idle.size());
    if (!was_down || now - node->last_logged >= kNodeLogPeriod) {
      log = true;
      unlogged = std::exchange(node->unlogged, 0);
      node->last_logged = now;
    } else {
      ++node->unlogged;
    }
  }
  for (redisContext* c : idle) redisFree(c);
  if (log && !was_down) {
    spdlog::warn(
        "redis node {} failed: {}; calls on its slots fail fast, and it is "
        "tried again every {}",
        node->address, status.ToString(),
        absl::FormatDuration(options_.node_retry));
  } else if (log) {
    spdlog::warn(
        "redis node {} still failing: {} ({} more failures since "
        "the last report)",
        node->address, status.ToString(), unlogged);
  }
  RequestRefresh(RefreshReason::kNodeDown);
}

}  // namespace kvtier::daemon
