// The step driver: a training loop's steps under policy `auto` (driver/shape_plans.h),
// `hinted` (the plan cache) or an eviction policy alone.
#include "remat/step_driver.h"

#include <absl/strings/str_cat.h>

#include <chrono>
#include <cmath>
#include <optional>
#include <stdexcept>
#include <utility>

#include "driver/shape_plans.h"
#include "driver/simulated_steps.h"
#include "remat/errors.h"
#include "runtime/core/wall_clock.h"

namespace remat {
namespace {

using Clock = detail::SteadyClock;
using detail::seconds_since;

// The driver's runtime: policy `auto` is `hinted` whose steps get hints only once a plan is
// kept. Any other name goes to the runtime, whose constructor rejects one it does not know.
RuntimeOptions driver_runtime_options(const StepDriverOptions& options) {
  RuntimeOptions rt = options.runtime;
  rt.policy = options.policy == "auto" ? "hinted" : options.policy;
  return rt;
}

}  // namespace

std::string_view step_kind_name(StepKind kind) {
  switch (kind) {
    case StepKind::kDynamic:
      return "dtr";
    case StepKind::kRecorded:
      return "recorded";
    case StepKind::kPlanTrial:
      return "plan trial";
    case StepKind::kPlanned:
      return "planned";
  }
  return "?";
}

std::string_view shape_decision_name(ShapeDecision d) {
  switch (d) {
    case ShapeDecision::kNotPlannedYet:
      return "dtr (not planned yet)";
    case ShapeDecision::kPlanning:
      return "dtr (planning)";
    case ShapeDecision::kTrial:
      return "trial";
    case ShapeDecision::kPlan:
      return "plan";
    case ShapeDecision::kDtr:
      return "dtr";
  }
  return "?";
}

bool read_back(Runtime& rt, const Tensor& t, void* dst) {
  if (rt.options().backend == Backend::kSimulated) {
    rt.materialize(t);
    return false;
  }
  rt.read(t, dst);
  return true;
}

class StepDriver::Impl {
 public:
  Impl(TrainingProgram& program, StepDriverOptions options)
      : program_(program),
        options_(std::move(options)),
        runtime_(driver_runtime_options(options_)),
        simulated_(program, runtime_.options(), options_.screened_steps, options_.placement),
        shape_plans_(shape_plan_options()),
        plan_cache_(options_.plan_cache != nullptr ? options_.plan_cache
                                                   : std::make_shared<PlanCache>()),
        state_(program_.make_state(runtime_)) {}

  const StepReport& run(int step, bool record);
  Runtime& runtime() { return runtime_; }
  TrainingProgram::State& state() { return *state_; }
  const DriverTotals& totals() const { return totals_; }
  std::vector<ShapeReport> shapes() const { return shape_plans_.report(); }
  void finish_planning() {
    shape_plans_.finish_planning();
    totals_.plans_made = shape_plans_.plans_made();
  }

 private:
  detail::ShapePlans::Options shape_plan_options();
  // The host memory the runtime may move victims to, for the plans too (planner offload).
  detail::HostForPlans host_for_plans() const {
    const RuntimeOptions& rt = options_.runtime;
    if (rt.host_memory_bytes == 0 || !rt.offload_victims) return {};
    return {static_cast<std::int64_t>(std::min<std::size_t>(rt.host_memory_bytes, INT64_MAX)),
            rt.host_link};
  }
  // The options of step `step` (of shape `key`), with report_.kind set.
  StepOptions prepare(int step, const PlanCache::Key& key, bool record);
  // Runs the step; under `auto`, a first step DTR cannot fit is planned and run again.
  RecordedStep run_prepared(int step, const PlanCache::Key& key, StepOptions& options);
  bool every_rank_agrees(bool yes);
  // `hinted`: plans the step just recorded for the steps of its shape to come.
  void plan_for_cache(const PlanCache::Key& key, const RecordedStep& recorded);

