// remat-replay: replays a recorded training step (DTR log format) under a memory budget on
// the simulated backend and prints one result per run (a table, or JSON lines with --json).
//
//   remat-replay TRACE.log --policy dtr --budget-fraction 0.5
//   remat-replay TRACE.log --policy all --sweep --json --accounting allocator
//   remat-replay --policy list
#include <absl/strings/numbers.h>
#include <absl/strings/str_split.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "remat/replay.h"

namespace {

int usage(const char* why) {
  if (why != nullptr) std::fprintf(stderr, "remat-replay: %s\n", why);
  std::fprintf(stderr,
               "usage: remat-replay TRACE.log --policy P|all|list (--budget BYTES | "
               "--budget-fraction F | --sweep)\n"
               "                    [--accounting logical|allocator] [--json] [--sample]\n"
               "                    [--min-evictable BYTES] [--no-window] [--expandable]\n"
               "                    [--slowdown-cap X]\n");
  return 2;
}

struct Args {
  std::string trace;
  std::vector<std::string> policies;
  bool list = false;
  long long budget = -1;
  std::vector<double> fractions;
  bool json = false;
  remat::ReplayOptions replay;
};

bool parse(int argc, char** argv, Args& a, std::string& err) {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&](const char* flag) -> const char* {
      if (i + 1 >= argc) {
        err = std::string(flag) + " needs a value";
        return nullptr;
      }
      return argv[++i];
    };
    if (arg == "--policy") {
      const char* v = value("--policy");
      if (v == nullptr) return false;
      if (std::string(v) == "list")
        a.list = true;
      else if (std::string(v) == "all")
        a.policies = remat::eviction_policy_names();
      else
        a.policies = absl::StrSplit(v, ',');
    } else if (arg == "--budget") {
      const char* v = value("--budget");
      if (v == nullptr) return false;
      if (!absl::SimpleAtoi(v, &a.budget) || a.budget < 0) return err = "bad --budget", false;
    } else if (arg == "--budget-fraction") {
      const char* v = value("--budget-fraction");
      double f;
      if (v == nullptr) return false;
      if (!absl::SimpleAtod(v, &f) || !(f > 0)) return err = "bad --budget-fraction", false;
      a.fractions = {f};
    } else if (arg == "--sweep") {
      a.fractions.clear();
      for (int k = 10; k >= 1; --k) a.fractions.push_back(k / 10.0);
    } else if (arg == "--json") {
      a.json = true;
    } else if (arg == "--sample") {
      a.replay.sample_candidates = true;
    } else if (arg == "--no-window") {
      a.replay.contiguous_eviction = false;
    } else if (arg == "--expandable") {
      a.replay.expandable_segments = true;
    } else if (arg == "--accounting") {
      const char* v = value("--accounting");
      if (v == nullptr) return false;
      if (std::string(v) == "logical")
        a.replay.accounting = remat::Accounting::kLogical;
      else if (std::string(v) == "allocator")
        a.replay.accounting = remat::Accounting::kAllocator;
      else
        return err = "--accounting is logical or allocator", false;
    } else if (arg == "--min-evictable") {
      const char* v = value("--min-evictable");
      if (v == nullptr || !absl::SimpleAtoi(v, &a.replay.min_evictable_bytes))
        return err = "bad --min-evictable", false;
    } else if (arg == "--slowdown-cap") {
      const char* v = value("--slowdown-cap");
      if (v == nullptr || !absl::SimpleAtod(v, &a.replay.slowdown_cap))
        return err = "bad --slowdown-cap", false;
    } else if (!arg.empty() && arg[0] == '-') {
      return err = "unknown flag " + arg, false;
    } else if (a.trace.empty()) {
      a.trace = arg;
    } else {
      return err = "more than one trace given", false;
    }
  }
  return true;
}

