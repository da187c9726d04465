// plan_step() and its parts (remat/step_planner.h) on steps the runtime recorded: small
// training-like graphs with parameters, run as DTR logs by the runtime (record_replay), with
// and without a budget.
#include "remat/step_planner.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "remat/dtr_trace.h"
#include "remat/graph_transforms.h"
#include "remat/replay.h"
#include "tests/support/test_graphs.h"

namespace remat {
namespace {

// A training step of `n` forward and `n` backward nodes (random sizes of 1 to 4 KiB and costs
// of 1 to 5) that reads `params` parameters: random_training_graph with input nodes in front.
Graph step_graph(int n, int params, std::uint64_t seed) {
  const Graph body = testing::random_training_graph(n, seed);
  Graph g;
  g.name = "step" + std::to_string(seed);
  for (int i = 0; i < params; ++i) {
    Node p;
    p.id = i;
    p.name = p.op = "param" + std::to_string(i);
    p.kind = NodeKind::kInput;
    p.bytes = 2048;
    g.nodes.push_back(p);
  }
  for (const Node& b : body.nodes) {
    Node node = b;
    node.id += params;
    node.bytes *= 1024;
    for (int& u : node.inputs) u += params;
    // Every forward node reads a parameter, every backward node the same one.
    const int k = node.phase == Phase::kForward ? b.id : 2 * n - 1 - b.id;
    node.inputs.push_back(k % params);
    std::sort(node.inputs.begin(), node.inputs.end());
    g.nodes.push_back(std::move(node));
  }
  g.outputs = {g.size() - 1};
  EXPECT_TRUE(validate_graph(g).ok()) << validate_graph(g);
  return g;
}

// The step as the runtime records it, and what it executed under `budget` logical bytes
// with policy dtr (SIZE_MAX: no budget).
struct Recorded {
  RecordedStep step;
  std::vector<int> executed;
};
Recorded record(const Graph& g, std::size_t budget = SIZE_MAX) {
  const DtrTrace trace = dtr_trace_from_graph(g);
  Recorded r{record_replay(trace), {}};
  ReplayOptions ro;
  ro.policy = "dtr";
  ro.budget = budget;
  ro.record_executed = true;
  ReplayResult rr = replay(trace, ro);
  EXPECT_EQ(rr.status, "ok") << rr.error;
  r.executed = std::move(rr.executed);
  return r;
}

// Positions in the step: one past the largest site.
int positions(const Graph& g) {
  int p = 0;
  for (const Node& node : g.nodes) p = std::max(p, node.site_position + 1);
  return p;
}

std::int64_t held_peak(const Graph& g) { return file_order_peak(hold_inputs(g)); }

TEST(StepPlannerTest, ChoosesTheCheapestFeasiblePlanUnderTheBudget) {
  for (std::uint64_t seed : {1, 2, 3}) {
    SCOPED_TRACE(seed);
    const Recorded r = record(step_graph(20, 3, seed));
    const std::int64_t peak = held_peak(r.step.graph);
    // The parameters are the recorded step's inputs, which plan_step() holds.
    EXPECT_EQ(std::count_if(r.step.graph.nodes.begin(), r.step.graph.nodes.end(),
                            [](const Node& n) { return n.kind == NodeKind::kInput; }),
              3);
    StepPlanOptions opt;
    opt.budget_bytes = peak * 6 / 10;
    opt.planners = {"chen", "twremat", "greedy", "rotor", "mincut"};
    opt.include_realized = false;  // it ran with no budget: only planners' plans fit
    absl::StatusOr<ChosenPlan> chosen = plan_step(r.step.graph, r.executed, opt);
    ASSERT_TRUE(chosen.ok()) << chosen.status();
    ASSERT_TRUE(chosen->feasible) << chosen->reason;

    // Feasible under the budget, as the simulator measures it independently.
    const SimResult sim = simulate(chosen->graph, chosen->schedule, opt.budget_bytes);
    ASSERT_TRUE(sim.valid) << sim.error;
    EXPECT_LE(sim.peak_bytes, opt.budget_bytes);
    EXPECT_EQ(sim.cost, chosen->sim.cost);
    // Inputs held: the schedule ends with hold_inputs.
    EXPECT_EQ(chosen->graph.nodes[static_cast<std::size_t>(chosen->schedule.order.back())].op,
              "hold_inputs");

    // The cheapest of the candidates, every planner weighed once, in order.
    ASSERT_EQ(chosen->candidates.size(), opt.planners.size());
    int feasible = 0;
    for (std::size_t i = 0; i < opt.planners.size(); ++i) {
      const StepCandidate& c = chosen->candidates[i];
      EXPECT_EQ(c.source, opt.planners[i]);
      if (!c.feasible) continue;
      ++feasible;
      EXPECT_LE(chosen->sim.cost, c.cost) << c.source;
    }
    EXPECT_GE(feasible, 1);
    // ... and the same as running the planners directly.
    PlanOptions po;
    po.budget_bytes = opt.budget_bytes;
    po.time_limit_seconds = opt.time_limit_seconds;
    double cheapest = INFINITY;
    std::string cheapest_algo;
    for (const std::string& algo : opt.planners) {
      absl::StatusOr<Plan> p = plan_holding_inputs(algo, chosen->graph, po);
      ASSERT_TRUE(p.ok()) << p.status();
      if (p->feasible && p->sim.cost < cheapest) {
        cheapest = p->sim.cost;
        cheapest_algo = algo;
      }
    }
    EXPECT_EQ(chosen->sim.cost, cheapest);
    EXPECT_EQ(chosen->source, cheapest_algo + " @ " + std::to_string(opt.budget_bytes) + " B");

    // Hints: one OpHint per position of the step, named as the step's ops, from the schedule.
    const StepHints& h = chosen->hints;
    EXPECT_EQ(h.source, chosen->source);
    ASSERT_EQ(static_cast<int>(h.ops.size()), positions(r.step.graph));
    for (const Node& node : r.step.graph.nodes) {
      if (node.site_position < 0) continue;
      EXPECT_EQ(h.ops[static_cast<std::size_t>(node.site_position)].op, node.op);
    }
    EXPECT_FALSE(h.schedule.empty());
    const StepHints again = hints_from_schedule(chosen->graph, chosen->schedule,
                                                recorded_sites(chosen->graph), chosen->source);
    ASSERT_EQ(again.ops.size(), h.ops.size());
    for (std::size_t p = 0; p < h.ops.size(); ++p) {
      EXPECT_EQ(again.ops[p].op, h.ops[p].op);
      EXPECT_EQ(again.ops[p].evict_after, h.ops[p].evict_after);
    }
    ASSERT_EQ(again.schedule.size(), h.schedule.size());
    for (std::size_t i = 0; i < h.schedule.size(); ++i)
      EXPECT_EQ(again.schedule[i].site, h.schedule[i].site);
  }
}

TEST(StepPlannerTest, TheRealizedScheduleCompetesAndWinsTies) {
  // Unconstrained, the step ran every op once: no planner can cost less, so the realized
  // schedule, weighed first, stays the choice.
  const Recorded r = record(step_graph(16, 2, 7));
  StepPlanOptions opt;
  opt.budget_bytes = held_peak(r.step.graph);
  opt.planners = {"chen", "twremat"};
  absl::StatusOr<ChosenPlan> chosen = plan_step(r.step.graph, r.executed, opt);
  ASSERT_TRUE(chosen.ok()) << chosen.status();
  ASSERT_TRUE(chosen->feasible) << chosen->reason;
  ASSERT_EQ(chosen->candidates.size(), 3u);
  EXPECT_EQ(chosen->candidates[0].source, "the schedule the runtime realized");
  EXPECT_TRUE(chosen->candidates[0].feasible);
  EXPECT_EQ(chosen->source, "the schedule the runtime realized");
  EXPECT_EQ(chosen->hints.source, chosen->source);
  EXPECT_EQ(chosen->sim.recomputations, 0);
  EXPECT_DOUBLE_EQ(chosen->sim.overhead, 0.0);
}

TEST(StepPlannerTest, ARealizedScheduleUnderABudgetIsAPlan) {
  // DTR under a budget evicts and recomputes; what it ran is a valid schedule of the held
  // graph and, checked against that budget, a feasible one.
  const Graph g = step_graph(24, 3, 11);
  const Recorded unconstrained = record(g);
  const std::int64_t peak = held_peak(unconstrained.step.graph);
  const auto budget = static_cast<std::size_t>(peak * 7 / 10);
  const Recorded r = record(g, budget);
  // DTR recomputed: more ops ran than the step has.
  EXPECT_GT(static_cast<int>(r.executed.size()), positions(r.step.graph));
  const Graph held = hold_inputs(r.step.graph);
  absl::StatusOr<Plan> realized =
      realized_plan(held, recorded_sites(held), r.executed, static_cast<std::int64_t>(budget));
  ASSERT_TRUE(realized.ok()) << realized.status();
  EXPECT_EQ(realized->algo, "realized");
  EXPECT_TRUE(realized->feasible) << realized->reason;
  EXPECT_LE(realized->sim.peak_bytes, static_cast<std::int64_t>(budget));
  EXPECT_GT(realized->sim.recomputations, 0);
  // Held to a budget below its peak it is not feasible, and says why.
  absl::StatusOr<Plan> tight =
      realized_plan(held, recorded_sites(held), r.executed, realized->sim.peak_bytes - 1);
  ASSERT_TRUE(tight.ok());
  EXPECT_FALSE(tight->feasible);
  EXPECT_FALSE(tight->reason.empty());
  // Positions the graph does not have are an error.
  EXPECT_FALSE(realized_plan(held, recorded_sites(held), {1 << 20}).ok());
}

TEST(StepPlannerTest, AnImpossibleBudgetIsNotFeasibleAndSaysWhy) {
  const Recorded r = record(step_graph(12, 2, 5));
  StepPlanOptions opt;
  opt.budget_bytes = 1;
  opt.realized_budget_bytes = opt.budget_bytes;  // hold the realized schedule to it too
  opt.planners = {"chen", "twremat", "greedy", "rotor", "mincut", "no_such_planner"};
  absl::StatusOr<ChosenPlan> chosen = plan_step(r.step.graph, r.executed, opt);
  ASSERT_TRUE(chosen.ok()) << chosen.status();
  EXPECT_FALSE(chosen->feasible);
  EXPECT_NE(chosen->reason.find("no plan fits 1 B"), std::string::npos) << chosen->reason;
  EXPECT_NE(chosen->reason.find("no_such_planner"), std::string::npos) << chosen->reason;
  EXPECT_TRUE(chosen->hints.ops.empty());
  EXPECT_TRUE(chosen->hints.schedule.empty());
  EXPECT_TRUE(chosen->hints.source.empty());
  EXPECT_TRUE(chosen->schedule.order.empty());
  ASSERT_EQ(chosen->candidates.size(), opt.planners.size() + 1);
  for (const StepCandidate& c : chosen->candidates) {
    EXPECT_FALSE(c.feasible) << c.source;
    EXPECT_FALSE(c.reason.empty()) << c.source;
  }
}

TEST(StepPlannerTest, AnUnknownPlannerIsACandidateThatFailsNotAnError) {
  const Recorded r = record(step_graph(12, 2, 6));
  StepPlanOptions opt;
  opt.budget_bytes = held_peak(r.step.graph) * 8 / 10;
  opt.include_realized = false;
  opt.planners = {"no_such_planner", "chen"};
  absl::StatusOr<ChosenPlan> chosen = plan_step(r.step.graph, r.executed, opt);
  ASSERT_TRUE(chosen.ok()) << chosen.status();
  ASSERT_EQ(chosen->candidates.size(), 2u);
  EXPECT_FALSE(chosen->candidates[0].feasible);
  EXPECT_FALSE(chosen->candidates[0].reason.empty());
  EXPECT_TRUE(chosen->feasible) << chosen->reason;
  EXPECT_EQ(chosen->source.rfind("chen @ ", 0), 0u) << chosen->source;
}

TEST(StepPlannerTest, GreedyIsSkippedOnLargeGraphs) {
  const Recorded r = record(step_graph(12, 2, 8));
  StepPlanOptions opt;
  opt.budget_bytes = held_peak(r.step.graph);
  opt.planners = {"greedy"};
  opt.include_realized = false;
  opt.greedy_max_nodes = 10;
  absl::StatusOr<ChosenPlan> chosen = plan_step(r.step.graph, r.executed, opt);
  ASSERT_TRUE(chosen.ok()) << chosen.status();
  EXPECT_FALSE(chosen->feasible);
  ASSERT_EQ(chosen->candidates.size(), 1u);
  EXPECT_EQ(chosen->candidates[0].reason.rfind("skipped", 0), 0u) << chosen->candidates[0].reason;
  opt.greedy_max_nodes = kGreedyMaxNodes;
  chosen = plan_step(r.step.graph, r.executed, opt);
  ASSERT_TRUE(chosen.ok()) << chosen.status();
  EXPECT_TRUE(chosen->feasible) << chosen->reason;
}

TEST(StepPlannerTest, ABudgetMustBeGiven) {
  const Recorded r = record(step_graph(8, 1, 9));
  absl::StatusOr<ChosenPlan> chosen = plan_step(r.step.graph, r.executed, StepPlanOptions{});
  EXPECT_EQ(chosen.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(StepPlannerTest, PlanHoldingInputsKeepsThemToTheEnd) {
  const Graph held = hold_inputs(step_graph(20, 3, 4));
  PlanOptions po;
  po.budget_bytes = file_order_peak(held) * 7 / 10;
  for (const std::string algo : {"chen", "twremat", "rotor"}) {
    absl::StatusOr<Plan> p = plan_holding_inputs(algo, held, po);
    ASSERT_TRUE(p.ok()) << p.status();
    if (!p->feasible) continue;
    EXPECT_EQ(p->schedule.order.back(), held.size() - 1) << algo;
    const SimResult sim = simulate(held, p->schedule, po.budget_bytes);
    EXPECT_TRUE(sim.valid) << algo << ": " << sim.error;
    EXPECT_EQ(sim.peak_bytes, p->sim.peak_bytes) << algo;
  }
}

TEST(StepPlannerTest, CheapestPlanKeepsTheFirstOfEqualCosts) {
  CheapestPlan best;
  EXPECT_TRUE(best.empty());
  EXPECT_EQ(best.cost(), INFINITY);
  EXPECT_FALSE(best.offer(INFINITY, Schedule{.graph = "g", .order = {0}}, "inf"));
  EXPECT_TRUE(best.offer(2.0, Schedule{.graph = "g", .order = {0, 1}}, "a"));
  EXPECT_FALSE(best.offer(2.0, Schedule{.graph = "g", .order = {1, 0}}, "b"));
  EXPECT_FALSE(best.offer(3.0, Schedule{.graph = "g", .order = {1}}, "c"));
  EXPECT_TRUE(best.offer(1.5, Schedule{.graph = "g", .order = {2}}, "d"));
  EXPECT_FALSE(best.empty());
  EXPECT_EQ(best.cost(), 1.5);
  EXPECT_EQ(best.source(), "d");
  EXPECT_EQ(best.schedule().order, std::vector<int>({2}));
}

}  // namespace
}  // namespace remat
