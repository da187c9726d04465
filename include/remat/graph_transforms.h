// remat/graph_transforms.h: the IR transforms between a planner's graph and the runtime's
// step: where each node runs (sites, which hints are keyed by), the schedule a recorded step
// realized, a graph whose inputs stay resident as a runtime's parameters do, and a graph as
// a DTR log program that remat::replay() runs.
//
//   remat::RecordedStep step = rt.end_step();               // recorded with StepOptions::record
//   remat::Graph g = remat::hold_inputs(step.graph);
//   absl::StatusOr<remat::Schedule> s =
//       remat::realized_schedule(g, remat::recorded_sites(g), step.executed);
//   remat::DtrTrace program = remat::dtr_trace_from_graph(g);
#ifndef REMAT_GRAPH_TRANSFORMS_H_
#define REMAT_GRAPH_TRANSFORMS_H_

#include <absl/status/statusor.h>

#include <vector>

#include "remat/dtr_trace.h"
#include "remat/graph.h"
#include "remat/hints.h"
#include "remat/schedule.h"

namespace remat {

// The graph as a recorded step: inputs and tangents are CONSTANTs, every other node a CALL in
// node order with its cost as TIME (scaled so the largest is 1e9, as TIME is an integer; only
// ratios matter), and each value is RELEASEd right after its last reader, as docs/formats.md frees
// it. A node with no bytes and no readers becomes a CALL with no result.
DtrTrace dtr_trace_from_graph(const Graph& graph);

// Where each node of `graph` runs, for hints_from_schedule(): in the step the runtime recorded
// it from (Node::site_position; -1 for inputs), or in dtr_trace_from_graph()'s program (one
// call per CALL it makes, in node order; -1 for inputs; a call with no result has its
// position and output -1).
std::vector<StepSite> recorded_sites(const Graph& graph);
std::vector<StepSite> trace_sites(const Graph& graph);

// The schedule a recorded step realized: `executed` (RecordedStep::executed) as node ids of
// `graph`, whose node v ran at `sites[v]`; each node that has no site (inputs, the nodes
// hold_inputs adds) comes right before its first reader.
// It is a static plan like any planner's (simulate() measures it), which is how a dynamic
// policy's decisions on one step can seed the hints of the next.
absl::StatusOr<Schedule> realized_schedule(const Graph& graph, const std::vector<StepSite>& sites,
                                           const std::vector<int>& executed);

// The graph with its inputs and tangents resident for the whole step in every accounting, as
// a runtime holds parameters (a pinned constant cannot be freed while lineage may need it;
// docs/formats.md makes an input when a schedule first places it and frees it after its last
// read, which no dynamic runtime could do). The inputs come first, then a node
// `inputs_ready` that reads them all and that every node reading only inputs also reads (so
// every schedule makes all inputs before any other node), then the other nodes in their
// order, and last a node `hold_inputs` that reads every input. Both added nodes have no
// bytes and no cost; node ids change, sites do not.
Graph hold_inputs(Graph graph);

// A schedule of a hold_inputs() graph with its `hold_inputs` node moved to the end. Nothing
// reads that node, so a planner may place it anywhere, and where it comes early docs/formats.md's
// accounting frees the inputs early; moved last, the schedule's simulated peak is what a
// runtime that holds its parameters needs. Returns whether it moved anything (then the plan
// must be simulated again).
bool hold_inputs_to_the_end(const Graph& graph, Schedule& schedule);

}  // namespace remat

#endif  // REMAT_GRAPH_TRANSFORMS_H_
