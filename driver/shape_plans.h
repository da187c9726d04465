// The step driver's policy `auto` (remat/step_driver.h): dynamic eviction for shapes seen
// once, a static plan for shapes that repeat, kept only where it recomputes no more than the
// dynamic run did.
//
//   ShapePlans plans({.budget = budget, .planners = {"rockmate", "mincut"}, .screen = sim});
//   for (int step = 0; ...; ++step) {
//     StepOptions opt = plans.before(key, step);    // hints, or a request to record
//     rt.begin_step(opt);  ...;  RecordedStep r = rt.end_step();
//     plans.after(key, std::move(r), stats_delta);  // records, plans, or judges a trial
//   }
//   std::vector<ShapeReport> report = plans.report();  // per shape: plan, seconds, reuse
//
// Note [Planning repeated shapes]
// A shape's first step runs under DTR; its second too, recorded (a first step is unlike
// the later ones: costs being learned, memory reserved for the first time). When the shape
// comes a third time, its recording is planned and screened (Note [Screening plans]) and
// that step follows the chosen plan: a trial. The trial is judged by the cost it
// recomputed against the recorded DTR step's (the same ops at the same shapes, so with
// estimated costs the comparison is exact and the same on every run): the plan is kept if
// it recomputed no more, otherwise the shape goes back to DTR for good; so does a later
// planned step that recomputes more than the DTR step did. A shape whose recorded DTR step
// recomputed nothing is not planned: no plan could do better. A shape whose first step DTR
// cannot run at all is planned at once (Note [Planning a step DTR cannot run] in
// shape_plans.cc). A shape that never repeats (a tree-LSTM's trees) costs nothing, one seen
// twice a recording; recordings are kept for the most recent `max_recordings` shapes only.
// Results never depend on any of this: hints decide what is evicted, never what is
// computed.
//
// Note [Planning beside the steps]
// Planning a shape takes as long as its planners are given, times the candidates screened:
// a minute for GPT-2 124M on an H200, where a step takes half a second. Made inside a step,
// that minute is the step's, and a loop that measures its steps (or a batch that repeats
// few times) pays it all. With `background`, the shape's planning runs on a thread of its
// own instead, from the recording moved there, and its steps go on under DTR meanwhile;
// the first step of the shape after the plan is ready is its trial. Where costs are
// estimated, the first step is recorded (its graph and costs are the later steps'; only its
// memory differs), so that the plan is made beside the second step and the trial judged
// against that second step's cost: planning beside the steps then reaches the same trial
// step that planning in the step does, where the planners take no longer than a step
// (recording the second step instead put one more DTR step before the trial, and the 6-layer
// GPT recomputed 0.31 of a step on average over 30 against 0.28). The steps do not wait
// for ever: after `steps_beside` of them (of any shape) the next waits for the plan, so a
// plan reaches its trial within a bound whatever the planners' speed (without it, a loop
// that never called finish_planning() met its plan late: the 6-layer GPT's steps recomputed
// 0.944 of a step on average over 30 against 0.64 planning in the step, issue 56). One
// shape is planned at a time: another waiting keeps its recording until the thread is
// free. The planning
// thread runs the program's steps on simulated runtimes of its own (the screening), beside
// the driver's step: the program must keep what a step changes in the runtime it is given
// (remat/step_driver.h). Which step a plan reaches first depends on the planners' speed,
// so reports differ run to run; results do not. A step DTR cannot run is still planned at
// once (the step needs the plan), and the destructor waits for planning under way, which
// stops between candidates. (Checkmate's solver forks beside the step's kernels: Note [BLAS
// across fork] in kernels/cpu/blas.cc.)
//
// Note [Screening plans]
// Which plan to try is chosen on the simulated backend: the same allocator and the same
// estimated costs, without kernels, so a step there costs what it costs for real. A plan's
// tensor bytes say little about how the allocator will hold them, so plans are made at
// several fractions of the budget, and at the fractions whose placement (Note [Placed
// allocations] in step_placement.cc) just fits beside the constants (Note [Plans that
// fit their arena] in shape_plans.cc). Each is traced on a simulated runtime without a
// budget and placed, then screened by four simulated steps following it (after a DTR and a
// recorded one, as the real steps go), its dearest step counting; the cheapest that beats
// the simulated DTR step goes to the real trial; where none does, DTR stays. A plan that
// runs out of memory in its screening never reaches a real step. (What a placed plan saves
// against DTR on the example GPT: docs/measurements.md.)
#ifndef REMAT_DRIVER_SHAPE_PLANS_H_
#define REMAT_DRIVER_SHAPE_PLANS_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "remat/hints.h"
#include "remat/placement.h"
#include "remat/plan_cache.h"
#include "remat/runtime.h"
#include "remat/step_driver.h"

