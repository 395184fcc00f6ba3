// Metrics: kvtierd's Prometheus endpoint and the latency hook its request
// handlers call.
//
// Two parts with different weights. The hook (LatencySink, OpTimer) is
// header-only and free of Prometheus: the gRPC adapter and the fast lookup
// server time Lookup, Commit and Attach with an OpTimer, which reads one
// process-wide atomic pointer and does nothing when no sink is installed (unit
// tests, a daemon run with --metrics_address=""). MetricsExporter (metrics.cc,
// prometheus-cpp) is that sink: lock-free histograms for the hook, and a
// Prometheus Collectable that reads TierCore::Stats and TierCore::Counters at
// scrape time, so the core keeps its plain counters and nothing is sprinkled
// through it. It serves the text format over HTTP (prometheus-cpp's Exposer,
// pull) on a loopback address.
//
// Thread-safety: SetLatencySink / GetLatencySink and OpTimer are thread-safe.
// MetricsExporter: Observe and Render are thread-safe; Start and Stop are
// called from one thread.
#ifndef KVTIER_DAEMON_METRICS_H_
#define KVTIER_DAEMON_METRICS_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"

namespace kvtier::daemon {

class TierCore;

// The requests whose latency is recorded.
enum class TimedOp : uint8_t { kLookup = 0, kCommit = 1, kAttach = 2, kNone };
inline constexpr int kTimedOps = 3;

// How a request reached the daemon: gRPC (either socket), or the engine
// socket (common/fast_lookup.h), which libkvtier speaks.
enum class Transport : uint8_t { kGrpc = 0, kEngine = 1 };
inline constexpr int kTransports = 2;

namespace internal {
constexpr bool StrEq(const char* a, const char* b) {
  while (*a != '\0' && *a == *b) {
    ++a;
    ++b;
  }
  return *a == *b;
}
}  // namespace internal

// Returns the TimedOp of the TierService method named `method` ("Lookup"),
// kNone for methods that are not timed. Constant-folded for literals.
constexpr TimedOp TimedOpOf(const char* method) {
  if (internal::StrEq(method, "Lookup")) return TimedOp::kLookup;
  if (internal::StrEq(method, "Commit")) return TimedOp::kCommit;
  if (internal::StrEq(method, "Attach")) return TimedOp::kAttach;
  return TimedOp::kNone;
}

// Receives one observation per timed request.
class LatencySink {
 public:
  virtual ~LatencySink() = default;
  // Records that a request of `op` over `transport` took `seconds` and
  // succeeded (`ok`) or was answered with an error. REQUIRES: op != kNone.
  // Called on request threads: must be thread-safe and must not block.
  virtual void Observe(TimedOp op, Transport transport, double seconds,
                       bool ok) = 0;
};

namespace internal {
inline std::atomic<LatencySink*> latency_sink{nullptr};
}  // namespace internal

// Installs the process-wide sink (nullptr uninstalls). REQUIRES: the sink
// outlives every request that may have read it: install before serving,
// uninstall after the servers have stopped.
inline void SetLatencySink(LatencySink* sink) {
  internal::latency_sink.store(sink, std::memory_order_release);
}

// Returns the installed sink, or nullptr.
inline LatencySink* GetLatencySink() {
  return internal::latency_sink.load(std::memory_order_acquire);
}

// Times one request from construction to Done(). Without a sink installed at
// construction (or for TimedOp::kNone) it reads no clock and records nothing.
// Not copyable; use on one thread.
class OpTimer {
 public:
  OpTimer(TimedOp op, Transport transport)
      : sink_(op == TimedOp::kNone ? nullptr : GetLatencySink()),
        op_(op),
        transport_(transport) {
    if (sink_ != nullptr) start_ = std::chrono::steady_clock::now();
  }
  OpTimer(const OpTimer&) = delete;
  OpTimer& operator=(const OpTimer&) = delete;

  // Records the elapsed time with the request's outcome. Only the first call
  // records; a timer never Done records nothing.
  void Done(bool ok) {
    if (sink_ == nullptr) return;
    const std::chrono::duration<double> took =
        std::chrono::steady_clock::now() - start_;
    sink_->Observe(op_, transport_, took.count(), ok);
    sink_ = nullptr;
  }

