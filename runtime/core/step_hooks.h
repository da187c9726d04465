// The hooks through which a training step joins the runtime core. The core runs, evicts and
// recomputes; a step (runtime/steps: positions, recording, plan following) is told at fixed
// points what the core did, and may take over when a new op runs (a followed plan defers it).
// Outside a step there is no StepHooks object and the core calls nothing.
#ifndef REMAT_RUNTIME_CORE_STEP_HOOKS_H_
#define REMAT_RUNTIME_CORE_STEP_HOOKS_H_

#include <span>
#include <vector>

#include "remat/op.h"
#include "runtime/core/lineage.h"

namespace remat::detail {

class StepHooks {
 public:
  virtual ~StepHooks() = default;

  // The position of the op about to be registered (the step's n-th call).
  virtual int next_position() = 0;
  // A constant was made during the step.
  virtual void on_constant(Id tensor) = 0;
  // A new op is registered at `position` (outputs made, no memory yet): runs it, now or where
  // a followed plan places it (RuntimeImpl::run_frames does the running).
  virtual void run_new_op(Id op, int position) = 0;
  // After the new op's outputs were touched: evictions its hints ask for.
  virtual void after_new_op() = 0;
  // The new op failed: ends its deferral if it had one (then the op's extra reference must go).
  virtual bool cancel_new_op(Id op) = 0;
  // An op ran (`first_run`: not a recomputation), its outputs still locked.
  virtual void on_ran(Id op, bool first_run) = 0;
  // A storage that a top-level run (no op waiting for it) has just filled: true if the step
  // holds it (a plan step's output stays until the plan frees it), false to let the core
  // decide.
  virtual bool holds_fresh(Id storage) = 0;
  // A top-level request (run_frames) ended, normally or not.
  virtual void on_request_end() = 0;
  // Before an update at `position` writes pinned memory, and after it ran.
  virtual void before_update(int position) = 0;
  virtual void on_update(const OpDef& op, const std::vector<Id>& args, double cost, int position,
                         const std::vector<Id>& frozen) = 0;
  // The program read a tensor back (data(), read()), or dropped its last handle.
  virtual void on_host_read(Id tensor) = 0;
  virtual void on_handles_gone(Id tensor) = 0;
  // A storage record is destroyed (its id may be reused).
  virtual void on_destroyed(Id storage) = 0;
};

}  // namespace remat::detail

#endif  // REMAT_RUNTIME_CORE_STEP_HOOKS_H_
