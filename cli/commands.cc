// kvtierctl's commands.
#include "cli/commands.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "cli/cluster_status.h"
#include "cli/table.h"
#include "google/protobuf/util/json_util.h"
#include "grpcpp/client_context.h"

namespace kvtier::cli {
namespace {

using Align = Table::Align;

constexpr Align kL = Align::kLeft;
constexpr Align kR = Align::kRight;

std::string Plural(uint64_t n, const std::string& one,
                   const std::string& many) {
  return absl::StrCat(FormatCount(n), " ", n == 1 ? one : many);
}

// Bytes of one page of one rank: the per-page banks' row sizes.
uint64_t PageBytes(const v1::Layout& layout) {
  uint64_t b = 0;
  for (const auto& bank : layout.page_banks()) b += bank.row_bytes();
  return b;
}

uint32_t StoredRanks(const v1::Layout& layout) {
  return layout.replicated() || layout.tp_size() == 0 ? 1 : layout.tp_size();
}

// Bytes of the namespace's committed rows and of all its rows.
std::pair<uint64_t, uint64_t> BankBytes(const v1::NamespaceInfo& ns) {
  uint64_t used = 0, total = 0;
  for (const auto& b : ns.banks()) {
    used += b.used_rows() * b.row_bytes();
    total += b.rows() * b.row_bytes();
  }
  return {used, total};
}

std::string Tp(const v1::Layout& layout) {
  return absl::StrCat(layout.tp_size() == 0 ? 1 : layout.tp_size(),
                      layout.replicated() ? " (replicated)" : "");
}

}  // namespace

ExitCode ExitCodeFor(const grpc::Status& status) {
  return status.error_code() == grpc::StatusCode::UNAVAILABLE ||
                 status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED
             ? kExitUnreachable
             : kExitDaemonError;
}

std::string RenderNamespaces(
    const google::protobuf::RepeatedPtrField<v1::NamespaceInfo>& namespaces) {
  Table t({{"NAMESPACE", kL},
           {"MODEL", kL},
           {"TOKENS/PAGE", kR},
           {"TP", kR},
           {"PAGES", kR},
           {"SNAPSHOTS", kR},
           {"PREFIXES", kR},
           {"CACHED", kR},
           {"SESSIONS", kR},
           {"HIT PAGES", kR},
           {"MISS PAGES", kR},
           {"HIT %", kR}});
  for (const auto& ns : namespaces) {
    t.AddRow({ns.name(), ns.layout().model(),
              FormatCount(ns.layout().tokens_per_page()), Tp(ns.layout()),
              FormatCount(ns.pages()), FormatCount(ns.snapshots()),
              FormatCount(ns.prefixes()), FormatBytes(BankBytes(ns).first),
              FormatCount(ns.sessions()), FormatCount(ns.hit_pages()),
              FormatCount(ns.miss_pages()),
              FormatPercent(ns.hit_pages(), ns.hit_pages() + ns.miss_pages())});
  }
  return t.Render();
}

std::string RenderStatus(const v1::StatsResponse& stats) {
  uint64_t used = 0, total = 0;
  for (const auto& ns : stats.namespaces()) {
    auto [u, t] = BankBytes(ns);
    used += u;
    total += t;
  }
  std::string out =
      absl::StrCat("kvtierd ", stats.version(), ", up ",
                   FormatElapsed(absl::Seconds(stats.uptime_seconds())), ", ",
                   Plural(stats.sessions(), "session", "sessions"), ", ",
                   Plural(stats.namespaces_size(), "namespace", "namespaces"),
                   ", ", FormatBytes(total), " of banks, ", FormatBytes(used),
                   " cached (", FormatPercent(used, total), ")\n");
  // The fence: rows kept for engines that may still touch them.
  uint64_t fenced = 0, holds = 0, waiting = 0;
  for (const auto& ns : stats.namespaces()) {
    for (const auto& b : ns.banks()) fenced += b.fenced_rows();
    holds += ns.fence_holds();
    waiting = std::max<uint64_t>(waiting, ns.restart_fence_processes());
  }
  if (fenced > 0 || holds > 0 || waiting > 0) {
    absl::StrAppend(&out, "fenced: ", FormatCount(fenced), " rows in ",
                    Plural(holds, "hold", "holds"));
    if (waiting > 0) {
      absl::StrAppend(&out, "; restart fence waiting for ",
                      Plural(waiting, "process", "processes"),
                      " from before the restart");
    }
    absl::StrAppend(&out, "\n");
  }
  for (const auto& u : stats.unrecoverable()) {
    absl::StrAppend(&out, "UNRECOVERABLE namespace '", u.name(),
                    "': ", u.reason(),
                    u.corrupt() ? " (drop it: kvtierctl drop --force "
                                : " (kvtierd retries; or drop it: kvtierctl "
                                  "drop --force ",
                    u.name(), ")\n");
  }
  absl::StrAppend(&out, RenderClusterStatus(stats.cluster()));
  if (stats.namespaces_size() == 0) return out;
  absl::StrAppend(&out, "\n", RenderNamespaces(stats.namespaces()), "\n");
  Table t({{"NAMESPACE", kL},
           {"BANK", kL},
           {"RANK", kR},
           {"ROW SIZE", kR},
           {"ROWS", kR},
           {"USED", kR},
           {"RESERVED", kR},
           {"FENCED", kR},
           {"FREE", kR},
           {"USE %", kR},
           {"SIZE", kR},
           {"MEMORY", kL},
           {"NODE", kR},
           {"FILE", kL}});
  for (const auto& ns : stats.namespaces()) {
    for (const auto& b : ns.banks()) {
      t.AddRow({ns.name(), b.bank(), absl::StrCat(b.rank()),
                FormatBytes(b.row_bytes()), FormatCount(b.rows()),
                FormatCount(b.used_rows()), FormatCount(b.reserved_rows()),
                FormatCount(b.fenced_rows()), FormatCount(b.free_rows()),
                FormatPercent(b.used_rows(), b.rows()),
                FormatBytes(b.rows() * b.row_bytes()),
                b.huge_pages() ? "2 MiB pages" : "4 KiB pages",
                b.numa_node() < 0 ? "-" : absl::StrCat(b.numa_node()),
                b.path()});
    }
  }
  out += t.Render();
  return out;
}

std::string RenderPrefixes(const std::string& ns,
                           const v1::ListPrefixesResponse& prefixes,
                           const std::string& order,
                           const v1::NamespaceInfo* info, absl::Time now) {
  if (prefixes.total_prefixes() == 0) {
    return absl::StrCat("no prefixes cached in '", ns, "'\n");
  }
  std::string out = absl::StrCat(
      "prefixes of '", ns, "': ", FormatCount(prefixes.total_prefixes()),
      " in all, showing ", FormatCount(prefixes.prefixes_size()), ", ",
      order == "recent" ? "most recently used" : "largest", " first\n\n");
  Table t({{"PREFIX", kL},
           {"TOKENS", kR},
           {"PAGES", kR},
           {"SNAPSHOTS", kR},
           {"SIZE", kR},
           {"PINS", kR},
           {"LAST USE", kR}});
  for (const auto& p : prefixes.prefixes()) {
    std::string size = "-";
    if (info != nullptr) {
      const uint64_t bytes =
          StoredRanks(info->layout()) *
          (uint64_t{p.pages()} * PageBytes(info->layout()) +
           uint64_t{p.snapshots()} * info->layout().snapshot_row_bytes());
      size = FormatBytes(bytes);
    }
    t.AddRow({HexPrefix(p.leaf_hash(), 8), FormatCount(p.tokens()),
              FormatCount(p.pages()), FormatCount(p.snapshots()), size,
              FormatCount(p.pins()), FormatAge(p.last_use_unix_ms(), now)});
  }
  out += t.Render();
  return out;
}

std::string RenderStats(const v1::StatsResponse& stats) {
  Table t({{"NAMESPACE", kL},
           {"LOOKUPS", kR},
           {"HIT PAGES", kR},
           {"MISS PAGES", kR},
           {"HIT %", kR},
           {"COMMITTED PAGES", kR},
           {"EVICTED PAGES", kR},
           {"EVICTED SNAPSHOTS", kR},
           {"SESSIONS", kR},
           {"LEASES", kR},
           {"RESERVATIONS", kR}});
  for (const auto& ns : stats.namespaces()) {
    t.AddRow({ns.name(), FormatCount(ns.lookups()), FormatCount(ns.hit_pages()),
              FormatCount(ns.miss_pages()),
              FormatPercent(ns.hit_pages(), ns.hit_pages() + ns.miss_pages()),
              FormatCount(ns.committed_pages()),
              FormatCount(ns.evicted_pages()),
              FormatCount(ns.evicted_snapshots()), FormatCount(ns.sessions()),
              FormatCount(ns.leases()), FormatCount(ns.reservations())});
  }
  return t.Render();
}

std::string RenderWatchFrame(const v1::StatsResponse* before,
                             const v1::StatsResponse& now_stats,
                             absl::Duration elapsed, absl::Time now) {
  absl::flat_hash_map<std::string, const v1::NamespaceInfo*> previous;
  if (before != nullptr) {
    for (const auto& ns : before->namespaces()) previous[ns.name()] = &ns;
  }
  const double seconds = absl::ToDoubleSeconds(elapsed);
  std::string out = absl::StrCat(
      "kvtierd ", now_stats.version(), ", up ",
      FormatElapsed(absl::Seconds(now_stats.uptime_seconds())), ", ",
      Plural(now_stats.sessions(), "session", "sessions"), ", at ",
      absl::FormatTime("%H:%M:%S", now, absl::LocalTimeZone()),
      before == nullptr ? " (rates from the next frame on)" : "", "\n\n");
  if (now_stats.namespaces_size() == 0) return out + "no namespaces\n";
  Table t({{"NAMESPACE", kL},
           {"SESSIONS", kR},
           {"PAGES", kR},
           {"CACHED", kR},
           {"USE %", kR},
           {"LOOKUPS", kR},
           {"HIT PAGES", kR},
           {"HIT %", kR},
           {"COMMITTED", kR},
           {"EVICTED", kR}});
  for (const auto& ns : now_stats.namespaces()) {
    auto [used, total] = BankBytes(ns);
    auto it = previous.find(ns.name());
    const v1::NamespaceInfo* p = it == previous.end() ? nullptr : it->second;
    auto rate = [&](uint64_t cur, uint64_t prev) -> std::string {
      if (p == nullptr || seconds <= 0) return "-";
      return FormatRate(cur >= prev ? (cur - prev) / seconds : 0);
    };
    const uint64_t hits =
        ns.hit_pages() - (p ? std::min(p->hit_pages(), ns.hit_pages()) : 0);
    const uint64_t misses =
        ns.miss_pages() - (p ? std::min(p->miss_pages(), ns.miss_pages()) : 0);
    t.AddRow({ns.name(), FormatCount(ns.sessions()), FormatCount(ns.pages()),
              FormatBytes(used), FormatPercent(used, total),
              rate(ns.lookups(), p ? p->lookups() : 0),
              rate(ns.hit_pages(), p ? p->hit_pages() : 0),
              FormatPercent(hits, hits + misses),
              rate(ns.committed_pages(), p ? p->committed_pages() : 0),
              rate(ns.evicted_pages(), p ? p->evicted_pages() : 0)});
  }
  out += t.Render();
  if (before != nullptr) {
    absl::StrAppendFormat(&out,
                          "\nLOOKUPS, HIT PAGES, COMMITTED and EVICTED per "
                          "second and HIT %% over the last %.1fs\n",
                          seconds);
  }
  return out;
}

std::string RenderVerify(const v1::VerifyResponse& verify) {
  if (verify.ok()) {
    return absl::StrCat(
        "ok: ", Plural(verify.namespaces_checked(), "namespace", "namespaces"),
        " checked, every invariant holds\n");
  }
  return absl::StrCat(
      "VIOLATION: ", verify.violation(), "\n(",
      Plural(verify.namespaces_checked(), "namespace", "namespaces"),
      " checked)\n");
}

absl::StatusOr<std::string> ParseHex(const std::string& hex) {
  if (hex.empty() || hex.size() % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("HASH: '", hex, "' is not an even number of hex digits"));
  }
  std::string out;
  for (size_t i = 0; i < hex.size(); i += 2) {
    int v = 0;
    for (size_t j = i; j < i + 2; ++j) {
      const char c = absl::ascii_tolower(hex[j]);
      int d;
      if (c >= '0' && c <= '9') {
        d = c - '0';
      } else if (c >= 'a' && c <= 'f') {
        d = c - 'a' + 10;
      } else {
        return absl::InvalidArgumentError(absl::StrCat(
            "HASH: '", hex, "' has a character that is not a hex digit"));
      }
      v = v * 16 + d;
    }
    out.push_back(static_cast<char>(v));
  }
  return out;
}

