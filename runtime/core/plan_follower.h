// Follows a static plan's schedule during a step (Note [Following a schedule] in
// remat/hints.h): defers the program's ops until the plan computes them, recomputes what the
// plan recomputes, and frees what it frees. Its holds on storages (a deferred op's pending
// reads, the plan's instances) are its own; the core sees only their sum
// (StorageRec::holds), which keeps a dead storage resident.
#ifndef REMAT_RUNTIME_CORE_PLAN_FOLLOWER_H_
#define REMAT_RUNTIME_CORE_PLAN_FOLLOWER_H_

#include <absl/container/flat_hash_map.h>

#include <cstddef>
#include <vector>

#include "remat/hints.h"
#include "runtime/core/step_hooks.h"

namespace remat::detail {

class Step;

class PlanFollower {
 public:
  PlanFollower(StepHost& rt, const Step& step);

  bool following() const { return following_; }
  // The new op at `position` starts deferred; the plan's steps up to it run, its own first
  // run among them unless the plan computes it after an op not called yet. A null `hint`
  // (no hint, or one naming another op) stops the cursor and runs the op now.
  void follow(Id op_id, int position, const OpHint* hint);
  // Before an update at `position`: what the plan computes before it, and every deferred op.
  void settle_before_update(int position);
  // At the end of the step (`end`: the number of ops called): the plan's steps left for ops
  // called, and every op still deferred.
  void finish(int end);
  void abandon();                  // nothing stays deferred or held
  bool cancel_deferral(Id op_id);  // ends a deferral without running; false: none
  void on_ran(Id op_id);           // a deferred op is running: its pending reads end
  bool holds_fresh(Id storage);    // a plan step's op made it: held until the plan frees it
  void on_request_end();           // the references deferred ops held until they ran go
  void forget(Id storage);         // its record is gone

 private:
  struct Hold {
    std::uint32_t pending_reads = 0;  // reads by deferred ops that have not run yet
    // Instances of the plan that live on it (a view's and its base's share one storage),
    // and whether a plan step made it resident before any instance claimed it (the other
    // outputs of a multi-output op).
    std::uint32_t plan_refs = 0;
    bool plan_spec = false;
  };
  Hold* find_hold(Id s);
  bool end_deferral(Id op_id);
  void sync(Id s);  // the core's count from the hold; a hold of nothing goes

  void run_plan_through(int last, Id called = kNone);
  void run_plan_step(const PlanStep& step);
  void claim_for_plan(Id s);
  void free_planned(const StepSite& site, bool evict_held);
  void with_storage(const StepSite& site, bool (StepHost::*move)(Id));
  void release_unclaimed();  // after a plan step: Note [Outputs the plan does not claim]
  void let_go(Id s, std::uint32_t pending, bool evict_held);
  void run_remaining_plan(int end);
  void run_deferred();
  void stop_following();

  StepHost& rt_;
  const Step& step_;
  bool following_ = true;
  std::size_t cursor_ = 0;         // the plan's next step
  bool plan_run_ = false;          // a plan step is running: its op's outputs stay resident
  std::vector<Id> deferred_;       // ops deferred in this step, in order
  std::vector<Id> undeferred_;     // deferred ops run by the current request
  std::vector<Id> plan_storages_;  // storages the plan holds
  std::vector<Id> fresh_;          // made by the current position's plan steps (holds_fresh)
  absl::flat_hash_map<Id, Hold> holds_;
};

}  // namespace remat::detail

#endif  // REMAT_RUNTIME_CORE_PLAN_FOLLOWER_H_
