// The cluster tier's keys and values: see cluster_value.h.
//
// Thread-safety: stateless functions; thread-safe.
#include "daemon/cluster_value.h"

#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace kvtier::daemon {
namespace {

constexpr char kMagic[8] = {'K', 'V', 'T', 'C', 'V', '1', 0, 0};
constexpr size_t kMacBytes = 32;
constexpr size_t kFixedHeader = 88;  // Through the bank count.
constexpr uint32_t kHasSnapshot = 1;
constexpr size_t kMinSecret = 32;
constexpr size_t kMaxKeyFile = 4096;

void PutU32(std::string* out, uint32_t v) {
  char b[4];
  for (int i = 0; i < 4; ++i) b[i] = static_cast<char>(v >> (8 * i));
  out->append(b, 4);
}
void PutU64(std::string* out, uint64_t v) {
  char b[8];
  for (int i = 0; i < 8; ++i) b[i] = static_cast<char>(v >> (8 * i));
  out->append(b, 8);
}
uint32_t GetU32(const char* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}
uint64_t GetU64(const char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

size_t HeaderBytes(size_t banks) { return kFixedHeader + 8 * banks + 8; }

void Mac(const ClusterKey& key, absl::string_view data, uint8_t out[32]) {
  unsigned int len = 0;
  HMAC(EVP_sha256(), key.secret().data(), static_cast<int>(key.secret().size()),
       reinterpret_cast<const unsigned char*>(data.data()), data.size(), out,
       &len);
}

}  // namespace

absl::StatusOr<ClusterKey> ClusterKey::FromSecret(std::string secret) {
  if (secret.size() < kMinSecret) {
    return absl::InvalidArgumentError(
        absl::StrCat("cluster key: ", secret.size(), " bytes; at least ",
                     kMinSecret, " are needed (e.g. `openssl rand -hex 32`)"));
  }
  return ClusterKey(std::move(secret));
}

absl::StatusOr<std::string> ReadSecretFile(const std::string& path,
                                           absl::string_view flag) {
  const int fd = open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    const std::string what =
        absl::StrCat(flag, " ", path, ": ", std::strerror(err));
    return err == ENOENT ? absl::NotFoundError(what)
                         : absl::FailedPreconditionError(what);
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return absl::FailedPreconditionError(
        absl::StrCat(flag, " ", path, ": not a regular file"));
  }
  if ((st.st_mode & 077) != 0 || (st.st_uid != geteuid() && st.st_uid != 0)) {
    close(fd);
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s %s: owner uid %d, mode %04o; it must be owned by "
        "uid %d or root and readable by nobody else (chmod 600)",
        flag, path, st.st_uid, st.st_mode & 07777, geteuid()));
  }
  std::string secret(kMaxKeyFile + 1, '\0');
  size_t got = 0;
  while (got < secret.size()) {
    const ssize_t n = read(fd, secret.data() + got, secret.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  close(fd);
  if (got > kMaxKeyFile) {
    return absl::FailedPreconditionError(
        absl::StrCat(flag, " ", path, ": more than ", kMaxKeyFile, " bytes"));
  }
  secret.resize(got);
  while (!secret.empty() && (secret.back() == '\n' || secret.back() == '\r')) {
    secret.pop_back();
  }
  return secret;
}

absl::StatusOr<ClusterKey> ClusterKey::ReadFile(const std::string& path) {
  auto secret = ReadSecretFile(path, "--cluster_key_file");
  if (!secret.ok()) return secret.status();
  return FromSecret(*std::move(secret));
}

ClusterDigest ClusterKeyDigest(absl::string_view name,
                               const Fingerprint& fingerprint,
                               absl::string_view hash, uint32_t rank) {
  std::string text = "kvtier-cluster-v1";
  text.push_back('\0');
  PutU32(&text, static_cast<uint32_t>(name.size()));
  text.append(name.data(), name.size());
  text.append(reinterpret_cast<const char*>(fingerprint.data()),
              fingerprint.size());
  PutU32(&text, static_cast<uint32_t>(hash.size()));
  text.append(hash.data(), hash.size());
  PutU32(&text, rank);
  ClusterDigest d{};
  unsigned int len = 0;
  EVP_Digest(text.data(), text.size(), d.data(), &len, EVP_sha256(), nullptr);
  return d;
}

std::string ClusterKeyName(const ClusterDigest& digest) {
  return absl::StrCat("kvt1:", absl::BytesToHexString(absl::string_view(
                                   reinterpret_cast<const char*>(digest.data()),
                                   digest.size())));
}

uint64_t ClusterValueBytes(const ClusterValueShape& shape, bool snapshot) {
  uint64_t bytes = HeaderBytes(shape.bank_bytes.size()) + kMacBytes;
  for (uint64_t b : shape.bank_bytes) bytes += b;
  if (snapshot) bytes += shape.snapshot_bytes;
  return bytes;
}

absl::StatusOr<std::string> EncodeClusterValue(
    const ClusterKey& key, const ClusterValueShape& shape,
    absl::Span<const absl::string_view> banks,
    const absl::string_view* snapshot) {
  if (banks.size() != shape.bank_bytes.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("banks: ", banks.size(), " rows for ",
                     shape.bank_bytes.size(), " page banks"));
  }
  for (size_t b = 0; b < banks.size(); ++b) {
    if (banks[b].size() != shape.bank_bytes[b]) {
      return absl::InvalidArgumentError(absl::StrCat("banks[", b,
                                                     "]: ", banks[b].size(),
                                                     " bytes, the bank's "
                                                     "rows hold ",
                                                     shape.bank_bytes[b]));
    }
  }
  if (snapshot != nullptr &&
      (shape.snapshot_bytes == 0 || snapshot->size() != shape.snapshot_bytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat("snapshot: ", snapshot->size(),
                     " bytes, the layout's "
                     "snapshot rows hold ",
                     shape.snapshot_bytes));
  }
  std::string out = BeginClusterValue(shape, snapshot != nullptr);
  for (absl::string_view b : banks) out.append(b.data(), b.size());
  if (snapshot != nullptr) out.append(snapshot->data(), snapshot->size());
  SealClusterValue(key, &out);
  return out;
}

