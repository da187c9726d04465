#include "remat/step_planner.h"

#include <absl/strings/str_cat.h>
#include <absl/strings/str_join.h>

#include <utility>

#include "remat/graph_transforms.h"

namespace remat {

absl::StatusOr<Plan> plan_holding_inputs(std::string_view algo, const Graph& held,
                                         const PlanOptions& options) {
  absl::StatusOr<Plan> plan = run_planner(algo, held, options);
  if (plan.ok() && plan->feasible && hold_inputs_to_the_end(held, plan->schedule)) {
    plan->sim = simulate(held, plan->schedule, options.budget_bytes);
    plan->feasible = plan->sim.valid;
    if (!plan->feasible) plan->reason = "over budget once the inputs are held to the end";
  }
  return plan;
}

absl::StatusOr<Plan> realized_plan(const Graph& held, const std::vector<StepSite>& sites,
                                   const std::vector<int>& executed,
                                   std::optional<std::int64_t> budget_bytes) {
  absl::StatusOr<Schedule> schedule = realized_schedule(held, sites, executed);
  if (!schedule.ok()) return schedule.status();
  Plan plan;
  plan.algo = "realized";
  plan.budget_bytes = budget_bytes;
  plan.sim = simulate(held, *schedule, budget_bytes);
  plan.feasible = plan.sim.valid;
  plan.reason = plan.sim.error;
  plan.schedule = *std::move(schedule);
  return plan;
}

bool CheapestPlan::offer(double cost, const Schedule& schedule, std::string_view source) {
  if (!(cost < cost_)) return false;
  has_ = true;
  cost_ = cost;
  schedule_ = schedule;
  source_ = std::string(source);
  return true;
}

namespace {

// The cheapest candidate as the chosen plan, with its hints; or why no candidate fits.
void choose(ChosenPlan& chosen, const CheapestPlan& best, const SimResult& best_sim,
            const std::vector<StepSite>& sites, std::int64_t budget_bytes) {
  if (best.empty()) {
    std::vector<std::string> why;
    for (const StepCandidate& c : chosen.candidates)
      why.push_back(absl::StrCat(c.source, ": ", c.reason));
    chosen.reason =
        absl::StrCat("no plan fits ", budget_bytes, " B (", absl::StrJoin(why, "; "), ")");
    return;
  }
  chosen.feasible = true;
  chosen.source = best.source();
  chosen.schedule = best.schedule();
  chosen.sim = best_sim;
  chosen.hints = hints_from_schedule(chosen.graph, chosen.schedule, sites, chosen.source);
}

// Planner offload's options: the cheapest plan so far to improve, and the host memory; the
// constants stay where the runtime keeps them.
//
// Note [Where offload starts]
// Planner offload replaces a start plan's recomputations by copies, and fits a plan over
// its budget by copies. The cheapest candidate may be the schedule the runtime realized,
// which competes unchecked and may be over the planner's budget: offload then fits it,
// which can beat every plan within the budget by far (a near-free link, where the realized
// step already sent its victims to the host), or fall back to a plan of 1.5 times the
// budget and lose to replacing the recomputations of the cheapest plan within it. So where
// the two differ offload runs from both, and the cheaper result competes.
PlanOptions offload_options(PlanOptions opt, const StepPlanOptions& options,
                            const CheapestPlan& best) {
  opt.host_memory_bytes = options.host_memory_bytes;
  opt.host_link = options.host_link;
  opt.offload_inputs = false;
  if (!best.empty()) opt.start = best.schedule();
  return opt;
}

// The candidates plan_step() weighs, and the cheapest of them.
struct Weighing {
  ChosenPlan* chosen;
  std::int64_t budget;
  CheapestPlan best = {};    // by SimResult::cost, named as the hints will be
  CheapestPlan within = {};  // the same among those within `budget`
  SimResult best_sim = {};
  bool best_fits = false;  // whether `best` is within `budget` (the realized one need not be)

