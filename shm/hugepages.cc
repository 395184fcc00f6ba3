// Discovery of 2 MiB hugetlbfs mounts and of the huge-page pool.
//
// Thread-safety: no shared state; every function is thread-safe.

#include "shm/hugepages.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "shm/bank_header.h"

namespace kvtier::shm {
namespace {

// statfs(2) f_type of hugetlbfs (linux/magic.h).
constexpr int64_t kHugeTlbfsMagic = 0x958458f6;

constexpr char kSysfsPool2M[] = "/sys/kernel/mm/hugepages/hugepages-2048kB/";

// Returns the whole contents of `path` (procfs and sysfs files report a size
// of 0, so this reads until EOF rather than trusting fstat).
absl::StatusOr<std::string> ReadFile(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::ErrnoToStatus(errno, absl::StrCat("open ", path));
  std::string out;
  char buf[8192];
  while (true) {
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      close(fd);
      return absl::ErrnoToStatus(err, absl::StrCat("read ", path));
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  return out;
}

// Decodes the octal escapes (\040 for a space, \011, \012, \134) that
// /proc/mounts uses in paths.
std::string DecodeMountPath(absl::string_view field) {
  std::string out;
  out.reserve(field.size());
  for (size_t i = 0; i < field.size(); ++i) {
    if (field[i] == '\\' && i + 3 < field.size() && field[i + 1] >= '0' &&
        field[i + 1] <= '3' && field[i + 2] >= '0' && field[i + 2] <= '7' &&
        field[i + 3] >= '0' && field[i + 3] <= '7') {
      out.push_back(static_cast<char>((field[i + 1] - '0') * 64 +
                                      (field[i + 2] - '0') * 8 +
                                      (field[i + 3] - '0')));
      i += 3;
    } else {
      out.push_back(field[i]);
    }
  }
  return out;
}

// abseil here is built with its own string_view type; the API uses std's.
absl::string_view ToAbsl(std::string_view s) {
  return absl::string_view(s.data(), s.size());
}

// Returns `path` without trailing slashes ("/" stays "/").
absl::string_view StripTrailingSlashes(absl::string_view path) {
  while (path.size() > 1 && path.back() == '/') path.remove_suffix(1);
  return path;
}

// True if `path` is `dir` or lies under it.
bool IsUnder(absl::string_view path, absl::string_view dir) {
  if (dir == "/") return !path.empty() && path.front() == '/';
  if (!absl::StartsWith(path, dir)) return false;
  return path.size() == dir.size() || path[dir.size()] == '/';
}

}  // namespace

absl::StatusOr<uint64_t> ParseSize(std::string_view text_in) {
  const absl::string_view text = ToAbsl(text_in);
  absl::string_view s = absl::StripAsciiWhitespace(text);
  // hugetlbfs prints size= with a NUL where it has no unit suffix.
  while (!s.empty() && s.back() == '\0') s.remove_suffix(1);
  uint64_t shift = 0;
  if (!s.empty()) {
    switch (absl::ascii_tolower(static_cast<unsigned char>(s.back()))) {
      case 'k':
        shift = 10;
        break;
      case 'm':
        shift = 20;
        break;
      case 'g':
        shift = 30;
        break;
      case 't':
        shift = 40;
        break;
      default:
        break;
    }
    if (shift != 0) s.remove_suffix(1);
  }
  uint64_t value = 0;
  if (s.empty() || !std::all_of(s.begin(), s.end(), absl::ascii_isdigit) ||
      !absl::SimpleAtoi(s, &value)) {
    return absl::InvalidArgumentError(
        absl::StrCat("size '", text, "' is not a number with K/M/G/T suffix"));
  }
  if (shift != 0 && value > (UINT64_MAX >> shift)) {
    return absl::InvalidArgumentError(
        absl::StrCat("size '", text, "' overflows 64 bits"));
  }
  return value << shift;
}

absl::StatusOr<std::vector<HugeTlbMount>> ParseMounts(
    std::string_view proc_mounts_in, uint64_t default_page_bytes) {
  const absl::string_view proc_mounts = ToAbsl(proc_mounts_in);
  std::vector<HugeTlbMount> mounts;
  for (absl::string_view line : absl::StrSplit(proc_mounts, '\n')) {
    std::vector<absl::string_view> fields =
        absl::StrSplit(line, ' ', absl::SkipEmpty());
    // device mountpoint fstype options dump pass
    if (fields.size() < 4 || fields[2] != "hugetlbfs") continue;
    HugeTlbMount mount;
    mount.mount = std::string(StripTrailingSlashes(DecodeMountPath(fields[1])));
    mount.page_bytes = default_page_bytes;
    for (absl::string_view option : absl::StrSplit(fields[3], ',')) {
      if (absl::ConsumePrefix(&option, "pagesize=")) {
        absl::StatusOr<uint64_t> size =
            ParseSize(std::string_view(option.data(), option.size()));
        if (!size.ok() || *size == 0) {
          return absl::InvalidArgumentError(absl::StrCat(
              "/proc/mounts line '", line, "': bad pagesize=", option));
        }
        mount.page_bytes = *size;
      } else if (absl::ConsumePrefix(&option, "size=")) {
        absl::StatusOr<uint64_t> size =
            ParseSize(std::string_view(option.data(), option.size()));
        if (!size.ok()) {
          return absl::InvalidArgumentError(absl::StrCat(
              "/proc/mounts line '", line, "': bad size=", option));
        }
        mount.size_limit_bytes = *size;
      }
    }
    mounts.push_back(std::move(mount));
  }
  return mounts;
}

absl::StatusOr<HugePagePool> ParseMeminfo(std::string_view meminfo_in) {
  const absl::string_view meminfo = ToAbsl(meminfo_in);
  HugePagePool pool;
  bool have_total = false, have_free = false, have_rsvd = false,
       have_surp = false, have_size = false;
  for (absl::string_view line : absl::StrSplit(meminfo, '\n')) {
    std::pair<absl::string_view, absl::string_view> kv =
        absl::StrSplit(line, absl::MaxSplits(':', 1));
    absl::string_view key = absl::StripAsciiWhitespace(kv.first);
    absl::string_view value = absl::StripAsciiWhitespace(kv.second);
    uint64_t* target = nullptr;
    bool* seen = nullptr;
    if (key == "HugePages_Total") {
      target = &pool.total_pages;
      seen = &have_total;
    } else if (key == "HugePages_Free") {
      target = &pool.free_pages;
      seen = &have_free;
    } else if (key == "HugePages_Rsvd") {
      target = &pool.reserved_pages;
      seen = &have_rsvd;
    } else if (key == "HugePages_Surp") {
      target = &pool.surplus_pages;
      seen = &have_surp;
    } else if (key == "Hugepagesize") {
      absl::string_view number = value;
      if (!absl::ConsumeSuffix(&number, " kB")) {
        return absl::InvalidArgumentError(
            absl::StrCat("meminfo Hugepagesize '", value, "' is not in kB"));
      }
      uint64_t kib = 0;
      if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(number), &kib) ||
          kib == 0 || kib > (UINT64_MAX >> 10)) {
        return absl::InvalidArgumentError(
            absl::StrCat("meminfo Hugepagesize '", value, "' does not parse"));
      }
      pool.page_bytes = kib << 10;
      have_size = true;
      continue;
    } else {
      continue;
    }
    if (!absl::SimpleAtoi(value, target)) {
      return absl::InvalidArgumentError(
          absl::StrCat("meminfo ", key, " '", value, "' does not parse"));
    }
    *seen = true;
  }
  const std::pair<bool, const char*> required[] = {
      {have_total, "HugePages_Total"},
      {have_free, "HugePages_Free"},
      {have_rsvd, "HugePages_Rsvd"},
      {have_surp, "HugePages_Surp"},
      {have_size, "Hugepagesize"}};
  for (const auto& [seen, name] : required) {
    if (!seen) {
      return absl::NotFoundError(
          absl::StrCat("meminfo has no ", name, " line (no hugetlb support?)"));
    }
  }
  return pool;
}

