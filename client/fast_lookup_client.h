// FastLookupClient: the client end of the fast lookup path
// (common/fast_lookup.h), a framed protocol on the daemon's second unix
// socket that serves Lookup in two wake-ups instead of gRPC's HTTP/2 round
// trip.
//
// Connect's Hello also binds this process's credentials (SO_PEERCRED) to the
// session, which the daemon needs before Attach; a Client connects (and
// reconnects after a daemon restart) before it attaches. When the path is
// not offered, refused or breaks, lookups fall back to gRPC: Lookup returns
// false, and the first fallback per Client is logged to stderr.
//
// Thread-safety: thread-safe. One request at a time per connection (mu_);
// every read and write on it carries the per-RPC deadline (SO_RCVTIMEO and
// SO_SNDTIMEO), so mu_ is never held longer than that.
#ifndef KVTIER_CLIENT_FAST_LOOKUP_CLIENT_H_
#define KVTIER_CLIENT_FAST_LOOKUP_CLIENT_H_

#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/fast_lookup.h"

namespace kvtier::client {

class FastLookupClient {
 public:
  FastLookupClient() = default;
  ~FastLookupClient() { Close(); }
  FastLookupClient(const FastLookupClient&) = delete;
  FastLookupClient& operator=(const FastLookupClient&) = delete;

  // Connects `path` (empty: the daemon offers no fast path) for session
  // `session_id` and exchanges the Hello within `timeout`, which then bounds
  // every read and write of a lookup. Keeps the connection for lookups when
  // `keep`, else closes it once the credentials are bound. On failure leaves
  // no connection, with the reason in last_error().
  void Connect(const std::string& path, uint64_t session_id,
               absl::Duration timeout, bool keep);

  // Runs a lookup. Returns false when no connection is open or the request
  // broke it (the caller then asks gRPC); else fills *status (the daemon's
  // answer, its code, message and ErrorReason), *reply and *rows.
  bool Lookup(uint64_t namespace_id, std::string_view hashes, bool pin,
              absl::Status* status, fastpath::Reply* reply,
              std::vector<uint32_t>* rows);

  // Closes the connection, if any; lookups go over gRPC until Connect.
  void Close();

  // True while a connection is open.
  bool active() const;
  // Why the last Connect failed or the connection broke ("" when the last
  // Connect succeeded).
  std::string last_error() const;

 private:
  // Connects and exchanges the Hello before the deadline, retrying (with
  // backoff) when the daemon closed the connection before answering: it
  // does so to connections still without a Hello when their uid holds too
  // many (a flood, maybe of this uid). Returns the fd, or -1 with *why.
  static int Dial(const std::string& path, uint64_t session_id,
                  absl::Duration timeout, std::string* why);
  // One connect + Hello before `deadline`. On failure returns -1, sets *why
  // and *retry (the daemon closed the connection before answering).
  static int DialOnce(const std::string& path, uint64_t session_id,
                      absl::Duration timeout, absl::Time deadline,
                      std::string* why, bool* retry);
  // Says once per client that lookups go over gRPC, and why.
  void LogFallback(const std::string& why);

  mutable absl::Mutex mu_;
  int fd_ ABSL_GUARDED_BY(mu_) = -1;
  std::string error_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> fallback_logged_{false};
};

}  // namespace kvtier::client

#endif  // KVTIER_CLIENT_FAST_LOOKUP_CLIENT_H_
