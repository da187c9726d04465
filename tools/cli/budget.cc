#include "tools/cli/budget.h"

#include <absl/strings/ascii.h>
#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>

#include <cmath>
#include <string>
#include <utility>

namespace remat::cli {

namespace {

// The unit at the end of `text` and its multiplier; "" (bytes) when there is none.
std::pair<absl::string_view, double> SplitUnit(absl::string_view text) {
  static constexpr std::pair<absl::string_view, double> kUnits[] = {
      {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0}, {"TiB", 1099511627776.0},
      {"kB", 1e3},     {"KB", 1e3},        {"MB", 1e6},           {"GB", 1e9},
      {"TB", 1e12},    {"B", 1.0}};
  for (const auto& [unit, scale] : kUnits) {
    if (text.size() > unit.size() && text.substr(text.size() - unit.size()) == unit)
      return {text.substr(0, text.size() - unit.size()), scale};
  }
  return {text, 1.0};
}

}  // namespace

absl::StatusOr<std::uint64_t> parse_bytes(absl::string_view text) {
  const absl::string_view trimmed = absl::StripAsciiWhitespace(text);
  auto [number, scale] = SplitUnit(trimmed);
  number = absl::StripTrailingAsciiWhitespace(number);
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("'", text, "' is not a budget: ", why));
  };
  if (number.empty()) return bad("wants a number of bytes, e.g. 123456, 512MiB or 1.5GiB");
  std::uint64_t whole = 0;
  if (scale == 1.0 && number.find_first_not_of("0123456789") == absl::string_view::npos) {
    if (!absl::SimpleAtoi(number, &whole) || whole > kMaxBudgetBytes) return bad("over 2^62 bytes");
    return whole;
  }
  double x = 0;
  if (!absl::SimpleAtod(number, &x) || std::isnan(x))
    return bad("wants a number of bytes, e.g. 123456, 512MiB or 1.5GiB");
  if (x < 0) return bad("negative");
  if (scale == 1.0 && x != std::floor(x)) return bad("a count of bytes is a whole number");
  const double bytes = std::floor(x * scale);
  if (!(bytes <= static_cast<double>(kMaxBudgetBytes))) return bad("over 2^62 bytes");
  return static_cast<std::uint64_t>(bytes);
}

absl::StatusOr<double> parse_fraction(absl::string_view text) {
  double x = 0;
  if (!absl::SimpleAtod(absl::StripAsciiWhitespace(text), &x) || !(x > 0) || !(x <= 1))
    return absl::InvalidArgumentError(
        absl::StrCat("'", text, "' is not a budget fraction: wants a number in (0, 1]"));
  return x;
}

std::optional<std::uint64_t> BudgetFlags::resolve(std::uint64_t baseline) const {
  if (bytes) return bytes;
  if (!fraction) return std::nullopt;
  return static_cast<std::uint64_t>(std::floor(*fraction * static_cast<double>(baseline)));
}

}  // namespace remat::cli
