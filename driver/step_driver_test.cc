// The step driver on a small training loop of its own (residual MLP blocks whose batch changes from
// step to step): every policy against the unconstrained run, bit for bit, at random budgets;
// what `auto` does per shape; the runtime usable after an out-of-memory step.
#include "remat/step_driver.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <stdexcept>
#include <vector>

#include "kernels/autograd.h"
#include "kernels/ops.h"
#include "remat/errors.h"

namespace remat {
namespace {

// A stack of pre-norm residual MLP blocks (h + W2 gelu(W1 layernorm(h))) trained with AdamW;
// step s draws its batch and inputs from s.
class ResidualMlp final : public TrainingProgram {
 public:
  struct Weights : State {
    std::vector<Tensor> params, m, v;
    std::vector<float> losses;  // of the steps run in this state, where kernels ran
  };
  static constexpr std::int64_t kWidth = 64, kHidden = 256, kBlocks = 4, kClasses = 4;

  explicit ResidualMlp(std::vector<std::int64_t> batches) : batches_(std::move(batches)) {}

  std::unique_ptr<State> make_state(Runtime& rt) override {
    const bool runs = rt.options().backend != Backend::kSimulated;
    auto w = std::make_unique<Weights>();
    std::mt19937 rng(11);
    std::normal_distribution<float> normal(0.0f, 0.1f);
    auto add = [&](const TensorSpec& spec, float fill) {
      std::vector<float> values(static_cast<std::size_t>(spec.numel()), fill);
      if (std::isnan(fill))
        for (float& x : values) x = normal(rng);
      const std::vector<float> zero(values.size(), 0.0f);
      w->params.push_back(rt.constant(spec, runs ? values.data() : nullptr));
      w->m.push_back(rt.constant(spec, runs ? zero.data() : nullptr));
      w->v.push_back(rt.constant(spec, runs ? zero.data() : nullptr));
    };
    for (std::int64_t b = 0; b < kBlocks; ++b) {
      add({{kWidth}}, 1.0f);  // layernorm
      add({{kWidth}}, 0.0f);
      add({{kHidden, kWidth}}, NAN);
      add({{kHidden}}, 0.0f);
      add({{kWidth, kHidden}}, NAN);
      add({{kWidth}}, 0.0f);
    }
    add({{kClasses, kWidth}}, NAN);
    add({{kClasses}}, 0.0f);
    return w;
  }

  void run_step(Runtime& rt, State& state, int step) override {
    auto& w = static_cast<Weights&>(state);
    const std::int64_t batch = batch_of(step);
    std::mt19937 rng(static_cast<unsigned>(1000 + step));
    std::normal_distribution<float> normal;
    std::vector<float> x(static_cast<std::size_t>(batch * kWidth));
    for (float& e : x) e = normal(rng);
    std::vector<std::int32_t> labels(static_cast<std::size_t>(batch));
    for (std::size_t i = 0; i < labels.size(); ++i) labels[i] = x[i * kWidth] > 0 ? 1 : 2;
    const bool runs = rt.options().backend != Backend::kSimulated;
    ad::Tape tape(rt);
    std::vector<ad::Var> p;
    for (const Tensor& t : w.params) p.push_back(tape.leaf(t));
    ad::Var h = tape.input(rt.constant({{batch, kWidth}}, runs ? x.data() : nullptr));
    const Tensor targets = rt.constant({{batch}, DType::kI32}, runs ? labels.data() : nullptr);
    for (std::size_t b = 0; b < kBlocks; ++b) {
      const ad::Var* q = &p[6 * b];
      ad::Var u = ad::layernorm(tape, h, q[0], q[1]);
      u = ad::gelu(tape, ad::linear(tape, u, q[2], q[3]));
      h = ad::add(tape, h, ad::linear(tape, u, q[4], q[5]));
    }
    ad::Var loss =
        ad::cross_entropy_mean(tape, ad::linear(tape, h, p[6 * kBlocks], p.back()), targets);
    h = ad::Var();
    rt.mark_backward();
    tape.backward(loss);
    float value = NAN;
    if (read_back(rt, loss.value, &value)) w.losses.push_back(value);
    loss = ad::Var();
    for (std::size_t i = 0; i < w.params.size(); ++i)
      ops::adamw(rt, w.params[i], w.m[i], w.v[i], tape.grad(p[i]), {.lr = 1e-2f}, step + 1);
  }

