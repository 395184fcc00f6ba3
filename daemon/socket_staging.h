// StagedSocket: a unix socket that nobody can reach before its group and
// mode are final.
//
// bind(2) makes the socket file with the mode the umask leaves (0770 under
// the unit's UMask=0007) and the process's group, so narrowing it afterwards
// leaves a moment in which every member of that group may connect; a
// connection keeps what the socket grants for its whole life, and on the
// operator socket that is every right. fchmod(2) on a socket fd does not
// reach the file, and the umask is process-wide (other threads create files
// meanwhile). So the socket is bound in a private folder beside its path,
// "<dir>/.<name>.new/s" (mode 0700: this uid's alone), given its group and
// mode there, and renamed into place: at every instant the path is either
// absent or the finished socket. rename(2) keeps the inode, which is what
// connect(2) finds, so the listener moves with the file.
//
// Thread-safety: one thread uses a StagedSocket. The folder's name follows
// from the path: one StagedSocket per path at a time (the daemon owns its
// socket folder; a folder a killed daemon left is removed by the next).
#ifndef KVTIER_DAEMON_SOCKET_STAGING_H_
#define KVTIER_DAEMON_SOCKET_STAGING_H_

#include <sys/types.h>

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvtier::daemon {

class StagedSocket {
 public:
  // Makes the private folder for the socket that will live at `path`,
  // removing the one a killed daemon left. `what` names the socket in errors
  // (e.g. "--admin_socket"). INVALID_ARGUMENT when bind_path() would not fit
  // a sockaddr_un; FAILED_PRECONDITION when the folder cannot be made or
  // something other than a left folder of this uid holding at most its
  // socket is in the way.
  static absl::StatusOr<StagedSocket> Create(const std::string& path,
                                             absl::string_view what);

  StagedSocket(StagedSocket&& o) noexcept;
  StagedSocket& operator=(StagedSocket&&) = delete;
  // Removes the private folder and a socket still in it (an unpublished
  // socket's listener stays open but nobody can reach it).
  ~StagedSocket();

  // Where to bind: inside the private folder.
  const std::string& bind_path() const { return bind_path_; }

  // REQUIRES: a socket is bound at bind_path(); not yet published.
  // Gives it `group` (-1: keeps the process's) and `mode`, then moves it to
  // the path given to Create, never replacing anything there (the caller
  // removed a stale socket first). FAILED_PRECONDITION naming the step and
  // errno; the socket then stays unreachable in the folder.
  absl::Status Publish(gid_t group, mode_t mode);

 private:
  StagedSocket(std::string path, std::string dir, std::string what);

  std::string path_;       // Where the socket is published.
  std::string dir_;        // The private folder; "" once moved from.
  std::string bind_path_;  // dir_ + "/s".
  std::string what_;
};

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_SOCKET_STAGING_H_
