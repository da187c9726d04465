// The parameters of the property tests that run every eviction policy in both accountings.
#ifndef REMAT_TESTS_SUPPORT_POLICY_CONFIGS_H_
#define REMAT_TESTS_SUPPORT_POLICY_CONFIGS_H_

#include <gtest/gtest.h>

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

// "dtr_logical", "lru_allocator", ...: the test names' suffixes.
inline std::string policy_config_name(const ::testing::TestParamInfo<PolicyConfig>& info) {
  return info.param.policy +
         (info.param.accounting == Accounting::kLogical ? "_logical" : "_allocator");
}

}  // namespace remat::testing

#endif  // REMAT_TESTS_SUPPORT_POLICY_CONFIGS_H_
