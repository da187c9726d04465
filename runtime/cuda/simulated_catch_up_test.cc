// Note [Host code run as a kernel]: SimulatedCuda::catch_up runs the work a new launch on a
// stream would start after, and nothing else, and that work is still checked for races.
#include <gtest/gtest.h>

#include <cstring>

#include "runtime/cuda/simulated_cuda.h"
#include "runtime/cuda/simulated_cuda_testing.h"

namespace remat {
namespace {

using sim_testing::device_alloc;
using sim_testing::make_stream;

// A copy enqueued on the stream ends before new work on it starts: catch_up runs it now,
// without moving the clock, so host code standing in for the next kernel reads its bytes.
TEST(SimulatedCatchUpTest, RunsTheStreamsPendingCopyWithoutTakingTime) {
  SimulatedCuda sim;
  char* a = device_alloc(sim, 64);
  char* b = device_alloc(sim, 64);
  CudaStream s = make_stream(sim);
  std::memset(a, 'x', 64);
  std::memset(b, 0, 64);
  ASSERT_TRUE(sim.memcpy_async(b, a, 64, CudaCopy::kDeviceToDevice, s).ok());
  ASSERT_EQ(b[0], 0);
  const double before = sim.now();
  sim.catch_up(s);  // everything due
  EXPECT_EQ(b[63], 'x');
  EXPECT_EQ(sim.now(), before);
  EXPECT_EQ(sim.pending_work(), 1u);  // still pending, for race detection
  EXPECT_EQ(sim.host_waits(), 0u);
  sim.synchronize_all();  // its body does not run twice
  EXPECT_EQ(b[0], 'x');
  EXPECT_EQ(sim.host_waits(), 1u);
}

// Work on another stream that nothing orders before the new work is left to run at its own
// end; once an event orders it, catch_up runs it too.
TEST(SimulatedCatchUpTest, LeavesWorkOnOtherStreamsUntilAnEventOrdersIt) {
  SimulatedCuda sim;
  char* a = device_alloc(sim, 64);
  char* b = device_alloc(sim, 64);
  CudaStream compute = make_stream(sim);
  CudaStream copies = make_stream(sim);
  std::memset(a, 'y', 64);
  std::memset(b, 0, 64);
  ASSERT_TRUE(sim.memcpy_async(b, a, 64, CudaCopy::kDeviceToDevice, copies).ok());
  sim.catch_up(compute);
  EXPECT_EQ(b[0], 0);
  CudaEvent copied = sim_testing::make_event(sim);
  ASSERT_TRUE(sim.event_record(copied, copies).ok());
  ASSERT_TRUE(sim.stream_wait_event(compute, copied).ok());
  sim.catch_up(compute);
  EXPECT_EQ(b[0], 'y');
}

// A caught-up item stays pending: a write on another stream that nothing ordered after it is
// still a race.
TEST(SimulatedCatchUpTest, ACaughtUpItemStillRacesWithUnorderedWork) {
  SimulatedCuda sim;
  char* a = device_alloc(sim, 64);
  char* b = device_alloc(sim, 64);
  CudaStream s = make_stream(sim);
  CudaStream other = make_stream(sim);
  ASSERT_TRUE(sim.memcpy_async(b, a, 64, CudaCopy::kDeviceToDevice, s).ok());
  sim.catch_up(s);  // everything due
  const DeviceRange writes[] = {{b, 64}};
  ASSERT_TRUE(sim.launch(other, 1000, {}, writes).ok());
  EXPECT_EQ(sim.races().size(), 1u);
}

// Given the kernel's memory, only the due work as far as the last that touches it runs: a
// copy into memory the kernel does not touch completes at its own time.
TEST(SimulatedCatchUpTest, RunsOnlyAsFarAsTheLastWorkThatTouchesTheKernelsMemory) {
  SimulatedCuda sim;
  char* a = device_alloc(sim, 64);
  char* b = device_alloc(sim, 64);
  char* c = device_alloc(sim, 64);
  CudaStream s = make_stream(sim);
  std::memset(a, 'x', 64);
  std::memset(b, 0, 64);
  std::memset(c, 0, 64);
  ASSERT_TRUE(sim.memcpy_async(b, a, 64, CudaCopy::kDeviceToDevice, s).ok());
  ASSERT_TRUE(sim.memcpy_async(c, a, 64, CudaCopy::kDeviceToDevice, s).ok());
  const DeviceRange kernel_reads[] = {{b, 64}};
  sim.catch_up(s, kernel_reads);
  EXPECT_EQ(b[0], 'x');
  EXPECT_EQ(c[0], 0) << "the later copy the kernel does not read waits for its time";
  const DeviceRange later[] = {{c, 64}};
  sim.catch_up(s, later);
  EXPECT_EQ(c[0], 'x');
}

}  // namespace
}  // namespace remat
