// FenceRegistry: instances, processes and connections that may still touch
// rows.
#include "daemon/fence_registry.h"

#include <fcntl.h>
#include <sys/stat.h>
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
#include "spdlog/spdlog.h"

namespace kvtier::daemon {
namespace {

constexpr absl::string_view kLineTag = "kvtier-fence-v1";

// "<tag> <instance hex> <pid> <start ticks> <connection> <crc32c of the
// rest, hex>\n"
std::string FormatLine(const InstanceKey& instance, const HolderKey& h) {
  std::string body = absl::StrCat(
      kLineTag, " ", absl::BytesToHexString(instance), " ", h.process.pid, " ",
      h.process.start_ticks, " ", h.connection);
  const uint32_t crc = Crc32c(body.data(), body.size());
  return absl::StrFormat("%s %08x\n", body, crc);
}

bool ParseLine(absl::string_view line, InstanceKey* instance, HolderKey* h) {
  std::vector<absl::string_view> f = absl::StrSplit(line, ' ');
  if (f.size() != 6 || f[0] != kLineTag) return false;
  const size_t body = line.size() - f[5].size() - 1;
  uint32_t crc = 0;
  if (f[5].size() != 8 || !absl::SimpleHexAtoi(f[5], &crc) ||
      crc != Crc32c(line.data(), body)) {
    return false;
  }
  // This abseil's HexStringToBytes does not report bad digits: check them.
  if (f[1].empty() || f[1].size() % 2 != 0 || f[1].size() > 128 ||
      f[1].find_first_not_of("0123456789abcdef") != absl::string_view::npos) {
    return false;
  }
  int64_t pid = 0;
  if (!absl::SimpleAtoi(f[2], &pid) || pid < 0 || pid > (1 << 30) ||
      !absl::SimpleAtoi(f[3], &h->process.start_ticks) ||
      !absl::SimpleAtoi(f[4], &h->connection)) {
    return false;
  }
  h->process.pid = static_cast<pid_t>(pid);
  *instance = absl::HexStringToBytes(f[1]);
  return true;
}

// The inode of process `pid`'s pid namespace; 0 when unknown (reading
// /proc/<pid>/ns/pid needs ptrace access: root, or the same uid).
uint64_t PidNamespace(pid_t pid) {
  struct stat st;
  const std::string path = absl::StrCat("/proc/", pid, "/ns/pid");
  return ::stat(path.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_ino) : 0;
}

}  // namespace

FenceRegistry::FenceRegistry(std::string path, FenceOptions options)
    : path_(std::move(path)), options_(options) {}

FenceRegistry::~FenceRegistry() {
  if (fd_ >= 0) ::close(fd_);
}

std::string FenceRegistry::Describe(const InstanceKey& instance) {
  return absl::BytesToHexString(instance);
}

absl::StatusOr<size_t> FenceRegistry::Recover() {
  absl::MutexLock lock(&mu_);
  if (path_.empty()) return 0;
  std::vector<std::pair<InstanceKey, HolderKey>> recorded;
  {
    std::ifstream in(path_);
    std::string line;
    size_t bad = 0;
    while (std::getline(in, line)) {
      InstanceKey instance;
      HolderKey h;
      if (ParseLine(line, &instance, &h)) {
        recorded.emplace_back(std::move(instance), h);
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
  for (auto& [instance, h] : recorded) {
    if (h.process.pid == 0) {
      if (!waiting_unseen_
               .try_emplace(std::make_pair(instance, h.connection),
                            now + options_.unseen_pid_hold)
               .second) {
        continue;
      }
      Instance& in = instances_[instance];
      in.unseen = true;
      in.last_close = now;
      recorded_.insert({instance, h});
      continue;
    }
    if (!processes_.contains(h.process)) {
      auto watch = ProcessWatch::Open(h.process.pid, h.process.start_ticks);
      if (!watch.ok()) continue;  // Exited while the daemon was down.
      Process& proc = processes_[h.process];
      proc.instance = instance;
      proc.watch = *std::move(watch);
      instances_[instance].processes.insert(h.process);
    }
    recorded_.insert({instance, h});
    waiting_.insert(h);
  }
  // Rewrite with the live ones only (temporary file, rename).
  const std::string tmp = path_ + ".tmp";
  const int fd =
      ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::InternalError(
        absl::StrCat(tmp, ": cannot create: ", std::strerror(errno)));
  }
  std::string all;
  for (const HolderKey& h : waiting_) {
    absl::StrAppend(&all, FormatLine(processes_[h.process].instance, h));
  }
  for (const auto& [key, deadline] : waiting_unseen_) {
    absl::StrAppend(&all, FormatLine(key.first, HolderKey{{}, key.second}));
  }
  const bool written =
      ::write(fd, all.data(), all.size()) == static_cast<ssize_t>(all.size());
  ::close(fd);
  if (!written || ::rename(tmp.c_str(), path_.c_str()) != 0) {
    ::unlink(tmp.c_str());
    return absl::InternalError(
        absl::StrCat(path_, ": cannot rewrite: ", std::strerror(errno)));
  }
  fd_ = ::open(path_.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
  if (fd_ < 0) {
    return absl::InternalError(
        absl::StrCat(path_, ": cannot open: ", std::strerror(errno)));
  }
  return waiting_.size() + waiting_unseen_.size();
}

void FenceRegistry::RecordLocked(const InstanceKey& instance,
                                 const HolderKey& holder) {
  if (path_.empty()) return;
  if (fd_ < 0) {
    fd_ =
        ::open(path_.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
  }
  const std::string line = FormatLine(instance, holder);
  if (fd_ < 0 || ::write(fd_, line.data(), line.size()) !=
                     static_cast<ssize_t>(line.size())) {
    SPDLOG_ERROR(
        "{}: cannot record instance {} pid {}: {}; its fence will not "
        "survive a daemon restart",
        path_, Describe(instance), holder.process.pid, std::strerror(errno));
  }
}

void FenceRegistry::OpenSession(uint64_t session,
                                const std::string& instance_id,
                                uint32_t fence_version,
                                uint64_t connection_id) {
  absl::MutexLock lock(&mu_);
  SessionEntry& e = sessions_[session];
  e.client_id = instance_id;
  if (instance_id.empty()) {
    e.instance = std::string("s:", 2);
    e.instance.append(reinterpret_cast<const char*>(&session), sizeof(session));
  } else {
    e.instance = instance_id;  // Until BindPeer binds it to credentials.
  }
  // A client without a connection id is one connection per session.
  e.holder.connection = connection_id != 0 ? connection_id : session;
  e.fence_version = fence_version;
  ++instances_[e.instance].sessions;
}

void FenceRegistry::BindPeer(uint64_t session, pid_t pid, uid_t uid) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(session);
  if (it == sessions_.end() || it->second.bound) return;
  SessionEntry& e = it->second;
  e.bound = true;
  // Not visible (pid 0): CloseSession applies the unseen-pid policy.
  absl::StatusOr<std::unique_ptr<ProcessWatch>> watch =
      absl::NotFoundError("pid not visible");
  uint64_t pid_namespace = 0;
  if (pid > 0) {
    watch = ProcessWatch::Open(pid);
    // Read while the watch holds the process: if it has not exited after,
    // the namespace was its (its pid was not reused meanwhile).
    if (watch.ok()) pid_namespace = PidNamespace(pid);
    if (watch.ok() && (*watch)->Exited()) pid_namespace = 0;
  }
  if (!e.client_id.empty()) {
    InstanceKey key = e.client_id;
    key.append(reinterpret_cast<const char*>(&uid), sizeof(uid));
    key.append(reinterpret_cast<const char*>(&pid_namespace),
               sizeof(pid_namespace));
    Instance& from = instances_[e.instance];
    if (from.sessions > 0) --from.sessions;
    e.instance = std::move(key);
    ++instances_[e.instance].sessions;
  }
  if (watch.ok()) {  // Else gone since connect(2): so is its session.
    e.holder.process = (*watch)->key();
    auto [p, inserted] = processes_.try_emplace(e.holder.process);
    if (inserted) {
      p->second.instance = e.instance;
      p->second.watch = *std::move(watch);
    }
    instances_[e.instance].processes.insert(e.holder.process);
  }
  if (e.attached) {  // Attached before its credentials were bound.
    if (e.holder.process.pid == 0) instances_[e.instance].unseen = true;
    if (recorded_.insert({e.instance, e.holder}).second) {
      RecordLocked(e.instance, e.holder);
    }
  }
}

void FenceRegistry::NoteHolder(uint64_t session) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(session);
  if (it == sessions_.end()) return;
  SessionEntry& e = it->second;
  e.attached = true;
  if (e.holder.process.pid == 0) instances_[e.instance].unseen = true;
  if (recorded_.insert({e.instance, e.holder}).second) {
    RecordLocked(e.instance, e.holder);
  }
}

void FenceRegistry::MarkQuiescent(uint64_t session) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(session);
  if (it != sessions_.end()) it->second.quiescent = true;
}

FenceRegistry::Closed FenceRegistry::CloseSession(uint64_t session) {
  absl::MutexLock lock(&mu_);
  Closed c;
  auto it = sessions_.find(session);
  if (it == sessions_.end()) {
    c.free_now = true;
    return c;
  }
  SessionEntry e = std::move(it->second);
  sessions_.erase(it);
  c.instance = e.instance;
  c.holder = e.holder;
  Instance& in = instances_[e.instance];
  if (in.sessions > 0) --in.sessions;
  in.last_close = absl::Now();
  // A holder never watchable: the unseen-pid policy keeps its instance.
  if (e.holder.process.pid == 0 && e.attached) in.unseen = true;
  // Another process of the instance may still read what this session
  // leased (vLLM's worker, the scheduler's leases): free at once only when
  // quiescent or when the whole instance is gone.
  c.free_now = e.quiescent || InstanceGoneLocked(e.instance, absl::Now());
  return c;
}

bool FenceRegistry::SessionOwner(uint64_t session, InstanceKey* instance,
                                 HolderKey* holder) const {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(session);
  if (it == sessions_.end()) return false;
  if (instance != nullptr) *instance = it->second.instance;
  if (holder != nullptr) *holder = it->second.holder;
  return true;
}

uint32_t FenceRegistry::FenceVersion(uint64_t session) const {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(session);
  return it == sessions_.end() ? 0 : it->second.fence_version;
}

void FenceRegistry::ReportComplete(uint64_t session) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(session);
  if (it == sessions_.end()) return;
  const SessionEntry& e = it->second;
  if (e.holder.process.pid != 0) {
    waiting_.erase(e.holder);
  } else {
    waiting_unseen_.erase(std::make_pair(e.instance, e.holder.connection));
  }
}

bool FenceRegistry::RestartHolder(uint64_t session) const {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(session);
  if (it == sessions_.end()) return false;
  const SessionEntry& e = it->second;
  if (e.holder.process.pid != 0) {
    for (const HolderKey& h : waiting_) {
      if (h.process == e.holder.process) return true;
    }
    return false;
  }
  for (const auto& [key, deadline] : waiting_unseen_) {
    if (key.first == e.instance) return true;
  }
  return false;
}

bool FenceRegistry::InstanceGoneLocked(const InstanceKey& key,
                                       absl::Time now) const {
  auto it = instances_.find(key);
  if (it == instances_.end()) return true;
  const Instance& in = it->second;
  if (in.sessions > 0) return false;
  for (const ProcessKey& k : in.processes) {
    auto p = processes_.find(k);
    if (p != processes_.end() && p->second.watch != nullptr &&
        !p->second.watch->Exited()) {
      return false;
    }
  }
  if (in.unseen && now - in.last_close < options_.unseen_pid_hold) {
    return false;
  }
  return true;
}

bool FenceRegistry::InstanceGone(const InstanceKey& instance) const {
  absl::MutexLock lock(&mu_);
  return InstanceGoneLocked(instance, absl::Now());
}

bool FenceRegistry::Poll() {
  absl::MutexLock lock(&mu_);
  bool changed = false;
  const absl::Time now = absl::Now();
  for (auto& [key, p] : processes_) {
    if (p.watch != nullptr && p.watch->Exited()) {
      p.watch.reset();
      changed = true;
    }
  }
  // Holders whose process exited (or is no longer known) are resolved.
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    auto cur = it++;
    auto p = processes_.find(cur->process);
    if (p == processes_.end() || p->second.watch == nullptr) {
      waiting_.erase(cur);
      changed = true;
    }
  }
  for (auto it = waiting_unseen_.begin(); it != waiting_unseen_.end();) {
    auto cur = it++;
    if (now >= cur->second) {
      waiting_unseen_.erase(cur);
      changed = true;
    }
  }
  for (auto it = instances_.begin(); it != instances_.end();) {
    auto cur = it++;
    if (!InstanceGoneLocked(cur->first, now)) continue;
    for (const ProcessKey& k : cur->second.processes) processes_.erase(k);
    instances_.erase(cur);
    changed = true;
  }
  return changed;
}

