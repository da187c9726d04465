// The plan cache (remat/plan_cache.h).
#include "remat/plan_cache.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>

namespace remat {
namespace {

// Note [Reusing plans across shapes]: the exact key first; else the nearest key, or with
// Reuse::kNoLarger the nearest among keys no larger in any entry; keys of another length
// never match.
TEST(PlanCacheTest, FindsExactNearestAndNoLargerPlans) {
  PlanCache cache;
  auto plan = [](std::string source) {
    auto h = std::make_shared<StepHints>();
    h->source = std::move(source);
    return h;
  };
  EXPECT_EQ(cache.find({4, 64}).hints, nullptr);
  cache.insert({4, 64}, plan("64"));
  cache.insert({4, 128}, plan("128"));
  cache.insert({8, 32}, plan("8x32"));
  PlanCache::Found f = cache.find({4, 128});
  ASSERT_NE(f.hints, nullptr);
  EXPECT_TRUE(f.exact);
  EXPECT_EQ(f.hints->source, "128");
  f = cache.find({4, 120});
  EXPECT_FALSE(f.exact);
  EXPECT_EQ(f.hints->source, "128");
  f = cache.find({4, 120}, PlanCache::Reuse::kNoLarger);
  ASSERT_NE(f.hints, nullptr);
  EXPECT_EQ(f.hints->source, "64");
  EXPECT_EQ(f.key, (PlanCache::Key{4, 64}));
  EXPECT_EQ(cache.find({4, 40}, PlanCache::Reuse::kNoLarger).hints, nullptr);
  EXPECT_EQ(cache.find({8, 200}, PlanCache::Reuse::kNoLarger).hints->source, "128");
  EXPECT_EQ(cache.find({8, 40}, PlanCache::Reuse::kNoLarger).hints->source, "8x32");
  EXPECT_EQ(cache.find({4}).hints, nullptr);
  EXPECT_EQ(cache.size(), 3u);
}

}  // namespace
}  // namespace remat
