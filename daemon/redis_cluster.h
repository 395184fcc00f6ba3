// RedisCluster: a small Redis Cluster client for kvtierd's cluster tier
// (issue 17), over Debian bookworm's hiredis 0.14.1 synchronous contexts.
//
// Each key goes to the master serving its slot (RedisKeySlot) in a slot map
// read with CLUSTER SLOTS. The map is fetched lazily, from any reachable
// known node (the seeds and every node a map named), and refreshed on MOVED,
// while calls hit a failed node (a replica promoted after a failover shows
// up this way), and every few seconds otherwise. A call's keys are
// pipelined: grouped by node, every node's commands are written before any
// reply is read, and the replies of all nodes are read as they arrive
// (poll), so one thread talks to every node at once; hiredis connects and
// writes, and the pipelines' replies are parsed by daemon/resp_reader.h,
// which reads a GET's value straight into the caller's ValueArena (no copy
// but the kernel's). MOVED is followed once
// (to the named node, after refreshing the map), and ASK once (ASKING, then
// the command, on the named node).
//
// Failures are per key: a node that is down, slow or unknown fails its own
// keys (UNAVAILABLE, or DEADLINE_EXCEEDED when the call's deadline passed
// first) and no other. A node that failed (a refused or timed-out connect,
// a failed AUTH, an I/O error or io_timeout without a byte) is marked down:
// calls on its slots fail fast, without touching the network, until
// node_retry has passed; then one caller tries it again.
//
// No TLS: hiredis 0.14 has none (hiredis_ssl arrived in 1.0), so AUTH and
// the values cross the network in clear; reach the cluster over a trusted
// network only.
//
// Keys and values are binary-safe. Writes run with SIGPIPE blocked in the
// calling thread, so a node that drops a connection cannot kill the process.
//
// Thread-safety: RedisCluster is thread-safe; any number of threads may call
// it at once. Each call takes one connection per node it needs from that
// node's pool (at most connections_per_node open per node) for the whole
// pipeline, in address order, so calls waiting for a busy pool never wait on
// each other in a cycle. Lock order: mu_, then a Node's mu (a leaf).
#ifndef KVTIER_DAEMON_REDIS_CLUSTER_H_
#define KVTIER_DAEMON_REDIS_CLUSTER_H_

#include <signal.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "daemon/resp_reader.h"

struct redisContext;  // hiredis
struct redisReply;

namespace kvtier::daemon {

struct RedisClusterOptions {
  std::vector<std::string> seeds;  // "host:port", at least one
  std::string user;      // ACL user; empty: AUTH with password only (or none)
  std::string password;  // empty: no AUTH
  absl::Duration connect_timeout = absl::Milliseconds(250);
  // Bounds each read or write system call; a node that sends nothing for
  // this long while replies are due has failed.
  absl::Duration io_timeout = absl::Milliseconds(500);
  // A node that failed is not retried sooner (calls on its slots fail fast
  // meanwhile).
  absl::Duration node_retry = absl::Milliseconds(500);
  int connections_per_node = 4;  // pool size per node (concurrent callers)
};

// Parses "host:port,host:port" (an IPv6 host in brackets: "[::1]:7000";
// blanks around entries are ignored) into "host:port" entries.
// INVALID_ARGUMENT naming the bad entry; an empty list is one.
absl::StatusOr<std::vector<std::string>> ParseRedisSeeds(
    absl::string_view list);

// The Redis Cluster slot of `key`: CRC16 (XMODEM) of the key, or of its hash
// tag (what lies between the first '{' and the next '}', when not empty),
// mod 16384.
uint16_t RedisKeySlot(absl::string_view key);

class RedisCluster {
 public:
  static constexpr int kSlots = 16384;

  // Validates `options` (INVALID_ARGUMENT naming the field); does not need
  // any node to be reachable.
  static absl::StatusOr<std::unique_ptr<RedisCluster>> Create(
      RedisClusterOptions options);
  // Closes every connection. REQUIRES: no call in flight.
  ~RedisCluster();
  RedisCluster(const RedisCluster&) = delete;
  RedisCluster& operator=(const RedisCluster&) = delete;

