// transfer_bench's JSON output: the machine description (GPU, driver,
// PCIe link, NUMA node, host, CPU, kernel) and Bench::Json, the one object
// the benchmark prints on stdout (config, layouts, verify, measurements,
// gemm, section times, notes, errors). The keys are the benchmark's output
// contract: scripts read them.
//
// Thread-safety: MachineJson reads /proc and /sys and is safe from any
// thread; Bench::Json runs on the main thread after Run.

#include <cuda_runtime_api.h>
#include <sys/utsname.h>

#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "bench/transfer_bench.h"
#include "client/transfer_engine.h"
#include "client/transfer_plan.h"
#include "kernels/page_copy.h"

namespace kvtier::bench {
namespace {

std::string ReadFirstLine(const std::string& path) {
  std::ifstream f(path);
  std::string line;
  std::getline(f, line);
  return std::string(absl::StripAsciiWhitespace(line));
}

// The kernel module's version from /proc/driver/nvidia/version, whose first
// line reads "NVRM version: NVIDIA UNIX [Open ]Kernel Module [for x86_64]
// 580.159.04  Release Build ...": the first word after "Module" that starts
// with a digit.
std::string DriverVersion() {
  const std::string line = ReadFirstLine("/proc/driver/nvidia/version");
  const size_t at = line.find("Module");
  if (at == std::string::npos) return "unknown";
  for (absl::string_view w :
       absl::StrSplit(line.substr(at), ' ', absl::SkipEmpty())) {
    if (absl::ascii_isdigit(w[0]) && w.find('.') != absl::string_view::npos) {
      return std::string(w);
    }
  }
  return "unknown";
}

}  // namespace

std::string MachineJson(const cudaDeviceProp& prop) {
  int driver_api = 0, runtime = 0;
  cudaDriverGetVersion(&driver_api);
  cudaRuntimeGetVersion(&runtime);
  const std::string driver = DriverVersion();
  const std::string bus = absl::StrFormat("%04x:%02x:%02x.0", prop.pciDomainID,
                                          prop.pciBusID, prop.pciDeviceID);
  const std::string sys = "/sys/bus/pci/devices/" + bus + "/";
  const std::string link =
      absl::StrCat(ReadFirstLine(sys + "current_link_speed"), " x",
                   ReadFirstLine(sys + "current_link_width"));
  const std::string numa = ReadFirstLine(sys + "numa_node");
  utsname u{};
  uname(&u);
  std::string cpu = "unknown";
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.rfind("model name", 0) == 0) {
      cpu = std::string(
          absl::StripAsciiWhitespace(line.substr(line.find(':') + 1)));
      break;
    }
  }
  return absl::StrFormat(
      "{\"gpu\": %s, \"sms\": %d, \"gpu_memory_gib\": %.1f, \"driver\": %s, "
      "\"cuda_driver_api\": %d, \"cuda_runtime\": %d, \"pci_bus\": %s, "
      "\"pcie_link\": %s, \"gpu_numa_node\": %s, \"host\": %s, \"cpu\": %s, "
      "\"cpus\": %d, \"kernel\": %s, \"async_engines\": %d}",
      JsonString(prop.name), prop.multiProcessorCount,
      static_cast<double>(prop.totalGlobalMem) / kGiB, JsonString(driver),
      driver_api, runtime, JsonString(bus), JsonString(link), JsonString(numa),
      JsonString(u.nodename), JsonString(cpu),
      std::thread::hardware_concurrency(), JsonString(u.release),
      prop.asyncEngineCount);
}

