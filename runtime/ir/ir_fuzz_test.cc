// Mutation fuzzing of the graph and schedule parsers (tests/support/fuzz_mutator.h): every mutated
// file either parses into something the rest of remat::ir accepts (validate_graph, the
// simulator, the writer, the DTR program of a graph) or is rejected with a one-line error;
// nothing throws, aborts or crashes, and no case takes 10 s. Seeds: ../shared/graphs/*.json,
// as they are (one line) and as write_graph writes them (one field a line), and schedules of
// those graphs. Besides text mutations, graph cases edit the parsed document: a field set to
// an edge value, an input pointing anywhere, a node made a member of its input's group, nodes
// dropped, copied or swapped.
//
// REMAT_FUZZ_SCALE=F runs F times the default number of cases (a fraction under sanitizers);
// REMAT_FUZZ_ONLY=K runs case K alone and writes its input to the test's temporary directory.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "remat/dtr_trace.h"
#include "remat/graph.h"
#include "remat/graph_transforms.h"
#include "remat/schedule.h"
#include "tests/support/fuzz_mutator.h"
#include "tests/support/test_graphs.h"

namespace remat {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using testing::case_seed;
using testing::CrashContext;
using testing::FuzzOptions;
using testing::Mutator;

constexpr double kCaseLimitSeconds = 10.0;

struct Seed {
  std::string name;
  std::string text;
  Graph graph;  // the seed's graph (for schedules: the graph they order)
};

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Every shared graph, as a file holds it and as write_graph writes it.
const std::vector<Seed>& graph_seeds() {
  static const std::vector<Seed>* seeds = [] {
    auto* s = new std::vector<Seed>;
    const std::string dir = testing::shared_graphs_dir();
    if (dir.empty()) return s;
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(dir))
      if (e.path().extension() == ".json") files.push_back(e.path());
    std::sort(files.begin(), files.end());
    for (const fs::path& p : files) {
      const std::string text = read_all(p);
      absl::StatusOr<Graph> g = parse_graph(text);
      if (!g.ok()) continue;  // graph_test reports a shared graph that does not parse
      s->push_back({p.filename().string(), text, *g});
      s->push_back({p.filename().string() + " (rewritten)", write_graph(*g), *g});
    }
    return s;
  }();
  return *seeds;
}

// Edits the parsed graph where the text mutations rarely reach: the structure.
std::string mutate_graph_document(json& doc, Mutator& m) {
  if (!doc.is_object() || !doc.contains("nodes") || !doc["nodes"].is_array() ||
      doc["nodes"].empty())
    return "no nodes to edit";
  json& nodes = doc["nodes"];
  const std::size_t n = nodes.size();
  const std::size_t i = m.below(n);
  json& node = nodes[i];
  auto edge_value = [&]() -> json {
    switch (m.below(9)) {
      case 0:
        return -1;
      case 1:
        return std::numeric_limits<std::uint64_t>::max();
      case 2:
        return std::uint64_t{1} << 63;
      case 3:
        return 9.3e18;
      case 4:
        return 1.5;
      case 5:
        return "7";
      case 6:
        return nullptr;
      case 7:
        return json::array({0});
      default:
        return static_cast<std::int64_t>(m.below(n + 2));
    }
  };
  static const char* kFields[] = {"id",    "bytes",        "cost", "inputs", "group",  "kind",
                                  "phase", "recomputable", "site", "flops",  "outputs"};
  switch (m.below(8)) {
    case 0: {
      const char* field = kFields[m.below(std::size(kFields))];
      if (std::string(field) == "outputs") {
        doc["outputs"] = json::array({edge_value()});
      } else {
        node[field] = edge_value();
      }
      return absl::StrCat(
          "node ", i, ".", field, " = ",
          std::string(field) == "outputs" ? doc["outputs"].dump() : node[field].dump());
    }
    case 1: {  // an input pointing anywhere: itself, a later node, none
      const std::int64_t u = static_cast<std::int64_t>(m.below(n + 1)) - (m.one_in(8) ? 1 : 0);
      if (!node["inputs"].is_array()) node["inputs"] = json::array();
      node["inputs"].push_back(u);
      return absl::StrCat("node ", i, " reads ", u);
    }
    case 2: {  // a member of the group of a node it reads (or that reads it)
      if (!node.contains("inputs") || !node["inputs"].is_array() || node["inputs"].empty())
        return "no input to join";
      const json& u = node["inputs"][m.below(node["inputs"].size())];
      if (!u.is_number_unsigned() || u.get<std::uint64_t>() >= n) return "odd input";
      const std::int64_t group = 1000000 + static_cast<std::int64_t>(i);
      node["group"] = group;
      nodes[u.get<std::size_t>()]["group"] = group;
      return absl::StrCat("node ", i, " joins the group of its input ", u.dump());
    }
    case 3: {
      nodes.erase(i);
      return absl::StrCat("drop node ", i);
    }
    case 4: {
      json copy = node;
      nodes.insert(nodes.begin() + static_cast<std::ptrdiff_t>(m.below(n + 1)), copy);
      return absl::StrCat("copy node ", i);
    }
    case 5: {
      const std::size_t j = m.below(n);
      std::swap(nodes[i], nodes[j]);
      return absl::StrCat("swap nodes ", i, " and ", j);
    }
    case 6: {
      doc["peer"] = json::object({{"pytorch_mincut_saved_bytes", edge_value()},
                                  {"pytorch_default_saved_bytes", 1e300},
                                  {"pytorch_mincut_saved", json::array({edge_value()})}});
      return absl::StrCat("peer = ", doc["peer"].dump());
    }
    default: {
      node["bytes"] = static_cast<std::int64_t>(std::numeric_limits<std::int64_t>::max() / 2);
      return absl::StrCat("node ", i, " bytes = INT64_MAX / 2");
    }
  }
}

