// transfer_bench's shared helpers (see transfer_bench.h): CUDA statuses,
// progress lines, JSON strings and flag lists, and the timing harness with
// the result records it produces: TimeRepeats times one configuration's
// repeats with CUDA events under the --repeats / --min_repeats /
// --max_config_seconds policy; Summarize turns the times into the p50, p99,
// mean and minimum every record reports.
//
// Thread-safety: stateless functions (the program start time is a constant),
// safe from any thread; Events and TimeRepeats use the caller's stream.

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "bench/transfer_bench.h"

namespace kvtier::bench {
namespace {

const Clock::time_point kStart = Clock::now();

}  // namespace

absl::Status Cuda(cudaError_t err, absl::string_view what) {
  if (err == cudaSuccess) return absl::OkStatus();
  cudaGetLastError();
  return absl::InternalError(absl::StrCat(std::string(what), ": ",
                                          cudaGetErrorName(err), ": ",
                                          cudaGetErrorString(err)));
}

double Elapsed() {
  return std::chrono::duration<double>(Clock::now() - kStart).count();
}

std::string JsonString(absl::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += absl::StrFormat("\\u%04x", static_cast<int>(c));
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

std::vector<std::string> SplitList(const std::string& s) {
  std::vector<std::string> out;
  for (absl::string_view p : absl::StrSplit(s, ',', absl::SkipEmpty())) {
    out.emplace_back(absl::StripAsciiWhitespace(p));
  }
  return out;
}

std::vector<uint32_t> SplitUints(const std::string& s) {
  std::vector<uint32_t> out;
  for (const std::string& p : SplitList(s)) {
    uint32_t v = 0;
    if (absl::SimpleAtoi(p, &v) && v > 0) out.push_back(v);
  }
  return out;
}

bool Contains(const std::vector<std::string>& v, absl::string_view s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

Stats Summarize(std::vector<double> ms) {
  Stats s;
  if (ms.empty()) return s;
  std::sort(ms.begin(), ms.end());
  s.repeats = static_cast<int>(ms.size());
  s.ms_p50 = ms[(ms.size() - 1) / 2];
  const size_t p99 = (ms.size() * 99 + 99) / 100;  // ceil(0.99 n)
  s.ms_p99 = ms[std::min(ms.size(), std::max<size_t>(p99, 1)) - 1];
  s.ms_min = ms.front();
  double sum = 0;
  for (double v : ms) sum += v;
  s.ms_mean = sum / ms.size();
  return s;
}

double Gbps(uint64_t bytes, double ms) {
  return ms > 0 ? static_cast<double>(bytes) / 1e9 / (ms / 1e3) : 0;
}

absl::Status Events::Create() {
  BENCH_RETURN_IF_ERROR(Cuda(cudaEventCreate(&start), "cudaEventCreate"));
  BENCH_RETURN_IF_ERROR(Cuda(cudaEventCreate(&stop), "cudaEventCreate"));
  return Cuda(cudaEventCreate(&stop2), "cudaEventCreate");
}

absl::StatusOr<std::vector<double>> TimeRepeats(
    const std::function<absl::Status()>& prepare,
    const std::function<absl::Status(cudaStream_t)>& enqueue, cudaStream_t s,
    const Events& ev, const Policy& p) {
  std::vector<double> ms;
  Clock::time_point first;
  for (int i = -1; i < p.repeats; ++i) {
    if (i == 0) first = Clock::now();
    BENCH_RETURN_IF_ERROR(prepare());
    BENCH_RETURN_IF_ERROR(Cuda(cudaEventRecord(ev.start, s), "record"));
    BENCH_RETURN_IF_ERROR(enqueue(s));
    BENCH_RETURN_IF_ERROR(Cuda(cudaEventRecord(ev.stop, s), "record"));
    BENCH_RETURN_IF_ERROR(Cuda(cudaEventSynchronize(ev.stop), "transfer"));
    float t = 0;
    BENCH_RETURN_IF_ERROR(
        Cuda(cudaEventElapsedTime(&t, ev.start, ev.stop), "elapsed"));
    if (i < 0) continue;
    ms.push_back(t);
    const double spent =
        std::chrono::duration<double>(Clock::now() - first).count();
    if (static_cast<int>(ms.size()) >= p.min_repeats && p.max_seconds > 0 &&
        spent > p.max_seconds) {
      break;
    }
  }
  return ms;
}

std::string RecordJson(const Record& r, double pct_of_contiguous) {
  std::string s = absl::StrFormat(
      "{\"method\": \"%s\", \"layout\": \"%s\", \"layout_name\": \"%s\", "
      "\"prefix_tokens\": %d, \"items\": %d, \"direction\": \"%s\", "
      "\"bytes\": %d, \"chunk_bytes\": %d, \"side_chunk_bytes\": %d, "
      "\"ctas\": %d, \"sms\": %d, \"default_grid\": %s, \"repeats\": %d, "
      "\"ms_p50\": %.4f, \"ms_p99\": %.4f, \"ms_mean\": %.4f, "
      "\"gbps_p50\": %.3f, \"gbps_p99\": %.3f, \"gbps_mean\": %.3f, "
      "\"gbps_max\": %.3f",
      r.method, r.layout->key, r.layout->name, r.prefix_tokens, r.items,
      r.direction, r.bytes, r.layout->chunk_bytes, r.layout->side_chunk_bytes,
      r.ctas, r.sms, r.default_grid ? "true" : "false", r.st.repeats,
      r.st.ms_p50, r.st.ms_p99, r.st.ms_mean, Gbps(r.bytes, r.st.ms_p50),
      Gbps(r.bytes, r.st.ms_p99), Gbps(r.bytes, r.st.ms_mean),
      Gbps(r.bytes, r.st.ms_min));
  if (pct_of_contiguous > 0) {
    absl::StrAppendFormat(&s, ", \"pct_of_contiguous_p50\": %.1f",
                          pct_of_contiguous);
  }
  if (r.direction == "both") {
    absl::StrAppendFormat(
        &s, ", \"evict_gbps_p50\": %.3f, \"rehydrate_gbps_p50\": %.3f",
        r.evict_gbps_p50, r.rehydrate_gbps_p50);
  }
  return s + "}";
}

void Report(const Record& r) {
  Progress(
      "%-5s %-15s %6u %-9s %-12s ctas=%-3u %8.2f GB/s p50 %8.2f p99 "
      "(%d reps)",
      r.layout->key, r.layout->name, r.prefix_tokens, r.direction, r.method,
      r.ctas, Gbps(r.bytes, r.st.ms_p50), Gbps(r.bytes, r.st.ms_p99),
      r.st.repeats);
}

}  // namespace kvtier::bench
