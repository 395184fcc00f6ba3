// FastLookupServer: the fast lookup path's daemon side.
#include "daemon/fast_lookup_server.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/fast_lookup.h"
#include "daemon/metrics.h"
#include "daemon/peer_credentials.h"
#include "spdlog/spdlog.h"

namespace kvtier::daemon {

FastLookupServer::~FastLookupServer() { Stop(); }

absl::Status FastLookupServer::Start(const std::string& path, gid_t group) {
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("fast lookup socket path too long: ", path));
  }
  struct stat st;
  if (::lstat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) {
    ::unlink(path.c_str());
  }
  listen_fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listen_fd_ < 0) {
    return absl::InternalError(absl::StrCat("socket: ", strerror(errno)));
  }
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) !=
          0 ||
      ::listen(listen_fd_, 64) != 0) {
    const int err = errno;
    ::close(listen_fd_);
    listen_fd_ = -1;
    return absl::FailedPreconditionError(
        absl::StrCat("fast lookup socket ", path, ": ", strerror(err)));
  }
  if ((group != static_cast<gid_t>(-1) &&
       ::chown(path.c_str(), static_cast<uid_t>(-1), group) != 0) ||
      ::chmod(path.c_str(), 0660) != 0) {
    const int err = errno;
    ::close(listen_fd_);
    listen_fd_ = -1;
    ::unlink(path.c_str());
    return absl::FailedPreconditionError(
        absl::StrCat("fast lookup socket ", path, ": setting group ", group,
                     " and mode 0660: ", strerror(err)));
  }
  path_ = path;
  acceptor_ = std::thread([this] { AcceptLoop(); });
  return absl::OkStatus();
}

void FastLookupServer::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_ || listen_fd_ < 0) return;
    stopping_ = true;
    for (int fd : connections_) ::shutdown(fd, SHUT_RDWR);
  }
  ::shutdown(listen_fd_, SHUT_RDWR);
  if (acceptor_.joinable()) acceptor_.join();
  ::close(listen_fd_);
  ::unlink(path_.c_str());
  absl::flat_hash_map<uint64_t, std::thread> threads;
  {
    absl::MutexLock lock(&mu_);
    threads.swap(threads_);
  }
  for (auto& [id, t] : threads) t.join();
}

void FastLookupServer::ReapFinished() {
  std::vector<std::thread> done;
  {
    absl::MutexLock lock(&mu_);
    for (uint64_t id : finished_) {
      auto it = threads_.find(id);
      if (it == threads_.end()) continue;
      done.push_back(std::move(it->second));
      threads_.erase(it);
    }
    finished_.clear();
  }
  for (auto& t : done) t.join();
}

void FastLookupServer::AcceptLoop() {
  for (;;) {
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
      SPDLOG_ERROR("fast lookup accept: {}", strerror(errno));
      continue;
    }
    ReapFinished();
    absl::MutexLock lock(&mu_);
    if (stopping_ || connections_.size() >= kMaxConnections) {
      ::close(fd);
      if (stopping_) return;
      continue;
    }
    connections_.insert(fd);
    const uint64_t id = next_id_++;
    threads_[id] = std::thread([this, id, fd] { Serve(id, fd); });
  }
}

void FastLookupServer::Serve(uint64_t id, int fd) {
  using namespace fastpath;  // NOLINT: the protocol's own names.
  Hello hello;
  HelloReply hello_reply;
  bool ok = ReadFull(fd, &hello, sizeof(hello)) && hello.magic == kHelloMagic;
  if (ok) {
    if (hello.version != kVersion) {
      hello_reply.code =
          static_cast<int>(absl::StatusCode::kFailedPrecondition);
    } else {
      // The kernel's record of this peer becomes the session's identity
      // (daemon/peer_credentials.h); an unknown session is NOT_FOUND.
      auto peer = ReadPeerCredentials(fd);
      absl::Status bound =
          peer.ok() ? core_->BindPeerCredentials(hello.session_id, *peer)
                    : peer.status();
      hello_reply.code = static_cast<int>(bound.code());
    }
    iovec iov{&hello_reply, sizeof(hello_reply)};
    ok = WriteFullV(fd, &iov, 1) && hello_reply.code == 0;
  }
  std::string hashes;
  TierCore::LookupOutcome out;
  while (ok) {
    Request req;
    if (!ReadFull(fd, &req, sizeof(req)) || req.magic != kRequestMagic ||
        req.hash_bytes > kMaxRequestBytes) {
      break;
    }
    hashes.resize(req.hash_bytes);
    if (!ReadFull(fd, hashes.data(), hashes.size())) break;
    OpTimer timer(TimedOp::kLookup, Transport::kFastPath);
    absl::Status s =
        core_->LookupHashes(hello.session_id, req.namespace_id, hashes,
                            (req.flags & kFlagPin) != 0, &out);
    timer.Done(s.ok());
    Reply reply;
    std::string message;
    iovec iov[3];
    int n = 1;
    iov[0] = {&reply, sizeof(reply)};
    if (s.ok()) {
      reply.matched_pages = out.matched_pages;
      reply.usable_pages = out.usable_pages;
      reply.has_snapshot = out.has_snapshot;
      reply.snapshot_row = out.snapshot_row;
      reply.lease_id = out.lease_id;
      iov[n++] = {out.rows.data(), out.rows.size() * sizeof(uint32_t)};
    } else {
      reply.code = static_cast<int>(s.code());
      message = std::string(s.message());
      reply.message_bytes = static_cast<uint32_t>(message.size());
      iov[n++] = {message.data(), message.size()};
    }
    ok = WriteFullV(fd, iov, n);
  }
  {
    // Forget the fd before closing it, so Stop never shuts down a number
    // the kernel has handed to someone else.
    absl::MutexLock lock(&mu_);
    connections_.erase(fd);
    finished_.push_back(id);
  }
  ::close(fd);
}

}  // namespace kvtier::daemon
