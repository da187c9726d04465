#include <map>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "remat/graph.h"
#include "remat/planner.h"
#include "remat/schedule.h"
#include "test_util.h"

namespace remat {
namespace {

using ::testing::HasSubstr;

Graph Diamond() {
  // 0 (100 bytes) feeds 1 and 3; 1 -> 2 -> 3. Unit sizes except node 0.
  Graph g = testing::RandomDag(4, 0, 1, 1);
  for (Node& n : g.nodes) { n.bytes = 1; n.cost = 1; n.inputs.clear(); }
  g.nodes[0].bytes = 100;
  g.nodes[0].cost = 7;
  g.nodes[1].inputs = {0};
  g.nodes[2].inputs = {1};
  g.nodes[3].inputs = {0, 2};
  return g;
}

TEST(Simulator, HandComputedProfileWithRecomputation) {
  Graph g = Diamond();
  Schedule s{g.name, {0, 1, 2, 0, 3}};
  // step0 {0}; step1 {0,1}; step2 {1,2} (first 0 dies after step1); step3 {2, 0'};
  // step4 {0', 2, 3}.
  EXPECT_EQ(MemoryProfile(g, s.order), (std::vector<int64_t>{100, 101, 2, 101, 102}));
  SimResult r = Simulate(g, s);
  ASSERT_TRUE(r.valid) << r.error;
  EXPECT_EQ(r.peak_bytes, 102);
  EXPECT_EQ(r.peak_step, 4);
  EXPECT_DOUBLE_EQ(r.cost, 7 + 1 + 1 + 7 + 1);
  EXPECT_DOUBLE_EQ(r.base_cost, 10);
  EXPECT_DOUBLE_EQ(r.overhead, 0.7);
  EXPECT_EQ(r.recomputations, 1);
}

TEST(Simulator, UnreadValueIsResidentOnlyAtItsStep) {
  Graph g = Diamond();
  g.nodes[3].inputs = {2};  // node 0 is read only by node 1 now
  Schedule s{g.name, {0, 1, 2, 3}};
  EXPECT_EQ(MemoryProfile(g, s.order), (std::vector<int64_t>{100, 101, 2, 2}));
}

TEST(Simulator, ReadUsesNewestInstance) {
  Graph g = Diamond();
  // 0 recomputed right after its first use: the first instance dies at step 1.
  Schedule s{g.name, {0, 1, 0, 2, 3}};
  EXPECT_EQ(MemoryProfile(g, s.order), (std::vector<int64_t>{100, 101, 101, 102, 102}));
}

TEST(Simulator, BudgetMakesScheduleInvalidWithReason) {
  Graph g = Diamond();
  Schedule s{g.name, {0, 1, 2, 3}};
  EXPECT_TRUE(Simulate(g, s, 102).valid);
  SimResult r = Simulate(g, s, 101);
  EXPECT_FALSE(r.valid);
  EXPECT_THAT(r.error, HasSubstr("exceeds the budget of 101"));
  EXPECT_EQ(r.peak_bytes, 102);
}

TEST(Simulator, RejectsReadBeforeAnyInstance) {
  Graph g = Diamond();
  SimResult r = Simulate(g, Schedule{g.name, {0, 2, 1, 3}});
  EXPECT_FALSE(r.valid);
  EXPECT_THAT(r.error, HasSubstr("step 1"));
  EXPECT_THAT(r.error, HasSubstr("reads node 1"));
}

TEST(Simulator, RejectsMissingUnknownAndRecomputedInputs) {
  Graph g = Diamond();
  EXPECT_THAT(Simulate(g, Schedule{g.name, {0, 1, 2}}).error, HasSubstr("node 3 ('n3') is never computed"));
  EXPECT_THAT(Simulate(g, Schedule{g.name, {0, 1, 9}}).error, HasSubstr("unknown node id 9"));
  g.nodes[0].kind = NodeKind::kInput;
  SimResult r = Simulate(g, Schedule{g.name, {0, 1, 2, 0, 3}});
  EXPECT_FALSE(r.valid);
  EXPECT_THAT(r.error, HasSubstr("computed a second time"));
  g.nodes[0].kind = NodeKind::kCompute;
  g.nodes[0].recomputable = false;
  EXPECT_FALSE(Simulate(g, Schedule{g.name, {0, 1, 2, 0, 3}}).valid);
}

TEST(Simulator, SavedBytesCountsForwardValuesReadByBackward) {
  Graph g = testing::LinearGraph(2);  // forward 0,1,2; backward 3 (reads 2,1), 4 (reads 3,0)
  g.nodes[0].bytes = 1;
  g.nodes[1].bytes = 10;
  g.nodes[2].bytes = 100;
  EXPECT_EQ(Simulate(g, Schedule{g.name, {0, 1, 2, 3, 4}}).saved_bytes, 111);
  // Recomputing 1 in the backward: only 0 and 2 are kept from the forward pass.
  EXPECT_EQ(Simulate(g, Schedule{g.name, {0, 1, 2, 1, 3, 4}}).saved_bytes, 101);
  // Graphs without a backward phase save nothing.
  Graph f = testing::RandomDag(5, 0.5, 3, 2);
  Schedule s{f.name, {0, 1, 2, 3, 4}};
  EXPECT_EQ(Simulate(f, s).saved_bytes, 0);
}

TEST(Simulator, EvictionHintsListEachInstanceOnceAtItsLastRead) {
  Graph g = Diamond();
  Schedule s{g.name, {0, 1, 2, 0, 3}};
  auto hints = EvictionHints(g, s);
  ASSERT_EQ(hints.size(), 5u);
  EXPECT_EQ(hints[0], (std::vector<int>{}));
  EXPECT_EQ(hints[1], (std::vector<int>{0}));  // first instance of 0: last read by 1
  EXPECT_EQ(hints[2], (std::vector<int>{1}));
  EXPECT_EQ(hints[3], (std::vector<int>{}));
  EXPECT_EQ(hints[4], (std::vector<int>{2, 0, 3}));
}

TEST(ScheduleIo, RoundTripsAndRejectsBadInput) {
  Schedule s{"g", {0, 1, 2, 0, 3}};
  auto back = ParseSchedule(WriteSchedule(s));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->graph, "g");
  EXPECT_EQ(back->order, s.order);
  EXPECT_FALSE(ParseSchedule("{").ok());
  EXPECT_FALSE(ParseSchedule(R"({"format":"remat-graph-v1","order":[]})").ok());
  auto bad = ParseSchedule(R"({"format":"remat-schedule-v1","graph":"g","order":[0,-3]})");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("step 1"));
}