  void weigh(std::string source, const absl::StatusOr<Plan>& plan, std::string_view hints_source) {
    StepCandidate candidate;
    candidate.source = std::move(source);
    if (!plan.ok()) {
      candidate.reason = std::string(plan.status().message());
    } else {
      candidate.feasible = plan->feasible;
      candidate.solve_seconds = plan->solve_seconds;
      if (plan->feasible) {
        candidate.cost = plan->sim.cost;
        const bool fits = plan->sim.peak_bytes <= budget;
        // Of equal costs, one within the budget wins over the realized schedule beyond it,
        // which the runtime follows with evictions of its own.
        if (fits && !best_fits && plan->sim.cost <= best.cost()) best = CheapestPlan{};
        if (best.offer(plan->sim.cost, plan->schedule, hints_source)) {
          best_sim = plan->sim;
          best_fits = fits;
        }
        if (fits) within.offer(plan->sim.cost, plan->schedule, hints_source);
      } else {
        candidate.reason = plan->reason;
      }
    }
    chosen->candidates.push_back(std::move(candidate));
  }
};

StepCandidate greedy_skipped(const Graph& g) {
  StepCandidate candidate;
  candidate.source = "greedy";
  candidate.reason =
      absl::StrCat("skipped: ", g.nodes.size(), " nodes (greedy simulates once per candidate)");
  return candidate;
}

}  // namespace

absl::StatusOr<ChosenPlan> plan_step(const Graph& graph, const std::vector<int>& executed,
                                     const StepPlanOptions& options) {
  if (options.budget_bytes < 0)
    return absl::InvalidArgumentError(
        absl::StrCat("plan_step: budget_bytes must be set (got ", options.budget_bytes, ")"));
  ChosenPlan chosen;
  chosen.graph = hold_inputs(graph);
  const Graph& g = chosen.graph;
  const std::vector<StepSite> sites = recorded_sites(g);
  Weighing w{.chosen = &chosen, .budget = options.budget_bytes};
  auto weigh = [&w](std::string source, const absl::StatusOr<Plan>& plan,
                    std::string_view hints_source) {
    w.weigh(std::move(source), plan, hints_source);
  };
  CheapestPlan& best = w.best;

  // What the runtime itself did on the step is a plan too (Note [Seeding hinted] in
  // tools/compare/compare.cc): it ran, and a planner must beat it to be followed.
  if (options.include_realized) {
    weigh(std::string(kRealizedSource),
          realized_plan(g, sites, executed, options.realized_budget_bytes), kRealizedSource);
  }
  PlanOptions opt;
  opt.budget_bytes = options.budget_bytes;
  opt.time_limit_seconds = options.time_limit_seconds;
  for (const std::string& algo : options.planners) {
    if (algo == "greedy" && g.nodes.size() > options.greedy_max_nodes) {
      chosen.candidates.push_back(greedy_skipped(g));
      continue;
    }
    weigh(algo, plan_holding_inputs(algo, g, opt),
          absl::StrCat(algo, " @ ", options.budget_bytes, " B"));
  }
  if (options.host_memory_bytes > 0) {
    const CheapestPlan recompute_only = best;
    const CheapestPlan within = w.within;
    // Note [Where offload starts]
    weigh("offload", run_planner("offload", g, offload_options(opt, options, best)),
          absl::StrCat("offload @ ", options.budget_bytes, " B"));
    if (!recompute_only.empty() && recompute_only.source() != within.source()) {
      weigh("offload within", run_planner("offload", g, offload_options(opt, options, within)),
            absl::StrCat("offload @ ", options.budget_bytes, " B"));
    }
    if (!recompute_only.empty() && best.source() != recompute_only.source()) {
      chosen.recompute_only_source = recompute_only.source();
      chosen.recompute_only_hints =
          hints_from_schedule(g, recompute_only.schedule(), sites, recompute_only.source());
    }
  }

  choose(chosen, best, w.best_sim, sites, options.budget_bytes);
  return chosen;
}

}  // namespace remat
