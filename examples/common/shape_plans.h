// The trainer's policy `auto`: dynamic eviction for shapes seen once, a static plan for
// shapes that repeat, kept only where it recomputes no more than the dynamic run did.
//
//   ShapePlans plans({.budget = budget, .planners = {"rockmate", "chen", "mincut"}});
//   for (int step = 0; ...; ++step) {
//     StepOptions opt = plans.before(key);          // hints, or a request to record
//     rt.begin_step(opt);  ...;  RecordedStep r = rt.end_step();
//     plans.after(key, std::move(r), stats_delta);  // records, plans, or judges a trial
//   }
//   nlohmann::json report = plans.report();          // per shape: plan, seconds, reuse
//
// Note [Planning repeated shapes]
// A shape's first step runs under DTR; its second too, recorded (a first step is unlike the
// later ones: costs being learned, memory reserved for the first time). When the shape
// comes a third time, its recording is planned (remat::plan_step: the realized schedule against the planners, at
// 0.9 of the budget) and that step follows the plan: a trial. The trial is judged by the
// cost it recomputed against the recorded DTR step's (the same ops at the same shapes, so
// with estimated costs the comparison is exact and the same on every run): the plan is kept
// if it recomputed no more, otherwise the shape goes back to DTR for good. A shape that
// never repeats (a tree-LSTM's trees) costs nothing, one seen twice a recording; recordings are
// kept for the most recent `max_recordings` shapes only. Results never depend on any of
// this: hints decide what is evicted, never what is computed.
#ifndef REMAT_EXAMPLES_COMMON_SHAPE_PLANS_H_
#define REMAT_EXAMPLES_COMMON_SHAPE_PLANS_H_

#include <cstddef>
#include <deque>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "remat/hints.h"
#include "remat/plan_cache.h"
#include "remat/runtime.h"

namespace remat::examples {

// The hints a recorded step's plan gives the runtime, with what was chosen and why.
struct StepPlan {
  std::shared_ptr<const StepHints> hints;  // empty hints: nothing fit; DTR alone
  std::string source;                      // the winning candidate, or why none
  double seconds = 0;                      // planning time
};

// Plans `step` for a runtime budget of `budget` reserved bytes with `planners` (each given
// `time_limit` seconds): plan_step() at 0.9 of it, since the planners count tensor bytes and
// the allocator rounds sizes up and cannot always reuse a freed block.
StepPlan plan_recorded_step(const RecordedStep& step, std::size_t budget,
                            const std::vector<std::string>& planners, double time_limit = 5);

class ShapePlans {
 public:
  struct Options {
    std::size_t budget = SIZE_MAX;  // SIZE_MAX: nothing to plan, every step is DTR's
    std::vector<std::string> planners;
    double time_limit = 5;           // each planner's seconds
    std::size_t max_recordings = 8;  // shapes not planned yet whose recording is kept
  };
  // The cost a step spent, from RuntimeStats before and after it.
  struct StepCost {
    double base = 0, recompute = 0;
  };

  explicit ShapePlans(Options options) : options_(std::move(options)) {}

  // The options of the next step, of shape `key`.
  StepOptions before(const PlanCache::Key& key);
  // After that step: what end_step() returned and what the step cost.
  void after(const PlanCache::Key& key, RecordedStep step, StepCost cost);

  std::size_t plans_made() const { return plans_made_; }
  std::size_t planned_steps() const { return planned_steps_; }  // trials and kept plans
  // One entry per shape seen: its state, the plan, its planning seconds, the costs compared
  // and how many steps reused the plan.
  nlohmann::json report() const;

 private:
  enum class State { kUnplanned, kTrial, kPlanned, kDynamic };
  struct Shape {
    State state = State::kUnplanned;
    int steps = 0;
    std::optional<RecordedStep> recording;  // kUnplanned, until planned or dropped
    StepCost dtr;                           // the recorded DTR step's
    StepCost trial;                         // the trial's
    StepPlan plan;
    int reused = 0;  // steps on the kept plan after its trial
    std::string why;
  };
  Shape& shape(const PlanCache::Key& key);

  Options options_;
  std::map<PlanCache::Key, Shape> shapes_;
  std::deque<PlanCache::Key> recorded_;  // shapes holding a recording, oldest first
  std::size_t plans_made_ = 0, planned_steps_ = 0;
};

}  // namespace remat::examples

#endif  // REMAT_EXAMPLES_COMMON_SHAPE_PLANS_H_
