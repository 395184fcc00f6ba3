// Reference implementation of the page copy: the kernel's plan executed with
// memcpy on the calling thread. CPU tests run the transfer engine against it;
// GPU tests compare the kernel with it bit for bit.
//
// Thread-safety: RunPageCopyReference may run concurrently with itself as
// long as the destinations of concurrent calls do not overlap.

#include <cstdint>
#include <cstring>

#include "absl/status/status.h"
#include "kernels/page_copy.h"

namespace kvtier::kernels {

absl::Status RunPageCopyReference(const PageCopyParams& p) {
  if (absl::Status s = CheckPageCopyParams(p); !s.ok()) return s;
  const uint64_t units =
      static_cast<uint64_t>(p.header.num_items) * p.header.chunks_per_item;
  for (uint64_t u = 0; u < units; ++u) {
    const PageCopyChunk c = ResolvePageCopyChunk(p, u);
    std::memcpy(reinterpret_cast<void*>(c.dst),
                reinterpret_cast<const void*>(c.src), c.bytes);
  }
  return absl::OkStatus();
}

}  // namespace kvtier::kernels
