#include "remat/byte_size.h"

#include <gtest/gtest.h>

#include <random>
#include <string>

namespace remat {
namespace {

TEST(ByteSizeTest, ParsesCountsAndUnits) {
  EXPECT_EQ(*parse_byte_size("0"), 0u);
  EXPECT_EQ(*parse_byte_size("512MiB"), std::uint64_t{512} << 20);
  EXPECT_EQ(*parse_byte_size(" 1.5GiB "), 1610612736u);
  EXPECT_EQ(*parse_byte_size("2GB"), 2000000000u);
  EXPECT_EQ(*parse_byte_size("0.5KiB"), 512u);
}

TEST(ByteSizeTest, ErrorsNameTheTextAndWhatItShouldBe) {
  for (const char* bad : {"", "MiB", "-1", "1.5", "ten", "nan", "inf", "1e30", "12 parsecs"}) {
    const absl::StatusOr<std::uint64_t> b = parse_byte_size(bad, "budget");
    ASSERT_FALSE(b.ok()) << bad;
    EXPECT_EQ(b.status().message().find(std::string("'") + bad + "' is not a budget: "), 0u)
        << b.status().message();
  }
  EXPECT_NE(parse_byte_size("5").value(), 0u);
  EXPECT_NE(parse_byte_size("x").status().message().find("is not a byte size"), std::string::npos);
}

// Random sizes written in their largest unit read back within that unit's rounding.
TEST(ByteSizeTest, FormattedSizesParseBackNearTheirValue) {
  std::mt19937_64 rng(7);
  for (int i = 0; i < 2000; ++i) {
    const std::uint64_t bytes = rng() >> (rng() % 61 + 3);
    const std::string text = format_byte_size(bytes);
    const absl::StatusOr<std::uint64_t> back = parse_byte_size(text);
    ASSERT_TRUE(back.ok()) << text << ": " << back.status().message();
    const double err = std::abs(static_cast<double>(*back) - static_cast<double>(bytes));
    EXPECT_LE(err, 0.005 * static_cast<double>(bytes) + 1) << bytes << " as " << text;
  }
  EXPECT_EQ(format_byte_size(1023), "1023 B");
  EXPECT_EQ(format_byte_size(std::uint64_t{227} << 20), "227.00 MiB");
}

}  // namespace
}  // namespace remat
