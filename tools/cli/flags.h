// The one command-line library of remat's tools (remat-plan, remat-replay, remat-compare and
// the example trainers), on Boost.Program_options: typed flags with their defaults, --help
// listing every flag and exiting 0, --version, --name=value or --name value, and one line
// naming the flag on every mistake (exit code kExitError).
//
//   remat::cli::FlagSet flags("remat-plan", "GRAPH.json --algo A [flags]",
//                             "Plans a rematerialization schedule for a remat-graph-v1 file.");
//   std::string graph, algo;
//   double time_limit = 60;
//   flags.add_positional("graph", &graph, "the remat-graph-v1 file");
//   flags.add("algo", &algo, "the planner");
//   flags.add("time-limit", &time_limit, "seconds the planner may take", /*min=*/0.001);
//   if (std::optional<int> code = flags.parse(argc, argv)) return *code;
#ifndef REMAT_TOOLS_CLI_FLAGS_H_
#define REMAT_TOOLS_CLI_FLAGS_H_

#include <absl/status/status.h>

#include <absl/strings/string_view.h>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "remat/host_link.h"
#include "tools/cli/budget.h"
#include "tools/cli/exit_code.h"

namespace remat::cli {

// The project's version, as --version prints it.
std::string version();

class FlagSet {
 public:
  FlagSet(std::string program, std::string synopsis, std::string description);

  // A flag with a value; the variable's value before parse() is the default --help shows.
  void add(const std::string& name, std::string* v, const std::string& help);
  void add(const std::string& name, std::int64_t* v, const std::string& help,
           std::int64_t min = std::numeric_limits<std::int64_t>::min());
  void add(const std::string& name, int* v, const std::string& help,
           int min = std::numeric_limits<int>::min());
  void add(const std::string& name, std::uint64_t* v, const std::string& help);
  // Finite numbers at least `min`.
  void add(const std::string& name, double* v, const std::string& help,
           double min = -std::numeric_limits<double>::max());
  void add(const std::string& name, float* v, const std::string& help,
           float min = -std::numeric_limits<float>::max());
  // A switch: present sets *v to true.
  void add_switch(const std::string& name, bool* v, const std::string& help);
  // One of `choices`.
  void add_choice(const std::string& name, std::string* v, std::vector<std::string> choices,
                  const std::string& help);
  // A comma-separated list (empty items dropped; an empty list is an error).
  void add_list(const std::string& name, std::vector<std::string>* v, const std::string& help);
  // Bytes, or a number with a unit (remat/byte_size.h: 512MiB, 1.5GiB, 2GB); `default_text`
  // is what --help shows as the default, `what` what an error calls the value.
  void add_bytes(const std::string& name, std::uint64_t* v, const std::string& default_text,
                 const std::string& help, std::string_view what = "byte size");
  // A flag read by `set`, which names what is wrong with a value.
  void add_custom(const std::string& name, const std::string& value_name,
                  const std::string& default_text, const std::string& help,
                  std::function<absl::Status(absl::string_view)> set);
  // --host-link (remat/host_link.h: a bandwidth in GB/s or a link's name) and --host-memory
  // (bytes with a unit; none given: no limit), for what may go to host memory: `what`.
  void add_host_memory(HostLink* link, std::uint64_t* bytes, const std::string& what);
  // --budget and --budget-fraction (budget.h); giving both is an error. `baseline` says what
  // the fraction is of.
  void add_budget(BudgetFlags* budget, const std::string& baseline);
  // A positional argument; at most one of each, in the order added. Missing ones stay as
  // they were (the tool says what it needs).
  void add_positional(const std::string& name, std::string* v, const std::string& help);

  // Reads the command line. Returns nullopt when the tool should go on, or the exit code when
  // it stops here: kExitOk after --help or --version, kExitError after a mistake, with one
  // line on stderr naming it.
  std::optional<int> parse(int argc, const char* const* argv);

  // What --help prints.
  std::string help() const;
  // Whether --name was on the command line (after parse()).
  bool given(const std::string& name) const;

  // The value of --name on a command line not yet parsed, for flags that decide which other
  // flags exist (remat-compare's --example); nullopt when absent or without a value.
  static std::optional<std::string> peek(int argc, const char* const* argv,
                                         const std::string& name);

 private:
  struct Flag {
    std::string name, value_name, default_text, help;
    bool is_switch = false;
    std::function<absl::Status(absl::string_view)> set;
  };
  struct Positional {
    std::string name, help;
    std::string* target;
  };

  friend class FlagSetOptions;  // the flags as Boost describes and parses them (flags.cc)
  void add_flag(Flag f);
  std::optional<int> fail(const std::string& message) const;

  std::string program_, synopsis_, description_;
  std::vector<Flag> flags_;
  std::vector<Positional> positionals_;
  std::vector<std::string> given_;
  BudgetFlags* budget_ = nullptr;
};

}  // namespace remat::cli

#endif  // REMAT_TOOLS_CLI_FLAGS_H_
