// The parameters of the property tests that run every eviction policy in both accountings.
#ifndef REMAT_TESTS_SUPPORT_POLICY_CONFIGS_H_
#define REMAT_TESTS_SUPPORT_POLICY_CONFIGS_H_

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdlib>
#include <string>
#include <vector>

#include "remat/runtime.h"

namespace remat::testing {

struct PolicyConfig {
  std::string policy;
  Accounting accounting;
};

// Every policy of eviction_policy_names(), in logical and in allocator accounting.
inline std::vector<PolicyConfig> all_policy_configs() {
  std::vector<PolicyConfig> out;
  for (const std::string& p : eviction_policy_names()) {
    out.push_back({p, Accounting::kLogical});
    out.push_back({p, Accounting::kAllocator});
  }
  return out;
}

// A run's peak in what `accounting` caps: allocated bytes (logical) or reserved ones.
inline std::size_t peak_in(const RuntimeStats& stats, Accounting accounting) {
  return accounting == Accounting::kLogical ? stats.memory.peak_allocated
                                            : stats.memory.peak_reserved;
}

// Programs per configuration: REMAT_PROPERTY_TRIALS where set, else `fallback`.
inline int property_trials(int fallback) {
  const char* env = std::getenv("REMAT_PROPERTY_TRIALS");
  return env != nullptr && std::atoi(env) > 0 ? std::atoi(env) : fallback;
}

// "dtr_logical", "lru_allocator", ...: the test names' suffixes.
inline std::string policy_config_name(const ::testing::TestParamInfo<PolicyConfig>& info) {
  return info.param.policy +
         (info.param.accounting == Accounting::kLogical ? "_logical" : "_allocator");
}

}  // namespace remat::testing

#endif  // REMAT_TESTS_SUPPORT_POLICY_CONFIGS_H_