  // Pipelined GETs of `keys`, all bounded by `deadline`. result[i]: the
  // value; NOT_FOUND when the key is absent; UNAVAILABLE / DEADLINE_EXCEEDED
  // when its node is down, slow or unknown (UNAUTHENTICATED when AUTH was
  // refused, PERMISSION_DENIED when the ACL forbids the command or key).
  // Returns by `deadline` plus at most one io_timeout (a write under way
  // when it passed); resolving a host name is not bounded (give addresses).
  std::vector<absl::StatusOr<std::string>> Get(
      absl::Span<const std::string> keys, absl::Time deadline);
  // The same GETs, each value read from the socket straight into `arena`
  // (views valid until its next Reset): no copy but the kernel's. With
  // `owned` instead of an arena, values go to (*owned)[i] and result[i]
  // views it. A value over `max_value_bytes` (at most RespReader::kMaxBulk)
  // is OUT_OF_RANGE, naming its size and node: refused before anything is
  // allocated for it, and drained off its connection, which stays usable.
  std::vector<absl::StatusOr<absl::string_view>> Get(
      absl::Span<const std::string> keys, absl::Time deadline,
      ValueArena* arena, std::vector<std::string>* owned = nullptr,
      size_t max_value_bytes = RespReader::kMaxBulk);
  // Pipelined EXISTS, same contract: result[i] true/false or an error.
  std::vector<absl::StatusOr<bool>> Exists(absl::Span<const std::string> keys,
                                           absl::Time deadline);
  // Pipelined SETs (values may be several MiB each) with a TTL (zero: none;
  // rounded up to milliseconds). result[i] OK or an error (as Get's, or
  // RESOURCE_EXHAUSTED when the node is out of memory).
  struct KeyValue {
    std::string_view key;
    std::string_view value;
  };
  std::vector<absl::Status> Set(absl::Span<const KeyValue> items,
                                absl::Duration ttl, absl::Time deadline);
  // Pipelined DEL (for tests and operators): OK whether or not the key was
  // there.
  std::vector<absl::Status> Del(absl::Span<const std::string> keys,
                                absl::Time deadline);

  struct NodeState {
    std::string address;
    bool master = true;  // false: a replica, or a seed no slot map named
    // No connection to it failed since the last success (a node never
    // contacted, such as a replica, counts as up).
    bool up = false;
    uint32_t slots = 0;
    std::string last_error;  // the last failure, kept after recovery
  };
  struct State {
    std::vector<NodeState> nodes;  // by address
    uint32_t covered_slots = 0;    // slots with a master in the map
    uint64_t slot_map_refreshes = 0;
    // Redirections followed, and node failures seen (failed connects, AUTH
    // refusals, I/O errors, io_timeouts; a call failed fast adds nothing).
    uint64_t moved = 0, asked = 0, node_failures = 0;
  };
  // A snapshot for `kvtierctl status` and metrics.
  State GetState() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct ReplyDeleter {
    void operator()(redisReply* reply) const;
  };
  using ReplyPtr = std::unique_ptr<redisReply, ReplyDeleter>;

  // One server: where it is, its connection pool and whether it is down.
  struct Node {
    Node(std::string address, std::string host, int port, int max_open)
        : address(std::move(address)),
          host(std::move(host)),
          port(port),
          max_open(max_open) {}
    bool CanTake() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
      return !idle.empty() || open < max_open;
    }

    const std::string address;  // "host:port"
    const std::string host;
    const int port;
    const int max_open;  // connections_per_node

    mutable absl::Mutex mu;
    std::vector<redisContext*> idle ABSL_GUARDED_BY(mu);  // owned
    int open ABSL_GUARDED_BY(mu) = 0;                     // idle plus leased
    bool down ABSL_GUARDED_BY(mu) = false;
    absl::Time retry_at ABSL_GUARDED_BY(mu) = absl::InfinitePast();
    absl::Status last_error ABSL_GUARDED_BY(mu);
    absl::Time last_logged ABSL_GUARDED_BY(mu) = absl::InfinitePast();
    uint64_t unlogged ABSL_GUARDED_BY(mu) = 0;  // failures not logged since
    // A down node's retry that fell to a caller whose deadline was shorter
    // than connect_timeout: the prober thread tries it instead.
    bool probe_wanted ABSL_GUARDED_BY(mu) = false;
  };

  // Who serves what, as one CLUSTER SLOTS reply said. Immutable once made.
  struct SlotMap {
    struct Entry {
      Node* node;
      bool master;
      uint32_t slots;
    };
    std::array<Node*, kSlots> master{};  // nullptr: no master known
    std::vector<Entry> nodes;            // every node the reply named
    uint32_t covered = 0;
  };

