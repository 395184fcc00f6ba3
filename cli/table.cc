// Text tables and units for kvtierctl's human output.
#include "cli/table.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace kvtier::cli {
namespace {

// Display width: bytes, not counting UTF-8 continuation bytes.
size_t Width(const std::string& s) {
  size_t w = 0;
  for (unsigned char c : s) {
    if ((c & 0xc0) != 0x80) ++w;
  }
  return w;
}

}  // namespace

Table::Table(std::vector<Column> columns) : columns_(std::move(columns)) {}

void Table::AddRow(std::vector<std::string> cells) {
  cells.resize(columns_.size());
  rows_.push_back(std::move(cells));
}

std::string Table::Render(const std::string& indent) const {
  std::vector<size_t> width(columns_.size(), 0);
  for (size_t c = 0; c < columns_.size(); ++c) {
    width[c] = Width(columns_[c].header);
    for (const auto& row : rows_) width[c] = std::max(width[c], Width(row[c]));
  }
  std::string out;
  auto line = [&](const std::vector<std::string>& cells) {
    std::string l = indent;
    for (size_t c = 0; c < columns_.size(); ++c) {
      const size_t pad = width[c] - Width(cells[c]);
      const bool last = c + 1 == columns_.size();
      if (columns_[c].align == Align::kRight) {
        l.append(pad, ' ');
        l += cells[c];
      } else {
        l += cells[c];
        if (!last) l.append(pad, ' ');
      }
      if (!last) l += "  ";
    }
    while (l.size() > indent.size() && l.back() == ' ') l.pop_back();
    out += l;
    out += '\n';
  };
  std::vector<std::string> header;
  for (const auto& col : columns_) header.push_back(col.header);
  line(header);
  for (const auto& row : rows_) line(row);
  return out;
}

std::string FormatCount(uint64_t n) {
  std::string digits = absl::StrCat(n);
  std::string out;
  const size_t lead = digits.size() % 3 == 0 ? 3 : digits.size() % 3;
  out = digits.substr(0, lead);
  for (size_t i = lead; i < digits.size(); i += 3) {
    out += ',';
    out += digits.substr(i, 3);
  }
  return out;
}

std::string FormatBytes(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB",
                                           "TiB", "PiB", "EiB"};
  if (bytes < 1024) return absl::StrCat(bytes, " B");
  double v = static_cast<double>(bytes) / 1024;
  int u = 0;
  // Round first so 1023.96 KiB reads "1.0 MiB", not "1024.0 KiB".
  while (std::round(v * 10) / 10 >= 1024 && u < 5) {
    v /= 1024;
    ++u;
  }
  return absl::StrFormat("%.1f %s", v, kUnits[u]);
}

std::string FormatPercent(uint64_t part, uint64_t whole) {
  if (whole == 0) return "-";
  return absl::StrFormat(
      "%.1f%%", 100.0 * static_cast<double>(part) / static_cast<double>(whole));
}

std::string FormatElapsed(absl::Duration d) {
  int64_t s = absl::ToInt64Seconds(d);
  if (s <= 0) return "0s";
  const int64_t days = s / 86400, hours = s / 3600 % 24, minutes = s / 60 % 60,
                seconds = s % 60;
  if (days > 0) return absl::StrCat(days, "d ", hours, "h");
  if (hours > 0) return absl::StrCat(hours, "h ", minutes, "m");
  if (minutes > 0) return absl::StrCat(minutes, "m ", seconds, "s");
  return absl::StrCat(seconds, "s");
}

std::string FormatAge(int64_t unix_ms, absl::Time now) {
  if (unix_ms <= 0) return "-";
  const absl::Duration ago = now - absl::FromUnixMillis(unix_ms);
  if (ago < absl::Seconds(1))
    return ago < absl::ZeroDuration() ? "now" : "0s ago";
  return absl::StrCat(FormatElapsed(ago), " ago");
}

std::string FormatRate(double per_second) {
  if (!(per_second > 0)) return "0/s";
  static constexpr const char* kPrefixes[] = {"", "k", "M", "G", "T"};
  int p = 0;
  while (per_second >= 999.95 && p < 4) {
    per_second /= 1000;
    ++p;
  }
  return absl::StrFormat("%.1f%s/s", per_second, kPrefixes[p]);
}

std::string HexPrefix(const std::string& bytes, size_t max_bytes) {
  std::string out;
  for (size_t i = 0; i < bytes.size() && i < max_bytes; ++i) {
    absl::StrAppendFormat(&out, "%02x", static_cast<unsigned char>(bytes[i]));
  }
  if (bytes.size() > max_bytes) out += "…";
  return out;
}

}  // namespace kvtier::cli
