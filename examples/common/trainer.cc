#include "examples/common/trainer.h"

#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <iostream>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <utility>

#include "examples/common/param_shards.h"
#include "remat/byte_size.h"
#include "remat/cuda_api.h"
#include "remat/data_parallel.h"
#include "remat/gradient_buckets.h"
#ifdef REMAT_EXAMPLES_HAVE_MPI
#include "remat/mpi_collectives.h"
#endif
#ifdef REMAT_EXAMPLES_HAVE_NCCL
#include "remat/nccl_collectives.h"
#endif
#include "remat/errors.h"
#include "remat/step_planner.h"
#include "remat/system_cuda.h"
#include "tools/cli/driver_flags.h"
#include "tools/report/report_json.h"

namespace remat::examples {
namespace {

struct Param {
  Tensor value, m, v;
};

// A Model as the step driver runs it: its state in a runtime, and a step of it.
class ModelProgram final : public TrainingProgram {
 public:
  struct Weights : State {
    std::vector<Param> params;         // with --zero 1, values only during a step, m and v unused
    std::vector<ParamShards> sharded;  // --zero 1
    std::vector<Tensor> buffers;
    std::vector<TensorSpec> specs;                         // the parameters' (their gradients')
    float loss = std::numeric_limits<float>::quiet_NaN();  // of the last step, where it ran
    std::size_t forward_bytes = 0;  // most non-pinned bytes after a forward pass
    GradientBucketStats buckets;    // summed over the steps that ran
  };

  ModelProgram(Model& model, const TrainConfig& config)
      : model_(model),
        config_(config),
        exchange_(config.device_collectives != nullptr ? make_device_exchange() : nullptr) {}

  // The parameters with their AdamW state (zero), pinned; values only where kernels run.
  std::unique_ptr<State> make_state(Runtime& rt) override {
    const bool runs = rt.options().backend != Backend::kSimulated;
    auto w = std::make_unique<Weights>();
    for (const HostTensor& h : model_.init_params(config_.seed())) {
      w->specs.push_back(h.spec);
      if (config_.zero == 1) {
        w->params.emplace_back();
        w->sharded.push_back(ParamShards::make(rt, h.spec, runs ? h.data.data() : nullptr,
                                               config_.rank(), config_.ranks()));
        continue;
      }
      const std::vector<float> zero(runs ? static_cast<std::size_t>(h.spec.numel()) : 0, 0.0f);
      const float* z = runs ? zero.data() : nullptr;
      w->params.push_back({rt.constant(h.spec, runs ? h.data.data() : nullptr),
                           rt.constant(h.spec, z), rt.constant(h.spec, z)});
    }
    for (const HostTensor& h : model_.init_buffers())
      w->buffers.push_back(rt.constant(h.spec, runs ? h.data.data() : nullptr));
    return w;
  }

  // Forward, backward, AdamW; with shards (TrainConfig::micro_batches, ranks), the forward
  // and backward passes of each micro-batch, the gradients summed in shard order (over the
  // ranks in buckets, beside the last micro-batch's backward pass), then AdamW.
  void run_step(Runtime& rt, State& state, int step) override {
    auto& w = static_cast<Weights&>(state);
    // A step that failed may have left its joined chunks behind: a rerun makes them anew.
    for (std::size_t i = 0; i < w.sharded.size(); ++i) w.params[i].value = Tensor();
    if (config_.shards() == 1) {
      join_chunks(rt, w);
      std::vector<Tensor> grads(w.specs.size());
      backward(rt, w, step, {}, &w.loss, [&](std::size_t i, Tensor g) { grads[i] = std::move(g); });
      RankStep alone(rt, nullptr);
      update(rt, alone, w, grads, step);
      return;
    }
    RankStep ranks(rt, config_.collectives);
    GradientBuckets buckets(
        rt, ranks, w.specs,
        {.bucket_bytes = config_.bucket_bytes,
         .scale = 1.0f / static_cast<float>(config_.shards()),
         .device = config_.device_collectives,
         .exchange = exchange_,
         .on_host = config_.backend() == Backend::kCuda && config_.device_collectives == nullptr});
    float loss_sum = 0;
    ranks.run([&] {
      join_chunks(rt, w);
      micro_batches(rt, w, step, loss_sum, buckets);
    });
    std::vector<Tensor> sum = buckets.finish();
    ranks.agree();  // every rank has every gradient, or every rank throws
    w.loss = mean_loss(rt, loss_sum);
    update(rt, ranks, w, sum, step);
    ranks.agree();
    const GradientBucketStats s = buckets.stats();
    w.buckets = {.buckets = s.buckets,
                 .bytes = s.bytes,
                 .exchange_seconds = w.buckets.exchange_seconds + s.exchange_seconds,
                 .wait_seconds = w.buckets.wait_seconds + s.wait_seconds};
  }