namespace remat::detail {

// The hints a recorded step's plan gives the runtime, with what was chosen and why.
struct StepPlan {
  std::shared_ptr<const StepHints> hints;  // empty hints: nothing fit; DTR alone
  std::string source;                      // the winning candidate, or why none
  double seconds = 0;                      // planning time
  // Where the plan's steps put their tensors (Note [Placed allocations] in
  // step_placement.cc), from a trace of the plan on the simulated backend; null: the
  // allocator's best fit.
  std::shared_ptr<const Placement> placement;
  // In its screening: the arena its placement needed beside the holes it used, and the
  // room the budget left for one (nothing where the screening never sized one).
  std::optional<CachingAllocator::PlacementOutcome> arena;
  // Where a plan with copies to the host won: the cheapest plan without them, which the
  // screening weighs beside it (ChosenPlan::recompute_only_hints); null otherwise.
  std::shared_ptr<const StepHints> recompute_only;
  std::string recompute_only_source;
  bool empty() const { return !hints || (hints->ops.empty() && hints->schedule.empty()); }
};

// Plans `step` with `planners` (each given `time_limit` seconds) at `fraction` of a runtime
// budget of `budget` reserved bytes: plan_step(), whose candidates are the planners' plans
// and the schedule the runtime realized.
// `realized_fits`: the recording ran under that budget, so the schedule it realized competes
// unchecked (false for a recording made without a budget).
// `host`: host memory for the plans (StepPlanOptions::host_memory_bytes, host_link).
struct HostForPlans {
  std::int64_t bytes = 0;
  HostLink link = HostLink::pcie5();
};
StepPlan plan_recorded_step(const RecordedStep& step, std::size_t budget,
                            const std::vector<std::string>& planners, double time_limit = 5,
                            double fraction = 0.9, bool realized_fits = true,
                            HostForPlans host = {});

class ShapePlans {
 public:
  // The cost a step spent, from RuntimeStats before and after it.
  // `recompute` counts the time the step lost: recomputation, and copies to and from the
  // host the clock waited for (RuntimeStats::transfer_exposed).
  struct StepCost {
    double base = 0, recompute = 0;
    // Recomputed cost over first runs' cost (RuntimeStats::compute_overhead of one step).
    double overhead() const { return base > 0 ? recompute / base : 0.0; }
  };
  // Runs step `step` of the shape being planned on the simulated backend (Note [Screening
  // plans]) following `plan` (its hints, and the placement it sets), after DTR steps as the
  // real run had them where `after_dtr`, or under DTR alone where `plan` is null: the
  // dearest one's cost, or nothing where one ran out of memory or thrashed. Called on the
  // planning thread where `background` (Note [Planning beside the steps]).
  using Screen = std::function<std::optional<StepCost>(int step, StepPlan* plan, bool after_dtr)>;
  struct Options {
    std::size_t budget = SIZE_MAX;  // SIZE_MAX: nothing to plan, every step is DTR's
    std::vector<std::string> planners;
    double time_limit = 5;  // each planner's seconds
    // The planners' budgets, as fractions of `budget`: each gives a candidate plan.
    std::vector<double> fractions = {0.9, 1.0, 1.1, 1.25, 1.5};
    Screen screen;                   // null: the 0.9 plan goes to its trial unscreened
    std::size_t max_recordings = 8;  // shapes not planned yet whose recording is kept
    std::size_t max_shapes = 1024;   // shapes kept (Note [Shapes forgotten])
    HostForPlans host;               // host memory the plans may use (planner offload)
    bool background = false;         // Note [Planning beside the steps]
    int steps_beside = 2;            // with `background`: the steps that may go on meanwhile
    // With `background` and costs estimated (the same in the first step as later): the
    // first step is recorded, so that the plan is made beside the second (Note [Planning
    // beside the steps]).
    bool record_first_step = false;
  };

  explicit ShapePlans(Options options) : options_(std::move(options)) {}
  ~ShapePlans();  // stops planning under way and waits for it
  ShapePlans(const ShapePlans&) = delete;
  ShapePlans& operator=(const ShapePlans&) = delete;