// ------------------------------------------------------------------- Ctl --

Ctl::Ctl(std::unique_ptr<v1::TierService::StubInterface> stub, Options options,
         std::FILE* out, std::FILE* err)
    : stub_(std::move(stub)),
      options_(std::move(options)),
      out_(out),
      err_(err) {}

void Ctl::Print(const std::string& text) {
  std::fwrite(text.data(), 1, text.size(), out_);
  std::fflush(out_);
}

int Ctl::PrintJson(const google::protobuf::Message& message, bool one_line) {
  std::string json;
  google::protobuf::util::JsonPrintOptions opts;
  opts.add_whitespace = !one_line;
  opts.always_print_primitive_fields = true;
  opts.preserve_proto_field_names = true;
  if (!google::protobuf::util::MessageToJsonString(message, &json, opts).ok()) {
    std::fprintf(err_, "kvtierctl: cannot print the answer as JSON\n");
    return kExitDaemonError;
  }
  if (json.empty() || json.back() != '\n') json += '\n';
  Print(json);
  return kExitOk;
}

int Ctl::Fail(const std::string& what, const grpc::Status& status) {
  const ExitCode code = ExitCodeFor(status);
  if (code == kExitUnreachable) {
    std::fprintf(err_,
                 "kvtierctl: %s: cannot reach kvtierd at %s: %s\n"
                 "(is it running? name its socket with --socket or "
                 "$KVTIER_SOCKET)\n",
                 what.c_str(), options_.socket.c_str(),
                 status.error_message().c_str());
  } else {
    std::fprintf(err_, "kvtierctl: %s: %s\n", what.c_str(),
                 status.error_message().c_str());
  }
  return code;
}

