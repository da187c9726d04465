// remat-plan: plans a rematerialization schedule for a remat-graph-v1 file.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>

#include "nlohmann/json.hpp"
#include "remat/graph.h"
#include "remat/planner.h"
#include "remat/schedule.h"
#include "tools/cli/flags.h"

namespace {

bool write_schedule_file(const std::string& path, const remat::Schedule& schedule) {
  std::ofstream out(path);
  out << remat::write_schedule(schedule) << "\n";
  if (!out) {
    std::cerr << "remat-plan: cannot write " << path << "\n";
    return false;
  }
  return true;
}

// What the plan's offloads move and how much of their time the steps wait for.
void add_offload_figures(const remat::SimResult& r, nlohmann::json* j) {
  (*j)["offloads"] = r.offloads;
  (*j)["bytes_moved"] = r.bytes_moved;
  (*j)["host_peak_bytes"] = r.host_peak_bytes;
  (*j)["transfer_cost"] = r.transfer_cost;
  (*j)["transfer_cost_hidden"] = r.transfer_cost - r.exposed_transfer_cost;
  (*j)["transfer_cost_exposed"] = r.exposed_transfer_cost;
}

void print_json(const remat::Graph& g, const remat::Plan& plan, std::optional<int64_t> budget) {
  const remat::SimResult& r = plan.sim;
  nlohmann::json j;
  j["graph"] = g.name;
  j["algo"] = plan.algo;
  j["budget_bytes"] = budget ? nlohmann::json(*budget) : nlohmann::json(nullptr);
  j["feasible"] = plan.feasible;
  if (!plan.feasible || !plan.reason.empty()) j["reason"] = plan.reason;
  // A schedule over the budget still has figures to report.
  bool have =
      !plan.schedule.order.empty() && r.error.find("exceeds the budget") != std::string::npos
          ? true
          : r.valid;
  j["peak_bytes"] = have ? nlohmann::json(r.peak_bytes) : nlohmann::json(nullptr);
  j["cost"] = have ? nlohmann::json(r.cost) : nlohmann::json(nullptr);
  j["base_cost"] = r.base_cost;
  j["overhead"] = have ? nlohmann::json(r.overhead) : nlohmann::json(nullptr);
  j["recomputations"] = have ? nlohmann::json(r.recomputations) : nlohmann::json(nullptr);
  j["solve_seconds"] = plan.solve_seconds;
  j["saved_bytes"] = have ? nlohmann::json(r.saved_bytes) : nlohmann::json(nullptr);
  j["optimal"] = plan.optimal;
  if (have) add_offload_figures(r, &j);
  if (!plan.details.empty()) j["details"] = nlohmann::json::parse(plan.details, nullptr, false);
  std::cout << j.dump() << "\n";
}

void print_text(const remat::Graph& g, const remat::Plan& plan, std::optional<int64_t> budget) {
  const remat::SimResult& r = plan.sim;
  std::cout << "graph " << g.name << "  algo " << plan.algo << "  budget "
            << (budget ? std::to_string(*budget) : std::string("none")) << "\n"
            << "feasible " << (plan.feasible ? "yes" : "no")
            << (plan.reason.empty() ? "" : "  (" + plan.reason + ")") << "\n";
  if (r.valid || r.error.find("exceeds the budget") != std::string::npos) {
    std::cout << "peak " << r.peak_bytes << " bytes  cost " << r.cost << "  base " << r.base_cost
              << "  overhead " << r.overhead * 100 << "%  recomputations " << r.recomputations
              << "  saved " << r.saved_bytes << " bytes  time " << plan.solve_seconds << " s\n";
    if (r.offloads > 0) {
      std::cout << "offloads " << r.offloads << "  moved " << r.bytes_moved << " bytes  host peak "
                << r.host_peak_bytes << " bytes  transfer " << r.transfer_cost << " (exposed "
                << r.exposed_transfer_cost << ")\n";
    }
  }
}

}  // namespace