  // The options of step `step`, of shape `key`.
  StepOptions before(const PlanCache::Key& key, int step);
  // After that step: what end_step() returned and what the step cost.
  void after(const PlanCache::Key& key, RecordedStep step, StepCost cost);
  // The step before() prepared ran out of memory under DTR, before any update: whether the
  // shape may be planned now (Note [Planning a step DTR cannot run]).
  bool may_plan_after_oom(const PlanCache::Key& key) const;
  // Plans the shape from `recording` (step `step` recorded without a budget) for the step to
  // be run again: its options, or no hints where no plan survived its screening.
  StepOptions plan_after_oom(const PlanCache::Key& key, RecordedStep recording, int step);
  // Waits for the plan being made on the planning thread, if any: its shape's next step is
  // its trial (Note [Planning beside the steps]).
  void finish_planning();

  // A step of the shape that followed its plan failed (out of memory, thrash): the shape goes
  // back to DTR, and the step does not count as planned.
  void planned_step_failed(const PlanCache::Key& key, const std::string& why);
  // Whether the shape's steps are on a plan's trial (before() gave them its hints).
  bool in_trial(const PlanCache::Key& key) const;
  std::size_t plans_made() const { return plans_made_; }
  std::size_t planned_steps() const { return planned_steps_; }  // trials and kept plans
  std::size_t forgotten() const { return forgotten_; }          // shapes past max_shapes
  // One entry per shape seen: its state, the plan, its planning seconds, the costs compared
  // and how many steps reused the plan.
  std::vector<ShapeReport> report() const;

 private:
  enum class State { kUnplanned, kPlanning, kTrial, kPlanned, kDynamic };
  static ShapeDecision decision(State state);
  struct Shape {
    State state = State::kUnplanned;
    int steps = 0;
    std::optional<RecordedStep> recording;  // kUnplanned, until planned or dropped
    int recording_step = 0;                 // the step screened for its plan
    bool dtr_failed = false;                // DTR ran out of memory on it: no DTR steps
    StepCost dtr;                           // the recorded DTR step's
    bool dtr_from_first_step = false;       // `dtr` is the first step's until the second ends
    StepCost trial;                         // the trial's
    StepPlan plan;
    int reused = 0;  // steps on the kept plan after its trial
    std::string why;
    std::vector<ScreenedPlan> screened;  // Note [Screening plans]
    std::uint64_t last_seen = 0;         // when shape() last gave it (Note [Shapes forgotten])
  };
  // Plans the recorded shape `s` and screens the candidates: s.plan is the winner, or empty.
  void choose_plan(Shape& s);
  struct Search {  // choose_plan's candidates so far
    Shape& shape;
    std::optional<StepPlan> best;
    double best_recompute;
  };
  std::optional<double> screen_candidate(Search& q, double fraction);
  std::optional<double> screen_plan(Search& q, StepPlan plan, double fraction);
  void screen_fractions(Search& q);  // the fixed fractions, then Note [Plans that fit ...]
  Shape& shape(const PlanCache::Key& key);
  void forget_a_shape(const PlanCache::Key& keep);  // Note [Shapes forgotten]
  StepOptions planned_step(const Shape& s);         // the options of a step that follows s.plan
  void plan_recording(const PlanCache::Key& key, Shape& s);  // choose_plan, then drop it
  // Sends a shape's planned or failed state after its plan is made: whether it is on trial.
  bool take_plan(Shape& s);
  // Note [Planning beside the steps]: moves the shape's recording to the planning thread;
  // false where no thread could be started (the recording stays).
  bool start_planning(const PlanCache::Key& key, Shape& s);
  void collect_plan(bool wait);  // takes the thread's plan where it is made (or waits)
  bool stopping() const { return stopping_.load(std::memory_order_relaxed); }

  Options options_;
  std::map<PlanCache::Key, Shape> shapes_;
  std::deque<PlanCache::Key> recorded_;  // shapes holding a recording, oldest first
  std::size_t plans_made_ = 0, planned_steps_ = 0, forgotten_ = 0;
  std::uint64_t seen_ = 0;  // shape() calls
  struct Job {              // a shape being planned on the planning thread
    PlanCache::Key key;
    std::future<Shape> planned;  // the shape's plan and screened candidates
    int steps_beside = 0;        // steps begun since planning started
  };
  std::optional<Job> job_;
  std::atomic<bool> stopping_{false};  // the destructor's: planning stops between candidates
};

}  // namespace remat::detail

#endif  // REMAT_DRIVER_SHAPE_PLANS_H_
