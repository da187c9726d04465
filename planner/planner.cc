// Planner registry: runs a planner, simulates its schedule, reports feasibility.
#include <absl/strings/str_cat.h>
#include <absl/strings/str_join.h>

#include <chrono>

#include "internal.h"
#include "remat/planner.h"

namespace remat {
namespace {

using PlanFn = absl::StatusOr<detail::RawPlan> (*)(const Graph&, const PlanOptions&);

struct Entry {
  const char* name;
  PlanFn fn;
};

absl::StatusOr<detail::RawPlan> plan_best(const Graph& g, const PlanOptions& opt);

const Entry kPlanners[] = {
    {"noremat", detail::plan_no_remat},  {"chen", detail::plan_chen},
    {"greedy", detail::plan_greedy},     {"mincut", detail::plan_mincut},
    {"rotor", detail::plan_rotor},       {"checkmate", detail::plan_checkmate},
    {"twremat", detail::plan_tw_remat},  {"moccasin", detail::plan_moccasin},
    {"rockmate", detail::plan_rockmate}, {"best", plan_best},
    {"offload", detail::plan_offload},
};

// Runs the other planners within the time limit and keeps the cheapest plan that fits.
class BestSearch {
 public:
  BestSearch(const Graph& g, const PlanOptions& opt) : g_(g), opt_(opt), deadline_(opt) {}

  detail::RawPlan run() {
    run_planners();
    // Randomised repair needs a budget to matter.
    if (opt_.budget_bytes && !unbeatable()) randomised_repair();
    if (!have_) best_.note = absl::StrCat("no planner met the budget (tried ", tried_, ")");
    return best_;
  }

 private:
  // A plan without recomputation cannot be beaten.
  bool unbeatable() const { return have_ && best_sim_.recomputations == 0; }

  void consider(const std::string& name, const std::vector<int>& raw_order, bool optimal) {
    // Unread instances only cost time and memory.
    std::vector<int> order = detail::prune_unread_instances(g_, raw_order);
    Schedule s{g_.name, order, std::nullopt};
    SimResult r = simulate(g_, s, opt_.budget_bytes);
    if (!r.valid) return;  // over the budget, when there is one
    // Lowest cost, then lowest peak.
    bool better = !have_ || r.cost < best_sim_.cost - 1e-12 ||
                  (r.cost <= best_sim_.cost + 1e-12 && r.peak_bytes < best_sim_.peak_bytes);
    if (better) {
      best_.order = order;
      best_.optimal = optimal;
      best_.note = absl::StrCat("from ", name);
      best_sim_ = r;
      have_ = true;
    }
  }

  // The options planner `name` runs with; false when it is skipped. Each gets an equal
  // share of the time left among those still to run (what one leaves passes on), so that a
  // slow member on a large graph cannot starve the others.
  bool options_for(const std::string& name, int still_to_run, PlanOptions* o) const {
    *o = opt_;
    o->deadline = deadline_.end();
    o->time_limit_seconds = std::max(0.0, deadline_.left()) / std::max(1, still_to_run);
    if (name == "checkmate") {
      // The MILP only for graphs it can handle in the time left; leave room for the
      // randomised repair below.
      if (g_.size() > 120) return false;
      o->time_limit_seconds = std::max(0.5, deadline_.left() * 0.4);
    }
    if (name == "rockmate") {
      // Its block MILPs use what they are given; leave most of the time to the others.
      o->time_limit_seconds = std::max(0.5, deadline_.left() * 0.3);
    }
    if (name == "moccasin") {
      // The CP model has O(n^2) slots: graphs up to a few hundred nodes, with a share of
      // the time left for the randomised repair below.
      if (g_.size() > 400 || !opt_.budget_bytes) return false;
      o->time_limit_seconds = std::max(0.5, deadline_.left() * 0.25);
    }
    return true;
  }