// Exit codes (tools/cli/exit_code.h): 0 a plan within the budget, 1 none found, 2 a bad flag
// or input; anything that still escapes is one line and exit 2, not std::terminate.
int main(int argc, char** argv) try {
  const auto start = std::chrono::steady_clock::now();
  namespace cli = remat::cli;
  std::string graph_path, algo, schedule_out, start_path;
  double time_limit = 60;
  int k = -1;
  bool json = false;
  remat::HostLink host_link = remat::HostLink::pcie5();
  std::uint64_t host_memory = INT64_MAX;
  cli::BudgetFlags budget_flags;
  cli::FlagSet flags("remat-plan", "GRAPH.json --algo A [--budget B | --budget-fraction F] [flags]",
                     "Plans a rematerialization schedule for a remat-graph-v1 file and checks it "
                     "with the simulator.\nExit status: 0 a plan within the budget, 1 no plan "
                     "within it, 2 a bad flag or input.");
  flags.add_positional("GRAPH.json", &graph_path, "the graph (remat-graph-v1)");
  flags.add_choice("algo", &algo, remat::planner_names(), "the planner (required)");
  flags.add_budget(&budget_flags,
                   "the peak of the file order without recomputation (FORMAT.md's accounting)");
  flags.add("time-limit", &time_limit,
            "seconds for the whole run, reading the graph included: the planner returns its "
            "best plan so far, or none, by then",
            0.001);
  flags.add("schedule-out", &schedule_out, "write the schedule (remat-schedule-v1) to this file");
  flags.add("start", &start_path,
            "--algo offload: improve this schedule (remat-schedule-v1, recompute-only) instead "
            "of searching for one");
  flags.add("k", &k, "twremat: the tree decomposition's width bound; -1 lets twremat choose");
  flags.add_host_memory(&host_link, &host_memory,
                        "planner offload's copies (none given: no limit)");
  flags.add_switch("json", &json, "one JSON object instead of text");
  if (std::optional<int> code = flags.parse(argc, const_cast<const char* const*>(argv)))
    return *code;
  if (graph_path.empty()) {
    std::cerr << "remat-plan: no graph given (remat-plan --help lists the flags)\n";
    return cli::kExitError;
  }
  if (algo.empty()) {
    std::cerr << "remat-plan: --algo is required (remat-plan --help lists the flags)\n";
    return cli::kExitError;
  }
  auto g = remat::read_graph_file(graph_path);
  if (!g.ok()) {
    std::cerr << "remat-plan: " << g.status().message() << "\n";
    return cli::kExitError;
  }
  const auto baseline_start = std::chrono::steady_clock::now();
  // The baseline of --budget-fraction (remat-compare measures the same).
  const auto baseline_peak =
      static_cast<std::uint64_t>(std::max<std::int64_t>(0, remat::file_order_peak(*g)));
  std::optional<int64_t> budget;
  if (budget_flags.given()) budget = static_cast<int64_t>(*budget_flags.resolve(baseline_peak));
  remat::PlanOptions opt;
  opt.budget_bytes = budget;
  opt.time_limit_seconds = time_limit;
  // The limit is for the whole run: reading the graph counts, and the plan's simulation
  // afterwards is kept out of it (twice the baseline's, which it resembles).
  const auto now = std::chrono::steady_clock::now();
  opt.deadline = start +
                 std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                     std::chrono::duration<double>(time_limit)) -
                 2 * (now - baseline_start);
  opt.twremat_k = k;
  opt.host_link = host_link;
  if (!start_path.empty()) {
    absl::StatusOr<remat::Schedule> start = remat::read_schedule_file(start_path);
    if (!start.ok()) {
      std::cerr << "remat-plan: " << start.status().message() << "\n";
      return cli::kExitError;
    }
    opt.start = *std::move(start);
  }
  opt.host_memory_bytes = static_cast<int64_t>(std::min<std::uint64_t>(host_memory, INT64_MAX));
  opt.verbose = std::getenv("REMAT_VERBOSE") != nullptr;
  auto plan = remat::run_planner(algo, *g, opt);
  if (!plan.ok()) {
    std::cerr << "remat-plan: " << plan.status().message() << "\n";
    return cli::kExitError;
  }
  if (!schedule_out.empty() && !plan->schedule.order.empty() &&
      !write_schedule_file(schedule_out, plan->schedule))
    return cli::kExitError;
  if (json)
    print_json(*g, *plan, budget);
  else
    print_text(*g, *plan, budget);
  return plan->feasible ? cli::kExitOk : cli::kExitInfeasible;
} catch (const std::exception& e) {
  std::cerr << "remat-plan: error: " << e.what() << "\n";
  return remat::cli::kExitError;
}
