#include "tools/compare/compare.h"

#include <gtest/gtest.h>

#include <boost/property_tree/ptree.hpp>
#include <boost/property_tree/xml_parser.hpp>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "remat/static_replay.h"

namespace remat::compare {
namespace {

// A forward chain with a skip connection every few layers and its mirrored backward: the
// shape of a small training step, with every value of the forward read again by the backward.
Graph TrainingLikeGraph(int layers, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  Graph g;
  g.name = "small";
  auto add = [&](NodeKind kind, Phase phase, std::int64_t bytes, double cost,
                 std::vector<int> inputs) {
    Node n;
    n.id = g.size();
    n.name = absl::StrCat("n", n.id);
    n.op = kind == NodeKind::kInput ? "input" : absl::StrCat("op", n.id % 5);
    n.kind = kind;
    n.phase = phase;
    n.bytes = bytes;
    n.cost = cost;
    n.inputs = std::move(inputs);
    g.nodes.push_back(n);
    return n.id;
  };
  const int x = add(NodeKind::kInput, Phase::kForward, 1000, 0, {});
  std::vector<int> fwd;
  int prev = x;
  for (int i = 0; i < layers; ++i) {
    std::vector<int> in = {prev};
    if (i >= 3 && i % 3 == 0) in.push_back(fwd[static_cast<std::size_t>(i - 3)]);
    prev = add(NodeKind::kCompute, Phase::kForward, 1000 + static_cast<std::int64_t>(rng() % 4000),
               1 + static_cast<double>(rng() % 9), in);
    fwd.push_back(prev);
  }
  int grad = add(NodeKind::kCompute, Phase::kBackward, 1000, 1, {prev});
  for (int i = layers - 1; i >= 0; --i) {
    std::vector<int> in = {grad, fwd[static_cast<std::size_t>(i)]};
    if (i > 0) in.push_back(fwd[static_cast<std::size_t>(i - 1)]);
    grad = add(NodeKind::kCompute, Phase::kBackward, 1000 + static_cast<std::int64_t>(rng() % 2000),
               2, in);
  }
  g.outputs = {grad};
  return g;
}

using boost::property_tree::ptree;

int CountTag(const ptree& node, const std::string& tag) {
  int n = 0;
  for (const auto& [name, child] : node) {
    if (name == tag) ++n;
    n += CountTag(child, tag);
  }
  return n;
}

TEST(Compare, RendersAPlotAndTimelinesThatParse) {
  const Graph g = HoldInputs(TrainingLikeGraph(24, 3));
  CompareOptions o;
  o.fractions = {1.0, 0.6, 0.4};
  o.planners = {"chen", "twremat", "checkmate"};
  o.planner_time_limit = 5;
  o.policies = {"dtr", "msps"};
  const auto dir = std::filesystem::temp_directory_path() / "remat_compare_test";
  std::filesystem::remove_all(dir);
  o.timeline_dir = dir.string();
  o.all_timelines = true;
  const CompareReport r = RunComparison(g, o);
  ASSERT_GT(r.baseline_peak, 0);

  // The plot: one polyline per method, and well-formed XML.
  const std::vector<PlotSeries> series = OverheadSeries(r);
  ASSERT_EQ(series.size(), 3u + 2u + 1u);  // planners, policies, hinted
  std::istringstream svg(RenderOverheadPlot(series, {.title = "small"}));
  ptree tree;
  ASSERT_NO_THROW(boost::property_tree::read_xml(svg, tree));
  EXPECT_EQ(CountTag(tree, "polyline"), 6);

  // Every run that fits wrote a timeline, and each parses as a Chrome trace with op slices
  // and memory counters whose allocated bytes never pass the budget... for dynamic runs.
  int timelines = 0;
  for (const RunRow& row : r.rows) {
    if (row.kind == "none" || row.status != "ok") continue;
    ASSERT_FALSE(row.timeline.empty()) << row.method << " @ " << row.fraction;
    std::ifstream in(row.timeline);
    const nlohmann::json j = nlohmann::json::parse(in);
    int slices = 0, counters = 0;
    for (const auto& e : j.at("traceEvents")) {
      slices += e.at("ph") == "X";
      if (e.at("ph") == "C") {
        ++counters;
        if (row.kind != "static") {
          EXPECT_LE(e.at("args").at("allocated").get<std::size_t>(), row.budget);
        }
      }
    }
    EXPECT_GE(slices, g.size() - 2) << row.timeline;  // every op ran (inputs are constants)
    EXPECT_GT(counters, 0);
    ++timelines;
  }
  EXPECT_GT(timelines, 6);
  std::filesystem::remove_all(dir);
}

// A static plan replayed by the runtime peaks exactly where the planner's simulator says, in
// logical accounting; in allocator accounting the difference is the allocator's.
TEST(Compare, StaticReplayReproducesThePlannersPeak) {
  for (std::uint64_t seed : {1, 2, 3}) {
    const Graph g = HoldInputs(TrainingLikeGraph(30, seed));
    CompareOptions o;
    o.fractions = {0.7, 0.5, 0.35};
    o.planners = {"chen", "twremat", "greedy", "rotor"};
    o.planner_time_limit = 5;
    o.policies = {"dtr"};
    const CompareReport r = RunComparison(g, o);
    int checked = 0;
    for (const RunRow& row : r.rows) {
      if (row.kind != "static" || row.status != "ok") continue;
      EXPECT_EQ(static_cast<std::int64_t>(row.peak_logical), row.predicted_peak)
          << row.method << " @ " << row.fraction;
      EXPECT_GE(static_cast<std::int64_t>(row.peak_reserved), row.predicted_peak);
      ++checked;
    }
    EXPECT_GT(checked, 4);
  }
}

}  // namespace
}  // namespace remat::compare
