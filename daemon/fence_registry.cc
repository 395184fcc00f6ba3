// FenceRegistry: instances, processes and connections that may still touch
// rows; what the restart fences wait for. The file: fence_registry_file.cc.
#include "daemon/fence_registry.h"

#include <sys/stat.h>
#include <unistd.h>

#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace kvtier::daemon {
namespace {

// The inode of process `pid`'s pid namespace; 0 when unknown (reading
// /proc/<pid>/ns/pid needs ptrace access: root, or the same uid).
uint64_t PidNamespace(pid_t pid) {
  struct stat st;
  const std::string path = absl::StrCat("/proc/", pid, "/ns/pid");
  return ::stat(path.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_ino) : 0;
}

}  // namespace

FenceRegistry::FenceRegistry(std::string path, FenceOptions options,
                             std::function<void(const char*)> hook)
    : path_(std::move(path)), options_(options), hook_(std::move(hook)) {}

FenceRegistry::~FenceRegistry() {
  absl::MutexLock io(&io_mu_);
  if (fd_ >= 0) ::close(fd_);
}

std::string FenceRegistry::Describe(const InstanceKey& instance) {
  return absl::BytesToHexString(instance);
}

absl::Status FenceRegistry::ClaimRecordLocked(const Record& r, uid_t uid,
                                              bool cap, bool* write) {
  *write = false;
  for (;;) {
    auto it = recorded_.find(r);
    if (it == recorded_.end()) break;
    if (it->second.written) return absl::OkStatus();
    written_.Wait(&mu_);  // Another call is writing it.
  }
  size_t& count = recorded_per_uid_[uid];
  if (cap && count >= options_.max_holders_per_uid) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "namespace: uid ", uid == kUnboundUid ? -1 : static_cast<int64_t>(uid),
        " has ", count,
        " client connections recorded as holding rows, the most one uid may "
        "(--max_fence_holders_per_uid); they are forgotten as their "
        "processes exit"));
  }
  ++count;
  recorded_.emplace(r, RecordState{uid, false});
  *write = true;
  return absl::OkStatus();
}

void FenceRegistry::DropRecordLocked(const Record& r) {
  auto it = recorded_.find(r);
  if (it == recorded_.end()) return;
  auto count = recorded_per_uid_.find(it->second.uid);
  if (count != recorded_per_uid_.end() && --count->second == 0) {
    recorded_per_uid_.erase(count);
  }
  recorded_.erase(it);
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
  // The process's watch and pid namespace, before any lock: /proc reads.
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
  std::vector<Record> to_write;
  {
    absl::MutexLock lock(&mu_);
    auto it = sessions_.find(session);
    if (it == sessions_.end() || it->second.bound) return;
    SessionEntry& e = it->second;
    e.bound = true;
    e.uid = uid;
    // Not visible (pid 0): CloseSession applies the unseen-pid policy.
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
      // Uncapped: it held rows already, under its unbound line. Copied
      // first: a claim may wait, releasing mu_ (and `e` with it).
      std::vector<Record> lines;
      for (const std::string& ns : e.namespaces) {
        lines.push_back(Record{e.instance, e.holder, ns});
      }
      for (const Record& r : lines) {
        bool write = false;
        (void)ClaimRecordLocked(r, uid, /*cap=*/false, &write);
        if (write) to_write.push_back(r);
      }
    }
  }
  for (const Record& r : to_write) WriteRecord(r);
}

absl::Status FenceRegistry::NoteHolder(uint64_t session,
                                       const std::string& ns) {
  Record r;
  {
    absl::MutexLock lock(&mu_);
    auto it = sessions_.find(session);
    if (it == sessions_.end()) return absl::OkStatus();
    SessionEntry& e = it->second;
    r = Record{e.instance, e.holder, ns};
    bool write = false;
    if (absl::Status s = ClaimRecordLocked(r, e.uid, /*cap=*/true, &write);
        !s.ok()) {
      return s;
    }
    // ClaimRecordLocked may have waited: the session may have closed.
    it = sessions_.find(session);
    if (it != sessions_.end()) {
      it->second.attached = true;
      it->second.namespaces.insert(ns);
      if (it->second.holder.process.pid == 0) {
        instances_[it->second.instance].unseen = true;
      }
    }
    if (!write) return absl::OkStatus();
  }
  WriteRecord(r);
  return absl::OkStatus();
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

void FenceRegistry::ReportComplete(uint64_t session,
                                   const std::vector<std::string>& namespaces,
                                   bool unresolved) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(session);
  if (it == sessions_.end()) return;
  const SessionEntry& e = it->second;
  // True when `w` waits for nothing more.
  auto resolve = [&](Waiting& w) {
    if (w.every) {
      if (unresolved) return false;
      return true;
    }
    for (const std::string& ns : namespaces) w.namespaces.erase(ns);
    return w.namespaces.empty();
  };
  if (e.holder.process.pid != 0) {
    auto w = waiting_.find(e.holder);
    if (w != waiting_.end() && resolve(w->second)) waiting_.erase(w);
  } else {
    auto w =
        waiting_unseen_.find(std::make_pair(e.instance, e.holder.connection));
    if (w != waiting_unseen_.end() && resolve(w->second.in)) {
      waiting_unseen_.erase(w);
    }
  }
}

