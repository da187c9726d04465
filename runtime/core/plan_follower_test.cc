// Following a plan's schedule (runtime/core/plan_follower.h, Note [Following a schedule]).
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "remat/graph_transforms.h"
#include "remat/hints.h"
#include "remat/runtime.h"
#include "tests/support/test_ops.h"

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

// Note [Outputs the plan does not claim]: the plan names only the first output of
// scan_and_square; the second, which the program holds, goes once the plan's steps at that
// position have run (as the schedule's simulator counts it), and reading it later recomputes
// the same values. Without a plan it stays.
TEST(PlanFollowerTest, AnOutputNoPlanStepClaimsGoesAfterItsPosition) {
  for (const bool planned : {false, true}) {
    RuntimeOptions o;
    o.accounting = Accounting::kLogical;
    o.policy = "hinted";
    Runtime rt(o);
    const std::vector<float> init = testing::iota(16);
    Tensor x = rt.constant(vec(16), init.data());
    StepOptions so;
    if (planned) {
      auto hints = std::make_shared<StepHints>();
      hints->ops = {{"scan_and_square", {{true, false}, {false, true}}, {}},
                    {"affine", {{true, false}}, {}}};
      hints->schedule = {{{0, 0}, {}, {}}, {{1, 0}, {}, {}}};
      so.hints = hints;
    }
    rt.begin_step(so);
    std::vector<Tensor> out = rt.call(testing::scan_and_square(), {x});
    Tensor y = rt.call1(testing::affine(2.0f, 0.0f), {out[0]});
    EXPECT_EQ(out[1].resident(), !planned) << (planned ? "planned" : "unplanned");
    rt.end_step();
    std::vector<float> square(16);
    for (int i = 0; i < 16; ++i) square[i] = init[i] * init[i];
    EXPECT_EQ(read(rt, out[1]), square);
    EXPECT_EQ(rt.stats().hint_mismatches, 0u);
  }
}

// Note [Reads by updates] in runtime/ir/hints.cc: a step makes a "gradient" g from x, updates
// the constant w with it, and lets go of g before end_step(), as a loop whose tensors are
// locals of its step function does. Followed, the schedule the step realized keeps g resident
// until the update reads it: nothing is recomputed, and w gets the bits an unplanned step
// gives it.
TEST(PlanFollowerTest, WhatAnUpdateReadsStaysUntilTheUpdate) {
  Runtime rt(testing::logical(SIZE_MAX, "hinted"));
  const std::vector<float> init = testing::iota(64);
  Tensor w = rt.constant(vec(64), init.data());
  Tensor x = rt.constant(vec(64), init.data());
  auto step = [&](StepOptions so) {
    rt.begin_step(std::move(so));
    {
      Tensor a = rt.call1(testing::affine(2.0f, 1.0f), {x});
      Tensor g = rt.call1(testing::affine(0.5f, 0.0f), {a});
      a.reset();
      rt.update(testing::add_into_first(), {w, g}, {0});
    }
    return rt.end_step();
  };
  StepOptions record;
  record.record = true;
  const RecordedStep recorded = step(record);
  const std::vector<StepSite> sites = recorded_sites(recorded.graph);
  absl::StatusOr<Schedule> realized = realized_schedule(recorded.graph, sites, recorded.executed);
  ASSERT_TRUE(realized.ok()) << realized.status();
  StepOptions follow;
  follow.hints = std::make_shared<StepHints>(
      hints_from_schedule(recorded.graph, *realized, sites, "realized"));
  ASSERT_FALSE(follow.hints->schedule.empty());
  for (const PlanStep& ps : follow.hints->schedule)
    for (const StepSite& freed : ps.free_after)
      EXPECT_FALSE(freed == (StepSite{1, 0})) << "g is evicted before the update reads it";
  const std::size_t recomputations = rt.stats().recomputations;
  step(follow);
  EXPECT_EQ(rt.stats().recomputations, recomputations);
  std::vector<float> expected(64);
  for (std::size_t i = 0; i < expected.size(); ++i) expected[i] = 3 * init[i] + 1;
  EXPECT_EQ(read(rt, w), expected);
}

// Runtime::abort_step: a step abandoned after an error and run again draws the same random
// numbers as a step that never failed, and nothing of the failed attempt stays resident.
TEST(StepTest, AbortedStepRunsAgainWithTheSameRandomNumbers) {
  auto run = [](bool fail_first) {
    RuntimeOptions o;
    o.accounting = Accounting::kLogical;
    Runtime rt(o);
    const std::vector<float> init = testing::iota(64);
    Tensor x = rt.constant(vec(64), init.data());
    if (fail_first) {
      rt.begin_step();
      {
        Tensor d = rt.call1(testing::dropout(), {x});
        Tensor e = rt.call1(testing::dropout(), {d});
      }
      rt.abort_step();
      EXPECT_EQ(rt.stats().resident_bytes, rt.stats().pinned_bytes);
    }
    rt.begin_step();
    Tensor d = rt.call1(testing::dropout(), {x});
    std::vector<float> values = read(rt, d);
    rt.end_step();
    return values;
  };
  const std::vector<float> clean = run(false);
  EXPECT_EQ(run(true), clean);
  EXPECT_NE(std::count(clean.begin(), clean.end(), 0.0f), 0) << "dropout should drop some";
}

}  // namespace
}  // namespace remat
