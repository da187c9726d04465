#include <filesystem>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "remat/graph.h"
#include "tests/support/test_graphs.h"

namespace remat {
namespace {

using ::testing::HasSubstr;
using json = nlohmann::json;

json small_graph() {
  return json::parse(R"({"format":"remat-graph-v1","name":"tiny","source":"test",
    "nodes":[
      {"id":0,"name":"x","op":"placeholder","kind":"input","phase":"forward","bytes":4,"cost":0,"inputs":[]},
      {"id":1,"name":"relu","op":"aten.relu","kind":"compute","phase":"forward","bytes":8,"cost":2.5,"inputs":[0]},
      {"id":2,"name":"t","op":"aten.t","kind":"view","phase":"forward","bytes":8,"cost":0,"inputs":[1],"group":2},
      {"id":3,"name":"grad","op":"aten.mul","kind":"compute","phase":"backward","bytes":4,"cost":1,"inputs":[2,1,1],
       "recomputable":false,"pytorch_banned":true}],
    "outputs":[3]})");
}

std::string error_of(const json& j) {
  auto g = parse_graph(j.dump());
  EXPECT_FALSE(g.ok());
  return g.ok() ? "" : std::string(g.status().message());
}

TEST(GraphIo, ParsesFieldsAndKeepsNamesAndOps) {
  auto g = parse_graph(small_graph().dump());
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
  auto g = parse_graph(small_graph().dump());
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

TEST(GraphIo, WholeGroupsRoundTripAndMustBeABoolean) {
  auto g = parse_graph(small_graph().dump());
  ASSERT_TRUE(g.ok());
  EXPECT_FALSE(g->whole_groups);
  g->whole_groups = true;
  auto again = parse_graph(write_graph(*g));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->whole_groups);
  nlohmann::json doc = small_graph();
  doc["whole_groups"] = "yes";
  auto bad = parse_graph(doc.dump());
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), ::testing::HasSubstr("'whole_groups'"));
}

TEST(GraphIo, RejectsBadJson) {
  auto g = parse_graph("{\"format\": \"remat-graph-v1\", \"nodes\": [");
  ASSERT_FALSE(g.ok());
  EXPECT_THAT(g.status().message(), HasSubstr("bad JSON"));
}

TEST(GraphIo, RejectsWrongFormat) {
  json j = small_graph();
  j["format"] = "something-else";
  EXPECT_THAT(error_of(j), HasSubstr("format"));
}

TEST(GraphIo, RejectsUnknownInputIdNamingTheNode) {
  json j = small_graph();
  j["nodes"][2]["inputs"] = {1, 17};
  std::string e = error_of(j);
  EXPECT_THAT(e, HasSubstr("node 2 ('t')"));
  EXPECT_THAT(e, HasSubstr("unknown node id 17"));
  j["nodes"][2]["inputs"] = {-1};
  EXPECT_THAT(error_of(j), HasSubstr("unknown node id -1"));
}

TEST(GraphIo, RejectsIdsNotInTopologicalOrder) {
  json j = small_graph();
  j["nodes"][1]["inputs"] = {2};  // node 1 reads node 2, listed after it; no cycle
  j["nodes"][2]["inputs"] = {0};
  std::string e = error_of(j);
  EXPECT_THAT(e, HasSubstr("node 1 ('relu')"));
  EXPECT_THAT(e, HasSubstr("topological"));
}

TEST(GraphIo, RejectsIdNotEqualToIndex) {
  json j = small_graph();
  j["nodes"][2]["id"] = 5;
  EXPECT_THAT(error_of(j), HasSubstr("node 2 ('t') has id 5"));
}

TEST(GraphIo, RejectsCyclesNamingANodeOnTheCycle) {
  json j = small_graph();
  j["nodes"][1]["inputs"] = {0, 2};  // 1 -> 2 -> 1
  std::string e = error_of(j);
  EXPECT_THAT(e, HasSubstr("cycle"));
  EXPECT_TRUE(e.find("node 1") != std::string::npos || e.find("node 2") != std::string::npos) << e;
  j = small_graph();
  j["nodes"][3]["inputs"] = {3};  // self-loop
  EXPECT_THAT(error_of(j), HasSubstr("cycle through node 3 ('grad')"));
}

TEST(GraphIo, RejectsNegativeAndOverflowingSizes) {
  json j = small_graph();
  j["nodes"][1]["bytes"] = -8;
  std::string e = error_of(j);
  EXPECT_THAT(e, HasSubstr("node 1 ('relu')"));
  EXPECT_THAT(e, HasSubstr("negative"));
  j["nodes"][1]["bytes"] = 18446744073709551615ULL;
  EXPECT_THAT(error_of(j), HasSubstr("overflow"));
  j["nodes"][1]["bytes"] = 1e30;
  EXPECT_THAT(error_of(j), HasSubstr("overflow"));
  j["nodes"][1]["bytes"] = 2.5;
  EXPECT_THAT(error_of(j), HasSubstr("whole number"));
  // Each size fits, but their sum does not.
  j = small_graph();
  j["nodes"][1]["bytes"] = 9000000000000000000LL;
  j["nodes"][2]["bytes"] = 9000000000000000000LL;
  e = error_of(j);
  EXPECT_THAT(e, HasSubstr("node 2 ('t')"));
  EXPECT_THAT(e, HasSubstr("overflow"));
}

