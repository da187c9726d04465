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

// A stand-in libcudart that keeps the thread's last error as the real one does: every call
// that returns an error, not-ready included, records it; cudaGetLastError returns and clears
// it.
thread_local cudaError_t last_error = cudaSuccess;
cudaError_t record(cudaError_t e) {
  if (e != cudaSuccess) last_error = e;
  return e;
}

CudartLibrary stand_in() {
  CudartLibrary c;
  c.loaded = true;
  c.get_error_string = [](cudaError_t) -> const char* { return "stand-in"; };
  c.get_last_error = []() {
    const cudaError_t e = last_error;
    last_error = cudaSuccess;
    return e;
  };
  c.event_query = [](cudaEvent_t) { return record(cudaErrorNotReady); };
  c.malloc = [](void**, std::size_t) { return record(cudaErrorMemoryAllocation); };
  return c;
}

// Issue 32, item 6: a not-ready event query left cudaErrorNotReady as the thread's last
// error, and the next kernel's launch check reported it as that kernel's failure.
TEST(CudartLibrary, NotReadyIsNotLeftForTheNextLaunchCheck) {
  const CudartLibrary library = stand_in();
  const std::shared_ptr<CudaApi> api = cuda_api_over(library);
  EXPECT_EQ(api->event_query(nullptr).status, CudaStatus::kNotReady);
  EXPECT_TRUE(api->last_launch_error().ok()) << api->last_launch_error().message;
  void* p = nullptr;
  EXPECT_EQ(api->malloc(&p, 1).status, CudaStatus::kOutOfMemory);
  EXPECT_TRUE(api->last_launch_error().ok()) << "a failed call's error goes to its caller only";
}

TEST(CudartLibrary, EveryCallOfALibraryThatDidNotOpenSaysWhy) {
  const CudartLibrary library = open_cudart({"libremat-no-such-cudart.so.1"});
  const std::shared_ptr<CudaApi> api = cuda_api_over(library);
  int count = 0;
  const CudaResult r = api->device_count(&count);
  EXPECT_EQ(r.status, CudaStatus::kError);
  EXPECT_THAT(r.message, HasSubstr("libremat-no-such-cudart.so.1"));
  EXPECT_FALSE(api->last_launch_error().ok());
  EXPECT_FALSE(cuda_device_available(api.get()));
}

}  // namespace
}  // namespace remat::detail
