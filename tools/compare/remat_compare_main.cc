// remat-compare: static plans against dynamic policies on one program, over a budget sweep.
//
//   remat-compare ../shared/graphs/resnet18.json --out compare-out
//   remat-compare ../shared/traces/dtr/resnet32.log --budgets 0.5,0.4,0.3
//   remat-compare --example gpt --layers 2 --timelines all --json
//
// Prints a table (or, with --json, one JSON object), and writes OUT/NAME.svg (overhead
// against budget, one line per method), OUT/NAME.json, and memory timeline files
// (OUT/NAME_METHOD_BUDGET.trace.json; open them in ui.perfetto.dev or chrome://tracing).
#include <absl/strings/str_cat.h>
#include <absl/strings/str_split.h>

#include <algorithm>
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
#include "remat/planner.h"
#include "remat/replay.h"
#include "remat/static_replay.h"
#include "tools/cli/flags.h"
#include "tools/compare/compare.h"

namespace {

std::unique_ptr<remat::examples::Model> make_model(const std::string& name) {
  if (name == "gpt") return std::make_unique<remat::examples::GptModel>();
  if (name == "mlp") return std::make_unique<remat::examples::MlpModel>();
  if (name == "resnet") return std::make_unique<remat::examples::ResnetModel>();
  if (name == "treelstm") return std::make_unique<remat::examples::TreeLstmModel>();
  return nullptr;
}

struct Flags {
  std::string input, example, out_dir = "compare-out", timelines = "0.5", graph_out;
  std::string hold = "auto";
  bool json = false;
  std::uint64_t host_memory = 0;
  std::string roofline = "cpu";
};

// The program to compare on: a graph file, a trace (recorded by replaying it), or a step of
// an example model recorded on the simulated backend. A trace sets the baseline of `opt`.
absl::StatusOr<remat::Graph> load_program(const std::string& input, remat::examples::Model* model,
                                          const Flags& f, remat::compare::CompareOptions& opt) {
  if (model != nullptr) {
    remat::examples::TrainConfig config;
    config.driver.runtime.backend = remat::Backend::kSimulated;
    config.driver.runtime.roofline =
        f.roofline == "gpu" ? remat::Roofline::gpu() : remat::Roofline::cpu();
    config.steps = 1;
    config.record_step = 0;
    config.driver.runtime.measure_costs = false;
    remat::examples::TrainResult r = remat::examples::train(*model, config);
    if (r.status != "ok" || !r.recorded)
      return absl::InternalError("recording the example failed: " + r.error);
    return std::move(r.recorded->graph);
  }
  if (input.size() > 4 && input.substr(input.size() - 4) == ".log") {
    absl::StatusOr<remat::DtrTrace> trace = remat::read_dtr_trace_file(input);
    if (!trace.ok()) return trace.status();
    opt.baseline_peak =
        static_cast<std::int64_t>(remat::replay_baseline(*trace).logical_peak_bytes);
    remat::RecordedStep step = remat::record_replay(*trace);
    step.graph.name = std::filesystem::path(input).stem().string();
    return std::move(step.graph);
  }
  return remat::read_graph_file(input);
}

void declare_flags(remat::cli::FlagSet& flags, Flags& f, remat::compare::CompareOptions& opt) {
  flags.add_positional("INPUT", &f.input, "a graph (.json, remat-graph-v1) or a trace (.log)");
  flags.add_choice("example", &f.example, {"gpt", "mlp", "resnet", "treelstm"},
                   "compare on a step of this example instead (recorded on the simulated "
                   "backend); its flags (--layers ...) follow, and --example E --help lists them");
  flags.add_choice("roofline", &f.roofline, {"cpu", "gpu"},
                   "--example: price its ops as this CPU (2 cores) or an H100 runs them");
  flags.add_custom("budgets", "F,F,...", "1.0,0.9,...,0.1",
                   "budget fractions in (0, 1] of the program's peak without rematerialization: "
                   "a graph's in file order (FORMAT.md's accounting, as remat-plan), a trace's "
                   "logical peak (as remat-replay)",
                   [&opt](absl::string_view text) {
                     std::vector<double> fractions;
                     for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipEmpty())) {
                       absl::StatusOr<double> x = remat::cli::parse_fraction(part);
                       if (!x.ok()) return x.status();
                       fractions.push_back(*x);
                     }
                     if (fractions.empty())
                       return absl::InvalidArgumentError("wants fractions, e.g. 0.5,0.4");
                     opt.fractions = std::move(fractions);
                     return absl::OkStatus();
                   });
  flags.add_list("planners", &opt.planners,
                 "static planners (default: those that suit the graph's size)");
  flags.add_list("policies", &opt.policies, "dynamic eviction policies");
  flags.add_custom("accounting", "logical|allocator", "logical",
                   "what the dynamic runs' budget caps", [&opt](absl::string_view text) {
                     if (text != "logical" && text != "allocator")
                       return absl::InvalidArgumentError("wants logical or allocator");
                     opt.accounting = text == "logical" ? remat::Accounting::kLogical
                                                        : remat::Accounting::kAllocator;
                     return absl::OkStatus();
                   });
  flags.add("time-limit", &opt.planner_time_limit, "seconds each planner may take", 0.001);
  flags.add_host_memory(&opt.host_link, &f.host_memory,
                        "planner offload's plans (none given: none, and offload is not run)");
  flags.add("out", &f.out_dir, "directory for the plot, the JSON and the timelines");
  flags.add("timelines", &f.timelines,
            "write memory timeline files of the runs at this fraction, or all, or none");
  flags.add_choice("hold-inputs", &f.hold, {"auto", "yes", "no"},
                   "keep the program's inputs live through the step (auto: for --example, "
                   "whose parameters and data live through a training step)");
  flags.add("write-graph", &f.graph_out, "also write the compared program as a graph file");
  flags.add_switch("json", &f.json, "one JSON object on stdout instead of the table");
}