std::string Bench::Json() const {
  std::string out = absl::StrFormat(
      "{\"benchmark\": \"transfer_bench\", \"date\": \"%s\",\n"
      " \"machine\": %s,\n",
      date_, MachineJson(prop_));
  absl::StrAppendFormat(
      &out,
      " \"config\": {\"pool_gib\": %.2f, \"arena_gib\": %.2f, \"quick\": %s, "
      "\"repeats\": %d, \"min_repeats\": %d, \"max_config_seconds\": %.2f, "
      "\"prefixes\": [%s], \"sweep_prefix\": %d, \"ctas\": [%s], "
      "\"default_ctas\": %d, \"staging_ctas\": [%s], "
      "\"default_staging_ctas\": %d, \"staging_bytes\": %d, "
      "\"first_slice_bytes\": %d, \"edge_slice_ctas\": %d, "
      "\"kvtier_variants\": %s, "
      "\"snapshots\": %d, \"slice_pages\": %d, \"row_run\": %d, "
      "\"row_run_lengths\": %s, \"mean_row_run\": %.2f, "
      "\"gbps\": \"1e9 bytes/s of payload\", \"host_memory\": "
      "\"MAP_SHARED|MAP_ANONYMOUS%s, populated, cudaHostRegister "
      "Mapped|Portable\"},\n",
      double(pool_bytes_) / kGiB, double(arena_bytes_) / kGiB,
      quick_ ? "true" : "false", policy_.repeats, policy_.min_repeats,
      policy_.max_seconds, absl::StrJoin(prefixes_, ", "), sweep_prefix_,
      absl::StrJoin(ctas_, ", "), kernels::kDefaultMaxCtas,
      absl::StrJoin(staging_ctas_, ", "), client::kDefaultStagingCtas,
      client::kDefaultStagingBytes, client::kAutoFirstSliceBytes,
      client::kDefaultEdgeSliceCtas,
      JsonString(absl::GetFlag(FLAGS_kvtier_variants)), snapshots_,
      client::kMaxSlicePages, absl::GetFlag(FLAGS_row_run),
      JsonString(absl::GetFlag(FLAGS_row_run_lengths)), HostRowMeanRun(),
      absl::GetFlag(FLAGS_huge_pages) ? "|MAP_HUGETLB (2 MiB pages)" : "");
  std::vector<std::string> layouts;
  for (const Bound& b : bounds_) {
    std::vector<std::string> banks;
    if (b.def->snapshot()) {
      banks.push_back(absl::StrFormat(
          "{\"name\": \"snapshot\", \"row_bytes\": %d, \"segments\": %d}",
          b.item_bytes, b.tensors.size()));
    } else {
      for (size_t k = 0; k < b.banks.size(); ++k) {
        banks.push_back(absl::StrFormat(
            "{\"name\": \"%s\", \"row_bytes\": %d, \"tensors\": %d}",
            b.banks[k].first, b.bank_row_bytes[k],
            b.def->banks[k].tensor_bytes.size()));
      }
    }
    layouts.push_back(absl::StrFormat(
        "{\"key\": \"%s\", \"name\": \"%s\", \"description\": %s, "
        "\"tokens_per_page\": %d, \"item_bytes\": %d, \"chunk_bytes\": %d, "
        "\"side_chunk_bytes\": %d, \"chunks_per_item\": %d, "
        "\"gpu_items\": %d, \"host_rows\": %d, \"banks\": [%s]}",
        b.def->key, b.def->name, JsonString(b.def->description),
        b.def->tokens_per_page, b.item_bytes, b.def->chunk_bytes,
        b.def->side_chunk_bytes, b.tensors.size(), b.gpu_items, b.host_rows,
        absl::StrJoin(banks, ", ")));
  }
  absl::StrAppend(&out, " \"layouts\": [\n  ", absl::StrJoin(layouts, ",\n  "),
                  "],\n");
  absl::StrAppend(&out, " \"verify\": {", absl::StrJoin(verify_, ", "), "},\n");
  std::vector<std::string> ms;
  for (const Record& r : records_) {
    double pct = 0;
    if (r.method != "contiguous") {
      for (const Record& c : records_) {
        if (c.method == "contiguous" && c.layout == r.layout &&
            c.prefix_tokens == r.prefix_tokens && c.direction == r.direction &&
            c.st.ms_p50 > 0) {
          pct = 100.0 * Gbps(r.bytes, r.st.ms_p50) / Gbps(c.bytes, c.st.ms_p50);
        }
      }
    }
    ms.push_back(RecordJson(r, pct));
  }
  absl::StrAppend(&out, " \"measurements\": [\n  ", absl::StrJoin(ms, ",\n  "),
                  "],\n");
  absl::StrAppend(&out,
                  " \"bidirectional_note\": \"memcpy_loop is not run "
                  "both ways: one host thread enqueues both streams\",\n");
  absl::StrAppend(&out, " \"interference\": ", interference_json_, ",\n");
  std::vector<std::string> secs;
  for (const auto& [name, s] : sections_) {
    secs.push_back(absl::StrFormat("%s: %.1f", JsonString(name), s));
  }
  std::vector<std::string> notes;
  for (const std::string& n : Notes()) notes.push_back(JsonString(n));
  std::vector<std::string> errs;
  for (const std::string& e : errors_) errs.push_back(JsonString(e));
  absl::StrAppendFormat(
      &out,
      " \"section_seconds\": {%s},\n \"wall_seconds\": %.1f,\n"
      " \"notes\": [%s],\n \"errors\": [%s]}\n",
      absl::StrJoin(secs, ", "), Elapsed(), absl::StrJoin(notes, ", "),
      absl::StrJoin(errs, ", "));
  return out;
}

}  // namespace kvtier::bench
