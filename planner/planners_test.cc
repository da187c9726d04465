#include <cmath>
#include <map>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "internal.h"
#include "remat/planner.h"
#include "remat/schedule.h"
#include "tests/support/test_graphs.h"

namespace remat {
namespace {

using ::testing::HasSubstr;

Plan must_plan(const std::string& algo, const Graph& g, std::optional<int64_t> budget,
               double time_limit = 20) {
  PlanOptions o;
  o.budget_bytes = budget;
  o.time_limit_seconds = time_limit;
  auto p = run_planner(algo, g, o);
  EXPECT_TRUE(p.ok()) << p.status();
  return p.ok() ? *p : Plan{};
}

// Checkmate's gen_linear_graph: the minimum cost by budget, from the issue.
const std::map<int, std::vector<std::pair<int64_t, double>>> kLinearOptima = {
    {4, {{3, 15}, {4, 11}, {5, 10}, {6, 9}}},
    {6, {{3, 28}, {4, 18}, {5, 16}, {6, 15}, {7, 14}, {8, 13}}},
};

TEST(Exhaustive, LinearGraphOptimaMatchTheIssue) {
  for (const auto& [n, rows] : kLinearOptima) {
    Graph g = testing::linear_graph(n);
    for (auto [budget, cost] : rows) {
      auto r = detail::exhaustive_optimum(g, budget);
      ASSERT_TRUE(r.has_value()) << "n=" << n << " B=" << budget;
      EXPECT_DOUBLE_EQ(r->cost, cost) << "n=" << n << " B=" << budget;
      SimResult s = simulate(g, Schedule{g.name, r->order}, budget);
      EXPECT_TRUE(s.valid) << s.error;
      EXPECT_DOUBLE_EQ(s.cost, cost);
    }
    // One byte less than the smallest budget of the table cannot be met at all.
    EXPECT_FALSE(detail::exhaustive_optimum(g, 2).has_value());
  }
}

TEST(Checkmate, HitsLinearGraphOptima) {
  for (const auto& [n, rows] : kLinearOptima) {
    Graph g = testing::linear_graph(n);
    for (auto [budget, cost] : rows) {
      Plan p = must_plan("checkmate", g, budget);
      ASSERT_TRUE(p.feasible) << "n=" << n << " B=" << budget << ": " << p.reason;
      EXPECT_DOUBLE_EQ(p.sim.cost, cost) << "n=" << n << " B=" << budget;
      EXPECT_LE(p.sim.peak_bytes, budget);
      EXPECT_TRUE(p.optimal);
    }
  }
}

TEST(Planners, BudgetBelowAnyScheduleIsInfeasibleWithReason) {
  Graph g = testing::linear_graph(4);
  for (const std::string& algo : planner_names()) {
    Plan p = must_plan(algo, g, 2);
    EXPECT_FALSE(p.feasible) << algo;
    EXPECT_THAT(p.reason, HasSubstr("below what any schedule needs")) << algo;
  }
}

TEST(Planners, UnknownNameIsAnError) {
  Graph g = testing::linear_graph(2);
  auto p = run_planner("nosuch", g, PlanOptions{});
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(p.status().message(), HasSubstr("nosuch"));
}

// On small random graphs no planner beats the exhaustive optimum and every schedule it
// reports as feasible is valid within the budget.
TEST(Planners, NoPlannerBeatsExhaustiveOptimumOnSmallRandomGraphs) {
  int checked = 0;
  for (uint64_t seed = 1; seed <= 12; ++seed) {
    Graph g =
        seed % 2 ? testing::random_dag(8, 0.3, 4, seed) : testing::random_training_graph(4, seed);
    int64_t full = file_order_peak(g);
    int64_t lb = detail::minimum_peak_lower_bound(g, nullptr);
    for (int64_t budget : {lb, (lb + full) / 2, full}) {
      auto opt = detail::exhaustive_optimum(g, budget);
      for (const std::string& algo : planner_names()) {
        // The exhaustive search keeps or recomputes; offload has host memory besides
        // (offload_test.cc checks it against the recompute-only plan of its own search).
        if (algo == "offload") continue;
        Plan p = must_plan(algo, g, budget, algo == "best" ? 0.2 : 2);
        if (!p.feasible) continue;
        SimResult again = simulate(g, p.schedule, budget);
        ASSERT_TRUE(again.valid) << algo << " seed " << seed << ": " << again.error;
        ASSERT_TRUE(opt.has_value())
            << algo << " found a schedule where exhaustive search found none";
        EXPECT_GE(p.sim.cost, opt->cost - 1e-9) << algo << " seed " << seed << " budget " << budget;
        if (algo == "checkmate" && p.optimal) {
          // Checkmate is exact for its model: first computations in id order.
          auto fixed = detail::exhaustive_optimum(g, budget, 5'000'000, /*first_in_id_order=*/true);
          ASSERT_TRUE(fixed.has_value());
          EXPECT_NEAR(p.sim.cost, fixed->cost, 1e-9) << "seed " << seed << " budget " << budget;
        }
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 100);
}

}  // namespace
}  // namespace remat

namespace remat {
namespace {

// Revolve's homogeneous model: advancing a stage costs 1, reversing one (its recording
// forward fused with its backward) costs 1, each checkpoint takes one of m slots besides
// the chain input; tapes cannot be held across other stages.
double revolve_chain_optimum(int l, int m) {
  detail::RotorChain c;
  for (int i = 0; i <= l; ++i) {
    c.fwd_cost.push_back(1);
    c.fwd_all_cost.push_back(0);
    c.bwd_cost.push_back(1);
    c.tape_bytes.push_back(1000);
    c.leaf_bytes.push_back(0);
  }
  c.act_bytes.assign(l + 2, 1);
  auto r = detail::rotor_solve(c, m, 0);
  return r ? r->first : -1;
}

// Revolve's closed form: opt(l, m) = (l + 1) + numforw(l + 1, m).
double closed_form(int l, int m) {
  auto binom = [](int a, int b) {
    double r = 1;
    for (int i = 1; i <= b; ++i) r = r * (a - b + i) / i;
    return r;
  };
  int L = l + 1, r = 0;
  while (binom(m + r, m) < L) ++r;
  return L + r * L - binom(m + r, m + 1);
}

TEST(Rotor, HomogeneousChainMatchesRevolve) {
  EXPECT_DOUBLE_EQ(revolve_chain_optimum(9, 2), 30);
  EXPECT_DOUBLE_EQ(revolve_chain_optimum(10, 3), 29);
  EXPECT_DOUBLE_EQ(revolve_chain_optimum(20, 3), 70);
  EXPECT_DOUBLE_EQ(revolve_chain_optimum(30, 4), 103);
  for (int l = 1; l <= 25; l += 3) {
    for (int m = 1; m <= 5; ++m) {
      EXPECT_DOUBLE_EQ(revolve_chain_optimum(l, m), closed_form(l, m)) << l << "," << m;
    }
  }
}

TEST(Rotor, HeldTapesNeverCostMore) {
  // Letting stages keep their tape can only help.
  detail::RotorChain c;
  for (int i = 0; i < 8; ++i) {
    c.fwd_cost.push_back(1 + i % 3);
    c.fwd_all_cost.push_back(1 + i % 3);
    c.bwd_cost.push_back(2);
    c.tape_bytes.push_back(2);
    c.leaf_bytes.push_back(2);
  }
  c.act_bytes.assign(9, 1);
  auto with = detail::rotor_solve(c, 6, 0);
  auto strict = c;
  strict.tape_bytes.assign(8, 1000);
  auto without = detail::rotor_solve(strict, 6, 0);
  ASSERT_TRUE(with && without);
  EXPECT_LE(with->first, without->first);
  EXPECT_FALSE(detail::rotor_solve(c, 1, 0).has_value());  // a leaf needs 2
}

TEST(Rotor, BudgetedPlansOnTrainingGraphsAreValid) {
  for (uint64_t seed = 1; seed <= 5; ++seed) {
    Graph g = testing::random_training_graph(20, seed);
    int64_t full = file_order_peak(g);
    for (double f : {1.0, 0.7, 0.5}) {
      PlanOptions o;
      o.budget_bytes = static_cast<int64_t>(f * full);
      auto p = run_planner("rotor", g, o);
      ASSERT_TRUE(p.ok());
      if (f == 1.0) {
        EXPECT_TRUE(p->feasible) << p->reason;
      }
      if (p->feasible) {
        EXPECT_TRUE(simulate(g, p->schedule, o.budget_bytes).valid);
        EXPECT_LE(p->sim.peak_bytes, *o.budget_bytes);
      }
    }
  }
}

}  // namespace
}  // namespace remat

namespace remat {
namespace {

TEST(Mincut, SavesNoMoreThanPyTorchAndNeverRecomputesBannedNodes) {
  std::string dir = testing::shared_graphs_dir();
  if (dir.empty()) GTEST_SKIP() << "../shared/graphs is absent";
  for (const char* name :
       {"mlp16", "resnet18", "vgg11", "mobilenet_v2", "gpt_small", "transformer_enc"}) {
    auto g = read_graph_file(dir + "/" + name + ".json");
    ASSERT_TRUE(g.ok()) << g.status();
    ASSERT_TRUE(g->peer.pytorch_mincut_saved_bytes.has_value()) << name;
    auto p = run_planner("mincut", *g, PlanOptions{});
    ASSERT_TRUE(p.ok());
    ASSERT_TRUE(p->feasible) << name << ": " << p->reason;
    EXPECT_LE(p->sim.saved_bytes, *g->peer.pytorch_mincut_saved_bytes) << name;
    EXPECT_GT(p->sim.saved_bytes, 0) << name;
    std::vector<int> count(g->size(), 0);
    for (int v : p->schedule.order) ++count[v];
    for (const Node& n : g->nodes) {
      if (n.pytorch_banned) {
        EXPECT_EQ(count[n.id], 1) << name << ": banned node " << n.id << " recomputed";
      }
    }
  }
}

TEST(Mincut, BudgetedVariantFitsTighterBudgets) {
  Graph g = testing::random_training_graph(30, 7);
  int64_t full = file_order_peak(g);
  PlanOptions o;
  o.budget_bytes = full * 6 / 10;
  auto p = run_planner("mincut", g, o);
  ASSERT_TRUE(p.ok());
  if (p->feasible) {
    EXPECT_LE(p->sim.peak_bytes, *o.budget_bytes);
  }
  EXPECT_TRUE(p->feasible || !p->reason.empty());
}

TEST(Greedy, MeetsBudgetsOnRandomGraphsWithValidSchedules) {
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    Graph g = testing::random_dag(60, 0.05, 50, seed);
    int64_t full = file_order_peak(g);
    int64_t lb = detail::minimum_peak_lower_bound(g, nullptr);
    int64_t budget = std::max(lb, full * 8 / 10);
    PlanOptions o;
    o.budget_bytes = budget;
    auto p = run_planner("greedy", g, o);
    ASSERT_TRUE(p.ok());
    EXPECT_TRUE(p->feasible) << "seed " << seed << ": " << p->reason;
    EXPECT_LE(p->sim.peak_bytes, budget);
    EXPECT_GE(p->sim.cost, g.total_cost());
  }
}

TEST(Simulator, NoRematPeaksMatchFormatTable) {
  std::string dir = testing::shared_graphs_dir();
  if (dir.empty()) GTEST_SKIP() << "../shared/graphs is absent";
  const std::map<std::string, std::pair<int, int64_t>> table = {
      {"rlg_n100", {100, 46319}},      {"rlg_n250", {250, 146840}},
      {"cm_vgg16", {45, 15825108992}}, {"cm_mobilenet", {185, 34701056000}},
      {"mlp16", {288, 75501568}},      {"resnet18", {439, 112386560}},
      {"vgg11", {176, 1070458784}},    {"mobilenet_v2", {929, 223733792}},
      {"gpt_small", {717, 129092608}}, {"transformer_enc", {993, 199604224}},
  };
  for (const auto& [name, expect] : table) {
    auto g = read_graph_file(dir + "/" + name + ".json");
    ASSERT_TRUE(g.ok()) << g.status();
    EXPECT_EQ(g->size(), expect.first) << name;
    auto plan = run_planner("noremat", *g, PlanOptions{});
    ASSERT_TRUE(plan.ok());
    EXPECT_TRUE(plan->feasible) << name << ": " << plan->reason;
    EXPECT_EQ(plan->sim.peak_bytes, expect.second) << name;
    EXPECT_EQ(plan->sim.recomputations, 0);
    EXPECT_NEAR(plan->sim.overhead, 0.0, 1e-12);
  }
}

}  // namespace
}  // namespace remat