// Names what is wrong with the planners, policies or output directory asked for.
absl::Status check_request(const Flags& f, const remat::compare::CompareOptions& opt) {
  for (const std::string& p : opt.planners) {
    const std::vector<std::string> known = remat::planner_names();
    if (std::find(known.begin(), known.end(), p) == known.end())
      return absl::InvalidArgumentError("unknown planner '" + p + "' in --planners");
  }
  for (const std::string& p : opt.policies) {
    const std::vector<std::string> known = remat::eviction_policy_names();
    if (std::find(known.begin(), known.end(), p) == known.end())
      return absl::InvalidArgumentError("unknown policy '" + p + "' in --policies");
  }
  if (std::filesystem::exists(f.out_dir) && !std::filesystem::is_directory(f.out_dir))
    return absl::InvalidArgumentError("--out " + f.out_dir + " exists and is not a directory");
  return absl::OkStatus();
}

}  // namespace

// Exit codes (tools/cli/exit_code.h): 0 the comparison ran, 2 a bad flag or input; anything
// that still escapes is one line and exit 2, not std::terminate.
int main(int argc, char** argv) try {
  namespace cli = remat::cli;
  const auto* args = const_cast<const char* const*>(argv);
  Flags f;
  remat::compare::CompareOptions opt;
  cli::FlagSet flags("remat-compare",
                     "(INPUT | --example gpt|mlp|resnet|treelstm [model flags]) [flags]",
                     "Static plans against dynamic policies on one program over a budget sweep: "
                     "a table (or JSON), OUT/NAME.svg, OUT/NAME.json and memory timelines.\n"
                     "Exit status: 0 the comparison ran, 2 a bad flag or input.");
  declare_flags(flags, f, opt);
  std::unique_ptr<remat::examples::Model> model;
  if (std::optional<std::string> e = cli::FlagSet::peek(argc, args, "example")) {
    model = make_model(*e);
    if (model != nullptr) model->add_flags(flags);
  }
  if (std::optional<int> code = flags.parse(argc, args)) return *code;
  auto fail = [](absl::string_view why) {
    std::cerr << "remat-compare: " << why << "\n";
    return cli::kExitError;
  };
  if (f.input.empty() == f.example.empty()) return fail("give one graph, trace or --example");
  if (model != nullptr)
    if (absl::Status s = model->check_flags(); !s.ok()) return fail(s.message());
  if (absl::Status s = check_request(f, opt); !s.ok()) return fail(s.message());
  if (f.timelines == "all") {
    opt.all_timelines = true;
  } else if (f.timelines != "none") {
    absl::StatusOr<double> x = cli::parse_fraction(f.timelines);
    if (!x.ok()) return fail("--timelines " + f.timelines + ": wants a fraction, all or none");
    opt.timeline_fraction = *x;
  }
  if (f.timelines != "none") opt.timeline_dir = f.out_dir;
  opt.host_memory_bytes =
      static_cast<std::int64_t>(std::min<std::uint64_t>(f.host_memory, INT64_MAX));

  absl::StatusOr<remat::Graph> graph = load_program(f.input, model.get(), f, opt);
  if (!graph.ok()) return fail(graph.status().message());
  if (model != nullptr) graph->name = f.example;
  if (absl::Status s = remat::validate_graph(*graph); !s.ok()) return fail(s.message());
  const bool hold = f.hold == "yes" || (f.hold == "auto" && model != nullptr);
  const remat::Graph program = hold ? remat::hold_inputs(*std::move(graph)) : *std::move(graph);
  // The program compared (an example's recorded step, inputs held), for remat-plan.
  if (!f.graph_out.empty()) {
    if (absl::Status s = remat::write_graph_file(program, f.graph_out); !s.ok())
      return fail(s.message());
  }
  remat::compare::CompareReport report = remat::compare::run_comparison(program, opt);

  std::filesystem::create_directories(f.out_dir);
  const std::string base = (std::filesystem::path(f.out_dir) / report.name).string();
  {
    std::ofstream svg(base + ".svg");
    svg << remat::compare::render_overhead_plot(
        remat::compare::overhead_series(report),
        {.title = absl::StrCat(report.name, ": overhead against budget")});
  }
  const nlohmann::json j = remat::compare::to_json(report);
  std::ofstream(base + ".json") << j.dump(1) << "\n";
  if (f.json) {
    std::cout << j.dump() << "\n";
  } else {
    std::cout << remat::compare::format_table(report);
    std::cout << "wrote " << base << ".svg, " << base << ".json"
              << (opt.timeline_dir.empty() ? "" : " and timelines") << "\n";
  }
  return cli::kExitOk;
} catch (const std::exception& e) {
  std::cerr << "remat-compare: error: " << e.what() << "\n";
  return remat::cli::kExitError;
}
