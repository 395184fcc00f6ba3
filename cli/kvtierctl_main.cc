// kvtierctl: the operator's CLI for kvtierd.
//
//   kvtierctl [--socket=PATH] [--json] status
//   kvtierctl [--socket=PATH] [--json] namespaces
//   kvtierctl [--socket=PATH] [--json] prefixes NAMESPACE [--order=largest|recent] [--limit=N]
//   kvtierctl [--socket=PATH] drop NAMESPACE [--force]
//
// Exit codes: 0 success, 1 the daemon answered with an error, 2 usage error,
// 3 the daemon could not be reached.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/default_socket.h"
#include "google/protobuf/util/json_util.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "kvtier/v1/tier.grpc.pb.h"

ABSL_FLAG(std::string, socket, "",
          "kvtierd socket (default: $KVTIER_SOCKET, /run/kvtier/kvtierd.sock, "
          "else the daemon's per-user default)");
ABSL_FLAG(bool, json, false, "Print JSON instead of tables");
ABSL_FLAG(std::string, order, "largest", "prefixes: largest or recent");
ABSL_FLAG(uint32_t, limit, 20, "prefixes: how many");
ABSL_FLAG(bool, force, false, "drop: even with sessions attached");
ABSL_FLAG(double, timeout, 5.0, "Seconds to wait for the daemon");

