// remat-compare: static plans against dynamic policies on one program, over a budget sweep.
//
//   remat-compare ../shared/graphs/resnet18.json --out compare-out
//   remat-compare ../shared/traces/dtr/resnet32.log --budgets 0.5,0.4,0.3
//   remat-compare --example gpt --layers 2 --timelines all --json
//
// Prints a table (or, with --json, one JSON object), and writes OUT/NAME.svg (overhead
// against budget, one line per method), OUT/NAME.json, and Chrome-trace memory timelines
// (OUT/NAME_METHOD_BUDGET.trace.json; open them in ui.perfetto.dev or chrome://tracing).
#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_split.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>

#include "examples/common/trainer.h"
#include "examples/gpt_model.h"
#include "examples/mlp_model.h"
#include "examples/resnet_model.h"
#include "examples/treelstm_model.h"
#include "remat/dtr_trace.h"
#include "remat/graph_transforms.h"
#include "remat/replay.h"
#include "remat/static_replay.h"
#include "tools/compare/compare.h"

namespace {

int usage(const std::string& why) {
  if (!why.empty()) std::cerr << "remat-compare: " << why << "\n";
  std::cerr << "usage: remat-compare (GRAPH.json | TRACE.log | --example gpt|mlp|resnet|treelstm "
               "[--MODEL-FLAG V ...])\n"
               "       [--budgets F,F,...] [--planners a,b] [--policies p,q]\n"
               "       [--accounting logical|allocator] [--time-limit S] [--out DIR]\n"
               "       [--timelines F|all|none] [--json] [--no-hold-inputs] [--write-graph PATH]\n";
  return 2;
}

std::unique_ptr<remat::examples::Model> make_model(const std::string& name) {
  if (name == "gpt") return std::make_unique<remat::examples::GptModel>();
  if (name == "mlp") return std::make_unique<remat::examples::MlpModel>();
  if (name == "resnet") return std::make_unique<remat::examples::ResnetModel>();
  if (name == "treelstm") return std::make_unique<remat::examples::TreeLstmModel>();
  return nullptr;
}

// The program to compare on: a graph file, a trace (recorded by replaying it), or a step of
// an example model recorded on the simulated backend.
absl::StatusOr<remat::Graph> load_program(const std::string& input, const std::string& example,
                                          const std::map<std::string, std::string>& flags) {
  if (!example.empty()) {
    auto model = make_model(example);
    if (model == nullptr) return absl::InvalidArgumentError("unknown example '" + example + "'");
    if (absl::Status s = model->configure(flags); !s.ok()) return s;
    remat::examples::TrainConfig config;
    config.backend = remat::Backend::kSimulated;
    config.steps = 1;
    config.record_step = 0;
    config.measure_costs = false;
    remat::examples::TrainResult r = remat::examples::train(*model, config);
    if (r.status != "ok" || !r.recorded)
      return absl::InternalError("recording the example failed: " + r.error);
    r.recorded->graph.name = example;
    return std::move(r.recorded->graph);
  }
  if (!flags.empty()) return absl::InvalidArgumentError("model flags need --example");
  if (input.size() > 4 && input.substr(input.size() - 4) == ".log") {
    absl::StatusOr<remat::DtrTrace> trace = remat::read_dtr_trace_file(input);
    if (!trace.ok()) return trace.status();
    remat::RecordedStep step = remat::record_replay(*trace);
    step.graph.name = std::filesystem::path(input).stem().string();
    return std::move(step.graph);
  }
  return remat::read_graph_file(input);
}

}  // namespace