bool FenceRegistry::RestartHolder(uint64_t session,
                                  const std::string& ns) const {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(session);
  if (it == sessions_.end()) return false;
  const SessionEntry& e = it->second;
  if (e.holder.process.pid != 0) {
    for (const auto& [h, w] : waiting_) {
      if (h.process == e.holder.process && w.Covers(ns)) return true;
    }
    return false;
  }
  for (const auto& [key, w] : waiting_unseen_) {
    if (key.first == e.instance && w.in.Covers(ns)) return true;
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
  bool changed = false;
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = absl::Now();
    for (auto& [key, p] : processes_) {
      if (p.watch != nullptr && p.watch->Exited()) {
        p.watch.reset();
        changed = true;
      }
    }
    auto exited = [&](const ProcessKey& k) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      auto p = processes_.find(k);
      return p == processes_.end() || p->second.watch == nullptr;
    };
    // Holders whose process exited (or is no longer known) are resolved.
    for (auto it = waiting_.begin(); it != waiting_.end();) {
      auto cur = it++;
      if (exited(cur->first.process)) {
        waiting_.erase(cur);
        changed = true;
      }
    }
    for (auto it = waiting_unseen_.begin(); it != waiting_unseen_.end();) {
      auto cur = it++;
      if (now >= cur->second.give_up) {
        waiting_unseen_.erase(cur);
        changed = true;
      }
    }
    // Lines of exited processes and gone unseen instances hold nothing.
    std::vector<Record> dead;
    for (const auto& [r, state] : recorded_) {
      if (!state.written) continue;
      if (r.holder.process.pid != 0
              ? exited(r.holder.process)
              : InstanceGoneLocked(r.instance, now) &&
                    !waiting_unseen_.contains(
                        std::make_pair(r.instance, r.holder.connection))) {
        dead.push_back(r);
      }
    }
    for (const Record& r : dead) DropRecordLocked(r);
    for (auto it = instances_.begin(); it != instances_.end();) {
      auto cur = it++;
      if (!InstanceGoneLocked(cur->first, now)) continue;
      for (const ProcessKey& k : cur->second.processes) processes_.erase(k);
      instances_.erase(cur);
      changed = true;
    }
  }
  MaybeCompact();
  return changed;
}

size_t FenceRegistry::restart_waiting() const {
  absl::MutexLock lock(&mu_);
  return waiting_.size() + waiting_unseen_.size();
}

size_t FenceRegistry::RestartWaiting(const std::string& ns) const {
  absl::MutexLock lock(&mu_);
  size_t n = 0;
  for (const auto& [h, w] : waiting_) n += w.Covers(ns) ? 1 : 0;
  for (const auto& [k, w] : waiting_unseen_) n += w.in.Covers(ns) ? 1 : 0;
  return n;
}

std::vector<std::string> FenceRegistry::RestartWaitingNames(
    const std::string& ns, size_t limit) const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> out;
  absl::flat_hash_set<pid_t> pids;
  for (const auto& [h, w] : waiting_) {
    if (out.size() >= limit) break;
    if (w.Covers(ns) && pids.insert(h.process.pid).second) {
      out.push_back(absl::StrCat("pid ", h.process.pid));
    }
  }
  for (const auto& [k, w] : waiting_unseen_) {
    if (out.size() >= limit) break;
    if (w.in.Covers(ns)) {
      out.push_back("a process in a pid namespace the daemon cannot see");
    }
  }
  return out;
}

size_t FenceRegistry::recorded() const {
  absl::MutexLock lock(&mu_);
  return recorded_.size();
}

size_t FenceRegistry::file_lines() const {
  absl::MutexLock lock(&mu_);
  return file_lines_;
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
