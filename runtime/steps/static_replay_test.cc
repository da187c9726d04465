// Static replay of schedules with offloads: the runtime sends each instance to host memory
// and back where the schedule says, and its memory follows the simulator's.
#include "remat/static_replay.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "remat/graph.h"
#include "remat/schedule.h"
#include "tests/support/test_graphs.h"

namespace remat {
namespace {

// A forward chain 0..n and its backward, each node 1000 bytes (Checkmate's linear graph).
Graph chain(int n) {
  Graph g = testing::linear_graph(n);
  for (Node& node : g.nodes) node.bytes = 1000;
  return g;
}

// File order with every forward value but the last in host memory between its forward
// read and its backward one.
Schedule offloaded_file_order(const Graph& g, int n) {
  Schedule s{g.name, {}};
  for (int v = 0; v < g.size(); ++v) s.order.push_back(v);
  for (int i = 0; i + 1 < n; ++i) s.offloads.push_back({i, i + 2, 2 * n - i});
  return s;
}

TEST(StaticReplayOffloads, MemoryFollowsTheSimulator) {
  const int n = 6;
  const Graph g = chain(n);
  const Schedule s = offloaded_file_order(g, n);
  const SimResult sim = simulate(g, s, std::nullopt, HostLink::pcie5());
  ASSERT_TRUE(sim.valid) << sim.error;
  const SimResult kept = simulate(g, Schedule{g.name, s.order});
  EXPECT_LT(sim.peak_bytes, kept.peak_bytes);
  absl::StatusOr<StaticReplayResult> r = static_replay(g, s, {.accounting = Accounting::kLogical});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->offloads, s.offloads.size());
  EXPECT_EQ(static_cast<int64_t>(r->peak_allocated_bytes), sim.peak_bytes);
  EXPECT_EQ(r->recomputations, 0u);
  // The runtime's copy engines run the copies as the simulator does.
  EXPECT_GT(sim.exposed_transfer_cost, 0);
  EXPECT_NEAR(r->cost, sim.cost, 1e-9 * sim.cost);
}

TEST(StaticReplayOffloads, ABadOffloadIsAnErrorNamingIt) {
  const Graph g = chain(4);
  Schedule s = offloaded_file_order(g, 4);
  s.offloads[1].free = 1;  // node 1 may not leave at the step that makes it
  absl::StatusOr<StaticReplayResult> r = static_replay(g, s);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()), ::testing::HasSubstr("offload 1"));
}

// Random training graphs with random offloads and links: the runtime's replay peaks where
// the simulator says and costs what it says, the copies' waits included.
TEST(StaticReplayOffloadsProperty, ReplayMatchesTheSimulatorInBytesAndTime) {
  std::size_t offloads = 0;
  for (uint64_t seed = 1; seed <= 40; ++seed) {
    SCOPED_TRACE(seed);
    const Graph g = testing::random_training_graph(8 + static_cast<int>(seed % 30), seed);
    Schedule s{g.name, {}};
    for (int v = 0; v < g.size(); ++v) s.order.push_back(v);
    s.offloads = testing::random_offloads(g, s.order, seed);
    const HostLink link{0.05 * static_cast<double>(1 + seed % 20), static_cast<double>(seed % 3)};
    const SimResult sim = simulate(g, s, std::nullopt, link);
    ASSERT_TRUE(sim.valid) << sim.error;
    absl::StatusOr<StaticReplayResult> r =
        static_replay(g, s, {.accounting = Accounting::kLogical, .host_link = link});
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(static_cast<int64_t>(r->peak_allocated_bytes), sim.peak_bytes);
    EXPECT_NEAR(r->cost, sim.cost, 1e-9 * (1 + sim.cost));
    EXPECT_EQ(r->offloads, s.offloads.size());
    offloads += r->offloads;
  }
  EXPECT_GT(offloads, 50u);
}

}  // namespace
}  // namespace remat
