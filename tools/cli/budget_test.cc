#include "tools/cli/budget.h"

#include <gtest/gtest.h>

namespace remat::cli {
namespace {

TEST(ParseBytes, CountsAndUnits) {
  EXPECT_EQ(*parse_bytes("0"), 0u);
  EXPECT_EQ(*parse_bytes("123456"), 123456u);
  EXPECT_EQ(*parse_bytes("512B"), 512u);
  EXPECT_EQ(*parse_bytes("2KiB"), 2048u);
  EXPECT_EQ(*parse_bytes("300kB"), 300000u);
  EXPECT_EQ(*parse_bytes("1.5GiB"), 1610612736u);
  EXPECT_EQ(*parse_bytes("2GB"), 2000000000u);
  EXPECT_EQ(*parse_bytes("40 MiB"), 40u << 20);
  EXPECT_EQ(*parse_bytes("1e3"), 1000u);  // a plain number in exponent form
  EXPECT_EQ(*parse_bytes("0.5KiB"), 512u);
  EXPECT_EQ(*parse_bytes("4611686018427387904"), kMaxBudgetBytes);
}

TEST(ParseBytes, RejectsWhatIsNotABudget) {
  for (const char* bad : {"", "-1", "-1MiB", "abc", "1.5", "inf", "nan", "1e30", "1e309", "5XB",
                          "4611686018427387905", "99999999999999999999999", "MiB", "1 2"}) {
    absl::StatusOr<std::uint64_t> b = parse_bytes(bad);
    EXPECT_FALSE(b.ok()) << "'" << bad << "' gave " << *b;
  }
  EXPECT_NE(parse_bytes("1e30").status().message().find("over 2^62"), std::string::npos);
}

TEST(ParseFraction, OnlyTheUnitInterval) {
  EXPECT_EQ(*parse_fraction("1"), 1.0);
  EXPECT_EQ(*parse_fraction("0.25"), 0.25);
  for (const char* bad : {"0", "-0.5", "1.01", "1e30", "inf", "-inf", "nan", "", "half"})
    EXPECT_FALSE(parse_fraction(bad).ok()) << bad;
}

TEST(BudgetFlags, ResolvesBytesOrAFractionOfTheBaseline) {
  BudgetFlags none;
  EXPECT_FALSE(none.resolve(1000).has_value());
  BudgetFlags bytes{.bytes = 77, .fraction = std::nullopt};
  EXPECT_EQ(*bytes.resolve(1000), 77u);
  BudgetFlags fraction{.bytes = std::nullopt, .fraction = 0.333};
  EXPECT_EQ(*fraction.resolve(1000), 333u);
  EXPECT_EQ(*fraction.resolve(0), 0u);
}

}  // namespace
}  // namespace remat::cli
