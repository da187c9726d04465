// remat-compare's engine: one program (a graph), every method, a budget sweep.
//
//   remat::Graph program = remat::hold_inputs(graph);
//   remat::compare::CompareReport report = remat::compare::run_comparison(program, {});
//   std::cout << remat::compare::format_table(report);
//
// Methods: `noremat` (the program as it is), each static planner's schedule replayed exactly
// by the runtime (static_replay), each dynamic policy replaying the program under the budget,
// and `hinted`: the `hinted` policy seeded with the hints of the best static plan (the
// cheapest feasible one at that budget, or, where none is, at the nearest larger budget).
// Everything runs on the simulated backend through the same runtime and allocator, with
// budgets as fractions of the program's unconstrained peak (docs/formats.md's accounting).
#ifndef REMAT_TOOLS_COMPARE_COMPARE_H_
#define REMAT_TOOLS_COMPARE_COMPARE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "remat/graph.h"
#include "remat/graph_transforms.h"
#include "remat/runtime.h"
#include "tools/compare/svg_plot.h"

namespace remat::compare {

struct CompareOptions {
  std::vector<double> fractions = {1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1};
  std::vector<std::string> planners;  // empty: those that suit the graph's size
  std::vector<std::string> policies = {"dtr", "dtr_eq", "dtr_sqrt", "msps", "lru", "largest"};
  double planner_time_limit = 10;                // seconds, for the solvers (checkmate, moccasin)
  Accounting accounting = Accounting::kLogical;  // of the dynamic runs
  double slowdown_cap = 2.0;                     // a dynamic run past this slowdown fails (thrash)
  std::string timeline_dir;                      // non-empty: write timeline files there
  double timeline_fraction = 0.5;                // ... for the runs at this budget (all: see below)
  bool all_timelines = false;                    // ... for every run
  // What the fractions are of; unset: the graph's peak in file order (FORMAT.md). A trace's
  // comparison sets the trace's own logical peak, so that a fraction means the same bytes
  // as in remat-replay.
  std::optional<std::int64_t> baseline_peak;
  // Host memory for the planners (PlanOptions::host_link, host_memory_bytes); above 0, the
  // default planners include `offload`.
  HostLink host_link = HostLink::pcie5();
  std::int64_t host_memory_bytes = 0;
};

struct RunRow {
  std::string method;
  std::string kind;  // none, static, dynamic, hinted
  double fraction = 0;
  std::size_t budget = 0;
  std::string status = "ok";         // ok, infeasible, oom, thrash, over_budget, error
  std::string note;                  // why not ok, or what seeded `hinted`
  std::size_t peak_reserved = 0;     // allocator accounting (static: its replay)
  std::size_t peak_logical = 0;      // sum of live tensor sizes
  std::int64_t predicted_peak = -1;  // static: the planner's simulated peak
  double overhead = 0;               // recomputed cost / base cost
  std::size_t evictions = 0;
  std::size_t recomputations = 0;
  double decision_seconds = 0;  // planner: solve time; dynamic: eviction search time
  // A plan with offloads: how many, the bytes they move, and the copies' time the steps
  // waited for.
  int offloads = 0;
  std::int64_t bytes_moved = 0;
  double transfer_exposed = 0;
  std::string timeline;  // path of its timeline file, if written
};

struct CompareReport {
  std::string name;
  std::int64_t baseline_peak = 0;  // the program's unconstrained peak (budgets are of it)
  std::size_t nodes = 0;
  std::vector<RunRow> rows;
};

CompareReport run_comparison(const Graph& program, const CompareOptions& options);

// The planners run_comparison uses on a graph of `nodes` nodes when none are named (with host
// memory, `offload` too).
std::vector<std::string> default_planners(std::size_t nodes, std::int64_t host_memory_bytes = 0);

std::string format_table(const CompareReport& report);
nlohmann::json to_json(const CompareReport& report);
// One series per method: (fraction, overhead) of its ok runs.
std::vector<PlotSeries> overhead_series(const CompareReport& report);

}  // namespace remat::compare

#endif  // REMAT_TOOLS_COMPARE_COMPARE_H_
