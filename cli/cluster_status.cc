// kvtierctl's view of the cluster tier: see cluster_status.h.
//
// Thread-safety: stateless.
#include "cli/cluster_status.h"

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "cli/table.h"

namespace kvtier::cli {

using Align = Table::Align;
constexpr Align kL = Align::kLeft;
constexpr Align kR = Align::kRight;

std::string RenderClusterStatus(const v1::ClusterTierStatus& c) {
  if (!c.enabled()) return "";
  uint32_t masters = 0, masters_up = 0;
  for (const auto& n : c.nodes()) {
    if (!n.master()) continue;
    ++masters;
    masters_up += n.up();
  }
  std::string out = absl::StrCat(
      "cluster tier: ", masters_up, " of ", masters, " Redis masters up, ",
      FormatCount(c.covered_slots()), " of 16384 slots mapped, ",
      c.write_through() ? "write-through" : "spill on eviction", "\n");
  absl::StrAppend(&out, "  written ", FormatCount(c.spilled_values()),
                  " values (", FormatBytes(c.spilled_bytes()), "), dropped ",
                  FormatCount(c.spills_dropped()), ", failed ",
                  FormatCount(c.spills_failed()), ", queued ",
                  FormatBytes(c.spill_queue_bytes()), "\n");
  absl::StrAppend(&out, "  remote lookups ", FormatCount(c.probes()), " (",
                  FormatCount(c.probe_hit_pages()),
                  " pages found); prefetches ", FormatCount(c.prefetches()),
                  " (", FormatCount(c.prefetched_pages()), " pages, ",
                  FormatCount(c.prefetches_cut()), " cut short); fetched ",
                  FormatCount(c.fetched_values()), " values (",
                  FormatBytes(c.fetched_bytes()), "), rejected ",
                  FormatCount(c.rejected_values()), "\n");
  if (c.nodes_size() == 0) return out;
  Table t({{"REDIS NODE", kL},
           {"ROLE", kL},
           {"STATE", kL},
           {"SLOTS", kR},
           {"LAST ERROR", kL}});
  for (const auto& n : c.nodes()) {
    t.AddRow({n.address(), n.master() ? "master" : "replica",
              n.up() ? "up" : "DOWN", FormatCount(n.slots()),
              n.last_error().empty() ? "-" : n.last_error()});
  }
  absl::StrAppend(&out, t.Render("  "));
  return out;
}

}  // namespace kvtier::cli
