// remat/static_replay.h: a planner's schedule executed exactly by the runtime, so that static
// plans and dynamic policies are measured by the same allocator on the same program.
//
// Usage:
//   remat::PlanOptions opt;
//   remat::Graph g = remat::hold_inputs(remat::read_graph_file(path).value());
//   remat::Plan plan = remat::run_planner("twremat", g, opt).value();
//   auto r = remat::static_replay(g, plan.schedule, {.accounting = remat::Accounting::kAllocator});
//   if (r.ok()) std::cout << r->peak_reserved_bytes - plan.sim.peak_bytes;  // allocator's share
//
// (hold_inputs() is in remat/graph_transforms.h, run_planner() in remat/planner.h.) Only the
// IR (remat/graph.h, remat/schedule.h) is used: the runtime does not link the planner.
#ifndef REMAT_STATIC_REPLAY_H_
#define REMAT_STATIC_REPLAY_H_

#include <absl/status/statusor.h>

#include <cstddef>

#include "remat/graph.h"
#include "remat/runtime.h"
#include "remat/schedule.h"

namespace remat {

struct StaticReplayOptions {
  Accounting accounting = Accounting::kAllocator;
  bool record_timeline = false;
  CachingAllocatorOptions allocator = {};
  HostLink host_link = HostLink::pcie5();  // prices the schedule's offloads on the clock
};

struct StaticReplayResult {
  std::size_t peak_reserved_bytes = 0;   // what the allocator reserved (logical: = allocated)
  std::size_t peak_allocated_bytes = 0;  // sum of live tensor sizes at its highest
  double cost = 0;                       // summed cost of every step run
  double overhead = 0;                   // cost / (every node once) - 1, as simulate() counts
  std::size_t recomputations = 0;
  std::size_t evictions = 0;  // instances the schedule frees while a later one follows
  std::size_t offloads = 0;   // instances sent to host memory (Schedule::offloads)
  double wall_seconds = 0;
  Timeline timeline;  // with StaticReplayOptions::record_timeline
};

// Runs `schedule` on the simulated backend with no budget: the n-th step computes its node
// (first instance: a new op; later ones: the runtime recomputes the evicted tensor), and after
// each step every instance read for the last time is evicted (another instance follows) or
// released (none does), as docs/formats.md's accounting frees it. Each node is its own tensor
// (views counted at full size, group members computed one by one), as simulate() counts
// them. Inputs are made by ops of no inputs rather than as pinned constants, so that they too
// are freed after their last read. An offload's instance is copied to the host after the
// step that makes it (Runtime::copy_to_host), leaves the device before its `free` step
// (offload) and is copied back from its `fetch` step (prefetch), on the runtime's copy engines
// as simulate() runs them, so the replay costs what the schedule does. (Except in a graph
// whose groups run whole, Graph::whole_groups: each member is still its own op of its share,
// so a schedule computing a member apart costs less here than simulate() says and the runtime
// pays.) An invalid schedule is an error naming the step and the node.
absl::StatusOr<StaticReplayResult> static_replay(const Graph& graph, const Schedule& schedule,
                                                 const StaticReplayOptions& options = {});

}  // namespace remat

#endif  // REMAT_STATIC_REPLAY_H_
