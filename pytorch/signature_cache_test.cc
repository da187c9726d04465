// Note [Signatures forgotten]: the cache stays bounded on signatures without end, and what a
// program keeps using is never forgotten.
#include "pytorch/detail/signature_cache.h"

#include <gtest/gtest.h>

#include <string>

namespace remat::torch_backend::detail {
namespace {

TEST(SignatureCache, StaysBoundedAndKeepsWhatIsInUse) {
  SignatureCache<int> cache(4);
  cache["step"] = 7;  // a signature every step uses
  for (int i = 0; i < 1000; ++i) {
    cache.insert_or_assign("shape " + std::to_string(i), i);  // one new signature per step
    ASSERT_LE(cache.size(), 8u);
    int* used = cache.find("step");
    ASSERT_NE(used, nullptr) << "forgotten after " << i << " new signatures";
    EXPECT_EQ(*used, 7);
  }
  EXPECT_GT(cache.forgotten(), 900u);
  EXPECT_EQ(cache.find("shape 0"), nullptr);
  ASSERT_NE(cache.find("shape 999"), nullptr);
  EXPECT_EQ(*cache.find("shape 999"), 999);
}

TEST(SignatureCache, AFoundOldEntryKeepsItsValue) {
  SignatureCache<std::string> cache(2);
  cache.insert_or_assign("a", "first");
  cache.insert_or_assign("b", "second");
  cache.insert_or_assign("c", "third");  // a and b are the old generation now
  ASSERT_NE(cache.find("a"), nullptr);
  EXPECT_EQ(*cache.find("a"), "first");
  EXPECT_EQ(cache["b"], "second");
  EXPECT_EQ(cache["new"], "");
}

}  // namespace
}  // namespace remat::torch_backend::detail
