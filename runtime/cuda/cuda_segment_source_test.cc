#include "runtime/cuda/cuda_segment_source.h"

#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <stdexcept>
#include <string>

#include "remat/errors.h"
#include "remat/system_cuda.h"
#include "runtime/cuda/cuda_device.h"
#include "runtime/cuda/simulated_cuda.h"

namespace remat {
namespace {

constexpr std::size_t kGranule = std::size_t{64} << 10;
constexpr int kDevice = 1;  // not 0, so that a source using the wrong device shows

// A two-device simulator with `kDevice` current: the sources assume the caller made their
// device current, as the runtime does.
std::shared_ptr<SimulatedCuda> simulator(std::size_t capacity) {
  auto sim = std::make_shared<SimulatedCuda>(
      SimulatedCudaOptions{.devices = 2, .capacity = capacity, .granularity = kGranule});
  EXPECT_TRUE(sim->set_device(kDevice).ok());
  return sim;
}

std::size_t round_up(std::size_t bytes, std::size_t g) { return (bytes + g - 1) / g * g; }

TEST(CudaSegmentSource, ReservesAndReleasesDeviceMemory) {
  auto sim = simulator(std::size_t{1} << 30);
  CudaSegmentSource source(sim, kDevice);
  EXPECT_STREQ(source.name(), "cuda");
  EXPECT_FALSE(source.host_accessible());
  EXPECT_FALSE(source.lazily_committed());
  void* p = source.reserve(1000);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(sim->live_allocations(), 1u);
  EXPECT_GE(sim->device_bytes_in_use(kDevice), 1000u);
  source.release(p, 1000);
  EXPECT_EQ(sim->live_allocations(), 0u);
  EXPECT_EQ(sim->device_bytes_in_use(kDevice), 0u);
}

TEST(CudaSegmentSource, OutOfMemoryIsARefusal) {
  auto sim = simulator(std::size_t{1} << 20);
  CudaSegmentSource source(sim, kDevice);
  EXPECT_EQ(source.reserve(std::size_t{2} << 20), nullptr);  // more than the device has
  sim->inject(SimulatedCall::kMalloc, SimulatedCuda::out_of_memory());
  EXPECT_EQ(source.reserve(16), nullptr);
  EXPECT_EQ(sim->live_allocations(), 0u);
  EXPECT_NE(source.reserve(16), nullptr);  // a refusal leaves the source usable
}

TEST(CudaSegmentSource, OtherMallocErrorsThrowCudaError) {
  auto sim = simulator(std::size_t{1} << 30);
  CudaSegmentSource source(sim, kDevice);
  sim->inject(SimulatedCall::kMalloc, SimulatedCuda::illegal_address());
  try {
    source.reserve(1024);
    FAIL() << "no CudaError";
  } catch (const CudaError& e) {
    EXPECT_EQ(e.call(), "cudaMalloc");
    EXPECT_EQ(e.code(), SimulatedCuda::illegal_address().code);
    EXPECT_EQ(e.cuda_message(), SimulatedCuda::illegal_address().message);
    EXPECT_EQ(e.device(), kDevice);
  }
}

TEST(CudaSegmentSource, StickyFaultIsAnErrorNotARefusal) {
  auto sim = simulator(std::size_t{1} << 30);
  CudaSegmentSource source(sim, kDevice);
  CudaStream stream = nullptr;
  ASSERT_TRUE(sim->stream_create(&stream).ok());
  sim->inject_sticky_fault();
  sim->launch(stream, 1000, {}, {});
  sim->synchronize_all();
  EXPECT_THROW(source.reserve(1024), CudaError);
}

TEST(CudaSegmentSource, FailingFreeThrowsCudaError) {
  auto sim = simulator(std::size_t{1} << 30);
  CudaSegmentSource source(sim, kDevice);
  void* p = source.reserve(1024);
  ASSERT_NE(p, nullptr);
  sim->inject(SimulatedCall::kFree, SimulatedCuda::illegal_address());
  try {
    source.release(p, 1024);
    FAIL() << "no CudaError";
  } catch (const CudaError& e) {
    EXPECT_EQ(e.call(), "cudaFree");
    EXPECT_EQ(e.code(), SimulatedCuda::illegal_address().code);
    EXPECT_EQ(e.device(), kDevice);
  }
}

TEST(MakeCudaSegmentSource, FallsBackToCudaMallocWithoutVirtualMemory) {
  auto sim = simulator(std::size_t{1} << 30);
  EXPECT_STREQ(make_cuda_segment_source(sim, kDevice, /*expandable=*/false)->name(), "cuda");
  sim->inject(SimulatedCall::kVmmGranularity, SimulatedCuda::invalid_value());
  EXPECT_STREQ(make_cuda_segment_source(sim, kDevice, /*expandable=*/true)->name(), "cuda");
  auto source = make_cuda_segment_source(sim, kDevice, /*expandable=*/true);
  EXPECT_STREQ(source->name(), "cuda-vmm");
  EXPECT_TRUE(source->lazily_committed());
  EXPECT_FALSE(source->host_accessible());
  EXPECT_EQ(source->commit_granularity(), kGranule);
}

std::unique_ptr<SegmentSource> virtual_source(const std::shared_ptr<SimulatedCuda>& sim) {
  auto source = make_cuda_segment_source(sim, kDevice, /*expandable=*/true);
  EXPECT_STREQ(source->name(), "cuda-vmm");
  return source;
}

TEST(CudaVirtualSegmentSource, ReservesAnUnbackedRangeOfWholeGranules) {
  auto sim = simulator(std::size_t{1} << 30);
  auto source = virtual_source(sim);
  void* base = source->reserve(5 * kGranule + 1);  // 6 granules of address space
  ASSERT_NE(base, nullptr);
  EXPECT_EQ(sim->live_reservations(), 1u);
  EXPECT_EQ(sim->device_bytes_in_use(kDevice), 0u);
  EXPECT_TRUE(source->commit_prefix(base, 6 * kGranule));
  EXPECT_EQ(sim->device_bytes_in_use(kDevice), 6 * kGranule);
  EXPECT_THROW(source->commit_prefix(base, 7 * kGranule), std::invalid_argument);
}

TEST(CudaVirtualSegmentSource, MapsExactlyTheGranulesThePrefixNeeds) {
  auto sim = simulator(std::size_t{1} << 30);
  auto source = virtual_source(sim);
  void* base = source->reserve(16 * kGranule);
  ASSERT_TRUE(source->commit_prefix(base, 3 * kGranule));
  EXPECT_EQ(sim->device_bytes_in_use(kDevice), 3 * kGranule);
  EXPECT_EQ(sim->device_bytes_in_use(0), 0u);
  // A map call per granule, so that any suffix can be unmapped later.
  EXPECT_EQ(sim->calls(SimulatedCall::kMap), 3u);
  ASSERT_TRUE(source->commit_prefix(base, 5 * kGranule));
  EXPECT_EQ(sim->device_bytes_in_use(kDevice), 5 * kGranule);
  EXPECT_EQ(sim->calls(SimulatedCall::kMap), 5u);
  ASSERT_TRUE(source->commit_prefix(base, 5 * kGranule));
  EXPECT_EQ(sim->calls(SimulatedCall::kMap), 5u);
  EXPECT_EQ(sim->calls(SimulatedCall::kUnmap), 0u);
}

TEST(CudaVirtualSegmentSource, UnmapsTheTailWhenThePrefixShrinks) {
  auto sim = simulator(std::size_t{1} << 30);
  auto source = virtual_source(sim);
  void* base = source->reserve(16 * kGranule);
  ASSERT_TRUE(source->commit_prefix(base, 8 * kGranule));
  ASSERT_TRUE(source->commit_prefix(base, 2 * kGranule));
  EXPECT_EQ(sim->device_bytes_in_use(kDevice), 2 * kGranule);
  EXPECT_EQ(sim->calls(SimulatedCall::kUnmap), 6u);
  ASSERT_TRUE(source->commit_prefix(base, 0));
  EXPECT_EQ(sim->device_bytes_in_use(kDevice), 0u);
}

TEST(CudaVirtualSegmentSource, RefusesWhenTheDeviceIsFullAndKeepsWhatWasMapped) {
  auto sim = simulator(4 * kGranule);
  auto source = virtual_source(sim);
  void* base = source->reserve(16 * kGranule);
  ASSERT_TRUE(source->commit_prefix(base, 2 * kGranule));
  EXPECT_FALSE(source->commit_prefix(base, 6 * kGranule));
  EXPECT_EQ(sim->device_bytes_in_use(kDevice), 2 * kGranule);
  // The refusal left the reservation usable: it still grows as far as the device allows.
  EXPECT_TRUE(source->commit_prefix(base, 4 * kGranule));
  EXPECT_EQ(sim->device_bytes_in_use(kDevice), 4 * kGranule);
}

TEST(CudaVirtualSegmentSource, OtherMapErrorsThrowAndReleaseStillUnmapsAll) {
  auto sim = simulator(std::size_t{1} << 30);
  auto source = virtual_source(sim);
  void* base = source->reserve(16 * kGranule);
  ASSERT_TRUE(source->commit_prefix(base, 2 * kGranule));
  sim->inject(SimulatedCall::kMap, SimulatedCuda::illegal_address(), /*skip=*/1);
  try {
    source->commit_prefix(base, 6 * kGranule);
    FAIL() << "no CudaError";
  } catch (const CudaError& e) {
    EXPECT_EQ(e.call(), "cuMemMap");
    EXPECT_EQ(e.code(), SimulatedCuda::illegal_address().code);
    EXPECT_EQ(e.device(), kDevice);
  }
  EXPECT_EQ(sim->device_bytes_in_use(kDevice), 3 * kGranule);  // the granule before the error
  source->release(base, 16 * kGranule);
  EXPECT_EQ(sim->device_bytes_in_use(kDevice), 0u);
  EXPECT_EQ(sim->live_reservations(), 0u);
}

TEST(CudaVirtualSegmentSource, FailingUnmapThrowsCudaError) {
  auto sim = simulator(std::size_t{1} << 30);
  auto source = virtual_source(sim);
  void* base = source->reserve(16 * kGranule);
  ASSERT_TRUE(source->commit_prefix(base, 4 * kGranule));
  sim->inject(SimulatedCall::kUnmap, SimulatedCuda::illegal_address());
  try {
    source->commit_prefix(base, kGranule);
    FAIL() << "no CudaError";
  } catch (const CudaError& e) {
    EXPECT_EQ(e.call(), "cuMemUnmap");
  }
  source->release(base, 16 * kGranule);
  EXPECT_EQ(sim->device_bytes_in_use(kDevice), 0u);
}

TEST(CudaVirtualSegmentSource, ReleaseUnmapsEverythingAndFreesTheRange) {
  auto sim = simulator(std::size_t{1} << 30);
  auto source = virtual_source(sim);
  void* a = source->reserve(16 * kGranule);
  void* b = source->reserve(16 * kGranule);
  ASSERT_TRUE(source->commit_prefix(a, 7 * kGranule));
  ASSERT_TRUE(source->commit_prefix(b, 3 * kGranule));
  source->release(a, 16 * kGranule);
  EXPECT_EQ(sim->device_bytes_in_use(kDevice), 3 * kGranule);
  EXPECT_EQ(sim->live_reservations(), 1u);
  source->release(b, 16 * kGranule);
  EXPECT_EQ(sim->device_bytes_in_use(kDevice), 0u);
  EXPECT_EQ(sim->live_reservations(), 0u);
  EXPECT_THROW(source->commit_prefix(a, kGranule), std::invalid_argument);
}

TEST(CudaVirtualSegmentSource, MappedBytesFollowAnyPrefix) {
  std::mt19937_64 rng(20240611);
  const std::size_t granules = 64;
  const std::size_t capacity = 40 * kGranule;
  auto sim = simulator(capacity);
  auto source = virtual_source(sim);
  void* base = source->reserve(granules * kGranule);
  std::size_t committed = 0;
  std::uniform_int_distribution<std::size_t> bytes(0, granules * kGranule);
  for (int i = 0; i < 500; ++i) {
    const std::size_t prefix = bytes(rng);
    const bool fits = round_up(prefix, kGranule) <= capacity;
    EXPECT_EQ(source->commit_prefix(base, prefix), fits) << "prefix " << prefix;
    if (fits) committed = round_up(prefix, kGranule);
    ASSERT_EQ(sim->device_bytes_in_use(kDevice), committed) << "after prefix " << prefix;
  }
  source->release(base, granules * kGranule);
  EXPECT_EQ(sim->device_bytes_in_use(kDevice), 0u);
  EXPECT_EQ(sim->live_reservations(), 0u);
}

TEST(CudaDeviceAvailable, AsksTheApiForDevices) {
  auto sim = std::make_shared<SimulatedCuda>();
  EXPECT_TRUE(cuda_device_available(sim.get()));
  sim->inject(SimulatedCall::kDeviceCount, SimulatedCuda::invalid_device());
  EXPECT_FALSE(cuda_device_available(sim.get()));
}

// Issue 32, item 4: a driver older than the build's CUDA makes every device query fail; the
// reason, and the runtime's error, say which versions (not only "no usable device").
TEST(CudaDeviceAvailable, ADriverTooOldIsNamedWithBothVersions) {
  auto sim = std::make_shared<SimulatedCuda>(
      SimulatedCudaOptions{.driver_version = 12040, .runtime_version = 13000});
  EXPECT_FALSE(cuda_device_available(sim.get()));
  const std::string why = cuda_unavailable_reason(sim.get());
  EXPECT_NE(why.find("the CUDA driver supports CUDA 12.4; this build needs 13.0"),
            std::string::npos)
      << why;
  try {
    detail::CudaDevice::open(sim, 0, nullptr, false);
    FAIL() << "expected std::runtime_error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("supports CUDA 12.4"), std::string::npos) << e.what();
  }
  EXPECT_EQ(cuda_unavailable_reason(std::make_shared<SimulatedCuda>().get()), "");
}

// Without a device (no driver, or none present) every call of the CUDA runtime's api fails
// cleanly, and an expandable source falls back to cudaMalloc rather than failing.
TEST(CudaRuntimeApi, WithoutADeviceVirtualMemoryIsUnsupported) {
  if (cuda_device_available()) GTEST_SKIP() << "a CUDA device is present";
  std::shared_ptr<CudaApi> api = cuda_runtime_api();
  if (api == nullptr) GTEST_SKIP() << "built without CUDA";
  EXPECT_EQ(api, cuda_runtime_api());  // one per process
  std::size_t granularity = 0;
  const CudaResult r = api->vmm_granularity(0, &granularity);
  EXPECT_EQ(r.status, CudaStatus::kError);
  EXPECT_NE(std::string(r.message), "");
  EXPECT_STREQ(make_cuda_segment_source(api, 0, /*expandable=*/true)->name(), "cuda");
}

}  // namespace
}  // namespace remat
