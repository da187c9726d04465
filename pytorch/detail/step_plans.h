// Policy `auto` on the device: the program's marked steps (remat_torch.step(), StepScope)
// recorded, planned and followed (Note [Planned steps on the device] in step_plans.cc).
#ifndef REMAT_PYTORCH_DETAIL_STEP_PLANS_H_
#define REMAT_PYTORCH_DETAIL_STEP_PLANS_H_

#include <cstddef>
#include <memory>
#include <string>

#include "remat/hints.h"
#include "remat/runtime.h"
#include "remat/torch.h"

namespace remat::torch_backend::detail {

using torch_backend::PlanReport;
using torch_backend::ScreenedCandidate;

class StepPlans {
 public:
  // The options of the step that begins now, under `budget` (SIZE_MAX: none).
  StepOptions begin_step(std::size_t budget);
  // The step has ended (Runtime::end_step returned `step`) with this compute overhead, and
  // this many hints that did not match the step's ops.
  void end_step(RecordedStep step, double overhead, std::size_t hint_mismatches);
  // Forgets the plan (the budget or the policy changed): the next steps warm up and record.
  void reset();
  PlanReport report() const;

 private:
  enum class Phase { kWarmUp, kRecording, kTrial, kPlan, kDtr };
  void plan(const RecordedStep& step, double dtr_overhead);

  Phase phase_ = Phase::kWarmUp;
  std::size_t budget_ = SIZE_MAX;
  std::shared_ptr<const StepHints> hints_;
  PlanReport report_;
};

}  // namespace remat::torch_backend::detail

#endif  // REMAT_PYTORCH_DETAIL_STEP_PLANS_H_
