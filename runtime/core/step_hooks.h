// How a training step and the runtime core meet, both ways. The core runs, evicts and
// recomputes; a step (Step with its StepRecorder and PlanFollower: positions, recording,
// plan following) is told at fixed points what the core did (StepHooks), and may take over
// when a new op runs (a followed plan defers it). What the step may ask of the core is
// StepHost: the lineage read-only, the few fields a step stamps on it (sites, recorded nodes,
// deferrals, holds), and running, evicting and releasing. Outside a step there is no
// StepHooks object and the core calls nothing.
#ifndef REMAT_RUNTIME_CORE_STEP_HOOKS_H_
#define REMAT_RUNTIME_CORE_STEP_HOOKS_H_

#include <cstdint>
#include <span>
#include <vector>

#include "remat/errors.h"
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

// What a step may ask of the core (RuntimeImpl implements it).
class StepHost {
 public:
  virtual ~StepHost() = default;

  // The lineage, read-only.
  virtual const TensorRec& tensor(Id t) const = 0;
  virtual const OpRec& op(Id op) const = 0;
  virtual const StorageRec& storage(Id s) const = 0;

  // What a step stamps on the lineage: where a tensor or an op sits in step `stamp`
  // (TensorRec::step, position, output, node reset to -1; OpRec::step, position), the node a
  // recording gave a tensor, and the step's holds on a storage (StorageRec::holds).
  virtual void set_tensor_site(Id t, std::uint32_t stamp, int position, int output) = 0;
  virtual void set_tensor_node(Id t, int node) = 0;
  virtual void set_op_site(Id op, std::uint32_t stamp, int position) = 0;
  virtual void set_holds(Id s, std::uint32_t holds) = 0;
  // A followed plan defers an op (OpRec::deferred; it keeps an extra reference, dropped with
  // release_op_ref once it has run), ends the deferral, and reports one that stayed deferred
  // past its call (counted; its outputs are born evicted as far as the policy can tell).
  virtual void defer(Id op) = 0;
  virtual void end_deferral(Id op) = 0;
  virtual void note_deferred(Id op) = 0;

  // Runs `op` (a recomputation if `recompute`) once its inputs are resident, recomputing
  // what they need first; errors name it.
  virtual void run_op(Id op, bool recompute) = 0;
  virtual bool evictable(Id s) const = 0;
  // Evicts a storage the plan frees (counted as a hint eviction).
  virtual void evict_for_hint(Id s) = 0;
  virtual void release_if_dead(Id s) = 0;  // frees a resident storage that nothing holds
  virtual void release_op_ref(Id op) = 0;  // drops a reference to an op, then what that frees
  // A followed plan's offloads (Note [Copies beside the kernels] in host_tier.cc): a copy to
  // the host begun, the device memory given back, a copy back begun; false where the core
  // may not (the storage is not where the plan has it, or host memory is full).
  virtual bool copy_to_host(Id s) = 0;
  virtual bool offload(Id s) = 0;
  virtual bool prefetch(Id s) = 0;

  // The eviction policy: whether it acts on hints, and a storage's weight from them; a hint
  // that named another op.
  virtual bool uses_hints() const = 0;
  virtual void set_hint_weight(Id s, float weight) = 0;
  virtual void count_hint_mismatch() = 0;
  // The memory resource's error, completed with the op being run and the locked bytes.
  virtual OutOfMemoryError annotated(const OutOfMemoryError& e) = 0;
};

}  // namespace remat::detail

#endif  // REMAT_RUNTIME_CORE_STEP_HOOKS_H_
