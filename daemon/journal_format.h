// The namespace journal's bytes on disk (daemon/journal.h says what the
// records mean and how a replay ends): the records' layouts, their framing,
// the encoders the writer uses and the bounds-checked decoding the reader
// uses. Internal to the journal's files (journal_*.cc), not its interface.
//
//   file    = magic "KVTJRNL1" | header record | record...
//   record  = u32 length of (type + payload) | u32 CRC-32C of (type +
//             payload) (common/crc32c.h) | u8 type | payload
//
// Integers are little-endian (the hosts are, see bank_header.h); a string is
// u32 length | bytes; a hash is the layout's hash_bytes (32 for SHA-256, 16
// for XXH3-128); a row is u32, kNoRow where none. The payloads:
//
//   kHeader  str name | str layout (serialized v1::Layout) | u64 page_rows |
//            u64 snapshot_rows | u32 max_replay_tokens | u32 segments |
//            segments x (str bank | u32 rank | str path | u64
//            created_unix_ns)
//   kNodes   u32 count (at most kNodesPerRecord) | count x (u32 parent: its
//            ordinal in the checkpoint, or kNoNode | hash | u64 last use |
//            ranks x page row | hybrid only: ranks x snapshot row)
//   kReserve u32 rank | u32 n | n x page row | u32 m | m x snapshot row
//   kCommit  u32 rank | u8 has parent | the parent's hash if it has one |
//            u32 n | n x (hash | page row, kNoRow: deduplicated) | u32 m |
//            m x (hash | snapshot row, kNoRow: deduplicated)
//   kDrop    hash
//   kRelease u32 rank | u32 n | n x page row | u32 m | m x snapshot row
//            (as kReserve; since v3, see journal.h)
//
// "ranks" is the stored ranks (StoredRanks); "hybrid": snapshot_rows > 0.
// These bytes are what journals already on disk hold: change nothing here
// without a new magic or record type, and add a fixture for it (testdata/).
//
// Thread-safety: the functions are pure and thread-safe; a Cursor is a
// value for one thread at a time.
#ifndef KVTIER_DAEMON_JOURNAL_FORMAT_H_
#define KVTIER_DAEMON_JOURNAL_FORMAT_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "daemon/journal.h"
#include "daemon/prefix_index.h"
#include "kvtier/v1/tier.pb.h"

