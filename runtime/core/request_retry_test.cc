// Note [Running a request once more]: a request that runs out of memory because of the order
// its walk locked inputs in runs again from the emptiest state, and fits.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <stdexcept>
#include <vector>

#include "remat/runtime.h"
#include "tests/support/test_ops.h"

namespace remat {
namespace {

using testing::iota;
using testing::logical;
using testing::read;
using testing::vec;

constexpr std::int64_t kFloats = 100;  // 400 bytes a tensor
constexpr std::size_t kBytes = kFloats * sizeof(float);

// affine(2, 0) that declares twice its input's bytes of scratch.
OpPtr doubled_with_scratch() {
  return with_scratch(testing::affine(2, 0), [](SpecList in) { return 2 * in[0].bytes(); });
}

// c = op(w, g) where w's producer needs 2 tensors' worth of scratch; run with w evicted
// and g resident, under room for 3 tensors beside the constant.
std::vector<float> run_pair(const OpPtr& op, std::size_t budget, RuntimeStats* stats) {
  Runtime rt(logical(budget));
  const Tensor x = rt.constant(vec(kFloats), iota(kFloats).data());
  Tensor w = rt.call1(doubled_with_scratch(), {x});  // scratch 800 + output 400
  const Tensor g = rt.call1(testing::affine(3, 1), {x});
  if (budget != SIZE_MAX) {
    EXPECT_TRUE(rt.evict(w));
  }
  // Locking g first and recomputing w needs g + 800 + 400: one tensor too many. Making w
  // first (g evicted) and g after needs 3 tensors at most.
  const Tensor c = rt.call1(op, {w, g});
  *stats = rt.stats();
  return read(rt, c);
}

TEST(RequestRetry, AnInputThatNeedsScratchIsRecomputedBeforeTheOthersAreLocked) {
  RuntimeStats unconstrained, budgeted;
  const std::vector<float> expected = run_pair(testing::combine(), SIZE_MAX, &unconstrained);
  const std::size_t budget = kBytes + 3 * kBytes;  // the constant, and room for 3 tensors
  const std::vector<float> got = run_pair(testing::combine(), budget, &budgeted);
  ASSERT_EQ(got.size(), expected.size());
  EXPECT_EQ(std::memcmp(got.data(), expected.data(), kBytes), 0);
  EXPECT_EQ(budgeted.retried_requests, 1u);
  EXPECT_EQ(unconstrained.retried_requests, 0u);
  EXPECT_LE(budgeted.memory.peak_allocated, budget);
}

// Where the bytes do not exist the retries fail too: concat's output is two tensors, so it
// needs w, g and 800 bytes, whatever the order. The error names the op and what it held
// (RuntimeTest.InfeasibleBudgetRaisesOutOfMemoryAndRuntimeStaysUsable: still usable after).
TEST(RequestRetry, AnInfeasibleRequestStillFailsAfterItsRetries) {
  RuntimeStats stats;
  try {
    run_pair(testing::concat(), kBytes + 3 * kBytes, &stats);
    FAIL() << "expected OutOfMemoryError";
  } catch (const OutOfMemoryError& e) {
    EXPECT_EQ(e.info().op, "concat");
    EXPECT_EQ(e.info().pinned, kBytes);
    // The figures of the first failure: g locked while w was recomputed beside its producer's
    // 800 bytes of declared scratch.
    EXPECT_EQ(e.info().locked, kBytes);
    EXPECT_EQ(e.info().untracked, 2 * kBytes);
  }
}

// A first run whose kernel started and then ran out of memory (its undeclared scratch) is
// not run again: it may have drawn random numbers or written constants. Its input, unlocked
// by the failure, would have been evictable, so a retry was possible.
TEST(RequestRetry, AFirstRunWhoseKernelFailedIsNotRunAgain) {
  Runtime rt(logical(4 * kBytes));
  const Tensor x = rt.constant(vec(kFloats), iota(kFloats).data());
  const Tensor y = rt.call1(testing::affine(2, 0), {x});
  auto entered = std::make_shared<int>(0);
  const OpPtr greedy = make_op(
      "greedy", [](SpecList in) { return Outputs{{in[0]}}; },
      [entered](const KernelContext& k) {
        ++*entered;
        if (k.scratch(3 * kBytes) == nullptr) throw std::runtime_error("no scratch");
      },
      testing::numel_cost);
  EXPECT_THROW(rt.call1(greedy, {y}), OutOfMemoryError);
  EXPECT_EQ(*entered, 1);
  EXPECT_EQ(rt.stats().retried_requests, 0u);
}

}  // namespace
}  // namespace remat
