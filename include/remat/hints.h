// remat/hints.h: what a static plan tells the dynamic runtime, keyed so that it still applies
// when shapes change (part of the IR, remat::ir; the cache of plans by shape is
// remat/plan_cache.h).
//
// Usage (remat/step_driver.h runs the whole loop: record, plan, follow):
//   remat::Runtime rt({.policy = "hinted"});            // other policies ignore hints
//   remat::PlanCache cache;                              // remat/plan_cache.h
//   remat::PlanOptions opt;                              // remat/planner.h
//   remat::StepOptions so;
//   so.hints = cache.find({batch, seq_len}).hints;       // null until a plan is cached
//   so.record = first_time;
//   rt.begin_step(so);
//   ... forward, rt.mark_backward(), backward ...
//   remat::RecordedStep step = rt.end_step();            // the step as a graph and a trace
//   remat::Plan plan = remat::run_planner("twremat", step.graph, opt).value();
//   cache.insert({batch, seq_len}, std::make_shared<remat::StepHints>(remat::hints_from_schedule(
//       step.graph, plan.schedule, remat::recorded_sites(step.graph), "twremat")));
//
// Note [Hints by position]
// A hint names an op by its position in the step (the runtime's n-th call since begin_step)
// and an output by its index, never by tensor ids, which differ from one step to the next.
// A training loop makes the same calls in the same order whatever its sequence length or
// batch size, so a plan made at one shape applies at every other. Each op hint carries the
// op's name; where the running step's op at a position has another name, the step's
// structure differs from the planned one and the runtime ignores that hint (counting it in
// RuntimeStats::hint_mismatches) rather than act on the wrong tensor.
//
// Note [Following a schedule]
// Weights and early evictions alone only steer DTR toward a plan: the runtime still
// recomputes in its own order, and it cannot run what the plan computes before the program
// asks for it. So the hints also carry the plan's schedule (StepHints::schedule), one entry
// per computation, and `hinted` follows it with a cursor. When the program calls the op at
// position p, the runtime registers it (lineage, shapes, RNG state) and then runs plan steps
// in order for as long as they name ops already called: a first run of such an op, a
// recomputation of an evicted output, and after each step the evictions the plan makes
// there. If the plan computes p only after some op the program has not called yet, p stays
// deferred: its outputs exist as handles but hold no memory, like evicted tensors that were
// never computed, until the plan's cursor reaches them or something reads them. Memory then
// follows the plan's profile step for step, reordered plans (TWRemat) included; a deferred
// op's inputs are kept until it has run. Once the op being called has run, the cursor stops
// until the program's next call (or update, or end of step): until `call` returns, the
// program holds handles to results the plan already dropped, and running later steps then
// would put memory above the plan's profile. Deviations are safe: a read of a deferred tensor
// computes it on demand, a tensor the plan says is resident but is not gets recomputed, the
// budget still binds (DTR's weighted scores choose what else to evict), an op whose name
// differs from the plan's stops the cursor for the rest of the step, and end_step() runs
// whatever is still deferred. A plan's offloads go along too (PlanStep::copy_after,
// offload_before, prefetch_before): the follower asks the core to begin an instance's copy
// to the host once it is made, to give its device memory back and to begin its copy back
// where the plan says, so that the copies run beside the kernels as the schedule's
// simulator ran them; a request the core refuses (the instance evicted meanwhile, host
// memory full) leaves the instance to come back by recomputation.
#ifndef REMAT_HINTS_H_
#define REMAT_HINTS_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "remat/graph.h"
#include "remat/schedule.h"

namespace remat {

struct OutputHint {
  bool keep = false;        // the plan computes it once and keeps it to its last read
  bool recomputed = false;  // the plan computes it more than once (it may be evicted)
};

// A tensor of the step: output `output` of the op at position `position`.
struct StepSite {
  int position = -1;
  int output = 0;
  friend bool operator==(const StepSite&, const StepSite&) = default;
};

struct OpHint {
  std::string op;                     // the op's name when planned (a mismatch voids the hint)
  std::vector<OutputHint> outputs;    // by output index
  std::vector<StepSite> evict_after;  // tensors the plan frees once this op has run
};

// One computation of the plan: the op at `site.position` runs (its first run, or a
// recomputation of output `site.output`), then the plan frees `free_after` (evicted if the
// program still holds them) and lets go of `drop_after` (results of the step, which the
// program may still read: freed only if it no longer holds them).
struct PlanStep {
  StepSite site;
  std::vector<StepSite> free_after;
  std::vector<StepSite> drop_after;
  // The plan's offloads (Schedule::offloads): tensors that leave the device before this step
  // and tensors whose copy back starts before it, and tensors whose copy to the host starts
  // once it has run (Runtime::offload, prefetch, copy_to_host).
  std::vector<StepSite> offload_before = {};
  std::vector<StepSite> prefetch_before = {};
  std::vector<StepSite> copy_after = {};
};

struct StepHints {
  std::string source;       // what made them, e.g. "twremat @ 0.5"
  std::vector<OpHint> ops;  // by position in the step
  // The plan itself, in order (Note [Following a schedule]); empty: weights and evict_after
  // only.
  std::vector<PlanStep> schedule;
};

// Signature of a step as the runtime saw it: its op sequence (names, arities) and its
// shapes. Two steps with the same `structure` take the same hints.
struct StepSignature {
  std::uint64_t structure = 0;
  std::uint64_t shapes = 0;
  std::size_t ops = 0;
  friend bool operator==(const StepSignature&, const StepSignature&) = default;
};

// The runtime's hints for a schedule of `g`: `sites[v]` is where node v runs in the step
// (recorded_sites() or trace_sites() of remat/graph_transforms.h). Nodes the schedule
// computes once are kept, the others marked recomputed, and every instance the schedule
// frees is evicted after the step's op that comes at or after its last read (unless its next
// instance is made before that op: the runtime keeps it resident instead). Outputs of `g`
// are never evicted after their last instance. The schedule itself goes along, step by step
// with what each step frees and offloads, for the runtime to follow (Note [Following a
// schedule]).
StepHints hints_from_schedule(const Graph& g, const Schedule& s, const std::vector<StepSite>& sites,
                              std::string source);

}  // namespace remat

#endif  // REMAT_HINTS_H_