  TrainingProgram& program_;
  StepDriverOptions options_;
  Runtime runtime_;
  detail::SimulatedSteps simulated_;
  detail::ShapePlans shape_plans_;
  std::shared_ptr<PlanCache> plan_cache_;
  StepReport report_;
  DriverTotals totals_;
  // Declared last: its tensors go before the runtime does.
  std::unique_ptr<TrainingProgram::State> state_;
};

detail::ShapePlans::Options StepDriver::Impl::shape_plan_options() {
  detail::ShapePlans::Options o;
  o.budget = options_.policy == "auto" ? options_.runtime.budget : SIZE_MAX;
  o.planners = options_.planners;
  o.time_limit = options_.plan_time_limit;
  o.host = host_for_plans();
  o.fractions = options_.plan_fractions;
  o.max_recordings = options_.max_recordings;
  o.max_shapes = options_.max_shapes;
  o.background = options_.plan_in_background && options_.runtime.backend != Backend::kSimulated;
  o.steps_beside = options_.plan_within_steps;
  o.record_first_step = o.background && !options_.runtime.measure_costs;
  if (options_.screen) {
    o.screen = [this](int step, detail::StepPlan* plan, bool after_dtr) {
      return simulated_.screen(step, plan, after_dtr);
    };
  }
  return o;
}

StepOptions StepDriver::Impl::prepare(int step, const PlanCache::Key& key, bool record) {
  StepOptions opt;
  opt.name = absl::StrCat(program_.name(), "_step", step);
  opt.record = record;
  report_.kind = StepKind::kDynamic;
  if (options_.policy == "hinted") {
    // Note [Reusing plans across shapes] in remat/plan_cache.h.
    const PlanCache::Found found = plan_cache_->find(key, PlanCache::Reuse::kNoLarger);
    opt.hints = found.hints;
    if (found.hints == nullptr) {
      opt.record = true;
      report_.kind = StepKind::kRecorded;
    } else {
      report_.kind = StepKind::kPlanned;
      report_.exact_plan = found.exact;  // counted once the step has run
    }
  } else if (options_.policy == "auto") {
    const auto start = Clock::now();
    const StepOptions planned = shape_plans_.before(key, step);
    report_.planning_seconds += seconds_since(start);
    opt.hints = planned.hints;
    opt.placement = planned.placement;
    opt.record |= planned.record;
    if (planned.record) report_.kind = StepKind::kRecorded;
    if (planned.hints != nullptr)
      report_.kind = shape_plans_.in_trial(key) ? StepKind::kPlanTrial : StepKind::kPlanned;
  }
  return opt;
}

RecordedStep StepDriver::Impl::run_prepared(int step, const PlanCache::Key& key,
                                            StepOptions& options) {
  const std::size_t updates = runtime_.stats().updates;
  std::optional<OutOfMemoryError> failed;
  try {
    return detail::run_program_step(runtime_, program_, *state_, step, options);
  } catch (const OutOfMemoryError& e) {
    runtime_.abort_step();
    // Note [Planning a step DTR cannot run] in shape_plans.cc. A step that wrote pinned
    // memory (an optimizer's update, batch norm's running statistics) cannot run again.
    const bool may_plan = options_.policy == "auto" && runtime_.stats().updates == updates &&
                          options.hints == nullptr && shape_plans_.may_plan_after_oom(key);
    if (!every_rank_agrees(may_plan)) throw;
    failed = e;
  }
  const auto start = Clock::now();
  StepOptions planned;
  try {
    planned = shape_plans_.plan_after_oom(key, simulated_.record_unbudgeted(step), step);
  } catch (...) {
    every_rank_agrees(false);  // the others must not wait for this rank's answer
    throw;
  }
  report_.planning_seconds += seconds_since(start);
  if (!every_rank_agrees(planned.hints != nullptr)) {
    if (planned.hints != nullptr) shape_plans_.planned_step_failed(key, "another rank has no plan");
    throw *failed;
  }
  options.hints = planned.hints;
  options.placement = planned.placement;
  report_.kind = StepKind::kPlanTrial;
  report_.planned_after_oom = true;
  return detail::run_program_step(runtime_, program_, *state_, step, options);
}

// Note [Ranks that agree] in remat/data_parallel.h: whether `yes` holds on every rank (that a
// step that ran out of memory may be planned, that a plan was found), so that every rank
// runs the step again or none does.
bool StepDriver::Impl::every_rank_agrees(bool yes) {
  Collectives* c = options_.collectives;
  if (c == nullptr || c->size() == 1) return yes;
  absl::StatusOr<std::int64_t> missing = c->all_max(yes ? 0 : 1);
  if (!missing.ok())
    throw std::runtime_error(absl::StrCat("rank ", c->rank(), ": ", missing.status().message()));
  return *missing == 0;
}

void StepDriver::Impl::plan_for_cache(const PlanCache::Key& key, const RecordedStep& recorded) {
  const auto start = Clock::now();
  detail::StepPlan plan =
      detail::plan_recorded_step(recorded, runtime_.budget(), options_.planners,
                                 options_.plan_time_limit, 0.9, true, host_for_plans());
  report_.planning_seconds += seconds_since(start);
  if (totals_.first_plan_source.empty()) totals_.first_plan_source = plan.hints->source;
  plan_cache_->insert(key, std::move(plan.hints));
  ++totals_.plans_made;
}

const StepReport& StepDriver::Impl::run(int step, bool record) {
  const auto start = Clock::now();
  const PlanCache::Key key = program_.shape_key(step);
  report_ = StepReport{.step = step, .shape = key};
  StepOptions options = prepare(step, key, record);
  const bool plan_now = options_.policy == "hinted" && report_.kind == StepKind::kRecorded;
  const RuntimeStats before = runtime_.stats();
  RecordedStep recorded;
  try {
    recorded = run_prepared(step, key, options);
  } catch (const std::exception& e) {
    runtime_.abort_step();  // a no-op where the step already ended
    if (options_.policy == "auto" && options.hints != nullptr) {
      shape_plans_.planned_step_failed(key, e.what());
      totals_.planned_steps = shape_plans_.planned_steps();
    }
    throw;
  }
  const RuntimeStats after = runtime_.stats();
  report_.base_cost = after.base_cost - before.base_cost;
  report_.recompute_cost = after.recompute_cost - before.recompute_cost;
  report_.transfer_exposed = after.transfer_exposed - before.transfer_exposed;
  if (plan_now) plan_for_cache(key, recorded);
  if (record) report_.recorded = recorded;
  if (options_.policy == "auto") {
    const auto planning = Clock::now();
    shape_plans_.after(key, std::move(recorded),
                       {.base = report_.base_cost,
                        .recompute = report_.recompute_cost + report_.transfer_exposed});
    report_.planning_seconds += seconds_since(planning);
    totals_.plans_made = shape_plans_.plans_made();
    totals_.planned_steps = shape_plans_.planned_steps();
    totals_.forgotten_shapes = shape_plans_.forgotten();
  } else if (report_.kind == StepKind::kPlanned) {
    ++totals_.planned_steps;
    ++(report_.exact_plan ? totals_.exact_plan_steps : totals_.reused_plan_steps);
  }
  report_.seconds = seconds_since(start);
  return report_;
}

StepDriver::StepDriver(TrainingProgram& program, StepDriverOptions options)
    : impl_(std::make_unique<Impl>(program, std::move(options))) {}
StepDriver::~StepDriver() = default;
const StepReport& StepDriver::run(int step, bool record) { return impl_->run(step, record); }
Runtime& StepDriver::runtime() { return impl_->runtime(); }
TrainingProgram::State& StepDriver::state() { return impl_->state(); }
const DriverTotals& StepDriver::totals() const { return impl_->totals(); }
void StepDriver::finish_planning() { impl_->finish_planning(); }
std::vector<ShapeReport> StepDriver::shapes() const { return impl_->shapes(); }

std::size_t measure_unconstrained_peak(TrainingProgram& program, RuntimeOptions options,
                                       int steps) {
  options.budget = SIZE_MAX;
  options.policy = "dtr";
  Runtime rt(options);
  {
    const std::unique_ptr<TrainingProgram::State> state = program.make_state(rt);
    for (int step = 0; step < steps; ++step)
      detail::run_program_step(rt, program, *state, step, {});
  }
  return rt.stats().memory.peak_reserved;
}

}  // namespace remat