absl::StatusOr<uint64_t> ParseCounter(std::string_view text_in) {
  const absl::string_view text = ToAbsl(text_in);
  absl::string_view s = absl::StripAsciiWhitespace(text);
  uint64_t value = 0;
  if (s.empty() || !std::all_of(s.begin(), s.end(), absl::ascii_isdigit) ||
      !absl::SimpleAtoi(s, &value)) {
    return absl::InvalidArgumentError(
        absl::StrCat("counter '", text, "' is not a non-negative integer"));
  }
  return value;
}

absl::StatusOr<HugeTlbInfo> SelectHugeTlbfs(
    const std::vector<HugeTlbMount>& mounts, const HugePagePool& pool,
    std::string_view dir_override_in) {
  const absl::string_view dir_override = ToAbsl(dir_override_in);
  const HugeTlbMount* chosen = nullptr;
  absl::string_view dir = StripTrailingSlashes(dir_override);
  if (dir.empty()) {
    for (const HugeTlbMount& m : mounts) {
      if (m.page_bytes == kHugePageBytes) {
        chosen = &m;
        break;
      }
    }
    if (chosen == nullptr) {
      return absl::NotFoundError(
          "no hugetlbfs mount with pagesize=2M in /proc/mounts");
    }
  } else {
    // The innermost mount containing the directory decides.
    for (const HugeTlbMount& m : mounts) {
      if (IsUnder(dir, m.mount) &&
          (chosen == nullptr || m.mount.size() > chosen->mount.size())) {
        chosen = &m;
      }
    }
    if (chosen == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "hugetlbfs_dir '", dir, "' is not on a hugetlbfs mount"));
    }
    if (chosen->page_bytes != kHugePageBytes) {
      return absl::FailedPreconditionError(
          absl::StrCat("hugetlbfs_dir '", dir, "' is on hugetlbfs mount '",
                       chosen->mount, "' of ", chosen->page_bytes,
                       "-byte pages; banks need ", kHugePageBytes));
    }
  }
  if (pool.page_bytes != kHugePageBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pool describes ", pool.page_bytes, "-byte pages, not 2 MiB"));
  }
  HugeTlbInfo info;
  info.mount = dir.empty() ? chosen->mount : std::string(dir);
  info.page_bytes = chosen->page_bytes;
  info.total_pages = pool.total_pages;
  info.free_pages =
      pool.free_pages - std::min(pool.reserved_pages, pool.free_pages);
  if (chosen->size_limit_bytes != 0) {
    info.free_pages = std::min(info.free_pages,
                               chosen->size_limit_bytes / chosen->page_bytes);
  }
  return info;
}

