#include "tools/cli/budget.h"

#include <absl/strings/ascii.h>
#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>

#include <cmath>

#include "remat/byte_size.h"

namespace remat::cli {

absl::StatusOr<std::uint64_t> parse_bytes(absl::string_view text) {
  return parse_byte_size(std::string_view(text.data(), text.size()), "budget");
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
