// GrpcGate (daemon/grpc_gate.h): accepting, the preface wait and the
// per-uid count of kvtierd's gRPC connections.
#include "daemon/grpc_gate.h"

#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "grpcpp/server.h"
#include "grpcpp/server_posix.h"
#include "spdlog/spdlog.h"

namespace kvtier::daemon {
namespace {

// What every HTTP/2 client sends first (RFC 9113, 3.4).
constexpr char kPreface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
constexpr size_t kPrefaceBytes = sizeof(kPreface) - 1;
// How often refusals are logged.
constexpr std::chrono::seconds kLogInterval(10);
// Accepting pauses this long when out of fds without a reserve fd.
constexpr std::chrono::milliseconds kAcceptPause(100);
// Connections accepted per wake-up before other events are handled.
constexpr int kAcceptBatch = 256;
// The epoll tags of the listener and the wake eventfd; connections are
// numbered from 1.
constexpr uint64_t kListenTag = 0;
constexpr uint64_t kWakeTag = ~uint64_t{0};

}  // namespace

GrpcGate::GrpcGate(grpc::Server* server, const GrpcGateOptions& options)
    : server_(server), options_([&] {
        GrpcGateOptions o = options;
        o.max_connections = std::max(1, o.max_connections);
        o.max_connections_per_uid = std::max(1, o.max_connections_per_uid);
        return o;
      }()) {}

GrpcGate::~GrpcGate() { Stop(); }

absl::Status GrpcGate::Start(const std::string& path) {
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("gRPC socket path too long: ", path));
  }
  listen_fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (listen_fd_ < 0) {
    return absl::InternalError(absl::StrCat("socket: ", strerror(errno)));
  }
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) !=
          0 ||
      ::listen(listen_fd_, SOMAXCONN) != 0) {
    const int err = errno;
    ::close(listen_fd_);
    listen_fd_ = -1;
    return absl::FailedPreconditionError(
        absl::StrCat("cannot listen on unix:", path, ": ", strerror(err)));
  }
  epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
  wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  epoll_event listen_ev{};
  listen_ev.events = EPOLLIN;
  listen_ev.data.u64 = kListenTag;
  epoll_event wake_ev{};
  wake_ev.events = EPOLLIN;
  wake_ev.data.u64 = kWakeTag;
  if (epoll_fd_ < 0 || wake_fd_ < 0 ||
      ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, listen_fd_, &listen_ev) != 0 ||
      ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &wake_ev) != 0) {
    const int err = errno;
    for (int* fd : {&epoll_fd_, &wake_fd_, &listen_fd_}) {
      if (*fd >= 0) ::close(*fd);
      *fd = -1;
    }
    ::unlink(path.c_str());
    return absl::InternalError(
        absl::StrCat("gRPC socket ", path, ": epoll: ", strerror(err)));
  }
  reserve_fd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  path_ = path;
  thread_ = std::thread([this] { Loop(); });
  SPDLOG_INFO(
      "gRPC on unix:{}: HTTP/2 preface within {}, {} connections per uid "
      "({} in all)",
      path, absl::FormatDuration(options_.preface_deadline),
      options_.max_connections_per_uid, options_.max_connections);
  return absl::OkStatus();
}

void GrpcGate::Stop() {
  if (listen_fd_ < 0) return;
  const uint64_t one = 1;
  (void)!::write(wake_fd_, &one, sizeof(one));
  if (thread_.joinable()) thread_.join();
  for (int* fd : {&epoll_fd_, &wake_fd_, &listen_fd_, &reserve_fd_}) {
    if (*fd >= 0) ::close(*fd);
    *fd = -1;
  }
}

int GrpcGate::NextTimeoutMs(Clock::time_point now) const {
  std::optional<Clock::time_point> next;
  if (!waiting_.empty()) next = conns_.at(waiting_.front()).deadline;
  if (accept_paused_ && (!next || accept_resume_ < *next)) {
    next = accept_resume_;
  }
  if (!next) return -1;
  if (*next <= now) return 0;
  // Rounded up: waking early would only loop.
  return static_cast<int>(
      std::chrono::ceil<std::chrono::milliseconds>(*next - now).count());
}

