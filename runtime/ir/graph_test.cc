#include <filesystem>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "remat/graph.h"
#include "runtime/ir/test_graphs.h"

namespace remat {
namespace {

using ::testing::HasSubstr;
using json = nlohmann::json;

json SmallGraph() {
  return json::parse(R"({"format":"remat-graph-v1","name":"tiny","source":"test",
    "nodes":[
      {"id":0,"name":"x","op":"placeholder","kind":"input","phase":"forward","bytes":4,"cost":0,"inputs":[]},
      {"id":1,"name":"relu","op":"aten.relu","kind":"compute","phase":"forward","bytes":8,"cost":2.5,"inputs":[0]},
      {"id":2,"name":"t","op":"aten.t","kind":"view","phase":"forward","bytes":8,"cost":0,"inputs":[1],"group":2},
      {"id":3,"name":"grad","op":"aten.mul","kind":"compute","phase":"backward","bytes":4,"cost":1,"inputs":[2,1,1],
       "recomputable":false,"pytorch_banned":true}],
    "outputs":[3]})");
}

std::string ErrorOf(const json& j) {
  auto g = parse_graph(j.dump());
  EXPECT_FALSE(g.ok());
  return g.ok() ? "" : std::string(g.status().message());
}

TEST(GraphIo, ParsesFieldsAndKeepsNamesAndOps) {
  auto g = parse_graph(SmallGraph().dump());
  ASSERT_TRUE(g.ok()) << g.status();
  ASSERT_EQ(g->size(), 4);
  EXPECT_EQ(g->name, "tiny");
  EXPECT_EQ(g->nodes[1].name, "relu");
  EXPECT_EQ(g->nodes[1].op, "aten.relu");
  EXPECT_EQ(g->nodes[0].kind, NodeKind::kInput);
  EXPECT_EQ(g->nodes[2].kind, NodeKind::kView);
  EXPECT_EQ(g->nodes[3].phase, Phase::kBackward);
  EXPECT_EQ(g->nodes[1].bytes, 8);
  EXPECT_DOUBLE_EQ(g->nodes[1].cost, 2.5);
  EXPECT_EQ(g->nodes[2].group, 2);
  EXPECT_FALSE(g->nodes[3].recomputable);
  EXPECT_TRUE(g->nodes[3].pytorch_banned);
  EXPECT_FALSE(g->nodes[3].can_recompute());
  EXPECT_FALSE(g->nodes[0].can_recompute());
  EXPECT_TRUE(g->nodes[1].can_recompute());
  EXPECT_EQ(g->nodes[3].inputs, (std::vector<int>{2, 1, 1}));
  auto users = g->users();
  EXPECT_EQ(users[1], (std::vector<int>{2, 3}));
  EXPECT_DOUBLE_EQ(g->total_cost(), 3.5);
}

TEST(GraphIo, WriteThenParseRoundTrips) {
  auto g = parse_graph(SmallGraph().dump());
  ASSERT_TRUE(g.ok());
  auto again = parse_graph(write_graph(*g));
  ASSERT_TRUE(again.ok()) << again.status();
  ASSERT_EQ(again->size(), g->size());
  for (int i = 0; i < g->size(); ++i) {
    const Node &a = g->nodes[i], &b = again->nodes[i];
    EXPECT_EQ(a.name, b.name);
    EXPECT_EQ(a.op, b.op);
    EXPECT_EQ(a.kind, b.kind);
    EXPECT_EQ(a.phase, b.phase);
    EXPECT_EQ(a.bytes, b.bytes);
    EXPECT_EQ(a.cost, b.cost);
    EXPECT_EQ(a.inputs, b.inputs);
    EXPECT_EQ(a.group, b.group);
    EXPECT_EQ(a.recomputable, b.recomputable);
    EXPECT_EQ(a.pytorch_banned, b.pytorch_banned);
  }
  EXPECT_EQ(again->outputs, g->outputs);
}

TEST(GraphIo, RejectsBadJson) {
  auto g = parse_graph("{\"format\": \"remat-graph-v1\", \"nodes\": [");
  ASSERT_FALSE(g.ok());
  EXPECT_THAT(g.status().message(), HasSubstr("bad JSON"));
}

TEST(GraphIo, RejectsWrongFormat) {
  json j = SmallGraph();
  j["format"] = "something-else";
  EXPECT_THAT(ErrorOf(j), HasSubstr("format"));
}

TEST(GraphIo, RejectsUnknownInputIdNamingTheNode) {
  json j = SmallGraph();
  j["nodes"][2]["inputs"] = {1, 17};
  std::string e = ErrorOf(j);
  EXPECT_THAT(e, HasSubstr("node 2 ('t')"));
  EXPECT_THAT(e, HasSubstr("unknown node id 17"));
  j["nodes"][2]["inputs"] = {-1};
  EXPECT_THAT(ErrorOf(j), HasSubstr("unknown node id -1"));
}

TEST(GraphIo, RejectsIdsNotInTopologicalOrder) {
  json j = SmallGraph();
  j["nodes"][1]["inputs"] = {2};  // node 1 reads node 2, listed after it; no cycle
  j["nodes"][2]["inputs"] = {0};
  std::string e = ErrorOf(j);
  EXPECT_THAT(e, HasSubstr("node 1 ('relu')"));
  EXPECT_THAT(e, HasSubstr("topological"));
}

TEST(GraphIo, RejectsIdNotEqualToIndex) {
  json j = SmallGraph();
  j["nodes"][2]["id"] = 5;
  EXPECT_THAT(ErrorOf(j), HasSubstr("node 2 ('t') has id 5"));
}

TEST(GraphIo, RejectsCyclesNamingANodeOnTheCycle) {
  json j = SmallGraph();
  j["nodes"][1]["inputs"] = {0, 2};  // 1 -> 2 -> 1
  std::string e = ErrorOf(j);
  EXPECT_THAT(e, HasSubstr("cycle"));
  EXPECT_TRUE(e.find("node 1") != std::string::npos || e.find("node 2") != std::string::npos) << e;
  j = SmallGraph();
  j["nodes"][3]["inputs"] = {3};  // self-loop
  EXPECT_THAT(ErrorOf(j), HasSubstr("cycle through node 3 ('grad')"));
}

TEST(GraphIo, RejectsNegativeAndOverflowingSizes) {
  json j = SmallGraph();
  j["nodes"][1]["bytes"] = -8;
  std::string e = ErrorOf(j);
  EXPECT_THAT(e, HasSubstr("node 1 ('relu')"));
  EXPECT_THAT(e, HasSubstr("negative"));
  j["nodes"][1]["bytes"] = 18446744073709551615ULL;
  EXPECT_THAT(ErrorOf(j), HasSubstr("overflow"));
  j["nodes"][1]["bytes"] = 1e30;
  EXPECT_THAT(ErrorOf(j), HasSubstr("overflow"));
  j["nodes"][1]["bytes"] = 2.5;
  EXPECT_THAT(ErrorOf(j), HasSubstr("whole number"));
  // Each size fits, but their sum does not.
  j = SmallGraph();
  j["nodes"][1]["bytes"] = 9000000000000000000LL;
  j["nodes"][2]["bytes"] = 9000000000000000000LL;
  e = ErrorOf(j);
  EXPECT_THAT(e, HasSubstr("node 2 ('t')"));
  EXPECT_THAT(e, HasSubstr("overflow"));
}

TEST(GraphIo, RejectsBadFieldTypesNamingTheNode) {
  json j = SmallGraph();
  j["nodes"][1]["kind"] = "banana";
  EXPECT_THAT(ErrorOf(j), HasSubstr("node 1 ('relu'): unknown kind 'banana'"));
  j = SmallGraph();
  j["nodes"][1]["cost"] = -1;
  EXPECT_THAT(ErrorOf(j), HasSubstr("node 1 ('relu')"));
  j = SmallGraph();
  j["nodes"][1].erase("bytes");
  EXPECT_THAT(ErrorOf(j), HasSubstr("node 1 ('relu'): missing field 'bytes'"));
  j = SmallGraph();
  j["nodes"][0]["inputs"] = {1};
  EXPECT_FALSE(parse_graph(j.dump()).ok());
  j = SmallGraph();
  j["nodes"] = 3;
  EXPECT_THAT(ErrorOf(j), HasSubstr("nodes"));
}

TEST(GraphIo, ValidateGraphChecksGraphsBuiltInCode) {
  Graph g = testing::LinearGraph(3);
  EXPECT_TRUE(validate_graph(g).ok());
  g.nodes[4].inputs.push_back(5);
  EXPECT_FALSE(validate_graph(g).ok());
}

TEST(GraphIo, MissingFileIsAnError) {
  auto g = read_graph_file("/nonexistent/graph.json");
  ASSERT_FALSE(g.ok());
  EXPECT_THAT(g.status().message(), HasSubstr("/nonexistent/graph.json"));
}

TEST(GraphIo, ReadsEverySharedGraph) {
  std::string dir = testing::SharedGraphsDir();
  if (dir.empty()) GTEST_SKIP() << "../shared/graphs is absent";
  int count = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().extension() != ".json") continue;
    auto g = read_graph_file(e.path().string());
    ASSERT_TRUE(g.ok()) << g.status();
    EXPECT_GT(g->size(), 0);
    EXPECT_EQ(g->name, e.path().stem().string());
    auto again = parse_graph(write_graph(*g));
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(again->size(), g->size());
    ++count;
  }
  EXPECT_EQ(count, 10);
}

}  // namespace
}  // namespace remat