  // --zero 1: the parameters the step reads, joined from their chunks.
  static void join_chunks(Runtime& rt, Weights& w) {
    for (std::size_t i = 0; i < w.sharded.size(); ++i) w.params[i].value = w.sharded[i].whole(rt);
  }

  // This rank's micro-batches, one after the other: their gradients summed in order, the
  // last micro-batch's sums into `buckets` as its backward pass makes them; their losses
  // into `loss_sum`.
  void micro_batches(Runtime& rt, Weights& w, int step, float& loss_sum, GradientBuckets& buckets) {
    std::vector<Tensor> sum(w.specs.size());
    for (int j = 0; j < config_.micro_batches; ++j) {
      float loss = std::numeric_limits<float>::quiet_NaN();
      const Shard shard{.index = config_.rank() * config_.micro_batches + j,
                        .count = config_.shards()};
      const bool last = j + 1 == config_.micro_batches;
      backward(rt, w, step, shard, &loss, [&](std::size_t i, Tensor g) {
        if (sum[i].defined()) g = ops::add(rt, sum[i], g);
        sum[i] = Tensor();  // gone before the next sum is made
        if (last)
          buckets.add(i, std::move(g));
        else
          sum[i] = std::move(g);
      });
      loss_sum = j == 0 ? loss : loss_sum + loss;
    }
    // A parameter an earlier micro-batch reached and the last did not: its sum so far.
    for (std::size_t i = 0; i < sum.size(); ++i)
      if (sum[i].defined()) buckets.add(i, std::move(sum[i]));
  }

  // The mean of the shards' losses where kernels ran (the ranks' sums summed), else NaN.
  float mean_loss(Runtime& rt, float loss_sum) {
    if (rt.options().backend == Backend::kSimulated) return std::numeric_limits<float>::quiet_NaN();
    float total = loss_sum;
    if (config_.ranks() > 1) {
      if (absl::Status st = config_.collectives->all_reduce_sum({&total, 1}); !st.ok())
        throw std::runtime_error(std::string(st.message()));
    }
    return total / static_cast<float>(config_.shards());
  }

  // The forward and backward passes of `shard` (the whole batch where it is the only one):
  // each parameter's gradient to `on_grad` (its index, the gradient) as soon as it is final
  // (Note [Gradients ready early] in kernels/autograd.cc; never where none reached it); the
  // loss into `loss`.
  void backward(Runtime& rt, Weights& w, int step, Shard shard, float* loss,
                const std::function<void(std::size_t, Tensor)>& on_grad) {
    if (shard.count > 1) rt.set_rng_counter(shard_rng_counter(step, shard));
    ad::Tape tape(rt);
    std::vector<ad::Var> vars;
    std::vector<std::size_t> param_of_node;
    for (const Param& p : w.params) {
      vars.push_back(tape.leaf(p.value));
      param_of_node.resize(static_cast<std::size_t>(vars.back().node) + 1);
      param_of_node.back() = vars.size() - 1;
    }
    ad::Var l = shard.count == 1
                    ? model_.loss(tape, vars, w.buffers, step, config_.seed())
                    : model_.shard_loss(tape, vars, w.buffers, step, config_.seed(), shard);
    const RuntimeStats s = rt.stats();
    w.forward_bytes = std::max(w.forward_bytes, s.resident_bytes - s.pinned_bytes);
    rt.mark_backward();
    tape.backward(l, [&](int node, Tensor g) {
      on_grad(param_of_node[static_cast<std::size_t>(node)], std::move(g));
    });
    read_back(rt, l.value, loss);
    l = ad::Var();
    // The joined chunks go before an update writes a chunk: held, they would be frozen.
    for (std::size_t i = 0; i < w.sharded.size(); ++i) w.params[i].value = Tensor();
  }