int Ctl::Usage(const std::string& message) {
  std::fprintf(err_, "kvtierctl: %s (see kvtierctl --help)\n", message.c_str());
  return kExitUsage;
}

std::unique_ptr<grpc::ClientContext> Ctl::Context() const {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + options_.timeout));
  return ctx;
}

int Ctl::Run(const std::vector<std::string>& args) {
  if (args.empty()) return Usage("name a command");
  const std::string& cmd = args[0];
  const size_t n = args.size() - 1;
  auto arity = [&](size_t min, size_t max, const char* what) -> bool {
    if (n >= min && n <= max) return true;
    Usage(absl::StrCat(cmd, ": ", what));
    return false;
  };
  if (cmd == "status") {
    return arity(0, 0, "takes no arguments") ? Status() : kExitUsage;
  }
  if (cmd == "namespaces") {
    return arity(0, 0, "takes no arguments") ? Namespaces() : kExitUsage;
  }
  if (cmd == "stats") {
    return arity(0, 0, "takes no arguments") ? Stats() : kExitUsage;
  }
  if (cmd == "verify") {
    return arity(0, 0, "takes no arguments") ? Verify() : kExitUsage;
  }
  if (cmd == "watch") {
    return arity(0, 0, "takes no arguments") ? Watch() : kExitUsage;
  }
  if (cmd == "prefixes") {
    return arity(1, 1, "name one namespace") ? Prefixes(args[1]) : kExitUsage;
  }
  if (cmd == "drop") {
    return arity(1, 2, "name a namespace and, optionally, a prefix's HASH")
               ? Drop(args[1], n == 2 ? args[2] : "")
               : kExitUsage;
  }
  return Usage(absl::StrCat("unknown command '", cmd, "'"));
}

