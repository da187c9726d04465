// remat/planner.h: the offline rematerialization planners.
//
// Usage:
//   remat::PlanOptions opt;
//   opt.budget_bytes = 100 << 20;        // or leave empty: the planner's own default
//   opt.time_limit_seconds = 30;
//   absl::StatusOr<remat::Plan> p = remat::RunPlanner("checkmate", g, opt);
//   if (p.ok() && p->feasible) Use(p->schedule);   // p->sim is the simulator's verdict
//
// Every plan has been through Simulate(); `feasible` is true only when the simulator found
// the schedule valid and within the budget. The runtime reads `schedule` (and
// `EvictionHints`) as hints on what to free and recompute.
#ifndef REMAT_PLANNER_H_
#define REMAT_PLANNER_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "remat/graph.h"
#include "remat/hints.h"
#include "remat/schedule.h"

namespace remat {

struct PlanOptions {
  std::optional<int64_t> budget_bytes;  // none: planner default (minimum cost, or minimum memory for twremat)
  double time_limit_seconds = 60.0;     // for the solvers and for `best`
  bool honour_pytorch_banned = false;   // mincut always honours it
  int twremat_k = -1;                   // twremat recursion limit; -1: unlimited
  int moccasin_intervals = 2;           // C, retention intervals per node
  uint64_t seed = 1;
  bool verbose = false;
};

struct Plan {
  std::string algo;
  bool feasible = false;
  std::string reason;          // why infeasible, or a note
  Schedule schedule;
  SimResult sim;               // the simulator's verdict on `schedule`
  std::optional<int64_t> budget_bytes;
  double solve_seconds = 0.0;
  bool optimal = false;        // proven optimal by a solver
};

// Per step of a schedule: the node ids whose instance dies after that step (their last
// read). The runtime uses them as eviction hints.
std::vector<std::vector<int>> EvictionHints(const Graph& g, const Schedule& s);

// The runtime's hints for a schedule of `g` (see remat/hints.h): `sites[v]` is where node v
// runs in the step (recorded_sites() or trace_sites() of remat/static_replay.h). Nodes the
// schedule computes once are kept, the others marked recomputed, and every instance the
// schedule frees is evicted after the step's op that comes at or after its last read (unless
// its next instance is made before that op: the runtime keeps it resident instead). Outputs
// of `g` are never evicted after their last instance. The schedule itself goes along, step by
// step with what each step frees, for the runtime to follow (Note [Following a schedule]).
StepHints HintsFromSchedule(const Graph& g, const Schedule& s, const std::vector<StepSite>& sites,
                            std::string source);

std::vector<std::string> PlannerNames();

// Runs planner `algo`. Errors are for unknown names or unusable input; a budget that
// cannot be met gives a Plan with feasible == false and a reason.
absl::StatusOr<Plan> RunPlanner(std::string_view algo, const Graph& g,
                                const PlanOptions& opt);

}  // namespace remat

#endif  // REMAT_PLANNER_H_
