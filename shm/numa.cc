// NUMA placement of banks (shm/numa.h).
//
// Thread-safety: thread-safe (no shared state).
#include "shm/numa.h"

#include <errno.h>
#include <linux/mempolicy.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <array>
#include <cctype>
#include <climits>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace kvtier::shm {
namespace {

constexpr size_t kMaskWords = (kMaxNumaNode + 1) / (CHAR_BIT * sizeof(long));
using NodeMask = std::array<unsigned long, kMaskWords>;

bool AllHex(absl::string_view s, size_t n) {
  if (s.size() != n) return false;
  for (char c : s) {
    if (!std::isxdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

// The first line of a small file, stripped; NOT_FOUND when it cannot be read.
absl::StatusOr<std::string> ReadLine(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) {
    return absl::NotFoundError(absl::StrCat("cannot read '", path, "'"));
  }
  return std::string(absl::StripAsciiWhitespace(line));
}

}  // namespace

absl::StatusOr<std::string> NormalizePciBusId(absl::string_view id) {
  auto bad = [&] {
    return absl::InvalidArgumentError(
        absl::StrCat("pci_bus_id: '", absl::CHexEscape(id),
                     "' is not a PCI bus id (domain:bus:device.function, e.g. "
                     "0000:3b:00.0)"));
  };
  std::vector<absl::string_view> parts = absl::StrSplit(id, ':');
  std::string domain = "0000";
  if (parts.size() == 3) {
    absl::string_view d = parts[0];
    // CUDA and nvidia-smi print 8 domain digits; sysfs uses 4.
    if (d.size() == 8 && absl::StartsWith(d, "0000")) d.remove_prefix(4);
    if (!AllHex(d, 4)) return bad();
    domain = std::string(d);
    parts.erase(parts.begin());
  }
  if (parts.size() != 2 || !AllHex(parts[0], 2)) return bad();
  std::vector<absl::string_view> df = absl::StrSplit(parts[1], '.');
  if (df.size() != 2 || !AllHex(df[0], 2) || df[1].size() != 1 ||
      df[1][0] < '0' || df[1][0] > '7') {
    return bad();
  }
  return absl::AsciiStrToLower(
      absl::StrCat(domain, ":", parts[0], ":", df[0], ".", df[1]));
}

absl::StatusOr<int> PciDeviceNumaNode(const std::string& sysfs_root,
                                      absl::string_view pci_bus_id) {
  absl::StatusOr<std::string> id = NormalizePciBusId(pci_bus_id);
  if (!id.ok()) return id.status();
  const std::string path =
      absl::StrCat(sysfs_root, "/bus/pci/devices/", *id, "/numa_node");
  absl::StatusOr<std::string> text = ReadLine(path);
  if (!text.ok()) {
    return absl::NotFoundError(absl::StrCat(
        "pci_bus_id: no PCI device ", *id, " (", text.status().message(), ")"));
  }
  int node = 0;
  if (!absl::SimpleAtoi(*text, &node) || node < -1 || node > kMaxNumaNode) {
    return absl::InternalError(
        absl::StrCat("'", path, "' holds '", *text, "', not a NUMA node"));
  }
  return node;
}

absl::StatusOr<uint64_t> NodeFreeHugePages(const std::string& sysfs_root,
                                           int node) {
  const std::string path =
      absl::StrCat(sysfs_root, "/devices/system/node/node", node,
                   "/hugepages/hugepages-2048kB/free_hugepages");
  absl::StatusOr<std::string> text = ReadLine(path);
  if (!text.ok()) return text.status();
  uint64_t pages = 0;
  if (!absl::SimpleAtoi(*text, &pages)) {
    return absl::InternalError(
        absl::StrCat("'", path, "' holds '", *text, "', not a count"));
  }
  return pages;
}

absl::StatusOr<uint64_t> NodeAvailableBytes(const std::string& sysfs_root,
                                            int node) {
  const std::string path =
      absl::StrCat(sysfs_root, "/devices/system/node/node", node, "/meminfo");
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read '", path, "'"));
  // Lines look like "Node 0 MemFree:         6466224 kB".
  uint64_t kb = 0;
  int found = 0;
  for (std::string line; std::getline(in, line);) {
    std::vector<absl::string_view> f =
        absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (f.size() != 5 || f[4] != "kB") continue;
    if (f[2] != "MemFree:" && f[2] != "Active(file):" &&
        f[2] != "Inactive(file):") {
      continue;
    }
    uint64_t v = 0;
    if (!absl::SimpleAtoi(f[3], &v)) {
      return absl::InternalError(
          absl::StrCat("'", path, "': cannot parse '", line, "'"));
    }
    kb += v;
    ++found;
  }
  if (found != 3) {
    return absl::InternalError(absl::StrCat(
        "'", path, "' lacks MemFree, Active(file) or Inactive(file)"));
  }
  return kb * 1024;
}

absl::Status BindToNode(void* addr, size_t bytes, int node, bool move) {
  if (node < 0 || node > kMaxNumaNode) {
    return absl::InvalidArgumentError(
        absl::StrCat("numa node: ", node, " is outside 0..", kMaxNumaNode));
  }
  NodeMask mask{};
  mask[node / (CHAR_BIT * sizeof(long))] |=
      1ul << (node % (CHAR_BIT * sizeof(long)));
  const unsigned flags = MPOL_MF_STRICT | (move ? MPOL_MF_MOVE : 0u);
  if (syscall(SYS_mbind, addr, bytes, MPOL_BIND, mask.data(),
              static_cast<unsigned long>(kMaxNumaNode + 1), flags) != 0) {
    const int err = errno;
    if (err == EINVAL) {
      return absl::InvalidArgumentError(
          absl::StrCat("bind ", bytes, " bytes to NUMA node ", node,
                       ": the kernel has no such node online (EINVAL)"));
    }
    return absl::ErrnoToStatus(
        err, absl::StrCat("mbind ", bytes, " bytes to NUMA node ", node,
                          move ? " (moving pages)" : ""));
  }
  return absl::OkStatus();
}

absl::StatusOr<int> BoundNode(const void* addr) {
  int mode = 0;
  NodeMask mask{};
  if (syscall(SYS_get_mempolicy, &mode, mask.data(),
              static_cast<unsigned long>(kMaxNumaNode + 1), addr,
              MPOL_F_ADDR) != 0) {
    return absl::ErrnoToStatus(errno, "get_mempolicy");
  }
  if (mode != MPOL_BIND && mode != MPOL_PREFERRED) return -1;
  int found = -1;
  for (int n = 0; n <= kMaxNumaNode; ++n) {
    if (mask[n / (CHAR_BIT * sizeof(long))] &
        (1ul << (n % (CHAR_BIT * sizeof(long))))) {
      if (found >= 0) return -1;  // Several nodes: no single one.
      found = n;
    }
  }
  return found;
}

}  // namespace kvtier::shm