// Bad inputs are Status errors (exit 1); anything that still escapes is one line and exit 2,
// not std::terminate.
int main(int argc, char** argv) try {
  std::string input, example, out_dir = "compare-out", timelines = "0.5", graph_out;
  std::map<std::string, std::string> model_flags;
  remat::compare::CompareOptions opt;
  bool json = false, hold = true;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (arg == "--help" || arg == "-h") return usage("");
    if (arg == "--json") {
      json = true;
    } else if (arg == "--no-hold-inputs") {
      hold = false;
    } else if (arg == "--example") {
      example = value();
    } else if (arg == "--write-graph") {
      graph_out = value();
    } else if (arg == "--out") {
      out_dir = value();
    } else if (arg == "--timelines") {
      timelines = value();
    } else if (arg == "--budgets") {
      opt.fractions.clear();
      for (absl::string_view f : absl::StrSplit(value(), ',', absl::SkipEmpty())) {
        double x = 0;
        if (!absl::SimpleAtod(f, &x) || !(x > 0)) return usage("bad --budgets");
        opt.fractions.push_back(x);
      }
      if (opt.fractions.empty()) return usage("bad --budgets");
    } else if (arg == "--planners") {
      opt.planners = absl::StrSplit(value(), ',', absl::SkipEmpty());
    } else if (arg == "--policies") {
      opt.policies = absl::StrSplit(value(), ',', absl::SkipEmpty());
    } else if (arg == "--accounting") {
      const std::string v = value();
      if (v == "logical")
        opt.accounting = remat::Accounting::kLogical;
      else if (v == "allocator")
        opt.accounting = remat::Accounting::kAllocator;
      else
        return usage("bad --accounting");
    } else if (arg == "--time-limit") {
      if (!absl::SimpleAtod(value(), &opt.planner_time_limit)) return usage("bad --time-limit");
    } else if (arg.rfind("--", 0) == 0 && !example.empty()) {
      model_flags[arg.substr(2)] = value();
    } else if (arg.rfind("--", 0) == 0) {
      return usage("unknown flag " + arg + " (model flags come after --example)");
    } else if (input.empty()) {
      input = arg;
    } else {
      return usage("more than one input");
    }
  }
  if (input.empty() == example.empty()) return usage("give one graph, trace or --example");
  if (timelines == "all") {
    opt.all_timelines = true;
  } else if (timelines != "none" && !absl::SimpleAtod(timelines, &opt.timeline_fraction)) {
    return usage("bad --timelines");
  }
  if (timelines != "none") opt.timeline_dir = out_dir;

  absl::StatusOr<remat::Graph> graph = load_program(input, example, model_flags);
  if (!graph.ok()) {
    std::cerr << "remat-compare: " << graph.status().message() << "\n";
    return 1;
  }
  if (absl::Status s = remat::validate_graph(*graph); !s.ok()) {
    std::cerr << "remat-compare: " << s.message() << "\n";
    return 1;
  }
  const remat::Graph program = hold ? remat::hold_inputs(*std::move(graph)) : *std::move(graph);
  // The program compared (an example's recorded step, inputs held), for remat-plan.
  if (!graph_out.empty()) {
    if (absl::Status s = remat::write_graph_file(program, graph_out); !s.ok()) {
      std::cerr << "remat-compare: " << s.message() << "\n";
      return 1;
    }
  }
  remat::compare::CompareReport report = remat::compare::RunComparison(program, opt);

  std::filesystem::create_directories(out_dir);
  const std::string base = (std::filesystem::path(out_dir) / report.name).string();
  {
    std::ofstream svg(base + ".svg");
    svg << remat::compare::RenderOverheadPlot(
        remat::compare::OverheadSeries(report),
        {.title = absl::StrCat(report.name, ": overhead against budget")});
  }
  const nlohmann::json j = remat::compare::ToJson(report);
  std::ofstream(base + ".json") << j.dump(1) << "\n";
  if (json) {
    std::cout << j.dump() << "\n";
  } else {
    std::cout << remat::compare::FormatTable(report);
    std::cout << "wrote " << base << ".svg, " << base << ".json"
              << (opt.timeline_dir.empty() ? "" : " and timelines") << "\n";
  }
  return 0;
} catch (const std::exception& e) {
  std::cerr << "remat-compare: error: " << e.what() << "\n";
  return 2;
}
