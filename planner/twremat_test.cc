// Tests of twremat (tree-decomposition rematerialization) and of the unread-instance pruning.
#include <random>
#include <string>

#include "gtest/gtest.h"
#include "internal.h"
#include "remat/planner.h"
#include "remat/schedule.h"
#include "tests/support/test_graphs.h"

namespace remat {
namespace detail {
// Defined in twremat.cc (internal.h is another change's): one twremat run, pruned; with
// shortcuts off, the plain recursion that the shortcuts must not change.
std::vector<int> tw_remat_order_for_test(const Graph& g, int k, int64_t budget, double balance,
                                         bool early, bool shortcuts);
}  // namespace detail
namespace {

const char* kSharedGraphs[] = {"rlg_n100",  "rlg_n250",       "cm_vgg16", "cm_mobilenet",
                               "mlp16",     "resnet18",       "vgg11",    "mobilenet_v2",
                               "gpt_small", "transformer_enc"};

Plan twremat(const Graph& g, std::optional<int64_t> budget, int k = -1) {
  PlanOptions o;
  o.budget_bytes = budget;
  o.twremat_k = k;
  auto p = run_planner("twremat", g, o);
  EXPECT_TRUE(p.ok()) << p.status();
  return p.ok() ? *p : Plan{};
}

TEST(Twremat, ValidAndNeverAboveNoRematOnSharedGraphs) {
  std::string dir = testing::shared_graphs_dir();
  if (dir.empty()) GTEST_SKIP() << "../shared/graphs is absent";
  for (const char* name : kSharedGraphs) {
    auto g = read_graph_file(dir + "/" + name + ".json");
    ASSERT_TRUE(g.ok()) << g.status();
    int64_t full = file_order_peak(*g);
    Plan p = twremat(*g, std::nullopt);
    ASSERT_TRUE(p.feasible) << name << ": " << p.reason;
    SimResult again = simulate(*g, p.schedule);
    ASSERT_TRUE(again.valid) << name << ": " << again.error;
    EXPECT_LE(again.peak_bytes, full) << name;
    // Budgeted mode: a plan reported feasible fits.
    int64_t budget = full * 7 / 10;
    Plan b = twremat(*g, budget);
    if (b.feasible) {
      EXPECT_TRUE(simulate(*g, b.schedule, budget).valid) << name;
    }
  }
}

// Kumar et al. report 3.48x-4.59x peak reductions on Transformers; the issue asks for at
// most 30% of the file-order peak.
TEST(Twremat, MinimisesTransformerPeaksToAtMostThirtyPercent) {
  std::string dir = testing::shared_graphs_dir();
  if (dir.empty()) GTEST_SKIP() << "../shared/graphs is absent";
  for (const char* name : {"transformer_enc", "gpt_small"}) {
    auto g = read_graph_file(dir + "/" + name + ".json");
    ASSERT_TRUE(g.ok()) << g.status();
    int64_t full = file_order_peak(*g);
    Plan p = twremat(*g, std::nullopt);
    ASSERT_TRUE(p.feasible) << name << ": " << p.reason;
    EXPECT_LE(static_cast<double>(p.sim.peak_bytes), 0.30 * static_cast<double>(full)) << name;
  }
}

// The smallest peak of any schedule, by exhaustive search over budgets.
int64_t exhaustive_min_peak(const Graph& g) {
  int64_t lo = detail::minimum_peak_lower_bound(g, nullptr), hi = file_order_peak(g);
  while (lo < hi) {
    int64_t mid = (lo + hi) / 2;
    if (detail::exhaustive_optimum(g, mid).has_value())
      hi = mid;
    else
      lo = mid + 1;
  }
  return lo;
}

TEST(Twremat, NeverBeatsExhaustiveMinimumPeakOnSmallRandomGraphs) {
  int lower = 0;
  for (uint64_t seed = 1; seed <= 10; ++seed) {
    Graph g =
        seed % 2 ? testing::random_dag(9, 0.3, 5, seed) : testing::random_training_graph(5, seed);
    int64_t best = exhaustive_min_peak(g);
    Plan p = twremat(g, std::nullopt);
    ASSERT_TRUE(p.feasible) << "seed " << seed << ": " << p.reason;
    ASSERT_TRUE(simulate(g, p.schedule).valid);
    EXPECT_GE(p.sim.peak_bytes, best) << "seed " << seed;
    if (p.sim.peak_bytes < file_order_peak(g)) ++lower;
    // Budgeted at the exhaustive minimum: a feasible plan fits it.
    Plan b = twremat(g, best);
    if (b.feasible) {
      EXPECT_LE(b.sim.peak_bytes, best);
    }
  }
  EXPECT_GT(lower, 0);  // it does rematerialize somewhere
}

TEST(Twremat, RecursionLimitTradesMemoryForLength) {
  Graph g = testing::random_training_graph(300, 3);
  int64_t full = file_order_peak(g);
  Plan flat = twremat(g, std::nullopt, 0);
  ASSERT_TRUE(flat.feasible);
  EXPECT_EQ(flat.sim.recomputations, 0);  // k = 0: no recursion, topological order
  Plan deep = twremat(g, std::nullopt, -1);
  ASSERT_TRUE(deep.feasible);
  // A chain-like training graph of width ~3 needs O(log n) values, not O(n).
  EXPECT_LT(deep.sim.peak_bytes * 5, full);
  EXPECT_GT(deep.sim.recomputations, 0);
  Plan mid = twremat(g, std::nullopt, 3);
  ASSERT_TRUE(mid.feasible);
  EXPECT_LE(mid.sim.recomputations, deep.sim.recomputations);
  EXPECT_GE(mid.sim.peak_bytes, deep.sim.peak_bytes);
}

TEST(Twremat, BudgetStopsRecursionEarly) {
  Graph g = testing::random_training_graph(300, 5);
  int64_t full = file_order_peak(g);
  Plan deep = twremat(g, std::nullopt);
  Plan loose = twremat(g, full * 6 / 10);
  ASSERT_TRUE(loose.feasible) << loose.reason;
  EXPECT_LE(loose.sim.peak_bytes, full * 6 / 10);
  // A loose budget needs fewer recomputations than minimising memory.
  EXPECT_LT(loose.sim.recomputations, deep.sim.recomputations);
}

// Note [A deadline for the decomposition]: the time limit bounds the tree decomposition too
// (it took minutes on graphs with long skips, whatever the limit). A limit already past stops
// it at once with DeadlineExceeded; the same graph with time to spare plans.
TEST(Twremat, TheTimeLimitBoundsTheDecomposition) {
  const Graph g = testing::random_training_graph(300, 5);
  PlanOptions opt;
  opt.budget_bytes = file_order_peak(g) * 6 / 10;
  opt.time_limit_seconds = 0;
  const absl::StatusOr<Plan> stopped = run_planner("twremat", g, opt);
  ASSERT_FALSE(stopped.ok());
  EXPECT_EQ(stopped.status().code(), absl::StatusCode::kDeadlineExceeded) << stopped.status();
  EXPECT_NE(stopped.status().message().find("tree decomposition"), std::string::npos);
  opt.time_limit_seconds = 60;
  const absl::StatusOr<Plan> planned = run_planner("twremat", g, opt);
  ASSERT_TRUE(planned.ok()) << planned.status();
  EXPECT_TRUE(planned->feasible) << planned->reason;
}

// A small DenseNet-like graph: 1 to 3 blocks of 1 to 5 layers, each reading all earlier ones.
Graph random_dense_net(std::mt19937_64& rng, uint64_t seed) {
  std::vector<int> blocks(1 + rng() % 3);
  for (int& b : blocks) b = 1 + static_cast<int>(rng() % 5);
  return testing::dense_net_graph(blocks, seed);
}

// Skipping calls whose instances are all pruned and replaying calls on computed sets are
// pure speed-ups: the schedule is the plain recursion's, pruned, under every setting.
TEST(Twremat, ShortcutsGiveThePlainRecursionsSchedule) {
  std::mt19937_64 rng(22);
  for (uint64_t seed = 1; seed <= 24; ++seed) {
    Graph g = seed % 3 == 0   ? testing::random_dag(25, 0.4, 9, seed)
              : seed % 3 == 1 ? random_dense_net(rng, seed)
                              : testing::random_training_graph(30, seed);
    const int64_t full = file_order_peak(g);
    for (int k : {-1, 2}) {
      for (int64_t budget :
           {detail::kNoBudget, full * (3 + static_cast<int64_t>(rng() % 7)) / 10}) {
        for (double balance : {0.5, 0.8}) {
          for (bool early : {true, false}) {
            EXPECT_EQ(detail::tw_remat_order_for_test(g, k, budget, balance, early, true),
                      detail::tw_remat_order_for_test(g, k, budget, balance, early, false))
                << g.name << " k=" << k << " budget=" << budget << " balance=" << balance
                << " early=" << early;
          }
        }
      }
    }
  }
}

TEST(Twremat, PlansForDenseGraphsAreValidAndWithinBudget) {
  std::mt19937_64 rng(121);
  int below_full = 0;
  for (uint64_t seed = 1; seed <= 30; ++seed) {
    Graph g = random_dense_net(rng, seed);
    const int64_t full = file_order_peak(g);
    Plan p = twremat(g, std::nullopt);
    ASSERT_TRUE(p.feasible) << g.name << ": " << p.reason;
    SimResult again = simulate(g, p.schedule);
    ASSERT_TRUE(again.valid) << g.name << ": " << again.error;
    EXPECT_LE(again.peak_bytes, full) << g.name;
    const int64_t budget = full * (3 + static_cast<int64_t>(rng() % 8)) / 10;
    Plan b = twremat(g, budget);
    if (!b.feasible) {  // over budget, or a budget below what any schedule needs
      if (!b.schedule.order.empty()) {
        EXPECT_TRUE(simulate(g, b.schedule).valid) << g.name;
      }
      continue;
    }
    EXPECT_TRUE(simulate(g, b.schedule, budget).valid) << g.name << " budget " << budget;
    EXPECT_LE(b.sim.peak_bytes, budget) << g.name;
    if (budget < full) ++below_full;
  }
  EXPECT_GT(below_full, 5);  // it fits budgets below the no-remat peak
}

TEST(Prune, DropsUnreadInstancesOnly) {
  Graph g = testing::linear_graph(3);  // 0..6; 4 reads 3 and 2, 5 reads 4 and 1, 6 reads 5 and 0
  // Every instance here is read before the next one of its node: nothing goes.
  std::vector<int> kept = {0, 1, 2, 3, 1, 2, 4, 5, 6};
  EXPECT_EQ(detail::prune_unread_instances(g, kept), kept);
  // 1 and 2 are recomputed before anything reads their first instances: those go.
  std::vector<int> order = {0, 1, 2, 1, 2, 3, 4, 5, 6};
  EXPECT_EQ(detail::prune_unread_instances(g, order), (std::vector<int>{0, 1, 2, 3, 4, 5, 6}));
  std::mt19937_64 rng(9);
  for (int trial = 0; trial < 200; ++trial) {
    Graph r = testing::random_dag(10, 0.3, 5, trial);
    std::vector<int> o;
    for (int v = 0; v < r.size(); ++v) {
      o.push_back(v);
      if (v > 0 && rng() % 2) o.push_back(static_cast<int>(rng() % v));  // random extra instances
    }
    SimResult before = simulate(r, Schedule{r.name, o});
    ASSERT_TRUE(before.valid) << before.error;
    SimResult after = simulate(r, Schedule{r.name, detail::prune_unread_instances(r, o)});
    ASSERT_TRUE(after.valid) << after.error;
    EXPECT_LE(after.peak_bytes, before.peak_bytes);
    EXPECT_LE(after.cost, before.cost);
  }
}

}  // namespace
}  // namespace remat
