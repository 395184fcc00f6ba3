// seccomp_exec: runs a program under a seccomp allow-list, the way systemd's
// SystemCallFilter= does for a unit, so the multi-process suites can run
// kvtierd under the filter that deploy/kvtierd.service sets (CI has no
// systemd to enforce the unit; docs/operations.md, "The unit").
//
//   seccomp_exec --allow=FILE [--allow=FILE...] [--known=FILE]
//                [--action=errno|kill|log] [--errno=N]
//                [--address_families=AF_UNIX,AF_INET,...]
//                [--deny_write_execute] [--verbose] -- PROGRAM [ARGS...]
//
// FILE: one system call name per line; '#' starts a comment. Names this
// architecture lacks (the 32-bit variants in systemd's groups) are skipped
// silently, as systemd skips them (--verbose lists them); names libseccomp
// does not know at all are skipped with a warning.
//
// What a call outside the allow-list gets:
//   --action=errno (default): fails with --errno (default EPERM), as under
//     SystemCallFilter= with SystemCallErrorNumber=EPERM -- the unit's
//     choice: a refused call is an error the daemon logs, not a SIGSYS
//     crash loop. systemd's own default (no SystemCallErrorNumber=) kills
//     the process; that is
//   --action=kill: SIGSYS kills the whole process (SCMP_ACT_KILL_PROCESS);
//   --action=log: the call runs and the kernel logs it (audit type 1326 in
//     dmesg), to find what a program needs.
// With --known=FILE (systemd's @known group), calls outside it fail with
// ENOSYS instead (systemd >= 250): newer calls look unimplemented, so a
// caller falls back to an older one.
//
// --address_families mirrors RestrictAddressFamilies= (socket() of another
// family fails with EAFNOSUPPORT) and --deny_write_execute mirrors
// MemoryDenyWriteExecute= (mmap of writable+executable memory, mprotect or
// pkey_mprotect adding PROT_EXEC, shmat with SHM_EXEC fail with EPERM), both
// with the rules systemd 252 loads. The unit's other settings are not
// emulated.
//
// Sets no_new_privs (NoNewPrivileges=; the kernel requires it of an
// unprivileged filter), loads the filters and execs PROGRAM (PATH is
// searched). Exit status: PROGRAM's, or 125 (bad usage or a filter that
// would not load), 126 (PROGRAM cannot run), 127 (PROGRAM not found).
#include <seccomp.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/shm.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace {

constexpr int kUsage = 125;

[[noreturn]] void Die(const std::string& msg) {
  std::fprintf(stderr, "seccomp_exec: %s\n", msg.c_str());
  std::exit(kUsage);
}

// The names in `path`, one a line, '#' comments and blank lines dropped.
std::vector<std::string> ReadNames(const std::string& path) {
  std::ifstream in(path);
  if (!in) Die("cannot read " + path);
  std::vector<std::string> names;
  std::string line;
  while (std::getline(in, line)) {
    line = line.substr(0, line.find('#'));
    const auto b = line.find_first_not_of(" \t\r");
    if (b == std::string::npos) continue;
    const auto e = line.find_last_not_of(" \t\r");
    names.push_back(line.substr(b, e - b + 1));
  }
  return names;
}

struct Family {
  const char* name;
  int value;
};
constexpr Family kFamilies[] = {
    {"AF_UNIX", AF_UNIX},       {"AF_LOCAL", AF_LOCAL},
    {"AF_INET", AF_INET},       {"AF_INET6", AF_INET6},
    {"AF_NETLINK", AF_NETLINK}, {"AF_PACKET", AF_PACKET},
    {"AF_VSOCK", AF_VSOCK},     {"AF_ALG", AF_ALG},
};

int FamilyValue(std::string_view name) {
  for (const Family& f : kFamilies) {
    if (name == f.name) return f.value;
  }
  Die("unknown address family " + std::string(name));
}

