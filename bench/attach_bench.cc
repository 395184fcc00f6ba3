// attach_bench: what it costs to bring a bank up and to attach an engine to
// it, on 4 KiB pages (a /dev/shm file) and on 2 MiB huge pages (a hugetlbfs
// file), for banks of --sizes_gib (default 8, 32 and 64 GiB).
//
// For each size and page kind, in this process:
//   populate_s    shm::Segment::Create with populate (ftruncate, fallocate,
//                 MAP_POPULATE, header): what the daemon pays once;
//   register_s    cudaHostRegister (Mapped | Portable, <= 64 GiB a call, the
//                 engine's own client/cuda_host.cc path) of the whole
//                 populated mapping, then unregister_s to undo it;
// then in a second, fresh process (this binary run again with --child), the
// engine's attach of the same file:
//   child.cuda_init_s   CUDA context creation (not part of the attach),
//   child.open_map_s    shm::Segment::Open (open, mmap, header checks),
//   child.register_s    cudaHostRegister of the whole mapping,
//   child.attach_s      open_map_s + register_s: the figure the <= 2 s target
//                       for 64 GiB on huge pages is about.
// The child also copies 1 MiB from the middle of the bank to the GPU through
// its device pointer, to show the mapping is usable. Times are wall clock
// (host work, nothing asynchronous). Prints one JSON object.
//
// Huge pages need a 2 MiB hugetlbfs mount with enough free pages (as root):
//   echo 33800 > /proc/sys/vm/nr_hugepages    # 66 GiB of 2 MiB pages
//   grep -q ' hugetlbfs ' /proc/mounts || { mkdir -p /dev/hugepages &&
//       mount -t hugetlbfs -o pagesize=2M none /dev/hugepages; }
// A bank of S GiB takes S * 512 + 1 pages (the header rounds the file up by
// one page). Sizes that do not fit, or no mount at all, are skipped with a
// note in "skipped". /dev/shm (tmpfs) defaults to half of RAM; for a 64 GiB
// bank on 4 KiB pages: mount -o remount,size=80G /dev/shm. Each bank is
// unlinked (its memory freed) before the next is made.
//
// Thread-safety: single-threaded.

#include <cuda_runtime_api.h>
#include <sys/types.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/cuda_host.h"
#include "shm/bank_header.h"
#include "shm/hugepages.h"
#include "shm/segment.h"

ABSL_FLAG(std::string, sizes_gib, "8,32,64", "Bank sizes to try, GiB");
ABSL_FLAG(std::string, kinds, "4k,huge",
          "Page kinds: 4k (a file in --shm_dir), huge (2 MiB hugetlbfs)");
ABSL_FLAG(std::string, shm_dir, "/dev/shm", "Directory of 4 KiB-page banks");
ABSL_FLAG(std::string, hugetlbfs_dir, "",
          "Directory on a 2 MiB hugetlbfs mount (empty: autodetect)");
ABSL_FLAG(bool, child, false, "Internal: attach --child_path and report");
ABSL_FLAG(std::string, child_path, "", "Internal: the bank the child attaches");

namespace kvtier::bench {
namespace {

using Clock = std::chrono::steady_clock;
constexpr uint64_t kGiB = 1ull << 30;
constexpr uint64_t kRowBytes = 2ull << 20;

double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::string JsonString(absl::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += absl::StrFormat("\\u%04x", static_cast<int>(c));
    } else {
      out += c;
    }
  }
  return out + "\"";
}

absl::Status Cuda(cudaError_t err, absl::string_view what) {
  if (err == cudaSuccess) return absl::OkStatus();
  cudaGetLastError();
  return absl::InternalError(
      absl::StrCat(std::string(what), ": ", cudaGetErrorString(err)));
}

std::string ReadFirstLine(const std::string& path) {
  std::ifstream f(path);
  std::string line;
  std::getline(f, line);
  return std::string(absl::StripAsciiWhitespace(line));
}

uint64_t MemTotalGiB() {
  std::ifstream f("/proc/meminfo");
  for (std::string line; std::getline(f, line);) {
    if (line.rfind("MemTotal:", 0) == 0) {
      uint64_t kb = 0;
      std::vector<std::string> w = absl::StrSplit(line, ' ', absl::SkipEmpty());
      if (w.size() >= 2 && absl::SimpleAtoi(w[1], &kb)) return kb >> 20;
    }
  }
  return 0;
}

