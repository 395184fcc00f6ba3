// NUMA placement of banks: which node a GPU hangs off (sysfs), binding a
// mapping's memory to a node (mbind(2): for tmpfs and hugetlbfs files this
// sets the file's shared policy, so pages allocated later, by fallocate or a
// fault in any process, come from that node), and reading a mapping's
// policy back (get_mempolicy(2)).
//
// Raw system calls with the kernel's <linux/mempolicy.h> rather than libnuma:
// three calls, and libnuma would add a runtime library to every engine host
// for nothing else.
//
// Thread-safety: every function is thread-safe (no shared state).
#ifndef KVTIER_SHM_NUMA_H_
#define KVTIER_SHM_NUMA_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvtier::shm {

// Nodes above this are refused (the node mask passed to the kernel is fixed).
inline constexpr int kMaxNumaNode = 1023;

// Returns `pci_bus_id` in sysfs's form, "dddd:bb:dd.f" lowercase. Accepts
// CUDA's forms too: an 8-digit domain ("00000000:3B:00.0", as nvidia-smi
// prints) or none ("3b:00.0", domain 0). INVALID_ARGUMENT otherwise.
absl::StatusOr<std::string> NormalizePciBusId(absl::string_view pci_bus_id);

// Returns the NUMA node of PCI device `pci_bus_id` from
// <sysfs_root>/bus/pci/devices/<id>/numa_node, or -1 when the kernel knows
// none (a one-node host reports -1). INVALID_ARGUMENT for a malformed id,
// NOT_FOUND when sysfs has no such device.
absl::StatusOr<int> PciDeviceNumaNode(const std::string& sysfs_root,
                                      absl::string_view pci_bus_id);

// Returns the free 2 MiB huge pages of `node`
// (<sysfs_root>/devices/system/node/node<N>/hugepages/hugepages-2048kB/
// free_hugepages). NOT_FOUND when the node or its pool is absent.
absl::StatusOr<uint64_t> NodeFreeHugePages(const std::string& sysfs_root,
                                           int node);

// Returns the bytes `node` could give a new bank without the kernel's OOM
// handling: MemFree plus the file cache it can drop (Active(file) +
// Inactive(file)) from <sysfs_root>/devices/system/node/node<N>/meminfo.
// NOT_FOUND when the file is absent, INTERNAL when it does not parse.
absl::StatusOr<uint64_t> NodeAvailableBytes(const std::string& sysfs_root,
                                            int node);

// Binds [addr, addr + bytes) to `node` (MPOL_BIND). With `move`, pages
// already there move to the node (MPOL_MF_MOVE: only pages no other process
// maps). INVALID_ARGUMENT for a node out of range or one the kernel does not
// have online; the errno's status otherwise (EPERM: a seccomp profile that
// forbids mbind, e.g. a container without CAP_SYS_NICE).
absl::Status BindToNode(void* addr, size_t bytes, int node, bool move);

// Returns the node the memory policy at `addr` binds to: -1 for the default
// policy (first touch) or one that names no single node.
absl::StatusOr<int> BoundNode(const void* addr);

}  // namespace kvtier::shm

#endif  // KVTIER_SHM_NUMA_H_