  // A connection out of a node's pool. It goes back to the pool when
  // released after Keep() (every reply read, no error); otherwise it is
  // closed.
  class Lease {
   public:
    Lease() = default;
    Lease(RedisCluster* owner, Node* node, redisContext* context)
        : owner_(owner), node_(node), context_(context) {}
    Lease(Lease&& other) noexcept { *this = std::move(other); }
    Lease& operator=(Lease&& other) noexcept;
    ~Lease() { Release(); }

    redisContext* get() const { return context_; }
    Node* node() const { return node_; }
    void Keep() { reusable_ = true; }
    void Release();

   private:
    RedisCluster* owner_ = nullptr;
    Node* node_ = nullptr;
    redisContext* context_ = nullptr;
    bool reusable_ = false;
  };

  // Blocks SIGPIPE in this thread while it writes to sockets (hiredis 0.14
  // uses write(), not send(MSG_NOSIGNAL)), then consumes any SIGPIPE the
  // writes raised, so a node closing a connection cannot kill the process.
  class SigpipeBlock {
   public:
    SigpipeBlock();
    ~SigpipeBlock();
    SigpipeBlock(const SigpipeBlock&) = delete;
    SigpipeBlock& operator=(const SigpipeBlock&) = delete;

   private:
    sigset_t pipe_, old_;
    bool was_pending_ = false;
  };

  // The status of error reply `error` from node `address` (UNAUTHENTICATED,
  // PERMISSION_DENIED, RESOURCE_EXHAUSTED, UNAVAILABLE, FAILED_PRECONDITION
  // or INTERNAL by its prefix), naming the node.
  static absl::Status ErrorReplyStatus(absl::string_view address,
                                       absl::string_view error);

  struct Request;  // one key's command (redis_cluster_pipeline.cc)
  struct Batch;    // one node's share of a pipeline round
  // Each request's outcome where success is a reply of type `ok_type`:
  // OK, the reply's error, or why none came.
  static std::vector<absl::Status> Statuses(
      const std::vector<Request>& requests, RespReply::Type ok_type,
      absl::string_view command);

  explicit RedisCluster(RedisClusterOptions options);

