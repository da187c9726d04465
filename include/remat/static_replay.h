// remat/static_replay.h: a planner's schedule executed exactly by the runtime, and a graph
// turned into a program the dynamic runtime can run, so that static plans and dynamic
// policies are measured by the same allocator on the same program.
//
// Usage:
//   remat::Graph g = remat::HoldInputs(remat::ReadGraphFile(path).value());
//   remat::Plan plan = remat::RunPlanner("twremat", g, opt).value();
//   auto r = remat::static_replay(g, plan.schedule, {.accounting = remat::Accounting::kAllocator});
//   if (r.ok()) std::cout << r->peak_reserved_bytes - plan.sim.peak_bytes;  // allocator's share
//
//   remat::DtrTrace program = remat::dtr_trace_from_graph(g);   // for remat::replay()
//
// Only the types of remat/graph.h and remat/schedule.h are used: the runtime does not link
// the planner.
#ifndef REMAT_STATIC_REPLAY_H_
#define REMAT_STATIC_REPLAY_H_

#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "remat/dtr_trace.h"
#include "remat/graph.h"
#include "remat/hints.h"
#include "remat/runtime.h"
#include "remat/schedule.h"

namespace remat {

struct StaticReplayOptions {
  Accounting accounting = Accounting::kAllocator;
  bool record_timeline = false;
  CachingAllocatorOptions allocator = {};
};

struct StaticReplayResult {
  std::size_t peak_reserved_bytes = 0;   // what the allocator reserved (logical: = allocated)
  std::size_t peak_allocated_bytes = 0;  // sum of live tensor sizes at its highest
  double cost = 0;                       // summed cost of every step run
  double overhead = 0;                   // cost / (every node once) - 1, as Simulate() counts
  std::size_t recomputations = 0;
  std::size_t evictions = 0;             // instances the schedule frees while a later one follows
  double wall_seconds = 0;
  Timeline timeline;                     // with StaticReplayOptions::record_timeline
};

// Runs `schedule` on the simulated backend with no budget: the n-th step computes its node
// (first instance: a new op; later ones: the runtime recomputes the evicted tensor), and after
// each step every instance read for the last time is evicted (another instance follows) or
// released (none does), as FORMAT.md's accounting frees it. Each node is its own tensor
// (views counted at full size, group members computed one by one), as Simulate() counts
// them. Inputs are made by ops of no inputs rather than as pinned constants, so that they too
// are freed after their last read. An invalid schedule is an error naming the step and the
// node.
absl::StatusOr<StaticReplayResult> static_replay(const Graph& graph, const Schedule& schedule,
                                                 const StaticReplayOptions& options = {});

// The graph as a recorded step: inputs and tangents are CONSTANTs, every other node a CALL in
// node order with its cost as TIME (scaled so the largest is 1e9, as TIME is an integer; only
// ratios matter), and each value is RELEASEd right after its last reader, as FORMAT.md frees
// it. A node with no bytes and no readers becomes a CALL with no result.
DtrTrace dtr_trace_from_graph(const Graph& graph);

// Where each node of `graph` runs, for HintsFromSchedule(): in the step the runtime recorded
// it from (Node::site_position; -1 for inputs), or in dtr_trace_from_graph()'s program (one
// call per CALL it makes, in node order; -1 for inputs; a call with no result has its
// position and output -1).
std::vector<StepSite> recorded_sites(const Graph& graph);
std::vector<StepSite> trace_sites(const Graph& graph);

// The schedule a recorded step realized: `executed` (RecordedStep::executed) as node ids of
// `graph`, whose node v ran at `sites[v]`; each node that has no site (inputs, the nodes
// HoldInputs adds) comes right before its first reader.
// It is a static plan like any planner's (Simulate() measures it), which is how a dynamic
// policy's decisions on one step can seed the hints of the next.
absl::StatusOr<Schedule> realized_schedule(const Graph& graph, const std::vector<StepSite>& sites,
                                           const std::vector<int>& executed);

// The graph with its inputs and tangents resident for the whole step in every accounting, as
// a runtime holds parameters (a pinned constant cannot be freed while lineage may need it;
// FORMAT.md makes an input when a schedule first places it and frees it after its last
// read, which no dynamic runtime could do). The inputs come first, then a node
// `inputs_ready` that reads them all and that every node reading only inputs also reads (so
// every schedule makes all inputs before any other node), then the other nodes in their
// order, and last a node `hold_inputs` that reads every input. Both added nodes have no
// bytes and no cost; node ids change, sites do not.
Graph HoldInputs(Graph graph);

// A schedule of a HoldInputs() graph with its `hold_inputs` node moved to the end. Nothing
// reads that node, so a planner may place it anywhere, and where it comes early FORMAT.md's
// accounting frees the inputs early; moved last, the schedule's simulated peak is what a
// runtime that holds its parameters needs. Returns whether it moved anything (then the plan
// must be simulated again).
bool HoldInputsToTheEnd(const Graph& graph, Schedule& schedule);

}  // namespace remat

#endif  // REMAT_STATIC_REPLAY_H_
