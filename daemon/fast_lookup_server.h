// FastLookupServer: serves the fast lookup path (common/fast_lookup.h) on a
// unix socket beside gRPC. One thread per engine connection blocks in read()
// and answers with TierCore::LookupHashes: no HTTP/2, no thread hand-off.
// Engines are few per node (one per GPU), so a thread each is cheap; the
// number of connections is capped. A connection's Hello also binds the
// peer's SO_PEERCRED to its session: this socket is how the daemon learns
// who an engine is (daemon/peer_credentials.h).
//
// Thread-safety: Start and Stop from one thread; serving threads are internal.
#ifndef KVTIER_DAEMON_FAST_LOOKUP_SERVER_H_
#define KVTIER_DAEMON_FAST_LOOKUP_SERVER_H_

#include <sys/types.h>

#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "daemon/tier_core.h"

namespace kvtier::daemon {

class FastLookupServer {
 public:
  static constexpr int kMaxConnections = 1024;

  // REQUIRES: `core` outlives this server.
  explicit FastLookupServer(TierCore* core) : core_(core) {}
  ~FastLookupServer();  // Stops.

  // Listens on `path` (a stale socket file is replaced; mode 0660, owned by
  // `group` unless it is -1).
  absl::Status Start(const std::string& path,
                     gid_t group = static_cast<gid_t>(-1));
  // Closes the listener and every connection and waits for their threads.
  void Stop();

 private:
  void AcceptLoop();
  void Serve(uint64_t id, int fd);
  // Joins the threads of connections that ended.
  void ReapFinished();

  TierCore* const core_;
  std::string path_;
  int listen_fd_ = -1;
  std::thread acceptor_;

  absl::Mutex mu_;
  absl::flat_hash_set<int> connections_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, std::thread> threads_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> finished_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_FAST_LOOKUP_SERVER_H_