std::string BeginClusterValue(const ClusterValueShape& shape, bool snapshot) {
  std::string out;
  out.reserve(ClusterValueBytes(shape, snapshot));
  out.append(kMagic, sizeof(kMagic));
  PutU32(&out, static_cast<uint32_t>(HeaderBytes(shape.bank_bytes.size())));
  PutU32(&out, snapshot ? kHasSnapshot : 0);
  out.append(reinterpret_cast<const char*>(shape.fingerprint.data()), 32);
  out.append(reinterpret_cast<const char*>(shape.digest.data()), 32);
  PutU32(&out, shape.rank);
  PutU32(&out, static_cast<uint32_t>(shape.bank_bytes.size()));
  for (uint64_t b : shape.bank_bytes) PutU64(&out, b);
  PutU64(&out, snapshot ? shape.snapshot_bytes : 0);
  return out;
}

void SealClusterValue(const ClusterKey& key, std::string* value) {
  uint8_t mac[kMacBytes];
  Mac(key, *value, mac);
  value->append(reinterpret_cast<const char*>(mac), kMacBytes);
}

absl::StatusOr<DecodedClusterValue> DecodeClusterValue(
    const ClusterKey& key, absl::string_view value,
    const ClusterValueShape& shape) {
  if (value.size() < kFixedHeader + kMacBytes) {
    return absl::DataLossError(
        absl::StrCat("cluster value: ", value.size(), " bytes, too short"));
  }
  if (std::memcmp(value.data(), kMagic, sizeof(kMagic)) != 0) {
    return absl::DataLossError("cluster value: bad magic");
  }
  const absl::string_view body = value.substr(0, value.size() - kMacBytes);
  uint8_t mac[kMacBytes];
  Mac(key, body, mac);
  if (CRYPTO_memcmp(mac, value.data() + body.size(), kMacBytes) != 0) {
    return absl::DataLossError(
        "cluster value: MAC mismatch (not written under this cluster key, or "
        "altered)");
  }
  const char* p = value.data();
  const size_t banks = shape.bank_bytes.size();
  if (GetU32(p + 8) != HeaderBytes(banks) ||
      GetU32(p + 84) != static_cast<uint32_t>(banks)) {
    return absl::DataLossError(
        absl::StrCat("cluster value: holds ", GetU32(p + 84),
                     " page banks, the layout has ", banks));
  }
  if (value.size() < HeaderBytes(banks) + kMacBytes) {
    return absl::DataLossError(absl::StrCat("cluster value: ", value.size(),
                                            " bytes, shorter than its header"));
  }
  if (std::memcmp(p + 16, shape.fingerprint.data(), 32) != 0) {
    return absl::DataLossError(
        "cluster value: written for another layout (fingerprint differs)");
  }
  if (std::memcmp(p + 48, shape.digest.data(), 32) != 0) {
    return absl::DataLossError(
        "cluster value: names another key (digest differs)");
  }
  if (GetU32(p + 80) != shape.rank) {
    return absl::DataLossError(absl::StrCat(
        "cluster value: of rank ", GetU32(p + 80), ", wanted ", shape.rank));
  }
  const uint32_t flags = GetU32(p + 12);
  if ((flags & ~kHasSnapshot) != 0) {
    return absl::DataLossError(
        absl::StrCat("cluster value: unknown flags ", flags));
  }
  DecodedClusterValue out;
  out.has_snapshot = (flags & kHasSnapshot) != 0;
  if (out.has_snapshot && shape.snapshot_bytes == 0) {
    return absl::DataLossError(
        "cluster value: holds a snapshot, the layout has none");
  }
  uint64_t offset = HeaderBytes(banks);
  for (size_t b = 0; b < banks; ++b) {
    if (GetU64(p + kFixedHeader + 8 * b) != shape.bank_bytes[b]) {
      return absl::DataLossError(
          absl::StrCat("cluster value: bank ", b, " holds ",
                       GetU64(p + kFixedHeader + 8 * b),
                       " bytes, the layout's rows ", shape.bank_bytes[b]));
    }
  }
  const uint64_t snap = GetU64(p + kFixedHeader + 8 * banks);
  if (snap != (out.has_snapshot ? shape.snapshot_bytes : 0)) {
    return absl::DataLossError(absl::StrCat("cluster value: snapshot of ", snap,
                                            " bytes, the layout's ",
                                            shape.snapshot_bytes));
  }
  if (value.size() != ClusterValueBytes(shape, out.has_snapshot)) {
    return absl::DataLossError(absl::StrCat(
        "cluster value: ", value.size(), " bytes, its header says ",
        ClusterValueBytes(shape, out.has_snapshot)));
  }
  for (size_t b = 0; b < banks; ++b) {
    out.banks.push_back(value.substr(offset, shape.bank_bytes[b]));
    offset += shape.bank_bytes[b];
  }
  if (out.has_snapshot) out.snapshot = value.substr(offset, snap);
  return out;
}

}  // namespace kvtier::daemon