namespace kvtier::cli {
namespace {

constexpr int kExitOk = 0, kExitError = 1, kExitUsage = 2, kExitUnreachable = 3;

std::string Bytes(uint64_t b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(b);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  return u == 0 ? absl::StrCat(b, " B") : absl::StrFormat("%.1f %s", v, units[u]);
}

std::string Hex(const std::string& s, size_t max_bytes) {
  std::string out;
  for (size_t i = 0; i < s.size() && i < max_bytes; ++i) {
    absl::StrAppendFormat(&out, "%02x", static_cast<unsigned char>(s[i]));
  }
  return out;
}

std::string Ago(int64_t unix_ms) {
  if (unix_ms <= 0) return "-";
  const int64_t s = (absl::ToUnixMillis(absl::Now()) - unix_ms) / 1000;
  if (s < 60) return absl::StrCat(s, "s ago");
  if (s < 3600) return absl::StrCat(s / 60, "m ago");
  if (s < 86400) return absl::StrCat(s / 3600, "h ago");
  return absl::StrCat(s / 86400, "d ago");
}

// Prints rows as aligned columns; the first row is the header.
void PrintTable(const std::vector<std::vector<std::string>>& rows,
                const std::string& indent = "") {
  std::vector<size_t> width;
  for (const auto& r : rows) {
    if (width.size() < r.size()) width.resize(r.size(), 0);
    for (size_t i = 0; i < r.size(); ++i) {
      width[i] = std::max(width[i], r[i].size());
    }
  }
  for (const auto& r : rows) {
    std::string line = indent;
    for (size_t i = 0; i < r.size(); ++i) {
      line += r[i];
      if (i + 1 < r.size()) line += std::string(width[i] - r[i].size() + 2, ' ');
    }
    std::printf("%s\n", line.c_str());
  }
}

int PrintJson(const google::protobuf::Message& m) {
  std::string out;
  google::protobuf::util::JsonPrintOptions opts;
  opts.add_whitespace = true;
  opts.always_print_primitive_fields = true;
  opts.preserve_proto_field_names = true;
  if (!google::protobuf::util::MessageToJsonString(m, &out, opts).ok()) {
    return kExitError;
  }
  std::printf("%s", out.c_str());
  return kExitOk;
}

int Fail(const grpc::Status& s) {
  std::fprintf(stderr, "kvtierctl: %s\n", s.error_message().c_str());
  return s.error_code() == grpc::StatusCode::UNAVAILABLE ||
                 s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED
             ? kExitUnreachable
             : kExitError;
}

void PrintNamespaces(const google::protobuf::RepeatedPtrField<v1::NamespaceInfo>&
                         namespaces) {
  std::vector<std::vector<std::string>> t = {
      {"NAMESPACE", "MODEL", "TOKENS/PAGE", "TP", "PAGES", "SNAPSHOTS",
       "PREFIXES", "SESSIONS", "HIT PAGES", "MISS PAGES"}};
  for (const auto& ns : namespaces) {
    t.push_back({ns.name(), ns.layout().model(),
                 absl::StrCat(ns.layout().tokens_per_page()),
                 absl::StrCat(ns.layout().tp_size(),
                              ns.layout().replicated() ? " (replicated)" : ""),
                 absl::StrCat(ns.pages()), absl::StrCat(ns.snapshots()),
                 absl::StrCat(ns.prefixes()), absl::StrCat(ns.sessions()),
                 absl::StrCat(ns.hit_pages()), absl::StrCat(ns.miss_pages())});
  }
  PrintTable(t);
}

int Status(v1::TierService::Stub& stub, grpc::ClientContext& ctx) {
  v1::StatsRequest req;
  v1::StatsResponse resp;
  grpc::Status s = stub.Stats(&ctx, req, &resp);
  if (!s.ok()) return Fail(s);
  if (absl::GetFlag(FLAGS_json)) return PrintJson(resp);
  std::printf("kvtierd %s, up %s, %u session%s, %d namespace%s\n\n",
              resp.version().c_str(),
              absl::FormatDuration(absl::Seconds(resp.uptime_seconds())).c_str(),
              resp.sessions(), resp.sessions() == 1 ? "" : "s",
              resp.namespaces_size(), resp.namespaces_size() == 1 ? "" : "s");
  if (resp.namespaces_size() == 0) return kExitOk;
  PrintNamespaces(resp.namespaces());
  std::printf("\n");
  std::vector<std::vector<std::string>> t = {
      {"NAMESPACE", "BANK", "RANK", "ROW SIZE", "ROWS", "USED", "RESERVED",
       "FREE", "SIZE", "MEMORY", "FILE"}};
  for (const auto& ns : resp.namespaces()) {
    for (const auto& b : ns.banks()) {
      t.push_back({ns.name(), b.bank(), absl::StrCat(b.rank()),
                   Bytes(b.row_bytes()), absl::StrCat(b.rows()),
                   absl::StrCat(b.used_rows()), absl::StrCat(b.reserved_rows()),
                   absl::StrCat(b.free_rows()), Bytes(b.rows() * b.row_bytes()),
                   b.huge_pages() ? "2 MiB pages" : "4 KiB pages", b.path()});
    }
  }
  PrintTable(t);
  return kExitOk;
}

int Namespaces(v1::TierService::Stub& stub, grpc::ClientContext& ctx) {
  v1::ListNamespacesRequest req;
  v1::ListNamespacesResponse resp;
  grpc::Status s = stub.ListNamespaces(&ctx, req, &resp);
  if (!s.ok()) return Fail(s);
  if (absl::GetFlag(FLAGS_json)) return PrintJson(resp);
  PrintNamespaces(resp.namespaces());
  return kExitOk;
}

int Prefixes(v1::TierService::Stub& stub, grpc::ClientContext& ctx,
             const std::string& ns) {
  v1::ListPrefixesRequest req;
  req.set_namespace_(ns);
  const std::string order = absl::GetFlag(FLAGS_order);
  if (order == "largest") {
    req.set_order(v1::ListPrefixesRequest::ORDER_LARGEST);
  } else if (order == "recent") {
    req.set_order(v1::ListPrefixesRequest::ORDER_RECENT);
  } else {
    std::fprintf(stderr, "kvtierctl: --order must be largest or recent\n");
    return kExitUsage;
  }
  req.set_limit(absl::GetFlag(FLAGS_limit));
  v1::ListPrefixesResponse resp;
  grpc::Status s = stub.ListPrefixes(&ctx, req, &resp);
  if (!s.ok()) return Fail(s);
  if (absl::GetFlag(FLAGS_json)) return PrintJson(resp);
  std::printf("%s: %lu prefixes (showing %d, %s first)\n\n", ns.c_str(),
              static_cast<unsigned long>(resp.total_prefixes()),
              resp.prefixes_size(), order.c_str());
  std::vector<std::vector<std::string>> t = {
      {"LEAF", "TOKENS", "PAGES", "SNAPSHOTS", "PINS", "LAST USE"}};
  for (const auto& p : resp.prefixes()) {
    t.push_back({Hex(p.leaf_hash(), 8), absl::StrCat(p.tokens()),
                 absl::StrCat(p.pages()), absl::StrCat(p.snapshots()),
                 absl::StrCat(p.pins()), Ago(p.last_use_unix_ms())});
  }
  PrintTable(t);
  return kExitOk;
}

int Drop(v1::TierService::Stub& stub, grpc::ClientContext& ctx,
         const std::string& ns) {
  v1::DropRequest req;
  req.set_namespace_(ns);
  req.set_force(absl::GetFlag(FLAGS_force));
  v1::DropResponse resp;
  grpc::Status s = stub.Drop(&ctx, req, &resp);
  if (!s.ok()) return Fail(s);
  if (absl::GetFlag(FLAGS_json)) return PrintJson(resp);
  std::printf("dropped %s: %lu pages, %lu snapshots\n", ns.c_str(),
              static_cast<unsigned long>(resp.dropped_pages()),
              static_cast<unsigned long>(resp.dropped_snapshots()));
  return kExitOk;
}

int Main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "kvtierctl [flags] status | namespaces | prefixes NAMESPACE | drop "
      "NAMESPACE");
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() < 2) {
    std::fprintf(stderr, "usage: %s\n", absl::ProgramUsageMessage().data());
    return kExitUsage;
  }
  const std::string cmd = args[1];
  const std::string socket = ResolveClientSocket(absl::GetFlag(FLAGS_socket));
  auto channel = grpc::CreateChannel("unix:" + socket,
                                     grpc::InsecureChannelCredentials());
  auto stub = v1::TierService::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(
      absl::Now() + absl::Seconds(absl::GetFlag(FLAGS_timeout))));
  if (cmd == "status") return Status(*stub, ctx);
  if (cmd == "namespaces") return Namespaces(*stub, ctx);
  if ((cmd == "prefixes" || cmd == "drop") && args.size() < 3) {
    std::fprintf(stderr, "kvtierctl %s: name a namespace\n", cmd.c_str());
    return kExitUsage;
  }
  if (cmd == "prefixes") return Prefixes(*stub, ctx, args[2]);
  if (cmd == "drop") return Drop(*stub, ctx, args[2]);
  std::fprintf(stderr, "kvtierctl: unknown command '%s'\n", cmd.c_str());
  return kExitUsage;
}

}  // namespace
}  // namespace kvtier::cli

int main(int argc, char** argv) { return kvtier::cli::Main(argc, argv); }
