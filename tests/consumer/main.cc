// A training loop of its own, built against the *installed* package: a stack of residual
// GELU blocks whose batch alternates between two sizes, trained through the step driver
// (remat/step_driver.h) under 0.42 of its unconstrained peak (or the fraction given as its
// argument). It prints, and checks, that DTR alone recomputes at that budget, that policy
// `auto` followed plans there ("planned_steps N"), and that the losses are those of the
// unconstrained run bit for bit ("bitwise yes"). Also the planner called directly on a
// graph. Exits 0 when all hold.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/autograd.h"
#include "kernels/ops.h"
#include "remat/errors.h"
#include "remat/planner.h"
#include "remat/step_driver.h"

namespace {

// Enough for both shapes' plans, made beside the steps, to reach their trials without the
// loop asking (StepDriverOptions::plan_within_steps).
constexpr int kSteps = 12;
constexpr std::int64_t kWidth = 96, kHidden = 384, kBlocks = 3;

class ResidualGelu final : public remat::TrainingProgram {
 public:
  struct Params : State {
    std::vector<remat::Tensor> w, m, v;
    std::vector<float> losses;
  };

  std::unique_ptr<State> make_state(remat::Runtime& rt) override {
    const bool runs = rt.options().backend != remat::Backend::kSimulated;
    auto p = std::make_unique<Params>();
    std::mt19937 rng(5);
    std::normal_distribution<float> normal(0.0f, 0.05f);
    auto param = [&](std::vector<std::int64_t> shape, bool random) {
      const remat::TensorSpec spec{std::move(shape)};
      std::vector<float> values(static_cast<std::size_t>(spec.numel()), 0.0f);
      if (random)
        for (float& x : values) x = normal(rng);
      const std::vector<float> zero(values.size(), 0.0f);
      p->w.push_back(rt.constant(spec, runs ? values.data() : nullptr));
      p->m.push_back(rt.constant(spec, runs ? zero.data() : nullptr));
      p->v.push_back(rt.constant(spec, runs ? zero.data() : nullptr));
    };
    for (std::int64_t b = 0; b < kBlocks; ++b) {
      param({kHidden, kWidth}, true);
      param({kHidden}, false);
      param({kWidth, kHidden}, true);
      param({kWidth}, false);
    }
    param({2, kWidth}, true);
    param({2}, false);
    return p;
  }

  void run_step(remat::Runtime& rt, State& state, int step) override {
    namespace ad = remat::ad;
    auto& p = static_cast<Params&>(state);
    const std::int64_t rows = batch(step);
    std::mt19937 rng(static_cast<unsigned>(step) * 7919u + 1u);
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    std::vector<float> x(static_cast<std::size_t>(rows * kWidth));
    for (float& e : x) e = uniform(rng);
    std::vector<std::int32_t> y(static_cast<std::size_t>(rows));
    for (std::size_t r = 0; r < y.size(); ++r) y[r] = x[r * kWidth] * x[r * kWidth + 1] > 0;
    const bool runs = rt.options().backend != remat::Backend::kSimulated;
    ad::Tape tape(rt);
    std::vector<ad::Var> w;
    for (const remat::Tensor& t : p.w) w.push_back(tape.leaf(t));
    ad::Var h = tape.input(rt.constant({{rows, kWidth}}, runs ? x.data() : nullptr));
    for (std::size_t b = 0; b < kBlocks; ++b) {
      ad::Var u = ad::gelu(tape, ad::linear(tape, h, w[4 * b], w[4 * b + 1]));
      h = ad::add(tape, h, ad::linear(tape, u, w[4 * b + 2], w[4 * b + 3]));
    }
    const remat::Tensor labels =
        rt.constant({{rows}, remat::DType::kI32}, runs ? y.data() : nullptr);
    ad::Var loss =
        ad::cross_entropy_mean(tape, ad::linear(tape, h, w[4 * kBlocks], w.back()), labels);
    h = ad::Var();
    rt.mark_backward();
    tape.backward(loss);
    float value = NAN;
    if (remat::read_back(rt, loss.value, &value)) p.losses.push_back(value);
    loss = ad::Var();
    for (std::size_t i = 0; i < p.w.size(); ++i)
      remat::ops::adamw(rt, p.w[i], p.m[i], p.v[i], tape.grad(w[i]), {.lr = 3e-3f}, step + 1);
  }