  // Cheap planners first (those linear in the graph's size before the others), then the
  // solvers with what is left.
  void run_planners() {
    const char* order[] = {"noremat", "chen",     "twremat",   "rotor",   "greedy",
                           "mincut",  "rockmate", "checkmate", "moccasin"};
    const int count = static_cast<int>(std::size(order));
    for (int i = 0; i < count; ++i) {
      const char* name = order[i];
      if (deadline_.expired()) break;
      if (unbeatable()) break;
      PlanOptions o;
      // The randomised repair afterwards counts as one more.
      if (!options_for(name, count - i + 1, &o)) continue;
      for (const Entry& e : kPlanners) {
        if (name != std::string(e.name)) continue;
        auto raw = e.fn(g_, o);
        absl::StrAppend(&tried_, tried_.empty() ? "" : ", ", name);
        if (raw.ok() && !raw->order.empty()) consider(name, raw->order, raw->optimal);
      }
    }
  }

  // Iterated local search: the best plan with one or two of its recomputations dropped at
  // random, for the repair to fix again.
  std::vector<int> perturb_best(uint64_t seed) const {
    std::vector<int> seen(g_.size(), 0), recomp;
    for (size_t j = 0; j < best_.order.size(); ++j)
      if (seen[best_.order[j]]++) recomp.push_back(static_cast<int>(j));
    std::vector<char> drop(best_.order.size(), 0);
    int k = 1 + static_cast<int>(seed % 2);
    for (int d = 0; d < k; ++d) drop[recomp[(seed * 7919 + d * 104729) % recomp.size()]] = 1;
    std::vector<int> start;
    for (size_t j = 0; j < best_.order.size(); ++j)
      if (!drop[j]) start.push_back(best_.order[j]);
    return start;
  }

  // Randomised XLA-style repair from file order and from the best plan so far, for the
  // rest of the time.
  void randomised_repair() {
    std::vector<int> file(g_.size());
    for (int v = 0; v < g_.size(); ++v) file[v] = v;
    uint64_t seed = opt_.seed;
    int rounds = 0;
    while (!deadline_.expired()) {
      detail::GreedyParams gp;
      gp.seed = ++seed;
      gp.noise = 0.3 + 0.25 * static_cast<double>(rounds % 8);
      gp.cost_exp = (rounds % 3 == 0) ? 1.0 : (rounds % 3 == 1 ? 0.8 : 1.2);
      const bool perturb = have_ && rounds % 2 == 1 && best_sim_.recomputations > 0;
      std::vector<int> start = perturb ? perturb_best(seed) : file;
      auto o = detail::repair_order(g_, start, *opt_.budget_bytes, gp, &deadline_);
      consider("greedy (randomised)", o, false);
      ++rounds;
      if (g_.size() > 5000 && rounds > 3) break;
    }
    absl::StrAppend(&tried_, ", randomised greedy x", rounds);
  }

  const Graph& g_;
  const PlanOptions& opt_;
  detail::Deadline deadline_;
  detail::RawPlan best_;
  SimResult best_sim_;
  bool have_ = false;
  std::string tried_;  // the planners run, for the report when none fits
};

absl::StatusOr<detail::RawPlan> plan_best(const Graph& g, const PlanOptions& opt) {
  return BestSearch(g, opt).run();
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
    int64_t lb = detail::minimum_peak_lower_bound(g, &witness);
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
  PlanOptions timed = opt;
  timed.deadline = detail::Deadline(opt).end();  // what every nested planner stops by
  auto raw = entry->fn(g, timed);
  plan.solve_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!raw.ok()) return raw.status();
  plan.schedule.order = std::move(raw->order);
  plan.schedule.backward_start = raw->backward_start;
  plan.optimal = raw->optimal;
  plan.details = std::move(raw->details);
  if (plan.schedule.order.empty()) {
    plan.feasible = false;
    plan.reason = raw->note.empty() ? "the planner found no schedule" : raw->note;
    plan.sim.base_cost = g.total_cost();
    return plan;
  }
  plan.schedule.offloads = std::move(raw->offloads);
  plan.sim = simulate(g, plan.schedule, opt.budget_bytes, opt.host_link);
  if (plan.sim.valid && plan.sim.host_peak_bytes > opt.host_memory_bytes) {
    plan.sim.valid = false;
    plan.sim.error =
        absl::StrCat("it holds ", plan.sim.host_peak_bytes,
                     " bytes in host memory, over the limit of ", opt.host_memory_bytes);
  }
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
