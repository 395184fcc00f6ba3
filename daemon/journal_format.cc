// The journal's record format: framing, the header's encoding and decoding,
// and the bounds-checked reads the replay builds on (journal_format.h).
// Thread-safety: pure functions.
#include "daemon/journal_format.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "daemon/namespace_layout.h"

namespace kvtier::daemon::journal_internal {
namespace {

// Reads a string of at most `max` bytes (u32 length, bytes) named `field`.
absl::Status ReadString(Cursor& c, uint32_t max, absl::string_view field,
                        std::string* out) {
  const uint32_t n = c.U32();
  if (!c.ok()) return absl::DataLossError(absl::StrCat(field, ": truncated"));
  if (n > max || n > c.left()) {
    return absl::DataLossError(
        absl::StrCat(field, ": length ", n, " is over the limit of ", max,
                     " or the record's ", c.left(), " bytes left"));
  }
  *out = std::string(c.Bytes(n));
  return absl::OkStatus();
}

}  // namespace

uint32_t StoredRanks(const v1::Layout& layout) {
  return layout.replicated() ? 1 : std::max<uint32_t>(1, layout.tp_size());
}

absl::Status Errno(absl::string_view what, const std::string& path) {
  return absl::InternalError(
      absl::StrCat("journal: ", what, " ", path, ": ", std::strerror(errno)));
}

// ------------------------------------------------------------ encoding --

void Frame(std::string* out, uint8_t type, absl::string_view payload) {
  const uint32_t length = static_cast<uint32_t>(payload.size() + 1);
  const uint8_t t = type;
  uint32_t crc = Crc32c(&t, 1);
  crc = Crc32c(payload.data(), payload.size(), crc);
  PutU32(out, length);
  PutU32(out, crc);
  PutU8(out, type);
  out->append(payload.data(), payload.size());
}

void EncodeReserve(std::string* out, uint32_t rank,
                   absl::Span<const uint32_t> page_rows,
                   absl::Span<const uint32_t> snapshot_rows) {
  PutU32(out, rank);
  PutU32(out, static_cast<uint32_t>(page_rows.size()));
  for (uint32_t row : page_rows) PutU32(out, row);
  PutU32(out, static_cast<uint32_t>(snapshot_rows.size()));
  for (uint32_t row : snapshot_rows) PutU32(out, row);
}

std::string EncodeHeader(const JournalHeader& h) {
  std::string out;
  PutString(&out, h.name);
  std::string layout;
  h.layout.SerializeToString(&layout);
  PutString(&out, layout);
  PutU64(&out, h.page_rows);
  PutU64(&out, h.snapshot_rows);
  PutU32(&out, h.max_replay_tokens);
  PutU32(&out, static_cast<uint32_t>(h.segments.size()));
  for (const JournalSegment& s : h.segments) {
    PutString(&out, s.bank);
    PutU32(&out, s.rank);
    PutString(&out, s.path);
    PutU64(&out, s.created_unix_ns);
  }
  return out;
}

// ------------------------------------------------------------ decoding --

NextStatus NextRecord(const uint8_t* data, size_t size, size_t* pos,
                      uint8_t* type, Cursor* payload, std::string* why) {
  const size_t at = *pos;
  if (at == size) return NextStatus::kEnd;
  const size_t left = size - at;
  // Zeros from `from` to the end: a tail the file system extended but
  // never wrote (a machine crash), not records.
  auto zeros_from = [&](size_t from) {
    return std::all_of(data + from, data + size,
                       [](uint8_t b) { return b == 0; });
  };
  if (left < kFrameBytes + 1) {
    *why = absl::StrCat("torn record at offset ", at, ": ", left,
                        " bytes, fewer than a record's frame");
    return NextStatus::kTorn;
  }
  uint32_t length, crc;
  std::memcpy(&length, data + at, 4);
  std::memcpy(&crc, data + at + 4, 4);
  if (length == 0 && zeros_from(at)) {
    *why = absl::StrCat("torn record at offset ", at, ": the last ", left,
                        " bytes of the file are zeros");
    return NextStatus::kTorn;
  }
  // A torn write leaves a prefix of a record the daemon wrote, whose length
  // field is in range.
  if (length == 0 || length > kMaxRecordBytes) {
    *why = absl::StrCat("corrupt record at offset ", at, ": length ", length,
                        " out of range 1..", kMaxRecordBytes);
    return NextStatus::kCorrupt;
  }
  if (length > left - kFrameBytes) {
    *why = absl::StrCat("torn record at offset ", at, ": length ", length,
                        " runs past the end of the file (", left - kFrameBytes,
                        " bytes left)");
    return NextStatus::kTorn;
  }
  const uint8_t* body = data + at + kFrameBytes;
  const size_t end = at + kFrameBytes + length;
  if (Crc32c(body, length) != crc) {
    if (end == size || zeros_from(end)) {
      *why = absl::StrCat("torn record at offset ", at,
                          ": CRC mismatch in the file's last record");
      return NextStatus::kTorn;
    }
    *why = absl::StrCat("corrupt record at offset ", at, ": CRC mismatch, ",
                        size - end, " bytes of the file after it");
    return NextStatus::kCorrupt;
  }
  *type = body[0];
  *payload = Cursor(body + 1, length - 1);
  *pos = end;
  return NextStatus::kRecord;
}

absl::Status ReadCount(Cursor& c, size_t item_bytes, absl::string_view field,
                       uint32_t* count) {
  *count = c.U32();
  if (!c.ok()) return absl::DataLossError(absl::StrCat(field, ": truncated"));
  if (item_bytes > 0 && *count > c.left() / item_bytes) {
    return absl::DataLossError(absl::StrCat(
        field, ": ", *count, " entries of at least ", item_bytes,
        " bytes cannot fit in the record's ", c.left(), " bytes left"));
  }
  return absl::OkStatus();
}

absl::Status DecodeHeader(Cursor& c, JournalHeader* h) {
  std::string layout;
  if (absl::Status s =
          ReadString(c, kMaxNamespaceName, "header.name", &h->name);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = ReadString(c, kMaxLayoutBytes, "header.layout", &layout);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = ValidateNamespaceName(h->name, "header.name"); !s.ok()) {
    return absl::DataLossError(s.message());
  }
  v1::Layout raw;
  if (!raw.ParseFromString(layout)) {
    return absl::DataLossError("header.layout: does not parse");
  }
  if (absl::Status s = ValidateLayout(raw); !s.ok()) {
    return absl::DataLossError(absl::StrCat("header.", s.message()));
  }
  h->layout = NormalizeLayout(raw);
  h->page_rows = c.U64();
  h->snapshot_rows = c.U64();
  h->max_replay_tokens = c.U32();
  if (!c.ok()) return absl::DataLossError("header: truncated bank sizes");
  // A segment takes at least its two lengths, rank and time stamp.
  uint32_t segments = 0;
  if (absl::Status s = ReadCount(c, 20, "header.segments", &segments);
      !s.ok()) {
    return s;
  }
  if (segments > kMaxSegments) {
    return absl::DataLossError(absl::StrCat(
        "header.segments: ", segments, " is over the limit of ", kMaxSegments));
  }
  h->segments.reserve(segments);
  for (uint32_t i = 0; i < segments; ++i) {
    const std::string field = absl::StrCat("header.segments[", i, "]");
    JournalSegment s;
    if (absl::Status e = ReadString(c, kMaxBankName, field + ".bank", &s.bank);
        !e.ok()) {
      return e;
    }
    s.rank = c.U32();
    if (absl::Status e =
            ReadString(c, kMaxSegmentPath, field + ".path", &s.path);
        !e.ok()) {
      return e;
    }
    s.created_unix_ns = c.U64();
    if (!c.ok()) return absl::DataLossError(absl::StrCat(field, ": truncated"));
    h->segments.push_back(std::move(s));
  }
  if (h->page_rows == 0 || h->page_rows >= kNoRow) {
    return absl::DataLossError(absl::StrCat("header.page_rows: ", h->page_rows,
                                            " out of range 1..", kNoRow - 1));
  }
  if (h->snapshot_rows >= kNoRow) {
    return absl::DataLossError(
        absl::StrCat("header.snapshot_rows: ", h->snapshot_rows,
                     " out of range 0..", kNoRow - 1));
  }
  if ((h->snapshot_rows > 0) != (h->layout.snapshot_row_bytes() > 0)) {
    return absl::DataLossError(
        "header.snapshot_rows: disagrees with layout.snapshot_row_bytes");
  }
  return absl::OkStatus();
}

}  // namespace kvtier::daemon::journal_internal