std::string MachineJson() {
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
  std::string gpu = "none";
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess) gpu = prop.name;
  // "NVRM version: NVIDIA UNIX [Open ]Kernel Module [for x86_64]
  // 580.159.04 ...": the first word after "Module" that starts with a digit.
  std::string driver = "unknown";
  const std::string line = ReadFirstLine("/proc/driver/nvidia/version");
  const size_t at = line.find("Module");
  if (at != std::string::npos) {
    for (absl::string_view w :
         absl::StrSplit(line.substr(at), ' ', absl::SkipEmpty())) {
      if (absl::ascii_isdigit(w[0]) && w.find('.') != absl::string_view::npos) {
        driver = std::string(w);
        break;
      }
    }
  }
  return absl::StrFormat(
      "{\"host\": %s, \"cpu\": %s, \"cpus\": %d, \"kernel\": %s, "
      "\"mem_total_gib\": %d, \"gpu\": %s, \"driver\": %s, "
      "\"page_size\": %d, \"transparent_hugepage\": %s, "
      "\"shmem_thp\": %s}",
      JsonString(u.nodename), JsonString(cpu),
      std::thread::hardware_concurrency(), JsonString(u.release), MemTotalGiB(),
      JsonString(gpu), JsonString(driver), sysconf(_SC_PAGESIZE),
      JsonString(ReadFirstLine("/sys/kernel/mm/transparent_hugepage/enabled")),
      JsonString(
          ReadFirstLine("/sys/kernel/mm/transparent_hugepage/shmem_enabled")));
}

// --child: attach the bank at --child_path as an engine would and print one
// JSON object with the times.
int ChildMain() {
  const std::string path = absl::GetFlag(FLAGS_child_path);
  auto fail = [](const absl::Status& st) {
    std::printf("{\"error\": %s}\n", JsonString(st.ToString()).c_str());
    return 1;
  };
  Clock::time_point t0 = Clock::now();
  if (absl::Status st = Cuda(cudaSetDevice(0), "cudaSetDevice"); !st.ok()) {
    return fail(st);
  }
  if (absl::Status st = Cuda(cudaFree(nullptr), "CUDA init"); !st.ok()) {
    return fail(st);
  }
  const double cuda_init_s = Since(t0);

  t0 = Clock::now();
  absl::StatusOr<shm::Segment> seg = shm::Segment::Open(path);
  if (!seg.ok()) return fail(seg.status());
  const double open_map_s = Since(t0);

  t0 = Clock::now();
  if (absl::Status st =
          client::RegisterHostRange(seg->base(), seg->file_bytes());
      !st.ok()) {
    return fail(st);
  }
  const double register_s = Since(t0);

  // Usable: the device pointer is the host address (UVA), and a copy from
  // the middle of the bank goes through.
  void* dev = nullptr;
  bool usable = false;
  if (cudaHostGetDevicePointer(&dev, seg->base(), 0) == cudaSuccess &&
      dev == seg->base()) {
    void* buf = nullptr;
    const size_t n = 1 << 20;
    if (cudaMalloc(&buf, n) == cudaSuccess) {
      const uint64_t mid = seg->rows() / 2;
      usable = cudaMemcpy(buf, seg->row(mid), n, cudaMemcpyHostToDevice) ==
               cudaSuccess;
      cudaFree(buf);
    }
  }
  cudaGetLastError();

  t0 = Clock::now();
  client::UnregisterHostRange(seg->base(), seg->file_bytes());
  const double unregister_s = Since(t0);
  std::printf(
      "{\"pid\": %d, \"cuda_init_s\": %.4f, \"open_map_s\": %.4f, "
      "\"register_s\": %.4f, \"attach_s\": %.4f, \"unregister_s\": %.4f, "
      "\"huge_pages\": %s, \"file_bytes\": %llu, \"usable\": %s}\n",
      static_cast<int>(getpid()), cuda_init_s, open_map_s, register_s,
      open_map_s + register_s, unregister_s,
      seg->huge_pages() ? "true" : "false",
      static_cast<unsigned long long>(seg->file_bytes()),
      usable ? "true" : "false");
  return 0;
}

