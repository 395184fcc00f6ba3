// seccomp_probe: makes the system calls seccomp_test needs to see refused
// or allowed, and prints one line per probe: NAME=ok, or NAME=<errno name>.
//
//   seccomp_probe PROBE...
//
// Probes, each harmless and needing no privilege:
//   mincore  mincore(2) of a page of its own: outside @system-service (the
//            page-cache side channel), so the filter refuses it
//   mseal    raw system call 462 (mseal(2), Linux 6.10) of nothing: newer
//            than systemd 252's @known list
//   netlink  socket(AF_NETLINK): outside the unit's RestrictAddressFamilies=
//   unix     socket(AF_UNIX): inside it
//   wx       an anonymous mapping both writable and executable
//            (MemoryDenyWriteExecute=)
// Exit status 0 once every probe ran; 2 on an unknown probe.
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

namespace {

// "ok" when rc >= 0, else errno's name.
std::string Result(long rc) {
  if (rc >= 0) return "ok";
  const char* name = strerrorname_np(errno);
  return name != nullptr ? name : std::to_string(errno);
}

std::string Probe(const std::string& probe) {
  if (probe == "mincore") {
    void* page = mmap(nullptr, 4096, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (page == MAP_FAILED) return "mmap failed";
    unsigned char vec = 0;
    const std::string r = Result(mincore(page, 4096, &vec));
    munmap(page, 4096);
    return r;
  }
  if (probe == "mseal") return Result(syscall(462, 0, 0, 0));
  if (probe == "netlink" || probe == "unix") {
    const int fd = socket(probe == "unix" ? AF_UNIX : AF_NETLINK,
                          SOCK_DGRAM | SOCK_CLOEXEC, 0);
    const std::string r = Result(fd);
    if (fd >= 0) close(fd);
    return r;
  }
  if (probe == "wx") {
    void* p = mmap(nullptr, 4096, PROT_READ | PROT_WRITE | PROT_EXEC,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return Result(-1);
    munmap(p, 4096);
    return "ok";
  }
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string r = Probe(argv[i]);
    if (r.empty()) {
      std::fprintf(stderr, "seccomp_probe: unknown probe %s\n", argv[i]);
      return 2;
    }
    std::printf("%s=%s\n", argv[i], r.c_str());
  }
  return 0;
}
