// remat/step_driver.h: a training loop's steps run under a memory budget with the measured
// behaviour: policy `auto` (DTR for a new shape, a static plan for a shape that repeats, kept
// only where it recomputes less), plans screened on the simulated backend and placed, and a
// step DTR cannot fit planned at once and run again with the same random numbers.
//
//   class Loop : public remat::TrainingProgram {
//    public:
//     struct Weights : State { remat::Tensor w, m, v; float loss = 0; };
//     std::unique_ptr<State> make_state(remat::Runtime& rt) override {
//       auto s = std::make_unique<Weights>();
//       s->w = rt.constant({{4, 64}}, w0);       // data: null on the simulated backend
//       s->m = rt.constant({{4, 64}}, zeros);
//       s->v = rt.constant({{4, 64}}, zeros);
//       return s;
//     }
//     void run_step(remat::Runtime& rt, State& state, int step) override {
//       auto& s = static_cast<Weights&>(state);
//       remat::ad::Tape tape(rt);
//       remat::ad::Var w = tape.leaf(s.w);
//       remat::ad::Var x = tape.input(rt.constant({{batch(step), 64}}, inputs(step)));
//       remat::ad::Var loss = my_loss(tape, x, w, step);
//       rt.mark_backward();
//       tape.backward(loss);
//       remat::read_back(rt, loss.value, &s.loss);  // read(); materialize() when simulated
//       remat::ops::adamw(rt, s.w, s.m, s.v, tape.grad(w), {}, step + 1);
//     }                                             // the step's tensors go here
//     remat::PlanCache::Key shape_key(int step) const override { return {batch(step)}; }
//   };
//   Loop loop;
//   remat::StepDriverOptions options;
//   options.runtime.budget = std::size_t{256} << 20;  // policy "auto" by default
//   remat::StepDriver driver(loop, options);
//   for (int step = 0; step < 100; ++step) {
//     const remat::StepReport& r = driver.run(step);    // r.kind, r.overhead(), ...
//   }
//   std::puts(driver.runtime().stats().summary().c_str());
//   for (const remat::ShapeReport& s : driver.shapes()) { ... }  // plan, decision, seconds
//
// The program must run the same ops in the same order for the same step whatever runtime it
// is given: the driver runs a step again in runtimes of its own on the simulated backend (no
// kernels, values never read) to record and price plans, and reruns a step that ran out of
// memory. Everything random derives from the step and the runtime's seed. Under `auto` those
// simulated steps run on a planning thread beside the driver's own step (options
// .plan_in_background): make_state and run_step may run on two threads at once, each with
// its own runtime and state, so they must change nothing else (a data loader's position
// belongs to the caller, read through the step number). A program that cannot promise that
// sets plan_in_background = false.
#ifndef REMAT_STEP_DRIVER_H_
#define REMAT_STEP_DRIVER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "remat/collectives.h"
#include "remat/plan_cache.h"
#include "remat/runtime.h"