void GrpcGate::Loop() {
  epoll_event events[64];
  for (;;) {
    const int n =
        ::epoll_wait(epoll_fd_, events, 64, NextTimeoutMs(Clock::now()));
    if (n < 0 && errno != EINTR) {
      SPDLOG_ERROR("gRPC gate epoll_wait: {}", strerror(errno));
      break;
    }
    bool stop = false;
    for (int i = 0; i < n; ++i) {
      const uint64_t tag = events[i].data.u64;
      if (tag == kWakeTag) {
        stop = true;
      } else if (tag == kListenTag) {
        AcceptReady();
      } else {
        OnEvent(tag);  // A closed connection's stale event finds nothing.
      }
    }
    if (stop) break;
    const Clock::time_point now = Clock::now();
    while (!waiting_.empty() && conns_.at(waiting_.front()).deadline <= now) {
      Close(waiting_.front(), GrpcClose::kPrefaceDeadline);
    }
    if (accept_paused_ && accept_resume_ <= now) {
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.u64 = kListenTag;
      accept_paused_ =
          ::epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, listen_fd_, &ev) != 0;
      if (accept_paused_) accept_resume_ = now + kAcceptPause;
    }
  }
  // Waiting connections are closed; served ones stay gRPC's.
  while (!conns_.empty()) Close(conns_.begin()->first, std::nullopt);
}

void GrpcGate::AcceptReady() {
  for (int i = 0; i < kAcceptBatch && !accept_paused_; ++i) {
    const int fd =
        ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      if (errno == EMFILE || errno == ENFILE) {
        OnFdsExhausted(errno);
        continue;
      }
      SPDLOG_ERROR("gRPC gate accept: {}", strerror(errno));
      return;
    }
    ucred cred{};
    socklen_t len = sizeof(cred);
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
      ::close(fd);
      continue;
    }
    int& of_uid = per_uid_[cred.uid];
    if (of_uid >= options_.max_connections_per_uid ||
        total_.load(std::memory_order_relaxed) >= options_.max_connections) {
      const bool uid_cap = of_uid >= options_.max_connections_per_uid;
      if (of_uid == 0) per_uid_.erase(cred.uid);
      CountGrpcClose(uid_cap ? GrpcClose::kUidCap : GrpcClose::kCap);
      ::close(fd);
      LogRefusal(cred.uid, uid_cap);
      continue;
    }
    const uint64_t seq = next_seq_++;
    epoll_event ev{};
    // Edge-triggered: the preface is peeked, not read, so a level-triggered
    // wait would wake for the same bytes until the rest came.
    ev.events = EPOLLIN | EPOLLRDHUP | EPOLLET;
    ev.data.u64 = seq;
    if (::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
      SPDLOG_ERROR("gRPC gate epoll_ctl: {}", strerror(errno));
      if (of_uid == 0) per_uid_.erase(cred.uid);
      ::close(fd);
      continue;
    }
    ++of_uid;
    total_.fetch_add(1, std::memory_order_relaxed);
    AddGrpcConnections(1, 0);
    Conn& c = conns_[seq];
    c.fd = fd;
    c.uid = cred.uid;
    c.deadline =
        Clock::now() + absl::ToChronoNanoseconds(options_.preface_deadline);
    c.order = waiting_.insert(waiting_.end(), seq);
    // A gRPC client sends its preface right after connect: usually it is
    // here.
    OnEvent(seq);
  }
}