int run(int argc, char** argv) {
  Args a;
  std::string err;
  if (!parse(argc, argv, a, err)) return usage(err.c_str());
  if (a.list) {
    for (const std::string& p : remat::eviction_policy_names()) std::printf("%s\n", p.c_str());
    return 0;
  }
  if (a.trace.empty()) return usage("no trace given");
  if (a.policies.empty()) return usage("no --policy given");
  for (const std::string& p : a.policies) {
    bool known = false;
    for (const std::string& n : remat::eviction_policy_names()) known |= n == p;
    if (!known) return usage(("unknown policy '" + p + "' (--policy list shows them)").c_str());
  }
  if (a.budget < 0 && a.fractions.empty())
    return usage("give --budget, --budget-fraction or --sweep");

  auto trace = remat::read_dtr_trace_file(a.trace);
  if (!trace.ok()) {
    std::fprintf(stderr, "remat-replay: %s\n", std::string(trace.status().message()).c_str());
    return 1;
  }
  const remat::ReplayBaseline base = remat::replay_baseline(*trace);
  std::vector<std::size_t> budgets;
  if (a.budget >= 0) budgets.push_back(static_cast<std::size_t>(a.budget));
  for (double f : a.fractions)
    budgets.push_back(static_cast<std::size_t>(f * static_cast<double>(base.logical_peak_bytes)));

  if (!a.json) {
    std::printf("%-12s %-10s %-9s %14s %14s %14s %8s %9s %9s %9s %8s\n", "trace", "policy",
                "status", "budget", "peak_reserved", "peak_alloc", "frac", "slowdown", "evictions",
                "recomputes", "search_s");
  }
  const char* accounting =
      a.replay.accounting == remat::Accounting::kLogical ? "logical" : "allocator";
  for (const std::string& policy : a.policies) {
    for (std::size_t budget : budgets) {
      remat::ReplayOptions opts = a.replay;
      opts.policy = policy;
      opts.budget = budget;
      const remat::ReplayResult r = remat::replay(*trace, opts);
      const double fraction =
          static_cast<double>(budget) / static_cast<double>(base.logical_peak_bytes);
      if (a.json) {
        nlohmann::json j = {
            {"trace", trace->name},
            {"policy", policy},
            {"accounting", accounting},
            {"budget_bytes", budget},
            {"budget_fraction", fraction},
            {"baseline_peak_bytes", base.logical_peak_bytes},
            {"baseline_reserved_bytes", base.reserved_peak_bytes},
            {"constant_bytes", base.constant_bytes},
            {"peak_reserved_bytes", r.peak_reserved_bytes},
            {"peak_allocated_bytes", r.peak_allocated_bytes},
            {"fragmentation", r.fragmentation},
            {"segment_reserves", r.segment_reserves},
            {"segment_releases", r.segment_releases},
            {"slowdown", r.slowdown},
            {"evictions", r.evictions},
            {"recomputations", r.recomputations},
            {"search_seconds", r.search_seconds},
            {"simulated_seconds", r.simulated_seconds},
            {"wall_seconds", r.wall_seconds},
            {"status", r.status},
        };
        if (!r.error.empty()) j["error"] = r.error;
        std::cout << j.dump() << "\n";
      } else {
        std::printf("%-12s %-10s %-9s %14zu %14zu %14zu %8.2f %9.3f %9zu %9zu %8.4f\n",
                    trace->name.c_str(), policy.c_str(), r.status.c_str(), budget,
                    r.peak_reserved_bytes, r.peak_allocated_bytes, fraction, r.slowdown,
                    r.evictions, r.recomputations, r.search_seconds);
      }
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace

// A bad trace is a Status from the parser (exit 1); anything that still escapes is reported
// on one line with exit 2 rather than left to std::terminate.
int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::string what = e.what();
    std::replace(what.begin(), what.end(), '\n', ' ');
    std::fprintf(stderr, "remat-replay: error: %s\n", what.c_str());
    return 2;
  }
}