  PlanCache::Key shape_key(int step) const override { return {batch_of(step)}; }
  std::int64_t batch_of(int step) const {
    return batches_[static_cast<std::size_t>(step) % batches_.size()];
  }

 private:
  std::vector<std::int64_t> batches_;
};

struct Trained {
  std::vector<float> losses;
  std::vector<std::vector<float>> params;
  std::vector<StepReport> reports;
  RuntimeStats stats;
};

// The driver's losses and parameters so far.
Trained trained_state(StepDriver& driver) {
  auto& w = static_cast<ResidualMlp::Weights&>(driver.state());
  Trained t;
  t.losses = w.losses;
  for (const Tensor& p : w.params) {
    t.params.emplace_back(static_cast<std::size_t>(p.spec().numel()));
    driver.runtime().read(p, t.params.back().data());
  }
  t.stats = driver.runtime().stats();
  return t;
}

Trained train(ResidualMlp& program, const StepDriverOptions& options, int steps) {
  StepDriver driver(program, options);
  std::vector<StepReport> reports;
  for (int s = 0; s < steps; ++s) {
    reports.push_back(driver.run(s));
    reports.back().recorded.reset();
  }
  Trained t = trained_state(driver);
  t.reports = std::move(reports);
  return t;
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// `driver`'s losses and parameters are `want`'s, bit for bit.
void expect_same_bits(StepDriver& driver, const Trained& want) {
  const Trained got = trained_state(driver);
  EXPECT_TRUE(bitwise_equal(got.losses, want.losses));
  ASSERT_EQ(got.params.size(), want.params.size());
  for (std::size_t i = 0; i < got.params.size(); ++i)
    EXPECT_TRUE(bitwise_equal(got.params[i], want.params[i])) << "parameter " << i;
}

// Planning in the step unless `background` (Note [Planning beside the steps]), so that
// which step tries a plan is the same on every run.
StepDriverOptions options_at(std::size_t budget, const std::string& policy,
                             bool background = false) {
  StepDriverOptions o;
  o.runtime.budget = budget;
  o.policy = policy;
  o.planners = {"chen", "mincut", "twremat"};
  o.plan_time_limit = 1;
  o.plan_in_background = background;
  return o;
}

// Random budgets between 0.45 of the unconstrained peak and all of it, under every
// policy the driver knows (`auto` planning in the step and beside it): a run that fits
// stays within its budget and is bitwise the unconstrained run; `auto` follows plans
// somewhere in the sweep.
TEST(StepDriverTest, RandomBudgetsMatchTheUnconstrainedRunBitwise) {
  ResidualMlp program({1024, 768, 1024, 768});
  constexpr int kSteps = 8;
  const std::size_t peak = measure_unconstrained_peak(program, {}, kSteps);
  const Trained base = train(program, options_at(SIZE_MAX, "dtr"), kSteps);
  ASSERT_EQ(base.losses.size(), static_cast<std::size_t>(kSteps));
  EXPECT_EQ(base.stats.memory.peak_reserved, peak);
  std::mt19937 rng(3);
  std::uniform_real_distribution<double> fraction(0.45, 1.0);
  std::map<std::string, int> fitted;
  std::size_t planned_steps = 0;
  for (int trial = 0; trial < 4; ++trial) {
    const double f = fraction(rng);
    for (const char* policy : {"auto", "auto beside the steps", "dtr", "hinted"}) {
      SCOPED_TRACE(std::string(policy) + " at " + std::to_string(f));
      const auto budget = static_cast<std::size_t>(f * static_cast<double>(peak));
      const bool background = std::string(policy) == "auto beside the steps";
      Trained run;
      try {
        run = train(program, options_at(budget, background ? "auto" : policy, background), kSteps);
      } catch (const OutOfMemoryError&) {
        continue;
      }
      ++fitted[policy];
      EXPECT_LE(run.stats.memory.peak_reserved, budget) << "the budget is a hard cap";
      EXPECT_TRUE(bitwise_equal(run.losses, base.losses));
      ASSERT_EQ(run.params.size(), base.params.size());
      for (std::size_t i = 0; i < run.params.size(); ++i)
        EXPECT_TRUE(bitwise_equal(run.params[i], base.params[i])) << "parameter " << i;
      for (const StepReport& r : run.reports) {
        if (std::string(policy) == "dtr") {
          EXPECT_EQ(r.kind, StepKind::kDynamic);
        }
        if (std::string(policy) == "auto" && r.kind == StepKind::kPlanned) ++planned_steps;
      }
    }
  }
  EXPECT_GT(fitted["auto"], 0);
  EXPECT_GT(fitted["dtr"], 0);
  EXPECT_GT(planned_steps, 0u) << "auto kept no plan at any budget";
}

// Note [Planning repeated shapes]: per shape, DTR, then DTR recorded, then a plan's trial
// (or DTR where no plan beat it); the shapes' reports add up to the steps run.
TEST(StepDriverTest, AutoRecordsThenTriesAPlanPerShape) {
  ResidualMlp program({1024, 768});
  const std::size_t peak = measure_unconstrained_peak(program, {}, 2);
  StepDriver driver(program, options_at(peak * 7 / 10, "auto"));
  std::map<std::int64_t, std::vector<StepKind>> kinds;
  for (int s = 0; s < 8; ++s) {
    const StepReport& r = driver.run(s);
    EXPECT_EQ(r.step, s);
    EXPECT_EQ(r.shape, PlanCache::Key{program.batch_of(s)});
    EXPECT_GT(r.base_cost, 0);
    EXPECT_GE(r.seconds, r.planning_seconds);
    kinds[program.batch_of(s)].push_back(r.kind);
  }
  const std::vector<ShapeReport> shapes = driver.shapes();
  ASSERT_EQ(shapes.size(), 2u);
  for (const ShapeReport& shape : shapes) {
    SCOPED_TRACE(shape.why);
    const std::vector<StepKind>& k = kinds[shape.shape[0]];
    ASSERT_EQ(k.size(), 4u);
    EXPECT_EQ(shape.steps, 4);
    EXPECT_EQ(k[0], StepKind::kDynamic);
    EXPECT_EQ(k[1], StepKind::kRecorded);
    EXPECT_TRUE(shape.planned);
    EXPECT_FALSE(shape.screened.empty());
    if (shape.decision == ShapeDecision::kPlan) {
      EXPECT_EQ(k[2], StepKind::kPlanTrial);
      EXPECT_EQ(k[3], StepKind::kPlanned);
      EXPECT_LE(*shape.plan_step_overhead, *shape.dtr_step_overhead);
    } else if (k[2] == StepKind::kPlanTrial) {
      EXPECT_EQ(shape.decision, ShapeDecision::kDtr);
      EXPECT_EQ(k[3], StepKind::kDynamic);
    }
  }
  EXPECT_EQ(driver.totals().plans_made, 2u);
}

// Note [Planning beside the steps]: with estimated costs the first step is recorded and the
// second starts planning and runs under DTR; the shape's steps stay DTR's until the plan is
// made, and the next one then tries it: the third, as planning in the step tries it.
// Results are the same bits as planning in the step gives. A driver destroyed while
// planning stops it.
TEST(StepDriverTest, AutoPlansBesideTheStepsAndTriesThePlanOnceItIsMade) {
  ResidualMlp program({1024});
  const std::size_t peak = measure_unconstrained_peak(program, {}, 2);
  const std::size_t budget = peak * 7 / 10;
  const Trained in_step = train(program, options_at(budget, "auto"), 6);
  ASSERT_EQ(in_step.reports[2].kind, StepKind::kPlanTrial) << "no plan to try at 0.7";
  StepDriver driver(program, options_at(budget, "auto", /*background=*/true));
  EXPECT_EQ(driver.run(0).kind, StepKind::kRecorded);
  EXPECT_EQ(driver.run(1).kind, StepKind::kDynamic);  // its plan is being made
  ASSERT_EQ(driver.shapes().size(), 1u);
  EXPECT_EQ(driver.shapes()[0].decision, ShapeDecision::kPlanning);
  EXPECT_EQ(shape_decision_name(ShapeDecision::kPlanning), "dtr (planning)");
  driver.finish_planning();
  EXPECT_EQ(driver.totals().plans_made, 1u);
  const ShapeReport planned = driver.shapes()[0];
  EXPECT_EQ(planned.decision, ShapeDecision::kTrial) << planned.why;
  EXPECT_GT(planned.plan_seconds, 0);
  StepDriver planned_in_step(program, options_at(budget, "auto"));
  for (int s = 0; s < 3; ++s) planned_in_step.run(s);
  EXPECT_EQ(planned.plan, planned_in_step.shapes()[0].plan) << "the same plan either way";
  EXPECT_EQ(driver.run(2).kind, StepKind::kPlanTrial);
  for (int s = 3; s < 6; ++s) driver.run(s);
  expect_same_bits(driver, in_step);
  StepDriver stopped(program, options_at(budget, "auto", /*background=*/true));
  for (int s = 0; s < 2; ++s) stopped.run(s);
  EXPECT_EQ(stopped.shapes()[0].decision, ShapeDecision::kPlanning);
}  // `stopped` waits for its planning thread here

// A loop that calls nothing but run() gets its plan within plan_within_steps + 1 steps of
// the one that started planning it: with 0 the next step waits for the plan and tries it;
// with 2 the trial comes by the third step after, however slow the planners.
TEST(StepDriverTest, APlanMadeBesideTheStepsArrivesWithinABoundWithoutFinishPlanning) {
  ResidualMlp program({1024});
  const std::size_t budget = measure_unconstrained_peak(program, {}, 2) * 7 / 10;
  for (const int within : {0, 2}) {
    SCOPED_TRACE(within);
    StepDriverOptions o = options_at(budget, "auto", /*background=*/true);
    o.plan_within_steps = within;
    StepDriver driver(program, o);
    for (int s = 0; s < 2; ++s) driver.run(s);  // the second starts planning, under DTR
    int trial = -1;
    for (int s = 2; s <= 2 + within && trial < 0; ++s)
      if (driver.run(s).kind == StepKind::kPlanTrial) trial = s;
    EXPECT_GE(trial, 2) << "no trial by step " << 2 + within;
    if (within == 0) {
      EXPECT_EQ(trial, 2);
    }
  }
}

// A budget under which DTR recomputes nothing leaves no plan to find (none is kept unless it
// recomputes no more than DTR did): the recorded step is dropped unplanned, and every step
// stays DTR's. On the tree-LSTM, whose steps once shared one key, planning such a step took
// 186 s on this machine.
TEST(StepDriverTest, AShapeWhoseRecordedStepRecomputedNothingIsNotPlanned) {
  ResidualMlp program({1024});
  const std::size_t peak = measure_unconstrained_peak(program, {}, 2);
  StepDriver driver(program, options_at(peak, "auto"));  // a budget, but all of the peak
  for (int s = 0; s < 5; ++s) {
    const StepReport& r = driver.run(s);
    EXPECT_EQ(r.recompute_cost, 0) << "step " << s;
    EXPECT_EQ(r.kind, s == 1 ? StepKind::kRecorded : StepKind::kDynamic) << "step " << s;
  }
  EXPECT_EQ(driver.totals().plans_made, 0u);
  const std::vector<ShapeReport> shapes = driver.shapes();
  ASSERT_EQ(shapes.size(), 1u);
  EXPECT_EQ(shapes[0].decision, ShapeDecision::kDtr);
  EXPECT_NE(shapes[0].why.find("recomputed nothing"), std::string::npos) << shapes[0].why;
}

// With host memory over a link that costs next to nothing, `auto` plans with planner offload
// (its plans' copies followed by the runtime: PlanStep::offload_before ...), and both `auto`
// and `hinted` train bitwise as the unconstrained run does.
TEST(StepDriverTest, PlansWithHostMemoryTrainBitwise) {
  ResidualMlp program({1024, 768, 1024, 768});
  constexpr int kSteps = 6;
  const std::size_t peak = measure_unconstrained_peak(program, {}, kSteps);
  const Trained base = train(program, options_at(SIZE_MAX, "dtr"), kSteps);
  for (const char* policy : {"auto", "hinted"}) {
    SCOPED_TRACE(policy);
    StepDriverOptions o = options_at(peak / 2, policy);
    o.runtime.host_memory_bytes = peak;
    o.runtime.host_link = HostLink{1e6, 0.0};
    o.plan_time_limit = 0.3;
    StepDriver driver(program, o);
    int offload_plans = 0;
    for (int s = 0; s < kSteps; ++s) driver.run(s);
    for (const ShapeReport& shape : driver.shapes())
      offload_plans += shape.plan.starts_with("offload");
    // (`hinted` follows what DTR realized here: with victims on the host, it recomputed
    // nothing, and no plan beats that.)
    if (std::string(policy) == "auto") {
      EXPECT_GT(offload_plans, 0) << "no plan used host memory";
    }
    expect_same_bits(driver, base);
    EXPECT_LE(driver.runtime().stats().memory.peak_reserved, peak / 2);
    EXPECT_GT(driver.runtime().stats().offloads, 0u);
  }
}

// Note [Screening plans with copies]: where a plan with copies to the host is screened, the
// cheapest plan without them at the same fraction is screened beside it, and the plan kept
// is the cheapest of all on the simulated backend, whatever the link costs.
TEST(StepDriverTest, ScreeningWeighsThePlanWithoutCopiesBesideTheOneWithThem) {
  ResidualMlp program({1024, 768, 1024, 768});
  constexpr int kSteps = 6;
  const std::size_t peak = measure_unconstrained_peak(program, {}, kSteps);
  int offload_rows = 0;
  for (double bytes_per_ns : {20.0, 2.0}) {
    SCOPED_TRACE(bytes_per_ns);
    StepDriverOptions o = options_at(peak / 2, "auto");
    o.runtime.host_memory_bytes = peak;
    o.runtime.host_link = HostLink{bytes_per_ns, 1000.0};
    o.plan_time_limit = 0.3;
    StepDriver driver(program, o);
    for (int s = 0; s < kSteps; ++s) driver.run(s);
    for (const ShapeReport& shape : driver.shapes()) {
      double cheapest = INFINITY;
      for (const ScreenedPlan& row : shape.screened) {
        if (row.simulated_overhead) cheapest = std::min(cheapest, *row.simulated_overhead);
        if (!row.plan.starts_with("offload")) continue;
        ++offload_rows;
        int beside = 0;
        for (const ScreenedPlan& other : shape.screened)
          beside += other.fraction == row.fraction && !other.plan.starts_with("offload");
        EXPECT_EQ(beside, 1) << row.plan << " at " << row.fraction.value_or(-1);
      }
      if (shape.decision != ShapeDecision::kPlan) continue;
      bool kept_cheapest = false;
      for (const ScreenedPlan& row : shape.screened)
        kept_cheapest |= row.plan == shape.plan && row.simulated_overhead == cheapest;
      EXPECT_TRUE(kept_cheapest) << shape.plan;
    }
  }
  EXPECT_GT(offload_rows, 0) << "no plan with copies was screened";
}

// An out-of-memory step is aborted: with the budget lifted, the same step runs again in the
// same driver and computes what an unconstrained run computes.
TEST(StepDriverTest, AnOutOfMemoryStepLeavesTheDriverUsable) {
  ResidualMlp program({64});
  const Trained base = train(program, options_at(SIZE_MAX, "dtr"), 2);
  for (const char* policy : {"auto", "dtr"}) {
    StepDriver driver(program, options_at(SIZE_MAX, policy));
    // Room for the parameters and their AdamW state, and little else.
    driver.runtime().set_budget(driver.runtime().stats().memory.reserved + (std::size_t{64} << 10));
    EXPECT_THROW(driver.run(0), OutOfMemoryError) << policy;
    // The step may fail as late as its optimizer updates (their freezing recomputes), after
    // it recorded its loss on the host: that record is the program's, not the runtime's.
    static_cast<ResidualMlp::Weights&>(driver.state()).losses.clear();
    driver.runtime().set_budget(SIZE_MAX);
    driver.run(0);
    driver.run(1);
    EXPECT_TRUE(
        bitwise_equal(static_cast<ResidualMlp::Weights&>(driver.state()).losses, base.losses));
  }
}

// The planned steps of `options` run until one is planned; under a budget shrunk below it
// (and below the arena a placed plan reserved), the next one fails within that budget.
void failed_planned_step_goes_back_to_dtr(ResidualMlp& program, const StepDriverOptions& options) {
  const std::size_t budget = options.runtime.budget;
  StepDriver driver(program, options);
  int step = 0;
  for (; step < 8 && driver.run(step).kind != StepKind::kPlanned; ++step) {
  }
  ASSERT_LT(step, 8) << "no plan was kept to fail";
  const std::size_t planned = driver.totals().planned_steps;
  const std::size_t small = driver.runtime().stats().pinned_bytes + (std::size_t{1} << 20);
  driver.runtime().set_budget(small);
  EXPECT_THROW(driver.run(++step), OutOfMemoryError);
  EXPECT_LE(driver.runtime().stats().memory.reserved, small) << "the budget is a hard cap";
  EXPECT_EQ(driver.totals().planned_steps, planned);
  ASSERT_EQ(driver.shapes().size(), 1u);
  EXPECT_EQ(driver.shapes()[0].decision, ShapeDecision::kDtr);
  EXPECT_NE(driver.shapes()[0].why.find("a step following the plan failed"), std::string::npos)
      << driver.shapes()[0].why;
  driver.runtime().set_budget(budget);
  EXPECT_EQ(driver.run(++step).kind, StepKind::kDynamic);
}

// A step that follows a kept plan and fails (here the budget shrank under it, below the
// arena a placed plan had reserved too, which goes back: the budget stays a hard cap) sends its
// shape back to DTR for good: the next step of that shape runs DTR, not the plan that failed, and
// the failed step is not counted as planned.
TEST(StepDriverTest, AFailedPlannedStepSendsItsShapeBackToDtr) {
  for (const bool placement : {false, true}) {
    SCOPED_TRACE(placement ? "placed" : "best fit");
    ResidualMlp program({1024});
    const std::size_t peak = measure_unconstrained_peak(program, {}, 2);
    const std::size_t budget = peak * 7 / 10;
    StepDriverOptions options = options_at(budget, "auto");
    options.placement = placement;
    failed_planned_step_goes_back_to_dtr(program, options);
  }
}

// Note [Shapes forgotten]: shapes past max_shapes are forgotten, the one seen longest ago
// first, and the run keeps its bits; a shape that comes again starts anew.
TEST(StepDriverTest, ShapesPastTheLimitAreForgottenAndTheBitsStay) {
  ResidualMlp program({256, 320, 384, 448, 512, 576});
  const std::size_t peak = measure_unconstrained_peak(program, {}, 6);
  const Trained want = train(program, options_at(SIZE_MAX, "dtr"), 12);
  StepDriverOptions o = options_at(peak * 7 / 10, "auto");
  o.max_shapes = 3;
  StepDriver driver(program, o);
  for (int s = 0; s < 12; ++s) {
    driver.run(s);
    EXPECT_LE(driver.shapes().size(), 3u) << "after step " << s;
  }
  EXPECT_EQ(driver.totals().forgotten_shapes, 9u);  // 12 shapes seen anew, 3 kept
  for (const ShapeReport& r : driver.shapes()) EXPECT_EQ(r.steps, 1) << "seen anew each time";
  expect_same_bits(driver, want);
}

TEST(StepDriverTest, RejectsAnUnknownPolicy) {
  ResidualMlp program({8});
  EXPECT_THROW(StepDriver(program, options_at(SIZE_MAX, "clairvoyant")), std::invalid_argument);
}

}  // namespace
}  // namespace remat
