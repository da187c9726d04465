// Tests of the Rockmate planner: block detection, the sequence DP, and plans checked by the
// simulator.
#include <algorithm>
#include <random>
#include <set>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "internal.h"
#include "nlohmann/json.hpp"
#include "remat/graph_transforms.h"
#include "remat/planner.h"
#include "remat/schedule.h"
#include "rockmate.h"
#include "tests/support/test_graphs.h"

namespace remat {
namespace {

using ::testing::HasSubstr;
namespace rm = detail::rockmate;

Node make_node(Graph& g, const std::string& name, int64_t bytes, double cost,
               std::vector<int> inputs, Phase phase, NodeKind kind = NodeKind::kCompute) {
  Node n;
  n.id = g.size();
  n.name = name;
  n.bytes = bytes;
  n.cost = cost;
  n.inputs = std::move(inputs);
  n.phase = phase;
  n.kind = kind;
  g.nodes.push_back(n);
  return g.nodes.back();
}

// A training step of `layers` identical residual blocks (y = x + g(f(x)), with a weight per
// block), shaped like an AOTAutograd joint graph: forward, tangent, backward in reverse.
Graph residual_chain(int layers) {
  Graph g;
  g.name = "residual" + std::to_string(layers);
  const int data = make_node(g, "data", 8, 0, {}, Phase::kForward, NodeKind::kInput).id;
  std::vector<int> weight;
  for (int l = 0; l < layers; ++l)
    weight.push_back(make_node(g, "w", 2, 0, {}, Phase::kForward, NodeKind::kInput).id);
  std::vector<int> x = {make_node(g, "embed", 8, 3, {data}, Phase::kForward).id}, a, b;
  for (int l = 0; l < layers; ++l) {
    a.push_back(make_node(g, "f", 16, 4, {x.back(), weight[l]}, Phase::kForward).id);
    b.push_back(make_node(g, "g", 8, 2, {a.back()}, Phase::kForward).id);
    x.push_back(make_node(g, "add", 8, 1, {x.back(), b.back()}, Phase::kForward).id);
  }
  int dy = make_node(g, "tangent", 8, 0, {}, Phase::kBackward, NodeKind::kTangent).id;
  for (int l = layers - 1; l >= 0; --l) {
    const int db = make_node(g, "g'", 16, 2, {dy, a[l]}, Phase::kBackward).id;
    const int da = make_node(g, "f'", 8, 4, {db, x[l], weight[l]}, Phase::kBackward).id;
    make_node(g, "dw", 2, 4, {db, x[l]}, Phase::kBackward);
    dy = make_node(g, "dx", 8, 1, {dy, da}, Phase::kBackward).id;
  }
  return g;
}

Plan must_plan(const std::string& algo, const Graph& g, int64_t budget, double seconds = 5) {
  PlanOptions o;
  o.budget_bytes = budget;
  o.time_limit_seconds = seconds;
  auto p = run_planner(algo, g, o);
  EXPECT_TRUE(p.ok()) << p.status();
  return p.ok() ? *p : Plan{};
}

TEST(RockmateBlocks, IdenticalBlocksOfAChainAreOneKind) {
  const Graph g = residual_chain(12);
  ASSERT_TRUE(validate_graph(g).ok());
  const rm::BlockSequence b = rm::detect_blocks(g);
  ASSERT_GE(b.size(), 12) << b.note;
  // Every block that holds a residual add is one kind, solved once; but the last two: a
  // backward node joins the block of the separator it reads (the previous block), so the
  // tangent's end of the chain shifts the last two.
  std::set<int> kinds;
  for (int i = 0; i + 2 < b.size(); ++i)
    if (g.nodes[b.out[i]].name == "add") kinds.insert(b.kind[i]);
  EXPECT_EQ(kinds.size(), 1u);
  EXPECT_LE(b.representative.size(), 4u);
  // Each block's backward pairs with its forward: it reads its own block's forward values.
  for (int i = 0; i < b.size(); ++i) {
    for (int v : b.bwd[i]) {
      for (int u : g.nodes[v].inputs) {
        if (b.block_of[u] >= 0 && !b.late[u]) {
          EXPECT_TRUE(b.block_of[u] == i || u == b.out[i - 1]) << "node " << v << " reads " << u;
        }
      }
    }
  }
}

TEST(RockmateBlocks, GraphWithoutBackwardIsOneBlock) {
  const Graph g = testing::random_dag(30, 0.2, 10, 3);
  const rm::BlockSequence b = rm::detect_blocks(g);
  EXPECT_EQ(b.size(), 1);
  EXPECT_THAT(b.note, HasSubstr("no backward"));
}

// Two strategies for one block: the cheap one needs more memory. The DP takes it only when
// the memory allows.
TEST(RockmateDp, ChoosesTheCheaperStrategyWhenTheBudgetAllows) {
  std::vector<rm::Strategy> list(2);
  list[0].fwd_peak = 50, list[0].bwd_peak = 100, list[0].kept = 40, list[0].cost = 10;
  list[1].fwd_peak = 30, list[1].bwd_peak = 50, list[1].kept = 0, list[1].cost = 16;
  rm::ChainModel c;
  c.act = {0, 10, 10};
  c.grads_in = {0, 10, 0};
  c.block_grads_in = {10, 0};
  c.advance_peak = {30, 30};
  c.advance_cost = {5, 5};
  c.rest_fwd = {0, 0};
  c.rest_bwd = {0, 0};
  c.rerunnable = {1, 1};
  c.strategies = {&list, &list};
  rm::ChainSolver solver;
  ASSERT_TRUE(solver.fill(c, 400, 400));
  auto roomy = solver.solve(400);
  ASSERT_TRUE(roomy.has_value());
  EXPECT_DOUBLE_EQ(roomy->first, 20);  // the cheap strategy in both blocks
  auto tight = solver.solve(70);
  ASSERT_TRUE(tight.has_value());
  EXPECT_GT(tight->first, 20);
  EXPECT_FALSE(solver.solve(40).has_value());  // no strategy's backward fits
  // Within the budget, the DP's choice is the cheapest way it knows.
  for (int64_t m = 50; m <= 400; m += 10) {
    auto r = solver.solve(m);
    if (!r) continue;
    auto more = solver.solve(m + 10);
    ASSERT_TRUE(more.has_value());
    EXPECT_LE(more->first, r->first) << m;
  }
}

TEST(RockmateStrategies, KeepAllAndRecomputeAllBracketTheFamily) {
  const Graph g = residual_chain(6);
  const rm::BlockSequence b = rm::detect_blocks(g);
  const int block = b.size() / 2;
  const rm::BlockProblem p = rm::build_block_problem(g, b, block);
  const rm::KindPlan k = rm::plan_kind(p, 2.0, false);
  ASSERT_FALSE(k.strategies.empty());
  double cheapest = 1e300;
  int64_t leanest = INT64_MAX;
  for (const rm::Strategy& s : k.strategies) {
    cheapest = std::min(cheapest, s.cost);
    leanest = std::min(leanest, s.kept);
    std::multiset<int> steps(s.fwd.begin(), s.fwd.end());
    steps.insert(s.bwd.begin(), s.bwd.end());
    for (int v = 0; v < p.sub.size(); ++v)
      if (!p.external[v]) {
        EXPECT_GE(steps.count(v), 1u) << s.source << " misses " << v;
      }
  }
  EXPECT_DOUBLE_EQ(cheapest, p.sub.total_cost());  // keep all: every node once
  EXPECT_EQ(leanest, 0);                           // recompute all: nothing kept
}

// Property test against the simulator: random layered training graphs at random budgets.
TEST(Rockmate, PlansOnRandomLayeredGraphsAreValidWithinBudget) {
  std::mt19937_64 rng(7);
  int feasible = 0;
  for (uint64_t seed = 1; seed <= 12; ++seed) {
    const Graph g = testing::random_training_graph(15 + static_cast<int>(seed) * 3, seed);
    const int64_t full = file_order_peak(g);
    const int64_t lb = detail::minimum_peak_lower_bound(g, nullptr);
    for (int k = 0; k < 3; ++k) {
      const int64_t budget = k == 0 ? full : lb + static_cast<int64_t>(rng() % (full - lb + 1));
      const Plan p = must_plan("rockmate", g, budget, 0.25);
      if (k == 0) {
        EXPECT_TRUE(p.feasible) << "seed " << seed << ": " << p.reason;
      }
      if (!p.feasible) continue;
      ++feasible;
      const SimResult again = simulate(g, p.schedule, budget);
      ASSERT_TRUE(again.valid) << "seed " << seed << ": " << again.error;
      EXPECT_LE(again.peak_bytes, budget);
      EXPECT_DOUBLE_EQ(again.cost, p.sim.cost);
    }
  }
  EXPECT_GE(feasible, 18);
}

// Note [Moving the DP's memory]: the probes are repaired against the simulator, so a plan
// has no recomputation the budget does not need: dropping any one of them (a later instance
// of a node) leaves a schedule that is invalid or over the budget.
TEST(Rockmate, EveryRecomputationIsNeededByTheBudget) {
  std::mt19937_64 rng(11);
  int checked = 0;
  for (uint64_t seed = 1; seed <= 8; ++seed) {
    const Graph g = testing::random_training_graph(20 + static_cast<int>(seed) * 2, seed);
    const int64_t full = file_order_peak(g);
    const int64_t lb = detail::minimum_peak_lower_bound(g, nullptr);
    const int64_t budget = lb + static_cast<int64_t>(rng() % (full - lb + 1));
    const Plan p = must_plan("rockmate", g, budget, 1);
    if (!p.feasible) continue;
    std::vector<int> seen(g.size(), 0);
    for (size_t j = 0; j < p.schedule.order.size(); ++j) {
      if (seen[p.schedule.order[j]]++ == 0) continue;
      Schedule less = p.schedule;
      less.order.erase(less.order.begin() + static_cast<std::ptrdiff_t>(j));
      const SimResult sim = simulate(g, less, budget);
      EXPECT_FALSE(sim.valid) << "seed " << seed << ": the recomputation at step " << j
                              << " of node " << p.schedule.order[j] << " is not needed ("
                              << p.reason << ")";
      ++checked;
    }
  }
  EXPECT_GE(checked, 10);
}

// Note [Strategies across calls]: a second plan of the same blocks at another budget takes
// every kind's strategies from the first, and is still valid within its budget.
TEST(Rockmate, SecondCallAtAnotherBudgetReusesTheSolvedKinds) {
  const Graph g = residual_chain(7);
  const int64_t full = file_order_peak(g);
  const Plan first = must_plan("rockmate", g, full * 9 / 10, 2);
  ASSERT_TRUE(first.feasible) << first.reason;
  const auto first_kinds = nlohmann::json::parse(first.details)["kind_list"];
  const Plan second = must_plan("rockmate", g, full * 6 / 10, 2);
  ASSERT_TRUE(second.feasible) << second.reason;
  const auto kinds = nlohmann::json::parse(second.details)["kind_list"];
  ASSERT_EQ(kinds.size(), first_kinds.size());
  for (const auto& k : kinds) EXPECT_TRUE(k["cached"].get<bool>()) << k.dump();
  const SimResult sim = simulate(g, second.schedule, full * 6 / 10);
  EXPECT_TRUE(sim.valid) << sim.error;
}

TEST(Rockmate, NoWorseThanRotorOnChains) {
  int compared = 0;
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    const Graph g = testing::random_training_graph(30, seed);
    const int64_t full = file_order_peak(g);
    for (double f : {1.0, 0.8, 0.65, 0.5}) {
      const int64_t budget = static_cast<int64_t>(f * static_cast<double>(full));
      const Plan rotor = must_plan("rotor", g, budget);
      if (!rotor.feasible) continue;
      const Plan rock = must_plan("rockmate", g, budget, 1);
      ASSERT_TRUE(rock.feasible) << "seed " << seed << " f " << f << ": " << rock.reason;
      EXPECT_LE(rock.sim.cost, rotor.sim.cost + 1e-9) << "seed " << seed << " f " << f;
      ++compared;
    }
  }
  EXPECT_GE(compared, 10);
}

TEST(Rockmate, GraphWithoutBlockStructureGetsAPlan) {
  // Forward only: no sequence of forward and backward blocks.
  const Graph dag = testing::random_dag(40, 0.15, 20, 5);
  const Plan p = must_plan("rockmate", dag, file_order_peak(dag));
  EXPECT_TRUE(p.feasible) << p.reason;
  EXPECT_THAT(p.details, HasSubstr("single_block"));
  // Dense skips: every forward node reads all earlier ones, so no separator exists.
  Graph dense;
  dense.name = "dense";
  for (int i = 0; i < 8; ++i) {
    std::vector<int> in;
    for (int j = 0; j < i; ++j) in.push_back(j);
    make_node(dense, "f", 4, 1, in, Phase::kForward);
  }
  for (int i = 0; i < 8; ++i) make_node(dense, "b", 4, 1, {7 - i, 8 + i - 1}, Phase::kBackward);
  const Plan q = must_plan("rockmate", dense, file_order_peak(dense));
  EXPECT_TRUE(q.feasible) << q.reason;
}

// hold_inputs() graphs (what remat-compare and the hinted policy plan): every node waits
// for a node reading all inputs and the tangent, and a last node holds them.
TEST(Rockmate, HeldInputGraphsKeepTheirBlocks) {
  const Graph g = hold_inputs(residual_chain(8));
  const rm::BlockSequence b = rm::detect_blocks(g);
  EXPECT_GE(b.size(), 8) << b.note;
  const int64_t full = file_order_peak(g);
  for (double f : {1.0, 0.8}) {
    const int64_t budget = static_cast<int64_t>(f * static_cast<double>(full));
    const Plan p = must_plan("rockmate", g, budget, 1);
    EXPECT_TRUE(p.feasible) << f << ": " << p.reason;
    if (p.feasible) {
      EXPECT_TRUE(simulate(g, p.schedule, budget).valid);
    }
  }
}

TEST(Rockmate, MalformedGraphsAreErrorsNotCrashes) {
  Graph g = residual_chain(2);
  g.nodes[5].inputs.push_back(9);  // reads a later node
  auto p = run_planner("rockmate", g, PlanOptions{});
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(std::string(p.status().message()), HasSubstr("node 5"));
  auto cyclic = parse_graph(R"({"format": "remat-graph-v1", "name": "c", "nodes": [
      {"id": 0, "bytes": 1, "inputs": [1]}, {"id": 1, "bytes": 1, "inputs": [0]}]})");
  ASSERT_FALSE(cyclic.ok());
  EXPECT_THAT(std::string(cyclic.status().message()), HasSubstr("cycle"));
}

TEST(Rockmate, GptSmallIsBlocksOfFewKindsAndFitsHalfItsPeak) {
  const std::string dir = testing::shared_graphs_dir();
  if (dir.empty()) GTEST_SKIP() << "../shared/graphs is absent";
  auto g = read_graph_file(dir + "/gpt_small.json");
  ASSERT_TRUE(g.ok()) << g.status();
  const rm::BlockSequence b = rm::detect_blocks(*g);
  EXPECT_GE(b.size(), 10);
  EXPECT_LT(b.representative.size(), static_cast<size_t>(b.size()));
  const int64_t budget = file_order_peak(*g) / 2;
  const Plan p = must_plan("rockmate", *g, budget, 5);
  ASSERT_TRUE(p.feasible) << p.reason;
  EXPECT_LE(p.sim.peak_bytes, budget);
  EXPECT_LT(p.sim.overhead, 0.25);  // `best` with 30 s reached 0.210 before rockmate
  EXPECT_THAT(p.details, HasSubstr("kind_list"));
}

}  // namespace
}  // namespace remat
