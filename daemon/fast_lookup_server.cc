// FastLookupServer: the fast lookup path's daemon side.
#include "daemon/fast_lookup_server.h"

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
#include <optional>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/error_reason.h"
#include "daemon/metrics.h"
#include "daemon/peer_credentials.h"
#include "daemon/socket_staging.h"
#include "spdlog/spdlog.h"

namespace kvtier::daemon {
namespace {

static_assert(fastpath::kMaxLookupHashes == kMaxLookupPages,
              "the fast path's request cap follows the lookup page limit");
static_assert(fastpath::kMaxHashBytes == sizeof(HashKey::bytes),
              "the fast path's request cap follows the longest hash");

// How often the same kind of refusal is logged.
constexpr std::chrono::seconds kLogInterval(10);
// Accepting pauses this long when out of fds without a reserve fd.
constexpr std::chrono::milliseconds kAcceptPause(100);
// Connections accepted per wake-up before pending Hellos are read.
constexpr int kAcceptBatch = 256;

// Answers first frame `first` with `code` on non-blocking `fd` (a fresh
// socket's buffer always has room for it), in the reply its kind expects: an
// OpenReply to an Open, else a HelloReply; best effort.
void RefuseHello(int fd, const fastpath::Hello& first, absl::StatusCode code) {
  fastpath::OpenReply open;
  fastpath::HelloReply hello;
  open.code = hello.code = static_cast<int>(code);
  if (first.magic == fastpath::kOpenMagic) {
    (void)::send(fd, &open, sizeof(open), MSG_NOSIGNAL | MSG_DONTWAIT);
  } else {
    (void)::send(fd, &hello, sizeof(hello), MSG_NOSIGNAL | MSG_DONTWAIT);
  }
}

}  // namespace

FastLookupServer::FastLookupServer(TierCore* core,
                                   const FastLookupOptions& options)
    : core_(core),
      options_([&] {
        FastLookupOptions o = options;
        o.max_pending_per_uid = std::max(1, o.max_pending_per_uid);
        o.max_pending = std::max(1, o.max_pending);
        o.max_request_bytes =
            std::min(o.max_request_bytes, fastpath::kMaxRequestBytes);
        o.max_sessions_per_uid = std::max(1, o.max_sessions_per_uid);
        return o;
      }()),
      uid_sessions_(options_.max_sessions_per_uid,
                    [core](uint64_t id) { return core->SessionOpen(id); }) {}

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
  // Bound out of reach; it appears at `path` only with its group and mode
  // set (daemon/socket_staging.h).
  absl::StatusOr<StagedSocket> staged =
      StagedSocket::Create(path, "fast lookup socket");
  if (!staged.ok()) return staged.status();
  listen_fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (listen_fd_ < 0) {
    return absl::InternalError(absl::StrCat("socket: ", strerror(errno)));
  }
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, staged->bind_path().c_str(),
              staged->bind_path().size() + 1);
  if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) !=
          0 ||
      ::listen(listen_fd_, SOMAXCONN) != 0) {
    const int err = errno;
    ::close(listen_fd_);
    listen_fd_ = -1;
    return absl::FailedPreconditionError(
        absl::StrCat("fast lookup socket ", path, ": ", strerror(err)));
  }
  if (absl::Status s = staged->Publish(group, 0660); !s.ok()) {
    ::close(listen_fd_);
    listen_fd_ = -1;
    return s;
  }
  epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
  wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  epoll_event listen_ev{};
  listen_ev.events = EPOLLIN;
  listen_ev.data.u64 = 0;  // Pending connections are numbered from 1.
  epoll_event wake_ev{};
  wake_ev.events = EPOLLIN;
  wake_ev.data.u64 = ~uint64_t{0};
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
        absl::StrCat("fast lookup socket ", path, ": epoll: ", strerror(err)));
  }
  reserve_fd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  path_ = path;
  acceptor_ = std::thread([this] { AcceptLoop(); });
  SPDLOG_INFO(
      "fast lookup on {}: Hello within {}, {} pending per uid ({} in all), "
      "{} served ({} per uid), requests up to {} bytes, idle call "
      "connections closed after {}, frames whole within {}, {} sessions "
      "per uid",
      path, absl::FormatDuration(options_.hello_deadline),
      options_.max_pending_per_uid, options_.max_pending,
      options_.max_connections, options_.max_connections_per_uid,
      options_.max_request_bytes, absl::FormatDuration(options_.idle_timeout),
      absl::FormatDuration(options_.frame_deadline),
      options_.max_sessions_per_uid);
  return absl::OkStatus();
}

void FastLookupServer::DrainSessions() {
  absl::MutexLock lock(&mu_);
  const fastpath::Control draining{
      .kind = static_cast<uint32_t>(fastpath::ControlKind::kDraining)};
  // The session connection's only other daemon write, the OpenReply, is
  // done before it registers here: nothing interleaves.
  for (int fd : sessions_) {
    (void)::send(fd, &draining, sizeof(draining), MSG_NOSIGNAL | MSG_DONTWAIT);
  }
}