TEST(GraphIo, RejectsBadFieldTypesNamingTheNode) {
  json j = small_graph();
  j["nodes"][1]["kind"] = "banana";
  EXPECT_THAT(error_of(j), HasSubstr("node 1 ('relu'): unknown kind 'banana'"));
  j = small_graph();
  j["nodes"][1]["cost"] = -1;
  EXPECT_THAT(error_of(j), HasSubstr("node 1 ('relu')"));
  j = small_graph();
  j["nodes"][1].erase("bytes");
  EXPECT_THAT(error_of(j), HasSubstr("node 1 ('relu'): missing field 'bytes'"));
  j = small_graph();
  j["nodes"][0]["inputs"] = {1};
  EXPECT_FALSE(parse_graph(j.dump()).ok());
  j = small_graph();
  j["nodes"] = 3;
  EXPECT_THAT(error_of(j), HasSubstr("nodes"));
}

// Issue 23: remat-plan and remat-compare aborted on this (nlohmann reports a number beyond a
// double as out_of_range, which escaped parse_graph).
TEST(GraphIo, RejectsANumberBeyondADoubleWithItsPosition) {
  std::string text = small_graph().dump();
  const std::size_t at = text.find("\"bytes\":8");
  ASSERT_NE(at, std::string::npos);
  text.replace(at, 9, "\"bytes\":1e309");
  absl::StatusOr<Graph> g;
  ASSERT_NO_THROW(g = parse_graph(text));
  ASSERT_FALSE(g.ok());
  EXPECT_THAT(g.status().message(),
              HasSubstr("bad JSON: number overflow parsing '1e309' at line 1"));
  const std::string path = ::testing::TempDir() + "/graph_test_1e309.json";
  std::ofstream(path) << text;
  ASSERT_NO_THROW(g = read_graph_file(path));
  ASSERT_FALSE(g.ok());
  EXPECT_THAT(g.status().message(), HasSubstr(path + ": bad JSON: number overflow"));
}

// Issue 23: accepted silently before. The outputs of one operator are made together.
TEST(GraphIo, RejectsAGroupMemberReadingAnotherMember) {
  json j = small_graph();
  j["nodes"][1]["group"] = 2;  // node 2 ('t', group 2) reads node 1
  EXPECT_THAT(error_of(j), HasSubstr("node 2 ('t') reads node 1 ('relu') of its own group 2"));
  Graph g = *parse_graph(small_graph().dump());
  g.nodes[1].group = 2;
  EXPECT_FALSE(validate_graph(g).ok());
  g.nodes[1].group = 3;  // members of different groups may read each other
  EXPECT_TRUE(validate_graph(g).ok());
}

// Integers past int64 are kept unsigned by nlohmann; read as int64 they wrapped to -1.
TEST(GraphIo, RejectsIntegersOutOfRangeNamingThem) {
  json j = small_graph();
  j["nodes"][2]["id"] = 18446744073709551615ULL;
  EXPECT_THAT(error_of(j), HasSubstr("node 2 ('t'): 'id' is out of range"));
  j = small_graph();
  j["nodes"][2]["inputs"] = {18446744073709551615ULL};
  EXPECT_THAT(error_of(j), HasSubstr("node 2 ('t') reads unknown node id 18446744073709551615"));
  j = small_graph();
  j["nodes"][2]["group"] = 18446744073709551615ULL;
  EXPECT_THAT(error_of(j), HasSubstr("node 2 ('t'): 'group' is out of range"));
  j = small_graph();
  j["outputs"] = {9223372036854775808ULL};
  EXPECT_THAT(error_of(j), HasSubstr("output id 9223372036854775808 names no node"));
}

// The peer figures are informational, but a double out of int64's range was converted to
// int64 anyway (undefined behaviour): now it is skipped like a field of the wrong type.
TEST(GraphIo, SkipsPeerFiguresOutOfRange) {
  json j = small_graph();
  j["peer"] = {{"pytorch_mincut_saved_bytes", 1e300},
               {"pytorch_default_saved_bytes", 1024.0},
               {"pytorch_mincut_saved", {1, 18446744073709551615ULL, -4}}};
  auto g = parse_graph(j.dump());
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_FALSE(g->peer.pytorch_mincut_saved_bytes.has_value());
  EXPECT_EQ(g->peer.pytorch_default_saved_bytes, 1024);
  EXPECT_EQ(g->peer.pytorch_mincut_saved, (std::vector<int>{1}));
}

TEST(GraphIo, ErrorsStayOnOneLine) {
  json j = small_graph();
  j["nodes"][1]["name"] = "two\nlines";
  j["nodes"][1]["kind"] = "banana";
  EXPECT_THAT(error_of(j), HasSubstr("node 1 ('two\\nlines'): unknown kind"));
}

TEST(GraphIo, ValidateGraphChecksGraphsBuiltInCode) {
  Graph g = testing::linear_graph(3);
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
  std::string dir = testing::shared_graphs_dir();
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
