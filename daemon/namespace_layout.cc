// Namespace layouts: validation, fingerprints and hash seeds.
#include "daemon/namespace_layout.h"

#include <openssl/sha.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace kvtier::daemon {
namespace {

bool IsNameChar(char c, bool allow_upper) {
  return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' ||
         (allow_upper && ((c >= 'A' && c <= 'Z') || c == '.' || c == '-'));
}

std::string CanonicalText(const v1::Layout& l) {
  std::string s =
      absl::StrCat("kvtier.layout.v1;model=", l.model().size(), ":", l.model(),
                   ";tpp=", l.tokens_per_page(), ";layers=", l.num_layers());
  for (const auto& b : l.page_banks()) {
    absl::StrAppend(&s, ";bank=", b.name(), ":", b.row_bytes(), ":",
                    b.dtype().size(), ":", b.dtype());
  }
  absl::StrAppend(&s, ";snap=", l.snapshot_row_bytes(), ";tp=", l.tp_size(),
                  ";repl=", l.replicated() ? 1 : 0,
                  ";hash=", static_cast<int>(l.hash_kind()));
  return s;
}

}  // namespace

absl::Status ValidateNamespaceName(absl::string_view name,
                                   absl::string_view field) {
  if (name.empty() || name.size() > kMaxNamespaceName) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": must be 1..", kMaxNamespaceName,
                     " characters, got ", name.size()));
  }
  if (name == "." || name == "..") {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": '", name, "' is reserved"));
  }
  for (char c : name) {
    if (!IsNameChar(c, /*allow_upper=*/true)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: character 0x%02x not allowed (use [A-Za-z0-9._-])", field,
          static_cast<unsigned char>(c)));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateLayout(const v1::Layout& l) {
  if (l.model().size() > 256) {
    return absl::InvalidArgumentError("layout.model: at most 256 bytes");
  }
  if (l.tokens_per_page() < 1 || l.tokens_per_page() > 65536) {
    return absl::InvalidArgumentError(absl::StrCat(
        "layout.tokens_per_page: must be 1..65536, got ", l.tokens_per_page()));
  }
  if (l.num_layers() < 1 || l.num_layers() > 4096) {
    return absl::InvalidArgumentError(absl::StrCat(
        "layout.num_layers: must be 1..4096, got ", l.num_layers()));
  }
  if (l.page_banks_size() < 1 ||
      l.page_banks_size() > static_cast<int>(kMaxPageBanks)) {
    return absl::InvalidArgumentError(
        absl::StrCat("layout.page_banks: must hold 1..", kMaxPageBanks,
                     " banks, got ", l.page_banks_size()));
  }
  for (int i = 0; i < l.page_banks_size(); ++i) {
    const auto& b = l.page_banks(i);
    const std::string field = absl::StrCat("layout.page_banks[", i, "]");
    if (b.name().empty() || b.name().size() > 32) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".name: must be 1..32 characters"));
    }
    for (char c : b.name()) {
      if (!IsNameChar(c, /*allow_upper=*/false)) {
        return absl::InvalidArgumentError(absl::StrCat(
            field, ".name: '", b.name(), "' must match [a-z0-9_]+"));
      }
    }
    if (b.name() == "snapshot") {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".name: 'snapshot' is reserved"));
    }
    for (int j = 0; j < i; ++j) {
      if (l.page_banks(j).name() == b.name()) {
        return absl::InvalidArgumentError(
            absl::StrCat(field, ".name: duplicate bank '", b.name(), "'"));
      }
    }
    if (b.row_bytes() == 0 || b.row_bytes() > kMaxRowBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".row_bytes: must be 1..", kMaxRowBytes, ", got ",
                       b.row_bytes()));
    }
    if (b.dtype().size() > 32) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".dtype: at most 32 characters"));
    }
  }
  if (l.snapshot_row_bytes() > kMaxRowBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("layout.snapshot_row_bytes: at most ", kMaxRowBytes,
                     ", got ", l.snapshot_row_bytes()));
  }
  if (l.tp_size() > kMaxTpSize) {
    return absl::InvalidArgumentError(absl::StrCat(
        "layout.tp_size: must be 1..", kMaxTpSize, ", got ", l.tp_size()));
  }
  if (!v1::HashKind_IsValid(l.hash_kind())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "layout.hash_kind: unknown value ", static_cast<int>(l.hash_kind())));
  }
  return absl::OkStatus();
}