int Ctl::Status() {
  v1::StatsResponse resp;
  grpc::Status s = stub_->Stats(Context().get(), v1::StatsRequest(), &resp);
  if (!s.ok()) return Fail("status", s);
  if (options_.json) return PrintJson(resp, false);
  Print(RenderStatus(resp));
  return kExitOk;
}

int Ctl::Namespaces() {
  v1::ListNamespacesResponse resp;
  grpc::Status s = stub_->ListNamespaces(Context().get(),
                                         v1::ListNamespacesRequest(), &resp);
  if (!s.ok()) return Fail("namespaces", s);
  if (options_.json) return PrintJson(resp, false);
  Print(resp.namespaces_size() == 0 ? "no namespaces\n"
                                    : RenderNamespaces(resp.namespaces()));
  return kExitOk;
}

int Ctl::Prefixes(const std::string& ns) {
  v1::ListPrefixesRequest req;
  req.set_namespace_(ns);
  if (options_.order == "largest") {
    req.set_order(v1::ListPrefixesRequest::ORDER_LARGEST);
  } else if (options_.order == "recent") {
    req.set_order(v1::ListPrefixesRequest::ORDER_RECENT);
  } else {
    return Usage(absl::StrCat("--order: '", options_.order,
                              "' is neither largest nor recent"));
  }
  if (options_.limit == 0 || options_.limit > 10000) {
    return Usage("--limit: between 1 and 10000");
  }
  req.set_limit(options_.limit);
  v1::ListPrefixesResponse resp;
  grpc::Status s = stub_->ListPrefixes(Context().get(), req, &resp);
  if (!s.ok()) return Fail("prefixes", s);
  if (options_.json) return PrintJson(resp, false);
  // Row sizes for the SIZE column; the table reads fine without them.
  v1::ListNamespacesResponse all;
  const v1::NamespaceInfo* info = nullptr;
  if (stub_->ListNamespaces(Context().get(), v1::ListNamespacesRequest(), &all)
          .ok()) {
    for (const auto& n : all.namespaces()) {
      if (n.name() == ns) info = &n;
    }
  }
  Print(RenderPrefixes(ns, resp, options_.order, info, absl::Now()));
  return kExitOk;
}

