// CRC-32C (Castagnoli, the iSCSI CRC of RFC 3720): the checksum that frames
// every journal record (daemon/journal_format.h) and every line of the fence
// registry (daemon/fence_registry.cc). The project's one CRC, computed by
// Intel ISA-L's crc32_iscsi (Debian's libisal), which picks its SSE4.2 /
// PCLMULQDQ code for the CPU at run time. The values are on disk: they never
// change (crc32c_test.cc holds this to the implementation that wrote them).
//
// Thread-safety: a pure function, safe from any thread.
#ifndef KVTIER_COMMON_CRC32C_H_
#define KVTIER_COMMON_CRC32C_H_

#include <cstddef>
#include <cstdint>

namespace kvtier {

// Returns the CRC-32C of the `n` bytes at `data` (null when `n` is 0),
// continuing from `crc`: 0 to start, or what the bytes before returned, so
// Crc32c(b, m, Crc32c(a, n)) is the CRC of a followed by b. Reflected, initial
// value and final xor 0xffffffff: Crc32c("123456789", 9) == 0xe3069283.
uint32_t Crc32c(const void* data, size_t n, uint32_t crc = 0);

}  // namespace kvtier

#endif  // KVTIER_COMMON_CRC32C_H_
