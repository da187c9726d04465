#include "driver/shape_plans.h"

#include <absl/strings/str_cat.h>
#include <absl/strings/str_join.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <system_error>
#include <utility>

#include "remat/step_planner.h"

namespace remat::detail {

StepPlan plan_recorded_step(const RecordedStep& step, std::size_t budget,
                            const std::vector<std::string>& planners, double time_limit,
                            double fraction, bool realized_fits, HostForPlans host) {
  StepPlan plan;
  plan.hints = std::make_shared<StepHints>();
  if (budget == SIZE_MAX) {
    plan.source = "no budget: nothing to plan";
    return plan;
  }
  const auto start = std::chrono::steady_clock::now();
  StepPlanOptions opt;
  opt.budget_bytes = static_cast<std::int64_t>(fraction * static_cast<double>(budget));
  opt.planners = planners;
  opt.time_limit_seconds = time_limit;
  opt.include_realized = realized_fits;
  opt.host_memory_bytes = host.bytes;
  opt.host_link = host.link;
  // The schedule the runtime realized competes unchecked against opt.budget_bytes: it fit
  // the runtime's own budget (Note [Seeding hinted] in tools/compare/compare.cc).
  absl::StatusOr<ChosenPlan> chosen = remat::plan_step(step.graph, step.executed, opt);
  if (chosen.ok() && chosen->feasible) {
    plan.hints = std::make_shared<StepHints>(std::move(chosen->hints));
    plan.source = chosen->source;
    if (!chosen->recompute_only_source.empty()) {
      plan.recompute_only = std::make_shared<StepHints>(std::move(chosen->recompute_only_hints));
      plan.recompute_only_source = chosen->recompute_only_source;
    }
  } else {
    plan.source = chosen.ok() ? chosen->reason : std::string(chosen.status().message());
  }
  plan.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return plan;
}

// Note [Shapes forgotten]
// A model whose shapes never repeat (treelstm's trees) adds a shape a step; kept forever,
// their states and reports would grow with the run. Past max_shapes the shape seen longest
// ago is forgotten, unless it is being planned or tried (its plan is on its way or under
// test): a shape seen again after that starts anew, as any new shape does. Recordings are
// bounded apart (max_recordings), and a forgotten shape's goes with it.
ShapePlans::Shape& ShapePlans::shape(const PlanCache::Key& key) {
  auto [it, added] = shapes_.try_emplace(key);
  it->second.last_seen = ++seen_;
  if (added && shapes_.size() > options_.max_shapes) forget_a_shape(key);
  return it->second;
}

void ShapePlans::forget_a_shape(const PlanCache::Key& keep) {
  auto oldest = shapes_.end();
  for (auto it = shapes_.begin(); it != shapes_.end(); ++it) {
    const State state = it->second.state;
    if (it->first == keep || state == State::kPlanning || state == State::kTrial ||
        (job_ && job_->key == it->first))
      continue;
    if (oldest == shapes_.end() || it->second.last_seen < oldest->second.last_seen) oldest = it;
  }
  if (oldest == shapes_.end()) return;
  std::erase(recorded_, oldest->first);
  shapes_.erase(oldest);
  ++forgotten_;
}

// Plans and screens the plan at `fraction`, keeping it in q.best where it is the cheapest so
// far; returns its arena's excess over the room the budget leaves it (negative: it fits), or
// nothing where it has no placement. Where the plan moves tensors to the host, the cheapest
// plan without copies is screened too (Note [Screening plans with copies]).
std::optional<double> ShapePlans::screen_candidate(Search& q, double fraction) {
  Shape& s = q.shape;
  StepPlan plan = plan_recorded_step(*s.recording, options_.budget, options_.planners,
                                     options_.time_limit, fraction, !s.dtr_failed, options_.host);
  std::optional<StepPlan> recompute_only;
  if (plan.recompute_only) {
    recompute_only.emplace();
    recompute_only->hints = std::move(plan.recompute_only);
    recompute_only->source = plan.recompute_only_source;
  }
  const std::optional<double> excess = screen_plan(q, std::move(plan), fraction);
  if (recompute_only) screen_plan(q, *std::move(recompute_only), fraction);
  return excess;
}

// Note [Screening plans with copies]
// Planner `offload` prices a plan's copies on the schedule's simulator, which counts tensor
// bytes; on the runtime a prefetch takes an allocator block when its copy starts, and the
// copies can wait longer than planned, most at a slow link, where a plan with copies wins
// by little if at all. Screening is where plans are priced on the runtime, so the cheapest
// plan without copies at the same fraction (ChosenPlan::recompute_only_hints) is screened
// beside the one with them, and the cheaper of the two there goes on.
std::optional<double> ShapePlans::screen_plan(Search& q, StepPlan plan, double fraction) {
  Shape& s = q.shape;
  ScreenedPlan row{.plan = plan.source, .fraction = fraction};
  if (plan.empty()) {
    s.screened.push_back(std::move(row));
    return std::nullopt;
  }
  const std::optional<StepCost> cost = options_.screen(s.recording_step, &plan, !s.dtr_failed);
  if (cost)
    row.simulated_overhead = cost->overhead();
  else
    row.failure = "out of memory or thrash";
  std::optional<double> excess;
  if (plan.placement && plan.arena) {
    row.arena_bytes = plan.arena->arena_bytes;
    excess = static_cast<double>(plan.arena->arena_bytes) - static_cast<double>(plan.arena->room);
  }
  s.screened.push_back(std::move(row));
  if (cost && cost->recompute < q.best_recompute) {
    q.best_recompute = cost->recompute;
    q.best = std::move(plan);
  }
  return excess;
}

// Note [Plans that fit their arena]
// A placed plan recomputes only what it chose, and the largest plan whose arena fits beside
// the constants is usually the cheapest step there is; the fixed fractions rarely hit it.
// From the smallest fraction whose arena was too large, the fraction moves down by the excess
// (as a share of the budget) and a little more, or halfway to the largest fraction below it
// already tried (none planned, or its arena fit), a few times at most, until an arena fits.
void ShapePlans::screen_fractions(Search& q) {
  std::optional<double> fit_from;  // the smallest fraction whose arena did not fit
  double excess_there = 0;
  std::vector<double> below;  // fractions with no plan, none placed, or an arena that fits
  for (double fraction : options_.fractions) {
    if (stopping()) return;
    const std::optional<double> excess = screen_candidate(q, fraction);
    if (!excess || *excess <= 0) below.push_back(fraction);
    if (excess && *excess > 0 && (!fit_from || fraction < *fit_from)) {
      fit_from = fraction;
      excess_there = *excess;
    }
  }
  double low = 0;
  for (double f : below)
    if (fit_from && f < *fit_from) low = std::max(low, f);
  for (int tries = 0; fit_from && tries < 4 && !stopping(); ++tries) {
    double fraction = *fit_from - excess_there / static_cast<double>(options_.budget) - 0.005;
    if (fraction <= low) fraction = (low + *fit_from) / 2;
    const std::optional<double> excess = screen_candidate(q, fraction);
    if (!excess) {
      low = fraction;  // no plan (or none placed) this low
      continue;
    }
    if (*excess <= 0) break;
    fit_from = fraction;
    excess_there = *excess;
  }
}

void ShapePlans::choose_plan(Shape& s) {
  const auto start = std::chrono::steady_clock::now();
  if (!options_.screen) {
    s.plan = plan_recorded_step(*s.recording, options_.budget, options_.planners,
                                options_.time_limit, 0.9, !s.dtr_failed, options_.host);
    return;
  }
  std::optional<StepCost> dtr;
  if (!s.dtr_failed) dtr = options_.screen(s.recording_step, nullptr, false);
  ScreenedPlan dtr_row{.plan = "dtr"};
  if (dtr)
    dtr_row.simulated_overhead = dtr->overhead();
  else
    dtr_row.failure = s.dtr_failed ? "out of memory (real step)" : "failed";
  s.screened.push_back(std::move(dtr_row));
  Search q{.shape = s, .best = std::nullopt, .best_recompute = dtr ? dtr->recompute : INFINITY};
  screen_fractions(q);
  if (q.best) {
    s.plan = *std::move(q.best);
  } else {
    s.plan = StepPlan{};
    s.plan.hints = std::make_shared<StepHints>();
    s.plan.source = s.dtr_failed ? "no plan fit the budget on the simulated backend"
                                 : "no plan recomputed less than DTR on the simulated backend";
  }
  s.plan.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

ShapePlans::~ShapePlans() {
  stopping_ = true;
  if (job_) job_->planned.wait();
}

StepOptions ShapePlans::before(const PlanCache::Key& key, int step) {
  StepOptions opt;
  if (options_.budget == SIZE_MAX) return opt;
  // A plan is waited for once steps_beside steps have gone on beside it: a loop that never
  // calls finish_planning() still gets it, within a bound it can count on.
  collect_plan(/*wait=*/job_ && job_->steps_beside++ >= options_.steps_beside);
  Shape& s = shape(key);
  switch (s.state) {
    case State::kUnplanned:
      // The shape's first step runs unrecorded: a first step is unlike the ones after it
      // (costs being learned, memory reserved for the first time), and the trial is judged
      // against the recorded step. Then it is recorded (again, if its recording was dropped).
      if (!s.recording) {
        opt.record = s.steps > 0 || options_.record_first_step;
        return opt;
      }
      if (s.dtr.recompute <= 0) {
        // A plan is kept only where it recomputes less than DTR did (or as much): none can
        // beat a step that recomputed nothing, so none is searched for.
        s.recording.reset();
        std::erase(recorded_, key);
        s.state = State::kDynamic;
        s.why = "no plan: the recorded DTR step recomputed nothing";
        return opt;
      }
      s.recording_step = step;
      // Beside the steps, DTR until the plan is made (or the thread is free).
      if (options_.background && (job_ || start_planning(key, s))) return opt;
      // Planned in the step after all (no thread): from a DTR step like the later ones, so
      // this one runs under DTR first, its cost the one the trial is judged against.
      if (s.dtr_from_first_step) return opt;
      plan_recording(key, s);
      if (!take_plan(s)) return opt;
      [[fallthrough]];
    case State::kTrial:
    case State::kPlanned:
      return planned_step(s);
    case State::kPlanning:
    case State::kDynamic:
      return opt;
  }
  return opt;
}

void ShapePlans::after(const PlanCache::Key& key, RecordedStep step, StepCost cost) {
  if (options_.budget == SIZE_MAX) return;
  Shape& s = shape(key);
  ++s.steps;
  if (s.dtr_from_first_step) {
    // The trial is judged against a step like the later ones, not the first (Note
    // [Planning beside the steps]): the one after the recorded first step, planned beside
    // or waiting to be.
    s.dtr = cost;
    s.dtr_from_first_step = false;
  }
  switch (s.state) {
    case State::kUnplanned:
      if (s.recording || step.graph.nodes.empty()) return;
      if (s.steps == 1 && !options_.record_first_step) return;
      s.recording = std::move(step);
      s.dtr = cost;
      s.dtr_from_first_step = s.steps == 1;
      recorded_.push_back(key);
      if (recorded_.size() > options_.max_recordings) {
        shapes_[recorded_.front()].recording.reset();
        recorded_.pop_front();
      }
      return;
    case State::kTrial:
      s.trial = cost;
      if (cost.recompute <= s.dtr.recompute) {
        s.state = State::kPlanned;
        if (!s.dtr_failed) s.why = "the plan recomputed no more than DTR";
      } else {
        s.state = State::kDynamic;
        s.why = "the plan recomputed more than DTR: DTR from now on";
      }
      return;
    case State::kPlanned:
      ++s.reused;
      // Memory does not settle the same way every step: a plan that drifts past DTR's cost
      // is dropped as a failed trial would be.
      if (cost.recompute > s.dtr.recompute) {
        s.state = State::kDynamic;
        s.why = absl::StrCat("planned step ", s.reused, " after the trial recomputed more than ",
                             "DTR: DTR from now on");
      }
      return;
    case State::kPlanning:  // DTR while the plan is made
    case State::kDynamic:
      return;
  }
}

// Note [Planning a step DTR cannot run]
// Under a tight budget DTR can run out of memory in a shape's first step, most often when
// the budget leaves little beside the constants and the free bytes lie in pieces, which a
// plan made for the step would have avoided. A step that fails so before any update ran
// has changed nothing the program keeps, so the trainer aborts it (Runtime::abort_step
// rewinds the random numbers too), records the same step on the simulated backend without
// a budget (its graph is the same: only recomputations depend on the budget), and the
// shape is planned here at once, screened on plans alone (there are no DTR steps to follow),
// and the step runs again following the plan. Its results are those the step would have
// had. The shape then never goes back to DTR, which could not run it.
bool ShapePlans::may_plan_after_oom(const PlanCache::Key& key) const {
  if (options_.budget == SIZE_MAX) return false;
  auto it = shapes_.find(key);
  return it == shapes_.end() || it->second.state == State::kUnplanned;
}

StepOptions ShapePlans::plan_after_oom(const PlanCache::Key& key, RecordedStep recording,
                                       int step) {
  Shape& s = shape(key);
  s.recording = std::move(recording);
  s.recording_step = step;
  s.dtr_failed = true;
  s.dtr = StepCost{.base = 0, .recompute = INFINITY};
  plan_recording(key, s);
  if (s.plan.empty()) {
    s.state = State::kDynamic;
    s.why =
        absl::StrCat("DTR ran out of memory and no plan survived its screening: ", s.plan.source);
    return {};
  }
  s.state = State::kTrial;
  s.why =
      "DTR ran out of memory in the shape's first step: planned from a recording without "
      "a budget";
  return planned_step(s);
}

void ShapePlans::planned_step_failed(const PlanCache::Key& key, const std::string& why) {
  Shape& s = shape(key);
  if (s.state != State::kTrial && s.state != State::kPlanned) return;
  s.state = State::kDynamic;
  s.why = absl::StrCat("a step following the plan failed (", why, "): DTR from now on");
  if (planned_steps_ > 0) --planned_steps_;
}

bool ShapePlans::in_trial(const PlanCache::Key& key) const {
  auto it = shapes_.find(key);
  return it != shapes_.end() && it->second.state == State::kTrial;
}

void ShapePlans::plan_recording(const PlanCache::Key& key, Shape& s) {
  choose_plan(s);
  s.recording.reset();
  std::erase(recorded_, key);
  ++plans_made_;
}

bool ShapePlans::take_plan(Shape& s) {
  if (s.plan.empty()) {
    s.state = State::kDynamic;
    s.why = absl::StrCat("no plan: ", s.plan.source);
    return false;
  }
  s.state = State::kTrial;
  return true;
}

// Note [Planning beside the steps] in shape_plans.h. The thread works on a shape of its own
// (the recording, and what choose_plan fills in), so it shares nothing with this one but the
// options and the screening, and the driver's steps never wait on it.
bool ShapePlans::start_planning(const PlanCache::Key& key, Shape& s) {
  auto work = std::make_shared<Shape>();
  work->recording = std::move(s.recording);
  work->recording_step = s.recording_step;
  work->dtr_failed = s.dtr_failed;
  try {
    job_ = Job{.key = key, .planned = std::async(std::launch::async, [this, work] {
                             choose_plan(*work);
                             work->recording.reset();
                             return std::move(*work);
                           })};
  } catch (const std::system_error&) {
    s.recording = std::move(work->recording);  // no thread to be had: planned in the step
    return false;
  }
  std::erase(recorded_, key);
  s.state = State::kPlanning;
  return true;
}

void ShapePlans::collect_plan(bool wait) {
  if (!job_) return;
  if (!wait && job_->planned.wait_for(std::chrono::seconds(0)) != std::future_status::ready) return;
  Shape& s = shape(job_->key);
  try {
    Shape work = job_->planned.get();
    s.plan = std::move(work.plan);
    s.screened = std::move(work.screened);
    ++plans_made_;
    take_plan(s);
  } catch (const std::exception& e) {
    s.state = State::kDynamic;
    s.why = absl::StrCat("planning failed: ", e.what());
  } catch (...) {
    s.state = State::kDynamic;
    s.why = "planning failed";
  }
  job_.reset();
}

void ShapePlans::finish_planning() { collect_plan(/*wait=*/true); }

StepOptions ShapePlans::planned_step(const Shape& s) {
  StepOptions opt;
  opt.hints = s.plan.hints;
  opt.placement = s.plan.placement;
  ++planned_steps_;
  return opt;
}

ShapeDecision ShapePlans::decision(State state) {
  switch (state) {
    case State::kUnplanned:
      return ShapeDecision::kNotPlannedYet;
    case State::kPlanning:
      return ShapeDecision::kPlanning;
    case State::kTrial:
      return ShapeDecision::kTrial;
    case State::kPlanned:
      return ShapeDecision::kPlan;
    case State::kDynamic:
      return ShapeDecision::kDtr;
  }
  return ShapeDecision::kDtr;
}

std::vector<ShapeReport> ShapePlans::report() const {
  std::vector<ShapeReport> list;
  for (const auto& [key, s] : shapes_) {
    ShapeReport r{.shape = key, .steps = s.steps, .decision = decision(s.state), .why = s.why};
    if (s.plan.hints) {
      r.planned = true;
      r.plan = s.plan.source;
      r.plan_seconds = s.plan.seconds;
      if (s.plan.placement) {
        if (s.plan.arena) r.arena_bytes = s.plan.arena->arena_bytes;
        r.placed_peak_live_bytes = s.plan.placement->peak_live_bytes;
      }
      if (!s.dtr_failed) r.dtr_step_overhead = s.dtr.overhead();
      if (s.trial.base > 0) r.plan_step_overhead = s.trial.overhead();  // a trial ran
      r.reused_steps = s.reused;
    }
    r.screened = s.screened;
    list.push_back(std::move(r));
  }
  return list;
}

}  // namespace remat::detail
