// The cluster tier's keys and values (issue 17; the tier:
// daemon/cluster_tier.h).
//
// A page leaves a node's host tier as one value per stored rank, under a
// content-addressed key that daemons on every node derive alike:
//
//   key    = "kvt1:" + hex(SHA-256("kvtier-cluster-v1" | namespace name |
//            layout fingerprint | block hash | rank))
//
// The namespace's name and fingerprint separate models and layouts; the
// block hash names the whole prefix up to the page (for chains libkvtier
// hashes, the tenant salt is inside it through the chain's seed), so the
// cluster tier separates exactly what a node's prefix index separates.
//
// A value is a header, the page's rows of every page bank of the rank (and
// the rank's snapshot row where the page had one), and an HMAC-SHA256 under
// the cluster key the daemons share (--cluster_key_file). Anything that can
// reach Redis could plant a value with a valid checksum; without the key it
// cannot plant one with a valid MAC. The MAC covers the header, which names
// the key's digest (so a valid value moved under another key fails) and the
// layout fingerprint (so a value of another layout fails). Little-endian:
//
//   0   magic "KVTCV1\0\0"           8 bytes
//   8   header bytes (through the sizes)  u32
//   12  flags: bit 0 has snapshot    u32
//   16  layout fingerprint           32 bytes
//   48  key digest                   32 bytes
//   80  rank                         u32
//   84  page banks (n)               u32
//   88  bank bytes                   n * u64
//   ..  snapshot bytes               u64 (0 without one)
//   ..  bank rows, then the snapshot
//   end HMAC-SHA256 of everything before it   32 bytes
//
// A value that fails any check is a miss, never served: DecodeClusterValue
// says why (DATA_LOSS), checking the MAC (in constant time) before it
// trusts any other field.
//
// Thread-safety: stateless functions and an immutable ClusterKey:
// thread-safe.
#ifndef KVTIER_DAEMON_CLUSTER_VALUE_H_
#define KVTIER_DAEMON_CLUSTER_VALUE_H_

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "daemon/namespace_layout.h"

namespace kvtier::daemon {

using ClusterDigest = std::array<uint8_t, 32>;

// The secret the daemons of a cluster share. At least 32 bytes.
class ClusterKey {
 public:
  // INVALID_ARGUMENT when `secret` is shorter than 32 bytes.
  static absl::StatusOr<ClusterKey> FromSecret(std::string secret);
  // Reads the key file `path` (its bytes, a trailing newline dropped): a
  // regular file owned by this process's uid or root, readable and writable
  // by nobody else (mode 0600 or 0400), as ssh does for private keys.
  // FAILED_PRECONDITION naming what was found; NOT_FOUND when absent.
  static absl::StatusOr<ClusterKey> ReadFile(const std::string& path);

  const std::string& secret() const { return secret_; }

 private:
  explicit ClusterKey(std::string secret) : secret_(std::move(secret)) {}
  std::string secret_;
};

// Reads a secret from file `path` for flag `flag` (its bytes, trailing
// newlines dropped, at most 4 KiB): a regular file, not a symlink, owned by
// this process's uid or root, readable and writable by nobody else (mode
// 0600 or 0400). FAILED_PRECONDITION naming the flag and what was found;
// NOT_FOUND when absent.
absl::StatusOr<std::string> ReadSecretFile(const std::string& path,
                                           absl::string_view flag);

// The digest naming page `hash` of `rank` in namespace `name` of layout
// `fingerprint` (the file comment's formula).
ClusterDigest ClusterKeyDigest(absl::string_view name,
                               const Fingerprint& fingerprint,
                               absl::string_view hash, uint32_t rank);
// "kvt1:" and the digest in lowercase hex: the Redis key.
std::string ClusterKeyName(const ClusterDigest& digest);

// What a value must hold to be accepted, and what it is made of.
struct ClusterValueShape {
  Fingerprint fingerprint{};
  ClusterDigest digest{};
  uint32_t rank = 0;
  std::vector<uint64_t> bank_bytes;  // Per page bank, layout order.
  uint64_t snapshot_bytes = 0;       // The layout's; 0 when not hybrid.
};

// Bytes of a value of `shape`, with or without a snapshot.
uint64_t ClusterValueBytes(const ClusterValueShape& shape, bool snapshot);

// The value of `shape` holding `banks` (one row per page bank, each of
// shape.bank_bytes[b] bytes) and, when `snapshot` is not null, the
// snapshot row (shape.snapshot_bytes). REQUIRES: the sizes match (checked:
// INVALID_ARGUMENT naming the bank).
absl::StatusOr<std::string> EncodeClusterValue(
    const ClusterKey& key, const ClusterValueShape& shape,
    absl::Span<const absl::string_view> banks,
    const absl::string_view* snapshot);

// EncodeClusterValue in two steps, for a caller that copies the rows
// straight into the value (under a lock) and leaves the MAC to another
// thread: BeginClusterValue returns the header, with room reserved for the
// rest; the caller appends each bank's row, then the snapshot row when
// `snapshot`; SealClusterValue appends the MAC. REQUIRES: what was appended
// matches `shape` (the result is then EncodeClusterValue's, byte for byte).
std::string BeginClusterValue(const ClusterValueShape& shape, bool snapshot);
void SealClusterValue(const ClusterKey& key, std::string* value);

struct DecodedClusterValue {
  std::vector<absl::string_view> banks;  // Views into the value.
  bool has_snapshot = false;
  absl::string_view snapshot;
};

// Checks `value` against `shape` under `key` and returns views of its rows.
// DATA_LOSS naming the first failed check (size, magic, MAC, header size,
// layout fingerprint, key digest, rank, bank count or sizes); the MAC is
// checked first, in constant time, so a value without the key is refused
// for its MAC whatever its header says.
absl::StatusOr<DecodedClusterValue> DecodeClusterValue(
    const ClusterKey& key, absl::string_view value,
    const ClusterValueShape& shape);

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_CLUSTER_VALUE_H_