  // Nodes (redis_cluster.cc) and their pools (redis_cluster_pool.cc).
  Node* GetNode(const std::string& address) ABSL_LOCKS_EXCLUDED(mu_);
  Node* GetNodeLocked(const std::string& address)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A connection to `node`: an idle one, a new one (within
  // connections_per_node), or the next one released before `deadline`.
  // Fails fast while the node is down.
  absl::StatusOr<Lease> Acquire(Node* node, absl::Time deadline)
      ABSL_LOCKS_EXCLUDED(mu_);
  // A new connection, AUTH done, within connect_timeout plus io_timeout and
  // no later than `deadline`; *cut is set when it failed because the
  // deadline came first.
  absl::StatusOr<redisContext*> Connect(const Node& node, absl::Time deadline,
                                        bool* cut);
  // Runs one command on `lease` and waits for its reply (an error reply
  // included), no later than `deadline`. On an I/O failure the connection is
  // closed and, unless the deadline came first, the node marked down.
  absl::StatusOr<ReplyPtr> RunCommand(Lease& lease,
                                      const std::vector<std::string_view>& argv,
                                      absl::Time deadline);
  void Return(Node* node, redisContext* context, bool reusable);
  // Marks `node` down for node_retry, closes its idle connections, logs
  // (rate-limited) and asks for a slot map refresh.
  void NodeFailed(Node* node, const absl::Status& status)
      ABSL_LOCKS_EXCLUDED(mu_);

  // The slot map (redis_cluster.cc): the current one, refreshed first when
  // a refresh is due; null (and *error set) when there is none.
  std::shared_ptr<const SlotMap> CurrentMap(absl::Time deadline,
                                            absl::Status* error)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Whether a refresh is due: no map yet, or one asked for (MOVED: at most
  // every 100 ms; a node down: every node_retry), or none for 5 s.
  bool RefreshDue(absl::Time now) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  enum class RefreshReason { kMoved, kNodeDown };
  void RequestRefresh(RefreshReason reason) ABSL_LOCKS_EXCLUDED(mu_);
  bool NotRefreshing() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !refreshing_;
  }

  // CurrentMap's steps (redis_cluster.cc), for the caller that refreshes
  // unless said otherwise.
  struct SlotRange;  // One range of a CLUSTER SLOTS reply.
  // For a caller that finds another refreshing: the stale map when there
  // is one; else waits (mu_ released meanwhile) until that refresh ends or
  // `deadline` passes, then returns the map it made, or null with *error
  // set (DEADLINE_EXCEEDED, or that refresh's error).
  std::shared_ptr<const SlotMap> AwaitOtherRefresh(absl::Time deadline,
                                                   absl::Status* error)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The nodes to ask, each once, those up before those down; in each part,
  // the current map's masters, then its replicas, then the seeds and every
  // other node ever named.
  std::vector<Node*> RefreshCandidates() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Asks `candidates` one after another (AskSlots) until one names at least
  // one range, and returns those. Stops at `deadline`. Otherwise "no redis
  // slot map from any of N nodes: " and every node's error, with the code
  // UNAUTHENTICATED / PERMISSION_DENIED when a node refused (the last),
  // else DEADLINE_EXCEEDED when the deadline cut the list short, else
  // UNAVAILABLE.
  absl::StatusOr<std::vector<SlotRange>> FetchSlotRanges(
      absl::Span<Node* const> candidates, absl::Time deadline)
      ABSL_LOCKS_EXCLUDED(mu_);
  // One CLUSTER SLOTS on `node`: its ranges (maybe none), or why not (the
  // connection's status, or the error reply's, "CLUSTER SLOTS on " it).
  absl::StatusOr<std::vector<SlotRange>> AskSlots(Node* node,
                                                  absl::Time deadline)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Parses a CLUSTER SLOTS reply from the node at `host` (which stands for
  // an empty endpoint). Nodes whose endpoint is unknown ("?") are left out.
  static absl::StatusOr<std::vector<SlotRange>> ParseClusterSlots(
      const redisReply* reply, const std::string& host);
  // Makes the map of `ranges` (naming their nodes) the current one, clears
  // refresh_error_ and counts the refresh.
  void InstallMap(absl::Span<const SlotRange> ranges)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Pipelines (redis_cluster_pipeline.cc): runs every request, following
  // one redirection each; leaves each request with a reply or a status.
  // Bulk strings go to `arena` (null: into their replies); one over
  // `max_bulk` bytes is drained, its reply RespReply::Type::kTooLarge.
  void Execute(std::vector<Request>& requests, absl::Time deadline,
               ValueArena* arena, size_t max_bulk = RespReader::kMaxBulk);
  void RunRound(std::vector<Batch>& batches, std::vector<Request>& requests,
                absl::Time deadline, ValueArena* arena, size_t max_bulk);
  void ReadReplies(std::vector<Batch>& batches, std::vector<Request>& requests,
                   absl::Time deadline);
  void FailBatch(Batch& batch, std::vector<Request>& requests,
                 const absl::Status& status, bool node_failed);

  // Immutable after construction.
  const RedisClusterOptions options_;

  std::atomic<uint64_t> moved_{0}, asked_{0}, node_failures_{0};

  mutable absl::Mutex mu_;
  // Every node ever named (seeds, slot maps, redirections); never removed,
  // so Node pointers stay valid for the client's life.
  std::map<std::string, std::unique_ptr<Node>> nodes_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<const SlotMap> map_ ABSL_GUARDED_BY(mu_);
  bool refreshing_ ABSL_GUARDED_BY(mu_) = false;
  bool moved_pending_ ABSL_GUARDED_BY(mu_) = false;
  bool down_pending_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time last_attempt_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  absl::Status refresh_error_ ABSL_GUARDED_BY(mu_);
  uint64_t refreshes_ ABSL_GUARDED_BY(mu_) = 0;

  // The prober (redis_cluster_pool.cc): retries down nodes for callers
  // too hurried to wait for a connect (remote lookups' 20 ms), so a host
  // gone off the wire costs them a fast failure, never their deadline, and
  // its return is still noticed.
  void ProbeLoop() ABSL_LOCKS_EXCLUDED(probe_mu_);
  void WantProbe() ABSL_LOCKS_EXCLUDED(probe_mu_);
  absl::Mutex probe_mu_;  // A leaf (taken under a Node::mu).
  bool probe_pending_ ABSL_GUARDED_BY(probe_mu_) = false;
  bool stop_ ABSL_GUARDED_BY(probe_mu_) = false;
  std::thread prober_;
};

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_REDIS_CLUSTER_H_