absl::StatusOr<HugeTlbInfo> DetectHugeTlbfs(const std::string& dir_override) {
  absl::StatusOr<std::string> meminfo = ReadFile("/proc/meminfo");
  if (!meminfo.ok()) return meminfo.status();
  absl::StatusOr<HugePagePool> pool = ParseMeminfo(*meminfo);
  if (!pool.ok()) return pool.status();
  const uint64_t default_page_bytes = pool->page_bytes;
  if (pool->page_bytes != kHugePageBytes) {
    // meminfo describes the default pool only; read the 2 MiB one.
    HugePagePool pool2m;
    pool2m.page_bytes = kHugePageBytes;
    const std::pair<const char*, uint64_t*> files[] = {
        {"nr_hugepages", &pool2m.total_pages},
        {"free_hugepages", &pool2m.free_pages},
        {"resv_hugepages", &pool2m.reserved_pages},
        {"surplus_hugepages", &pool2m.surplus_pages}};
    for (const auto& [name, target] : files) {
      std::string path = absl::StrCat(kSysfsPool2M, name);
      absl::StatusOr<std::string> text = ReadFile(path);
      if (!text.ok()) return text.status();
      absl::StatusOr<uint64_t> value = ParseCounter(*text);
      if (!value.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat(path, ": ", value.status().message()));
      }
      *target = *value;
    }
    *pool = pool2m;
  }

  std::string dir;
  if (!dir_override.empty()) {
    char resolved[PATH_MAX];
    if (realpath(dir_override.c_str(), resolved) == nullptr) {
      return absl::ErrnoToStatus(
          errno, absl::StrCat("hugetlbfs_dir '", dir_override, "'"));
    }
    dir = resolved;
  }

  absl::StatusOr<std::string> mounts_text = ReadFile("/proc/mounts");
  if (!mounts_text.ok()) return mounts_text.status();
  absl::StatusOr<std::vector<HugeTlbMount>> mounts =
      ParseMounts(*mounts_text, default_page_bytes);
  if (!mounts.ok()) return mounts.status();
  absl::StatusOr<HugeTlbInfo> info = SelectHugeTlbfs(*mounts, *pool, dir);
  if (!info.ok()) return info.status();

  // /proc/mounts can be stale or shadowed; statfs is the truth, and it also
  // reports what a size= limit leaves free on this mount.
  struct statfs fs;
  if (statfs(info->mount.c_str(), &fs) != 0) {
    return absl::ErrnoToStatus(errno,
                               absl::StrCat("statfs '", info->mount, "'"));
  }
  if (static_cast<int64_t>(fs.f_type) != kHugeTlbfsMagic) {
    return absl::FailedPreconditionError(
        absl::StrCat("'", info->mount, "' is not on hugetlbfs"));
  }
  if (static_cast<uint64_t>(fs.f_bsize) != kHugePageBytes) {
    return absl::FailedPreconditionError(
        absl::StrCat("'", info->mount, "' has ", fs.f_bsize,
                     "-byte pages; banks need ", kHugePageBytes));
  }
  if (fs.f_blocks > 0) {
    info->free_pages =
        std::min(info->free_pages, static_cast<uint64_t>(fs.f_bavail));
  }
  return info;
}

}  // namespace kvtier::shm
