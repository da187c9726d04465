// The step driver's options (remat/step_driver.h) as command-line flags, the same in every
// tool that runs a training loop through remat::StepDriver: --backend, --budget BYTES |
// --budget-fraction F, --policy, --planners, --plan-time-limit, --seed, --costs,
// --compaction, --placement, --expandable-segments, --cuda-device, --sync-after-launch.
//
//   remat::StepDriverOptions options;
//   remat::cli::DriverFlags extra;
//   remat::cli::add_driver_flags(flags, options, extra);
//   if (std::optional<int> code = flags.parse(argc, argv)) return *code;
//   remat::cli::apply_driver_flags(extra, options);  // a fraction stays in extra.budget
#ifndef REMAT_TOOLS_CLI_DRIVER_FLAGS_H_
#define REMAT_TOOLS_CLI_DRIVER_FLAGS_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "remat/step_driver.h"
#include "tools/cli/budget.h"
#include "tools/cli/flags.h"

namespace remat::cli {

// What the flags read that does not map one to one onto StepDriverOptions.
struct DriverFlags {
  std::string backend = "cpu", costs = "estimated", compaction = "yes", placement = "yes";
  std::string plan_in_background = "yes";
  std::uint64_t max_shapes = StepDriverOptions{}.max_shapes;
  std::string roofline = "backend";
  std::uint64_t host_memory = 0;
  BudgetFlags budget;
};

// `budget_baseline` says what --budget-fraction is a fraction of.
void add_driver_flags(FlagSet& flags, StepDriverOptions& options, DriverFlags& extra,
                      const std::string& budget_baseline);
// Moves what add_driver_flags read into `options`: the budget where given in bytes.
void apply_driver_flags(const DriverFlags& extra, StepDriverOptions& options);

std::string_view backend_name(Backend backend);  // "cpu", "cuda", "sim"

}  // namespace remat::cli

#endif  // REMAT_TOOLS_CLI_DRIVER_FLAGS_H_
