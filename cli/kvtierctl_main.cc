// kvtierctl: the operator's CLI for kvtierd. Parses the command line, finds
// the daemon's socket (the same default as the daemon's) and runs one
// command (cli/commands.h). `kvtierctl --help` lists commands, flags and exit
// codes.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "absl/types/optional.h"
#include "cli/commands.h"
#include "common/default_socket.h"
#include "grpcpp/create_channel.h"
#include "shm/trusted_path.h"

ABSL_FLAG(std::string, socket, "",
          "kvtierd's socket (default: $KVTIER_SOCKET, else "
          "/run/kvtier/kvtierd.sock when it exists, else the daemon's "
          "per-user default $XDG_RUNTIME_DIR/kvtier/kvtierd.sock or "
          "/tmp/kvtier-<uid>/kvtierd.sock)");
ABSL_FLAG(bool, json, false,
          "Print the daemon's answer as JSON (proto field names) instead of "
          "tables; watch prints one JSON object per line");
ABSL_FLAG(double, timeout, 5.0,
          "Seconds to wait for each answer before giving up (exit code 3)");
ABSL_FLAG(std::string, order, "largest",
          "prefixes: largest (most pages) or recent (last used) first");
ABSL_FLAG(uint32_t, limit, 20, "prefixes: how many to show (1..10000)");
ABSL_FLAG(bool, force, false,
          "drop: drop a namespace even while sessions are attached");
ABSL_FLAG(double, interval, 2.0, "watch: seconds between refreshes");
ABSL_FLAG(int32_t, count, 0,
          "watch: stop after this many refreshes (0: until interrupted)");

namespace kvtier::cli {
namespace {

constexpr char kUsage[] =
    R"(kvtierctl: inspect and manage kvtierd, the host-memory KV cache tier.

Usage: kvtierctl [FLAGS] COMMAND [ARGUMENTS]

Commands:
  status                  the daemon, its namespaces and their banks (rows
                          used, reserved and free per bank and rank)
  namespaces              namespaces: layout, pages, snapshots, hit counts
  prefixes NAMESPACE      cached prefixes with tokens, pages, snapshots, size
                          and last use; --order=largest|recent, --limit=N
  stats                   request and eviction counters per namespace
  drop NAMESPACE [HASH]   drop a namespace and unlink its segments (--force
                          while sessions are attached), or only the page HASH
                          and every page cached after it (hex: a full hash,
                          or a unique start of a leaf hash that `prefixes`
                          shows, which drops that prefix's last page)
  verify                  check the daemon's invariants (rows, index, leases)
  watch                   a live view, redrawn every --interval seconds, with
                          rates; --count=N stops after N refreshes

Output: aligned tables for people; --json prints the daemon's answer as JSON
for scripts.

Exit codes:
  0  success
  1  the daemon answered with an error (e.g. no such namespace)
  2  usage error
  3  the daemon could not be reached (not running, wrong socket, or no answer
     within --timeout)
  4  verify found a violated invariant
)";

// Prints the usage text and this program's flags.
void PrintHelp() {
  std::string out = absl::StrCat(kUsage, "\nFlags:\n");
  std::vector<const absl::CommandLineFlag*> flags;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (absl::StrContains(flag->Filename(), "kvtierctl_main")) {
      flags.push_back(flag);
    }
  }
  std::sort(flags.begin(), flags.end(),
            [](const auto* a, const auto* b) { return a->Name() < b->Name(); });
  for (const auto* f : flags) {
    absl::StrAppend(&out, "  --", f->Name(), " (default: ",
                    f->DefaultValue().empty() ? "\"\"" : f->DefaultValue(),
                    ")\n");
    // The help text, wrapped at 78 columns under the name.
    std::string line = "      ";
    for (absl::string_view word :
         absl::StrSplit(f->Help(), ' ', absl::SkipEmpty())) {
      if (line.size() > 6 && line.size() + 1 + word.size() > 78) {
        absl::StrAppend(&out, line, "\n");
        line = "      ";
      }
      absl::StrAppend(&line, line.size() > 6 ? " " : "", word);
    }
    absl::StrAppend(&out, line, "\n");
  }
  std::fputs(out.c_str(), stdout);
}

// Parses `argv` into this program's flags and the positional arguments.
// absl::ParseCommandLine would exit 1 on a bad flag; here that is a usage
// error (exit 2) with a message naming the flag. Flags may come before or
// after the command; "--" ends them.
// --help, -help and -h set *help.
bool ParseArgs(int argc, char** argv, std::vector<std::string>* positional,
               bool* help, std::string* error) {
  bool flags_done = false;
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (flags_done || arg.size() < 2 || arg[0] != '-') {
      positional->emplace_back(arg);
      continue;
    }
    if (arg == "--") {
      flags_done = true;
      continue;
    }
    arg.remove_prefix(arg[1] == '-' ? 2 : 1);
    const size_t eq = arg.find('=');
    std::string name(arg.substr(0, eq));
    if (name == "help" || name == "h") {
      *help = true;
      continue;
    }
    absl::optional<std::string> value;
    if (eq != absl::string_view::npos) value = std::string(arg.substr(eq + 1));
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr && !value && absl::StartsWith(name, "no")) {
      // --noforce: a boolean flag set to false.
      flag = absl::FindCommandLineFlag(name.substr(2));
      if (flag != nullptr && flag->IsOfType<bool>()) {
        name = name.substr(2);
        value = "false";
      } else {
        flag = nullptr;
      }
    }
    if (flag == nullptr ||
        !absl::StrContains(flag->Filename(), "kvtierctl_main")) {
      *error = absl::StrCat("unknown flag --", name);
      return false;
    }
    if (!value) {
      if (flag->IsOfType<bool>()) {
        value = "true";
      } else if (i + 1 < argc) {
        value = std::string(argv[++i]);
      } else {
        *error = absl::StrCat("--", name, ": missing value");
        return false;
      }
    }
    std::string why;
    if (!flag->ParseFrom(*value, &why)) {
      *error = absl::StrCat("--", name, ": ", why);
      return false;
    }
  }
  return true;
}

