// remat-replay: replays a recorded training step (DTR log format) under a memory budget on
// the simulated backend and prints one result per run (a table, or JSON lines with --json).
//
//   remat-replay TRACE.log --policy dtr --budget-fraction 0.5
//   remat-replay TRACE.log --policy all --sweep --json --accounting allocator
//   remat-replay --policy list
#include <absl/strings/str_format.h>
#include <absl/strings/str_split.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "remat/replay.h"
#include "tools/cli/flags.h"

namespace {

struct Args {
  std::string trace, policy;
  std::vector<std::string> policies;
  remat::cli::BudgetFlags budget;
  bool sweep = false, json = false, no_window = false;
  std::string accounting = "logical";
  std::uint64_t min_evictable = 0;
  std::uint64_t host_memory = 0;
  remat::ReplayOptions replay;
};

void declare_flags(remat::cli::FlagSet& flags, Args& a) {
  flags.add_positional("TRACE.log", &a.trace, "the recorded step (DTR log format)");
  flags.add("policy", &a.policy,
            "eviction policies, comma-separated, or all, or list (prints their names)");
  flags.add_budget(&a.budget,
                   "the trace's peak of live bytes when nothing is evicted (logical accounting)");
  flags.add_switch("sweep", &a.sweep, "budgets 1.0, 0.9, ..., 0.1 of that peak");
  flags.add_choice("accounting", &a.accounting, {"logical", "allocator"},
                   "what the budget caps: the sum of live tensor bytes, or the allocator's "
                   "reserved bytes");
  flags.add_switch("json", &a.json, "one JSON object per run instead of a table");
  flags.add_switch("sample", &a.replay.sample_candidates,
                   "score a random sample of candidates rather than all of them");
  flags.add_switch("no-window", &a.no_window, "evict single tensors, not contiguous windows");
  flags.add_switch("expandable", &a.replay.expandable_segments,
                   "one expandable arena instead of segments");
  flags.add("min-evictable", &a.min_evictable, "never evict tensors smaller than this (bytes)");
  flags.add("slowdown-cap", &a.replay.slowdown_cap,
            "a run whose slowdown passes this is stopped as thrashing", 1.0);
  flags.add_host_memory(&a.replay.host_link, &a.host_memory,
                        "victims whose round trip costs less than recomputing them (none given: "
                        "none)");
}

// Checks what the flags asked for; an error message where they do not make sense.
std::optional<std::string> check_args(Args& a) {
  a.policies = a.policy == "all"
                   ? remat::eviction_policy_names()
                   : std::vector<std::string>(absl::StrSplit(a.policy, ',', absl::SkipEmpty()));
  a.replay.contiguous_eviction = !a.no_window;
  a.replay.min_evictable_bytes = static_cast<std::size_t>(a.min_evictable);
  a.replay.host_memory_bytes = static_cast<std::size_t>(a.host_memory);
  a.replay.accounting =
      a.accounting == "logical" ? remat::Accounting::kLogical : remat::Accounting::kAllocator;
  if (a.trace.empty()) return "no trace given";
  if (a.policies.empty()) return "no --policy given";
  for (const std::string& p : a.policies) {
    bool known = false;
    for (const std::string& n : remat::eviction_policy_names()) known |= n == p;
    if (!known) return "unknown policy '" + p + "' (--policy list shows them)";
  }
  if (a.budget.given() == a.sweep) return "give one of --budget, --budget-fraction, --sweep";
  return std::nullopt;
}

// The budgets to replay at: the sweep's ten fractions, one fraction, or one size.
std::vector<std::size_t> budgets_for(const Args& a, const remat::ReplayBaseline& base) {
  std::vector<std::size_t> budgets;
  std::vector<double> fractions;
  if (a.sweep)
    for (int k = 10; k >= 1; --k) fractions.push_back(k / 10.0);
  else if (a.budget.fraction)
    fractions.push_back(*a.budget.fraction);
  else
    budgets.push_back(static_cast<std::size_t>(*a.budget.bytes));
  for (double f : fractions)
    budgets.push_back(static_cast<std::size_t>(f * static_cast<double>(base.logical_peak_bytes)));
  return budgets;
}

struct Row {
  const std::string& trace;
  const std::string& policy;
  const char* accounting;
  std::size_t budget;
  double fraction;
  const remat::ReplayBaseline& base;
  const remat::ReplayResult& r;
};

void print_json(const Row& row) {
  const remat::ReplayResult& r = row.r;
  nlohmann::json j = {
      {"trace", row.trace},
      {"policy", row.policy},
      {"accounting", row.accounting},
      {"budget_bytes", row.budget},
      {"budget_fraction", row.fraction},
      {"baseline_peak_bytes", row.base.logical_peak_bytes},
      {"baseline_reserved_bytes", row.base.reserved_peak_bytes},
      {"constant_bytes", row.base.constant_bytes},
      {"peak_reserved_bytes", r.peak_reserved_bytes},
      {"peak_allocated_bytes", r.peak_allocated_bytes},
      {"fragmentation", r.fragmentation},
      {"segment_reserves", r.segment_reserves},
      {"segment_releases", r.segment_releases},
      // A run that stopped early has no slowdown: its time so far is not a step's.
      {"slowdown", r.status == "ok" ? nlohmann::json(r.slowdown) : nlohmann::json()},
      {"evictions", r.evictions},
      {"recomputations", r.recomputations},
      {"retried_requests", r.retried_requests},
      {"search_seconds", r.search_seconds},
      {"simulated_seconds", r.simulated_seconds},
      {"wall_seconds", r.wall_seconds},
      {"status", r.status},
      {"offloads", r.offloads},
      {"restores", r.restores},
      {"transfer_seconds", r.transfer_seconds},
  };
  if (!r.error.empty()) j["error"] = r.error;
  std::cout << j.dump() << "\n";
}

void print_text(const Row& row) {
  const remat::ReplayResult& r = row.r;
  const std::string slowdown =
      r.status == "ok" ? absl::StrFormat("%.3f", r.slowdown) : std::string("-");
  std::printf("%-12s %-10s %-9s %14zu %14zu %14zu %8.2f %9s %9zu %9zu %8.4f\n", row.trace.c_str(),
              row.policy.c_str(), r.status.c_str(), row.budget, r.peak_reserved_bytes,
              r.peak_allocated_bytes, row.fraction, slowdown.c_str(), r.evictions, r.recomputations,
              r.search_seconds);
}

// Replays `trace` for every policy and budget; true when every run fit.
bool replay_all(const Args& a, const remat::DtrTrace& trace) {
  const remat::ReplayBaseline base = remat::replay_baseline(trace);
  if (!a.json) {
    std::printf("%-12s %-10s %-9s %14s %14s %14s %8s %9s %9s %9s %8s\n", "trace", "policy",
                "status", "budget", "peak_reserved", "peak_alloc", "frac", "slowdown", "evictions",
                "recomputes", "search_s");
  }
  const char* accounting =
      a.replay.accounting == remat::Accounting::kLogical ? "logical" : "allocator";
  bool all_fit = true;
  for (const std::string& policy : a.policies) {
    for (std::size_t budget : budgets_for(a, base)) {
      remat::ReplayOptions opts = a.replay;
      opts.policy = policy;
      opts.budget = budget;
      const remat::ReplayResult r = remat::replay(trace, opts);
      const double fraction =
          static_cast<double>(budget) / static_cast<double>(base.logical_peak_bytes);
      const Row row{trace.name, policy, accounting, budget, fraction, base, r};
      a.json ? print_json(row) : print_text(row);
      all_fit &= r.status == "ok";
      std::fflush(stdout);
    }
  }
  return all_fit;
}

int run(int argc, char** argv) {
  namespace cli = remat::cli;
  Args a;
  cli::FlagSet flags("remat-replay",
                     "TRACE.log --policy P (--budget B | --budget-fraction F | --sweep) [flags]",
                     "Replays a recorded training step under a memory budget on the simulated "
                     "backend, one result per run.\nExit status: 0 every run fit its budget, 1 "
                     "some run ran out of memory or thrashed, 2 a bad flag or input.");
  declare_flags(flags, a);
  if (std::optional<int> code = flags.parse(argc, const_cast<const char* const*>(argv)))
    return *code;
  if (a.policy == "list") {
    for (const std::string& p : remat::eviction_policy_names()) std::printf("%s\n", p.c_str());
    return cli::kExitOk;
  }
  if (std::optional<std::string> why = check_args(a)) {
    std::fprintf(stderr, "remat-replay: %s (remat-replay --help lists the flags)\n", why->c_str());
    return cli::kExitError;
  }
  auto trace = remat::read_dtr_trace_file(a.trace);
  if (!trace.ok()) {
    std::fprintf(stderr, "remat-replay: %s\n", std::string(trace.status().message()).c_str());
    return cli::kExitError;
  }
  return replay_all(a, *trace) ? cli::kExitOk : cli::kExitInfeasible;
}

}  // namespace

// A bad trace is a Status from the parser (exit 2); anything that still escapes is reported
// on one line with exit 2 rather than left to std::terminate.
int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::string what = e.what();
    std::replace(what.begin(), what.end(), '\n', ' ');
    std::fprintf(stderr, "remat-replay: error: %s\n", what.c_str());
    return remat::cli::kExitError;
  }
}