int Ctl::Stats() {
  v1::StatsResponse resp;
  grpc::Status s = stub_->Stats(Context().get(), v1::StatsRequest(), &resp);
  if (!s.ok()) return Fail("stats", s);
  if (options_.json) return PrintJson(resp, false);
  Print(resp.namespaces_size() == 0 ? "no namespaces\n" : RenderStats(resp));
  return kExitOk;
}

std::string Ctl::ResolveHash(const std::string& ns, const std::string& hex,
                             int* exit_code) {
  auto bytes = ParseHex(hex.size() % 2 == 0 ? hex : hex + "0");
  if (!bytes.ok() || hex.size() < 4) {
    *exit_code = Usage(bytes.ok() ? "HASH: give at least 4 hex digits"
                                  : std::string(bytes.status().message()));
    return "";
  }
  // A full SHA-256 or XXH3-128 hash is used as given.
  if (hex.size() == 64 || hex.size() == 32) return *bytes;
  v1::ListPrefixesRequest req;
  req.set_namespace_(ns);
  req.set_limit(10000);
  v1::ListPrefixesResponse resp;
  grpc::Status s = stub_->ListPrefixes(Context().get(), req, &resp);
  if (!s.ok()) {
    *exit_code = Fail("drop", s);
    return "";
  }
  const std::string want = absl::AsciiStrToLower(hex);
  std::vector<std::string> matches;
  for (const auto& p : resp.prefixes()) {
    if (absl::StartsWith(HexPrefix(p.leaf_hash(), p.leaf_hash().size()),
                         want)) {
      matches.push_back(p.leaf_hash());
    }
  }
  if (matches.size() == 1) return matches[0];
  if (matches.empty()) {
    std::fprintf(err_,
                 "kvtierctl: drop: no cached prefix of '%s' has a leaf hash "
                 "starting with %s (give the full hash to drop an inner "
                 "page)\n",
                 ns.c_str(), want.c_str());
    *exit_code = kExitDaemonError;
    return "";
  }
  *exit_code = Usage(absl::StrCat("HASH: ", want, " starts ", matches.size(),
                                  " prefixes' hashes; give more digits"));
  return "";
}

