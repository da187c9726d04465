// The training loop the examples share: parameters pinned in the runtime, a gradient tape
// per step, AdamW in place, and the statistics and flags every example reports.
//
//   class MyModel : public remat::examples::Model { ... };
//   int main(int argc, char** argv) { return remat::examples::run_main(argc, argv, my_model); }
//
// Flags: --backend cpu|cuda|sim, --budget BYTES | --budget-fraction F (of the unconstrained
// peak, measured first in the same process), --baseline yes|no, --policy P, --steps N,
// --seed S, --cuda-device N, --sync-after-launch, --json, and --name=value model flags
// (e.g. --layers 4).
#ifndef REMAT_EXAMPLES_COMMON_TRAINER_H_
#define REMAT_EXAMPLES_COMMON_TRAINER_H_

#include <absl/status/statusor.h>

#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kernels/autograd.h"
#include "kernels/ops.h"
#include "remat/hints.h"
#include "remat/plan_cache.h"
#include "remat/runtime.h"
#include "remat/step_planner.h"

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
  // Reads model flags (--layers etc.); unknown keys are an error.
  virtual absl::Status configure(const std::map<std::string, std::string>& flags) = 0;
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
  bool progress = false;          // a progress line on stderr
  bool measure_costs = true;      // CPU: op costs from timing first runs (--costs measured)
  double clock_limit = INFINITY;  // runtime clock (summed op costs) past which a run thrashes
  int record_step = -1;           // >= 0: record that step (TrainResult::recorded)
  // Policy `hinted`: the first step of a shape with no usable plan in the cache is recorded
  // and planned (remat::plan_step: the cheapest of the schedule the runtime realized and the
  // feasible plans of `planners`, fast ones by default, at 0.9 x the budget); later steps
  // take its hints, at their own shape or, through Note [Hints by position], at others.
  std::vector<std::string> planners = StepPlanOptions().planners;
  std::shared_ptr<PlanCache> plan_cache;  // null: one per run
  // Run the unconstrained baseline first (--baseline no skips it: a batch that only fits
  // under the budget cannot run unconstrained on a real device).
  bool baseline = true;
  CudaOptions cuda;                  // --cuda-device N, --sync-after-launch
  bool expandable_segments = false;  // --expandable-segments: one arena (Note [Expandable arena])
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
  std::optional<RecordedStep> recorded;  // TrainConfig::record_step
  // Policy `hinted`: plans made, steps that ran a plan made at their own shape, and steps
  // that ran one made at another shape.
  std::size_t plans_made = 0, exact_plan_steps = 0, reused_plan_steps = 0;
  std::string plan_source;  // what made the first plan
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

// Parses the common flags into `config` and the rest into `model_flags`.
absl::Status parse_flags(int argc, char** argv, TrainConfig& config, bool& json,
                         std::map<std::string, std::string>& model_flags);

int run_main(int argc, char** argv, Model& model);

}  // namespace remat::examples

#endif  // REMAT_EXAMPLES_COMMON_TRAINER_H_