v1::Layout NormalizeLayout(const v1::Layout& layout) {
  v1::Layout l = layout;
  if (l.tp_size() == 0) l.set_tp_size(1);
  if (l.hash_kind() == v1::HASH_KIND_UNSPECIFIED) {
    l.set_hash_kind(v1::HASH_KIND_SHA256);
  }
  return l;
}

Fingerprint LayoutFingerprint(const v1::Layout& normalized) {
  const std::string text = CanonicalText(normalized);
  Fingerprint fp;
  SHA256(reinterpret_cast<const unsigned char*>(text.data()), text.size(),
         fp.data());
  return fp;
}

std::string DescribeLayoutDifference(const v1::Layout& a, const v1::Layout& b) {
  auto diff = [](absl::string_view field, const auto& x, const auto& y) {
    return absl::StrCat(field, ": existing ", x, ", requested ", y);
  };
  if (a.model() != b.model()) return diff("model", a.model(), b.model());
  if (a.tokens_per_page() != b.tokens_per_page()) {
    return diff("tokens_per_page", a.tokens_per_page(), b.tokens_per_page());
  }
  if (a.num_layers() != b.num_layers()) {
    return diff("num_layers", a.num_layers(), b.num_layers());
  }
  if (a.page_banks_size() != b.page_banks_size()) {
    return diff("page_banks (count)", a.page_banks_size(), b.page_banks_size());
  }
  for (int i = 0; i < a.page_banks_size(); ++i) {
    const auto& x = a.page_banks(i);
    const auto& y = b.page_banks(i);
    const std::string f = absl::StrCat("page_banks[", i, "]");
    if (x.name() != y.name()) return diff(f + ".name", x.name(), y.name());
    if (x.row_bytes() != y.row_bytes()) {
      return diff(f + ".row_bytes", x.row_bytes(), y.row_bytes());
    }
    if (x.dtype() != y.dtype()) return diff(f + ".dtype", x.dtype(), y.dtype());
  }
  if (a.snapshot_row_bytes() != b.snapshot_row_bytes()) {
    return diff("snapshot_row_bytes", a.snapshot_row_bytes(),
                b.snapshot_row_bytes());
  }
  if (a.tp_size() != b.tp_size())
    return diff("tp_size", a.tp_size(), b.tp_size());
  if (a.replicated() != b.replicated()) {
    return diff("replicated", a.replicated(), b.replicated());
  }
  if (a.hash_kind() != b.hash_kind()) {
    return diff("hash_kind", v1::HashKind_Name(a.hash_kind()),
                v1::HashKind_Name(b.hash_kind()));
  }
  return "";
}

uint32_t HashBytes(v1::HashKind kind) {
  return kind == v1::HASH_KIND_XXH3_128 ? 16 : 32;
}

std::string DeriveHashSeed(absl::string_view namespace_name,
                           const Fingerprint& fingerprint,
                           absl::string_view tenant_salt, uint32_t hash_bytes) {
  std::string text = absl::StrCat("kvtier.seed.v1;", namespace_name.size(), ":",
                                  namespace_name, ";");
  text.append(reinterpret_cast<const char*>(fingerprint.data()),
              fingerprint.size());
  absl::StrAppend(&text, ";", tenant_salt.size(), ":");
  text.append(tenant_salt.data(), tenant_salt.size());
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(text.data()), text.size(),
         digest);
  return std::string(reinterpret_cast<const char*>(digest), hash_bytes);
}

}  // namespace kvtier::daemon
