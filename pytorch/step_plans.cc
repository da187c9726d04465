#include "pytorch/detail/step_plans.h"

#include <absl/status/statusor.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <utility>

#include "remat/replay.h"
#include "remat/step_planner.h"

namespace remat::torch_backend::detail {

// Note [Planned steps on the device]
// DTR alone decides every eviction when it is out of memory, one storage at a time, and in
// a training step it evicts what the next layer's backward needs and recomputes chains that
// lock more than they free. A static plan of the whole step does far better where steps
// repeat, which they do in a training loop. The program marks its steps (remat_torch.step())
// and under policy `auto`:
//   warm-up    the first step runs on DTR: it makes the optimizer's state, so its ops are
//              not those of the steps after it;
//   recording  the second is recorded (Runtime::begin_step with `record`), up to the
//              optimizer's first call (the updates write constants, nothing to plan). At its
//              end the planners plan its graph at a few fractions of the budget, and each
//              plan is priced by replaying the recorded trace on the simulated backend under
//              the budget (remat/replay.h), as the allocator would serve it;
//   trial      the third step follows the plan whose replay was cheapest (policy `hinted`,
//              Note [Following a schedule]), where one replayed with its requests placed;
//   plan/dtr   it is kept where the trial ran no slower than the recorded DTR step, from
//              first operator to the optimizer, else the steps run on DTR for good. Wall
//              time, not compute overhead, decides: DTR's cost under a tight budget is as
//              much in finding room (evictions chosen one by one, blocks moved, segments
//              evacuated) as in recomputing, and a placed plan saves both.
// A followed step whose ops do not match the plan's (hint_mismatches) has changed shape or
// structure: the next step is recorded and planned again, as is the first after a change of
// budget. The program's own code runs unchanged in every phase; only the order and choice of
// evictions and recomputations differ, so results stay bitwise.
namespace {

constexpr double kFractions[] = {0.8, 0.9, 1.0};
constexpr double kPlannerSeconds = 2;
const std::vector<std::string>& planners() {
  static const std::vector<std::string> names = {"rockmate", "mincut", "chen", "twremat", "rotor"};
  return names;
}

// Note [Placed allocations] in step_placement.cc: the requests of `step` following `hints`,
// replayed with `options` but without a budget (nothing but the plan evicts), placed.
std::shared_ptr<const Placement> place_plan(const RecordedStep& step, ReplayOptions options,
                                            std::shared_ptr<const StepHints> hints,
                                            std::size_t scratch_bytes) {
  options.policy = "hinted";
  options.accounting = Accounting::kAllocator;
  options.budget = SIZE_MAX;
  options.hints = std::move(hints);
  options.record_allocations = true;
  ReplayResult r = replay(step.trace, options);
  if (r.status != "ok") return nullptr;
  // What the step leaves live (the gradients) is placed too, as if freed at its end: the
  // program drops it before the next step's first operator (Note [A step begins at its first
  // operator]), which finds the arena empty again.
  std::size_t end = 0;
  for (const AllocationSequence::Allocation& a : r.allocations.allocations)
    end = std::max({end, a.start + 1, a.end == AllocationSequence::kStillLive ? 0 : a.end + 1});
  for (AllocationSequence::Allocation& a : r.allocations.allocations)
    if (a.end == AllocationSequence::kStillLive) a.end = end;
  Placement placement = place_allocations(std::move(r.allocations));
  placement.headroom_bytes = scratch_bytes;  // the kernels' scratch: the planning budget left it
  return std::make_shared<const Placement>(std::move(placement));
}

// The simulated overhead of the recorded step replayed with `options` (the budget, what the
// device holds beside the step) under `hints` (null: DTR), its requests at `placement`'s
// places (null: best fit).
ScreenedCandidate screen(const RecordedStep& step, ReplayOptions options,
                         std::shared_ptr<const StepHints> hints,
                         std::shared_ptr<const Placement> placement, std::string source) {
  options.policy = hints ? "hinted" : "dtr";
  options.accounting = Accounting::kAllocator;
  options.hints = std::move(hints);
  options.placement = std::move(placement);
  const ReplayResult r = replay(step.trace, options);
  ScreenedCandidate c;
  c.source = std::move(source);
  c.placed_allocations = r.placed_allocations;
  c.placement_misses = r.placement_misses;
  if (r.status == "ok") {
    c.simulated_overhead = r.overhead;
  } else {
    c.failure = r.status + ": " + r.error;
  }
  return c;
}

}  // namespace

StepOptions StepPlans::begin_step(std::size_t budget) {
  if (budget != budget_) {
    reset();
    budget_ = budget;
  }
  StepOptions options;
  ++report_.steps;
  if (budget_ == SIZE_MAX) return options;
  if (phase_ == Phase::kWarmUp && report_.steps > 1) phase_ = Phase::kRecording;
  options.record = phase_ == Phase::kRecording;
  if (phase_ == Phase::kTrial || phase_ == Phase::kPlan) {
    options.hints = hints_;
    options.placement = placement_;
  }
  return options;
}

void StepPlans::end_step(StepOutcome outcome) {
  switch (phase_) {
    case Phase::kWarmUp:
    case Phase::kDtr:
      return;
    case Phase::kRecording:
      report_.dtr_step_overhead = outcome.overhead;
      report_.dtr_step_seconds = outcome.seconds;
      plan(outcome);
      return;
    case Phase::kTrial:
      report_.plan_step_overhead = outcome.overhead;
      report_.plan_step_seconds = outcome.seconds;
      phase_ = outcome.seconds <= report_.dtr_step_seconds.value_or(INFINITY) ? Phase::kPlan
                                                                              : Phase::kDtr;
      if (phase_ == Phase::kDtr) {
        hints_.reset();
        placement_.reset();
        report_.source = "dtr: " + report_.source + " ran slower in its trial";
      }
      [[fallthrough]];
    case Phase::kPlan:
      if (hints_ && outcome.hint_mismatches > 0) {  // another structure: plan it again
        hints_.reset();
        placement_.reset();
        phase_ = Phase::kRecording;
      }
      return;
  }
}

// Note [What the trace does not see]
// The recording ends at the optimizer's first call, so its trace never reads the optimizer's
// state. Those bytes are resident all the same, through the whole step, and a plan made for
// the whole budget would not fit beside them. Plans are made and priced for the budget less
// the storages pinned from the recorded step's start to its end that it did not read.
// What the step frees on its way (the last step's gradients, where a program zeroes them
// after its forward pass) is not counted: it goes before the backward pass, where the peak
// is, and the plans' fractions of the budget leave room beside it. Nor does the trace see
// the kernels' scratch: the largest a kernel of the recorded step asked for is left out of
// the plans' budget too, and a placed step's arena keeps that much free for it
// (Placement::headroom_bytes).
std::size_t StepPlans::planning_budget(const StepOutcome& recorded) {
  report_.unread_bytes = recorded.unread_bytes;
  report_.scratch_bytes = recorded.max_scratch_bytes;
  const std::size_t outside = report_.unread_bytes + report_.scratch_bytes;
  return budget_ > outside ? budget_ - outside : 0;
}

void StepPlans::plan(const StepOutcome& recorded) {
  const auto start = std::chrono::steady_clock::now();
  const RecordedStep& step = recorded.step;
  const std::size_t budget = planning_budget(recorded);
  // The replays hold what the device holds beside the step, as one constant, under the
  // device's budget: DTR's with the scratch's room left out too, a placed plan's with it in
  // its arena (Placement::headroom_bytes).
  ReplayOptions replayed;
  replayed.run_when_called.assign(run_when_called_.begin(), run_when_called_.end());
  replayed.unread_bytes = report_.unread_bytes;
  replayed.budget = budget_ > report_.scratch_bytes ? budget_ - report_.scratch_bytes : 0;
  report_.screened.clear();
  report_.screened.push_back(screen(step, replayed, nullptr, nullptr, "dtr"));
  replayed.budget = budget_;
  // The cheapest replay is tried on the device, whatever the replay's DTR did: that is not
  // the device's (it often thrashes where the device's does not), and the trial decides.
  ScreenedCandidate best;
  for (double fraction : kFractions) {
    StepPlanOptions options;
    options.budget_bytes = static_cast<std::int64_t>(fraction * static_cast<double>(budget));
    options.planners = planners();
    options.time_limit_seconds = kPlannerSeconds;
    absl::StatusOr<ChosenPlan> chosen = plan_step(step.graph, step.executed, options);
    if (!chosen.ok() || !chosen->feasible) continue;
    auto hints = std::make_shared<StepHints>(std::move(chosen->hints));
    std::shared_ptr<const Placement> placement =
        place_plan(step, replayed, hints, report_.scratch_bytes);
    ScreenedCandidate c = screen(step, replayed, hints, placement, chosen->source);
    report_.screened.push_back(c);
    // A plan whose placement was given up in its replay would be given it up on the device.
    if (c.simulated_overhead && c.placement_misses == 0 &&
        *c.simulated_overhead < best.simulated_overhead.value_or(INFINITY)) {
      best = c;
      hints_ = std::move(hints);
      placement_ = std::move(placement);
    }
  }
  report_.planning_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  report_.source = hints_ ? best.source : "no plan replayed with its requests placed";
  phase_ = hints_ ? Phase::kTrial : Phase::kDtr;
}

void StepPlans::reset() {
  phase_ = Phase::kWarmUp;
  hints_.reset();
  placement_.reset();
  report_ = PlanReport{};
}

PlanReport StepPlans::report() const {
  PlanReport r = report_;
  if (budget_ == SIZE_MAX) {
    r.phase = "unconstrained";
    return r;
  }
  static constexpr const char* kNames[] = {"warm-up", "recording", "trial", "plan", "dtr"};
  r.phase = kNames[static_cast<int>(phase_)];
  return r;
}

}  // namespace remat::torch_backend::detail
