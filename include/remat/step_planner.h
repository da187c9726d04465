// remat/step_planner.h: from a step the runtime recorded to the plan its later steps follow:
// the step's graph with its inputs held (as the runtime holds parameters), a list of planners
// under a budget, the schedule the runtime realized competing with them, the cheapest
// feasible plan, and that plan as the runtime's hints (remat/hints.h).
//
// Usage (remat/step_driver.h runs the whole loop: record, plan, follow):
//   remat::RecordedStep step = rt.end_step();            // recorded with StepOptions::record
//   remat::StepPlanOptions opt;
//   opt.budget_bytes = 100 << 20;                        // the planners' budget
//   opt.planners = {"chen", "twremat", "rotor"};
//   absl::StatusOr<remat::ChosenPlan> chosen = remat::plan_step(step.graph, step.executed, opt);
//   if (chosen.ok() && chosen->feasible)
//     cache.insert(key, std::make_shared<remat::StepHints>(chosen->hints));
//   else if (chosen.ok()) std::cerr << chosen->reason << "\n";   // nothing fits the budget
//
// Tools that measure candidates their own way (tools/compare replays every plan) build the
// same pipeline from its parts: plan_holding_inputs() for each planner, realized_plan() for
// what a dynamic run did, CheapestPlan to keep the best, hints_from_schedule() for the hints.
//
// Only the IR's types are taken (a recorded step's graph and executed positions, not
// RecordedStep itself), so that the planner does not depend on the runtime.
#ifndef REMAT_STEP_PLANNER_H_
#define REMAT_STEP_PLANNER_H_

#include <absl/status/statusor.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "remat/graph.h"
#include "remat/hints.h"
#include "remat/planner.h"
#include "remat/schedule.h"

namespace remat {

// StepCandidate::source and ChosenPlan::source of what the runtime itself did on the step.
inline constexpr std::string_view kRealizedSource = "the schedule the runtime realized";

// Graphs larger than this (nodes) skip `greedy`, which simulates once per candidate.
inline constexpr std::size_t kGreedyMaxNodes = 3000;

// Planner `algo`'s plan for `held`, a hold_inputs() graph (remat/graph_transforms.h), under
// `options`: run_planner(), then, where the plan is feasible, hold_inputs_to_the_end() and,
// if that moved anything, simulate() again under options.budget_bytes (`feasible` and `sim`
// are then the new verdict; `reason` says why it no longer fits). Errors are run_planner()'s.
absl::StatusOr<Plan> plan_holding_inputs(std::string_view algo, const Graph& held,
                                         const PlanOptions& options);

// What a run of the step did (`executed`: RecordedStep::executed, or ReplayResult::executed,
// positions at `sites`) as a plan of `held`: realized_schedule() simulated under
// `budget_bytes` (none: checked for validity only). `algo` is "realized"; `feasible` is the
// simulator's verdict and `reason` its error. Errors are realized_schedule()'s.
absl::StatusOr<Plan> realized_plan(const Graph& held, const std::vector<StepSite>& sites,
                                   const std::vector<int>& executed,
                                   std::optional<std::int64_t> budget_bytes = std::nullopt);

// The cheapest of the schedules offered to it, by whatever cost the caller measures (the
// simulator's cost, a replay's overhead). A schedule replaces the best only if it costs
// strictly less: of equal costs, the first offered wins.
class CheapestPlan {
 public:
  // Returns whether `schedule` is now the best.
  bool offer(double cost, const Schedule& schedule, std::string_view source);
  bool empty() const { return !has_; }
  double cost() const { return cost_; }  // INFINITY while empty
  const Schedule& schedule() const { return schedule_; }
  const std::string& source() const { return source_; }

 private:
  bool has_ = false;
  double cost_ = INFINITY;
  Schedule schedule_;
  std::string source_;
};

struct StepPlanOptions {
  // The planners' budget in tensor bytes (docs/formats.md's accounting). A runtime budget in
  // reserved bytes should be passed somewhat lower: the allocator rounds sizes up and cannot
  // always reuse a freed block.
  std::int64_t budget_bytes = -1;
  std::vector<std::string> planners = {"chen", "twremat", "greedy", "rotor", "mincut"};
  double time_limit_seconds = 5;  // each planner's (PlanOptions::time_limit_seconds)
  // The schedule the runtime realized on the step competes with the planners' plans, checked
  // for validity and, when realized_budget_bytes is set, against that budget. Unset, it is
  // not held to budget_bytes: it already ran within the runtime's own budget.
  bool include_realized = true;
  std::optional<std::int64_t> realized_budget_bytes;
  std::size_t greedy_max_nodes = kGreedyMaxNodes;  // larger graphs skip `greedy`
  // Host memory for the plan (RuntimeOptions::host_memory_bytes): above 0, planner `offload`
  // improves the cheapest plan with copies over `host_link` (or searches alone where no
  // plan fits), the constants staying where they are; it competes like the others.
  std::int64_t host_memory_bytes = 0;
  HostLink host_link = HostLink::pcie5();
};

// One plan that plan_step() weighed.
struct StepCandidate {
  std::string source;        // "the schedule the runtime realized", or the planner's name
  bool feasible = false;     // valid and within its budget
  std::string reason;        // why not feasible (a planner's error, a skip, the simulator)
  double cost = INFINITY;    // the simulator's cost (SimResult::cost) where feasible
  double solve_seconds = 0;  // the planner's (0 for the realized schedule)
};

struct ChosenPlan {
  // Whether some candidate was feasible; `source`, `schedule`, `sim` and `hints` are then the
  // cheapest one's (the lowest SimResult::cost; of equal costs, the earliest candidate: the
  // realized schedule, then the planners in their order).
  bool feasible = false;
  std::string reason;  // not feasible: every candidate's reason
  std::string source;  // "the schedule the runtime realized" or "ALGO @ BUDGET B"
  Graph graph;         // the step's graph with its inputs held: what `schedule` is of
  Schedule schedule;
  SimResult sim;    // simulate(graph, schedule), under the candidate's budget
  StepHints hints;  // hints_from_schedule() at recorded_sites(graph); empty if none
  std::vector<StepCandidate> candidates;  // every candidate weighed, in order
  // Where planner `offload` won (host memory given): the cheapest plan without copies, its
  // source and hints, for a caller that prices plans on the runtime to weigh both (a plan's
  // copies may wait longer there than the simulator says). Empty otherwise.
  std::string recompute_only_source;
  StepHints recompute_only_hints;
};

// Plans a recorded step (`graph`: RecordedStep::graph; `executed`: RecordedStep::executed)
// under options.budget_bytes. A budget nothing meets is not an error: the result says
// feasible == false, with each candidate's reason, and carries empty hints (the `hinted`
// policy then runs as DTR alone). So is a planner that fails (an unknown name): it is a
// candidate that is not feasible. Errors are for a negative budget.
absl::StatusOr<ChosenPlan> plan_step(const Graph& graph, const std::vector<int>& executed,
                                     const StepPlanOptions& options);

}  // namespace remat

#endif  // REMAT_STEP_PLANNER_H_
