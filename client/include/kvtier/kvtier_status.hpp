// The value types of libkvtier's C++ layer (kvtier/kvtier.hpp, which
// includes this file): Status and Result<T> (errors as values, no
// exceptions), Span<T> (C++17 has no std::span), and the internal helpers
// every other kvtier_*.hpp header shares: the move-only owner of one kvt_*
// handle and the checks of packed hash chains. C++17 standard library and
// kvtier/kvtier.h only.
//
// Thread-safety: Status, Result and Span are plain values (a Span views
// memory it does not own: valid while that memory is). An internal::Handle
// is as thread-safe as the kvt_* handle it owns.
#ifndef KVTIER_KVTIER_STATUS_HPP_
#define KVTIER_KVTIER_STATUS_HPP_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kvtier/kvtier.h"

namespace kvtier {

// The canonical status codes (kvt_status; the same numbers as gRPC).
enum class StatusCode : int {
  kOk = KVT_OK,
  kCancelled = KVT_CANCELLED,
  kUnknown = KVT_UNKNOWN,
  kInvalidArgument = KVT_INVALID_ARGUMENT,
  kDeadlineExceeded = KVT_DEADLINE_EXCEEDED,
  kNotFound = KVT_NOT_FOUND,
  kAlreadyExists = KVT_ALREADY_EXISTS,
  kPermissionDenied = KVT_PERMISSION_DENIED,
  kResourceExhausted = KVT_RESOURCE_EXHAUSTED,
  kFailedPrecondition = KVT_FAILED_PRECONDITION,
  kAborted = KVT_ABORTED,
  kOutOfRange = KVT_OUT_OF_RANGE,
  kUnimplemented = KVT_UNIMPLEMENTED,
  kInternal = KVT_INTERNAL,
  kUnavailable = KVT_UNAVAILABLE,
  kDataLoss = KVT_DATA_LOSS,
  kUnauthenticated = KVT_UNAUTHENTICATED,
};

// A call's outcome: OK, or a code and a message naming what failed.
class Status {
 public:
  Status() = default;  // OK.
  Status(StatusCode code, std::string message)
      : code_(code),
        message_(code == StatusCode::kOk ? "" : std::move(message)) {}
  // The outcome of a C call that returned `s` on this thread: its message is
  // kvt_last_error(), read now (before the thread's next call replaces it).
  static Status FromC(kvt_status s) {
    if (s == KVT_OK) return Status();
    return Status(static_cast<StatusCode>(s), kvt_last_error());
  }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

// Either a T or the non-OK Status that says why there is none.
template <typename T>
class Result {
 public:
  // REQUIRES: !status.ok() (an OK status without a value is UNKNOWN).
  Result(Status status)  // NOLINT: implicit, as absl::StatusOr.
      : status_(status.ok() ? Status(StatusCode::kUnknown,
                                     "Result made from an OK Status")
                            : std::move(status)) {}
  Result(T value) : value_(std::move(value)) {}  // NOLINT: implicit.

  bool ok() const { return value_.has_value(); }
  // OK when a value is held.
  const Status& status() const { return status_; }
  // REQUIRES: ok().
  T& value() & { return *value_; }
  const T& value() const& { return *value_; }
  T&& value() && { return *std::move(value_); }
  T& operator*() & { return *value_; }
  const T& operator*() const& { return *value_; }
  T&& operator*() && { return *std::move(value_); }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }

 private:
  Status status_;
  std::optional<T> value_;
};

// A read-only view of `size` elements (C++17 has no std::span).
template <typename T>
class Span {
 public:
  Span() = default;
  Span(const T* data, size_t size) : data_(data), size_(size) {}
  Span(const std::vector<T>& v)  // NOLINT: implicit, as absl::Span.
      : data_(v.data()), size_(v.size()) {}
  const T* data() const { return data_; }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  const T* begin() const { return data_; }
  const T* end() const { return data_ + size_; }
  const T& operator[](size_t i) const { return data_[i]; }

 private:
  const T* data_ = nullptr;
  size_t size_ = 0;
};

namespace internal {

// Owns one kvt_* handle; `Free` releases it. Move-only.
template <typename H, void (*Free)(H*)>
class Handle {
 public:
  Handle() = default;
  explicit Handle(H* h) : h_(h) {}
  Handle(Handle&& o) noexcept : h_(std::exchange(o.h_, nullptr)) {}
  Handle& operator=(Handle&& o) noexcept {
    if (this != &o) {
      reset();
      h_ = std::exchange(o.h_, nullptr);
    }
    return *this;
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  ~Handle() { reset(); }

  H* get() const { return h_; }
  // Gives the handle up (the C call that consumed it freed it).
  H* release() { return std::exchange(h_, nullptr); }
  void reset() {
    if (h_ != nullptr) Free(std::exchange(h_, nullptr));
  }

 private:
  H* h_ = nullptr;
};

inline const uint8_t* Bytes(std::string_view s) {
  return reinterpret_cast<const uint8_t*>(s.data());
}
// *n = hashes.size() / hash_bytes; INVALID_ARGUMENT when that leaves a rest.
inline Status CountHashes(std::string_view hashes, uint32_t hash_bytes,
                          size_t* n) {
  if (hash_bytes == 0 || hashes.size() % hash_bytes != 0) {
    return Status(StatusCode::kInvalidArgument,
                  "hashes: " + std::to_string(hashes.size()) +
                      " bytes, not a multiple of hash_bytes " +
                      std::to_string(hash_bytes));
  }
  *n = hashes.size() / hash_bytes;
  return Status();
}

}  // namespace internal
}  // namespace kvtier

#endif  // KVTIER_KVTIER_STATUS_HPP_
