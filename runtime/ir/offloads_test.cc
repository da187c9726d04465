// Offloads in schedules: hand-computed timing and memory, the checks, the format, and a
// property test against an independent count of resident bytes.
#include "runtime/ir/offloads.h"

#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "remat/graph.h"
#include "remat/host_link.h"
#include "remat/schedule.h"
#include "runtime/ir/instances.h"
#include "tests/support/test_graphs.h"

namespace remat {
namespace {

using ::testing::HasSubstr;

constexpr HostLink kTenBytesPerNs{10.0, 0.0};

TEST(Offloads, HandComputedMemoryAndTiming) {
  const Graph g = testing::diamond_graph();
  Schedule s{g.name, {0, 1, 2, 3}};
  s.offloads = {{.step = 0, .free = 2, .fetch = 3}};
  // Node 0 is away at step 2 only: {1, 2}.
  const SimResult r = simulate(g, s, std::nullopt, kTenBytesPerNs);
  ASSERT_TRUE(r.valid) << r.error;
  EXPECT_EQ(r.peak_bytes, 102);
  EXPECT_EQ(r.host_peak_bytes, 100);
  EXPECT_EQ(r.offloads, 1);
  EXPECT_EQ(r.bytes_moved, 200);
  // Copy out 7..17: step 2 waits from 8 to 17. Copy back 18..28: step 3 waits until 28.
  EXPECT_DOUBLE_EQ(r.transfer_cost, 20);
  EXPECT_DOUBLE_EQ(r.exposed_transfer_cost, 19);
  EXPECT_DOUBLE_EQ(r.cost, 29);
  const ScheduleTiming t = time_schedule(g, s, kTenBytesPerNs);
  EXPECT_EQ(t.start, (std::vector<double>{0, 7, 17, 28}));
  EXPECT_DOUBLE_EQ(t.out_done[0], 17);
  EXPECT_DOUBLE_EQ(t.in_done[0], 28);
}

TEST(Offloads, AFastLinkHidesTheCopies) {
  const Graph g = testing::diamond_graph();
  Schedule s{g.name, {0, 1, 2, 3}};
  s.offloads = {{.step = 0, .free = 2, .fetch = 3}};
  // 0.1 ns each way: the copy out ends at 7.1, before step 2 starts at 8; the copy back
  // starts at 9 and step 3 waits 0.1 for it.
  const SimResult r = simulate(g, s, std::nullopt, HostLink{1000.0, 0.0});
  ASSERT_TRUE(r.valid) << r.error;
  EXPECT_NEAR(r.exposed_transfer_cost, 0.1, 1e-9);
  EXPECT_NEAR(r.cost, 10.1, 1e-9);
}

TEST(Offloads, CopiesOneWayQueueOnTheirEngine) {
  // Two 100-byte inputs copied out after steps 0 and 1: the second waits for the first.
  Graph g = testing::diamond_graph();
  g.nodes[1].bytes = 100;
  g.nodes[1].cost = 0;
  g.nodes[0].cost = 0;
  g.nodes[2].inputs = {1};
  g.nodes[3].inputs = {0, 1, 2};
  Schedule s{g.name, {0, 1, 2, 3}};
  s.offloads = {{.step = 0, .free = 2, .fetch = 3}, {.step = 1, .free = 2, .fetch = 3}};
  // step 2 reads node 1, so node 1 may not leave before step 2: that is an error.
  EXPECT_THAT(simulate(g, s, std::nullopt, kTenBytesPerNs).error, HasSubstr("while it is on"));
  g.nodes[2].inputs = {};
  const ScheduleTiming t = time_schedule(g, s, kTenBytesPerNs);
  EXPECT_DOUBLE_EQ(t.out_done[0], 10);
  EXPECT_DOUBLE_EQ(t.out_done[1], 20);
  // Step 2 waits for both (until 20) and ends at 21; the copies back end at 31 and 41.
  EXPECT_DOUBLE_EQ(t.in_done[0], 31);
  EXPECT_DOUBLE_EQ(t.in_done[1], 41);
  EXPECT_DOUBLE_EQ(t.exposed, 40);
  EXPECT_DOUBLE_EQ(t.end, 42);
}

TEST(Offloads, ChecksNameTheEntryAndTheProblem) {
  const Graph g = testing::diamond_graph();
  auto error = [&](std::vector<Offload> offloads) {
    Schedule s{g.name, {0, 1, 2, 3}};
    s.offloads = std::move(offloads);
    return simulate(g, s).error;
  };
  EXPECT_THAT(error({{0, 1, 3}}), HasSubstr("offload 0 (step 0, free 1, fetch 3): step 1"));
  EXPECT_THAT(error({{0, 2, 3}, {0, 2, 3}}), HasSubstr("offload 1"));
  EXPECT_THAT(error({{0, 2, 3}, {0, 2, 3}}), HasSubstr("same instance"));
  EXPECT_THAT(error({{0, 0, 3}}), HasSubstr("step < free < fetch"));
  EXPECT_THAT(error({{0, 2, 2}}), HasSubstr("step < free < fetch"));
  EXPECT_THAT(error({{9, 10, 11}}), HasSubstr("not in the order"));
  EXPECT_EQ(error({{0, 2, 3}}), "");
  Graph read_once = g;
  read_once.nodes[3].inputs = {2};
  Schedule s{g.name, {0, 1, 2, 3}};
  s.offloads = {{0, 2, 3}};
  EXPECT_THAT(simulate(read_once, s).error, HasSubstr("no step reads it after the fetch"));
}

TEST(Offloads, WrittenAndReadBack) {
  Schedule s{"g", {0, 1, 2, 3}};
  s.offloads = {{0, 2, 3}};
  absl::StatusOr<Schedule> back = parse_schedule(write_schedule(s));
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->offloads.size(), 1u);
  EXPECT_EQ(back->offloads[0].free, 2);
  EXPECT_EQ(back->offloads[0].fetch, 3);
  EXPECT_THAT(std::string(parse_schedule(R"({"format": "remat-schedule-v1", "order": [0],
      "offloads": [{"step": 0, "free": -1, "fetch": 2}]})")
                              .status()
                              .message()),
              HasSubstr("offload 0 needs"));
  EXPECT_FALSE(
      parse_schedule(R"({"format": "remat-schedule-v1", "order": [0], "offloads": 3})").ok());
  EXPECT_EQ(write_schedule(Schedule{"g", {0}}).find("offloads"), std::string::npos);
}