// Runs this binary with --child on `path`; returns its JSON line.
absl::StatusOr<std::string> RunChild(const std::string& path, double* wall_s) {
  int fds[2];
  if (pipe(fds) != 0) return absl::ErrnoToStatus(errno, "pipe");
  const Clock::time_point t0 = Clock::now();
  const pid_t pid = fork();
  if (pid < 0) return absl::ErrnoToStatus(errno, "fork");
  if (pid == 0) {
    dup2(fds[1], STDOUT_FILENO);
    close(fds[0]);
    close(fds[1]);
    const std::string arg = "--child_path=" + path;
    char child_flag[] = "--child";
    char self[] = "/proc/self/exe";
    char* argv[] = {self, child_flag, const_cast<char*>(arg.c_str()), nullptr};
    execv(self, argv);
    _exit(127);
  }
  close(fds[1]);
  std::string out;
  char buf[4096];
  for (;;) {
    const ssize_t n = read(fds[0], buf, sizeof(buf));
    if (n > 0) {
      out.append(buf, static_cast<size_t>(n));
    } else if (n == 0 || errno != EINTR) {
      break;
    }
  }
  close(fds[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  *wall_s = Since(t0);
  out = std::string(absl::StripAsciiWhitespace(out));
  if (out.empty() || out[0] != '{') {
    return absl::InternalError(
        absl::StrCat("child printed no JSON (status ", status, "): ", out));
  }
  return out;
}

struct Outcome {
  std::vector<std::string> results, skipped;
};

void RunOne(uint64_t size_gib, bool huge, Outcome* o) {
  const char* kind = huge ? "2m" : "4k";
  auto skip = [&](const std::string& why) {
    std::fprintf(stderr, "attach_bench: %llu GiB %s skipped: %s\n",
                 static_cast<unsigned long long>(size_gib), kind, why.c_str());
    o->skipped.push_back(
        absl::StrFormat("{\"size_gib\": %d, \"pages\": \"%s\", \"reason\": %s}",
                        size_gib, kind, JsonString(why)));
  };
  shm::SegmentSpec spec;
  spec.file_name =
      absl::StrCat("kvtier-attach-bench-", getpid(), "-", size_gib, "g-", kind);
  spec.namespace_name = "attach-bench";
  spec.bank = "kv";
  spec.rows = size_gib * kGiB / kRowBytes;
  spec.row_bytes = kRowBytes;
  shm::SegmentOptions opt;
  opt.shm_dir = absl::GetFlag(FLAGS_shm_dir);
  opt.hugetlbfs_dir = absl::GetFlag(FLAGS_hugetlbfs_dir);
  opt.huge_pages =
      huge ? shm::HugePagePolicy::kRequire : shm::HugePagePolicy::kOff;
  opt.populate = true;
  opt.mode = 0600;
  if (huge) {
    absl::StatusOr<shm::HugeTlbInfo> info =
        shm::DetectHugeTlbfs(opt.hugetlbfs_dir);
    if (!info.ok()) {
      skip(absl::StrCat("no usable hugetlbfs mount: ",
                        info.status().ToString()));
      return;
    }
    const uint64_t need = size_gib * kGiB / shm::kHugePageBytes + 1;
    if (info->free_pages < need) {
      skip(absl::StrCat("needs ", need, " free 2 MiB pages, ", info->mount,
                        " has ", info->free_pages, " (of ", info->total_pages,
                        "): raise vm.nr_hugepages"));
      return;
    }
  }
  Clock::time_point t0 = Clock::now();
  absl::StatusOr<shm::Segment> seg = shm::Segment::Create(spec, opt);
  const double populate_s = Since(t0);
  if (!seg.ok()) {
    skip(absl::StrCat("create: ", seg.status().ToString()));
    return;
  }
  std::fprintf(stderr, "attach_bench: %llu GiB %s populated in %.2f s at %s\n",
               static_cast<unsigned long long>(size_gib), kind, populate_s,
               seg->path().c_str());
  const std::string path = seg->path();
  std::string entry = absl::StrFormat(
      "{\"size_gib\": %d, \"pages\": \"%s\", \"path\": %s, \"file_bytes\": %d, "
      "\"huge_pages\": %s, \"populate_s\": %.4f",
      size_gib, kind, JsonString(path), seg->file_bytes(),
      seg->huge_pages() ? "true" : "false", populate_s);

  t0 = Clock::now();
  absl::Status st = client::RegisterHostRange(seg->base(), seg->file_bytes());
  const double register_s = Since(t0);
  if (st.ok()) {
    t0 = Clock::now();
    client::UnregisterHostRange(seg->base(), seg->file_bytes());
    absl::StrAppendFormat(&entry,
                          ", \"register_s\": %.4f, \"unregister_s\": %.4f",
                          register_s, Since(t0));
  } else {
    absl::StrAppendFormat(&entry, ", \"register_error\": %s",
                          JsonString(st.ToString()));
  }
  double wall = 0;
  absl::StatusOr<std::string> child = RunChild(path, &wall);
  if (child.ok()) {
    absl::StrAppendFormat(&entry, ", \"child\": %s, \"child_wall_s\": %.4f",
                          *child, wall);
  } else {
    absl::StrAppendFormat(&entry, ", \"child_error\": %s",
                          JsonString(child.status().ToString()));
  }
  entry += "}";
  std::fprintf(stderr, "attach_bench: %s\n", entry.c_str());
  o->results.push_back(entry);
  (void)shm::Segment::Unlink(path);
}

int Main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_child)) return ChildMain();
  const std::string date =
      absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::Now(), absl::UTCTimeZone());
  Clock::time_point t0 = Clock::now();
  const bool cuda = client::CudaDevicePresent() &&
                    cudaSetDevice(0) == cudaSuccess &&
                    cudaFree(nullptr) == cudaSuccess;
  const double cuda_init_s = Since(t0);
  std::string hugetlb = "null";
  if (absl::StatusOr<shm::HugeTlbInfo> info =
          shm::DetectHugeTlbfs(absl::GetFlag(FLAGS_hugetlbfs_dir));
      info.ok()) {
    hugetlb = absl::StrFormat(
        "{\"mount\": %s, \"free_pages\": %d, \"total_pages\": %d}",
        JsonString(info->mount), info->free_pages, info->total_pages);
  } else {
    hugetlb = absl::StrFormat("{\"error\": %s}",
                              JsonString(info.status().ToString()));
  }
  Outcome o;
  std::vector<uint64_t> sizes;
  for (absl::string_view s :
       absl::StrSplit(absl::GetFlag(FLAGS_sizes_gib), ',', absl::SkipEmpty())) {
    uint64_t v = 0;
    if (absl::SimpleAtoi(absl::StripAsciiWhitespace(s), &v) && v > 0) {
      sizes.push_back(v);
    }
  }
  std::vector<std::string> kinds =
      absl::StrSplit(absl::GetFlag(FLAGS_kinds), ',', absl::SkipEmpty());
  if (!cuda) {
    o.skipped.push_back(JsonString("no CUDA device: nothing registered"));
  } else {
    for (uint64_t size : sizes) {
      for (const std::string& k : kinds) {
        if (k == "4k" || k == "huge") RunOne(size, k == "huge", &o);
      }
    }
  }
  std::printf(
      "{\"benchmark\": \"attach_bench\", \"date\": \"%s\",\n"
      " \"machine\": %s,\n \"hugetlbfs\": %s,\n \"cuda_init_s\": %.4f,\n"
      " \"row_bytes\": %llu, \"register_chunk_gib\": %llu,\n"
      " \"results\": [\n  %s],\n \"skipped\": [%s]}\n",
      date.c_str(), MachineJson().c_str(), hugetlb.c_str(), cuda_init_s,
      static_cast<unsigned long long>(kRowBytes),
      static_cast<unsigned long long>(client::kMaxRegisterChunk / kGiB),
      absl::StrJoin(o.results, ",\n  ").c_str(),
      absl::StrJoin(o.skipped, ", ").c_str());
  return 0;
}

}  // namespace
}  // namespace kvtier::bench

int main(int argc, char** argv) { return kvtier::bench::Main(argc, argv); }