namespace kvtier::daemon::journal_internal {

// The file's first 8 bytes.
inline constexpr char kMagic[8] = {'K', 'V', 'T', 'J', 'R', 'N', 'L', '1'};

enum RecordType : uint8_t {
  kHeader = 1,
  kNodes = 2,
  kReserve = 3,
  kCommit = 4,
  kDrop = 5,
  kRelease = 6,
};

// Record framing: u32 length of (type + payload), u32 CRC-32C of them.
inline constexpr size_t kFrameBytes = 8;
// Larger records are corrupt: a commit of kMaxReservePages 32-byte hashes
// with rows is about 36 MiB.
inline constexpr uint32_t kMaxRecordBytes = 256u << 20;
// Nodes per checkpoint record.
inline constexpr uint32_t kNodesPerRecord = 16384;
// Rows (of each bank) per checkpoint reservation record.
inline constexpr size_t kRowsPerReserveRecord = 1 << 20;
// Header limits.
inline constexpr uint32_t kMaxLayoutBytes = 1 << 20;
inline constexpr uint32_t kMaxSegments = 4096;
inline constexpr uint32_t kMaxBankName = 64;
inline constexpr uint32_t kMaxSegmentPath = 4096;

// Returns the ranks whose rows the journal stores: 1 for a replicated
// layout, else its tp_size.
uint32_t StoredRanks(const v1::Layout& layout);

// ------------------------------------------------------------ encoding --

inline void PutU8(std::string* out, uint8_t v) {
  out->push_back(static_cast<char>(v));
}
inline void PutU32(std::string* out, uint32_t v) {
  char b[4];
  std::memcpy(b, &v, 4);  // Little-endian hosts only (see bank_header.h).
  out->append(b, 4);
}
inline void PutU64(std::string* out, uint64_t v) {
  char b[8];
  std::memcpy(b, &v, 8);
  out->append(b, 8);
}
inline void PutString(std::string* out, absl::string_view s) {
  PutU32(out, static_cast<uint32_t>(s.size()));
  out->append(s.data(), s.size());
}
inline void PutHash(std::string* out, const HashKey& k, uint32_t hash_bytes) {
  out->append(reinterpret_cast<const char*>(k.bytes.data()), hash_bytes);
}

// Appends a framed record of `type` holding `payload` to `out`.
void Frame(std::string* out, uint8_t type, absl::string_view payload);
// Appends a kReserve payload to `out` (a kRelease payload is the same).
void EncodeReserve(std::string* out, uint32_t rank,
                   absl::Span<const uint32_t> page_rows,
                   absl::Span<const uint32_t> snapshot_rows);
// Returns the kHeader payload of `h`.
std::string EncodeHeader(const JournalHeader& h);

// ------------------------------------------------------------ decoding --

// Bounds-checked reads from one record's payload. Any read past the end
// marks the cursor failed and yields zeros (or an empty view).
class Cursor {
 public:
  Cursor(const uint8_t* p, size_t n) : p_(p), n_(n) {}
  bool ok() const { return ok_; }
  bool done() const { return n_ == 0; }
  size_t left() const { return n_; }
  uint8_t U8() {
    uint8_t v = 0;
    Read(&v, 1);
    return v;
  }
  uint32_t U32() {
    uint32_t v = 0;
    Read(&v, 4);
    return v;
  }
  uint64_t U64() {
    uint64_t v = 0;
    Read(&v, 8);
    return v;
  }
  HashKey Hash(uint32_t hash_bytes) {
    HashKey k;
    Read(k.bytes.data(), hash_bytes);
    return k;
  }
  // The next `n` bytes, valid while the record's memory is.
  absl::string_view Bytes(size_t n) {
    if (!ok_ || n > n_) {
      ok_ = false;
      return {};
    }
    absl::string_view s(reinterpret_cast<const char*>(p_), n);
    p_ += n;
    n_ -= n;
    return s;
  }

 private:
  void Read(void* dst, size_t n) {
    if (!ok_ || n > n_) {
      ok_ = false;
      return;
    }
    std::memcpy(dst, p_, n);
    p_ += n;
    n_ -= n;
  }
  const uint8_t* p_;
  size_t n_;
  bool ok_ = true;
};

enum class NextStatus { kRecord, kEnd, kTorn, kCorrupt };

// Reads the record framed at `*pos` of the file's `size` bytes at `data`.
// kRecord: its type and payload (CRC verified), `*pos` moved past it.
// kEnd: `*pos` is the end of the file. kTorn / kCorrupt (the rule at the top
// of daemon/journal.h): `*why` says why and at which offset; `*pos` stays.
NextStatus NextRecord(const uint8_t* data, size_t size, size_t* pos,
                      uint8_t* type, Cursor* payload, std::string* why);

// Reads a count (u32) of items of at least `item_bytes` bytes each, and
// checks that that many can fit in what is left of the record: DATA_LOSS
// naming `field` otherwise. Call it before sizing anything by the count.
absl::Status ReadCount(Cursor& c, size_t item_bytes, absl::string_view field,
                       uint32_t* count);

// Decodes a kHeader payload into `*h` (its layout normalized) and checks
// every field: DATA_LOSS naming the first one out of range.
absl::Status DecodeHeader(Cursor& c, JournalHeader* h);

// INTERNAL "journal: <what> <path>: <strerror(errno)>".
absl::Status Errno(absl::string_view what, const std::string& path);

}  // namespace kvtier::daemon::journal_internal

#endif  // KVTIER_DAEMON_JOURNAL_FORMAT_H_