void FastLookupServer::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_ || listen_fd_ < 0) return;
    stopping_ = true;
    for (int fd : connections_) ::shutdown(fd, SHUT_RDWR);
  }
  const uint64_t one = 1;
  (void)!::write(wake_fd_, &one, sizeof(one));
  if (acceptor_.joinable()) acceptor_.join();
  ::close(listen_fd_);
  ::close(epoll_fd_);
  ::close(wake_fd_);
  if (reserve_fd_ >= 0) ::close(reserve_fd_);
  ::unlink(path_.c_str());
  absl::flat_hash_map<uint64_t, std::thread> threads;
  {
    absl::MutexLock lock(&mu_);
    threads.swap(threads_);
  }
  for (auto& [id, t] : threads) t.join();
}

int FastLookupServer::served_connections() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(connections_.size());
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

int FastLookupServer::NextTimeoutMs(Clock::time_point now) const {
  std::optional<Clock::time_point> next;
  if (!order_.empty()) next = pending_.at(order_.front()).deadline;
  if (accept_paused_ && (!next || accept_resume_ < *next)) {
    next = accept_resume_;
  }
  if (!next) return -1;
  if (*next <= now) return 0;
  // Rounded up: waking early would only loop.
  return static_cast<int>(
      std::chrono::ceil<std::chrono::milliseconds>(*next - now).count());
}

void FastLookupServer::AcceptLoop() {
  epoll_event events[64];
  for (;;) {
    const int n =
        ::epoll_wait(epoll_fd_, events, 64, NextTimeoutMs(Clock::now()));
    if (n < 0 && errno != EINTR) {
      SPDLOG_ERROR("fast lookup epoll_wait: {}", strerror(errno));
      break;
    }
    bool stop = false;
    for (int i = 0; i < n; ++i) {
      const uint64_t tag = events[i].data.u64;
      if (tag == ~uint64_t{0}) {
        stop = true;
      } else if (tag == 0) {
        AcceptReady();
      } else {
        ReadHello(tag);  // A closed connection's stale event finds nothing.
      }
    }
    if (stop) break;
    ReapFinished();
    const Clock::time_point now = Clock::now();
    while (!order_.empty() && pending_.at(order_.front()).deadline <= now) {
      ClosePending(order_.front(), FastLookupClose::kHelloDeadline);
    }
    if (accept_paused_ && accept_resume_ <= now) {
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.u64 = 0;
      accept_paused_ =
          ::epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, listen_fd_, &ev) != 0;
      if (accept_paused_) accept_resume_ = now + kAcceptPause;
    }
  }
  while (!order_.empty()) ClosePending(order_.front(), std::nullopt);
}

void FastLookupServer::AcceptReady() {
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
      SPDLOG_ERROR("fast lookup accept: {}", strerror(errno));
      return;
    }
    ucred cred{};
    socklen_t len = sizeof(cred);
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
      ::close(fd);
      continue;
    }
    // Room first: the uid's oldest pending connection, then the oldest of
    // all, give way to this one.
    auto same_uid = by_uid_.find(cred.uid);
    if (same_uid != by_uid_.end() &&
        same_uid->second.size() >=
            static_cast<size_t>(options_.max_pending_per_uid)) {
      ClosePending(same_uid->second.front(), FastLookupClose::kUidCap);
    }
    if (pending_.size() >= static_cast<size_t>(options_.max_pending)) {
      ClosePending(order_.front(), FastLookupClose::kPendingCap);
    }
    const uint64_t seq = next_seq_++;
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.u64 = seq;
    if (::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
      SPDLOG_ERROR("fast lookup epoll_ctl: {}", strerror(errno));
      ::close(fd);
      continue;
    }
    Pending& p = pending_[seq];
    p.fd = fd;
    p.uid = cred.uid;
    p.deadline =
        Clock::now() + absl::ToChronoNanoseconds(options_.hello_deadline);
    p.order_pos = order_.insert(order_.end(), seq);
    std::list<uint64_t>& mine = by_uid_[cred.uid];
    p.uid_pos = mine.insert(mine.end(), seq);
    AddFastLookupConnections(1, 0);
    // An engine sends its Hello right after connect: usually it is here.
    ReadHello(seq);
  }
}

