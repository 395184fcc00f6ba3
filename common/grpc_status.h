// The one mapping between absl::Status and grpc::Status: the daemon's gRPC
// service adapter and the tests use it. libkvtier speaks no gRPC: the engine
// protocol (common/fast_lookup.h) carries the code, the message and the
// ErrorReason in its own replies.
//
// absl and gRPC share the canonical code numbering, so the mapping keeps the
// code and the message. An absl status's payloads (such as the reason of
// common/error_reason.h) travel in grpc::Status::error_details, which gRPC
// sends as the grpc-status-details-bin trailer, encoded as a google.rpc.Status
// (1: code, 2: message, 3: details, each a google.protobuf.Any of 1: type_url
// and 2: value) as gRPC's convention has it, so gRPC tools can read them. The
// bytes are written and read with protobuf's wire-format primitives rather
// than generated code: nothing here registers google/rpc/status.proto in the
// process's descriptor pool, where an engine may already have its own copy.
//
// Thread-safety: pure functions.
#ifndef KVTIER_COMMON_GRPC_STATUS_H_
#define KVTIER_COMMON_GRPC_STATUS_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "grpcpp/support/status.h"

namespace kvtier {
namespace grpc_status_internal {

// Protobuf wire types and the tags of google.rpc.Status and Any.
inline constexpr uint32_t kVarint = 0, kFixed64 = 1, kBytes = 2, kFixed32 = 5;
inline constexpr uint32_t Tag(uint32_t field, uint32_t wire_type) {
  return field << 3 | wire_type;
}

inline void WriteBytes(google::protobuf::io::CodedOutputStream* out,
                       uint32_t field, absl::string_view bytes) {
  out->WriteTag(Tag(field, kBytes));
  out->WriteVarint32(static_cast<uint32_t>(bytes.size()));
  out->WriteRaw(bytes.data(), static_cast<int>(bytes.size()));
}

inline bool ReadBytes(google::protobuf::io::CodedInputStream* in,
                      std::string* bytes) {
  uint32_t size = 0;
  return in->ReadVarint32(&size) &&
         in->ReadString(bytes, static_cast<int>(size));
}

// Skips the field of `tag`; false on malformed input (or a group).
inline bool SkipField(google::protobuf::io::CodedInputStream* in,
                      uint32_t tag) {
  uint64_t varint = 0;
  uint32_t size = 0;
  switch (tag & 7) {
    case kVarint:
      return in->ReadVarint64(&varint);
    case kFixed64:
      return in->Skip(8);
    case kBytes:
      return in->ReadVarint32(&size) && in->Skip(static_cast<int>(size));
    case kFixed32:
      return in->Skip(4);
    default:
      return false;
  }
}

// google.rpc.Status of `s`, its payloads as the details.
inline std::string EncodeDetails(const absl::Status& s) {
  std::string bytes;
  {
    google::protobuf::io::StringOutputStream raw(&bytes);
    google::protobuf::io::CodedOutputStream out(&raw);
    out.WriteTag(Tag(1, kVarint));
    out.WriteVarint32SignExtended(static_cast<int32_t>(s.code()));
    WriteBytes(&out, 2, s.message());
    s.ForEachPayload([&out](absl::string_view url, const absl::Cord& value) {
      const std::string v(value);
      std::string any;
      {
        google::protobuf::io::StringOutputStream any_raw(&any);
        google::protobuf::io::CodedOutputStream any_out(&any_raw);
        WriteBytes(&any_out, 1, url);
        WriteBytes(&any_out, 2, v);
      }
      WriteBytes(&out, 3, any);
    });
  }
  return bytes;
}

// Adds the details of google.rpc.Status `bytes` to `s` as payloads. Input
// that is not a well-formed google.rpc.Status adds what came before the
// damage: the code and message stand either way.
inline void DecodeDetails(absl::string_view bytes, absl::Status* s) {
  google::protobuf::io::CodedInputStream in(
      reinterpret_cast<const uint8_t*>(bytes.data()),
      static_cast<int>(bytes.size()));
  while (const uint32_t tag = in.ReadTag()) {
    if (tag != Tag(3, kBytes)) {
      if (!SkipField(&in, tag)) return;
      continue;
    }
    std::string any;
    if (!ReadBytes(&in, &any)) return;
    google::protobuf::io::CodedInputStream any_in(
        reinterpret_cast<const uint8_t*>(any.data()),
        static_cast<int>(any.size()));
    std::string url, value;
    bool ok = true;
    while (const uint32_t t = any_in.ReadTag()) {
      if (t == Tag(1, kBytes)) {
        ok = ReadBytes(&any_in, &url);
      } else if (t == Tag(2, kBytes)) {
        ok = ReadBytes(&any_in, &value);
      } else {
        ok = SkipField(&any_in, t);
      }
      if (!ok) break;
    }
    if (ok && !url.empty()) s->SetPayload(url, absl::Cord(value));
  }
}

}  // namespace grpc_status_internal

// Returns the gRPC status with the code, message and payloads of `s`.
inline grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  bool has_payload = false;
  s.ForEachPayload([&has_payload](absl::string_view, const absl::Cord&) {
    has_payload = true;
  });
  return grpc::Status(
      static_cast<grpc::StatusCode>(s.code()), std::string(s.message()),
      has_payload ? grpc_status_internal::EncodeDetails(s) : std::string());
}

// Returns the absl status with the code, message and payloads of `s`; the
// message is prefixed with "<context>: " when `context` (what failed, e.g.
// the RPC's name) is not empty.
inline absl::Status FromGrpcStatus(const grpc::Status& s,
                                   absl::string_view context = {}) {
  if (s.ok()) return absl::OkStatus();
  absl::Status out(static_cast<absl::StatusCode>(s.error_code()),
                   context.empty()
                       ? s.error_message()
                       : absl::StrCat(context, ": ", s.error_message()));
  if (!s.error_details().empty()) {
    grpc_status_internal::DecodeDetails(s.error_details(), &out);
  }
  return out;
}

}  // namespace kvtier

#endif  // KVTIER_COMMON_GRPC_STATUS_H_