// Resident bytes per step counted instance by instance, each offload's gap left out.
std::vector<int64_t> count_resident(const Graph& g, const Schedule& s) {
  const Instances in = compute_instances(g, s.order);
  std::vector<int64_t> mem(s.order.size(), 0);
  for (size_t i = 0; i < s.order.size(); ++i)
    for (int j = static_cast<int>(i); j <= in.last_read[i]; ++j) {
      bool away = false;
      for (const Offload& o : s.offloads)
        away |= o.step == static_cast<int>(i) && j >= o.free && j < o.fetch;
      if (!away) mem[static_cast<size_t>(j)] += g.nodes[static_cast<size_t>(s.order[i])].bytes;
    }
  return mem;
}

TEST(OffloadsProperty, RandomOffloadsKeepTheAccountingAndTheClockConsistent) {
  size_t offloads = 0;
  for (uint64_t seed = 1; seed <= 60; ++seed) {
    SCOPED_TRACE(seed);
    std::mt19937_64 rng(seed);
    const Graph g = testing::random_training_graph(10 + static_cast<int>(seed % 30), seed);
    Schedule s{g.name, {}};
    for (int v = 0; v < g.size(); ++v) s.order.push_back(v);
    const SimResult plain = simulate(g, s);
    s.offloads = testing::random_offloads(g, s.order, rng());
    offloads += s.offloads.size();
    const HostLink link{1.0 + static_cast<double>(rng() % 100), static_cast<double>(rng() % 50)};
    const SimResult r = simulate(g, s, std::nullopt, link);
    ASSERT_TRUE(r.valid) << r.error;
    const std::vector<int64_t> mem = count_resident(g, s);
    EXPECT_EQ(r.peak_bytes, *std::max_element(mem.begin(), mem.end()));
    EXPECT_LE(r.peak_bytes, plain.peak_bytes);
    EXPECT_GE(r.exposed_transfer_cost, 0);
    EXPECT_LE(r.exposed_transfer_cost, r.transfer_cost + 1e-9);
    EXPECT_NEAR(r.cost, plain.cost + r.exposed_transfer_cost, 1e-6 * (1 + r.cost));
    // A link that costs nothing hides everything.
    const SimResult free_link = simulate(g, s, std::nullopt, HostLink{1e18, 0.0});
    EXPECT_NEAR(free_link.cost, plain.cost, 1e-6 * (1 + plain.cost));
  }
  EXPECT_GT(offloads, 100u);  // the generator offloads something
}

}  // namespace
}  // namespace remat