int ErrnoValue(const std::string& s) {
  if (s == "EPERM") return EPERM;
  if (s == "EACCES") return EACCES;
  if (s == "ENOSYS") return ENOSYS;
  char* end = nullptr;
  const long v = std::strtol(s.c_str(), &end, 10);
  if (end == s.c_str() || *end != '\0' || v <= 0 || v > 4095) {
    Die("bad --errno " + s);
  }
  return static_cast<int>(v);
}

void Check(int rc, const char* what) {
  if (rc < 0) Die(std::string(what) + ": " + std::strerror(-rc));
}

// The RestrictAddressFamilies= and MemoryDenyWriteExecute= rules, in a
// filter of their own whose default is to allow (as systemd loads them).
void LoadRestrictions(const std::vector<int>& families, bool deny_wx) {
  scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
  if (ctx == nullptr) Die("seccomp_init failed");
  if (!families.empty()) {
    const uint32_t refuse = SCMP_ACT_ERRNO(EAFNOSUPPORT);
    const scmp_datum_t first =
        *std::min_element(families.begin(), families.end());
    const scmp_datum_t last =
        *std::max_element(families.begin(), families.end());
    Check(seccomp_rule_add(ctx, refuse, SCMP_SYS(socket), 1,
                           SCMP_A0(SCMP_CMP_LT, first)),
          "socket rule");
    Check(seccomp_rule_add(ctx, refuse, SCMP_SYS(socket), 1,
                           SCMP_A0(SCMP_CMP_GT, last)),
          "socket rule");
    for (scmp_datum_t af = first + 1; af < last; ++af) {
      if (std::find(families.begin(), families.end(), static_cast<int>(af)) !=
          families.end()) {
        continue;
      }
      Check(seccomp_rule_add(ctx, refuse, SCMP_SYS(socket), 1,
                             SCMP_A0(SCMP_CMP_EQ, af)),
            "socket rule");
    }
  }
  if (deny_wx) {
    const uint32_t refuse = SCMP_ACT_ERRNO(EPERM);
    const scmp_datum_t wx = PROT_WRITE | PROT_EXEC;
    Check(seccomp_rule_add(ctx, refuse, SCMP_SYS(mmap), 1,
                           SCMP_A2(SCMP_CMP_MASKED_EQ, wx, wx)),
          "mmap rule");
    Check(seccomp_rule_add(ctx, refuse, SCMP_SYS(mprotect), 1,
                           SCMP_A2(SCMP_CMP_MASKED_EQ, PROT_EXEC, PROT_EXEC)),
          "mprotect rule");
    Check(seccomp_rule_add(ctx, refuse, SCMP_SYS(pkey_mprotect), 1,
                           SCMP_A2(SCMP_CMP_MASKED_EQ, PROT_EXEC, PROT_EXEC)),
          "pkey_mprotect rule");
    Check(seccomp_rule_add(ctx, refuse, SCMP_SYS(shmat), 1,
                           SCMP_A2(SCMP_CMP_MASKED_EQ, SHM_EXEC, SHM_EXEC)),
          "shmat rule");
  }
  Check(seccomp_load(ctx), "loading the restriction filter");
  seccomp_release(ctx);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> allow_files;
  std::string known_file;
  std::string action = "errno";
  int error_number = EPERM;
  std::vector<int> families;
  bool deny_wx = false;
  bool verbose = false;
  int i = 1;
  for (; i < argc; ++i) {
    const std::string_view a = argv[i];
    auto value = [&](std::string_view flag) -> const char* {
      return a.substr(0, flag.size()) == flag ? argv[i] + flag.size() : nullptr;
    };
    if (a == "--") {
      ++i;
      break;
    } else if (const char* v = value("--allow=")) {
      allow_files.push_back(v);
    } else if (const char* v = value("--known=")) {
      known_file = v;
    } else if (const char* v = value("--action=")) {
      action = v;
    } else if (const char* v = value("--errno=")) {
      error_number = ErrnoValue(v);
    } else if (const char* v = value("--address_families=")) {
      std::string_view list = v;
      while (!list.empty()) {
        const auto comma = list.find(',');
        families.push_back(FamilyValue(list.substr(0, comma)));
        list = comma == list.npos ? "" : list.substr(comma + 1);
      }
    } else if (a == "--deny_write_execute") {
      deny_wx = true;
    } else if (a == "--verbose") {
      verbose = true;
    } else {
      Die("unknown option " + std::string(a) +
          " (usage: seccomp_exec --allow=FILE... -- PROGRAM ARGS...)");
    }
  }
  if (i >= argc) Die("no PROGRAM (usage: ... -- PROGRAM ARGS...)");
  if (allow_files.empty()) Die("no --allow=FILE");

  uint32_t refuse = 0;
  if (action == "errno") {
    refuse = SCMP_ACT_ERRNO(error_number);
  } else if (action == "kill") {
    refuse = SCMP_ACT_KILL_PROCESS;
  } else if (action == "log") {
    refuse = SCMP_ACT_LOG;
  } else {
    Die("bad --action " + action + " (errno, kill or log)");
  }
  // Calls outside @known: ENOSYS, but a log run logs them too.
  const uint32_t unknown =
      known_file.empty() || action == "log" ? refuse : SCMP_ACT_ERRNO(ENOSYS);

  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) {
    Die(std::string("PR_SET_NO_NEW_PRIVS: ") + std::strerror(errno));
  }
  // First the filters that allow by default: once the allow-list is loaded,
  // seccomp(2) itself may be refused.
  if (!families.empty() || deny_wx) LoadRestrictions(families, deny_wx);

  scmp_filter_ctx ctx = seccomp_init(unknown);
  if (ctx == nullptr) Die("seccomp_init failed");
  Check(seccomp_attr_set(ctx, SCMP_FLTATR_CTL_NNP, 1), "SCMP_FLTATR_CTL_NNP");
  std::set<std::string> allowed;
  std::vector<std::string> not_here;
  std::string unknown_names;
  int rules = 0;
  for (const std::string& file : allow_files) {
    for (const std::string& name : ReadNames(file)) {
      if (!allowed.insert(name).second) continue;
      const int nr = seccomp_syscall_resolve_name(name.c_str());
      if (nr == __NR_SCMP_ERROR) {
        unknown_names += " " + name;
        continue;
      }
      if (nr < 0) {  // A pseudo number: not a call of this architecture.
        not_here.push_back(name);
        continue;
      }
      Check(seccomp_rule_add(ctx, SCMP_ACT_ALLOW, nr, 0), name.c_str());
      ++rules;
    }
  }
  if (unknown != refuse) {
    for (const std::string& name : ReadNames(known_file)) {
      if (allowed.count(name) != 0) continue;
      const int nr = seccomp_syscall_resolve_name(name.c_str());
      if (nr < 0) continue;
      Check(seccomp_rule_add(ctx, refuse, nr, 0), name.c_str());
    }
  }
  if (!unknown_names.empty()) {
    const scmp_version* v = seccomp_version();
    std::fprintf(stderr,
                 "seccomp_exec: warning: skipped what libseccomp %u.%u.%u "
                 "does not know:%s\n",
                 v->major, v->minor, v->micro, unknown_names.c_str());
  }
  if (verbose) {
    std::string skipped;
    for (const std::string& n : not_here) skipped += " " + n;
    std::fprintf(stderr,
                 "seccomp_exec: %d calls allowed; not on this "
                 "architecture:%s\n",
                 rules, skipped.c_str());
  }
  Check(seccomp_load(ctx), "loading the allow-list");
  seccomp_release(ctx);

  execvp(argv[i], argv + i);
  const int err = errno;
  std::fprintf(stderr, "seccomp_exec: %s: %s\n", argv[i], std::strerror(err));
  return err == ENOENT ? 127 : 126;
}