  // Where a shard's random numbers start (Runtime::set_rng_counter): 2^36 counters for each
  // shard of each step, far more than a step's dropout masks take.
  static std::uint64_t shard_rng_counter(int step, Shard shard) {
    const auto index = static_cast<std::uint64_t>(step) * static_cast<std::uint64_t>(shard.count) +
                       static_cast<std::uint64_t>(shard.index);
    return (index + 1) << 36;
  }

  // AdamW on every parameter a gradient reached (with --zero 1, on this rank's chunks, then
  // the chunks gathered).
  void update(Runtime& rt, RankStep& ranks, Weights& w, const std::vector<Tensor>& grads,
              int step) {
    for (std::size_t i = 0; i < w.params.size(); ++i) {
      if (!grads[i].defined()) continue;
      if (i < w.sharded.size()) {
        w.sharded[i].update(rt, ranks, grads[i], config_.adamw, step + 1);
      } else {
        ranks.run([&] {
          ops::adamw(rt, w.params[i].value, w.params[i].m, w.params[i].v, grads[i], config_.adamw,
                     step + 1);
        });
      }
    }
  }

  PlanCache::Key shape_key(int step) const override {
    return model_.shape_key(step, config_.seed());
  }
  std::string name() const override { return model_.name(); }

 private:
  Model& model_;
  const TrainConfig& config_;
  std::shared_ptr<DeviceExchange> exchange_;  // NCCL's buckets' stream and buffers, kept
};

// The steps of `config` on `driver`, into `result`.
void run_steps(StepDriver& driver, Model& model, const TrainConfig& config, TrainResult& result) {
  auto& w = static_cast<ModelProgram::Weights&>(driver.state());
  for (int step = 0; step < config.steps; ++step) {
    w.loss = std::numeric_limits<float>::quiet_NaN();
    const StepReport& r = driver.run(step, step == config.record_step);
    if (r.recorded) result.recorded = r.recorded;
    result.step_overheads.push_back(r.overhead());
    result.step_transfer_exposed.push_back(r.base_cost > 0 ? r.transfer_exposed / r.base_cost
                                                           : 0.0);
    if (step == 0) {
      const MemoryStats m = driver.runtime().memory().stats();
      result.first_step_segment_reserves = m.segment_reserves;
      result.first_step_segment_releases = m.segment_releases;
    }
    result.losses.push_back(w.loss);
    result.step_seconds.push_back(r.seconds);
    result.items += model.items(step, config.seed());
    if (config.progress) {
      std::fprintf(stderr, "\r%s step %d/%d loss %.4f evictions %zu", model.name().c_str(),
                   step + 1, config.steps, static_cast<double>(w.loss),
                   driver.runtime().stats().evictions);
      std::fflush(stderr);
    }
  }
  if (config.progress) std::fprintf(stderr, "\n");
  if (config.backend() == Backend::kSimulated) return;
  for (const ParamShards& p : w.sharded) result.final_state.push_back(p.read(driver.runtime()));
  std::vector<Tensor> state;
  for (const Param& p : w.params)
    if (p.value.defined()) state.push_back(p.value);
  state.insert(state.end(), w.buffers.begin(), w.buffers.end());
  for (const Tensor& t : state) {
    result.final_state.emplace_back(static_cast<std::size_t>(t.spec().numel()));
    driver.runtime().read(t, result.final_state.back().data());
  }
}

// The driver and the program's state in it; with ranks, each learns whether every rank's
// state fit before any step waits on the others (Note [Ranks that agree]).
void make_driver(ModelProgram& program, const TrainConfig& config,
                 std::optional<StepDriver>& driver) {
  std::exception_ptr failure;
  try {
    driver.emplace(program, config.driver);
  } catch (...) {
    failure = std::current_exception();
  }
  if (config.ranks() > 1 && config.backend() != Backend::kSimulated)
    agree_on_step(*config.collectives, failure);
  else if (failure)
    std::rethrow_exception(failure);
}

}  // namespace

absl::Status Model::check_shards(int count) const {
  if (count == 1) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(name(), " does not split its batch into shards (data parallel, micro-batches)"));
}

ad::Var Model::shard_loss(ad::Tape& tape, const std::vector<ad::Var>& params,
                          const std::vector<Tensor>& buffers, int step, std::uint64_t seed,
                          Shard shard) {
  if (absl::Status st = check_shards(shard.count); !st.ok())
    throw std::invalid_argument(std::string(st.message()));
  return loss(tape, params, buffers, step, seed);
}

