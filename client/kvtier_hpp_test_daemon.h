// The kvtierd of the public C++ layer's tests (kvtier_hpp_test.cc,
// kvtier_hpp_device_test.cc): a real daemon in a private folder under
// /dev/shm (socket and banks), started and killed with POSIX calls only.
// Those tests are built as an engine builds (C++17, the public include
// folder, libkvtier.so and gtest), so this helper cannot use the test-support
// library: that would bring abseil.
//
// Thread-safety: a Daemon is used by one thread (the test's).
#ifndef KVTIER_CLIENT_KVTIER_HPP_TEST_DAEMON_H_
#define KVTIER_CLIENT_KVTIER_HPP_TEST_DAEMON_H_

#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

extern char** environ;

namespace kvtier_hpp_test {

class Daemon {
 public:
  // Makes the folder and starts kvtierd (KVTIER_KVTIERD_PATH) in it.
  Daemon() {
    char tmpl[] = "/dev/shm/kvtier-hpp-XXXXXX";
    if (::mkdtemp(tmpl) != nullptr) dir_ = tmpl;
    socket_ = dir_ + "/kvtierd.sock";
    shm_ = dir_ + "/shm";
    std::filesystem::create_directories(shm_);
    ::chmod(shm_.c_str(), 0750);  // kvtierd refuses a folder others can write.
    Start();
  }
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;
  // Kills the daemon and removes the folder.
  ~Daemon() {
    Kill();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  // Starts kvtierd ($KVTIERD, else KVTIER_KVTIERD_PATH: a copied build runs
  // elsewhere) over the same socket and shm folder (a restart after Kill).
  // REQUIRES: none is running.
  void Start() {
    const char* env = std::getenv("KVTIERD");
    const std::string kvtierd = env != nullptr ? env : KVTIER_KVTIERD_PATH;
    std::vector<std::string> argv = {kvtierd, "--socket=" + socket_,
                                     "--shm_dir=" + shm_, "--huge_pages=off",
                                     "--log_level=warn"};
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    if (::posix_spawn(&pid_, args[0], nullptr, nullptr, args.data(), environ) !=
        0) {
      pid_ = -1;
    }
  }
  // SIGKILL and reap: the daemon's session ends as in a crash.
  void Kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  // True once the running daemon accepts connections (within 20 s).
  bool WaitUntilListening() const {
    if (pid_ <= 0) return false;
    for (int i = 0; i < 1000; ++i) {
      const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
      sockaddr_un addr{};
      addr.sun_family = AF_UNIX;
      std::strncpy(addr.sun_path, socket_.c_str(), sizeof(addr.sun_path) - 1);
      const bool up =
          ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
      ::close(fd);
      if (up) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }
  const std::string& socket() const { return socket_; }
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_, socket_, shm_;
  pid_t pid_ = -1;
};

}  // namespace kvtier_hpp_test

#endif  // KVTIER_CLIENT_KVTIER_HPP_TEST_DAEMON_H_
