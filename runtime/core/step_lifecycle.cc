// Steps on the core's side: beginning, ending and aborting the Step that joins the core
// (step.h), and StepHost, what that step may ask of the core.
#include <memory>
#include <utility>

#include "runtime/core/runtime_impl.h"
#include "runtime/core/step.h"

namespace remat::detail {

void RuntimeImpl::begin_step(StepOptions options) {
  if (step != nullptr) end_step();  // runs what the unfinished step deferred
  // Recomputations between steps (a program's optimizer reading evicted gradients) leave
  // lingering storages too (Note [Lingering storages]); a step does not start with them, and
  // a placement's arena needs their room.
  free_lingering();
  if (caching != nullptr) {
    // Note [Plans start from an empty cache]
    // A plan's step meets the allocator as the last step left it: cached segments of the
    // sizes that step happened to reserve, which best fit then cuts the plan's tensors
    // from. The layout, and with it the evictions the plan did not choose, drifts from step
    // to step, until a plan that was cheap in its first step recomputes several steps' cost
    // or runs out of memory (docs/measurements.md). A step that follows a plan therefore
    // starts with every cached segment given back, so that it starts where its screening
    // started and costs the same every time; one with a placement starts in its own arena
    // (Note [Placed allocations]).
    caching->end_placement();
    if (options.placement != nullptr) pack_for_placement();
    if (options.record_allocations) caching->record_allocations();
    const bool placed = options.placement != nullptr && caching->begin_placement(options.placement);
    const bool follows_plan = policy->uses_hints() && options.hints != nullptr &&
                              !options.hints->schedule.empty();  // as Step decides
    if (!placed && follows_plan) caching->release_cached();
    // Note [Later steps start warm]
    // A step that follows no plan keeps the segments the last step cached. The first step of
    // a run starts from none, so under a tight budget a later step meets another layout,
    // evicts other tensors, and at a budget within a few hundredths of the lowest that fits
    // can need more than the first did (in allocator accounting, rarely: the property test
    // tests/repeated_steps_property_test.cc allows it there). Starting every step from an
    // empty cache removes that, but costs more than it saves: DTR's later steps then
    // recompute about twice what they do warm (docs/measurements.md). What made later steps differ
    // everywhere else is gone: ties between candidates go to the earliest (Note [Ties go to
    // the earliest]), each step keeps time from its own start (Note [Each step's own
    // clock]), and fragmented free memory is joined by evacuation (Note [Evacuating
    // segments]).
  }
  start_step_clock();
  step_rng_start = rng_counter();
  step_unfinished = true;
  step = std::make_unique<Step>(*this, std::move(options), ++steps_begun);
}

// Note [Each step's own clock]
// The policies weigh a candidate by its staleness, the simulated time since its last use,
// which the runtime keeps as two doubles: the clock, and the clock when the storage was
// last read. Kept from the start of the run, both grow with every step, and their difference
// is rounded at ever coarser steps: two candidates that tie in the first step (outputs of
// one op, a layer repeated) differ by a rounding in a later one, and scores that were
// ordered one way are ordered the other. Each step then evicted other tensors than the one
// before; on the 6-layer example GPT the recomputation grew from 1.99 of a step to 2.43 by
// the fourth (docs/measurements.md). So the clock starts from zero at every step: the time
// before is kept aside (`clock_base`, which reports and timelines add back), and every time
// held against the clock (storages' last uses and copy-backs, the candidate index, the host
// tier's copy engines) is moved back with it. Two steps that start from the same state now
// make the same decisions bit for bit.
void RuntimeImpl::start_step_clock() {
  const double by = clock;
  if (by == 0) return;
  clock_base += by;
  clock = 0;
  for (Id s = 0; s < storages.slots(); ++s) {
    storages[s].last_access -= by;
    storages[s].ready_at -= by;
  }
  candidates_->shift_times(by);
  host_.shift_times(by);
}

void RuntimeImpl::mark_backward() {
  if (step != nullptr) static_cast<Step&>(*step).mark_backward();
}

RecordedStep RuntimeImpl::end_step() {
  auto* ending = static_cast<Step*>(step.get());
  if (ending != nullptr) {
    try {
      ending->finish();
    } catch (...) {
      step.reset();
      throw;
    }
  }
  free_lingering();
  step_unfinished = false;
  const std::unique_ptr<StepHooks> done = std::move(step);  // gone, whatever
  return ending != nullptr ? ending->result() : RecordedStep{};
}

void RuntimeImpl::abort_step() {
  // Also after an end_step() that threw: that step is gone but did not end well.
  if (!step_unfinished) return;
  step_unfinished = false;
  if (auto* aborted = static_cast<Step*>(step.get())) aborted->abandon();
  free_lingering();
  step.reset();
  rewind_rng(step_rng_start);
  if (caching != nullptr) {
    caching->end_placement();
    caching->take_allocations();
  }
}

AllocationSequence RuntimeImpl::take_allocation_sequence() {
  return caching != nullptr ? caching->take_allocations() : AllocationSequence{};
}

void RuntimeImpl::materialize(Id tensor) {
  make_resident(tensor);
  if (step) step->on_host_read(tensor);
}

// ---------------------------------------------------------------------------------------
// StepHost

void RuntimeImpl::set_tensor_site(Id t, std::uint32_t stamp, int position, int output) {
  TensorRec& tr = tensors[t];
  tr.step = stamp;
  tr.position = position;
  tr.output = output;
  tr.node = -1;
}

void RuntimeImpl::set_op_site(Id o, std::uint32_t stamp, int position) {
  ops[o].step = stamp;
  ops[o].position = position;
}

void RuntimeImpl::defer(Id o) {
  ops[o].deferred = true;
  ++ops[o].refs;  // the op must outlive its outputs' handles until it has run
}

void RuntimeImpl::note_deferred(Id o) {
  ++stats.deferred_ops;
  for (Id s : ops[o].out_storages)
    if (s != kNone) policy->on_evicted(s);  // born evicted, as far as the policy can tell
}

void RuntimeImpl::run_op(Id o, bool recompute) {
  current_op = ops[o].op->name;
  run_frames(o, recompute);
}

void RuntimeImpl::evict_for_hint(Id s) {
  evict(s);
  ++stats.hint_evictions;
}

bool RuntimeImpl::uses_hints() const { return policy->uses_hints(); }

void RuntimeImpl::set_hint_weight(Id s, float weight) { policy->set_weight(s, weight); }

}  // namespace remat::detail