size_t FenceRegistry::restart_waiting() const {
  absl::MutexLock lock(&mu_);
  return waiting_.size() + waiting_unseen_.size();
}

std::vector<std::string> FenceRegistry::RestartWaitingNames(
    size_t limit) const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> out;
  absl::flat_hash_set<pid_t> pids;
  for (const HolderKey& k : waiting_) {
    if (out.size() >= limit) break;
    if (pids.insert(k.process.pid).second) {
      out.push_back(absl::StrCat("pid ", k.process.pid));
    }
  }
  for (size_t i = 0; i < waiting_unseen_.size() && out.size() < limit; ++i) {
    out.push_back("a process in a pid namespace the daemon cannot see");
  }
  return out;
}

size_t FenceRegistry::instances() const {
  absl::MutexLock lock(&mu_);
  const absl::Time now = absl::Now();
  size_t n = 0;
  for (const auto& [key, in] : instances_) {
    n += InstanceGoneLocked(key, now) ? 0 : 1;
  }
  return n;
}

size_t FenceRegistry::unseen_pid_processes() const {
  absl::MutexLock lock(&mu_);
  size_t n = 0;
  for (const auto& [id, e] : sessions_) {
    n += e.holder.process.pid == 0 && e.attached ? 1 : 0;
  }
  return n;
}

}  // namespace kvtier::daemon