int Ctl::Drop(const std::string& ns, const std::string& hash_hex) {
  v1::DropRequest req;
  req.set_namespace_(ns);
  req.set_force(options_.force);
  if (!hash_hex.empty()) {
    int code = kExitOk;
    const std::string hash = ResolveHash(ns, hash_hex, &code);
    if (code != kExitOk) return code;
    req.set_hash(hash);
  }
  v1::DropResponse resp;
  grpc::Status s = stub_->Drop(Context().get(), req, &resp);
  if (!s.ok()) return Fail("drop", s);
  if (options_.json) return PrintJson(resp, false);
  Print(absl::StrCat(
      "dropped ",
      hash_hex.empty()
          ? absl::StrCat("namespace '", ns, "'")
          : absl::StrCat("prefix ", HexPrefix(req.hash(), 8), " of '", ns, "'"),
      ": ", Plural(resp.dropped_pages(), "page", "pages"), ", ",
      Plural(resp.dropped_snapshots(), "snapshot", "snapshots"), "\n"));
  return kExitOk;
}

int Ctl::Verify() {
  v1::VerifyResponse resp;
  grpc::Status s = stub_->Verify(Context().get(), v1::VerifyRequest(), &resp);
  if (!s.ok()) return Fail("verify", s);
  const int rc = resp.ok() ? kExitOk : kExitViolation;
  if (options_.json) {
    const int printed = PrintJson(resp, false);
    return printed != kExitOk ? printed : rc;
  }
  Print(RenderVerify(resp));
  return rc;
}

int Ctl::Watch() {
  if (options_.interval <= absl::ZeroDuration()) {
    return Usage("--interval: must be above 0");
  }
  if (options_.count < 0) return Usage("--count: must be 0 or more");
  std::unique_ptr<v1::StatsResponse> before;
  absl::Time before_at;
  for (int frame = 0; options_.count == 0 || frame < options_.count; ++frame) {
    if (frame > 0) absl::SleepFor(options_.interval);
    auto now_stats = std::make_unique<v1::StatsResponse>();
    grpc::Status s =
        stub_->Stats(Context().get(), v1::StatsRequest(), now_stats.get());
    const absl::Time at = absl::Now();
    if (!s.ok()) return Fail("watch", s);
    if (options_.json) {
      if (int rc = PrintJson(*now_stats, true); rc != kExitOk) return rc;
    } else {
      const std::string text =
          RenderWatchFrame(before.get(), *now_stats, at - before_at, at);
      // Home and clear, then the frame: the view is redrawn in place.
      Print(options_.redraw ? absl::StrCat("\x1b[H\x1b[2J", text)
                            : absl::StrCat(frame > 0 ? "\n" : "", text));
    }
    before = std::move(now_stats);
    before_at = at;
  }
  return kExitOk;
}

}  // namespace kvtier::cli
