#include "tools/cli/driver_flags.h"

namespace remat::cli {

void add_driver_flags(FlagSet& flags, StepDriverOptions& options, DriverFlags& f,
                      const std::string& budget_baseline) {
  RuntimeOptions& rt = options.runtime;
  flags.add_choice("backend", &f.backend, {"cpu", "cuda", "sim"}, "where the kernels run");
  flags.add_budget(&f.budget, budget_baseline);
  flags.add("policy", &options.policy,
            "eviction policy (remat-replay --policy list names them; hinted: plan-seeded; auto: "
            "DTR, and a static plan for shapes that repeat where it recomputes less)");
  flags.add_list("planners", &options.planners, "the planners that seed --policy hinted and auto");
  flags.add("plan-time-limit", &options.plan_time_limit,
            "seconds each planner may take on a recorded step (--policy hinted, auto)", 0.0);
  flags.add("seed", &rt.seed, "seed of the parameters, the data and the dropout masks");
  flags.add_choice("costs", &f.costs, {"estimated", "measured"},
                   "op costs the eviction policy weighs: estimated from each op's declared work "
                   "(the same on every run) or measured by timing first runs (vary run to run)");
  flags.add_choice("roofline", &f.roofline, {"backend", "cpu", "gpu"},
                   "what estimated op costs are priced by: the backend's machine (cuda: an "
                   "H100's, else this CPU's), a 2-core CPU, or an H100 (--backend sim with gpu: "
                   "a GPU step simulated here)");
  flags.add_host_memory(&rt.host_link, &f.host_memory,
                        "eviction victims cheaper to move than to recompute, and constants "
                        "where nothing else makes room (none given: none)");
  flags.add_choice("compaction", &f.compaction, {"yes", "no"},
                   "move pinned and locked tensors together when nothing is left to evict, "
                   "before reporting out of memory");
  flags.add_choice("placement", &f.placement, {"yes", "no"},
                   "policy auto: serve a plan's steps at offsets planned from a simulated "
                   "trace of the plan, in the holes beside the parameters and one arena, "
                   "instead of by best fit");
  flags.add("max-shapes", &f.max_shapes,
            "policy auto: shapes remembered; past it the one seen longest ago (not being "
            "planned or tried) is forgotten, for models whose shapes never repeat");
  flags.add_choice("plan-in-background", &f.plan_in_background, {"yes", "no"},
                   "policy auto: plan repeated shapes on a thread of their own while the steps "
                   "go on under DTR, instead of inside the step that tries the plan (the "
                   "simulated backend always plans in the step)");
  flags.add_switch("expandable-segments", &rt.allocator.expandable_segments,
                   "one expandable arena instead of pooled segments");
  flags.add("cuda-device", &rt.cuda.device, "CUDA device", 0);
  flags.add_switch("sync-after-launch", &rt.cuda.sync_after_launch,
                   "synchronize after each CUDA kernel, naming the op that failed (debugging)");
}

void apply_driver_flags(const DriverFlags& f, StepDriverOptions& options) {
  RuntimeOptions& rt = options.runtime;
  rt.backend = f.backend == "cuda"  ? Backend::kCuda
               : f.backend == "sim" ? Backend::kSimulated
                                    : Backend::kCpu;
  if (f.budget.bytes) rt.budget = static_cast<std::size_t>(*f.budget.bytes);
  rt.measure_costs = f.costs == "measured";
  rt.compaction = f.compaction == "yes";
  rt.host_memory_bytes = static_cast<std::size_t>(f.host_memory);
  if (f.roofline != "backend")
    rt.roofline = f.roofline == "gpu" ? Roofline::gpu() : Roofline::cpu();
  options.placement = f.placement == "yes";
  options.plan_in_background = f.plan_in_background == "yes";
  options.max_shapes = static_cast<std::size_t>(f.max_shapes);
}

std::string_view backend_name(Backend backend) {
  switch (backend) {
    case Backend::kCpu:
      return "cpu";
    case Backend::kCuda:
      return "cuda";
    case Backend::kSimulated:
      return "sim";
  }
  return "?";
}

}  // namespace remat::cli