namespace remat {

// What a training loop is, to the driver: the state it keeps in a runtime across steps, and
// one step of it.
class TrainingProgram {
 public:
  // Parameters, optimizer state, buffers: what the loop keeps in the runtime across steps.
  struct State {
    virtual ~State() = default;
  };
  virtual ~TrainingProgram() = default;
  // Makes the state in `rt`: the driver's runtime once, and a runtime on the simulated
  // backend for each plan it screens (there, kernels do not run: constants may get null data).
  virtual std::unique_ptr<State> make_state(Runtime& rt) = 0;
  // Runs step `step` on `state` in `rt`, inside a step the driver began: the forward pass,
  // rt.mark_backward(), the backward pass and the updates. Lets go of every tensor of the
  // step before returning (the driver ends the step then).
  virtual void run_step(Runtime& rt, State& state, int step) = 0;
  // What the loop knows of step `step`'s shapes before running it (batch, sequence length):
  // steps of one key run the same ops at the same shapes, and share a plan.
  virtual PlanCache::Key shape_key(int /*step*/) const { return {}; }
  // Names recorded steps ("NAME_step7").
  virtual std::string name() const { return "program"; }
};

// Reads `t` into `dst` where kernels run; on the simulated backend makes it resident as a
// read would, and leaves `dst` alone. Returns whether it read. A TrainingProgram reads its
// loss this way, so that a screened step makes the requests a real one makes.
bool read_back(Runtime& rt, const Tensor& t, void* dst);

struct StepDriverOptions {
  // The runtime the driver makes. Its `policy` is replaced by what `policy` below asks for.
  RuntimeOptions runtime = {};
  // "auto" (Note [Planning repeated shapes] in driver/shape_plans.h), "hinted" (the first
  // step of a shape with no usable plan in `plan_cache` is recorded and planned at 0.9 of the
  // budget; later steps follow the plan, made at their shape or a smaller one), or an
  // eviction policy's name (eviction_policy_names(): "dtr" and others) alone.
  std::string policy = "auto";
  // The planners of `auto` and `hinted` (remat/planner.h), and each one's seconds.
  std::vector<std::string> planners = {"rockmate", "mincut", "chen", "twremat", "rotor"};
  double plan_time_limit = 5;
  // `auto`: the planners' budgets, as fractions of the runtime's budget; each is a candidate.
  std::vector<double> plan_fractions = {0.9, 1.0, 1.1, 1.25, 1.5};
  // `auto`: price every candidate by simulated steps before trying one (Note [Screening
  // plans]); off, the 0.9 plan goes to its trial unscreened.
  bool screen = true;
  int screened_steps = 4;  // simulated steps per candidate; the dearest counts
  // `auto`: serve a plan's steps at offsets placed from a simulated trace of the plan (Note
  // [Placed allocations] in step_placement.cc), rather than by best fit.
  bool placement = true;
  std::size_t max_recordings = 8;  // `auto`: shapes whose recording waits for a third step
  // `auto`: shapes remembered (their state, plan and report). Past it, the one seen longest
  // ago that is not being planned or tried is forgotten (and is new if it comes again), so
  // that a model whose shapes never repeat keeps no more (ShapeReport is per shape kept;
  // DriverTotals::forgotten_shapes counts the others).
  std::size_t max_shapes = 1024;
  // `auto`: plan on a thread of its own while the steps go on under DTR, rather than inside
  // the step that is to try the plan (Note [Planning beside the steps] in
  // driver/shape_plans.h). Ignored on the simulated backend, whose steps take no real time:
  // planning there stays in the step, so its reports are the same on every run.
  bool plan_in_background = true;
  // With plan_in_background: the steps that may go on under DTR while a plan is made; the
  // step after them waits for the plan (and its shape's next step tries it). So a loop that
  // calls nothing but run() gets a shape's plan within plan_within_steps + 1 steps of the one
  // that started planning it, however slow its planners; finish_planning() waits at once.
  int plan_within_steps = 2;
  std::shared_ptr<PlanCache> plan_cache = nullptr;  // `hinted`; null: one of the driver's own
  // Data parallel: the ranks this driver's process is one of. A step that ran out of memory
  // is run again under a plan only where every rank found one (Note [Ranks that agree] in
  // remat/data_parallel.h); otherwise every rank throws. Null: this process alone.
  Collectives* collectives = nullptr;
};

// What one StepDriver::run did.
enum class StepKind : std::uint8_t {
  kDynamic,    // the eviction policy alone (DTR)
  kRecorded,   // DTR, recorded to be planned
  kPlanTrial,  // `auto`: the first step on a shape's new plan, judged against DTR
  kPlanned,    // following a plan
};
std::string_view step_kind_name(StepKind kind);  // "dtr", "recorded", "plan trial", "planned"

struct StepReport {
  int step = 0;
  PlanCache::Key shape{};
  StepKind kind = StepKind::kDynamic;
  // `auto`: DTR ran out of memory in the shape's first step; it was planned and run again.
  bool planned_after_oom = false;
  // `hinted`: the plan followed was made at this step's shape (else at a smaller one).
  bool exact_plan = false;
  double base_cost = 0;       // the cost of the step's first runs
  double recompute_cost = 0;  // the cost it recomputed
  // How long it waited for copies to and from host memory (RuntimeStats::transfer_exposed).
  double transfer_exposed = 0;
  double seconds = 0;  // wall time, planning included
  double planning_seconds = 0;
  std::optional<RecordedStep> recorded{};  // StepDriver::run(step, /*record=*/true)
  // Recomputed cost over first runs' cost: RuntimeStats::compute_overhead of this step.
  double overhead() const { return base_cost > 0 ? recompute_cost / base_cost : 0.0; }
};

// `auto`'s view of one shape.
enum class ShapeDecision : std::uint8_t {
  kNotPlannedYet,  // DTR; planned when the shape comes again
  kPlanning,       // DTR while its plan is made beside the steps
  kTrial,          // its plan's trial is under way
  kPlan,           // steps follow the plan
  kDtr,            // DTR for good (no plan beat it, or the plan cost more)
};
// "dtr (not planned yet)", "dtr (planning)", "trial", ...
std::string_view shape_decision_name(ShapeDecision d);

// A candidate `auto` weighed for a shape (Note [Screening plans]).
struct ScreenedPlan {
  std::string plan{};                // "dtr", or the plan's source
  std::optional<double> fraction{};  // of the budget it was planned at (none for DTR)
  std::optional<double> simulated_overhead{};
  std::string failure{};  // no overhead: why ("out of memory or thrash"); empty: no plan
  std::optional<std::size_t> arena_bytes{};  // its placement's arena
};

struct ShapeReport {
  PlanCache::Key shape{};
  int steps = 0;
  ShapeDecision decision = ShapeDecision::kNotPlannedYet;
  std::string why{};
  bool planned = false;  // a plan was chosen (the fields below until reused_steps)
  std::string plan{};    // its source, or why there is none
  double plan_seconds = 0;
  std::optional<std::size_t> arena_bytes{}, placed_peak_live_bytes{};
  std::optional<double> dtr_step_overhead{};   // the recorded DTR step's
  std::optional<double> plan_step_overhead{};  // its trial's
  int reused_steps = 0;                        // steps on the kept plan after its trial
  std::vector<ScreenedPlan> screened{};
};

// Counts over every step run.
struct DriverTotals {
  std::size_t plans_made = 0;
  std::size_t planned_steps = 0;      // steps that followed a plan
  std::size_t exact_plan_steps = 0;   // `hinted`: on a plan made at their shape
  std::size_t reused_plan_steps = 0;  // `hinted`: on a plan made at another shape
  std::string first_plan_source{};    // `hinted`: what made the first plan
  std::size_t forgotten_shapes = 0;   // `auto`: past StepDriverOptions::max_shapes
};

class StepDriver {
 public:
  // Makes the runtime and the program's state in it (may throw OutOfMemoryError).
  // Throws std::invalid_argument for a policy that is neither auto, hinted nor a known one.
  StepDriver(TrainingProgram& program, StepDriverOptions options);
  ~StepDriver();
  StepDriver(const StepDriver&) = delete;
  StepDriver& operator=(const StepDriver&) = delete;

  // Runs step `step` (recorded too where `record`). Errors are the runtime's
  // (OutOfMemoryError, ThrashError, a kernel's): the step is then aborted (its random
  // numbers rewound) and the driver stays usable.
  const StepReport& run(int step, bool record = false);

  // `auto`: waits for the plan being made beside the steps, if any; its shape's next step
  // tries it. (A loop that wants every report the same run to run calls it after each step,
  // or sets plan_in_background = false.)
  void finish_planning();

  Runtime& runtime();
  TrainingProgram::State& state();
  const DriverTotals& totals() const;
  std::vector<ShapeReport> shapes() const;  // `auto`: one per shape seen, by key

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

// The peak reserved bytes of `steps` steps of `program` run without a budget under DTR, in a
// runtime of its own made with `options` (its budget and policy replaced): what a budget
// given as a fraction of the unconstrained peak is a fraction of.
std::size_t measure_unconstrained_peak(TrainingProgram& program, RuntimeOptions options, int steps);

}  // namespace remat

#endif  // REMAT_STEP_DRIVER_H_