  remat::PlanCache::Key shape_key(int step) const override { return {batch(step)}; }
  std::string name() const override { return "residual_gelu"; }
  static std::int64_t batch(int step) { return step % 2 == 0 ? 1024 : 768; }
};

struct Run {
  std::vector<float> losses;
  double recomputed = 0;  // summed over steps, in step costs
  std::size_t planned_steps = 0, peak = 0;
  std::string summary;
};

Run train(std::size_t budget, const std::string& policy) {
  ResidualGelu program;
  remat::StepDriverOptions options;
  options.runtime.budget = budget;
  options.policy = policy;
  remat::StepDriver driver(program, options);
  Run run;
  for (int step = 0; step < kSteps; ++step) run.recomputed += driver.run(step).overhead();
  run.losses = static_cast<ResidualGelu::Params&>(driver.state()).losses;
  run.planned_steps = driver.totals().planned_steps;
  run.peak = driver.runtime().stats().memory.peak_reserved;
  run.summary = driver.runtime().stats().summary();
  return run;
}

bool planner_works() {
  absl::StatusOr<remat::Graph> parsed = remat::parse_graph(R"({"format": "remat-graph-v1",
      "name": "chain", "outputs": [3], "nodes": [
        {"id": 0, "name": "x", "kind": "input", "phase": "forward", "bytes": 100, "cost": 0,
         "inputs": []},
        {"id": 1, "name": "y", "kind": "compute", "phase": "forward", "bytes": 100, "cost": 1,
         "inputs": [0]},
        {"id": 2, "name": "z", "kind": "compute", "phase": "forward", "bytes": 100, "cost": 1,
         "inputs": [1]},
        {"id": 3, "name": "dy", "kind": "compute", "phase": "backward", "bytes": 100,
         "cost": 1, "inputs": [1, 2]}]})");
  if (!parsed.ok()) return false;
  absl::StatusOr<remat::Plan> plan = remat::run_planner("chen", *parsed, remat::PlanOptions());
  return plan.ok() && plan->feasible;
}

}  // namespace

int main(int argc, char** argv) {
  const double fraction = argc > 1 ? std::atof(argv[1]) : 0.42;
  ResidualGelu program;
  const std::size_t peak = remat::measure_unconstrained_peak(program, {}, kSteps);
  const auto budget = static_cast<std::size_t>(fraction * static_cast<double>(peak));
  Run free_run, dtr, automatic;
  try {
    free_run = train(SIZE_MAX, "dtr");
    dtr = train(budget, "dtr");
    automatic = train(budget, "auto");
  } catch (const remat::OutOfMemoryError& e) {
    std::printf("budget %zu B (%.2f of the unconstrained peak): %s\n", budget, fraction, e.what());
    return 1;
  }
  const bool bitwise =
      automatic.losses.size() == static_cast<std::size_t>(kSteps) &&
      automatic.losses.size() == free_run.losses.size() &&
      std::memcmp(automatic.losses.data(), free_run.losses.data(), kSteps * sizeof(float)) == 0;
  const bool planned = planner_works();
  std::printf("unconstrained peak %zu B, budget %zu B; dtr recomputed %.3f steps; auto: %s\n", peak,
              budget, dtr.recomputed, automatic.summary.c_str());
  std::printf("auto recomputed %.3f steps, planned_steps %zu, bitwise %s, planner %s\n",
              automatic.recomputed, automatic.planned_steps, bitwise ? "yes" : "no",
              planned ? "feasible" : "none");
  const bool ok = dtr.recomputed > 0 && automatic.planned_steps > 0 && bitwise &&
                  automatic.peak <= budget && planned;
  return ok ? 0 : 1;
}
