// The on-segment header of a kvtier bank: the first kHeaderBytes of every
// segment file, written once by the process that creates the segment (the
// daemon) and read by every process that maps it (engines, kvtierctl, a
// restarted daemon). Its layout is a cross-process, cross-build contract: the
// field offsets are pinned by static_asserts below, and any change to them
// must bump kHeaderVersion.
//
// Thread-safety: every field except `state` is written only while the
// segment is private to its creator (before it is published under its final
// name) and is immutable afterwards, so readers need no synchronisation once
// they have observed `state == kStateReady` with acquire order.

#ifndef KVTIER_SHM_BANK_HEADER_H_
#define KVTIER_SHM_BANK_HEADER_H_

#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace kvtier::shm {

// Every row starts at a multiple of this many bytes from data_offset, so the
// copy kernels can use 16-byte vector accesses on any row.
inline constexpr uint64_t kRowAlign = 16;

// Bytes reserved for the header at offset 0; also the data_offset of every
// segment (4 KiB-page and huge-page alike), so rows are 4 KiB aligned.
inline constexpr uint64_t kHeaderBytes = 4096;

// The only huge-page size kvtier places banks on (x86-64 and arm64 PMD size).
inline constexpr uint64_t kHugePageBytes = 2ull << 20;

// Largest data area (rows * row_stride) of one bank: 16 TiB. Far above any
// host's RAM; it exists so that size arithmetic can never overflow.
inline constexpr uint64_t kMaxDataBytes = 16ull << 40;

// "KVTIERB1" read as a little-endian u64: the file's first eight bytes spell
// the string, so `head -c8` identifies a bank.
inline constexpr uint64_t kMagic = uint64_t{'K'} | uint64_t{'V'} << 8 |
                                   uint64_t{'T'} << 16 | uint64_t{'I'} << 24 |
                                   uint64_t{'E'} << 32 | uint64_t{'R'} << 40 |
                                   uint64_t{'B'} << 48 | uint64_t{'1'} << 56;

// Layout version of BankHeader. A reader refuses any other version.
inline constexpr uint32_t kHeaderVersion = 1;

// BankHeader::flags bits.
inline constexpr uint32_t kFlagHugePages = 1;  // file lives on hugetlbfs
inline constexpr uint32_t kKnownFlags = kFlagHugePages;

// BankHeader::state values.
inline constexpr uint32_t kStateInitialising = 0;
inline constexpr uint32_t kStateReady = 1;

// Capacities of the NUL-terminated name fields, terminator included.
inline constexpr size_t kNamespaceNameCapacity = 129;  // 1..128 chars
inline constexpr size_t kBankNameCapacity = 33;        // 1..32 chars

// The header at offset 0 of a segment. All integers are little-endian
// (host order; kvtier supports little-endian hosts only). Invariants of a
// valid, ready header:
//   magic == kMagic, version == kHeaderVersion,
//   header_bytes == data_offset == kHeaderBytes,
//   rows >= 1, row_bytes >= 1, row_stride == round_up(row_bytes, kRowAlign),
//   rows * row_stride <= kMaxDataBytes,
//   data_offset + rows * row_stride <= file_bytes == size of the file,
//   (flags & kFlagHugePages) implies file_bytes % kHugePageBytes == 0,
//   namespace_name and bank are non-empty and NUL-terminated.
struct BankHeader {
  uint64_t magic;
  uint32_t version;
  uint32_t header_bytes;
  uint64_t rows;
  uint64_t row_bytes;
  uint64_t row_stride;
  uint64_t data_offset;
  uint64_t file_bytes;
  uint32_t rank;
  uint32_t flags;  // kFlag* bits
  uint64_t created_unix_ns;
  uint8_t layout_fingerprint[32];
  char namespace_name[kNamespaceNameCapacity];  // NUL-terminated
  char bank[kBankNameCapacity];                 // NUL-terminated
  // kStateInitialising or kStateReady. One writer: the creating process (the
  // daemon), which stores kStateReady with release order as its last write,
  // after population and every other field. Readers load it with acquire
  // order before trusting anything else in the segment.
  std::atomic<uint32_t> state;
};

static_assert(std::endian::native == std::endian::little,
              "BankHeader is defined as little-endian");
static_assert(std::is_standard_layout_v<BankHeader>);
static_assert(std::atomic<uint32_t>::is_always_lock_free,
              "state is shared across processes: it must be lock-free");
static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t));
static_assert(sizeof(BankHeader) <= kHeaderBytes);
// Pinned offsets: changing any of these is a new kHeaderVersion.
static_assert(offsetof(BankHeader, magic) == 0);
static_assert(offsetof(BankHeader, version) == 8);
static_assert(offsetof(BankHeader, header_bytes) == 12);
static_assert(offsetof(BankHeader, rows) == 16);
static_assert(offsetof(BankHeader, row_bytes) == 24);
static_assert(offsetof(BankHeader, row_stride) == 32);
static_assert(offsetof(BankHeader, data_offset) == 40);
static_assert(offsetof(BankHeader, file_bytes) == 48);
static_assert(offsetof(BankHeader, rank) == 56);
static_assert(offsetof(BankHeader, flags) == 60);
static_assert(offsetof(BankHeader, created_unix_ns) == 64);
static_assert(offsetof(BankHeader, layout_fingerprint) == 72);
static_assert(offsetof(BankHeader, namespace_name) == 104);
static_assert(offsetof(BankHeader, bank) == 233);
static_assert(offsetof(BankHeader, state) == 268);
static_assert(kHugePageBytes % kHeaderBytes == 0);
static_assert(kHeaderBytes % kRowAlign == 0);

}  // namespace kvtier::shm

#endif  // KVTIER_SHM_BANK_HEADER_H_
