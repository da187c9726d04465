// libcudart opened at run time (Note [cudart opened, not linked]): what a failed open reports,
// and that the toolkit's own library opens with every function the CudaApi calls.
#include "runtime/cuda/cudart_library.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "remat/cuda_api.h"
#include "remat/system_cuda.h"

namespace remat::detail {
namespace {

using ::testing::HasSubstr;

TEST(CudartLibrary, AMissingLibraryNamesEveryFileTriedAndLeavesNoFunction) {
  const CudartLibrary c =
      open_cudart({"libremat-no-such-cudart.so.1", "/nonexistent/libcudart.so"});
  EXPECT_FALSE(c.loaded);
  EXPECT_EQ(c.malloc, nullptr);
  EXPECT_THAT(c.error, HasSubstr("libremat-no-such-cudart.so.1"));
  EXPECT_THAT(c.error, HasSubstr("/nonexistent/libcudart.so"));
}

TEST(CudartLibrary, TheToolkitsLibraryOpensWithEveryFunction) {
  const std::vector<std::string> names = cudart_names();
  ASSERT_FALSE(names.empty());
  EXPECT_THAT(names.front(), HasSubstr("libcudart.so."));
  const CudartLibrary& c = cudart();
  ASSERT_TRUE(c.loaded) << c.error;
  EXPECT_NE(c.get_driver_entry_point_by_version, nullptr);
  EXPECT_NE(c.memcpy_async, nullptr);
}

TEST(CudartLibrary, TheRuntimeApiAnswersThroughIt) {
  // With or without a GPU the call returns: a count, or an error that counts as no device.
  std::shared_ptr<CudaApi> api = cuda_runtime_api();
  ASSERT_NE(api, nullptr);
  int count = -1;
  const CudaResult r = api->device_count(&count);
  if (r.ok()) {
    EXPECT_GE(count, 0);
    EXPECT_EQ(cuda_device_available(api.get()), count > 0);
  } else {
    EXPECT_FALSE(cuda_device_available(api.get()));
    EXPECT_STRNE(r.message, "");
  }
}

}  // namespace
}  // namespace remat::detail
