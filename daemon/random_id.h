// RandomId: the one source of the ids kvtierd hands out that grant
// something (session ids, reservation and lease ids, fence hold ids): 64
// bits from the kernel's randomness, getrandom(2).
//
// An id is a capability, or names one to the session that holds it: a
// session id is every RPC's credential, a hold id is what releases fenced
// rows. They are drawn from the kernel's CSPRNG, never from a counter or a
// user-space generator whose state a bug could expose. Only where
// getrandom(2) is unavailable (ENOSYS: a kernel before 3.17, or a seccomp
// filter refusing it) does RandomId fall back to absl::BitGen (Randen,
// seeded from the OS), logging once.
//
// Thread-safety: thread-safe.
#ifndef KVTIER_DAEMON_RANDOM_ID_H_
#define KVTIER_DAEMON_RANDOM_ID_H_

#include <cstdint>

namespace kvtier::daemon {

// A non-zero 64-bit id drawn from getrandom(2) (one 8-byte call per draw;
// a draw of 0 is drawn again). Callers that need an id unique among their
// own retry on a collision.
uint64_t RandomId();

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_RANDOM_ID_H_
