// The training loop the examples share: a Model as a remat::TrainingProgram (parameters and
// AdamW state pinned in the runtime, a gradient tape per step, AdamW in place) run by the
// library's StepDriver, and the statistics and flags every example reports.
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

#include "kernels/autograd.h"
#include "kernels/ops.h"
#include "remat/collectives.h"
#include "remat/gradient_buckets.h"
#include "remat/plan_cache.h"
#include "remat/runtime.h"
#include "remat/step_driver.h"
#include "tools/cli/flags.h"

namespace remat::examples {

struct HostTensor {
  std::string name;
  TensorSpec spec;
  std::vector<float> data;  // empty on the simulated backend's request (see Model::init)
};

// One of the `count` equal parts of a step's batch, `index` from 0: what one rank (or one
// micro-batch) of a data-parallel step trains on.
struct Shard {
  int index = 0, count = 1;
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
  // The loss of `shard` of step `step`'s batch (its mean over the shard's items): the same
  // inputs as the whole batch's, cut into equal parts. A model that cannot split its batch
  // keeps the default: check_shards refuses more than one.
  virtual absl::Status check_shards(int count) const;
  virtual ad::Var shard_loss(ad::Tape& tape, const std::vector<ad::Var>& params,
                             const std::vector<Tensor>& buffers, int step, std::uint64_t seed,
                             Shard shard);
  // How many items a step processed (tokens, images, trees), for per-item rates.
  virtual double items(int step, std::uint64_t seed) const = 0;
  // What the loop knows of step `step`'s shapes before running it (batch, sequence length):
  // the key of its plan in the PlanCache. Steps with one key run the same shapes.
  virtual PlanCache::Key shape_key(int /*step*/, std::uint64_t /*seed*/) const { return {}; }
};

// The trainer's defaults: seed 1, DTR alone, plan_step()'s planners (run_main's: the driver's),
// planning inside the step (run_main: beside the steps, as --plan-in-background says).
StepDriverOptions trainer_driver_options();

struct TrainConfig {
  // The runtime's options (backend, budget, seed, costs, CUDA, allocator, compaction) and
  // the policy's (auto, hinted or an eviction policy alone; planners, placement, plan cache).
  StepDriverOptions driver = trainer_driver_options();
  double budget_fraction = 0;  // > 0: the budget is this fraction of a first unconstrained run
  int steps = 10;
  ops::AdamW adamw = {.lr = 1e-3f, .weight_decay = 0.0f};
  bool progress = false;  // a progress line on stderr
  int record_step = -1;   // >= 0: record that step (TrainResult::recorded)
  // Run the unconstrained baseline first (--baseline no skips it: a batch that only fits
  // under the budget cannot run unconstrained on a real device).
  bool baseline = true;
  // Data parallel: each step's batch in micro_batches x ranks equal shards (Model::shard_loss);
  // this process runs its micro-batches one after the other, and the gradients are summed
  // over them, then over the ranks of `collectives` (null: this process alone), in shard
  // order, and divided by the shard count. One process with --micro-batches 2 gets the bits
  // two ranks of one micro-batch each get.
  int micro_batches = 1;
  Collectives* collectives = nullptr;
  // 1: AdamW's state split over the ranks (Note [Optimizer state in shards] in
  // common/param_shards.cc); 0: every rank holds all of it. The same bits either way.
  int zero = 0;
  // Data parallel: a bucket of gradients closes at this many bytes, and its sum over the
  // ranks starts beside the rest of the backward pass (remat/gradient_buckets.h).
  std::uint64_t bucket_bytes = std::uint64_t{1} << 20;
  // On the CUDA backend: the buckets' sums over NCCL, on device memory (null: through host
  // memory and `collectives`).
  DeviceCollectives* device_collectives = nullptr;
  int ranks() const { return collectives != nullptr ? collectives->size() : 1; }
  int rank() const { return collectives != nullptr ? collectives->rank() : 0; }
  int shards() const { return micro_batches * ranks(); }
  Backend backend() const { return driver.runtime.backend; }
  std::size_t budget() const { return driver.runtime.budget; }
  std::uint64_t seed() const { return driver.runtime.seed; }
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
  std::size_t optimizer_state_bytes = 0;     // AdamW's moments this process holds
  std::size_t forward_activation_bytes = 0;  // most bytes of non-pinned tensors after a forward
  GradientBucketStats buckets;  // data parallel: the last step's buckets, the steps' seconds
  double items = 0;
  double wall_seconds = 0;
  std::vector<double> step_seconds;           // wall time of each step that completed
  std::vector<double> step_overheads;         // each one's recomputed cost / its first runs' cost
  std::vector<double> step_transfer_exposed;  // each one's waits for host copies / the same
  std::optional<RecordedStep> recorded;       // TrainConfig::record_step
  DriverTotals totals;                        // plans made, planned steps (auto, hinted)
  std::vector<ShapeReport> shape_plans;       // policy auto: StepDriver::shapes()
};

// One training run with the budget as given (budget_fraction ignored).
TrainResult train(Model& model, const TrainConfig& config);

struct Comparison {
  TrainResult baseline;  // unconstrained
  TrainResult run;       // under the budget
};
// The budget at `fraction` of an unconstrained run: its fixed reservation (cuBLAS's workspace
// on CUDA, none elsewhere) plus the fraction of the rest of its peak reserved bytes.
std::size_t fraction_budget(double fraction, const TrainResult& baseline);

// The unconstrained run, then the budgeted one (fraction_budget, or config.budget when no
// fraction is given).
Comparison train_with_baseline(Model& model, const TrainConfig& config);

// The examples' main: the common flags and the model's, a baseline and a budgeted run.
int run_main(int argc, char** argv, Model& model);

}  // namespace remat::examples

#endif  // REMAT_EXAMPLES_COMMON_TRAINER_H_
