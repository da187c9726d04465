#include <fstream>
#include <map>
#include <optional>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "remat/graph.h"
#include "remat/schedule.h"
#include "runtime/ir/instances.h"
#include "tests/support/test_graphs.h"

namespace remat {
namespace {

using ::testing::HasSubstr;

TEST(Simulator, HandComputedProfileWithRecomputation) {
  Graph g = testing::diamond_graph();
  Schedule s{g.name, {0, 1, 2, 0, 3}};
  // step0 {0}; step1 {0,1}; step2 {1,2} (first 0 dies after step1); step3 {2, 0'};
  // step4 {0', 2, 3}.
  EXPECT_EQ(memory_profile(g, s.order), (std::vector<int64_t>{100, 101, 2, 101, 102}));
  SimResult r = simulate(g, s);
  ASSERT_TRUE(r.valid) << r.error;
  EXPECT_EQ(r.peak_bytes, 102);
  EXPECT_EQ(r.peak_step, 4);
  EXPECT_DOUBLE_EQ(r.cost, 7 + 1 + 1 + 7 + 1);
  EXPECT_DOUBLE_EQ(r.base_cost, 10);
  EXPECT_DOUBLE_EQ(r.overhead, 0.7);
  EXPECT_EQ(r.recomputations, 1);
}

// Two outputs (1 and 2) of one operator of cost 6, read by 3.
Graph group_graph(bool whole_groups) {
  Graph g;
  g.name = "group";
  g.whole_groups = whole_groups;
  auto add = [&](double cost, std::vector<int> inputs, std::optional<int64_t> group) {
    Node n;
    n.id = g.size();
    n.name = n.op = "n" + std::to_string(n.id);
    n.bytes = 10;
    n.cost = cost;
    n.inputs = std::move(inputs);
    n.group = group;
    g.nodes.push_back(n);
  };
  add(2, {}, std::nullopt);
  add(3, {0}, 7);
  add(3, {0}, 7);
  add(1, {1, 2}, std::nullopt);
  g.outputs = {3};
  return g;
}

// Note [Groups that run whole]: a run of a group's members costs the operator once; a member
// computed apart costs it whole; without whole groups every member costs its share.
TEST(Simulator, GroupsThatRunWholeCostTheOperatorPerRun) {
  const Graph shares = group_graph(false), whole = group_graph(true);
  ASSERT_TRUE(validate_graph(whole).ok());
  const Schedule in_order{"group", {0, 1, 2, 3}}, reversed{"group", {0, 2, 1, 3}};
  const Schedule apart{"group", {0, 1, 2, 3, 2}};
  EXPECT_DOUBLE_EQ(simulate(whole, in_order).cost, 9);
  EXPECT_DOUBLE_EQ(simulate(whole, reversed).cost, 9);
  EXPECT_DOUBLE_EQ(simulate(whole, apart).cost, 15);
  EXPECT_DOUBLE_EQ(simulate(shares, apart).cost, 12);
  EXPECT_EQ(step_costs(whole, apart.order), (std::vector<double>{2, 3, 3, 1, 6}));
  EXPECT_EQ(step_costs(shares, apart.order), (std::vector<double>{2, 3, 3, 1, 3}));
  // The same member twice in a row is two runs.
  EXPECT_EQ(step_costs(whole, {0, 1, 1, 2, 3}), (std::vector<double>{2, 6, 3, 3, 1}));
}

TEST(Simulator, UnreadValueIsResidentOnlyAtItsStep) {
  Graph g = testing::diamond_graph();
  g.nodes[3].inputs = {2};  // node 0 is read only by node 1 now
  Schedule s{g.name, {0, 1, 2, 3}};
  EXPECT_EQ(memory_profile(g, s.order), (std::vector<int64_t>{100, 101, 2, 2}));
}

TEST(Simulator, ReadUsesNewestInstance) {
  Graph g = testing::diamond_graph();
  // 0 recomputed right after its first use: the first instance dies at step 1.
  Schedule s{g.name, {0, 1, 0, 2, 3}};
  EXPECT_EQ(memory_profile(g, s.order), (std::vector<int64_t>{100, 101, 101, 102, 102}));
}

TEST(Simulator, BudgetMakesScheduleInvalidWithReason) {
  Graph g = testing::diamond_graph();
  Schedule s{g.name, {0, 1, 2, 3}};
  EXPECT_TRUE(simulate(g, s, 102).valid);
  SimResult r = simulate(g, s, 101);
  EXPECT_FALSE(r.valid);
  EXPECT_THAT(r.error, HasSubstr("exceeds the budget of 101"));
  EXPECT_EQ(r.peak_bytes, 102);
}

TEST(Simulator, RejectsReadBeforeAnyInstance) {
  Graph g = testing::diamond_graph();
  SimResult r = simulate(g, Schedule{g.name, {0, 2, 1, 3}});
  EXPECT_FALSE(r.valid);
  EXPECT_THAT(r.error, HasSubstr("step 1"));
  EXPECT_THAT(r.error, HasSubstr("reads node 1"));
}

TEST(Simulator, RejectsMissingUnknownAndRecomputedInputs) {
  Graph g = testing::diamond_graph();
  EXPECT_THAT(simulate(g, Schedule{g.name, {0, 1, 2}}).error,
              HasSubstr("node 3 ('n3') is never computed"));
  EXPECT_THAT(simulate(g, Schedule{g.name, {0, 1, 9}}).error, HasSubstr("unknown node id 9"));
  g.nodes[0].kind = NodeKind::kInput;
  SimResult r = simulate(g, Schedule{g.name, {0, 1, 2, 0, 3}});
  EXPECT_FALSE(r.valid);
  EXPECT_THAT(r.error, HasSubstr("computed a second time"));
  g.nodes[0].kind = NodeKind::kCompute;
  g.nodes[0].recomputable = false;
  EXPECT_FALSE(simulate(g, Schedule{g.name, {0, 1, 2, 0, 3}}).valid);
}

TEST(Simulator, SavedBytesCountsForwardValuesReadByBackward) {
  Graph g = testing::linear_graph(2);  // forward 0,1,2; backward 3 (reads 2,1), 4 (reads 3,0)
  g.nodes[0].bytes = 1;
  g.nodes[1].bytes = 10;
  g.nodes[2].bytes = 100;
  EXPECT_EQ(simulate(g, Schedule{g.name, {0, 1, 2, 3, 4}}).saved_bytes, 111);
  // Recomputing 1 in the backward: only 0 and 2 are kept from the forward pass.
  EXPECT_EQ(simulate(g, Schedule{g.name, {0, 1, 2, 1, 3, 4}}).saved_bytes, 101);
  // Graphs without a backward phase save nothing.
  Graph f = testing::random_dag(5, 0.5, 3, 2);
  Schedule s{f.name, {0, 1, 2, 3, 4}};
  EXPECT_EQ(simulate(f, s).saved_bytes, 0);
}

TEST(ScheduleIo, RoundTripsAndRejectsBadInput) {
  Schedule s{"g", {0, 1, 2, 0, 3}};
  auto back = parse_schedule(write_schedule(s));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->graph, "g");
  EXPECT_EQ(back->order, s.order);
  EXPECT_FALSE(parse_schedule("{").ok());
  EXPECT_FALSE(parse_schedule(R"({"format":"remat-graph-v1","order":[]})").ok());
  auto bad = parse_schedule(R"({"format":"remat-schedule-v1","graph":"g","order":[0,-3]})");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("step 1"));
}

TEST(ScheduleIo, RejectsNumbersOutOfRange) {
  auto s = parse_schedule(R"({"format":"remat-schedule-v1","order":[0,1e309]})");
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.status().message(),
              HasSubstr("schedule: bad JSON: number overflow parsing '1e309' at line 1"));
  s = parse_schedule(R"({"format":"remat-schedule-v1","order":[0,18446744073709551615]})");
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.status().message(), HasSubstr("step 1 is not a valid node id"));
  // get<int> wrapped this to 0, a valid step.
  s = parse_schedule(R"({"format":"remat-schedule-v1","order":[0],"backward_start":4294967296})");
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.status().message(), HasSubstr("'backward_start' is not an int"));
  s = parse_schedule(R"({"format":"remat-schedule-v1","order":[0],"backward_start":2})");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->backward_start, 2);
}

TEST(ScheduleIo, FileErrorsNameThePath) {
  const std::string path = ::testing::TempDir() + "/schedule_test_bad.json";
  std::ofstream(path) << R"({"format":"remat-schedule-v1","order":[0,-3]})";
  auto s = read_schedule_file(path);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().message(), path + ": schedule: step 1 is not a valid node id");
  EXPECT_EQ(read_schedule_file("/nonexistent/s.json").status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace remat
