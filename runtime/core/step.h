// A training step under way: op positions, the step's signature, hints from a static plan,
// and the two collaborators a step may have, a StepRecorder (StepOptions::record) and a
// PlanFollower (hints that carry a schedule). It joins the runtime core through StepHooks.
#ifndef REMAT_RUNTIME_CORE_STEP_H_
#define REMAT_RUNTIME_CORE_STEP_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "remat/hints.h"
#include "remat/runtime.h"
#include "runtime/core/step_hooks.h"

namespace remat::detail {

class StepRecorder;
class PlanFollower;

class Step final : public StepHooks {
 public:
  Step(StepHost& rt, StepOptions options, std::uint32_t stamp);
  ~Step() override;

  int next_position() override { return position_++; }
  void on_constant(Id tensor) override;
  void run_new_op(Id op, int position) override;
  void after_new_op() override;
  bool cancel_new_op(Id op) override;
  void on_ran(Id op, bool first_run) override;
  bool holds_fresh(Id storage) override;
  void on_request_end() override;
  void before_update(int position) override;
  void on_update(const OpDef& op, const std::vector<Id>& args, double cost, int position,
                 const std::vector<Id>& frozen) override;
  void on_host_read(Id tensor) override;
  void on_handles_gone(Id tensor) override;
  void on_destroyed(Id storage) override;

  void mark_backward();
  // Runs what a followed plan still computes and every op still deferred: a step's results
  // are all computed once it is over. On failure the step is abandoned (nothing stays
  // deferred or held) and the error rethrown.
  void finish();
  void abandon();         // nothing stays deferred or held; what was deferred never runs
  RecordedStep result();  // what was recorded, and the signature; after finish()

  // For the collaborators.
  std::uint32_t stamp() const { return stamp_; }
  Phase phase() const { return phase_; }
  const StepHints& hints() const { return *hints_; }
  Id op_at(int position) const;                // the step's op there, kNone: none (any more)
  Id site_tensor(const StepSite& site) const;  // the step's tensor there, kNone: none

 private:
  // Gives the new op and its outputs their sites, and the outputs their hint weights;
  // returns the op's hint when it matches the op.
  const OpHint* place_op(Id op_id, int position);
  void enter_position(const std::string& name, const std::vector<Id>& inputs,
                      std::span<const TensorSpec> outputs, int position);
  bool is_step_tensor(Id t, int position, int output) const;
  void evict_hinted(const OpHint& hint);

  StepHost& rt_;
  std::uint32_t stamp_;
  int position_ = 0;  // of the next op
  Phase phase_ = Phase::kForward;
  StepSignature signature_;
  std::shared_ptr<const StepHints> hints_;  // null: a step without hints
  std::vector<std::vector<Id>> outputs_;    // per position: the output tensors
  std::vector<Id> ops_at_;                  // per position: the op (kNone: an update)
  const OpHint* new_op_hint_ = nullptr;     // of the op run_new_op() ran, for after_new_op()
  bool new_op_followed_ = false;
  std::unique_ptr<StepRecorder> recorder_;
  std::unique_ptr<PlanFollower> follower_;
};

}  // namespace remat::detail

#endif  // REMAT_RUNTIME_CORE_STEP_H_