int Main(int argc, char** argv) {
  std::vector<std::string> args;
  bool help = false;
  std::string error;
  if (!ParseArgs(argc, argv, &args, &help, &error)) {
    std::fprintf(stderr, "kvtierctl: %s (see kvtierctl --help)\n",
                 error.c_str());
    return kExitUsage;
  }
  // Help is ours, not absl's: it lists the commands and exit codes, and
  // exits 0.
  if (help || (!args.empty() && args[0] == "help")) {
    PrintHelp();
    return kExitOk;
  }
  if (args.empty()) {
    std::fputs(kUsage, stderr);
    return kExitUsage;
  }

  Options options;
  options.socket = ResolveClientSocket(absl::GetFlag(FLAGS_socket));
  options.json = absl::GetFlag(FLAGS_json);
  const double timeout = absl::GetFlag(FLAGS_timeout);
  const double interval = absl::GetFlag(FLAGS_interval);
  if (!(timeout > 0)) {
    std::fprintf(stderr, "kvtierctl: --timeout: must be above 0\n");
    return kExitUsage;
  }
  options.timeout = absl::Seconds(timeout);
  options.order = absl::GetFlag(FLAGS_order);
  options.limit = absl::GetFlag(FLAGS_limit);
  options.force = absl::GetFlag(FLAGS_force);
  options.interval =
      interval > 0 ? absl::Seconds(interval) : absl::ZeroDuration();
  options.count = absl::GetFlag(FLAGS_count);
  options.redraw = ::isatty(STDOUT_FILENO) == 1;

  // kvtierctl is an operator's tool: it speaks to the operator socket
  // beside the engine socket, which only root, kvtierd's uid and
  // --admin_group can reach, and only when it is kvtierd's
  // (shm/trusted_path.h).
  const std::string admin = options.socket + ".admin";
  if (auto owner = shm::CheckDaemonSocket(admin);
      !owner.ok() && !absl::IsNotFound(owner.status())) {
    std::fprintf(stderr, "kvtierctl: %s\n",
                 std::string(owner.status().message()).c_str());
    return kExitUnreachable;
  }
  if (::access(admin.c_str(), R_OK | W_OK) != 0 && errno == EACCES) {
    std::fprintf(stderr,
                 "kvtierctl: permission denied on kvtierd's operator socket "
                 "%s: kvtierctl needs root or membership in kvtierd's "
                 "--admin_group\n",
                 admin.c_str());
    return kExitUnreachable;
  }
  options.socket = admin;
  auto channel = grpc::CreateChannel("unix:" + options.socket,
                                     grpc::InsecureChannelCredentials());
  Ctl ctl(v1::TierService::NewStub(channel), std::move(options), stdout,
          stderr);
  return ctl.Run(args);
}

}  // namespace
}  // namespace kvtier::cli

int main(int argc, char** argv) { return kvtier::cli::Main(argc, argv); }