 private:
  LatencySink* sink_;
  const TimedOp op_;
  const Transport transport_;
  std::chrono::steady_clock::time_point start_;
};

// Connections the fast lookup server closed, by why
// (kvtier_fast_lookup_connections_closed_total{reason}): before serving
// them, no first frame whole within the Hello deadline, the peer uid's or
// the server's pending cap made room for a newer one, the served-connection
// cap, a malformed Hello, out of fds in accept; once served, a call
// connection idle past the idle timeout, a frame not whole within the frame
// deadline.
enum class FastLookupClose : uint8_t {
  kHelloDeadline = 0,
  kUidCap = 1,
  kPendingCap = 2,
  kServedCap = 3,
  kBadHello = 4,
  kNoFds = 5,
  kIdle = 6,
  kFrameDeadline = 7,
};
inline constexpr int kFastLookupCloseReasons = 8;
inline constexpr const char* kFastLookupCloseNames[kFastLookupCloseReasons] = {
    "hello_deadline", "uid_cap", "pending_cap", "served_cap",
    "bad_hello",      "no_fds",  "idle",        "frame_deadline"};

namespace internal {
inline std::atomic<uint64_t> fast_lookup_closed[kFastLookupCloseReasons] = {};
// [0] pending (awaiting a Hello), [1] served.
inline std::atomic<int64_t> fast_lookup_connections[2] = {};
}  // namespace internal

// Counts one close of `why`. Thread-safe, lock-free; process-wide (every
// FastLookupServer of the process adds to the same counters).
inline void CountFastLookupClose(FastLookupClose why) {
  internal::fast_lookup_closed[static_cast<int>(why)].fetch_add(
      1, std::memory_order_relaxed);
}
// The closes of `why` counted so far in this process.
inline uint64_t FastLookupClosed(FastLookupClose why) {
  return internal::fast_lookup_closed[static_cast<int>(why)].load(
      std::memory_order_relaxed);
}
// Adds `pending` and `served` to the fast lookup connection gauges.
inline void AddFastLookupConnections(int64_t pending, int64_t served) {
  internal::fast_lookup_connections[0].fetch_add(pending,
                                                 std::memory_order_relaxed);
  internal::fast_lookup_connections[1].fetch_add(served,
                                                 std::memory_order_relaxed);
}

// gRPC connections the gate (daemon/grpc_gate.h) closed, by why
// (kvtier_grpc_connections_closed_total{reason}): refused at accept by the
// uid's or the server's cap, no HTTP/2 preface within the deadline, bytes
// that are not the preface, out of fds.
enum class GrpcClose : uint8_t {
  kUidCap = 0,
  kCap = 1,
  kPrefaceDeadline = 2,
  kBadPreface = 3,
  kNoFds = 4,
};
inline constexpr int kGrpcCloseReasons = 5;
inline constexpr const char* kGrpcCloseNames[kGrpcCloseReasons] = {
    "uid_cap", "cap", "preface_deadline", "bad_preface", "no_fds"};

namespace internal {
inline std::atomic<uint64_t> grpc_closed[kGrpcCloseReasons] = {};
// [0] waiting for their preface, [1] served.
inline std::atomic<int64_t> grpc_connections[2] = {};
}  // namespace internal

// Counts one close of `why`. Thread-safe, lock-free; process-wide.
inline void CountGrpcClose(GrpcClose why) {
  internal::grpc_closed[static_cast<int>(why)].fetch_add(
      1, std::memory_order_relaxed);
}
// The closes of `why` counted so far in this process.
inline uint64_t GrpcClosed(GrpcClose why) {
  return internal::grpc_closed[static_cast<int>(why)].load(
      std::memory_order_relaxed);
}
// Adds `waiting` and `served` to the gRPC connection gauges.
inline void AddGrpcConnections(int64_t waiting, int64_t served) {
  internal::grpc_connections[0].fetch_add(waiting, std::memory_order_relaxed);
  internal::grpc_connections[1].fetch_add(served, std::memory_order_relaxed);
}

// The daemon's Prometheus metrics (see docs/operations.md for the list).
class MetricsExporter final : public LatencySink {
 public:
  // Upper bounds (seconds) of the latency histograms' buckets: lookups and
  // commits take tens of microseconds to milliseconds, attaches that create
  // a namespace seconds (the daemon populates the banks).
  static constexpr double kRequestBuckets[] = {
      10e-6, 25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3,
      10e-3, 25e-3, 50e-3, 100e-3, 250e-3, 1,      2.5,  10,     30};
  static constexpr int kBuckets =
      sizeof(kRequestBuckets) / sizeof(kRequestBuckets[0]);

  // REQUIRES: `core` outlives this exporter.
  explicit MetricsExporter(TierCore* core);
  ~MetricsExporter() override;  // Stops serving.
  MetricsExporter(const MetricsExporter&) = delete;
  MetricsExporter& operator=(const MetricsExporter&) = delete;

  // Serves GET /metrics on `address` ("host:port"; port 0 picks a free
  // one). INVALID_ARGUMENT naming --metrics_address for a malformed address;
  // UNAVAILABLE when it cannot bind (the port is taken). REQUIRES: not
  // serving.
  absl::Status Start(const std::string& address);
  // The bound port once Start succeeded, else 0.
  int port() const;
  // Stops serving; Render keeps working. Idempotent.
  void Stop();

  // The current metrics in the Prometheus text format: exactly what a scrape
  // of /metrics returns.
  std::string Render() const;

  void Observe(TimedOp op, Transport transport, double seconds,
               bool ok) override;

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_METRICS_H_
