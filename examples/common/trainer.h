// The training loop the examples share: parameters pinned in the runtime, a gradient tape
// per step, AdamW in place, and the statistics and flags every example reports.
//
//   class MyModel : public remat::examples::Model { ... };
//   int main(int argc, char** argv) { return remat::examples::run_main(argc, argv, my_model); }
//
// Flags (EXAMPLE --help lists them with their defaults): --backend, --budget BYTES |
// --budget-fraction F (of the unconstrained run's peak reserved bytes, measured first in the
// same process), --policy, --steps, --seed, --costs, --json, ..., and the model's own
// (--layers 4).
#ifndef REMAT_EXAMPLES_COMMON_TRAINER_H_
#define REMAT_EXAMPLES_COMMON_TRAINER_H_

#include <absl/status/statusor.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include "kernels/autograd.h"
#include "kernels/ops.h"
#include "remat/hints.h"
#include "remat/plan_cache.h"
#include "remat/runtime.h"
#include "remat/step_planner.h"
#include "tools/cli/flags.h"

namespace remat::examples {

struct HostTensor {
  std::string name;
  TensorSpec spec;
  std::vector<float> data;  // empty on the simulated backend's request (see Model::init)
};

// A model: its parameters, its non-trained state (batch-norm running statistics) and the
// loss of a step. Everything a step draws (data, sequence lengths) derives from (seed, step),
// so two runs see the same inputs.
class Model {
 public:
  virtual ~Model() = default;
  virtual std::string name() const = 0;
  // Declares the model's flags (--layers etc.), bound to its configuration.
  virtual void add_flags(cli::FlagSet& flags) = 0;
  // Checks the flags together once they are read (--channels a multiple of --heads).
  virtual absl::Status check_flags() const { return absl::OkStatus(); }
  virtual std::vector<HostTensor> init_params(std::uint64_t seed) const = 0;
  virtual std::vector<HostTensor> init_buffers() const { return {}; }
  // Builds step `step`'s inputs in `rt` and runs the forward pass on the tape; returns the
  // one-element loss. `buffers` are pinned and may be updated in place (running statistics).
  virtual ad::Var loss(ad::Tape& tape, const std::vector<ad::Var>& params,
                       const std::vector<Tensor>& buffers, int step, std::uint64_t seed) = 0;
  // How many items a step processed (tokens, images, trees), for per-item rates.
  virtual double items(int step, std::uint64_t seed) const = 0;
  // What the loop knows of step `step`'s shapes before running it (batch, sequence length):
  // the key of its plan in the PlanCache. Steps with one key run the same shapes.
  virtual PlanCache::Key shape_key(int /*step*/, std::uint64_t /*seed*/) const { return {}; }
};

struct TrainConfig {
  Backend backend = Backend::kCpu;
  std::size_t budget = SIZE_MAX;
  double budget_fraction = 0;  // > 0: the budget is this fraction of a first unconstrained run
  std::string policy = "dtr";
  int steps = 10;
  std::uint64_t seed = 1;
  ops::AdamW adamw = {.lr = 1e-3f, .weight_decay = 0.0f};
  bool progress = false;  // a progress line on stderr
  // Op costs from timing first runs (--costs measured) rather than each op's declared work
  // priced by the roofline (the default): measured costs make eviction order, and whether a
  // tight budget fits, vary from run to run.
  bool measure_costs = false;
  double clock_limit = INFINITY;  // runtime clock (summed op costs) past which a run thrashes
  int record_step = -1;           // >= 0: record that step (TrainResult::recorded)
  // Policy `hinted`: the first step of a shape with no usable plan in the cache is recorded
  // and planned (remat::plan_step: the cheapest of the schedule the runtime realized and the
  // feasible plans of `planners`, fast ones by default, at 0.9 x the budget); later steps
  // take its hints, at their own shape or, through Note [Hints by position], at others.
  // Policy `auto` (Note [Planning repeated shapes] in shape_plans.h): DTR for a shape's first
  // two steps, the second recorded; at its third the recording is planned with `planners`
  // at several fractions of the budget, screened on the simulated backend, and the plan is
  // kept where its steps recompute no more than DTR's did.
  std::vector<std::string> planners = StepPlanOptions().planners;
  double plan_time_limit = 5;             // seconds per planner
  std::shared_ptr<PlanCache> plan_cache;  // null: one per run
  // Run the unconstrained baseline first (--baseline no skips it: a batch that only fits
  // under the budget cannot run unconstrained on a real device).
  bool baseline = true;
  CudaOptions cuda;                  // --cuda-device N, --sync-after-launch
  bool expandable_segments = false;  // --expandable-segments: one arena (Note [Expandable arena])
  bool compaction = true;            // --compaction no: RuntimeOptions::compaction off
  bool placement = true;             // policy auto places its plans' steps (--placement)
};

struct TrainResult {
  std::string status = "ok";  // ok, oom, thrash, error
  std::string error;
  std::vector<float> losses;                    // per step (NaN on the simulated backend)
  std::vector<std::vector<float>> final_state;  // parameters then buffers (CPU backend)
  RuntimeStats stats;
  std::size_t budget = SIZE_MAX;
  std::size_t peak_reserved = 0;
  std::size_t peak_allocated = 0;
  // Segment reserves and releases of the memory resource in the first step (the rest are in
  // stats.memory): after it, a training loop should be reusing what it reserved.
  std::size_t first_step_segment_reserves = 0, first_step_segment_releases = 0;
  std::size_t param_bytes = 0;               // parameters + optimizer state + buffers
  std::size_t forward_activation_bytes = 0;  // most bytes of non-pinned tensors after a forward
  double items = 0;
  double wall_seconds = 0;
  std::vector<double> step_seconds;      // wall time of each step that completed
  std::vector<double> step_overheads;    // each one's recomputed cost / its first runs' cost
  std::optional<RecordedStep> recorded;  // TrainConfig::record_step
  // Policy `hinted`: plans made, steps that ran a plan made at their own shape, and steps
  // that ran one made at another shape.
  std::size_t plans_made = 0, exact_plan_steps = 0, reused_plan_steps = 0;
  std::string plan_source;  // what made the first plan
  // Policy `auto`: trials and steps on a kept plan, and ShapePlans::report().
  std::size_t planned_steps = 0;
  nlohmann::json shape_plans;
};

// One training run with the budget as given (budget_fraction ignored).
TrainResult train(Model& model, const TrainConfig& config);

struct Comparison {
  TrainResult baseline;  // unconstrained
  TrainResult run;       // under the budget
};
// The unconstrained run, then the budgeted one (budget = fraction x its peak reserved bytes,
// or config.budget when no fraction is given).
Comparison train_with_baseline(Model& model, const TrainConfig& config);

// The common flags that do not map one to one onto TrainConfig.
struct TrainFlags {
  std::string backend = "cpu", baseline = "yes", costs = "estimated", compaction = "yes",
              placement = "yes";
  cli::BudgetFlags budget;
  bool json = false;
};
// Declares the flags every example takes (--backend, --budget, --steps, ...).
void add_train_flags(cli::FlagSet& flags, TrainConfig& config, TrainFlags& extra);
// Moves what add_train_flags read into `config`.
void apply_train_flags(const TrainFlags& extra, TrainConfig& config);

// The examples' main: the common flags and the model's, a baseline and a budgeted run.
int run_main(int argc, char** argv, Model& model);

}  // namespace remat::examples

#endif  // REMAT_EXAMPLES_COMMON_TRAINER_H_
