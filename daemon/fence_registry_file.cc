// FenceRegistry's file (fence_registry.h, "Across daemon restarts"): the
// line format, Recover, appending a record and rewriting away dead lines.
//
// A line: "kvtier-fence-v2 <instance hex> <pid> <start ticks> <connection>
// <namespace hex, or - for every namespace> <crc32c of the rest, hex>".
// Older daemons wrote "kvtier-fence-v1" lines without the namespace field:
// they are read as every namespace. (An older daemon skips v2 lines as
// unreadable: downgrading forgets the recorded holders.)
//
// Thread-safety: as fence_registry.h; the file under io_mu_.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/crc32c.h"
#include "daemon/fence_registry.h"
#include "spdlog/spdlog.h"

namespace kvtier::daemon {
namespace {

constexpr absl::string_view kLineTagV1 = "kvtier-fence-v1";
constexpr absl::string_view kLineTag = "kvtier-fence-v2";

std::string FormatLine(const FenceRegistry::Record& r) {
  std::string body = absl::StrCat(
      kLineTag, " ", absl::BytesToHexString(r.instance), " ",
      r.holder.process.pid, " ", r.holder.process.start_ticks, " ",
      r.holder.connection, " ",
      r.ns.empty() ? std::string("-") : absl::BytesToHexString(r.ns));
  const uint32_t crc = Crc32c(body.data(), body.size());
  return absl::StrFormat("%s %08x\n", body, crc);
}

// This abseil's HexStringToBytes does not report bad digits: check them.
bool IsHex(absl::string_view s, size_t max) {
  return !s.empty() && s.size() % 2 == 0 && s.size() <= max &&
         s.find_first_not_of("0123456789abcdef") == absl::string_view::npos;
}

bool ParseLine(absl::string_view line, FenceRegistry::Record* r) {
  std::vector<absl::string_view> f = absl::StrSplit(line, ' ');
  const bool v1 = f.size() == 6 && f[0] == kLineTagV1;
  if (!v1 && !(f.size() == 7 && f[0] == kLineTag)) return false;
  const absl::string_view crc_hex = f.back();
  const size_t body = line.size() - crc_hex.size() - 1;
  uint32_t crc = 0;
  if (crc_hex.size() != 8 || !absl::SimpleHexAtoi(crc_hex, &crc) ||
      crc != Crc32c(line.data(), body)) {
    return false;
  }
  if (!IsHex(f[1], 128)) return false;
  int64_t pid = 0;
  if (!absl::SimpleAtoi(f[2], &pid) || pid < 0 || pid > (1 << 30) ||
      !absl::SimpleAtoi(f[3], &r->holder.process.start_ticks) ||
      !absl::SimpleAtoi(f[4], &r->holder.connection)) {
    return false;
  }
  r->ns.clear();
  if (!v1 && f[5] != "-") {
    if (!IsHex(f[5], 2048)) return false;
    r->ns = absl::HexStringToBytes(f[5]);
  }
  r->holder.process.pid = static_cast<pid_t>(pid);
  r->instance = absl::HexStringToBytes(f[1]);
  return true;
}

// The uid a bound instance key names (fence_registry.h, InstanceKey).
uid_t KeyUid(const InstanceKey& key) {
  if (key.size() != kInstanceIdBytes + sizeof(uid_t) + sizeof(uint64_t)) {
    return kUnboundUid;
  }
  uid_t uid = 0;
  std::memcpy(&uid, key.data() + kInstanceIdBytes, sizeof(uid));
  return uid;
}

}  // namespace

absl::StatusOr<size_t> FenceRegistry::Recover() {
  absl::MutexLock io(&io_mu_);
  absl::MutexLock lock(&mu_);
  if (path_.empty()) return 0;
  std::vector<Record> lines;
  {
    std::ifstream in(path_);
    std::string line;
    size_t bad = 0;
    while (std::getline(in, line)) {
      Record r;
      if (ParseLine(line, &r)) {
        lines.push_back(std::move(r));
      } else {
        ++bad;
      }
    }
    if (bad > 0) {
      SPDLOG_WARN(
          "{}: {} unreadable lines skipped (a torn last line is what a "
          "crash leaves)",
          path_, bad);
    }
  }
  const absl::Time now = absl::Now();
  auto wait_in = [](Waiting& w, const std::string& ns) {
    if (ns.empty()) {
      w.every = true;
    } else {
      w.namespaces.insert(ns);
    }
  };
  std::string all;
  for (Record& r : lines) {
    if (r.holder.process.pid == 0) {
      auto [it, inserted] = waiting_unseen_.try_emplace(
          std::make_pair(r.instance, r.holder.connection));
      if (inserted) it->second.give_up = now + options_.unseen_pid_hold;
      wait_in(it->second.in, r.ns);
      Instance& in = instances_[r.instance];
      in.unseen = true;
      in.last_close = now;
    } else {
      if (!processes_.contains(r.holder.process)) {
        auto watch = ProcessWatch::Open(r.holder.process.pid,
                                        r.holder.process.start_ticks);
        if (!watch.ok()) continue;  // Exited while the daemon was down.
        Process& proc = processes_[r.holder.process];
        proc.instance = r.instance;
        proc.watch = *std::move(watch);
        instances_[r.instance].processes.insert(r.holder.process);
      }
      wait_in(waiting_[r.holder], r.ns);
    }
    const uid_t uid = KeyUid(r.instance);
    if (recorded_.try_emplace(r, RecordState{uid, true}).second) {
      ++recorded_per_uid_[uid];
      absl::StrAppend(&all, FormatLine(r));
    }
  }
  // Rewrite with the live ones only.
  if (absl::Status s = RewriteLocked(all); !s.ok()) return s;
  file_lines_ = recorded_.size();
  return waiting_.size() + waiting_unseen_.size();
}

absl::Status FenceRegistry::RewriteLocked(const std::string& lines) {
  const std::string tmp = path_ + ".tmp";
  const int fd =
      ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::InternalError(
        absl::StrCat(tmp, ": cannot create: ", std::strerror(errno)));
  }
  const bool written = ::write(fd, lines.data(), lines.size()) ==
                       static_cast<ssize_t>(lines.size());
  ::close(fd);
  if (!written || ::rename(tmp.c_str(), path_.c_str()) != 0) {
    ::unlink(tmp.c_str());
    return absl::InternalError(
        absl::StrCat(path_, ": cannot rewrite: ", std::strerror(errno)));
  }
  if (fd_ >= 0) ::close(fd_);
  fd_ = ::open(path_.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
  if (fd_ < 0) {
    return absl::InternalError(
        absl::StrCat(path_, ": cannot open: ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

void FenceRegistry::WriteRecord(const Record& r) {
  {
    absl::MutexLock io(&io_mu_);
    if (hook_) hook_("fence:record");
    if (!path_.empty()) {
      if (fd_ < 0) {
        fd_ = ::open(path_.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC,
                     0600);
      }
      const std::string line = FormatLine(r);
      if (fd_ < 0 || ::write(fd_, line.data(), line.size()) !=
                         static_cast<ssize_t>(line.size())) {
        SPDLOG_ERROR(
            "{}: cannot record instance {} pid {}: {}; its fence will not "
            "survive a daemon restart",
            path_, Describe(r.instance), r.holder.process.pid,
            std::strerror(errno));
      }
    }
    absl::MutexLock lock(&mu_);
    ++file_lines_;
    auto it = recorded_.find(r);
    if (it != recorded_.end()) it->second.written = true;
    written_.SignalAll();
  }
  MaybeCompact();
}

void FenceRegistry::MaybeCompact() {
  // Busy writing: the next Poll rewrites (a Fence RPC's sweep never waits
  // for a stalled write).
  if (path_.empty() || !io_mu_.TryLock()) return;
  CompactLocked();
  io_mu_.Unlock();
}

void FenceRegistry::CompactLocked() {
  std::string all;
  size_t live = 0;
  {
    absl::MutexLock lock(&mu_);
    live = recorded_.size();
    const size_t dead = file_lines_ > live ? file_lines_ - live : 0;
    if (dead < kCompactAfter || dead <= live) return;
    // Lines being written are kept too (their writer appends them again).
    for (const auto& [r, state] : recorded_) {
      absl::StrAppend(&all, FormatLine(r));
    }
  }
  if (absl::Status s = RewriteLocked(all); !s.ok()) {
    SPDLOG_ERROR("{}", s.ToString());
    return;
  }
  absl::MutexLock lock(&mu_);
  file_lines_ = live;  // Appends wait for io_mu_.
}

}  // namespace kvtier::daemon
