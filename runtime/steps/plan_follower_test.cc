// Following a plan's schedule (runtime/steps/plan_follower.h, Note [Following a schedule]).
#include <gtest/gtest.h>

#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "remat/runtime.h"
#include "tests/test_ops.h"

namespace remat {
namespace {

using testing::read;
using testing::vec;

// The program calls a (0), b (1), c (2); c reads only a. A plan that computes c before b
// defers b when the program calls it: b holds no memory until the cursor reaches it after c,
// the recorded order of runs is the plan's, and every value is the one an unplanned run gives.
std::vector<std::vector<float>> run(bool planned, RuntimeStats* stats, std::vector<int>* order,
                                    const std::string& policy = "hinted") {
  RuntimeOptions o;
  o.accounting = Accounting::kLogical;
  o.policy = policy;
  Runtime rt(o);
  std::vector<float> init(64);
  std::iota(init.begin(), init.end(), 1.0f);
  Tensor x = rt.constant(vec(64), init.data());
  StepOptions so;
  so.record = true;
  if (planned) {
    auto hints = std::make_shared<StepHints>();
    hints->source = "test plan";
    hints->ops = {{"affine", {{true, false}}, {}},
                  {"affine", {{true, false}}, {}},
                  {"combine", {{true, false}}, {}}};
    hints->schedule = {{{0, 0}, {}, {}}, {{2, 0}, {}, {}}, {{1, 0}, {}, {}}};
    so.hints = hints;
  }
  rt.begin_step(so);
  Tensor a = rt.call1(testing::affine(2.0f, 1.0f), {x});
  Tensor b = rt.call1(testing::affine(-1.0f, 3.0f), {x});
  const bool b_resident_when_called = b.resident();
  Tensor c = rt.call1(testing::combine(), {a, a});
  RecordedStep step = rt.end_step();
  *stats = rt.stats();
  *order = step.executed;
  if (planned && policy == "hinted") {
    EXPECT_FALSE(b_resident_when_called) << "b should wait for the plan";
  }
  return {read(rt, a), read(rt, b), read(rt, c)};
}

TEST(PlanFollowerTest, DefersAnOpTheScheduleRunsLaterAndKeepsEveryValue) {
  RuntimeStats plain_stats, planned_stats;
  std::vector<int> plain_order, planned_order;
  const auto plain = run(false, &plain_stats, &plain_order);
  const auto planned = run(true, &planned_stats, &planned_order);
  EXPECT_EQ(plain, planned);
  EXPECT_EQ(plain_order, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(planned_order, (std::vector<int>{0, 2, 1}));
  EXPECT_EQ(plain_stats.deferred_ops, 0u);
  EXPECT_EQ(planned_stats.deferred_ops, 1u);
  EXPECT_EQ(planned_stats.hint_mismatches, 0u);
}

// Only a policy that acts on hints (`hinted`) makes a hinted step: under `dtr` the same hints
// are ignored, and the ops run where the program calls them.
TEST(PlanFollowerTest, OtherPoliciesIgnoreHints) {
  RuntimeStats stats;
  std::vector<int> order;
  run(true, &stats, &order, "dtr");
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(stats.deferred_ops, 0u);
  EXPECT_EQ(stats.hint_evictions, 0u);
}

// A hint naming another op means the plan no longer describes the step: the cursor stops,
// nothing stays deferred, and the values are still exact.
TEST(PlanFollowerTest, AMismatchedHintStopsFollowing) {
  RuntimeOptions o;
  o.accounting = Accounting::kLogical;
  o.policy = "hinted";
  Runtime rt(o);
  std::vector<float> init(8, 2.0f);
  Tensor x = rt.constant(vec(8), init.data());
  auto hints = std::make_shared<StepHints>();
  hints->ops = {{"not_affine", {{true, false}}, {}}, {"affine", {{true, false}}, {}}};
  hints->schedule = {{{1, 0}, {}, {}}, {{0, 0}, {}, {}}};
  StepOptions so;
  so.hints = hints;
  rt.begin_step(so);
  Tensor a = rt.call1(testing::affine(2.0f, 1.0f), {x});
  Tensor b = rt.call1(testing::affine(3.0f, 0.0f), {a});
  rt.end_step();
  EXPECT_EQ(rt.stats().hint_mismatches, 1u);
  EXPECT_EQ(rt.stats().deferred_ops, 0u);
  EXPECT_EQ(read(rt, b), std::vector<float>(8, 15.0f));
}

}  // namespace
}  // namespace remat