TEST(Simulator, NoRematPeaksMatchFormatTable) {
  std::string dir = testing::SharedGraphsDir();
  if (dir.empty()) GTEST_SKIP() << "../shared/graphs is absent";
  const std::map<std::string, std::pair<int, int64_t>> table = {
      {"rlg_n100", {100, 46319}},           {"rlg_n250", {250, 146840}},
      {"cm_vgg16", {45, 15825108992}},       {"cm_mobilenet", {185, 34701056000}},
      {"mlp16", {288, 75501568}},            {"resnet18", {439, 112386560}},
      {"vgg11", {176, 1070458784}},          {"mobilenet_v2", {929, 223733792}},
      {"gpt_small", {717, 129092608}},       {"transformer_enc", {993, 199604224}},
  };
  for (const auto& [name, expect] : table) {
    auto g = ReadGraphFile(dir + "/" + name + ".json");
    ASSERT_TRUE(g.ok()) << g.status();
    EXPECT_EQ(g->size(), expect.first) << name;
    auto plan = RunPlanner("noremat", *g, PlanOptions{});
    ASSERT_TRUE(plan.ok());
    EXPECT_TRUE(plan->feasible) << name << ": " << plan->reason;
    EXPECT_EQ(plan->sim.peak_bytes, expect.second) << name;
    EXPECT_EQ(plan->sim.recomputations, 0);
    EXPECT_NEAR(plan->sim.overhead, 0.0, 1e-12);
  }
}

}  // namespace
}  // namespace remat
