// A program's steps on the simulated backend, as the driver's runtime would run them: the
// recording of a step DTR could not run, the trace a plan's placement is laid out from, and
// the screening of candidate plans (Note [Screening plans] in driver/shape_plans.h).
#ifndef REMAT_DRIVER_SIMULATED_STEPS_H_
#define REMAT_DRIVER_SIMULATED_STEPS_H_

#include <cstddef>
#include <optional>
#include <string>
#include <utility>

#include "driver/shape_plans.h"
#include "remat/runtime.h"
#include "remat/step_driver.h"

namespace remat::detail {

// Runs step `step` of `program` on `state` in `rt` as one runtime step with `options`.
RecordedStep run_program_step(Runtime& rt, TrainingProgram& program, TrainingProgram::State& state,
                              int step, StepOptions options);

class SimulatedSteps {
 public:
  // `real`: the options of the driver's runtime (its budget is the one screened against).
  SimulatedSteps(TrainingProgram& program, RuntimeOptions real, int screened_steps, bool placement)
      : program_(program),
        real_(std::move(real)),
        screened_steps_(screened_steps),
        placement_(placement) {}

  // Note [Planning a step DTR cannot run] in shape_plans.cc: step `step` recorded without a
  // budget.
  RecordedStep record_unbudgeted(int step);
  // ShapePlans::Screen for step `step`.
  std::optional<ShapePlans::StepCost> screen(int step, StepPlan* plan, bool after_dtr);

 private:
  RuntimeOptions simulated(std::size_t budget) const;
  // Step `step` in a fresh simulated runtime without a budget: a plain first step, then one
  // with `options`; what the second recorded, and its allocation trace where it traced them.
  std::pair<RecordedStep, AllocationSequence> run_unbudgeted(int step, const StepOptions& options);
  std::shared_ptr<const Placement> place_plan(int step,
                                              const std::shared_ptr<const StepHints>& hints);

  TrainingProgram& program_;
  RuntimeOptions real_;
  int screened_steps_;
  bool placement_;
};

}  // namespace remat::detail

#endif  // REMAT_DRIVER_SIMULATED_STEPS_H_
