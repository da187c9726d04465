#include "examples/common/shape_plans.h"

#include <absl/strings/str_cat.h>
#include <absl/strings/str_join.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <utility>

#include "remat/step_planner.h"

namespace remat::examples {

StepPlan plan_recorded_step(const RecordedStep& step, std::size_t budget,
                            const std::vector<std::string>& planners, double time_limit,
                            double fraction) {
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
  // The schedule the runtime realized competes unchecked against opt.budget_bytes: it fit
  // the runtime's own budget (Note [Seeding hinted] in tools/compare/compare.cc).
  absl::StatusOr<ChosenPlan> chosen = remat::plan_step(step.graph, step.executed, opt);
  if (chosen.ok() && chosen->feasible) {
    plan.hints = std::make_shared<StepHints>(std::move(chosen->hints));
    plan.source = chosen->source;
  } else {
    plan.source = chosen.ok() ? chosen->reason : std::string(chosen.status().message());
  }
  plan.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return plan;
}

ShapePlans::Shape& ShapePlans::shape(const PlanCache::Key& key) { return shapes_[key]; }

void ShapePlans::choose_plan(Shape& s) {
  const auto start = std::chrono::steady_clock::now();
  if (!options_.screen) {
    s.plan = plan_recorded_step(*s.recording, options_.budget, options_.planners,
                                options_.time_limit, 0.9);
    return;
  }
  const std::optional<StepCost> dtr = options_.screen(nullptr);
  s.screened.push_back(
      {{"plan", "dtr"}, {"simulated_overhead", dtr ? nlohmann::json(dtr->overhead()) : "failed"}});
  std::optional<StepPlan> best;
  double best_recompute = dtr ? dtr->recompute : INFINITY;
  for (double fraction : options_.fractions) {
    StepPlan plan = plan_recorded_step(*s.recording, options_.budget, options_.planners,
                                       options_.time_limit, fraction);
    nlohmann::json j = {{"fraction", fraction}, {"plan", plan.source}};
    if (plan.empty()) {
      s.screened.push_back(std::move(j));
      continue;
    }
    const std::optional<StepCost> cost = options_.screen(plan.hints);
    j["simulated_overhead"] = cost ? nlohmann::json(cost->overhead()) : "out of memory or thrash";
    s.screened.push_back(std::move(j));
    if (cost && cost->recompute < best_recompute) {
      best_recompute = cost->recompute;
      best = std::move(plan);
    }
  }
  if (best) {
    s.plan = *std::move(best);
  } else {
    s.plan = StepPlan{};
    s.plan.hints = std::make_shared<StepHints>();
    s.plan.source = "no plan recomputed less than DTR on the simulated backend";
  }
  s.plan.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

StepOptions ShapePlans::before(const PlanCache::Key& key) {
  StepOptions opt;
  if (options_.budget == SIZE_MAX) return opt;
  Shape& s = shape(key);
  switch (s.state) {
    case State::kUnplanned:
      // The shape's first step runs unrecorded: a first step is unlike the ones after it
      // (costs being learned, memory reserved for the first time), and the trial is judged
      // against the recorded step. Then it is recorded (again, if its recording was dropped).
      if (!s.recording) {
        opt.record = s.steps > 0;
        return opt;
      }
      choose_plan(s);
      s.recording.reset();
      std::erase(recorded_, key);
      ++plans_made_;
      if (s.plan.empty()) {
        s.state = State::kDynamic;
        s.why = absl::StrCat("no plan: ", s.plan.source);
        return opt;
      }
      s.state = State::kTrial;
      [[fallthrough]];
    case State::kTrial:
    case State::kPlanned:
      opt.hints = s.plan.hints;
      ++planned_steps_;
      return opt;
    case State::kDynamic:
      return opt;
  }
  return opt;
}

void ShapePlans::after(const PlanCache::Key& key, RecordedStep step, StepCost cost) {
  if (options_.budget == SIZE_MAX) return;
  Shape& s = shape(key);
  ++s.steps;
  switch (s.state) {
    case State::kUnplanned:
      if (s.recording || s.steps == 1 || step.graph.nodes.empty()) return;
      s.recording = std::move(step);
      s.dtr = cost;
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
        s.why = "the plan recomputed no more than DTR";
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
    case State::kDynamic:
      return;
  }
}

nlohmann::json ShapePlans::report() const {
  nlohmann::json list = nlohmann::json::array();
  for (const auto& [key, s] : shapes_) {
    nlohmann::json j;
    j["shape"] = key;
    j["steps"] = s.steps;
    switch (s.state) {
      case State::kUnplanned:
        j["decision"] = "dtr (not planned yet)";
        break;
      case State::kTrial:
        j["decision"] = "trial";
        break;
      case State::kPlanned:
        j["decision"] = "plan";
        break;
      case State::kDynamic:
        j["decision"] = "dtr";
        break;
    }
    if (!s.why.empty()) j["why"] = s.why;
    if (s.plan.hints) {
      j["plan"] = s.plan.source;
      j["plan_seconds"] = s.plan.seconds;
      j["dtr_step_overhead"] = s.dtr.overhead();
      if (s.trial.base > 0) j["plan_step_overhead"] = s.trial.overhead();  // a trial ran
      j["reused_steps"] = s.reused;
    }
    if (!s.screened.empty()) j["screened"] = s.screened;
    list.push_back(std::move(j));
  }
  return list;
}

}  // namespace remat::examples
