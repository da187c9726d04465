#include "tools/compare/compare.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <boost/property_tree/ptree.hpp>
#include <boost/property_tree/xml_parser.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "remat/graph_transforms.h"
#include "remat/planner.h"
#include "remat/replay.h"
#include "remat/schedule.h"
#include "remat/static_replay.h"
#include "tests/support/random_order.h"
#include "tests/support/test_graphs.h"

namespace remat::compare {
namespace {

// A forward chain with a skip connection every few layers and its mirrored backward: the
// shape of a small training step, with every value of the forward read again by the backward.
// With `branches`, every third layer also makes a side value only its backward reads (as
// batch norm's statistics are), which a schedule may compute at either end. With
// `weight_grads`, every backward layer also makes a result nothing in the step reads (a
// weight's gradient), which a plan frees at its own step.
Graph training_like_graph(int layers, std::uint64_t seed, bool branches = false,
                          bool weight_grads = false) {
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
  std::vector<int> side(static_cast<std::size_t>(layers), -1);
  int prev = x;
  for (int i = 0; i < layers; ++i) {
    std::vector<int> in = {prev};
    if (i >= 3 && i % 3 == 0) in.push_back(fwd[static_cast<std::size_t>(i - 3)]);
    prev = add(NodeKind::kCompute, Phase::kForward, 1000 + static_cast<std::int64_t>(rng() % 4000),
               1 + static_cast<double>(rng() % 9), in);
    fwd.push_back(prev);
    if (branches && i % 3 == 1)
      side[static_cast<std::size_t>(i)] =
          add(NodeKind::kCompute, Phase::kForward, 500 + static_cast<std::int64_t>(rng() % 3000),
              1 + static_cast<double>(rng() % 4), {prev});
  }
  int grad = add(NodeKind::kCompute, Phase::kBackward, 1000, 1, {prev});
  for (int i = layers - 1; i >= 0; --i) {
    std::vector<int> in = {grad, fwd[static_cast<std::size_t>(i)]};
    if (i > 0) in.push_back(fwd[static_cast<std::size_t>(i - 1)]);
    if (side[static_cast<std::size_t>(i)] >= 0) in.push_back(side[static_cast<std::size_t>(i)]);
    grad = add(NodeKind::kCompute, Phase::kBackward, 1000 + static_cast<std::int64_t>(rng() % 2000),
               2, in);
    if (weight_grads)
      g.outputs.push_back(add(NodeKind::kCompute, Phase::kBackward,
                              800 + static_cast<std::int64_t>(rng() % 1600), 1,
                              {grad, fwd[static_cast<std::size_t>(i)]}));
  }
  g.outputs.push_back(grad);
  return g;
}

using boost::property_tree::ptree;

int count_tag(const ptree& node, const std::string& tag) {
  int n = 0;
  for (const auto& [name, child] : node) {
    if (name == tag) ++n;
    n += count_tag(child, tag);
  }
  return n;
}

TEST(Compare, RendersAPlotAndTimelinesThatParse) {
  const Graph g = hold_inputs(training_like_graph(24, 3));
  CompareOptions o;
  o.fractions = {1.0, 0.6, 0.4};
  o.planners = {"chen", "twremat", "checkmate"};
  o.planner_time_limit = 5;
  o.policies = {"dtr", "msps"};
  // One per process: test runs on one machine must not share it.
  const auto dir =
      std::filesystem::temp_directory_path() / ("remat_compare_test_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  o.timeline_dir = dir.string();
  o.all_timelines = true;
  const CompareReport r = run_comparison(g, o);
  ASSERT_GT(r.baseline_peak, 0);

  // The plot: one polyline per method, and well-formed XML.
  const std::vector<PlotSeries> series = overhead_series(r);
  ASSERT_EQ(series.size(), 3u + 2u + 1u);  // planners, policies, hinted
  std::istringstream svg(render_overhead_plot(series, {.title = "small"}));
  ptree tree;
  ASSERT_NO_THROW(boost::property_tree::read_xml(svg, tree));
  EXPECT_EQ(count_tag(tree, "polyline"), 6);

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
    const Graph g = hold_inputs(training_like_graph(30, seed));
    CompareOptions o;
    o.fractions = {0.7, 0.5, 0.35};
    o.planners = {"chen", "twremat", "greedy", "rotor"};
    o.planner_time_limit = 5;
    o.policies = {"dtr"};
    const CompareReport r = run_comparison(g, o);
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

// Note [Following a schedule]: hints made from a plan, followed by `hinted` on the graph's
// program under a budget of the plan's own predicted peak, cost exactly what the plan costs
// and never make DTR search.
TEST(Compare, HintedFollowsAPlanExactly) {
  int checked = 0;
  for (std::uint64_t seed : {1, 2, 3, 4}) {
    const Graph g = hold_inputs(training_like_graph(30, seed));
    const DtrTrace program = dtr_trace_from_graph(g);
    Schedule in_order{.graph = g.name, .order = {}};
    for (int v = 0; v < g.size(); ++v) in_order.order.push_back(v);
    const std::int64_t peak = simulate(g, in_order).peak_bytes;
    for (double f : {0.8, 0.6, 0.45}) {
      for (const std::string algo : {"chen", "greedy", "rotor", "twremat"}) {
        PlanOptions po;
        po.budget_bytes = static_cast<std::int64_t>(f * static_cast<double>(peak));
        absl::StatusOr<Plan> plan = run_planner(algo, g, po);
        ASSERT_TRUE(plan.ok()) << plan.status();
        if (!plan->feasible) continue;
        ReplayOptions ro;
        ro.policy = "hinted";
        ro.accounting = Accounting::kLogical;
        ro.budget = static_cast<std::size_t>(plan->sim.peak_bytes);
        ro.hints = std::make_shared<StepHints>(
            hints_from_schedule(g, plan->schedule, trace_sites(g), algo));
        const ReplayResult r = replay(program, ro);
        ASSERT_EQ(r.status, "ok") << algo << " @ " << f << " seed " << seed << ": " << r.error;
        EXPECT_NEAR(r.overhead, plan->sim.overhead, 1e-6) << algo << " @ " << f << " seed " << seed;
        EXPECT_LE(static_cast<std::int64_t>(r.peak_allocated_bytes), plan->sim.peak_bytes);
        EXPECT_EQ(r.evictions, r.hint_evictions) << "DTR searched: memory left the plan's profile";
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 20);
}

// A plan with offloads, followed: the runtime sends each instance to the host, brings it
// back and waits for the copies where the plan says (PlanStep::offload_before,
// prefetch_before, copy_after), so that under a budget of the plan's own peak it costs what
// simulate() says, copies' waits included, and never makes DTR search.
TEST(Compare, HintedFollowsOffloadsExactly) {
  std::size_t offloads = 0;
  for (std::uint64_t seed = 1; seed <= 8; ++seed) {
    const Graph g = hold_inputs(training_like_graph(12 + static_cast<int>(seed), seed));
    Schedule s{.graph = g.name, .order = {}};
    for (int v = 0; v < g.size(); ++v) s.order.push_back(v);
    s.offloads = testing::random_offloads(g, s.order, seed);
    const HostLink link{0.2 * static_cast<double>(seed), 1.0};
    const SimResult sim = simulate(g, s, std::nullopt, link);
    ASSERT_TRUE(sim.valid) << sim.error;
    ReplayOptions ro;
    ro.policy = "hinted";
    ro.accounting = Accounting::kLogical;
    ro.budget = static_cast<std::size_t>(sim.peak_bytes);
    ro.host_memory_bytes = static_cast<std::size_t>(sim.host_peak_bytes) + 1;
    // dtr_trace_from_graph scales the costs so that the dearest op takes a second: the link
    // is scaled with them.
    double max_cost = 0;
    for (const Node& n : g.nodes) max_cost = std::max(max_cost, n.cost);
    const double scale = 1e9 / max_cost;
    ro.host_link = HostLink{link.bytes_per_ns / scale, link.latency_ns * scale};
    ro.slowdown_cap = 1e6;  // the copies are slow beside these ops
    ro.hints = std::make_shared<StepHints>(hints_from_schedule(g, s, trace_sites(g), "random"));
    const ReplayResult r = replay(dtr_trace_from_graph(g), ro);
    ASSERT_EQ(r.status, "ok") << "seed " << seed << ": " << r.error;
    EXPECT_EQ(r.offloads, static_cast<std::size_t>(sim.offloads)) << "seed " << seed;
    EXPECT_NEAR(r.slowdown - 1, sim.overhead, 1e-6 * (1 + sim.overhead)) << "seed " << seed;
    EXPECT_LE(static_cast<std::int64_t>(r.peak_allocated_bytes), sim.peak_bytes);
    EXPECT_EQ(r.evictions, r.hint_evictions) << "DTR searched: memory left the plan's profile";
    offloads += r.offloads;
  }
  EXPECT_GT(offloads, 8u);
}

// Note [Groups that run whole]: a step whose op `split` makes two outputs, recorded, and a
// plan that computes the second output apart from the first (only where the backward op
// reads it). The runtime runs `split` whole at both places, so the plan costs the op twice,
// as simulate() says of a recorded graph; priced by shares it would look free.
TEST(Compare, APlanComputingOneOutputOfAnOpApartPaysForTheWholeOp) {
  std::istringstream text(R"({"ANNOTATION": "START", "INSTRUCTION": "ANNOTATE"}
{"INSTRUCTION": "CONSTANT", "NAME": "x1"}
{"INSTRUCTION": "MEMORY", "MEMORY": "1024", "NAME": "x1"}
{"ARGS": ["x1"], "INSTRUCTION": "CALL", "NAME": "f", "RESULT": ["x2"], "TIME": "100"}
{"INSTRUCTION": "MEMORY", "MEMORY": "1024", "NAME": "x2"}
{"ALIAS": "-1", "INSTRUCTION": "ALIAS", "NAME": "x2"}
{"ARGS": ["x2"], "INSTRUCTION": "CALL", "NAME": "split", "RESULT": ["x3", "x4"], "TIME": "300"}
{"INSTRUCTION": "MEMORY", "MEMORY": "1024", "NAME": "x3"}
{"ALIAS": "-1", "INSTRUCTION": "ALIAS", "NAME": "x3"}
{"INSTRUCTION": "MEMORY", "MEMORY": "8192", "NAME": "x4"}
{"ALIAS": "-1", "INSTRUCTION": "ALIAS", "NAME": "x4"}
{"ARGS": ["x3"], "INSTRUCTION": "CALL", "NAME": "g", "RESULT": ["x5"], "TIME": "100"}
{"INSTRUCTION": "MEMORY", "MEMORY": "1024", "NAME": "x5"}
{"ALIAS": "-1", "INSTRUCTION": "ALIAS", "NAME": "x5"}
{"INSTRUCTION": "RELEASE", "NAME": "x3"}
{"ANNOTATION": "BACKWARD", "INSTRUCTION": "ANNOTATE"}
{"ARGS": ["x5", "x4"], "INSTRUCTION": "CALL", "NAME": "h", "RESULT": ["x6"], "TIME": "100"}
{"INSTRUCTION": "MEMORY", "MEMORY": "1024", "NAME": "x6"}
{"ALIAS": "-1", "INSTRUCTION": "ALIAS", "NAME": "x6"}
{"INSTRUCTION": "RELEASE", "NAME": "x2"}
{"INSTRUCTION": "RELEASE", "NAME": "x4"}
{"INSTRUCTION": "RELEASE", "NAME": "x5"}
)");
  const absl::StatusOr<DtrTrace> trace = parse_dtr_trace(text, "split");
  ASSERT_TRUE(trace.ok()) << trace.status();
  const RecordedStep step = record_replay(*trace);
  ASSERT_TRUE(step.graph.whole_groups);
  const Graph g = hold_inputs(step.graph);
  int first = -1, second = -1;  // split's outputs
  for (const Node& n : g.nodes) {
    if (n.op == "split") (n.site_output == 0 ? first : second) = n.id;
  }
  ASSERT_GE(first, 0);
  ASSERT_GE(second, 0);
  ASSERT_TRUE(g.nodes[static_cast<std::size_t>(first)].group);
  // File order, but `second` moved to just before its reader.
  Schedule s{.graph = g.name, .order = {}};
  int reader = -1;
  for (const Node& n : g.nodes)
    if (n.op == "h") reader = n.id;
  for (int v = 0; v < g.size(); ++v) {
    if (v == second) continue;
    if (v == reader) s.order.push_back(second);
    s.order.push_back(v);
  }
  const SimResult sim = simulate(g, s);
  ASSERT_TRUE(sim.valid) << sim.error;
  EXPECT_NEAR(sim.cost - sim.base_cost, 300, 1e-9) << "split runs twice";
  ReplayOptions ro;
  ro.policy = "hinted";
  ro.accounting = Accounting::kLogical;
  // The runtime makes both outputs wherever split runs, and frees the one the plan does
  // not claim at once: room for it on top of the plan's peak.
  ro.budget =
      static_cast<std::size_t>(sim.peak_bytes + g.nodes[static_cast<std::size_t>(second)].bytes);
  ro.hints = std::make_shared<StepHints>(hints_from_schedule(g, s, recorded_sites(g), "apart"));
  const ReplayResult r = replay(*trace, ro);
  ASSERT_EQ(r.status, "ok") << r.error;
  EXPECT_NEAR(r.slowdown - 1, sim.overhead, 1e-9);
  EXPECT_EQ(r.recomputations, 1u);
  // Without whole groups the simulator charged the second output its share alone.
  Graph shares = g;
  shares.whole_groups = false;
  EXPECT_NEAR(simulate(shares, s).cost, sim.base_cost, 1e-9);
}

// The same for random valid schedules: a random topological order (so that ops the program
// calls early often come late, deferred) with random recomputations. Followed under a budget
// of the schedule's simulated peak, the runtime costs what simulate() says, exactly.
TEST(Compare, HintedFollowsRandomReorderedSchedulesExactly) {
  std::mt19937_64 rng(31);
  std::size_t deferred = 0;
  for (int trial = 0; trial < 12; ++trial) {
    const Graph g = hold_inputs(training_like_graph(20 + trial, rng(), /*branches=*/true,
                                                    /*weight_grads=*/trial % 2 == 1));
    Schedule s{.graph = g.name, .order = {}};
    const std::vector<std::vector<int>> users = g.users();
    std::vector<bool> placed(g.nodes.size(), false);
    // Recomputing a value none of whose readers is still to come is waste that the runtime
    // skips (the program has let go of it and no lineage needs it), so only values something
    // will still read are recomputed.
    auto still_read = [&](int v) {
      for (int u : users[static_cast<std::size_t>(v)])
        if (!placed[static_cast<std::size_t>(u)]) return true;
      return false;
    };
    for (int v : testing::random_topological_order(g, rng)) {
      s.order.push_back(v);
      placed[static_cast<std::size_t>(v)] = true;
      const int again = s.order[rng() % s.order.size()];
      const Node& n = g.nodes[static_cast<std::size_t>(again)];
      if (rng() % 3 == 0 && n.kind == NodeKind::kCompute && n.can_recompute() && still_read(again))
        s.order.push_back(again);
    }
    hold_inputs_to_the_end(g, s);  // as planners' plans are (see compare.cc)
    const SimResult sim = simulate(g, s);
    ASSERT_TRUE(sim.valid) << sim.error;
    ReplayOptions ro;
    ro.policy = "hinted";
    ro.accounting = Accounting::kLogical;
    ro.budget = static_cast<std::size_t>(sim.peak_bytes);
    ro.hints = std::make_shared<StepHints>(hints_from_schedule(g, s, trace_sites(g), "random"));
    const ReplayResult r = replay(dtr_trace_from_graph(g), ro);
    ASSERT_EQ(r.status, "ok") << "trial " << trial << ": " << r.error;
    EXPECT_NEAR(r.overhead, sim.overhead, 1e-6) << "trial " << trial;
    EXPECT_GT(sim.recomputations, 0);
    EXPECT_LE(static_cast<std::int64_t>(r.peak_allocated_bytes), sim.peak_bytes);
    EXPECT_EQ(r.evictions, r.hint_evictions) << "trial " << trial;
    deferred += r.deferred_ops;
  }
  EXPECT_GT(deferred, 0u) << "no random order made the runtime defer an op";
}

// The acceptance of `hinted` as a property: at every budget of a sweep over random
// training-like graphs, it fits wherever any static plan or dynamic policy fits, at or
// below the lowest overhead among them.
TEST(Compare, HintedIsAtOrBelowEveryOtherMethod) {
  for (std::uint64_t seed : {5, 6, 7}) {
    const Graph g = hold_inputs(training_like_graph(28, seed, /*branches=*/seed % 2 == 1));
    CompareOptions o;
    o.fractions = {0.9, 0.7, 0.55, 0.45, 0.35};
    o.planners = {"chen", "twremat", "greedy", "rotor", "mincut"};
    o.planner_time_limit = 5;
    o.policies = {"dtr", "dtr_eq", "msps", "lru"};
    const CompareReport r = run_comparison(g, o);
    for (double f : o.fractions) {
      double best = INFINITY;
      const RunRow* hinted = nullptr;
      for (const RunRow& row : r.rows) {
        if (row.fraction != f) continue;
        if (row.kind == "hinted") hinted = &row;
        if ((row.kind == "static" || row.kind == "dynamic") && row.status == "ok")
          best = std::min(best, row.overhead);
      }
      ASSERT_NE(hinted, nullptr);
      if (!std::isfinite(best)) continue;
      ASSERT_EQ(hinted->status, "ok") << "seed " << seed << " @ " << f << ": " << hinted->note;
      EXPECT_LE(hinted->overhead, best + 1e-6) << "seed " << seed << " @ " << f;
    }
  }
}

}  // namespace
}  // namespace remat::compare
