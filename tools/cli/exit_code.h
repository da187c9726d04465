// The exit codes every remat tool uses, so that a script can tell a budget that cannot be met
// from a mistake in the command or the input.
//
//   if (!plan.feasible) return remat::cli::kExitInfeasible;
#ifndef REMAT_TOOLS_CLI_EXIT_CODE_H_
#define REMAT_TOOLS_CLI_EXIT_CODE_H_

namespace remat::cli {

// The tool ran and everything it was asked for fits its budget (also --help and --version).
inline constexpr int kExitOk = 0;
// The tool ran, and a plan or run did not fit its budget: no plan found, out of memory,
// thrashing. Its output still reports what happened.
inline constexpr int kExitInfeasible = 1;
// Nothing meaningful ran: a bad flag, a bad or unreadable input file, an internal error.
inline constexpr int kExitError = 2;

}  // namespace remat::cli

#endif  // REMAT_TOOLS_CLI_EXIT_CODE_H_
