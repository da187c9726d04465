// Planner registry: runs a planner, simulates its schedule, reports feasibility.
#include <chrono>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "internal.h"
#include "remat/planner.h"

namespace remat {
namespace {

using PlanFn = absl::StatusOr<internal::RawPlan> (*)(const Graph&, const PlanOptions&);

struct Entry {
  const char* name;
  PlanFn fn;
};

absl::StatusOr<internal::RawPlan> PlanBest(const Graph& g, const PlanOptions& opt);

const Entry kPlanners[] = {
    {"noremat", internal::PlanNoRemat},
    {"chen", internal::PlanChen},
    {"greedy", internal::PlanGreedy},
    {"mincut", internal::PlanMincut},
    {"rotor", internal::PlanRotor},
    {"checkmate", internal::PlanCheckmate},
    {"twremat", internal::PlanTwRemat},
    {"moccasin", internal::PlanMoccasin},
    {"best", PlanBest},
};

// Runs the other planners within the time limit and keeps the cheapest plan that fits.
absl::StatusOr<internal::RawPlan> PlanBest(const Graph& g, const PlanOptions& opt) {
  internal::Deadline deadline(opt.time_limit_seconds);
  internal::RawPlan best;
  SimResult best_sim;
  bool have = false;
  std::string tried;
  auto consider = [&](const std::string& name, const std::vector<int>& raw_order, bool optimal) {
    // Unread instances only cost time and memory.
    std::vector<int> order = internal::PruneUnreadInstances(g, raw_order);
    Schedule s{g.name, order, std::nullopt};
    SimResult r = simulate(g, s, opt.budget_bytes);
    if (!r.valid) return;
    bool better = !have || r.cost < best_sim.cost - 1e-12 ||
                  (r.cost <= best_sim.cost + 1e-12 && r.peak_bytes < best_sim.peak_bytes);
    if (!opt.budget_bytes && have) {
      // Without a budget: lowest cost, then lowest peak.
      better = r.cost < best_sim.cost - 1e-12 ||
               (r.cost <= best_sim.cost + 1e-12 && r.peak_bytes < best_sim.peak_bytes);
    }
    if (better) {
      best.order = order;
      best.optimal = optimal;
      best.note = absl::StrCat("from ", name);
      best_sim = r;
      have = true;
    }
  };
  // Cheap planners first, then the solvers with what is left.
  const char* order[] = {"noremat", "greedy",  "chen",      "mincut",
                         "rotor",   "twremat", "checkmate", "moccasin"};
  for (const char* name : order) {
    if (deadline.Expired()) break;
    if (have && best_sim.recomputations == 0) break;  // cannot be beaten
    PlanOptions o = opt;
    o.time_limit_seconds = std::max(0.5, deadline.Left());
    if (std::string(name) == "checkmate") {
      // The MILP only for graphs it can handle in the time left; leave room for the
      // randomised repair below.
      if (g.size() > 120) continue;
      o.time_limit_seconds = std::max(0.5, deadline.Left() * 0.4);
    }
    if (std::string(name) == "moccasin") {
      // The CP model has O(n^2) slots: graphs up to a few hundred nodes, with a share of
      // the time left for the randomised repair below.
      if (g.size() > 400 || !opt.budget_bytes) continue;
      o.time_limit_seconds = std::max(0.5, deadline.Left() * 0.25);
    }
    for (const Entry& e : kPlanners) {
      if (name != std::string(e.name)) continue;
      auto raw = e.fn(g, o);
      absl::StrAppend(&tried, tried.empty() ? "" : ", ", name);
      if (raw.ok() && !raw->order.empty()) consider(name, raw->order, raw->optimal);
    }
  }
  // Randomised XLA-style repair from file order and from the best plan so far, for the
  // rest of the time (a budget is needed for it to matter).
  if (opt.budget_bytes && !(have && best_sim.recomputations == 0)) {
    std::vector<int> file(g.size());
    for (int v = 0; v < g.size(); ++v) file[v] = v;
    uint64_t seed = opt.seed;
    int rounds = 0;
    while (!deadline.Expired()) {
      internal::GreedyParams gp;
      gp.seed = ++seed;
      gp.noise = 0.3 + 0.25 * static_cast<double>(rounds % 8);
      gp.cost_exp = (rounds % 3 == 0) ? 1.0 : (rounds % 3 == 1 ? 0.8 : 1.2);
      std::vector<int> start = file;
      if (have && rounds % 2 == 1 && best_sim.recomputations > 0) {
        // Iterated local search: drop one or two recomputations of the best plan at random
        // and repair again.
        std::vector<int> seen(g.size(), 0), recomp;
        for (size_t j = 0; j < best.order.size(); ++j)
          if (seen[best.order[j]]++) recomp.push_back(static_cast<int>(j));
        std::vector<char> drop(best.order.size(), 0);
        int k = 1 + static_cast<int>(seed % 2);
        for (int d = 0; d < k; ++d) drop[recomp[(seed * 7919 + d * 104729) % recomp.size()]] = 1;
        start.clear();
        for (size_t j = 0; j < best.order.size(); ++j)
          if (!drop[j]) start.push_back(best.order[j]);
      }
      auto o = internal::RepairOrder(g, start, *opt.budget_bytes, gp, &deadline);
      consider("greedy (randomised)", o, false);
      ++rounds;
      if (g.size() > 5000 && rounds > 3) break;
    }
    absl::StrAppend(&tried, ", randomised greedy x", rounds);
  }
  if (!have) best.note = absl::StrCat("no planner met the budget (tried ", tried, ")");
  return best;
}

}  // namespace

std::vector<std::string> planner_names() {
  std::vector<std::string> names;
  for (const Entry& e : kPlanners) names.push_back(e.name);
  return names;
}

absl::StatusOr<Plan> run_planner(std::string_view algo, const Graph& g, const PlanOptions& opt) {
  const Entry* entry = nullptr;
  for (const Entry& e : kPlanners)
    if (algo == e.name) entry = &e;
  if (!entry) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown planner '", std::string(algo),
                     "'; known: ", absl::StrJoin(planner_names(), ", ")));
  }
  absl::Status valid = validate_graph(g);
  if (!valid.ok()) return valid;
  Plan plan;
  plan.algo = std::string(algo);
  plan.budget_bytes = opt.budget_bytes;
  plan.schedule.graph = g.name;
  if (opt.budget_bytes) {
    int witness = -1;
    int64_t lb = internal::MinimumPeakLowerBound(g, &witness);
    if (*opt.budget_bytes < lb) {
      plan.feasible = false;
      plan.reason = absl::StrCat(
          "budget ", *opt.budget_bytes, " bytes is below what any schedule needs: node ", witness,
          " ('", g.nodes[witness].name, "') needs ", lb, " bytes for itself and its inputs");
      plan.sim.base_cost = g.total_cost();
      return plan;
    }
  }
  auto t0 = std::chrono::steady_clock::now();
  auto raw = entry->fn(g, opt);
  plan.solve_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!raw.ok()) return raw.status();
  plan.schedule.order = std::move(raw->order);
  plan.schedule.backward_start = raw->backward_start;
  plan.optimal = raw->optimal;
  if (plan.schedule.order.empty()) {
    plan.feasible = false;
    plan.reason = raw->note.empty() ? "the planner found no schedule" : raw->note;
    plan.sim.base_cost = g.total_cost();
    return plan;
  }
  plan.sim = simulate(g, plan.schedule, opt.budget_bytes);
  plan.feasible = plan.sim.valid;
  if (!plan.feasible) {
    plan.reason = absl::StrCat(plan.algo, " did not meet the budget: ", plan.sim.error);
    if (!raw->note.empty()) absl::StrAppend(&plan.reason, " (", raw->note, ")");
  } else {
    plan.reason = raw->note;
  }
  return plan;
}

}  // namespace remat