// An error must be one line.
void expect_one_line(const absl::Status& status, const std::string& where) {
  EXPECT_EQ(status.message().find('\n'), std::string::npos) << where << ": " << status;
}

// What a graph that parsed must allow.
void check_parsed_graph(const Graph& g, const std::string& where) {
  ASSERT_TRUE(validate_graph(g).ok()) << where << ": " << validate_graph(g);
  absl::StatusOr<Graph> again = parse_graph(write_graph(g));
  ASSERT_TRUE(again.ok()) << where << ": " << again.status();
  EXPECT_EQ(again->size(), g.size()) << where;
  // The file order is a topological order: computing every node once is a valid schedule.
  Schedule s;
  for (int v = 0; v < g.size(); ++v) s.order.push_back(v);
  const SimResult r = simulate(g, s);
  EXPECT_TRUE(r.valid) << where << ": " << r.error;
  // The DTR program of the graph is a valid trace when its sizes fit a trace's limit.
  std::uint64_t total = 0;
  for (const Node& node : g.nodes) total += static_cast<std::uint64_t>(node.bytes);
  if (total <= kMaxTraceBytes) {
    const DtrTrace program = dtr_trace_from_graph(g);
    EXPECT_TRUE(validate_dtr_trace(program).ok()) << where << ": " << validate_dtr_trace(program);
  }
}

