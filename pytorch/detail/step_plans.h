// Policy `auto` on the device: the program's marked steps (remat_torch.step(), StepScope)
// recorded, planned and followed (Note [Planned steps on the device] in step_plans.cc).
#ifndef REMAT_PYTORCH_DETAIL_STEP_PLANS_H_
#define REMAT_PYTORCH_DETAIL_STEP_PLANS_H_

#include <absl/container/flat_hash_set.h>

#include <cstddef>
#include <memory>
#include <string>

#include "remat/hints.h"
#include "remat/placement.h"
#include "remat/runtime.h"
#include "remat/torch.h"

namespace remat::torch_backend::detail {

using torch_backend::PlanReport;
using torch_backend::ScreenedCandidate;

class StepPlans {
 public:
  // The options of the step that begins now, under `budget` (SIZE_MAX: none).
  StepOptions begin_step(std::size_t budget);
  // How a step went: what Runtime::end_step returned, its compute overhead and wall time, how many
  // hints did not match its ops, the bytes of the storages pinned from its start to its end that it
  // never read (the optimizer's state), and the most scratch one of its kernels asked for.
  struct StepOutcome {
    RecordedStep step;
    double overhead = 0;
    double seconds = 0;  // wall time, first operator to the optimizer's first call
    std::size_t hint_mismatches = 0;
    std::size_t unread_bytes = 0;
    std::size_t max_scratch_bytes = 0;
  };
  void end_step(StepOutcome outcome);
  // An operator (by name) that runs as soon as it is called although a followed plan would
  // defer it (Note [Random operators run when called]): the placement's replay runs it so.
  void runs_when_called(const std::string& op) { run_when_called_.insert(op); }
  // Forgets the plan (the budget or the policy changed): the next steps warm up and record.
  void reset();
  PlanReport report() const;

 private:
  enum class Phase { kWarmUp, kRecording, kTrial, kPlan, kDtr };
  void plan(const StepOutcome& recorded);
  // The budget the recorded step's plans are made for (Note [What the trace does not see]).
  std::size_t planning_budget(const StepOutcome& recorded);

  Phase phase_ = Phase::kWarmUp;
  std::size_t budget_ = SIZE_MAX;
  std::shared_ptr<const StepHints> hints_;
  std::shared_ptr<const Placement> placement_;  // hints_'s requests, placed
  absl::flat_hash_set<std::string> run_when_called_;
  PlanReport report_;
};

}  // namespace remat::torch_backend::detail

#endif  // REMAT_PYTORCH_DETAIL_STEP_PLANS_H_
