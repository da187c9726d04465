// Note [Each step's own clock]: a step's evictions do not depend on how much simulated time
// the steps before it took.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "remat/runtime.h"
#include "tests/support/test_ops.h"

namespace remat {
namespace {

using testing::vec;

// y = a x + 1 named `name` and priced at `cost`: layers of one price tie, layers of others
// do not.
OpPtr priced_affine(const std::string& name, float a, double cost) {
  return make_op(
      name, [](SpecList in) { return Outputs{{in[0]}}; },
      [a](const KernelContext& k) {
        const float* x = k.input<float>(0);
        float* y = k.output<float>(0);
        for (std::int64_t i = 0; i < k.input_spec(0).numel(); ++i) y[i] = a * x[i] + 1.0f;
      },
      [cost](SpecList) { return cost; });
}

// What a step evicted, in order: each eviction's producer and bytes.
struct Eviction {
  std::string op;
  std::size_t bytes;
};

// A step of a chain whose layers cost 1 to 7 and whose sizes vary: forward, then back
// through every layer's output combined with the gradient.
void run_step(Runtime& rt, const Tensor& input) {
  rt.begin_step();
  std::vector<Tensor> acts{input};
  for (int l = 0; l < 24; ++l)
    acts.push_back(rt.call1(priced_affine("layer" + std::to_string(l), 0.5f + 0.01f * l, 1 + l % 7),
                            {acts.back()}));
  rt.mark_backward();
  Tensor g = acts.back();
  for (int l = 23; l >= 0; --l) {
    g = rt.call1(testing::combine(), {g, acts[static_cast<std::size_t>(l)]});
    acts.pop_back();
  }
  testing::read(rt, g);
  rt.end_step();
}

std::vector<Eviction> evictions_since(const Runtime& rt, std::size_t first_event) {
  std::vector<Eviction> out;
  const std::vector<TimelineEvent>& events = rt.timeline().events;
  for (std::size_t i = first_event; i < events.size(); ++i)
    if (events[i].kind == TimelineEvent::Kind::kEvict)
      out.push_back({events[i].name, events[i].bytes});
  return out;
}

// The second step's evictions, after a first step and `idle` units of simulated time
// spent outside any step.
std::vector<Eviction> second_step(double idle) {
  RuntimeOptions o = testing::logical(12 * 4096);
  o.record_timeline = true;
  Runtime rt(o);
  const std::vector<float> values = testing::iota(1024);
  const Tensor input = rt.constant(vec(1024), values.data());
  run_step(rt, input);
  // Time outside the steps: an op of that cost, whose output is dropped at once.
  rt.call1(priced_affine("idle", 1.0f, idle), {input});
  const std::size_t first_event = rt.timeline().events.size();
  run_step(rt, input);
  return evictions_since(rt, first_event);
}

TEST(StepClock, AStepEvictsTheSameWhateverTimePassedBeforeIt) {
  const std::vector<Eviction> soon = second_step(1.0);
  ASSERT_GT(soon.size(), 4u);  // the budget makes the step evict
  // At 2^60 the clock's rounding step (256) is larger than any layer's cost: a staleness
  // measured from the start of the run would round the layers' differences away.
  const std::vector<Eviction> late = second_step(0x1.0p60);
  ASSERT_EQ(late.size(), soon.size());
  for (std::size_t i = 0; i < soon.size(); ++i) {
    EXPECT_EQ(late[i].op, soon[i].op) << "eviction " << i;
    EXPECT_EQ(late[i].bytes, soon[i].bytes) << "eviction " << i;
  }
}

// The clock the program sees still counts every step: the time reported goes on from where
// it was.
TEST(StepClock, TheReportedClockCountsEveryStep) {
  Runtime rt(testing::logical(SIZE_MAX));
  const std::vector<float> values = testing::iota(16);
  const Tensor input = rt.constant(vec(16), values.data());
  rt.call1(priced_affine("a", 1.0f, 5.0), {input});
  const double before = rt.clock();
  EXPECT_EQ(before, 5.0);
  rt.begin_step();
  rt.call1(priced_affine("b", 1.0f, 3.0), {input});
  rt.end_step();
  rt.begin_step();
  rt.call1(priced_affine("c", 1.0f, 2.0), {input});
  rt.end_step();
  EXPECT_EQ(rt.clock(), 10.0);
}

}  // namespace
}  // namespace remat
