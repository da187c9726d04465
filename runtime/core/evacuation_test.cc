// Note [Evacuating segments]: free budget split into crumbs beside pinned blocks, which
// compaction cannot join (no other segment has room for what would move), is joined by
// evacuating segments through the host, and every tensor keeps its bytes.
#include <gtest/gtest.h>

#include <cstddef>
#include <memory>
#include <vector>

#include "remat/errors.h"
#include "remat/placement.h"
#include "remat/runtime.h"
#include "runtime/cuda/simulated_cuda.h"
#include "tests/support/test_ops.h"

namespace remat {
namespace {

using testing::iota;
using testing::read;
using testing::vec;

// Three 1 KiB constants under a 4 KiB budget whose segments are 1.5 KiB: the first two get a
// segment each with 512 bytes free beside them, the third a bare 1 KiB segment; nothing is
// left unreserved. A 1 KiB output then has 1 KiB of free budget, in two 512-byte crumbs.
RuntimeOptions crumbs(bool compaction) {
  RuntimeOptions o;
  o.budget = 4096;
  o.allocator.medium_segment = 1536;
  o.compaction = compaction;
  return o;
}

TEST(Evacuation, JoinsCrumbsThatCompactionCannotAndKeepsEveryByte) {
  Runtime rt(crumbs(true));
  const Tensor c1 = rt.constant(vec(256), iota(256, 1).data());
  const Tensor c2 = rt.constant(vec(256), iota(256, 1000).data());
  const Tensor c3 = rt.constant(vec(256), iota(256, 2000).data());
  ASSERT_EQ(rt.stats().memory.reserved, 4096u);
  ASSERT_EQ(rt.stats().memory.segments, 3u);
  const Tensor y = rt.call1(testing::affine(2, 0), {c3});
  EXPECT_GE(rt.stats().evacuations, 1u);
  EXPECT_GT(rt.stats().evacuation_bytes, 0u);
  EXPECT_LE(rt.stats().memory.peak_reserved, 4096u) << "the budget is a hard cap";
  EXPECT_EQ(read(rt, c1), iota(256, 1));
  EXPECT_EQ(read(rt, c2), iota(256, 1000));
  EXPECT_EQ(read(rt, c3), iota(256, 2000));
  std::vector<float> twice = iota(256, 2000);
  for (float& f : twice) f *= 2;
  EXPECT_EQ(read(rt, y), twice);
}

TEST(Evacuation, WithoutItTheSameRequestRunsOutOfMemoryAndSaysWhy) {
  Runtime rt(crumbs(false));
  const Tensor c1 = rt.constant(vec(256), iota(256, 1).data());
  const Tensor c2 = rt.constant(vec(256), iota(256, 1000).data());
  const Tensor c3 = rt.constant(vec(256), iota(256, 2000).data());
  try {
    rt.call1(testing::affine(2, 0), {c3});
    FAIL() << "expected OutOfMemoryError";
  } catch (const OutOfMemoryError& e) {
    EXPECT_EQ(e.info().pinned, 3072u);
    const std::string what = e.what();
    EXPECT_NE(what.find("free: 1024 reserved bytes in pieces of at most 512 and 0 unreserved"),
              std::string::npos)
        << what;
    // The error does not claim that no move could join them: none was tried.
    EXPECT_EQ(e.info().moves_refused, "compaction is off (RuntimeOptions::compaction)");
    EXPECT_NE(what.find("not joined: no block moved, since compaction is off"), std::string::npos)
        << what;
    EXPECT_EQ(what.find("no move of the blocks"), std::string::npos) << what;
  }
  EXPECT_EQ(rt.stats().evacuations, 0u);
}

// Where compaction was tried and nothing could serve the request (2 KiB more than the
// budget holds), the error says no move could join the free pieces.
TEST(Evacuation, WhereMovesWereTriedTheErrorSaysNoneCouldJoin) {
  Runtime rt(crumbs(true));
  const Tensor c1 = rt.constant(vec(256), iota(256, 1).data());
  const Tensor c2 = rt.constant(vec(256), iota(256, 1000).data());
  const Tensor c3 = rt.constant(vec(256), iota(256, 2000).data());
  try {
    rt.call1(testing::concat(), {c3, c3});
    FAIL() << "expected OutOfMemoryError";
  } catch (const OutOfMemoryError& e) {
    EXPECT_EQ(e.info().moves_refused, "");
    const std::string what = e.what();
    EXPECT_NE(what.find("which no move of the blocks between them could join"), std::string::npos)
        << what;
  }
  EXPECT_EQ(read(rt, c2), iota(256, 1000));
}

// On a device the bytes go to the host and back (here the simulated one, where a copy is
// real host memory): a fourth constant is the request.
TEST(Evacuation, CopiesThroughTheHostOnADevice) {
  auto sim = std::make_shared<SimulatedCuda>();
  RuntimeOptions o = crumbs(true);
  o.backend = Backend::kCuda;
  o.cuda.api = sim;
  o.cuda.blas_workspace_bytes = 1536;  // a segment of its own, which no evacuation touches
  o.budget += 1536;
  Runtime rt(o);
  std::vector<Tensor> c;
  for (int i = 0; i < 4; ++i) c.push_back(rt.constant(vec(256), iota(256, 1000.0f * i).data()));
  EXPECT_GE(rt.stats().evacuations, 1u);
  EXPECT_LE(rt.stats().memory.peak_reserved, o.budget);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(read(rt, c[i]), iota(256, 1000.0f * i)) << i;
}

// Where the bytes do not exist (allocated + request above the budget), nothing moves.
TEST(Evacuation, DoesNothingWhereTheBudgetCannotHoldTheRequest) {
  Runtime rt(crumbs(true));
  const Tensor c1 = rt.constant(vec(256), iota(256, 1).data());
  const Tensor c2 = rt.constant(vec(256), iota(256, 1000).data());
  const Tensor c3 = rt.constant(vec(256), iota(256, 2000).data());
  EXPECT_THROW(rt.call1(testing::concat(), {c3, c3}), OutOfMemoryError);  // 2 KiB more
  EXPECT_EQ(rt.stats().evacuations, 0u);
  EXPECT_EQ(read(rt, c1), iota(256, 1));
}

// Note [A placed step starts packed]: a step that begins with a placement first packs the
// segments it starts with, so that their crumbs are budget its arena can have; bytes kept.
TEST(Evacuation, AStepWithAPlacementStartsPacked) {
  Runtime rt(crumbs(true));
  const Tensor c1 = rt.constant(vec(256), iota(256, 1).data());
  const Tensor c2 = rt.constant(vec(256), iota(256, 1000).data());
  ASSERT_EQ(rt.stats().memory.reserved, 3072u);  // 512 bytes free beside each
  AllocationSequence seq;
  seq.allocations = {{.bytes = 2048, .start = 0, .end = 1}};
  StepOptions step;
  step.placement = std::make_shared<const Placement>(place_allocations(seq));
  rt.begin_step(step);
  EXPECT_EQ(rt.stats().evacuation_bytes, 2048u);
  const Tensor y = rt.call1(testing::concat(), {c1, c2});  // 2 KiB, at its place
  EXPECT_EQ(rt.stats().memory.placed_allocations, 1u);
  EXPECT_EQ(rt.stats().memory.placement_misses, 0u);
  EXPECT_LE(rt.stats().memory.peak_reserved, 4096u);
  rt.end_step();
  EXPECT_EQ(read(rt, c1), iota(256, 1));
  EXPECT_EQ(read(rt, c2), iota(256, 1000));
}

}  // namespace
}  // namespace remat
