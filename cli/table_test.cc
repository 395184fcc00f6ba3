// Tests of kvtierctl's tables and units.
#include "cli/table.h"

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvtier::cli {
namespace {

TEST(TableTest, AlignsColumnsWithoutTrailingSpaces) {
  Table t({{"NAME", Table::Align::kLeft},
           {"ROWS", Table::Align::kRight},
           {"FILE", Table::Align::kLeft}});
  t.AddRow({"kv", "64", "/dev/shm/a"});
  t.AddRow({"scale", "1,024", ""});
  EXPECT_EQ(t.rows(), 2u);
  EXPECT_EQ(t.Render(),
            "NAME    ROWS  FILE\n"
            "kv        64  /dev/shm/a\n"
            "scale  1,024\n");
  EXPECT_EQ(t.Render("  "),
            "  NAME    ROWS  FILE\n"
            "  kv        64  /dev/shm/a\n"
            "  scale  1,024\n");
}

TEST(TableTest, MissingCellsAreEmptyAndExtraCellsDropped) {
  Table t({{"A", Table::Align::kLeft}, {"B", Table::Align::kRight}});
  t.AddRow({"x"});
  t.AddRow({"y", "1", "ignored"});
  EXPECT_EQ(t.Render(),
            "A  B\n"
            "x\n"
            "y  1\n");
}

TEST(TableTest, MultiByteCharactersTakeOneColumn) {
  Table t({{"PREFIX", Table::Align::kLeft}, {"N", Table::Align::kRight}});
  t.AddRow({"abcd…", "1"});
  t.AddRow({"abcdefg", "22"});
  EXPECT_EQ(t.Render(),
            "PREFIX    N\n"
            "abcd…     1\n"
            "abcdefg  22\n");
}

TEST(TableTest, HeaderOnly) {
  Table t({{"A", Table::Align::kLeft}, {"LONG", Table::Align::kRight}});
  EXPECT_EQ(t.Render(), "A  LONG\n");
}

TEST(FormatTest, Count) {
  EXPECT_EQ(FormatCount(0), "0");
  EXPECT_EQ(FormatCount(999), "999");
  EXPECT_EQ(FormatCount(1000), "1,000");
  EXPECT_EQ(FormatCount(123456), "123,456");
  EXPECT_EQ(FormatCount(1234567), "1,234,567");
  EXPECT_EQ(FormatCount(18446744073709551615ull), "18,446,744,073,709,551,615");
}

TEST(FormatTest, Bytes) {
  EXPECT_EQ(FormatBytes(0), "0 B");
  EXPECT_EQ(FormatBytes(1023), "1023 B");
  EXPECT_EQ(FormatBytes(1024), "1.0 KiB");
  EXPECT_EQ(FormatBytes(4096), "4.0 KiB");
  EXPECT_EQ(FormatBytes(1536), "1.5 KiB");
  EXPECT_EQ(FormatBytes(1048575), "1.0 MiB");  // Not "1024.0 KiB".
  EXPECT_EQ(FormatBytes(3ull << 30), "3.0 GiB");
  EXPECT_EQ(FormatBytes(64ull << 40), "64.0 TiB");
}

TEST(FormatTest, Percent) {
  EXPECT_EQ(FormatPercent(0, 0), "-");
  EXPECT_EQ(FormatPercent(0, 10), "0.0%");
  EXPECT_EQ(FormatPercent(1, 8), "12.5%");
  EXPECT_EQ(FormatPercent(10, 10), "100.0%");
}

TEST(FormatTest, Duration) {
  EXPECT_EQ(FormatElapsed(absl::Seconds(-3)), "0s");
  EXPECT_EQ(FormatElapsed(absl::ZeroDuration()), "0s");
  EXPECT_EQ(FormatElapsed(absl::Seconds(12)), "12s");
  EXPECT_EQ(FormatElapsed(absl::Seconds(250)), "4m 10s");
  EXPECT_EQ(FormatElapsed(absl::Hours(2) + absl::Minutes(5)), "2h 5m");
  EXPECT_EQ(FormatElapsed(absl::Hours(76)), "3d 4h");
}

TEST(FormatTest, Age) {
  const absl::Time now = absl::FromUnixSeconds(1'800'000'000);
  const int64_t now_ms = absl::ToUnixMillis(now);
  EXPECT_EQ(FormatAge(0, now), "-");
  EXPECT_EQ(FormatAge(now_ms - 200, now), "0s ago");
  EXPECT_EQ(FormatAge(now_ms - 3'000, now), "3s ago");
  EXPECT_EQ(FormatAge(now_ms - 302'000, now), "5m 2s ago");
  EXPECT_EQ(FormatAge(now_ms + 5'000, now), "now");
}

TEST(FormatTest, Rate) {
  EXPECT_EQ(FormatRate(0), "0/s");
  EXPECT_EQ(FormatRate(-1), "0/s");
  EXPECT_EQ(FormatRate(12), "12.0/s");
  EXPECT_EQ(FormatRate(12345), "12.3k/s");
  EXPECT_EQ(FormatRate(999.99), "1.0k/s");
  EXPECT_EQ(FormatRate(4.5e6), "4.5M/s");
}

TEST(FormatTest, HexPrefix) {
  EXPECT_EQ(HexPrefix("", 8), "");
  EXPECT_EQ(HexPrefix(std::string("\x00\xab\x10", 3), 8), "00ab10");
  EXPECT_EQ(HexPrefix(std::string("\x01\x02\x03", 3), 2), "0102…");
}

}  // namespace
}  // namespace kvtier::cli
