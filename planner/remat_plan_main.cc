// remat-plan: plans a rematerialization schedule for a remat-graph-v1 file.
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iostream>
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

}  // namespace

int main(int argc, char** argv) {
  std::string graph_path, algo, schedule_out;
  std::optional<int64_t> budget;
  std::optional<double> fraction;
  double time_limit = 60;
  bool as_json = false;
  int k = -1;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&](const char* flag) -> std::optional<std::string> {
      if (i + 1 >= argc) return std::nullopt;
      (void)flag;
      return std::string(argv[++i]);
    };
    if (a == "--json") {
      as_json = true;
      continue;
    }
    if (a == "--help" || a == "-h") return Usage("");
    if (a == "--algo" || a == "--budget" || a == "--budget-fraction" || a == "--time-limit" ||
        a == "--schedule-out" || a == "--k") {
      auto v = value(a.c_str());
      if (!v) return Usage(a + " needs a value");
      if (a == "--algo")
        algo = *v;
      else if (a == "--schedule-out")
        schedule_out = *v;
      else if (a == "--budget") {
        int64_t b;
        if (!absl::SimpleAtoi(*v, &b) || b < 0)
          return Usage("--budget wants a non-negative integer of bytes");
        budget = b;
      } else if (a == "--budget-fraction") {
        double f;
        if (!absl::SimpleAtod(*v, &f) || !(f > 0) || !std::isfinite(f))
          return Usage("--budget-fraction wants a positive number");
        fraction = f;
      } else if (a == "--time-limit") {
        if (!absl::SimpleAtod(*v, &time_limit) || !(time_limit > 0))
          return Usage("--time-limit wants seconds > 0");
      } else if (a == "--k") {
        if (!absl::SimpleAtoi(*v, &k)) return Usage("--k wants an integer");
      }
      continue;
    }
    if (!a.empty() && a[0] == '-') return Usage("unknown flag " + a);
    if (!graph_path.empty()) return Usage("more than one graph given");
    graph_path = a;
  }
  if (graph_path.empty()) return Usage("no graph given");
  if (algo.empty()) return Usage("--algo is required");
  if (budget && fraction) return Usage("give --budget or --budget-fraction, not both");
  auto g = remat::read_graph_file(graph_path);
  if (!g.ok()) {
    std::cerr << "remat-plan: " << g.status().message() << "\n";
    return 1;
  }
  if (fraction) {
    remat::Schedule s{g->name, {}};
    for (int v = 0; v < g->size(); ++v) s.order.push_back(v);
    remat::SimResult base = remat::simulate(*g, s);
    budget = static_cast<int64_t>(std::floor(*fraction * static_cast<double>(base.peak_bytes)));
  }
  remat::PlanOptions opt;
  opt.budget_bytes = budget;
  opt.time_limit_seconds = time_limit;
  opt.twremat_k = k;
  opt.verbose = std::getenv("REMAT_VERBOSE") != nullptr;
  auto plan = remat::run_planner(algo, *g, opt);
  if (!plan.ok()) {
    std::cerr << "remat-plan: " << plan.status().message() << "\n";
    return 1;
  }
  if (!schedule_out.empty() && !plan->schedule.order.empty()) {
    std::ofstream out(schedule_out);
    out << remat::write_schedule(plan->schedule) << "\n";
    if (!out) {
      std::cerr << "remat-plan: cannot write " << schedule_out << "\n";
      return 1;
    }
  }
  const remat::SimResult& r = plan->sim;
  if (as_json) {
    nlohmann::json j;
    j["graph"] = g->name;
    j["algo"] = plan->algo;
    j["budget_bytes"] = budget ? nlohmann::json(*budget) : nlohmann::json(nullptr);
    j["feasible"] = plan->feasible;
    if (!plan->feasible || !plan->reason.empty()) j["reason"] = plan->reason;
    bool have =
        !plan->schedule.order.empty() && r.error.find("exceeds the budget") != std::string::npos
            ? true
            : r.valid;
    j["peak_bytes"] = have ? nlohmann::json(r.peak_bytes) : nlohmann::json(nullptr);
    j["cost"] = have ? nlohmann::json(r.cost) : nlohmann::json(nullptr);
    j["base_cost"] = r.base_cost;
    j["overhead"] = have ? nlohmann::json(r.overhead) : nlohmann::json(nullptr);
    j["recomputations"] = have ? nlohmann::json(r.recomputations) : nlohmann::json(nullptr);
    j["solve_seconds"] = plan->solve_seconds;
    j["saved_bytes"] = have ? nlohmann::json(r.saved_bytes) : nlohmann::json(nullptr);
    j["optimal"] = plan->optimal;
    std::cout << j.dump() << "\n";
  } else {
    std::cout << "graph " << g->name << "  algo " << plan->algo << "  budget "
              << (budget ? std::to_string(*budget) : std::string("none")) << "\n"
              << "feasible " << (plan->feasible ? "yes" : "no")
              << (plan->reason.empty() ? "" : "  (" + plan->reason + ")") << "\n";
    if (r.valid || r.error.find("exceeds the budget") != std::string::npos) {
      std::cout << "peak " << r.peak_bytes << " bytes  cost " << r.cost << "  base " << r.base_cost
                << "  overhead " << r.overhead * 100 << "%  recomputations " << r.recomputations
                << "  saved " << r.saved_bytes << " bytes  time " << plan->solve_seconds << " s\n";
    }
  }
  return 0;
}
