#include <cmath>
#include <map>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "internal.h"
#include "remat/planner.h"
#include "remat/schedule.h"
#include "test_util.h"

namespace remat {
namespace {

using ::testing::HasSubstr;

Plan MustPlan(const std::string& algo, const Graph& g, std::optional<int64_t> budget, double time_limit = 20) {
  PlanOptions o;
  o.budget_bytes = budget;
  o.time_limit_seconds = time_limit;
  auto p = RunPlanner(algo, g, o);
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
    Graph g = testing::LinearGraph(n);
    for (auto [budget, cost] : rows) {
      auto r = internal::ExhaustiveOptimum(g, budget);
      ASSERT_TRUE(r.has_value()) << "n=" << n << " B=" << budget;
      EXPECT_DOUBLE_EQ(r->cost, cost) << "n=" << n << " B=" << budget;
      SimResult s = Simulate(g, Schedule{g.name, r->order}, budget);
      EXPECT_TRUE(s.valid) << s.error;
      EXPECT_DOUBLE_EQ(s.cost, cost);
    }
    // One byte less than the smallest budget of the table cannot be met at all.
    EXPECT_FALSE(internal::ExhaustiveOptimum(g, 2).has_value());
  }
}

TEST(Checkmate, HitsLinearGraphOptima) {
  for (const auto& [n, rows] : kLinearOptima) {
    Graph g = testing::LinearGraph(n);
    for (auto [budget, cost] : rows) {
      Plan p = MustPlan("checkmate", g, budget);
      ASSERT_TRUE(p.feasible) << "n=" << n << " B=" << budget << ": " << p.reason;
      EXPECT_DOUBLE_EQ(p.sim.cost, cost) << "n=" << n << " B=" << budget;
      EXPECT_LE(p.sim.peak_bytes, budget);
      EXPECT_TRUE(p.optimal);
    }
  }
}

TEST(Planners, BudgetBelowAnyScheduleIsInfeasibleWithReason) {
  Graph g = testing::LinearGraph(4);
  for (const std::string& algo : PlannerNames()) {
    Plan p = MustPlan(algo, g, 2);
    EXPECT_FALSE(p.feasible) << algo;
    EXPECT_THAT(p.reason, HasSubstr("below what any schedule needs")) << algo;
  }
}

TEST(Planners, UnknownNameIsAnError) {
  Graph g = testing::LinearGraph(2);
  auto p = RunPlanner("nosuch", g, PlanOptions{});
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(p.status().message(), HasSubstr("nosuch"));
}

// On small random graphs no planner beats the exhaustive optimum and every schedule it
// reports as feasible is valid within the budget.
TEST(Planners, NoPlannerBeatsExhaustiveOptimumOnSmallRandomGraphs) {
  int checked = 0;
  for (uint64_t seed = 1; seed <= 12; ++seed) {
    Graph g = seed % 2 ? testing::RandomDag(8, 0.3, 4, seed) : testing::RandomTrainingGraph(4, seed);
    int64_t full = testing::NoRematPeak(g);
    int64_t lb = internal::MinimumPeakLowerBound(g, nullptr);
    for (int64_t budget : {lb, (lb + full) / 2, full}) {
      auto opt = internal::ExhaustiveOptimum(g, budget);
      for (const std::string& algo : PlannerNames()) {
        Plan p = MustPlan(algo, g, budget, 5);
        if (!p.feasible) continue;
        SimResult again = Simulate(g, p.schedule, budget);
        ASSERT_TRUE(again.valid) << algo << " seed " << seed << ": " << again.error;
        ASSERT_TRUE(opt.has_value()) << algo << " found a schedule where exhaustive search found none";
        EXPECT_GE(p.sim.cost, opt->cost - 1e-9) << algo << " seed " << seed << " budget " << budget;
        if (algo == "checkmate" && p.optimal) {
          // Checkmate is exact for its model: first computations in id order.
          auto fixed = internal::ExhaustiveOptimum(g, budget, 5'000'000, /*first_in_id_order=*/true);
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