StepDriverOptions trainer_driver_options() {
  StepDriverOptions o;
  o.runtime.seed = 1;
  o.policy = "dtr";
  o.planners = StepPlanOptions().planners;
  // Programs that train() a model compare reports across runs: planning stays in the step
  // (the command line plans beside the steps, the driver's default).
  o.plan_in_background = false;
  return o;
}

TrainResult train(Model& model, const TrainConfig& config) {
  TrainResult result;
  result.budget = config.budget();
  const auto start = std::chrono::steady_clock::now();
  ModelProgram program(model, config);
  // Outside the try: an out-of-memory or thrashing run still reports what it did so far.
  std::optional<StepDriver> driver;
  try {
    make_driver(program, config, driver);
    result.param_bytes = driver->runtime().stats().pinned_bytes;
    const auto& w = static_cast<ModelProgram::Weights&>(driver->state());
    for (const ParamShards& p : w.sharded) result.optimizer_state_bytes += p.state_bytes();
    for (const Param& p : w.params)
      if (p.m.defined()) result.optimizer_state_bytes += p.m.bytes() + p.v.bytes();
    run_steps(*driver, model, config, result);
  } catch (const OutOfMemoryError& e) {
    result.status = "oom";
    result.error = e.what();
  } catch (const ThrashError& e) {
    result.status = "thrash";
    result.error = e.what();
  } catch (const std::exception& e) {
    result.status = "error";
    result.error = e.what();
  }
  if (driver.has_value()) {
    result.stats = driver->runtime().stats();
    result.totals = driver->totals();
    result.shape_plans = driver->shapes();
    const auto& w = static_cast<ModelProgram::Weights&>(driver->state());
    result.forward_activation_bytes = w.forward_bytes;
    result.buckets = w.buckets;
  }
  result.peak_reserved = result.stats.memory.peak_reserved;
  result.peak_allocated = result.stats.memory.peak_allocated;
  result.wall_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

std::size_t fraction_budget(double fraction, const TrainResult& baseline) {
  // The backend's fixed reservation (cuBLAS's workspace on CUDA: 32 MiB, more than a small
  // model's tensors) is held whatever the budget, so the fraction scales the rest.
  const std::size_t fixed = std::min(baseline.stats.cuda.workspace_bytes, baseline.peak_reserved);
  return fixed +
         static_cast<std::size_t>(fraction * static_cast<double>(baseline.peak_reserved - fixed));
}

Comparison train_with_baseline(Model& model, const TrainConfig& config) {
  Comparison c;
  if (!config.baseline) {
    if (config.budget_fraction > 0) {
      c.run.status = "error";
      c.run.error = "--budget-fraction needs the baseline run (give --budget BYTES instead)";
      return c;
    }
    c.run = train(model, config);
    return c;
  }
  TrainConfig base = config;
  base.driver.runtime.budget = SIZE_MAX;
  base.progress = false;
  c.baseline = train(model, base);
  if (config.budget_fraction <= 0 && config.budget() == SIZE_MAX) {
    c.run = c.baseline;
    return c;
  }
  TrainConfig run = config;
  if (config.budget_fraction > 0) {
    run.driver.runtime.budget = fraction_budget(config.budget_fraction, c.baseline);
  }
  c.run = train(model, run);
  // What no rematerialization can free: say so when the budget leaves the step little else.
  if (c.run.status == "oom" && c.baseline.param_bytes > 0) {
    const double share = static_cast<double>(c.baseline.param_bytes) /
                         static_cast<double>(std::max<std::size_t>(run.budget(), 1));
    c.run.error += absl::StrFormat(
        "; the parameters, optimizer state and buffers alone take %zu bytes (%.0f%% of the "
        "budget), pinned for the whole run",
        c.baseline.param_bytes, 100 * share);
  }
  return c;
}

namespace {

struct TrainFlags {
  cli::DriverFlags driver;
  std::string baseline = "yes";
  bool json = false;
  bool data_parallel = false;
  std::string zero = "0";
  std::vector<std::string> rank_budgets;
};

void add_train_flags(cli::FlagSet& flags, TrainConfig& config, TrainFlags& f) {
  cli::add_driver_flags(flags, config.driver, f.driver,
                        "the unconstrained run's peak reserved bytes (measured first, in the "
                        "same process) beyond the backend's fixed reservation (cuBLAS's workspace "
                        "on cuda), which the budget holds beside");
  flags.add_choice("baseline", &f.baseline, {"yes", "no"},
                   "run the unconstrained baseline first (a budget fraction needs it)");
  flags.add("steps", &config.steps, "training steps", 0);
  flags.add("lr", &config.adamw.lr, "AdamW learning rate", 0.0f);
  flags.add_switch("json", &f.json, "one JSON object on stdout");
  flags.add_switch("data-parallel", &f.data_parallel,
                   "one rank of mpirun's processes: each trains on its share of every batch, "
                   "the gradients summed over the ranks in rank order");
  flags.add("micro-batches", &config.micro_batches,
            "shares of this process's part of every batch, run one after the other, their "
            "gradients summed in order (one process with 2 gets the bits 2 ranks get)",
            1);
  flags.add_list("rank-budgets", &f.rank_budgets,
                 "with --data-parallel: each rank's budget, in rank order (ranks whose devices "
                 "have different room), instead of --budget");
  flags.add_bytes("bucket-bytes", &config.bucket_bytes, "1MiB",
                  "with shards: a bucket of gradients closes at this size (with a unit: 256KiB, "
                  "4MB), and its sum over the ranks starts beside the rest of the backward pass");
  flags.add_choice("zero", &f.zero, {"0", "1"},
                   "1: AdamW's state split over the ranks (ZeRO stage 1), each rank updating "
                   "its part of every parameter and gathering the rest; 0: every rank holds all");
}

void apply_train_flags(const TrainFlags& f, TrainConfig& config) {
  cli::apply_driver_flags(f.driver, config.driver);
  if (f.driver.budget.fraction) config.budget_fraction = *f.driver.budget.fraction;
  config.baseline = f.baseline == "yes";
  config.zero = f.zero == "1" ? 1 : 0;
}

bool bitwise_equal(const TrainResult& a, const TrainResult& b) {
  if (a.losses.size() != b.losses.size() || a.final_state != b.final_state) return false;
  return std::memcmp(a.losses.data(), b.losses.data(), a.losses.size() * sizeof(float)) == 0;
}

// A 64-bit FNV-1a hash of the final parameters' and buffers' bytes: two runs that end in
// the same bits print the same hash.
std::uint64_t fnv1a(const TrainResult& r) {
  std::uint64_t h = 14695981039346656037ull;
  for (const std::vector<float>& t : r.final_state) {
    const auto* bytes = reinterpret_cast<const unsigned char*>(t.data());
    for (std::size_t i = 0; i < t.size() * sizeof(float); ++i)
      h = (h ^ bytes[i]) * 1099511628211ull;
  }
  return h;
}

void print_json(const Model& model, const TrainConfig& config, const Comparison& c, bool same) {
  const TrainResult& r = c.run;
  auto or_null = [](bool has, auto value) {
    return has ? nlohmann::json(value) : nlohmann::json();
  };
  nlohmann::json j;
  j["example"] = model.name();
  j["backend"] = std::string(cli::backend_name(config.backend()));
  const std::string& policy = config.driver.policy;
  j["policy"] = policy;
  j["steps"] = config.steps;
  j["seed"] = config.seed();
  j["costs"] = config.driver.runtime.measure_costs ? "measured" : "estimated";
  j["status"] = r.status;
  if (!r.error.empty()) j["error"] = r.error;
  nlohmann::json losses = nlohmann::json::array();
  for (float l : r.losses) losses.push_back(or_null(!std::isnan(l), l));
  j["losses"] = losses;
  j["budget_bytes"] = or_null(r.budget != SIZE_MAX, r.budget);
  j["peak_reserved_bytes"] = r.peak_reserved;
  j["peak_allocated_bytes"] = r.peak_allocated;
  j["baseline_peak_bytes"] = or_null(config.baseline, c.baseline.peak_reserved);
  j["param_and_state_bytes"] = r.param_bytes;
  j["optimizer_state_bytes"] = r.optimizer_state_bytes;
  j["forward_activation_bytes"] = r.forward_activation_bytes;
  report::add_runtime_stats(j, r.stats, config.backend() == Backend::kCuda);
  j["first_step_segment_reserves"] = r.first_step_segment_reserves;
  j["first_step_segment_releases"] = r.first_step_segment_releases;
  j["wall_seconds"] = r.wall_seconds;
  j["step_seconds"] = r.step_seconds;
  j["step_overheads"] = r.step_overheads;
  j["step_transfer_exposed"] = r.step_transfer_exposed;
  j["baseline_wall_seconds"] = or_null(config.baseline, c.baseline.wall_seconds);
  j["items"] = r.items;
  if (policy == "auto" || policy == "hinted") j["plans_made"] = r.totals.plans_made;
  if (policy == "auto") {
    j["planned_steps"] = r.totals.planned_steps;
    j["forgotten_shapes"] = r.totals.forgotten_shapes;  // past --max-shapes
    j["shape_plans"] = report::shape_reports_json(r.shape_plans);
  }
  if (policy == "hinted") {
    j["exact_plan_steps"] = r.totals.exact_plan_steps;
    j["reused_plan_steps"] = r.totals.reused_plan_steps;
    j["plan_source"] = r.totals.first_plan_source;
  }
  j["losses_match_baseline"] = or_null(config.baseline, same);
  if (config.shards() > 1) {
    j["rank"] = config.rank();
    j["ranks"] = config.ranks();
    j["micro_batches"] = config.micro_batches;
    j["zero"] = config.zero;
    j["gradient_buckets"] = r.buckets.buckets;
    j["gradient_bucket_bytes"] = r.buckets.bytes;
    // Seconds the exchange thread spent summing buckets, and what the steps waited for them
    // after their backward passes: the rest ran beside the backward passes.
    j["exchange_seconds"] = r.buckets.exchange_seconds;
    j["exchange_wait_seconds"] = r.buckets.wait_seconds;
  }
  if (!r.final_state.empty()) j["final_state_fnv1a"] = absl::StrFormat("%016x", fnv1a(r));
  std::cout << j.dump() << "\n";
}

// The collectives of this process's rank: over MPI, and over NCCL for CUDA tensors.
struct RankEngines {
  std::unique_ptr<Collectives> host;  // MPI_Finalize when it goes
  std::unique_ptr<DeviceCollectives> device;
};

// --data-parallel on the CUDA backend, where this build has NCCL: rank r on device
// (--cuda-device + r) % devices, its gradient buckets summed by NCCL (Note [Buckets on the
// device] in driver/device_buckets.cc). Where no device is usable, nothing: run_main says so.
absl::Status set_up_nccl(TrainConfig& config, RankEngines& engines) {
#ifdef REMAT_EXAMPLES_HAVE_NCCL
  if (config.backend() != Backend::kCuda || config.ranks() < 2) return absl::OkStatus();
  std::shared_ptr<CudaApi> api = cuda_runtime_api();
  int devices = 0;
  const bool usable = api != nullptr && api->device_count(&devices).ok() && devices > 0;
  // Every rank takes NCCL or none does: one that went on alone would wait in its start.
  absl::StatusOr<std::int64_t> any_unusable = engines.host->all_max(usable ? 0 : 1);
  if (!any_unusable.ok()) return any_unusable.status();
  if (*any_unusable != 0) return absl::OkStatus();
  int& device = config.driver.runtime.cuda.device;
  device = (device + config.rank()) % devices;
  absl::StatusOr<std::unique_ptr<DeviceCollectives>> d = nccl_collectives(*engines.host, device);
  if (!d.ok()) return d.status();
  engines.device = *std::move(d);
  config.device_collectives = engines.device.get();
#else
  (void)config;
  (void)engines;
#endif
  return absl::OkStatus();
}

// --data-parallel: this process as one rank of mpirun's (MPI), into `config`, with its budget
// from --rank-budgets where given; then the model's check of the shard count. Ranks plan inside the
// step, so that they follow the same plan from the same step (with estimated costs, each makes the
// same one).
absl::Status set_up_shards(const Model& model, bool data_parallel,
                           const std::vector<std::string>& rank_budgets, TrainConfig& config,
                           RankEngines& engines) {
  if (data_parallel) {
#ifdef REMAT_EXAMPLES_HAVE_MPI
    absl::StatusOr<std::unique_ptr<Collectives>> c = mpi_collectives(nullptr, nullptr);
    if (!c.ok()) return c.status();
    engines.host = *std::move(c);
#else
    return absl::FailedPreconditionError(
        "--data-parallel needs MPI, and this build has none (tools/setup.sh installs OpenMPI; "
        "configure again)");
#endif
    config.collectives = engines.host.get();
    config.driver.collectives = engines.host.get();
    config.driver.plan_in_background = false;
    if (absl::Status st = set_up_nccl(config, engines); !st.ok()) return st;
  }
  if (!rank_budgets.empty()) {
    if (config.budget_fraction > 0)
      return absl::InvalidArgumentError("--rank-budgets and --budget-fraction: give one");
    if (rank_budgets.size() != static_cast<std::size_t>(config.ranks()))
      return absl::InvalidArgumentError(absl::StrCat("--rank-budgets names ", rank_budgets.size(),
                                                     " budgets for ", config.ranks(), " ranks"));
    // Every rank reads every entry, so that all refuse the same list.
    for (std::size_t r = 0; r < rank_budgets.size(); ++r) {
      absl::StatusOr<std::uint64_t> b = parse_byte_size(rank_budgets[r]);
      if (!b.ok())
        return absl::InvalidArgumentError(absl::StrCat("--rank-budgets: ", b.status().message()));
      if (static_cast<int>(r) == config.rank()) config.driver.runtime.budget = *b;
    }
  }
  return model.check_shards(config.shards());
}

}  // namespace

int run_main(int argc, char** argv, Model& model) {
  TrainConfig config;
  config.driver.policy = "auto";  // the command line's default: the driver's own
  config.driver.planners = StepDriverOptions().planners;
  TrainFlags tf;
  cli::FlagSet flags(model.name(), "[flags]",
                     "Trains the example through remat: unconstrained first, then under the "
                     "budget, and reports both (the losses match bit for bit).\nExit status: "
                     "0 the run fit its budget, 1 out of memory or thrashing, 2 a bad flag.");
  add_train_flags(flags, config, tf);
  model.add_flags(flags);
  if (std::optional<int> code = flags.parse(argc, const_cast<const char* const*>(argv)))
    return *code;
  apply_train_flags(tf, config);
  if (absl::Status st = model.check_flags(); !st.ok()) {
    std::cerr << model.name() << ": " << st.message() << "\n";
    return cli::kExitError;
  }
  RankEngines engines;
  if (absl::Status st = set_up_shards(model, tf.data_parallel, tf.rank_budgets, config, engines);
      !st.ok()) {
    std::cerr << model.name() << ": " << st.message() << "\n";
    return cli::kExitError;
  }
  if (config.budget_fraction > 0 && !config.baseline) {
    std::cerr << model.name() << ": --budget-fraction needs the baseline run (--baseline yes)\n";
    return cli::kExitError;
  }
  const bool no_device = config.backend() == Backend::kCuda && !cuda_device_available();
  if (no_device) {
    std::cerr << model.name() << ": --backend cuda needs a CUDA device, and none is usable: "
              << cuda_unavailable_reason() << "\n";
  }
  // Ranks stop together: one that returned here would leave the others waiting for it.
  absl::StatusOr<std::int64_t> any = config.collectives != nullptr
                                         ? config.collectives->all_max(no_device ? 1 : 0)
                                         : absl::StatusOr<std::int64_t>(no_device ? 1 : 0);
  if (!any.ok() || *any != 0) {
    if (!no_device) std::cerr << model.name() << ": another rank has no usable CUDA device\n";
    return cli::kExitError;
  }
  config.progress = !tf.json && isatty(STDERR_FILENO);
  const Comparison c = train_with_baseline(model, config);
  const TrainResult& r = c.run;
  const bool same = config.baseline && bitwise_equal(r, c.baseline);
  if (tf.json) {
    print_json(model, config, c, same);
  } else {
    std::printf("%s: status %s, %zu steps, final loss %.6f\n", model.name().c_str(),
                r.status.c_str(), r.losses.size(),
                r.losses.empty() ? 0.0 : static_cast<double>(r.losses.back()));
    std::printf(
        "  budget %s; unconstrained peak reserved %s, wall %.2f s (unconstrained %.2f s)\n  %s\n",
        r.budget == SIZE_MAX ? "none" : format_byte_size(r.budget).c_str(),
        format_byte_size(c.baseline.peak_reserved).c_str(), r.wall_seconds, c.baseline.wall_seconds,
        r.stats.summary().c_str());
    const char* match = same ? "yes" : r.status == "ok" ? "no" : "no (the run stopped early)";
    if (config.baseline)
      std::printf("  losses and parameters match the unconstrained run bit for bit: %s\n", match);
    if (!r.error.empty()) std::printf("  %s\n", r.error.c_str());
  }
  return r.status == "ok" ? cli::kExitOk : cli::kExitInfeasible;
}

}  // namespace remat::examples
