// PinnedHostPool and CudaHostCopies alone, on the simulated device: chunks reserved once and
// reused, the capacity kept, blocks reused only after their copies, and copies on their own
// streams that overlap the kernels without racing them. (host_tier_test runs the runtime's
// host tier on top of them.)
#include "runtime/cuda/pinned_host_pool.h"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <vector>

#include "runtime/cuda/cuda_host_copies.h"
#include "runtime/cuda/simulated_cuda.h"

namespace remat::detail {
namespace {

constexpr std::size_t kChunk = std::size_t{1} << 20;

TEST(PinnedHostPoolTest, ReservesChunksOnceAndReusesFreedBlocks) {
  auto sim = std::make_shared<SimulatedCuda>();
  PinnedHostPool pool(sim, 4 * kChunk, kChunk);
  void* a = pool.allocate(1000);
  void* b = pool.allocate(kChunk / 2);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(pool.chunks(), 1u);  // both from the first chunk
  pool.deallocate(a, nullptr);
  void* c = pool.allocate(900);
  EXPECT_EQ(c, a) << "a freed block is reused before reserving more";
  const std::size_t calls = sim->calls(SimulatedCall::kMallocHost);
  for (int i = 0; i < 100; ++i) pool.deallocate(pool.allocate(kChunk / 4), nullptr);
  EXPECT_EQ(sim->calls(SimulatedCall::kMallocHost), calls) << "no page-locking per request";
  EXPECT_EQ(pool.reserved_bytes(), kChunk);
}

TEST(PinnedHostPoolTest, KeepsItsCapacity) {
  auto sim = std::make_shared<SimulatedCuda>();
  PinnedHostPool pool(sim, 2 * kChunk, kChunk);
  void* big = pool.allocate(kChunk + 1);  // a chunk of its own, larger than the default
  ASSERT_NE(big, nullptr);
  EXPECT_EQ(pool.allocate(kChunk), nullptr) << "past the capacity";
  void* small = pool.allocate(kChunk - 2 * PinnedHostPool::kAlignment);
  EXPECT_NE(small, nullptr) << "what is left of the capacity still serves";
  EXPECT_LE(pool.reserved_bytes(), 2 * kChunk);
}

TEST(PinnedHostPoolTest, ABlockIsReusedOnlyAfterItsLastCopy) {
  auto sim = std::make_shared<SimulatedCuda>();
  CudaStream compute = nullptr, copies = nullptr;
  ASSERT_TRUE(sim->stream_create(&compute).ok());
  ASSERT_TRUE(sim->stream_create(&copies).ok());
  void* device = nullptr;
  ASSERT_TRUE(sim->malloc(&device, kChunk).ok());
  PinnedHostPool pool(sim, kChunk, kChunk);
  void* host = pool.allocate(kChunk);
  ASSERT_NE(host, nullptr);
  const DeviceRange d{device, kChunk};
  ASSERT_TRUE(sim->launch(copies, 1e6, {}, std::span(&d, 1)).ok());  // a long write first
  ASSERT_TRUE(sim->memcpy_async(host, device, kChunk, CudaCopy::kDeviceToHost, copies).ok());
  CudaEvent done = nullptr;
  ASSERT_TRUE(sim->event_create(&done, false).ok());
  ASSERT_TRUE(sim->event_record(done, copies).ok());
  pool.deallocate(host, done);
  void* again = pool.allocate(kChunk);  // the only block: it waits for the copy
  EXPECT_EQ(again, host);
  EXPECT_GE(sim->now(), 1e6);
  // Reused on another stream, it races with nothing.
  ASSERT_TRUE(sim->memcpy_async(again, device, kChunk, CudaCopy::kDeviceToHost, compute).ok());
  ASSERT_TRUE(sim->stream_synchronize(compute).ok());
  EXPECT_TRUE(sim->races().empty());
}

// A storage's round trip through CudaHostCopies beside a kernel: its bytes come back, the
// copies overlap the kernel, and nothing races.
TEST(CudaHostCopiesTest, ARoundTripOverlapsTheKernelsAndComesBackBitForBit) {
  auto sim = std::make_shared<SimulatedCuda>(SimulatedCudaOptions{.copy_bytes_per_ns = 1});
  CudaStream compute = nullptr;
  ASSERT_TRUE(sim->stream_create(&compute).ok());
  void *x = nullptr, *y = nullptr, *other = nullptr;
  const std::size_t n = 64 << 10;
  for (void** p : {&x, &y, &other}) ASSERT_TRUE(sim->malloc(p, n).ok());
  const DeviceRange rx{x, n}, ro{other, n};
  ASSERT_TRUE(sim->launch(compute, 1000, {}, std::span(&rx, 1),
                          [x, n] {
                            for (std::size_t i = 0; i < n; ++i)
                              static_cast<unsigned char*>(x)[i] = i * 7 % 251;
                          })
                  .ok());
  CudaHostCopies copies(sim, compute, 1 << 20);
  ASSERT_TRUE(copies.copy_out(2, other, n));  // the pool's chunk is reserved now, not below
  copies.drop(2);
  ASSERT_TRUE(sim->stream_synchronize(compute).ok());
  const double start = sim->now();
  ASSERT_TRUE(copies.copy_out(1, x, n));
  // A kernel on other memory runs while the copy does.
  ASSERT_TRUE(sim->launch(compute, 50e3, {}, std::span(&ro, 1)).ok());
  copies.order_compute_after(1);  // x is freed next: nothing may write it before the copy
  const DeviceRange ry{y, n};
  ASSERT_TRUE(sim->launch(compute, 1000, {}, std::span(&rx, 1)).ok());  // x reused
  copies.copy_in(1, y);
  EXPECT_FALSE(copies.holds(1));
  copies.order_compute_after(1);
  std::vector<unsigned char> got(n);
  ASSERT_TRUE(sim->launch(compute, 1000, std::span(&ry, 1), {},
                          [&got, y, n] { std::memcpy(got.data(), y, n); })
                  .ok());
  ASSERT_TRUE(sim->stream_synchronize(compute).ok());
  for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(got[i], i * 7 % 251) << i;
  EXPECT_TRUE(sim->races().empty()) << sim->races().front().what;
  // Each copy takes 67.5 us (2 us and a byte a ns); one after the other, the copies and the
  // kernels would take 188 us, and the copy out runs beside the 50 us kernel instead.
  const double copy = 2000 + static_cast<double>(n);
  EXPECT_LT(sim->now() - start, 3000 + 2 * copy + 10e3);
}

// Without the compute stream's wait the simulated device sees the kernel write x while the
// copy out reads it: what order_compute_after prevents.
TEST(CudaHostCopiesTest, WithoutTheComputeWaitTheCopyRacesTheKernel) {
  auto sim = std::make_shared<SimulatedCuda>();
  CudaStream compute = nullptr;
  ASSERT_TRUE(sim->stream_create(&compute).ok());
  void* x = nullptr;
  const std::size_t n = 64 << 10;
  ASSERT_TRUE(sim->malloc(&x, n).ok());
  CudaHostCopies copies(sim, compute, 1 << 20);
  ASSERT_TRUE(copies.copy_out(1, x, n));
  const DeviceRange rx{x, n};
  ASSERT_TRUE(sim->launch(compute, 1000, {}, std::span(&rx, 1)).ok());
  ASSERT_TRUE(sim->stream_synchronize(compute).ok());
  ASSERT_TRUE(sim->stream_synchronize(copies.to_host_stream()).ok());
  EXPECT_FALSE(sim->races().empty());
}

}  // namespace
}  // namespace remat::detail
