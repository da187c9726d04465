#include "pytorch/detail/step_plans.h"

#include <absl/status/statusor.h>

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
//   trial      where the cheapest plan replays cheaper than the recorded step ran on DTR,
//              the third step follows it (policy `hinted`, Note [Following a schedule]);
//   plan/dtr   it is kept where the trial recomputed no more than the recorded DTR step,
//              else the steps run on DTR for good.
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

// The simulated overhead of the recorded step under `budget` with `hints` (null: DTR).
ScreenedCandidate screen(const RecordedStep& step, std::size_t budget,
                         std::shared_ptr<const StepHints> hints, std::string source) {
  ReplayOptions options;
  options.policy = hints ? "hinted" : "dtr";
  options.accounting = Accounting::kAllocator;
  options.budget = budget;
  options.hints = std::move(hints);
  const ReplayResult r = replay(step.trace, options);
  ScreenedCandidate c;
  c.source = std::move(source);
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
  if (phase_ == Phase::kTrial || phase_ == Phase::kPlan) options.hints = hints_;
  return options;
}

void StepPlans::end_step(RecordedStep step, double overhead, std::size_t hint_mismatches) {
  switch (phase_) {
    case Phase::kWarmUp:
    case Phase::kDtr:
      return;
    case Phase::kRecording:
      report_.dtr_step_overhead = overhead;
      plan(step, overhead);
      return;
    case Phase::kTrial:
      report_.plan_step_overhead = overhead;
      phase_ =
          overhead <= report_.dtr_step_overhead.value_or(INFINITY) ? Phase::kPlan : Phase::kDtr;
      if (phase_ == Phase::kDtr) {
        hints_.reset();
        report_.source = "dtr: " + report_.source + " recomputed more in its trial";
      }
      [[fallthrough]];
    case Phase::kPlan:
      if (hints_ && hint_mismatches > 0) {  // another structure: plan it again
        hints_.reset();
        phase_ = Phase::kRecording;
      }
      return;
  }
}

void StepPlans::plan(const RecordedStep& step, double dtr_overhead) {
  const auto start = std::chrono::steady_clock::now();
  report_.screened.clear();
  report_.screened.push_back(screen(step, budget_, nullptr, "dtr"));
  // The replay knows neither the kernels' scratch nor what the step found resident, and
  // prices DTR lower than it ran: a plan is tried where it replays cheaper than DTR ran.
  ScreenedCandidate best;
  best.simulated_overhead = dtr_overhead;
  for (double fraction : kFractions) {
    StepPlanOptions options;
    options.budget_bytes = static_cast<std::int64_t>(fraction * static_cast<double>(budget_));
    options.planners = planners();
    options.time_limit_seconds = kPlannerSeconds;
    absl::StatusOr<ChosenPlan> chosen = plan_step(step.graph, step.executed, options);
    if (!chosen.ok() || !chosen->feasible) continue;
    auto hints = std::make_shared<StepHints>(std::move(chosen->hints));
    ScreenedCandidate c = screen(step, budget_, hints, chosen->source);
    report_.screened.push_back(c);
    if (c.simulated_overhead &&
        *c.simulated_overhead < best.simulated_overhead.value_or(INFINITY)) {
      best = c;
      hints_ = std::move(hints);
    }
  }
  report_.planning_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  report_.source = hints_ ? best.source : "no plan replayed cheaper than DTR ran";
  phase_ = hints_ ? Phase::kTrial : Phase::kDtr;
}

void StepPlans::reset() {
  phase_ = Phase::kWarmUp;
  hints_.reset();
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
