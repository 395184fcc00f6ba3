// Real local users for multi-process tests: creates groups and users with
// the system's groupadd/useradd (CI runs as root) and runs code in a forked
// child that has become one of them (initgroups, setgid, setuid), so the
// daemon sees that user's SO_PEERCRED and the kernel applies that user's
// file permissions. A permission test whose client is root proves nothing:
// root bypasses file modes.
//
// The users and groups are left in place for the next run (creating them
// again is slow and racy between tests).
//
// Thread-safety: not thread-safe; call from the test's one thread, and never
// from a process that runs gRPC threads (RunAs forks).
#ifndef KVTIER_TESTS_TEST_USERS_H_
#define KVTIER_TESTS_TEST_USERS_H_

#include <sys/types.h>

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kvtier::testing {

struct User {
  std::string name;
  uid_t uid = 0;
  gid_t gid = 0;
};

// Path of a system tool (useradd, groupadd, usermod) or "" when missing.
std::string Tool(const std::string& name);

// An empty string when this process can create users and become them
// (root, useradd and groupadd installed); else why not, for GTEST_SKIP.
// With KVTIER_REQUIRE_USERS=1 in the environment (`make test` sets it) the
// callers fail instead of skipping.
std::string CannotCreateUsers();
bool UsersRequired();

// Runs argv (argv[0] a path) and waits; INTERNAL with its output on a
// non-zero exit.
absl::Status RunTool(const std::vector<std::string>& argv);

// The gid of group `name`, created if missing.
absl::StatusOr<gid_t> EnsureGroup(const std::string& name);

// User `name` (created if missing: no home, no login) whose supplementary
// groups are exactly `groups` (comma-separated, may be empty).
absl::StatusOr<User> EnsureUser(const std::string& name,
                                const std::string& groups);

struct Outcome {
  int code = -1;  // body's return value; 120: could not become the user.
  std::string output;
};

// Runs `body` in a forked child as `user` (nullptr: stays root). The child
// reports through `out`; the parent waits for it.
Outcome RunAs(const User* user, const std::function<int(std::string*)>& body);

// errno of connect(2) to the unix socket `path` (0: connected).
int ConnectErrno(const std::string& path);
// errno of open(2) of `path` read-write, then read-only (0: opened).
int OpenErrno(const std::string& path);

}  // namespace kvtier::testing

#endif  // KVTIER_TESTS_TEST_USERS_H_
