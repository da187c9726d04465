#include "tools/compare/compare.h"

#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>

#include "remat/graph_transforms.h"
#include "remat/planner.h"
#include "remat/replay.h"
#include "remat/schedule.h"
#include "remat/static_replay.h"
#include "remat/step_planner.h"
#include "remat/timeline_file.h"

namespace remat::compare {
namespace {

std::string fraction_label(double f) { return absl::StrFormat("%.2f", f); }

// Writes a run's timeline when the options ask for it; returns its path ("" if none).
std::string maybe_write_timeline(const CompareOptions& o, const std::string& name,
                                 const RunRow& row, const Timeline& timeline) {
  if (o.timeline_dir.empty()) return "";
  std::filesystem::create_directories(o.timeline_dir);
  const std::string file =
      absl::StrCat(name, "_", row.method, "_", fraction_label(row.fraction), ".trace.json");
  const std::string path = (std::filesystem::path(o.timeline_dir) / file).string();
  std::ofstream out(path);
  const absl::Status s = write_timeline_file(
      timeline, absl::StrCat(name, " ", row.method, " @ ", fraction_label(row.fraction)), out);
  return s.ok() ? path : "";
}

bool wants_timeline(const CompareOptions& o, double fraction) {
  return !o.timeline_dir.empty() &&
         (o.all_timelines || std::abs(fraction - o.timeline_fraction) < 1e-9);
}

RunRow dynamic_row(const DtrTrace& trace, const std::string& method, const std::string& policy,
                   std::shared_ptr<const StepHints> hints, double fraction, std::size_t budget,
                   const CompareOptions& o, Timeline* timeline,
                   std::vector<int>* executed = nullptr) {
  ReplayOptions ro;
  ro.policy = policy;
  ro.accounting = o.accounting;
  ro.budget = budget;
  ro.slowdown_cap = o.slowdown_cap;
  ro.hints = std::move(hints);
  ro.record_timeline = timeline != nullptr;
  ro.record_executed = executed != nullptr;
  ReplayResult r = replay(trace, ro);
  if (executed != nullptr) *executed = std::move(r.executed);
  RunRow row;
  row.method = method;
  row.kind = method == "hinted" ? "hinted" : "dynamic";
  row.fraction = fraction;
  row.budget = budget;
  row.status = r.status;
  row.note = r.error;
  row.peak_reserved = r.peak_reserved_bytes;
  row.peak_logical = r.peak_allocated_bytes;
  row.overhead = r.slowdown - 1.0;
  row.evictions = r.evictions;
  row.recomputations = r.recomputations;
  row.decision_seconds = r.search_seconds;
  if (timeline != nullptr) *timeline = std::move(r.timeline);
  return row;
}

}  // namespace

// Note [Seeding hinted]
// `hinted` follows one plan: the cheapest of the static planners' plans and of the schedules
// the dynamic policies realized on the same step (recorded by the runtime and checked by
// simulate() like any plan), at this budget or, where none fits, the last budget that had
// one. A realized schedule is how a training loop would seed it: step one runs a dynamic
// policy and records what it did; later steps follow the best plan known, evicting where it
// freed instead of searching. The hints keep their DTR scores for whatever the plan did not
// foresee, so results stay exact and the budget stays a hard cap.

std::vector<std::string> default_planners(std::size_t nodes, std::int64_t host_memory_bytes) {
  std::vector<std::string> p = {"chen", "greedy", "mincut", "rotor", "twremat"};
  if (nodes > kGreedyMaxNodes) p.erase(std::find(p.begin(), p.end(), "greedy"));
  if (nodes <= 120) p.push_back("checkmate");
  if (nodes <= 400) p.push_back("moccasin");
  if (host_memory_bytes > 0) p.push_back("offload");
  return p;
}

namespace {

// One budget of a comparison: its fraction of the baseline, its bytes, and whether its runs
// write timelines.
struct BudgetPoint {
  double fraction;
  std::size_t budget;
  bool timeline;
};

// noremat: the program as it is, no budget.
RunRow noremat_row(const BudgetPoint& at, std::int64_t file_peak) {
  RunRow row;
  row.method = "noremat";
  row.kind = "none";
  row.fraction = at.fraction;
  row.budget = at.budget;
  row.predicted_peak = file_peak;
  row.peak_logical = static_cast<std::size_t>(file_peak);
  row.status = file_peak <= static_cast<std::int64_t>(at.budget) ? "ok" : "over_budget";
  return row;
}

// A plan's offloads: how many, the bytes they move and the copies' time the steps waited
// for (the replay runs the copies as the simulator does, so its overhead includes it).
void add_offloads(const SimResult& sim, RunRow* row) {
  row->offloads = sim.offloads;
  row->bytes_moved = sim.bytes_moved;
  row->transfer_exposed = sim.exposed_transfer_cost;
}

// A static planner's plan, replayed in both accountings; offered to `best` where it fits.
RunRow static_row(const Graph& g, const std::string& algo, const BudgetPoint& at,
                  const CompareOptions& o, const std::string& name, CheapestPlan& best) {
  PlanOptions po;
  po.budget_bytes = static_cast<std::int64_t>(at.budget);
  po.time_limit_seconds = o.planner_time_limit;
  po.host_link = o.host_link;
  po.host_memory_bytes = o.host_memory_bytes;
  RunRow row;
  row.method = algo;
  row.kind = "static";
  row.fraction = at.fraction;
  row.budget = at.budget;
  absl::StatusOr<Plan> plan = plan_holding_inputs(algo, g, po);
  if (!plan.ok()) {
    row.status = "error";
    row.note = std::string(plan.status().message());
    return row;
  }
  row.decision_seconds = plan->solve_seconds;
  if (!plan->feasible) {
    row.status = "infeasible";
    row.note = plan->reason;
    return row;
  }
  row.predicted_peak = plan->sim.peak_bytes;
  StaticReplayOptions logical_opts;
  logical_opts.accounting = Accounting::kLogical;
  logical_opts.host_link = o.host_link;
  absl::StatusOr<StaticReplayResult> logical = static_replay(g, plan->schedule, logical_opts);
  StaticReplayOptions alloc_opts;
  alloc_opts.record_timeline = at.timeline;
  alloc_opts.host_link = o.host_link;
  absl::StatusOr<StaticReplayResult> alloc = static_replay(g, plan->schedule, alloc_opts);
  if (!logical.ok() || !alloc.ok()) {
    row.status = "error";
    row.note = std::string((!logical.ok() ? logical : alloc).status().message());
    return row;
  }
  row.peak_logical = logical->peak_allocated_bytes;
  row.peak_reserved = alloc->peak_reserved_bytes;
  row.overhead = logical->overhead;
  row.evictions = logical->evictions;
  row.recomputations = logical->recomputations;
  add_offloads(plan->sim, &row);
  if (o.accounting == Accounting::kAllocator && row.peak_reserved > at.budget) {
    row.status = "over_budget";
    row.note = absl::StrCat("the allocator reserved ", row.peak_reserved - at.budget,
                            " bytes past the budget");
  }
  if (at.timeline) row.timeline = maybe_write_timeline(o, name, row, alloc->timeline);
  // The runtime's hints do not carry offloads yet: such a plan does not seed `hinted`.
  if (row.status == "ok" && row.offloads == 0) best.offer(row.overhead, plan->schedule, algo);
  return row;
}

// The best plan so far, carried from budget to budget to seed hinted.
struct Seed {
  std::optional<Schedule> schedule;  // the best plan at the last budget that had one
  std::string note;
};

// Hinted, seeded with the best plan at this budget (or the last budget's best).
RunRow hinted_row(const Graph& g, const DtrTrace& program, const std::vector<StepSite>& sites,
                  const BudgetPoint& at, const CheapestPlan& best, const CompareOptions& o,
                  const std::string& name, Seed& seed) {
  std::string seed_note;
  if (!best.empty()) {
    seed.schedule = best.schedule();
    seed.note = absl::StrCat("seeded by ", best.source(), " @ ", fraction_label(at.fraction));
    seed_note = seed.note;
  } else if (seed.schedule) {
    seed_note = absl::StrCat(seed.note, " (no plan fits this budget)");
  } else {
    seed_note = "no plan to seed it: DTR alone";
  }
  std::shared_ptr<const StepHints> hints;
  if (seed.schedule)
    hints = std::make_shared<StepHints>(hints_from_schedule(g, *seed.schedule, sites, seed_note));
  Timeline tl;
  RunRow row = dynamic_row(program, "hinted", "hinted", hints, at.fraction, at.budget, o,
                           at.timeline ? &tl : nullptr);
  if (row.status == "ok") row.note = seed_note;
  if (at.timeline) row.timeline = maybe_write_timeline(o, name, row, tl);
  return row;
}

}  // namespace

CompareReport run_comparison(const Graph& g, const CompareOptions& o) {
  CompareReport report;
  report.name = g.name;
  report.nodes = g.nodes.size();
  const std::int64_t file_peak = file_order_peak(g);
  report.baseline_peak = o.baseline_peak.value_or(file_peak);
  const DtrTrace program = dtr_trace_from_graph(g);
  const std::vector<StepSite> sites = trace_sites(g);
  const std::vector<std::string> planners =
      o.planners.empty() ? default_planners(g.nodes.size(), o.host_memory_bytes) : o.planners;
  Seed seed;
  for (double f : o.fractions) {
    const BudgetPoint at{f, static_cast<std::size_t>(f * static_cast<double>(report.baseline_peak)),
                         wants_timeline(o, f)};
    report.rows.push_back(noremat_row(at, file_peak));
    // Static planners, replayed; the best plan here by overhead (the static plans' replayed,
    // the realized schedules' simulated).
    CheapestPlan best;
    for (const std::string& algo : planners)
      report.rows.push_back(static_row(g, algo, at, o, report.name, best));
    // Dynamic policies. What each realized on the step is a static plan too (see
    // Note [Seeding hinted]).
    for (const std::string& policy : o.policies) {
      Timeline tl;
      std::vector<int> executed;
      RunRow row = dynamic_row(program, policy, policy, nullptr, f, at.budget, o,
                               at.timeline ? &tl : nullptr, &executed);
      if (at.timeline) row.timeline = maybe_write_timeline(o, report.name, row, tl);
      report.rows.push_back(row);
      if (row.status != "ok") continue;
      absl::StatusOr<Plan> realized =
          realized_plan(g, sites, executed, static_cast<std::int64_t>(at.budget));
      if (realized.ok() && realized->feasible)
        best.offer(realized->sim.overhead, realized->schedule,
                   absl::StrCat("the schedule ", policy, " realized"));
    }
    report.rows.push_back(hinted_row(g, program, sites, at, best, o, report.name, seed));
  }
  return report;
}

std::string format_table(const CompareReport& r) {
  std::string out = absl::StrFormat("%s: %zu nodes, unconstrained peak %d bytes\n", r.name, r.nodes,
                                    r.baseline_peak);
  out += absl::StrFormat("%-6s %-10s %-8s %-11s %14s %14s %14s %9s %9s %9s\n", "budget", "method",
                         "kind", "status", "peak_reserved", "peak_logical", "predicted", "overhead",
                         "evictions", "decide_s");
  for (const RunRow& row : r.rows) {
    const bool ok = row.status == "ok";
    out += absl::StrFormat(
        "%-6s %-10s %-8s %-11s %14s %14s %14s %9s %9zu %9.4f\n", fraction_label(row.fraction),
        row.method, row.kind, row.status, row.peak_reserved ? absl::StrCat(row.peak_reserved) : "-",
        row.peak_logical ? absl::StrCat(row.peak_logical) : "-",
        row.predicted_peak >= 0 ? absl::StrCat(row.predicted_peak) : "-",
        ok ? absl::StrFormat("%.4f", row.overhead) : "-", row.evictions, row.decision_seconds);
  }
  return out;
}

nlohmann::json to_json(const CompareReport& r) {
  nlohmann::json runs = nlohmann::json::array();
  for (const RunRow& row : r.rows) {
    nlohmann::json j = {{"method", row.method},
                        {"kind", row.kind},
                        {"fraction", row.fraction},
                        {"budget_bytes", row.budget},
                        {"status", row.status},
                        {"note", row.note},
                        {"peak_reserved_bytes", row.peak_reserved},
                        {"peak_logical_bytes", row.peak_logical},
                        {"overhead", row.overhead},
                        {"evictions", row.evictions},
                        {"recomputations", row.recomputations},
                        {"decision_seconds", row.decision_seconds}};
    if (row.offloads > 0) {
      j["offloads"] = row.offloads;
      j["bytes_moved"] = row.bytes_moved;
      j["transfer_cost_exposed"] = row.transfer_exposed;
    }
    if (row.predicted_peak >= 0) {
      j["predicted_peak_bytes"] = row.predicted_peak;
      // The replay's own peak against the planner's: zero in logical accounting when the
      // runtime executes the schedule exactly; the allocator's rounding and fragmentation
      // in reserved bytes.
      j["logical_minus_predicted_bytes"] =
          static_cast<std::int64_t>(row.peak_logical) - row.predicted_peak;
      if (row.peak_reserved > 0)
        j["reserved_minus_predicted_bytes"] =
            static_cast<std::int64_t>(row.peak_reserved) - row.predicted_peak;
    }
    if (!row.timeline.empty()) j["timeline"] = row.timeline;
    runs.push_back(std::move(j));
  }
  return {{"graph", r.name},
          {"nodes", r.nodes},
          {"baseline_peak_bytes", r.baseline_peak},
          {"runs", std::move(runs)}};
}

std::vector<PlotSeries> overhead_series(const CompareReport& r) {
  std::vector<PlotSeries> series;
  for (const RunRow& row : r.rows) {
    if (row.kind == "none") continue;
    auto it = std::find_if(series.begin(), series.end(),
                           [&](const PlotSeries& s) { return s.name == row.method; });
    if (it == series.end()) {
      series.push_back({row.method, {}});
      it = series.end() - 1;
    }
    if (row.status == "ok") it->points.emplace_back(row.fraction, row.overhead);
  }
  return series;
}

}  // namespace remat::compare
