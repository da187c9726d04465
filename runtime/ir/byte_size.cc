#include "remat/byte_size.h"

#include <absl/strings/ascii.h>
#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>

#include <cmath>
#include <utility>

namespace remat {
namespace {

// The unit at the end of `text` and its multiplier; "" (bytes) when there is none.
std::pair<absl::string_view, double> split_unit(absl::string_view text) {
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

// Debian's abseil has a string_view of its own.
absl::StatusOr<std::uint64_t> parse_byte_size(std::string_view text_in, std::string_view what_in) {
  const absl::string_view text(text_in.data(), text_in.size());
  const absl::string_view what(what_in.data(), what_in.size());
  const absl::string_view trimmed = absl::StripAsciiWhitespace(text);
  auto [number, scale] = split_unit(trimmed);
  number = absl::StripTrailingAsciiWhitespace(number);
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("'", text, "' is not a ", what, ": ", why));
  };
  if (number.empty()) return bad("wants a number of bytes, e.g. 123456, 512MiB or 1.5GiB");
  std::uint64_t whole = 0;
  if (scale == 1.0 && number.find_first_not_of("0123456789") == absl::string_view::npos) {
    if (!absl::SimpleAtoi(number, &whole) || whole > kMaxByteSize) return bad("over 2^62 bytes");
    return whole;
  }
  double x = 0;
  if (!absl::SimpleAtod(number, &x) || std::isnan(x))
    return bad("wants a number of bytes, e.g. 123456, 512MiB or 1.5GiB");
  if (x < 0) return bad("negative");
  if (scale == 1.0 && x != std::floor(x)) return bad("a count of bytes is a whole number");
  const double bytes = std::floor(x * scale);
  if (!(bytes <= static_cast<double>(kMaxByteSize))) return bad("over 2^62 bytes");
  return static_cast<std::uint64_t>(bytes);
}

std::string format_byte_size(std::uint64_t bytes) {
  static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB"};
  if (bytes < 1024) return absl::StrCat(bytes, " B");
  double x = static_cast<double>(bytes) / 1024;
  int unit = 0;
  for (; x >= 1024 && unit < 3; ++unit) x /= 1024;
  return absl::StrFormat("%.2f %s", x, kUnits[unit]);
}

}  // namespace remat
