// Issue 32, item 1: segments of the virtual-memory source are unmapped when released, and
// unmapping does not wait for the device as cudaFree does. A segment given back by
// release_cached (a lowered budget, a device out of memory) while a kernel queued before its
// tensors were freed still writes them must wait for that kernel first.
#include <gtest/gtest.h>

#include <memory>

#include "remat/caching_allocator.h"
#include "remat/runtime.h"
#include "runtime/cuda/simulated_cuda.h"
#include "tests/support/simulated_device_ops.h"
#include "tests/support/test_ops.h"

namespace remat {
namespace {

using testing::vec;

TEST(VirtualMemorySegments, ReleasingOneWaitsForTheKernelsThatUseIt) {
  auto sim = std::make_shared<SimulatedCuda>(SimulatedCudaOptions{.granularity = 1 << 20});
  RuntimeOptions o = on_sim(sim, SIZE_MAX);
  o.allocator.expandable_segments = true;
  Runtime rt(o);
  ASSERT_STREQ(static_cast<CachingAllocator&>(rt.memory()).source().name(), "cuda-vmm");
  const Tensor x = rt.constant(vec(4 << 20), testing::iota(4 << 20).data());  // 16 MiB
  Tensor y = rt.call1(on_device(sim, testing::affine(2, 0), 1e9), {x});       // a second
  const std::size_t reserved = rt.stats().memory.reserved;
  y.reset();                // freed in stream order: the kernel still writes it
  rt.set_budget(18 << 20);  // below what is reserved: y's segment goes back
  EXPECT_LT(rt.stats().memory.reserved, reserved);
  sim->synchronize_all();
  EXPECT_TRUE(sim->invalid_accesses().empty()) << sim->invalid_accesses()[0].what;
  EXPECT_EQ(testing::read(rt, x)[1], 2.0f);
}

}  // namespace
}  // namespace remat
