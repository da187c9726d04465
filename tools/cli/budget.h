// The budget every remat tool takes, read the same way everywhere: --budget BYTES (a count of
// bytes, or a number with a unit: 512MiB, 1.5GiB, 2GB, 300kB) or --budget-fraction F, a
// number in (0, 1] of the tool's baseline, the program's peak without rematerialization (each
// tool's --help says how it measures that peak).
//
//   remat::cli::BudgetFlags budget;
//   flags.add_budget(&budget, "the peak of the file order, as ../shared/graphs/FORMAT.md");
//   ...
//   std::optional<std::uint64_t> bytes = budget.resolve(baseline_peak);
#ifndef REMAT_TOOLS_CLI_BUDGET_H_
#define REMAT_TOOLS_CLI_BUDGET_H_

#include <absl/status/statusor.h>

#include <absl/strings/string_view.h>
#include <cstdint>
#include <optional>

#include "remat/byte_size.h"

namespace remat::cli {

// The largest budget a tool accepts: the planners count bytes in int64_t.
inline constexpr std::uint64_t kMaxBudgetBytes = kMaxByteSize;

// remat::parse_byte_size (remat/byte_size.h), its errors worded as a budget's.
absl::StatusOr<std::uint64_t> parse_bytes(absl::string_view text);

// A number in (0, 1]; anything else (0, negative, above 1, inf, nan, text) is an error.
absl::StatusOr<double> parse_fraction(absl::string_view text);

struct BudgetFlags {
  std::optional<std::uint64_t> bytes;  // --budget
  std::optional<double> fraction;      // --budget-fraction

  bool given() const { return bytes.has_value() || fraction.has_value(); }
  // The budget in bytes: `bytes`, or floor(fraction x baseline); nullopt when neither was given.
  std::optional<std::uint64_t> resolve(std::uint64_t baseline) const;
};

}  // namespace remat::cli

#endif  // REMAT_TOOLS_CLI_BUDGET_H_
