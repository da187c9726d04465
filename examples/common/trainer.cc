#include "examples/common/trainer.h"

#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <utility>

#include "examples/common/shape_plans.h"
#include "remat/cuda_api.h"
#include "remat/errors.h"
#include "remat/static_replay.h"

namespace remat::examples {
namespace {

struct Param {
  ad::Var var;  // unused outside a step
  Tensor value, m, v;
};

const char* backend_name(Backend b) {
  switch (b) {
    case Backend::kCpu:
      return "cpu";
    case Backend::kCuda:
      return "cuda";
    case Backend::kSimulated:
      return "sim";
  }
  return "?";
}

std::vector<float> read_floats(Runtime& rt, const Tensor& t) {
  std::vector<float> out(static_cast<std::size_t>(t.spec().numel()));
  rt.read(t, out.data());
  return out;
}

RuntimeOptions runtime_options(const TrainConfig& config) {
  RuntimeOptions options;
  options.backend = config.backend;
  options.budget = config.budget;
  // Policy `auto` is `hinted` whose steps get hints only once ShapePlans kept a plan.
  options.policy = config.policy == "auto" ? "hinted" : config.policy;
  options.seed = config.seed;
  options.measure_costs = config.measure_costs;
  options.clock_limit = config.clock_limit;
  options.cuda = config.cuda;
  options.allocator.expandable_segments = config.expandable_segments;
  options.compaction = config.compaction;
  return options;
}

// The parameters with their AdamW state (zero), pinned; values only where kernels run.
std::vector<Param> make_params(Runtime& rt, const Model& model, std::uint64_t seed, bool runs) {
  std::vector<Param> params;
  for (const HostTensor& h : model.init_params(seed)) {
    Param p;
    p.value = rt.constant(h.spec, runs ? h.data.data() : nullptr);
    const std::vector<float> zero(runs ? static_cast<std::size_t>(h.spec.numel()) : 0, 0.0f);
    p.m = rt.constant(h.spec, runs ? zero.data() : nullptr);
    p.v = rt.constant(h.spec, runs ? zero.data() : nullptr);
    params.push_back(std::move(p));
  }
  return params;
}

std::vector<Tensor> make_buffers(Runtime& rt, const Model& model, bool runs) {
  std::vector<Tensor> buffers;
  for (const HostTensor& h : model.init_buffers())
    buffers.push_back(rt.constant(h.spec, runs ? h.data.data() : nullptr));
  return buffers;
}

// One training step: forward, backward, AdamW. Returns what end_step() recorded; the loss
// goes to *loss where kernels run, and the bytes of non-pinned tensors after the forward
// pass raise *forward_bytes.
RecordedStep run_step(Runtime& rt, Model& model, const std::vector<Param>& params,
                      const std::vector<Tensor>& buffers, int step, const TrainConfig& config,
                      const StepOptions& options, float* loss, std::size_t* forward_bytes) {
  rt.begin_step(options);
  ad::Tape tape(rt);
  std::vector<ad::Var> vars;
  for (const Param& p : params) vars.push_back(tape.leaf(p.value));
  ad::Var l = model.loss(tape, vars, buffers, step, config.seed);
  const RuntimeStats s = rt.stats();
  *forward_bytes = std::max(*forward_bytes, s.resident_bytes - s.pinned_bytes);
  rt.mark_backward();
  tape.backward(l);
  // The simulated backend has no values to read, but makes the loss resident as the read
  // does, so that a screened or traced step makes the requests a real one makes.
  if (config.backend != Backend::kSimulated)
    rt.read(l.value, loss);
  else
    rt.materialize(l.value);
  l = ad::Var();
  for (std::size_t i = 0; i < params.size(); ++i) {
    Tensor g = tape.grad(vars[i]);
    if (g.defined())
      ops::adamw(rt, params[i].value, params[i].m, params[i].v, g, config.adamw, step + 1);
  }
  return rt.end_step();
}

// Note [Screening plans] in shape_plans.h: step `step` on a simulated runtime under the
// same budget, as the real run meets it: once under DTR, once recorded, then following
// `hints` kScreenedSteps times; the dearest of those (the recorded one where `hints` is
// null).
constexpr int kScreenedSteps = 4;

// The run `config` describes on the simulated backend, under policy `hinted`, with `budget`.
TrainConfig simulated(const TrainConfig& config, std::size_t budget) {
  TrainConfig sim = config;
  sim.backend = Backend::kSimulated;
  sim.policy = "hinted";
  sim.budget = budget;
  return sim;
}

// Step `step` on a simulated runtime without a budget, so that nothing but a plan evicts:
// a plain first step, as the real run has had, then one with `options`. Returns what the
// second recorded, and the trace of its allocations where it traced them.
std::pair<RecordedStep, AllocationTrace> run_unbudgeted(Model& model, const TrainConfig& config,
                                                        int step, const StepOptions& options) {
  const TrainConfig sim = simulated(config, SIZE_MAX);
  Runtime rt(runtime_options(sim));
  const std::vector<Param> params = make_params(rt, model, sim.seed, false);
  const std::vector<Tensor> buffers = make_buffers(rt, model, false);
  float loss = 0;
  std::size_t bytes = 0;
  run_step(rt, model, params, buffers, step, sim, {}, &loss, &bytes);
  RecordedStep recorded = run_step(rt, model, params, buffers, step, sim, options, &loss, &bytes);
  return {std::move(recorded), rt.take_allocation_trace()};
}

// Note [Placed allocations] in caching_allocator.cc: the requests of step `step` following
// `hints`, traced without a budget.
std::shared_ptr<const Placement> place_plan(Model& model, const TrainConfig& config, int step,
                                            const std::shared_ptr<const StepHints>& hints) {
  StepOptions traced;
  traced.hints = hints;
  traced.trace_allocations = true;
  return std::make_shared<const Placement>(
      place_allocations(run_unbudgeted(model, config, step, traced).second));
}

// Note [Planning a step DTR cannot run] in shape_plans.cc: step `step` recorded without a
// budget.
RecordedStep record_unbudgeted(Model& model, const TrainConfig& config, int step) {
  StepOptions record;
  record.record = true;
  record.name = absl::StrCat(model.name(), "_step", step);
  return run_unbudgeted(model, config, step, record).first;
}

std::optional<ShapePlans::StepCost> screen_step(Model& model, const TrainConfig& config, int step,
                                                StepPlan* plan, bool after_dtr) {
  const TrainConfig sim = simulated(config, config.budget);
  const std::shared_ptr<const StepHints> hints = plan != nullptr ? plan->hints : nullptr;
  std::optional<Runtime> runtime;
  // The arena the plan's first step needed, and the room it had (also where it failed).
  auto note_arena = [&] {
    const auto* caching = dynamic_cast<const CachingAllocator*>(&runtime->memory());
    if (caching == nullptr || plan == nullptr || plan->placement == nullptr) return;
    plan->arena = caching->last_placement();
  };
  int pass = hints && !after_dtr ? 2 : 0;
  try {
    if (plan != nullptr && config.placement)
      plan->placement = place_plan(model, config, step, hints);
    Runtime& rt = runtime.emplace(runtime_options(sim));
    const std::vector<Param> params = make_params(rt, model, sim.seed, false);
    const std::vector<Tensor> buffers = make_buffers(rt, model, false);
    float loss = 0;
    std::size_t bytes = 0;
    ShapePlans::StepCost worst;
    for (; pass < (hints ? 2 + kScreenedSteps : 2); ++pass) {
      StepOptions opt;
      opt.record = pass == 1;
      if (pass >= 2) {
        opt.hints = hints;
        opt.placement = plan->placement;
      }
      const RuntimeStats before = rt.stats();
      run_step(rt, model, params, buffers, step, sim, opt, &loss, &bytes);
      const RuntimeStats after = rt.stats();
      if (pass == 2) note_arena();
      const double recompute = after.recompute_cost - before.recompute_cost;
      if (pass >= (hints ? 2 : 1) && recompute >= worst.recompute)
        worst = {.base = after.base_cost - before.base_cost, .recompute = recompute};
    }
    return worst;
  } catch (const OutOfMemoryError&) {
  } catch (const ThrashError&) {
  }
  if (pass == 2 && runtime.has_value()) note_arena();
  return std::nullopt;
}

}  // namespace

TrainResult train(Model& model, const TrainConfig& config) {
  TrainResult result;
  result.budget = config.budget;
  const RuntimeOptions options = runtime_options(config);
  const bool runs = config.backend != Backend::kSimulated;
  const auto start = std::chrono::steady_clock::now();
  // Outside the try: an out-of-memory or thrashing run still reports what it did so far.
  std::optional<Runtime> runtime;
  const bool automatic = config.policy == "auto";
  int screening_step = 0;  // the step whose shape ShapePlans is planning
  ShapePlans shape_plans({.budget = config.budget,
                          .planners = config.planners,
                          .time_limit = config.plan_time_limit,
                          .screen = [&](StepPlan* plan, bool after_dtr) {
                            return screen_step(model, config, screening_step, plan, after_dtr);
                          }});
  try {
    Runtime& rt = runtime.emplace(options);
    const std::vector<Param> params = make_params(rt, model, config.seed, runs);
    const std::vector<Tensor> buffers = make_buffers(rt, model, runs);
    result.param_bytes = rt.stats().pinned_bytes;

    const bool hinted = config.policy == "hinted";
    std::shared_ptr<PlanCache> cache =
        config.plan_cache != nullptr ? config.plan_cache : std::make_shared<PlanCache>();
    for (int step = 0; step < config.steps; ++step) {
      const auto step_start = std::chrono::steady_clock::now();
      float loss_value = std::numeric_limits<float>::quiet_NaN();
      StepOptions step_options;
      step_options.name = absl::StrCat(model.name(), "_step", step);
      step_options.record = step == config.record_step;
      const PlanCache::Key key = model.shape_key(step, config.seed);
      bool plan_now = false;
      if (hinted) {
        // Note [Reusing plans across shapes] in remat/hints.h.
        PlanCache::Found found = cache->find(key, PlanCache::Reuse::kNoLarger);
        step_options.hints = found.hints;
        plan_now = found.hints == nullptr;
        step_options.record |= plan_now;
        if (found.hints != nullptr)
          ++(found.exact ? result.exact_plan_steps : result.reused_plan_steps);
      }
      if (automatic) {
        screening_step = step;
        const StepOptions planned = shape_plans.before(key);
        step_options.hints = planned.hints;
        step_options.placement = planned.placement;
        step_options.record |= planned.record;
      }
      const RuntimeStats before = rt.stats();
      {
        RecordedStep recorded;
        try {
          recorded = run_step(rt, model, params, buffers, step, config, step_options, &loss_value,
                              &result.forward_activation_bytes);
        } catch (const OutOfMemoryError&) {
          // Note [Planning a step DTR cannot run] in shape_plans.cc. A step that wrote
          // pinned memory (an optimizer's update, batch norm's running statistics) cannot run
          // again.
          if (!automatic || rt.stats().updates != before.updates || step_options.hints != nullptr ||
              !shape_plans.may_plan_after_oom(key))
            throw;
          rt.abort_step();
          const StepOptions planned =
              shape_plans.plan_after_oom(key, record_unbudgeted(model, config, step));
          if (planned.hints == nullptr) throw;
          step_options.hints = planned.hints;
          step_options.placement = planned.placement;
          recorded = run_step(rt, model, params, buffers, step, config, step_options, &loss_value,
                              &result.forward_activation_bytes);
        }
        if (plan_now) {
          StepPlan plan =
              plan_recorded_step(recorded, config.budget, config.planners, config.plan_time_limit);
          if (result.plan_source.empty()) result.plan_source = plan.hints->source;
          cache->insert(key, std::move(plan.hints));
          ++result.plans_made;
        }
        if (step == config.record_step) result.recorded = recorded;
        const RuntimeStats after = rt.stats();
        const ShapePlans::StepCost cost{.base = after.base_cost - before.base_cost,
                                        .recompute = after.recompute_cost - before.recompute_cost};
        result.step_overheads.push_back(cost.overhead());
        if (automatic) shape_plans.after(key, std::move(recorded), cost);
      }
      if (step == 0) {
        const MemoryStats m = rt.memory().stats();
        result.first_step_segment_reserves = m.segment_reserves;
        result.first_step_segment_releases = m.segment_releases;
      }
      result.losses.push_back(loss_value);
      result.step_seconds.push_back(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - step_start).count());
      result.items += model.items(step, config.seed);
      if (config.progress) {
        std::fprintf(stderr, "\r%s step %d/%d loss %.4f evictions %zu", model.name().c_str(),
                     step + 1, config.steps, static_cast<double>(loss_value), rt.stats().evictions);
        std::fflush(stderr);
      }
    }
    if (config.progress) std::fprintf(stderr, "\n");
    if (runs) {
      for (const Param& p : params) result.final_state.push_back(read_floats(rt, p.value));
      for (const Tensor& b : buffers) result.final_state.push_back(read_floats(rt, b));
    }
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
  if (automatic) {
    result.plans_made = shape_plans.plans_made();
    result.planned_steps = shape_plans.planned_steps();
    result.shape_plans = shape_plans.report();
  }
  if (runtime.has_value()) result.stats = runtime->stats();
  result.peak_reserved = result.stats.memory.peak_reserved;
  result.peak_allocated = result.stats.memory.peak_allocated;
  result.wall_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
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
  base.budget = SIZE_MAX;
  base.progress = false;
  c.baseline = train(model, base);
  if (config.budget_fraction <= 0 && config.budget == SIZE_MAX) {
    c.run = c.baseline;
    return c;
  }
  TrainConfig run = config;
  if (config.budget_fraction > 0) {
    run.budget = static_cast<std::size_t>(config.budget_fraction *
                                          static_cast<double>(c.baseline.peak_reserved));
  }
  c.run = train(model, run);
  // What no rematerialization can free: say so when the budget leaves the step little else.
  if (c.run.status == "oom" && c.baseline.param_bytes > 0) {
    const double share = static_cast<double>(c.baseline.param_bytes) /
                         static_cast<double>(std::max<std::size_t>(run.budget, 1));
    c.run.error += absl::StrFormat(
        "; the parameters, optimizer state and buffers alone take %zu bytes (%.0f%% of the "
        "budget), pinned for the whole run",
        c.baseline.param_bytes, 100 * share);
  }
  return c;
}

void add_train_flags(cli::FlagSet& flags, TrainConfig& config, TrainFlags& f) {
  flags.add_choice("backend", &f.backend, {"cpu", "cuda", "sim"}, "where the kernels run");
  flags.add_budget(&f.budget,
                   "the unconstrained run's peak reserved bytes (measured first, in the same "
                   "process)");
  flags.add_choice("baseline", &f.baseline, {"yes", "no"},
                   "run the unconstrained baseline first (a budget fraction needs it)");
  flags.add("policy", &config.policy,
            "eviction policy (remat-replay --policy list names them; hinted: plan-seeded; auto: "
            "DTR, and a static plan for shapes that repeat where it recomputes less)");
  flags.add_list("planners", &config.planners, "the planners that seed --policy hinted and auto");
  flags.add("plan-time-limit", &config.plan_time_limit,
            "seconds each planner may take on a recorded step (--policy hinted, auto)", 0.0);
  flags.add("steps", &config.steps, "training steps", 0);
  flags.add("seed", &config.seed, "seed of the parameters, the data and the dropout masks");
  flags.add("lr", &config.adamw.lr, "AdamW learning rate", 0.0f);
  flags.add_choice("costs", &f.costs, {"estimated", "measured"},
                   "op costs the eviction policy weighs: estimated from each op's declared work "
                   "(the same on every run) or measured by timing first runs (vary run to run)");
  flags.add_choice("compaction", &f.compaction, {"yes", "no"},
                   "move pinned and locked tensors together when nothing is left to evict, "
                   "before reporting out of memory");
  flags.add_choice("placement", &f.placement, {"yes", "no"},
                   "policy auto: serve a plan's steps at offsets planned from a simulated "
                   "trace of the plan, in the holes beside the parameters and one arena, "
                   "instead of by best fit");
  flags.add_switch("expandable-segments", &config.expandable_segments,
                   "one expandable arena instead of pooled segments");
  flags.add("cuda-device", &config.cuda.device, "CUDA device", 0);
  flags.add_switch("sync-after-launch", &config.cuda.sync_after_launch,
                   "synchronize after each CUDA kernel, naming the op that failed (debugging)");
  flags.add_switch("json", &f.json, "one JSON object on stdout");
}

void apply_train_flags(const TrainFlags& f, TrainConfig& config) {
  config.backend = f.backend == "cuda"  ? Backend::kCuda
                   : f.backend == "sim" ? Backend::kSimulated
                                        : Backend::kCpu;
  if (f.budget.bytes) config.budget = static_cast<std::size_t>(*f.budget.bytes);
  if (f.budget.fraction) config.budget_fraction = *f.budget.fraction;
  config.baseline = f.baseline == "yes";
  config.measure_costs = f.costs == "measured";
  config.compaction = f.compaction == "yes";
  config.placement = f.placement == "yes";
}

int run_main(int argc, char** argv, Model& model) {
  TrainConfig config;
  // The command line's defaults: policy `auto` (Note [Planning repeated shapes]) with the
  // planners that win on block-structured graphs first.
  config.policy = "auto";
  config.planners = {"rockmate", "mincut", "chen", "twremat", "rotor"};
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
  const bool json = tf.json;
  if (absl::Status st = model.check_flags(); !st.ok()) {
    std::cerr << model.name() << ": " << st.message() << "\n";
    return cli::kExitError;
  }
  if (config.budget_fraction > 0 && !config.baseline) {
    std::cerr << model.name() << ": --budget-fraction needs the baseline run (--baseline yes)\n";
    return cli::kExitError;
  }
  if (config.backend == Backend::kCuda && !cuda_device_available()) {
    std::cerr << model.name() << ": --backend cuda needs a CUDA device, and none is usable\n";
    return cli::kExitError;
  }
  config.progress = !json && isatty(STDERR_FILENO);
  Comparison c = train_with_baseline(model, config);
  const TrainResult& r = c.run;
  if (json) {
    nlohmann::json j;
    j["example"] = model.name();
    j["backend"] = backend_name(config.backend);
    j["policy"] = config.policy;
    j["steps"] = config.steps;
    j["seed"] = config.seed;
    j["costs"] = config.measure_costs ? "measured" : "estimated";
    j["status"] = r.status;
    if (!r.error.empty()) j["error"] = r.error;
    nlohmann::json losses = nlohmann::json::array();
    for (float l : r.losses) losses.push_back(std::isnan(l) ? nlohmann::json() : nlohmann::json(l));
    j["losses"] = losses;
    j["budget_bytes"] = r.budget == SIZE_MAX ? nlohmann::json() : nlohmann::json(r.budget);
    j["peak_reserved_bytes"] = r.peak_reserved;
    j["peak_allocated_bytes"] = r.peak_allocated;
    j["baseline_peak_bytes"] =
        config.baseline ? nlohmann::json(c.baseline.peak_reserved) : nlohmann::json();
    j["param_and_state_bytes"] = r.param_bytes;
    j["forward_activation_bytes"] = r.forward_activation_bytes;
    j["compute_overhead"] = r.stats.compute_overhead();
    j["evictions"] = r.stats.evictions;
    j["deferred_frees"] = r.stats.memory.deferred_frees;
    j["compactions"] = r.stats.compactions;
    j["compaction_bytes"] = r.stats.compaction_bytes;
    j["packed_storages"] = r.stats.packed_storages;
    j["placed_allocations"] = r.stats.memory.placed_allocations;
    j["placement_misses"] = r.stats.memory.placement_misses;
    if (config.backend == Backend::kCuda) {
      j["cuda_device_total_bytes"] = r.stats.cuda.device_total_bytes;
      j["cuda_outside_budget_bytes"] = r.stats.cuda.outside_bytes;
      j["cuda_workspace_bytes"] = r.stats.cuda.workspace_bytes;
    }
    j["segment_reserves"] = r.stats.memory.segment_reserves;
    j["segment_releases"] = r.stats.memory.segment_releases;
    j["first_step_segment_reserves"] = r.first_step_segment_reserves;
    j["first_step_segment_releases"] = r.first_step_segment_releases;
    j["recomputations"] = r.stats.recomputations;
    j["search_seconds"] = r.stats.search_seconds;
    j["wall_seconds"] = r.wall_seconds;
    j["step_seconds"] = r.step_seconds;
    j["step_overheads"] = r.step_overheads;
    j["baseline_wall_seconds"] =
        config.baseline ? nlohmann::json(c.baseline.wall_seconds) : nlohmann::json();
    j["items"] = r.items;
    if (config.policy == "auto" || config.policy == "hinted") {
      j["plans_made"] = r.plans_made;
      j["hint_evictions"] = r.stats.hint_evictions;
      j["hint_mismatches"] = r.stats.hint_mismatches;
    }
    if (config.policy == "auto") {
      j["planned_steps"] = r.planned_steps;
      j["shape_plans"] = r.shape_plans;
    }
    if (config.policy == "hinted") {
      j["exact_plan_steps"] = r.exact_plan_steps;
      j["reused_plan_steps"] = r.reused_plan_steps;
      j["plan_source"] = r.plan_source;
      j["hint_evictions"] = r.stats.hint_evictions;
      j["hint_mismatches"] = r.stats.hint_mismatches;
    }
    bool same = r.losses.size() == c.baseline.losses.size();
    for (std::size_t i = 0; same && i < r.losses.size(); ++i)
      same = std::memcmp(&r.losses[i], &c.baseline.losses[i], sizeof(float)) == 0;
    j["losses_match_baseline"] =
        config.baseline ? nlohmann::json(same && r.final_state == c.baseline.final_state)
                        : nlohmann::json();
    std::cout << j.dump() << "\n";
  } else {
    std::printf("%s: status %s, %zu steps, final loss %.6f\n", model.name().c_str(),
                r.status.c_str(), r.losses.size(),
                r.losses.empty() ? 0.0 : static_cast<double>(r.losses.back()));
    std::printf("  peak reserved %.2f MiB (unconstrained %.2f MiB), budget %s\n",
                r.peak_reserved / 1048576.0, c.baseline.peak_reserved / 1048576.0,
                r.budget == SIZE_MAX ? "none" : absl::StrCat(r.budget, " B").c_str());
    std::printf(
        "  evictions %zu, recomputations %zu, compute overhead %.4f, wall %.2f s "
        "(unconstrained %.2f s)\n",
        r.stats.evictions, r.stats.recomputations, r.stats.compute_overhead(), r.wall_seconds,
        c.baseline.wall_seconds);
    if (!r.error.empty()) std::printf("  %s\n", r.error.c_str());
  }
  return r.status == "ok" ? cli::kExitOk : cli::kExitInfeasible;
}

}  // namespace remat::examples
