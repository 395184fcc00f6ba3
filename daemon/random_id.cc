// RandomId: ids from getrandom(2), with absl::BitGen where it is refused.
#include "daemon/random_id.h"

#include <sys/random.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "absl/random/random.h"
#include "spdlog/spdlog.h"

namespace kvtier::daemon {

uint64_t RandomId() {
  static std::atomic<bool> warned{false};
  for (;;) {
    uint64_t id = 0;
    ssize_t got = 0;
    do {
      got = ::getrandom(&id, sizeof(id), 0);
    } while (got < 0 && errno == EINTR);
    if (got != static_cast<ssize_t>(sizeof(id))) {
      // 8 bytes never come short from an initialized pool; an error is a
      // kernel without getrandom or a filter refusing it.
      if (!warned.exchange(true)) {
        SPDLOG_WARN(
            "getrandom(2) unavailable ({}): ids are drawn from absl::BitGen "
            "instead",
            got < 0 ? std::strerror(errno) : "short read");
      }
      absl::BitGen gen;
      id = absl::Uniform<uint64_t>(gen);
    }
    if (id != 0) return id;
  }
}

}  // namespace kvtier::daemon