void GrpcGate::OnFdsExhausted(int err) {
  const Clock::time_point now = Clock::now();
  bool shed = false;
  if (!waiting_.empty()) {
    // The oldest connection still without a preface gives way.
    Close(waiting_.front(), GrpcClose::kNoFds);
    shed = true;
  } else if (reserve_fd_ >= 0) {
    // Room to accept the new connection and close it, so the listener
    // drains instead of staying readable (a busy loop).
    ::close(reserve_fd_);
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd >= 0) {
      CountGrpcClose(GrpcClose::kNoFds);
      ::close(fd);
      shed = true;
    }
    reserve_fd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  }
  if (!shed) {
    // Nothing to shed with: stop watching the listener for a moment.
    epoll_event ev{};
    ev.data.u64 = kListenTag;
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, listen_fd_, &ev);
    accept_paused_ = true;
    accept_resume_ = now + kAcceptPause;
  }
  ++refusals_;
  if (now - last_log_ >= kLogInterval) {
    SPDLOG_ERROR(
        "gRPC accept: {}: out of file descriptors ({} connections); {} "
        "refused since the last report (raise RLIMIT_NOFILE: LimitNOFILE= in "
        "the unit)",
        strerror(err), total_.load(std::memory_order_relaxed), refusals_);
    last_log_ = now;
    refusals_ = 0;
  }
}

void GrpcGate::LogRefusal(uid_t uid, bool uid_cap) {
  ++refusals_;
  const Clock::time_point now = Clock::now();
  if (now - last_log_ < kLogInterval) return;
  SPDLOG_WARN(
      "gRPC: refused {} connections since the last report, the latest from "
      "uid {} ({} {}, {} connections in all)",
      refusals_, uid,
      uid_cap ? "--grpc_max_connections_per_uid" : "--grpc_max_connections",
      uid_cap ? options_.max_connections_per_uid : options_.max_connections,
      total_.load(std::memory_order_relaxed));
  last_log_ = now;
  refusals_ = 0;
}

void GrpcGate::OnEvent(uint64_t seq) {
  auto it = conns_.find(seq);
  if (it == conns_.end()) return;
  Conn& c = it->second;
  if (c.served) {
    // Only a hang-up is watched on a served connection: it ended.
    Close(seq, std::nullopt);
    return;
  }
  char got[kPrefaceBytes];
  ssize_t r;
  do {
    r = ::recv(c.fd, got, sizeof(got), MSG_PEEK | MSG_DONTWAIT);
  } while (r < 0 && errno == EINTR);
  if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
  if (r <= 0) {
    Close(seq, std::nullopt);  // The peer left.
    return;
  }
  if (std::memcmp(got, kPreface, static_cast<size_t>(r)) != 0) {
    Close(seq, GrpcClose::kBadPreface);
    return;
  }
  if (static_cast<size_t>(r) == kPrefaceBytes) HandOver(seq);
}

void GrpcGate::HandOver(uint64_t seq) {
  Conn& c = conns_.at(seq);
  // The gate's own reference to the socket: it hangs up when the peer
  // closes or gRPC shuts the socket down, which is how the gate learns the
  // connection ended.
  const int watch = ::fcntl(c.fd, F_DUPFD_CLOEXEC, 0);
  if (watch < 0) {
    Close(seq, GrpcClose::kNoFds);
    return;
  }
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, c.fd, nullptr);
  epoll_event ev{};
  ev.events = 0;  // EPOLLHUP and EPOLLERR are always reported.
  ev.data.u64 = seq;
  if (::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, watch, &ev) != 0) {
    SPDLOG_ERROR("gRPC gate epoll_ctl: {}", strerror(errno));
    ::close(watch);
    Close(seq, std::nullopt);
    return;
  }
  waiting_.erase(c.order);
  const int fd = std::exchange(c.fd, watch);
  c.served = true;
  AddGrpcConnections(-1, 1);
  // gRPC owns `fd` from here.
  grpc::AddInsecureChannelFromFd(server_, fd);
}

void GrpcGate::Close(uint64_t seq, std::optional<GrpcClose> why) {
  auto it = conns_.find(seq);
  if (it == conns_.end()) return;
  Conn c = std::move(it->second);
  conns_.erase(it);
  if (!c.served) waiting_.erase(c.order);
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, c.fd, nullptr);
  if (why) CountGrpcClose(*why);  // Before the peer can see the close.
  ::close(c.fd);
  if (auto u = per_uid_.find(c.uid); u != per_uid_.end() && --u->second <= 0) {
    per_uid_.erase(u);
  }
  total_.fetch_sub(1, std::memory_order_relaxed);
  AddGrpcConnections(c.served ? 0 : -1, c.served ? -1 : 0);
}

}  // namespace kvtier::daemon
