// CRC-32C through ISA-L (see crc32c.h).
#include "common/crc32c.h"

#include <isa-l/crc.h>

#include <algorithm>

namespace kvtier {

uint32_t Crc32c(const void* data, size_t n, uint32_t crc) {
  // crc32_iscsi is the bare reflected CRC register: it neither inverts the
  // value it starts from nor the one it returns (what the standard CRC-32C
  // does on both ends), and it takes an int length and a non-const pointer
  // (it only reads).
  constexpr size_t kMaxChunk = size_t{1} << 30;
  unsigned char* p = static_cast<unsigned char*>(const_cast<void*>(data));
  uint32_t c = ~crc;
  while (n > 0) {
    const size_t chunk = std::min(n, kMaxChunk);
    c = crc32_iscsi(p, static_cast<int>(chunk), c);
    p += chunk;
    n -= chunk;
  }
  return ~c;
}

}  // namespace kvtier
