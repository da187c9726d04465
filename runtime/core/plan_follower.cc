// Following a static plan's schedule (Note [Following a schedule] in remat/hints.h).
#include "runtime/core/plan_follower.h"

#include "runtime/core/step.h"

namespace remat::detail {

PlanFollower::PlanFollower(StepHost& rt, const Step& step) : rt_(rt), step_(step) {}

PlanFollower::Hold* PlanFollower::find_hold(Id s) {
  auto it = holds_.find(s);
  return it == holds_.end() ? nullptr : &it->second;
}

void PlanFollower::sync(Id s) {
  auto it = holds_.find(s);
  if (it == holds_.end()) return;
  const Hold& h = it->second;
  const std::uint32_t holds = h.pending_reads + h.plan_refs + (h.plan_spec ? 1 : 0);
  rt_.set_holds(s, holds);
  if (holds == 0) holds_.erase(it);
}

void PlanFollower::forget(Id s) { holds_.erase(s); }

// A hint that does not match (another op, or past the plan's end) means the plan no longer
// describes the step: the cursor stops, and from here DTR's weighted scores decide alone.
void PlanFollower::follow(Id op_id, int position, const OpHint* hint) {
  if (hint == nullptr) {
    stop_following();
    rt_.run_op(op_id, /*recompute=*/false);
    return;
  }
  try {
    if (rt_.op(op_id).outputs.empty() || !rt_.op(op_id).accumulates.empty()) {
      // Nothing reads what it makes, or it writes constants (Note [Accumulating into
      // constants] in update.cc): it runs where the program calls it, after the plan's
      // steps before it (Note [Following a schedule]).
      run_plan_through(position - 1);
      rt_.run_op(op_id, /*recompute=*/false);
      return;
    }
    rt_.defer(op_id);  // the op outlives its outputs' handles until it has run
    for (Id t : rt_.op(op_id).inputs) {
      const Id s = rt_.tensor(t).storage;
      ++holds_[s].pending_reads;
      sync(s);
    }
    deferred_.push_back(op_id);
    run_plan_through(position, op_id);
  } catch (...) {
    stop_following();
    throw;
  }
  if (rt_.op(op_id).deferred) rt_.note_deferred(op_id);
}

// The plan's steps from the cursor on, while they name ops at positions up to `last`.
// With `called` (the op the program is calling, at position `last`), the cursor stops once
// that op has run: the steps after it wait for the program's next call, update or end of
// step. Until the call returns, the program still holds handles to what the plan has
// already dropped (a result freed at its own step, say); letting it release them first
// keeps memory at the plan's profile instead of above it during the steps that follow.
void PlanFollower::run_plan_through(int last, Id called) {
  const std::vector<PlanStep>& plan = step_.hints().schedule;
  while (cursor_ < plan.size() && plan[cursor_].site.position <= last) {
    run_plan_step(plan[cursor_++]);
    release_unclaimed();
    const bool ran_called =
        called != kNone && !rt_.op(called).deferred && plan[cursor_ - 1].site.position == last;
    // (The op's other outputs' steps, which come next in the plan, still run now.)
    if (ran_called && (cursor_ == plan.size() || plan[cursor_].site.position != last)) return;
  }
}

// One computation of the plan: a deferred op's first run, or an evicted output recomputed;
// then the frees the plan makes there. What is already as the plan wants is left alone.
// Storages the step's op makes stay resident (plan_spec) until the plan claims them as
// instances (plan_refs) and frees them, so that a dead tensor the plan recomputes for later
// steps is not freed by the first op that reads it.
void PlanFollower::run_plan_step(const PlanStep& step) {
  for (const StepSite& site : step.offload_before) with_storage(site, &StepHost::offload);
  for (const StepSite& site : step.prefetch_before) with_storage(site, &StepHost::prefetch);
  const Id op = step_.op_at(step.site.position);
  Id root = kNone;
  bool recompute = false;
  if (op != kNone && rt_.op(op).deferred) {
    root = op;
  } else if (const Id t = step_.site_tensor(step.site); t != kNone) {
    const Id s = rt_.tensor(t).storage;
    if (!rt_.storage(s).resident && rt_.storage(s).producer != kNone) {
      root = rt_.storage(s).producer;
      recompute = true;
    }
  }
  if (root != kNone) {
    plan_run_ = true;
    try {
      rt_.run_op(root, recompute);
    } catch (...) {
      plan_run_ = false;
      throw;
    }
    plan_run_ = false;
  }
  if (const Id t = step_.site_tensor(step.site);
      t != kNone && rt_.storage(rt_.tensor(t).storage).resident)
    claim_for_plan(rt_.tensor(t).storage);
  for (const StepSite& site : step.copy_after) with_storage(site, &StepHost::copy_to_host);
  for (const StepSite& site : step.free_after) free_planned(site, /*evict=*/true);
  for (const StepSite& site : step.drop_after) free_planned(site, /*evict=*/false);
}

// The plan's offloads: each a request the core may refuse where the step went otherwise
// (the tensor evicted, say), which then comes back by recomputation as any other would.
void PlanFollower::with_storage(const StepSite& site, bool (StepHost::*move)(Id)) {
  const Id t = step_.site_tensor(site);
  if (t != kNone) (rt_.*move)(rt_.tensor(t).storage);
}

bool PlanFollower::holds_fresh(Id s) {
  if (!plan_run_) return false;
  Hold& h = holds_[s];
  if (!h.plan_spec && h.plan_refs == 0) plan_storages_.push_back(s);
  fresh_.push_back(s);
  h.plan_spec = true;
  sync(s);
  return true;
}

void PlanFollower::claim_for_plan(Id s) {
  Hold& h = holds_[s];
  if (h.plan_refs == 0 && !h.plan_spec) plan_storages_.push_back(s);
  ++h.plan_refs;
  h.plan_spec = false;
  sync(s);
}

// Note [Outputs the plan does not claim]
// Running a plan step can make storages no step of the plan names: the other outputs of a
// multi-output op whose plan lists only the one it needs (attention's saved probabilities,
// when the plan recomputes the block later), or an input the walk had to recompute first.
// The schedule's simulator counts such an instance as dead once its step is done, so the
// follower holds them only until the plan's steps at that position have all run (a group's
// other outputs come right after); then what no step claimed goes, evicted if the program
// still holds it, as the plan assumed. Kept until the end of the step instead, they held
// the attention probabilities of every block of a GPT whose plan had counted them gone.
void PlanFollower::release_unclaimed() {
  // Only once the cursor has left the position (it stands on the step after the last run).
  const std::vector<PlanStep>& plan = step_.hints().schedule;
  if (cursor_ < plan.size() && plan[cursor_].site.position == plan[cursor_ - 1].site.position)
    return;
  std::vector<Id> fresh;
  fresh.swap(fresh_);
  for (Id s : fresh) {
    Hold* h = find_hold(s);
    if (h == nullptr || !h->plan_spec || h->plan_refs > 0) continue;
    h->plan_spec = false;
    const std::uint32_t pending = h->pending_reads;
    sync(s);
    if (rt_.storage(s).resident) let_go(s, pending, /*evict_held=*/pending == 0);
  }
}

// A storage the plan no longer holds: freed outright when no handle holds it and no deferred
// op waits for it, else evicted (it stays recomputable) where `evict_held`.
void PlanFollower::let_go(Id s, std::uint32_t pending, bool evict_held) {
  if (rt_.storage(s).handles == 0 && pending == 0) {
    rt_.release_if_dead(s);
    return;
  }
  if (evict_held && rt_.evictable(s)) rt_.evict_for_hint(s);
}

// The plan no longer says what happens next: its holds end, and dead storages go.
void PlanFollower::stop_following() {
  following_ = false;
  std::vector<Id> held;
  held.swap(plan_storages_);
  for (Id s : held) {
    if (Hold* h = find_hold(s)) {
      h->plan_refs = 0;
      h->plan_spec = false;
      sync(s);
    }
  }
  for (Id s : held) rt_.release_if_dead(s);
}

// A storage nothing will read before the plan's next instance of it: freed outright when no
// handle holds it and no deferred op waits for it, else evicted (it stays recomputable) unless
// it is a result the program may still read (`evict_held` false).
void PlanFollower::free_planned(const StepSite& site, bool evict_held) {
  const Id t = step_.site_tensor(site);
  if (t == kNone) return;
  const Id s = rt_.tensor(t).storage;
  Hold* h = find_hold(s);
  if (h != nullptr) {
    if (h->plan_refs > 0 && --h->plan_refs > 0) {
      sync(s);
      return;  // a view or its base still lives in the plan
    }
    h->plan_spec = false;
  }
  const std::uint32_t pending = h != nullptr ? h->pending_reads : 0;
  sync(s);
  let_go(s, pending, evict_held);
}

// The plan's steps left, for ops the program has called (positions before `end`).
void PlanFollower::run_remaining_plan(int end) {
  const std::vector<PlanStep>& plan = step_.hints().schedule;
  while (cursor_ < plan.size()) {
    const PlanStep& step = plan[cursor_++];
    if (step.site.position < end) run_plan_step(step);
    release_unclaimed();
  }
  stop_following();
}

// Every op still deferred, in the order the program called them.
void PlanFollower::run_deferred() {
  for (std::size_t i = 0; i < deferred_.size(); ++i) {
    const Id op = deferred_[i];
    if (!rt_.op(op).deferred) continue;
    rt_.run_op(op, /*recompute=*/false);
  }
  deferred_.clear();
}

void PlanFollower::finish(int end) {
  if (following_) run_remaining_plan(end);
  run_deferred();
}

// An update writes parameters in place: what the plan computes before it runs first, and
// no op that may read the old values is left deferred past it.
void PlanFollower::settle_before_update(int position) {
  if (deferred_.empty() && !following_) return;
  try {
    if (following_) run_plan_through(position);
    run_deferred();
  } catch (const OutOfMemoryError& e) {
    stop_following();
    throw rt_.annotated(e);
  } catch (...) {
    stop_following();
    throw;
  }
}

// The op is no longer deferred: its pending reads stop holding its inputs. False if it was not
// deferred.
bool PlanFollower::end_deferral(Id op_id) {
  if (!rt_.op(op_id).deferred) return false;
  rt_.end_deferral(op_id);
  for (Id t : rt_.op(op_id).inputs) {
    const Id s = rt_.tensor(t).storage;
    if (Hold* h = find_hold(s)) {
      --h->pending_reads;
      sync(s);
    }
  }
  return true;
}

void PlanFollower::on_ran(Id op_id) {
  if (!end_deferral(op_id)) return;
  undeferred_.push_back(op_id);  // its extra reference goes once the request is over
}

void PlanFollower::on_request_end() {
  std::vector<Id> done;
  done.swap(undeferred_);
  for (Id op : done) rt_.release_op_ref(op);
}

void PlanFollower::abandon() {
  stop_following();
  for (Id op : deferred_)
    if (cancel_deferral(op)) rt_.release_op_ref(op);
  deferred_.clear();
}

bool PlanFollower::cancel_deferral(Id op_id) {
  if (!end_deferral(op_id)) return false;
  for (Id t : rt_.op(op_id).inputs) rt_.release_if_dead(rt_.tensor(t).storage);
  return true;
}

}  // namespace remat::detail