void FastLookupServer::OnFdsExhausted(int err) {
  const Clock::time_point now = Clock::now();
  bool shed = false;
  if (!order_.empty()) {
    // The oldest connection still without a Hello gives way, as at the
    // pending caps: a flood cannot keep an engine out by exhausting fds.
    ClosePending(order_.front(), FastLookupClose::kNoFds);
    shed = true;
  } else if (reserve_fd_ >= 0) {
    // The reserve fd makes room to accept the connection and close it, so
    // the listener drains instead of staying readable (a busy loop).
    ::close(reserve_fd_);
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd >= 0) {
      CountFastLookupClose(FastLookupClose::kNoFds);
      ::close(fd);
      shed = true;
    }
    reserve_fd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  }
  if (!shed) {
    // Nothing to shed with: stop watching the listener for a moment.
    epoll_event ev{};
    ev.data.u64 = 0;
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, listen_fd_, &ev);
    accept_paused_ = true;
    accept_resume_ = now + kAcceptPause;
  }
  ++fd_refusals_;
  if (now - last_fd_log_ >= kLogInterval) {
    SPDLOG_ERROR(
        "fast lookup accept: {}: out of file descriptors ({} pending, {} "
        "served connections); {} connections shed since the last report "
        "(raise RLIMIT_NOFILE: LimitNOFILE= in the unit)",
        strerror(err), pending_.size(), served_connections(), fd_refusals_);
    last_fd_log_ = now;
    fd_refusals_ = 0;
  }
}

FastLookupServer::Pending FastLookupServer::TakePending(uint64_t seq) {
  auto it = pending_.find(seq);
  Pending p = std::move(it->second);
  pending_.erase(it);
  order_.erase(p.order_pos);
  auto uid = by_uid_.find(p.uid);
  uid->second.erase(p.uid_pos);
  if (uid->second.empty()) by_uid_.erase(uid);
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, p.fd, nullptr);
  AddFastLookupConnections(-1, 0);
  return p;
}

void FastLookupServer::ClosePending(uint64_t seq,
                                    std::optional<FastLookupClose> why) {
  const Pending p = TakePending(seq);
  if (why) CountFastLookupClose(*why);  // Before the peer can see the close.
  ::close(p.fd);
}

void FastLookupServer::ReadHello(uint64_t seq) {
  auto it = pending_.find(seq);
  if (it == pending_.end()) return;
  Pending& p = it->second;
  for (;;) {
    const ssize_t r = ::recv(p.fd, reinterpret_cast<char*>(&p.hello) + p.got,
                             sizeof(p.hello) - p.got, MSG_DONTWAIT);
    if (r > 0) {
      p.got += static_cast<size_t>(r);
      if (p.got == sizeof(p.hello)) break;
      continue;
    }
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    ClosePending(seq, std::nullopt);  // EOF or error before a Hello.
    return;
  }
  if (p.hello.magic != fastpath::kHelloMagic &&
      p.hello.magic != fastpath::kOpenMagic) {
    ClosePending(seq, FastLookupClose::kBadHello);
    return;
  }
  if (p.hello.version != fastpath::kVersion) {
    RefuseHello(p.fd, p.hello, absl::StatusCode::kFailedPrecondition);
    ClosePending(seq, FastLookupClose::kBadHello);
    return;
  }
  ReapFinished();
  absl::MutexLock lock(&mu_);
  int& of_uid = served_per_uid_[p.uid];
  if (stopping_ ||
      connections_.size() >= static_cast<size_t>(options_.max_connections) ||
      of_uid >= options_.max_connections_per_uid) {
    if (of_uid == 0) served_per_uid_.erase(p.uid);
    if (stopping_) return;  // The loop closes it on its way out.
    const uid_t uid = p.uid;
    RefuseHello(p.fd, p.hello, absl::StatusCode::kResourceExhausted);
    ClosePending(seq, FastLookupClose::kServedCap);
    ++cap_refusals_;
    const Clock::time_point now = Clock::now();
    if (now - last_cap_log_ >= kLogInterval) {
      SPDLOG_WARN(
          "fast lookup: refused {} Hellos since the last report, the latest "
          "from uid {}: serving {} connections (--fast_lookup_max_connections "
          "{}, --fast_lookup_max_connections_per_uid {})",
          cap_refusals_, uid, connections_.size(), options_.max_connections,
          options_.max_connections_per_uid);
      last_cap_log_ = now;
      cap_refusals_ = 0;
    }
    return;
  }
  Pending taken = TakePending(seq);
  // Serving threads block in read().
  const int flags = ::fcntl(taken.fd, F_GETFL);
  ::fcntl(taken.fd, F_SETFL, flags & ~O_NONBLOCK);
  const uint64_t id = next_id_++;
  try {
    threads_[id] = std::thread(
        [this, id, fd = taken.fd, uid = taken.uid, hello = taken.hello,
         end = taken.deadline] { Serve(id, fd, uid, hello, end); });
  } catch (const std::system_error& e) {
    // Out of threads (RLIMIT_NPROC, memory): this engine retries.
    threads_.erase(id);
    if (of_uid == 0) served_per_uid_.erase(taken.uid);
    RefuseHello(taken.fd, taken.hello, absl::StatusCode::kResourceExhausted);
    ::close(taken.fd);
    SPDLOG_ERROR("fast lookup: cannot start a serving thread: {}", e.what());
    return;
  }
  ++of_uid;
  connections_.insert(taken.fd);
  AddFastLookupConnections(0, 1);
}

}  // namespace kvtier::daemon
