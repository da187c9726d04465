// remat/planner.h: the offline rematerialization planners.
//
// Usage:
//   remat::PlanOptions opt;
//   opt.budget_bytes = 100 << 20;        // or leave empty: the planner's own default
//   opt.time_limit_seconds = 30;
//   absl::StatusOr<remat::Plan> p = remat::run_planner("checkmate", g, opt);
//   if (p.ok() && p->feasible) Use(p->schedule);   // p->sim is the simulator's verdict
//
//   opt.host_link = remat::HostLink::nvlink_c2c();  // keep, recompute or copy to the host
//   p = remat::run_planner("offload", g, opt);      // p->schedule.offloads, p->sim.bytes_moved
//
// Every plan has been through simulate(); `feasible` is true only when the simulator found
// the schedule valid and within the budget. hints_from_schedule() (remat/hints.h) turns a
// plan's `schedule` into the runtime's hints.
#ifndef REMAT_PLANNER_H_
#define REMAT_PLANNER_H_

#include <absl/status/statusor.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "remat/graph.h"
#include "remat/host_link.h"
#include "remat/schedule.h"

namespace remat {

struct PlanOptions {
  std::optional<int64_t>
      budget_bytes;  // none: planner default (minimum cost, or minimum memory for twremat)
  // Every planner returns within about this long (its best plan so far, or none); and by
  // `deadline` when one is set (remat-plan sets it so that reading the graph counts).
  double time_limit_seconds = 60.0;
  std::optional<std::chrono::steady_clock::time_point> deadline;
  bool honour_pytorch_banned = false;  // mincut always honours it
  int twremat_k = -1;                  // twremat recursion limit; -1: unlimited
  int moccasin_intervals = 2;          // C, retention intervals per node
  uint64_t seed = 1;
  bool verbose = false;
  // Host memory as a third choice beside keeping and recomputing (planner "offload"): the
  // link its copies cross, in the graph's cost unit taken as nanoseconds, and the most
  // bytes a plan may hold in host memory at once.
  HostLink host_link = HostLink::pcie5();
  int64_t host_memory_bytes = INT64_MAX;
  // Planner offload: the recompute-only plan to improve (one `best` made, say), instead of
  // searching for one; the result is never dearer than it. And whether graph inputs may go
  // to the host (a runtime following the plan keeps its constants where they are).
  std::optional<Schedule> start;
  bool offload_inputs = true;
};

struct Plan {
  std::string algo;
  bool feasible = false;
  std::string reason;  // why infeasible, or a note
  Schedule schedule;
  SimResult sim;  // the simulator's verdict on `schedule`
  std::optional<int64_t> budget_bytes;
  double solve_seconds = 0.0;
  bool optimal = false;  // proven optimal by a solver
  // A JSON object of planner-specific figures, or empty (rockmate: its blocks, kinds,
  // strategies and where the time went; remat-plan --json prints it as "details").
  std::string details;
};

std::vector<std::string> planner_names();

// Runs planner `algo`. Errors are for unknown names or unusable input; a budget that
// cannot be met gives a Plan with feasible == false and a reason.
absl::StatusOr<Plan> run_planner(std::string_view algo, const Graph& g, const PlanOptions& opt);

}  // namespace remat

#endif  // REMAT_PLANNER_H_
