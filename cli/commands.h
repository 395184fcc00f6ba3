// kvtierctl's commands: each asks kvtierd over its TierService and prints an
// aligned table for people or, with --json, the daemon's answer as JSON for
// scripts. Rendering is split from the RPCs (the Render* functions are pure)
// so tables are unit-tested without a daemon.
//
// Exit codes (ExitCode) mean the same for every command; kvtierctl --help
// lists them.
//
// Thread-safety: a Ctl is used by one thread; the Render* functions are pure.
#ifndef KVTIER_CLI_COMMANDS_H_
#define KVTIER_CLI_COMMANDS_H_

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/support/status.h"
#include "kvtier/v1/tier.grpc.pb.h"

namespace kvtier::cli {

enum ExitCode : int {
  kExitOk = 0,
  kExitDaemonError = 1,  // The daemon answered with an error.
  kExitUsage = 2,        // Bad command line.
  kExitUnreachable = 3,  // No daemon at the socket, or no answer in time.
  kExitViolation = 4,    // verify found a violated invariant.
};

// Returns the exit code for a failed RPC: kExitUnreachable for UNAVAILABLE
// and DEADLINE_EXCEEDED, else kExitDaemonError. REQUIRES: !status.ok().
ExitCode ExitCodeFor(const grpc::Status& status);

// What the command line asked for beyond the command and its arguments.
struct Options {
  std::string socket;  // Already resolved (ResolveClientSocket).
  bool json = false;
  absl::Duration timeout = absl::Seconds(5);   // Per RPC.
  std::string order = "largest";               // prefixes: largest | recent.
  uint32_t limit = 20;                         // prefixes: rows shown.
  bool force = false;                          // drop: with sessions attached.
  absl::Duration interval = absl::Seconds(2);  // watch: between frames.
  int count = 0;  // watch: frames to show, 0 = until interrupted.
  // watch: redraw in place (clear the screen before each frame). Off when
  // stdout is not a terminal: frames are then separated by a blank line.
  bool redraw = false;
};

// ------------------------------------------------------------- rendering --

// `status`: the daemon line, the namespaces table and the banks table.
std::string RenderStatus(const v1::StatsResponse& stats);
// `namespaces`: one row per namespace.
std::string RenderNamespaces(
    const google::protobuf::RepeatedPtrField<v1::NamespaceInfo>& namespaces);
// `prefixes`: a title line and one row per prefix. `info` (may be null)
// supplies row sizes for the SIZE column.
std::string RenderPrefixes(const std::string& ns,
                           const v1::ListPrefixesResponse& prefixes,
                           const std::string& order,
                           const v1::NamespaceInfo* info, absl::Time now);
// `stats`: request and eviction counters per namespace.
std::string RenderStats(const v1::StatsResponse& stats);
// One `watch` frame: the state of `now_stats` and, when `before` is not null,
// rates over `elapsed` since it.
std::string RenderWatchFrame(const v1::StatsResponse* before,
                             const v1::StatsResponse& now_stats,
                             absl::Duration elapsed, absl::Time now);
// `verify`'s line.
std::string RenderVerify(const v1::VerifyResponse& verify);

// Returns the hex string `hex` (case-insensitive) as bytes; INVALID_ARGUMENT
// naming HASH when it is not an even number of hex digits.
absl::StatusOr<std::string> ParseHex(const std::string& hex);

// --------------------------------------------------------------- running --

class Ctl {
 public:
  // `stub` talks to the daemon; output goes to `out`, errors to `err`.
  Ctl(std::unique_ptr<v1::TierService::StubInterface> stub, Options options,
      std::FILE* out, std::FILE* err);

  // Runs `args` (args[0] is the command) and returns the exit code.
  int Run(const std::vector<std::string>& args);

 private:
  int Status();
  int Namespaces();
  int Prefixes(const std::string& ns);
  int Stats();
  int Drop(const std::string& ns, const std::string& hash);
  int Verify();
  int Watch();

  // Prints `message` to the JSON or text output.
  int PrintJson(const google::protobuf::Message& message, bool one_line);
  void Print(const std::string& text);
  // Reports a failed RPC and returns its exit code.
  int Fail(const std::string& what, const grpc::Status& status);
  int Usage(const std::string& message);
  // A context with the per-RPC deadline.
  std::unique_ptr<grpc::ClientContext> Context() const;
  // Resolves HASH (full hex or a unique hex prefix of a listed prefix's
  // leaf) in namespace `ns`; sets *exit_code on failure.
  std::string ResolveHash(const std::string& ns, const std::string& hex,
                          int* exit_code);

  std::unique_ptr<v1::TierService::StubInterface> stub_;
  const Options options_;
  std::FILE* const out_;
  std::FILE* const err_;
};

}  // namespace kvtier::cli

#endif  // KVTIER_CLI_COMMANDS_H_