template <typename Check>
void timed(const std::string& where, Check check, double& slowest) {
  CrashContext::set(where);
  const auto start = std::chrono::steady_clock::now();
  try {
    check();
  } catch (const std::exception& e) {
    ADD_FAILURE() << where << ": threw " << e.what();
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  slowest = std::max(slowest, seconds);
  EXPECT_LT(seconds, kCaseLimitSeconds) << where;
}

void dump(const FuzzOptions& opt, const std::string& name, const std::string& where,
          const std::string& input) {
  if (!opt.only) return;
  const fs::path out = fs::path(::testing::TempDir()) / name;
  std::ofstream(out, std::ios::binary) << input;
  std::cerr << where << "\n  input written to " << out << "\n";
}

TEST(GraphFuzz, MutatedGraphsParseOrFailCleanly) {
  const std::vector<Seed>& seeds = graph_seeds();
  if (seeds.empty()) GTEST_SKIP() << "../shared/graphs is absent";
  const FuzzOptions opt = FuzzOptions::from_env(3000);
  int parsed = 0, rejected = 0;
  double slowest = 0;
  for (int i = 0; i < opt.end(); ++i) {
    if (!opt.runs(i)) continue;
    const Seed& seed = seeds[static_cast<std::size_t>(i) % seeds.size()];
    Mutator m(case_seed(0x6a0f0001, static_cast<std::uint64_t>(i)));
    std::string log, input;
    if (m.one_in(2)) {
      json doc = json::parse(seed.text);
      log = mutate_graph_document(doc, m);
      if (m.one_in(3)) log += "; " + mutate_graph_document(doc, m);
      input = doc.dump();
    } else {
      input = m.mutate(seed.text, &log);
    }
    const std::string where = absl::StrCat("case ", i, " (", seed.name, ": ", log, ")");
    dump(opt, absl::StrCat("graph_fuzz_", i, ".json"), where, input);
    timed(
        where,
        [&] {
          absl::StatusOr<Graph> g = parse_graph(input);
          if (g.ok()) {
            ++parsed;
            check_parsed_graph(*g, where);
          } else {
            ++rejected;
            expect_one_line(g.status(), where);
          }
        },
        slowest);
    if (::testing::Test::HasFailure() && !opt.only) break;
  }
  std::cout << parsed << " mutated graphs parsed, " << rejected << " rejected; slowest case "
            << slowest << " s\n";
}

TEST(ScheduleFuzz, MutatedSchedulesParseOrFailCleanly) {
  const std::vector<Seed>& graphs = graph_seeds();
  if (graphs.empty()) GTEST_SKIP() << "../shared/graphs is absent";
  // Per graph: computing every node once in file order, and that order with recomputations
  // and a backward start.
  std::vector<Seed> seeds;
  for (std::size_t k = 0; k < graphs.size(); k += 2) {
    const Graph& g = graphs[k].graph;
    Schedule once{g.name, {}};
    for (int v = 0; v < g.size(); ++v) once.order.push_back(v);
    seeds.push_back({g.name + " once", write_schedule(once), g});
    Schedule again = once;
    for (int v = 0; v < g.size(); v += 3) again.order.push_back(v);
    again.backward_start = g.size() / 2;
    seeds.push_back({g.name + " with recomputation", write_schedule(again), g});
  }
  const FuzzOptions opt = FuzzOptions::from_env(3000);
  int parsed = 0, rejected = 0;
  double slowest = 0;
  for (int i = 0; i < opt.end(); ++i) {
    if (!opt.runs(i)) continue;
    const Seed& seed = seeds[static_cast<std::size_t>(i) % seeds.size()];
    Mutator m(case_seed(0x5c4ed001, static_cast<std::uint64_t>(i)));
    std::string log;
    const std::string input = m.mutate(seed.text, &log);
    const std::string where = absl::StrCat("case ", i, " (", seed.name, ": ", log, ")");
    dump(opt, absl::StrCat("schedule_fuzz_", i, ".json"), where, input);
    timed(
        where,
        [&] {
          absl::StatusOr<Schedule> s = parse_schedule(input);
          if (!s.ok()) {
            ++rejected;
            expect_one_line(s.status(), where);
            return;
          }
          ++parsed;
          absl::StatusOr<Schedule> back = parse_schedule(write_schedule(*s));
          ASSERT_TRUE(back.ok()) << where << ": " << back.status();
          EXPECT_EQ(back->order, s->order) << where;
          // The simulator judges any order against the graph, and never fails otherwise.
          const SimResult r = simulate(seed.graph, *s);
          if (r.valid) {
            EXPECT_GE(r.peak_bytes, 0) << where;
          } else {
            EXPECT_FALSE(r.error.empty()) << where;
          }
          const SimResult budgeted = simulate(seed.graph, *s, r.peak_bytes / 2);
          if (r.valid && r.peak_bytes > 0) {
            EXPECT_FALSE(budgeted.valid) << where;
          }
        },
        slowest);
    if (::testing::Test::HasFailure() && !opt.only) break;
  }
  std::cout << parsed << " mutated schedules parsed, " << rejected << " rejected; slowest case "
            << slowest << " s\n";
}

}  // namespace
}  // namespace remat
