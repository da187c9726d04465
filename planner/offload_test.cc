// Planner "offload" and its pass: never worse than the plan it starts from, within the
// device budget and the host memory, with copies the simulator accepts.
#include <absl/strings/str_cat.h>

#include <random>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "internal.h"
#include "nlohmann/json.hpp"
#include "remat/planner.h"
#include "remat/schedule.h"
#include "tests/support/test_graphs.h"

namespace remat {
namespace {

constexpr HostLink kFastLink{1000.0, 0.0};

PlanOptions options(int64_t budget, HostLink link, int64_t host = INT64_MAX) {
  PlanOptions o;
  o.budget_bytes = budget;
  o.time_limit_seconds = 1;
  o.host_link = link;
  o.host_memory_bytes = host;
  return o;
}

TEST(OffloadPlanner, AFastLinkReplacesTheRecomputationsOfAChain) {
  // Checkmate's linear graph of 6 at a budget of 4 recomputes 5 steps at best (cost 18
  // against 13); a link that costs next to nothing brings the values back instead.
  const Graph g = testing::linear_graph(6);
  absl::StatusOr<Plan> p = run_planner("offload", g, options(4, kFastLink));
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_TRUE(p->feasible) << p->reason;
  EXPECT_GT(p->sim.offloads, 0);
  EXPECT_LT(p->sim.cost, 18);
  EXPECT_LE(p->sim.peak_bytes, 4);
  // The written schedule simulates to the same figures.
  absl::StatusOr<Schedule> back = parse_schedule(write_schedule(p->schedule));
  ASSERT_TRUE(back.ok()) << back.status();
  const SimResult again = simulate(g, *back, 4, kFastLink);
  EXPECT_TRUE(again.valid) << again.error;
  EXPECT_DOUBLE_EQ(again.cost, p->sim.cost);
  EXPECT_EQ(again.bytes_moved, p->sim.bytes_moved);
}

TEST(OffloadPlanner, WithoutHostMemoryRecomputationStays) {
  const Graph g = testing::linear_graph(6);
  for (int64_t host : {0, 1}) {
    absl::StatusOr<Plan> p = run_planner("offload", g, options(4, kFastLink, host));
    ASSERT_TRUE(p.ok()) << p.status();
    ASSERT_TRUE(p->feasible) << p->reason;
    EXPECT_LE(p->sim.host_peak_bytes, host);
    if (host == 0) {
      EXPECT_EQ(p->sim.offloads, 0);
    }
    EXPECT_GE(p->sim.cost, host == 0 ? 18 : 13);
    EXPECT_GT(p->sim.recomputations, 0);
  }
}

// A copy out that takes longer than a step: its free moves past the steps the copy spans,
// so the compute stream never waits for it (timed as if the free came last; timed with the
// free where it starts, the stream's wait there made the next step seem late enough).
TEST(OffloadPass, AFreeWaitsForItsCopyOutWithoutTheStreamWaiting) {
  Graph g;
  g.name = "chain";
  for (int i = 0; i < 10; ++i) {  // a chain of unit steps; the last reads the first again
    Node n;
    n.id = i;
    n.name = n.op = "n" + std::to_string(i);
    n.bytes = i == 0 ? 10 : 1;
    n.cost = 1;
    if (i > 0) n.inputs = {i - 1};
    if (i == 9) n.inputs.push_back(0);
    g.nodes.push_back(n);
  }
  g.outputs = {9};
  ASSERT_TRUE(validate_graph(g).ok());
  const std::vector<int> order = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
  const HostLink link{4.0, 0.0};  // 10 bytes: 2.5 steps each way
  std::vector<Offload> offloads = {{0, 1, 9}};
  PlanOptions o = options(100, link);
  ASSERT_TRUE(detail::place_copies(g, o, order, &offloads, 0));
  const SimResult r = simulate(g, detail::schedule_with(g, order, offloads), 100, link);
  ASSERT_TRUE(r.valid) << r.error;
  EXPECT_EQ(offloads[0].free, 4) << "the copy out ends at 3.5";
  EXPECT_DOUBLE_EQ(r.exposed_transfer_cost, 0);
}

// Note [Joining a group computed apart]: an operator with a small output read by the forward
// chain and a large one read only at the end, whose start plan computes the large output
// apart (so the operator runs twice). With host memory the pass computes both in one run and
// keeps the large one on the host across the chain; the budget has no room for it there.
TEST(OffloadPass, JoinsAnOutputComputedApartToItsSibling) {
  Graph g;
  g.name = "apart";
  g.whole_groups = true;
  auto add = [&](int64_t bytes, double cost, std::vector<int> inputs,
                 std::optional<int64_t> group) {
    Node n;
    n.id = g.size();
    n.name = n.op = "n" + std::to_string(n.id);
    n.bytes = bytes;
    n.cost = cost;
    n.inputs = std::move(inputs);
    n.group = group;
    g.nodes.push_back(n);
  };
  add(1, 1, {}, std::nullopt);   // 0: x
  add(1, 5, {0}, 9);             // 1: the operator's small output
  add(10, 5, {0}, 9);            // 2: its large output
  add(2, 4, {1}, std::nullopt);  // 3..6: the chain
  add(2, 4, {3}, std::nullopt);
  add(2, 4, {4}, std::nullopt);
  add(2, 4, {5}, std::nullopt);
  add(1, 1, {6, 2}, std::nullopt);  // 7: reads the end of the chain and the large output
  g.outputs = {7};
  ASSERT_TRUE(validate_graph(g).ok());
  const std::vector<int> start = {0, 1, 3, 4, 5, 6, 2, 7};
  const int64_t budget = 13;  // what step 7 reads and makes
  const SimResult before = simulate(g, Schedule{g.name, start}, budget, kFastLink);
  ASSERT_TRUE(before.valid) << before.error;
  ASSERT_FALSE(simulate(g, Schedule{g.name, {0, 1, 2, 3, 4, 5, 6, 7}}, budget).valid)
      << "the large output fits beside the chain: nothing to offload";
  const detail::OffloadedOrder out =
      detail::add_offloads(g, {start, {}}, options(budget, kFastLink), detail::Deadline(1.0));
  const SimResult after =
      simulate(g, detail::schedule_with(g, out.order, out.offloads), budget, kFastLink);
  ASSERT_TRUE(after.valid) << after.error;
  EXPECT_EQ(out.order, (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
  ASSERT_EQ(out.offloads.size(), 1u);
  EXPECT_EQ(out.offloads[0].step, 2);
  EXPECT_DOUBLE_EQ(before.cost, 1 + 10 + 16 + 10 + 1);  // the operator twice
  EXPECT_LT(after.cost, before.cost - 9);
  // Without host memory nothing can hold the large output: the plan stays as it was.
  const detail::OffloadedOrder kept =
      detail::add_offloads(g, {start, {}}, options(budget, kFastLink, 0), detail::Deadline(1.0));
  EXPECT_EQ(kept.order, start);
}

// Given a recompute-only plan to start from, the planner never returns a dearer one.
TEST(OffloadPlanner, NeverDearerThanTheStartItIsGiven) {
  int checked = 0;
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    const Graph g = testing::random_training_graph(20 + static_cast<int>(seed), seed);
    const int64_t budget = file_order_peak(g) * 6 / 10;
    const std::vector<int> start = detail::greedy_order(g, budget, {});
    const SimResult before = simulate(g, Schedule{g.name, start}, budget);
    if (!before.valid) continue;
    PlanOptions o = options(budget, HostLink{0.5, 1.0});
    o.time_limit_seconds = 0.3;
    o.start = Schedule{g.name, start};
    absl::StatusOr<Plan> p = run_planner("offload", g, o);
    ASSERT_TRUE(p.ok()) << p.status();
    ASSERT_TRUE(p->feasible) << p->reason;
    EXPECT_LE(p->sim.cost, before.cost + 1e-9) << "seed " << seed;
    ++checked;
  }
  EXPECT_GT(checked, 2);
  PlanOptions o = options(4, kFastLink);
  o.start = Schedule{"g", {0}};
  o.start->offloads = {{0, 1, 2}};
  EXPECT_FALSE(run_planner("offload", testing::linear_graph(6), o).ok());
}

TEST(OffloadPlanner, AnImpossibleBudgetSaysWhy) {
  const Graph g = testing::linear_graph(6);
  absl::StatusOr<Plan> p = run_planner("offload", g, options(1, kFastLink));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_FALSE(p->feasible);
  EXPECT_THAT(p->reason, ::testing::HasSubstr("below what any schedule needs"));
}

// An input (100 bytes) read first and last around a chain of 10-byte values: recomputation
// cannot free an input, so 111 bytes (the last node with its inputs) fits only with the
// input in host memory across the chain.
Graph input_around_a_chain() {
  Graph g;
  g.name = "input_around_a_chain";
  const std::vector<std::vector<int>> inputs = {{}, {0}, {1}, {2}, {3, 0}};
  const int64_t bytes[] = {100, 10, 10, 10, 1};
  for (int v = 0; v < 5; ++v) {
    Node n;
    n.id = v;
    n.name = absl::StrCat("n", v);
    n.kind = v == 0 ? NodeKind::kInput : NodeKind::kCompute;
    n.bytes = bytes[v];
    n.cost = v == 0 ? 0 : 1000;
    n.inputs = inputs[static_cast<size_t>(v)];
    g.nodes.push_back(n);
  }
  return g;
}

TEST(OffloadPlanner, HostMemoryFitsWhatRecomputationCannot) {
  const Graph g = input_around_a_chain();
  PlanOptions o = options(111, kFastLink);
  o.time_limit_seconds = 0.5;
  absl::StatusOr<Plan> recompute_only = run_planner("best", g, o);
  ASSERT_TRUE(recompute_only.ok()) << recompute_only.status();
  EXPECT_FALSE(recompute_only->feasible);
  absl::StatusOr<Plan> p = run_planner("offload", g, o);
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_TRUE(p->feasible) << p->reason;
  EXPECT_EQ(p->sim.offloads, 1);
  EXPECT_EQ(p->sim.host_peak_bytes, 100);
  EXPECT_LE(p->sim.peak_bytes, 111);
  // Less host memory than the input: recomputation is all there is, and it cannot.
  o.host_memory_bytes = 99;
  p = run_planner("offload", g, o);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_FALSE(p->feasible);
}

// Random training graphs at random budgets and links: the pass keeps the plan valid,
// within both memories, and never dearer than where it started.
TEST(OffloadPlannerProperty, ThePassNeverMakesAPlanWorse) {
  int improved = 0, tried = 0;
  for (uint64_t seed = 1; seed <= 40; ++seed) {
    SCOPED_TRACE(seed);
    std::mt19937_64 rng(seed);
    const Graph g = testing::random_training_graph(12 + static_cast<int>(seed % 25), seed);
    const int64_t peak = file_order_peak(g);
    const int64_t budget = peak * (40 + static_cast<int64_t>(rng() % 50)) / 100;
    const HostLink link{0.05 + static_cast<double>(rng() % 1000) / 100.0,
                        static_cast<double>(rng() % 4)};
    const int64_t host = rng() % 3 == 0 ? static_cast<int64_t>(rng() % 8) : INT64_MAX;
    PlanOptions o = options(budget, link, host);
    const std::vector<int> start = detail::greedy_order(g, budget, {});
    const SimResult before = simulate(g, Schedule{g.name, start}, budget, link);
    if (!before.valid) continue;
    ++tried;
    const detail::OffloadedOrder done =
        detail::add_offloads(g, {start, {}}, o, detail::Deadline(5.0));
    Schedule s{g.name, done.order};
    s.offloads = done.offloads;
    const SimResult after = simulate(g, s, budget, link);
    ASSERT_TRUE(after.valid) << after.error;
    EXPECT_LE(after.cost, before.cost + 1e-9);
    EXPECT_LE(after.host_peak_bytes, host);
    improved += after.cost < before.cost - 1e-9;
  }
  EXPECT_GT(tried, 20);
  EXPECT_GT(improved, 0);  // the pass finds something on some of them
}

}  // namespace
}  // namespace remat

namespace remat {
namespace {

// The planner on random training graphs: a plan it calls feasible fits both memories, and it
// is never dearer than the recompute-only plan of the same search.
TEST(OffloadPlannerProperty, NeverDearerThanRecomputeOnly) {
  int fitted_below_recompute_only = 0;
  for (uint64_t seed = 1; seed <= 12; ++seed) {
    SCOPED_TRACE(seed);
    std::mt19937_64 rng(seed);
    const Graph g = testing::random_training_graph(14 + static_cast<int>(seed % 20), seed);
    const int64_t budget = file_order_peak(g) * (30 + static_cast<int64_t>(rng() % 60)) / 100;
    const HostLink link{0.1 + static_cast<double>(rng() % 500) / 100.0, 0.0};
    const int64_t host = rng() % 3 == 0 ? static_cast<int64_t>(rng() % 8) : INT64_MAX;
    PlanOptions o = options(budget, link, host);
    o.time_limit_seconds = 0.2;
    absl::StatusOr<Plan> p = run_planner("offload", g, o);
    ASSERT_TRUE(p.ok()) << p.status();
    if (!p->feasible) continue;
    const SimResult r = simulate(g, p->schedule, budget, link);
    ASSERT_TRUE(r.valid) << r.error;
    EXPECT_LE(r.host_peak_bytes, host);
    const nlohmann::json d = nlohmann::json::parse(p->details);
    if (d.contains("recompute_only_cost")) {
      EXPECT_LE(r.cost, d["recompute_only_cost"].get<double>() + 1e-9);
    } else {
      ++fitted_below_recompute_only;
    }
  }
  RecordProperty("fitted_below_recompute_only", fitted_below_recompute_only);
}

}  // namespace
}  // namespace remat
