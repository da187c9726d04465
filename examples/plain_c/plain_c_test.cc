// The worked example of docs/integrating.md: the plain-C loop's own kernels, moved into remat
// (matmul_backward adding into the parameter gradients through call_accumulate), train to the
// same bits as the loop on its own buffers, at 0.5 and 0.3 of the unconstrained peak, under
// every policy that fits there.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "examples/plain_c/model.h"
#include "remat/errors.h"
#include "remat/step_driver.h"

namespace plain_c {
namespace {

constexpr int kSteps = 6;

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(PlainCTest, EveryPolicyThatFitsTrainsToTheReferenceBits) {
  const Config config;
  ReferenceLoop reference(config);
  for (int s = 0; s < kSteps; ++s) reference.step(s);
  RematLoop loop(config);
  const std::size_t peak = remat::measure_unconstrained_peak(loop, {}, kSteps);
  std::vector<std::string> policies = {"auto", "hinted"};
  for (const std::string& p : remat::eviction_policy_names())
    if (p != "hinted") policies.push_back(p);
  int fitted_tight = 0;
  for (const double fraction : {0.5, 0.3}) {
    for (const std::string& policy : policies) {
      SCOPED_TRACE(policy + " at " + std::to_string(fraction));
      remat::StepDriverOptions options;
      options.runtime.budget = static_cast<std::size_t>(fraction * static_cast<double>(peak));
      options.policy = policy;
      options.planners = {"mincut", "chen", "twremat"};
      options.plan_time_limit = 1;
      remat::StepDriver driver(loop, options);
      try {
        for (int s = 0; s < kSteps; ++s) driver.run(s);
      } catch (const remat::OutOfMemoryError& e) {
        EXPECT_NE(policy, "dtr") << "DTR must fit: " << e.what();
        continue;
      } catch (const remat::ThrashError&) {
        continue;
      }
      const remat::RuntimeStats stats = driver.runtime().stats();
      EXPECT_LE(stats.memory.peak_reserved, options.runtime.budget);
      EXPECT_GT(stats.evictions, 0u);
      EXPECT_TRUE(same_bits(RematLoop::losses(driver.state()), reference.losses()));
      const auto params = RematLoop::parameters(driver.runtime(), driver.state());
      ASSERT_EQ(params.size(), reference.parameters().size());
      for (std::size_t i = 0; i < params.size(); ++i)
        EXPECT_TRUE(same_bits(params[i], reference.parameters()[i])) << "parameter " << i;
      if (fraction < 0.4) ++fitted_tight;
    }
  }
  EXPECT_GT(fitted_tight, 0) << "nothing fit at 0.3 of the peak";
}

// The debugging options a port is checked with (docs/integrating.md, section 5): outputs
// poisoned before each kernel and inputs hashed around it. The example's kernels write every
// output byte and no input, so the run is still bitwise.
TEST(PlainCTest, TheKernelsPassTheDebuggingChecks) {
  const Config config;
  ReferenceLoop reference(config);
  for (int s = 0; s < 2; ++s) reference.step(s);
  RematLoop loop(config);
  remat::StepDriverOptions options;
  options.policy = "dtr";
  options.runtime.budget = static_cast<std::size_t>(
      0.3 * static_cast<double>(remat::measure_unconstrained_peak(loop, {}, 2)));
  options.runtime.poison_outputs = true;
  options.runtime.check_inputs = true;
  remat::StepDriver driver(loop, options);
  for (int s = 0; s < 2; ++s) driver.run(s);
  EXPECT_GT(driver.runtime().stats().recomputations, 0u);
  EXPECT_TRUE(same_bits(RematLoop::losses(driver.state()), reference.losses()));
}

}  // namespace
}  // namespace plain_c
