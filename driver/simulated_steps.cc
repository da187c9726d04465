#include "driver/simulated_steps.h"

#include <absl/strings/str_cat.h>

#include <memory>
#include <optional>

#include "remat/errors.h"
#include "remat/placement.h"

namespace remat::detail {

RecordedStep run_program_step(Runtime& rt, TrainingProgram& program, TrainingProgram::State& state,
                              int step, StepOptions options) {
  rt.begin_step(std::move(options));
  program.run_step(rt, state, step);
  return rt.end_step();
}

// The driver's runtime on the simulated backend, under policy `hinted` and `budget`, pricing
// ops as the real one does.
RuntimeOptions SimulatedSteps::simulated(std::size_t budget) const {
  RuntimeOptions sim = real_;
  sim.backend = Backend::kSimulated;
  sim.policy = "hinted";
  sim.budget = budget;
  sim.record_timeline = false;
  sim.cuda = {};
  if (!sim.roofline)
    sim.roofline = real_.backend == Backend::kCuda ? Roofline::gpu() : Roofline::cpu();
  return sim;
}

// Without a budget nothing but a plan evicts: a plain first step, as the real run has had,
// then one with `options`.
std::pair<RecordedStep, AllocationSequence> SimulatedSteps::run_unbudgeted(
    int step, const StepOptions& options) {
  Runtime rt(simulated(SIZE_MAX));
  const std::unique_ptr<TrainingProgram::State> state = program_.make_state(rt);
  run_program_step(rt, program_, *state, step, {});
  RecordedStep recorded = run_program_step(rt, program_, *state, step, options);
  return {std::move(recorded), rt.take_allocation_sequence()};
}

// Note [Placed allocations] in step_placement.cc: the requests of step `step` following
// `hints`, traced without a budget.
std::shared_ptr<const Placement> SimulatedSteps::place_plan(
    int step, const std::shared_ptr<const StepHints>& hints) {
  StepOptions traced;
  traced.hints = hints;
  traced.record_allocations = true;
  return std::make_shared<const Placement>(place_allocations(run_unbudgeted(step, traced).second));
}

RecordedStep SimulatedSteps::record_unbudgeted(int step) {
  StepOptions record;
  record.record = true;
  record.name = absl::StrCat(program_.name(), "_step", step);
  return run_unbudgeted(step, record).first;
}

// Note [Screening plans] in shape_plans.h: step `step` on a simulated runtime under the real
// budget, as the real run meets it: once under DTR, once recorded, then following the plan
// screened_steps_ times; the dearest of those (the recorded one where `plan` is null).
std::optional<ShapePlans::StepCost> SimulatedSteps::screen(int step, StepPlan* plan,
                                                           bool after_dtr) {
  const std::shared_ptr<const StepHints> hints = plan != nullptr ? plan->hints : nullptr;
  std::optional<Runtime> runtime;
  // The arena the plan's first step needed, and the room it had (also where it failed).
  auto note_arena = [&] {
    const auto* caching = dynamic_cast<const CachingAllocator*>(&runtime->memory());
    if (caching == nullptr || plan == nullptr || plan->placement == nullptr) return;
    plan->arena = caching->last_placement();
  };
  int pass = hints && !after_dtr ? 2 : 0;
  try {
    if (plan != nullptr && placement_) plan->placement = place_plan(step, hints);
    Runtime& rt = runtime.emplace(simulated(real_.budget));
    const std::unique_ptr<TrainingProgram::State> state = program_.make_state(rt);
    ShapePlans::StepCost worst;
    for (; pass < (hints ? 2 + screened_steps_ : 2); ++pass) {
      StepOptions opt;
      opt.record = pass == 1;
      if (pass >= 2) {
        opt.hints = hints;
        opt.placement = plan->placement;
      }
      const RuntimeStats before = rt.stats();
      run_program_step(rt, program_, *state, step, opt);
      const RuntimeStats after = rt.stats();
      if (pass == 2) note_arena();
      const double recompute = after.recompute_cost - before.recompute_cost +
                               after.transfer_exposed - before.transfer_exposed;
      if (pass >= (hints ? 2 : 1) && recompute >= worst.recompute)
        worst = {.base = after.base_cost - before.base_cost, .recompute = recompute};
    }
    return worst;
  } catch (const OutOfMemoryError&) {
  } catch (const ThrashError&) {
  }
  if (pass == 2 && runtime.has_value()) note_arena();
  return std::nullopt;
}

}  // namespace remat::detail
