// Text tables and units for kvtierctl's human output.
//
// A Table lines its columns up: two spaces between columns, text left
// aligned, numbers right aligned, no trailing spaces. The Format* functions
// give every quantity a unit a person reads at a glance (1.5 GiB, 3m 12s,
// 42.0%, 12.3k/s).
//
// Thread-safety: a Table is not thread-safe; the functions are pure.
#ifndef KVTIER_CLI_TABLE_H_
#define KVTIER_CLI_TABLE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/time/time.h"

namespace kvtier::cli {

class Table {
 public:
  enum class Align { kLeft, kRight };
  struct Column {
    std::string header;
    Align align = Align::kLeft;
  };

  explicit Table(std::vector<Column> columns);

  // Appends a row. Missing cells are empty; cells beyond the columns are
  // dropped.
  void AddRow(std::vector<std::string> cells);
  size_t rows() const { return rows_.size(); }

  // Returns the header and the rows, each line prefixed by `indent` and
  // ended by '\n'. Width counts bytes, except that a UTF-8 continuation byte
  // counts nothing, so "…" takes one column.
  std::string Render(const std::string& indent = "") const;

 private:
  std::vector<Column> columns_;
  std::vector<std::vector<std::string>> rows_;
};

// Returns `n` with thousands separators: "1,234,567".
std::string FormatCount(uint64_t n);

// Returns `bytes` in binary units with one decimal: "512 B", "4.0 KiB",
// "1.5 GiB".
std::string FormatBytes(uint64_t bytes);

// Returns part/whole as a percentage with one decimal ("42.0%"), or "-" when
// whole is 0.
std::string FormatPercent(uint64_t part, uint64_t whole);

// Returns the two largest units of a non-negative duration: "12s",
// "4m 10s", "2h 5m", "3d 4h". Negative durations read "0s".
std::string FormatElapsed(absl::Duration d);

// Returns how long before `now` the Unix-millisecond time was: "3s ago",
// "5m 2s ago"; "-" when unix_ms <= 0 (never), "now" when in the future.
std::string FormatAge(int64_t unix_ms, absl::Time now);

// Returns a rate with an SI prefix: "0/s", "12.0/s", "12.3k/s", "4.5M/s".
std::string FormatRate(double per_second);

// Returns the first `max_bytes` bytes of `bytes` in lowercase hex, followed
// by "…" when there were more.
std::string HexPrefix(const std::string& bytes, size_t max_bytes);

}  // namespace kvtier::cli

#endif  // KVTIER_CLI_TABLE_H_
