// remat-plan: plans a rematerialization schedule for a remat-graph-v1 file.
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"
#include "remat/graph.h"
#include "remat/planner.h"
#include "remat/schedule.h"

namespace {

int Usage(const std::string& msg) {
  if (!msg.empty()) std::cerr << "remat-plan: " << msg << "\n";
  std::cerr << "usage: remat-plan GRAPH.json --algo A [--budget BYTES | --budget-fraction F]\n"
               "                  [--time-limit S] [--schedule-out FILE] [--k K] [--json]\n"
               "algorithms: "
            << absl::StrJoin(remat::planner_names(), ", ") << "\n";
  return 2;
}

struct Flags {
  std::string graph_path, algo, schedule_out;
  std::optional<int64_t> budget;
  std::optional<double> fraction;
  double time_limit = 60;
  bool as_json = false;
  int k = -1;
};

bool TakesValue(const std::string& a) {
  return a == "--algo" || a == "--budget" || a == "--budget-fraction" || a == "--time-limit" ||
         a == "--schedule-out" || a == "--k";
}

// Stores the value v of flag a; returns what is wrong with it, or "" when it is accepted.
std::string SetFlagValue(const std::string& a, const std::string& v, Flags* f) {
  if (a == "--algo")
    f->algo = v;
  else if (a == "--schedule-out")
    f->schedule_out = v;
  else if (a == "--budget") {
    int64_t b;
    if (!absl::SimpleAtoi(v, &b) || b < 0) return "--budget wants a non-negative integer of bytes";
    f->budget = b;
  } else if (a == "--budget-fraction") {
    double x;
    if (!absl::SimpleAtod(v, &x) || !(x > 0) || !std::isfinite(x))
      return "--budget-fraction wants a positive number";
    f->fraction = x;
  } else if (a == "--time-limit") {
    if (!absl::SimpleAtod(v, &f->time_limit) || !(f->time_limit > 0))
      return "--time-limit wants seconds > 0";
  } else if (a == "--k") {
    if (!absl::SimpleAtoi(v, &f->k)) return "--k wants an integer";
  }
  return "";
}

// Reads the command line into *f; returns the exit status when the program stops here
// (help, or a usage error).
std::optional<int> ParseFlags(int argc, char** argv, Flags* f) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--json") {
      f->as_json = true;
      continue;
    }
    if (a == "--help" || a == "-h") return Usage("");
    if (TakesValue(a)) {
      if (i + 1 >= argc) return Usage(a + " needs a value");
      std::string error = SetFlagValue(a, argv[++i], f);
      if (!error.empty()) return Usage(error);
      continue;
    }
    if (!a.empty() && a[0] == '-') return Usage("unknown flag " + a);
    if (!f->graph_path.empty()) return Usage("more than one graph given");
    f->graph_path = a;
  }
  if (f->graph_path.empty()) return Usage("no graph given");
  if (f->algo.empty()) return Usage("--algo is required");
  if (f->budget && f->fraction) return Usage("give --budget or --budget-fraction, not both");
  return std::nullopt;
}

// The budget as a fraction of the peak of the file order without recomputation.
int64_t FractionOfPeak(const remat::Graph& g, double fraction) {
  remat::Schedule s{g.name, {}};
  for (int v = 0; v < g.size(); ++v) s.order.push_back(v);
  remat::SimResult base = remat::simulate(g, s);
  return static_cast<int64_t>(std::floor(fraction * static_cast<double>(base.peak_bytes)));
}

bool WriteSchedule(const std::string& path, const remat::Schedule& schedule) {
  std::ofstream out(path);
  out << remat::write_schedule(schedule) << "\n";
  if (!out) {
    std::cerr << "remat-plan: cannot write " << path << "\n";
    return false;
  }
  return true;
}

void PrintJson(const remat::Graph& g, const remat::Plan& plan, std::optional<int64_t> budget) {
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
  if (!plan.details.empty()) j["details"] = nlohmann::json::parse(plan.details, nullptr, false);
  std::cout << j.dump() << "\n";
}

void PrintText(const remat::Graph& g, const remat::Plan& plan, std::optional<int64_t> budget) {
  const remat::SimResult& r = plan.sim;
  std::cout << "graph " << g.name << "  algo " << plan.algo << "  budget "
            << (budget ? std::to_string(*budget) : std::string("none")) << "\n"
            << "feasible " << (plan.feasible ? "yes" : "no")
            << (plan.reason.empty() ? "" : "  (" + plan.reason + ")") << "\n";
  if (r.valid || r.error.find("exceeds the budget") != std::string::npos) {
    std::cout << "peak " << r.peak_bytes << " bytes  cost " << r.cost << "  base " << r.base_cost
              << "  overhead " << r.overhead * 100 << "%  recomputations " << r.recomputations
              << "  saved " << r.saved_bytes << " bytes  time " << plan.solve_seconds << " s\n";
  }
}

}  // namespace

// Bad inputs are Status errors (exit 1); anything that still escapes is one line and exit 2,
// not std::terminate.
int main(int argc, char** argv) try {
  Flags f;
  if (std::optional<int> status = ParseFlags(argc, argv, &f)) return *status;
  auto g = remat::read_graph_file(f.graph_path);
  if (!g.ok()) {
    std::cerr << "remat-plan: " << g.status().message() << "\n";
    return 1;
  }
  std::optional<int64_t> budget = f.budget;
  if (f.fraction) budget = FractionOfPeak(*g, *f.fraction);
  remat::PlanOptions opt;
  opt.budget_bytes = budget;
  opt.time_limit_seconds = f.time_limit;
  opt.twremat_k = f.k;
  opt.verbose = std::getenv("REMAT_VERBOSE") != nullptr;
  auto plan = remat::run_planner(f.algo, *g, opt);
  if (!plan.ok()) {
    std::cerr << "remat-plan: " << plan.status().message() << "\n";
    return 1;
  }
  if (!f.schedule_out.empty() && !plan->schedule.order.empty() &&
      !WriteSchedule(f.schedule_out, plan->schedule))
    return 1;
  if (f.as_json)
    PrintJson(*g, *plan, budget);
  else
    PrintText(*g, *plan, budget);
  return 0;
} catch (const std::exception& e) {
  std::cerr << "remat-plan: error: " << e.what() << "\n";
  return 2;
}
