#include "runtime/cuda/simulated_cuda.h"

#include <algorithm>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/cuda/simulated_cuda_testing.h"

namespace remat {
namespace {

using ::testing::HasSubstr;

constexpr std::size_t kMiB = std::size_t{1} << 20;

using sim_testing::device_alloc;
using sim_testing::make_event;
using sim_testing::make_stream;
using sim_testing::pinned_alloc;

void expect_error(const CudaResult& r, CudaStatus status, int code) {
  EXPECT_EQ(r.status, status) << r.message;
  EXPECT_EQ(r.code, code) << r.message;
}

// --- Copies ---------------------------------------------------------------------------------

TEST(SimulatedCudaTest, PinnedSourceOverwrittenBeforeTheCopyCompletesUploadsTheNewBytes) {
  SimulatedCuda sim;
  char* dev = device_alloc(sim, 64);
  char* host = pinned_alloc(sim, 64);
  CudaStream s = make_stream(sim);
  std::memset(host, 'A', 64);
  ASSERT_TRUE(sim.memcpy_async(dev, host, 64, CudaCopy::kHostToDevice, s).ok());
  EXPECT_EQ(sim.pending_work(), 1u);
  std::memset(host, 'B', 64);  // the bug: the copy has not read the source yet
  ASSERT_TRUE(sim.stream_synchronize(s).ok());
  EXPECT_EQ(dev[0], 'B');
  EXPECT_EQ(dev[63], 'B');
}

TEST(SimulatedCudaTest, PinnedSourceOverwrittenAfterEventSynchronizeUploadsTheOldBytes) {
  SimulatedCuda sim;
  char* dev = device_alloc(sim, 64);
  char* host = pinned_alloc(sim, 64);
  CudaStream s = make_stream(sim);
  CudaEvent done = make_event(sim);
  std::memset(host, 'A', 64);
  ASSERT_TRUE(sim.memcpy_async(dev, host, 64, CudaCopy::kHostToDevice, s).ok());
  ASSERT_TRUE(sim.event_record(done, s).ok());
  ASSERT_TRUE(sim.event_synchronize(done).ok());
  std::memset(host, 'B', 64);
  ASSERT_TRUE(sim.stream_synchronize(s).ok());
  EXPECT_EQ(dev[0], 'A');
  EXPECT_EQ(dev[63], 'A');
}

TEST(SimulatedCudaTest, PinnedDestinationIsStaleUntilTheCopyCompletes) {
  SimulatedCuda sim;
  char* dev = device_alloc(sim, 64);
  char* host = pinned_alloc(sim, 64);
  CudaStream s = make_stream(sim);
  std::memset(dev, 'D', 64);
  std::memset(host, '-', 64);
  ASSERT_TRUE(sim.memcpy_async(host, dev, 64, CudaCopy::kDeviceToHost, s).ok());
  EXPECT_EQ(host[0], '-');  // read too early: stale
  ASSERT_TRUE(sim.stream_synchronize(s).ok());
  EXPECT_EQ(host[0], 'D');
}

TEST(SimulatedCudaTest, PageableCopiesAreSynchronousWithTheHost) {
  SimulatedCuda sim({.copy_bytes_per_ns = 10, .copy_latency_ns = 2000});
  char* dev = device_alloc(sim, 1000);
  CudaStream s = make_stream(sim);
  std::vector<char> host(1000, 'A');
  const double before = sim.now();
  ASSERT_TRUE(sim.memcpy_async(dev, host.data(), 1000, CudaCopy::kHostToDevice, s).ok());
  std::fill(host.begin(), host.end(), 'B');  // safe: the copy has completed
  EXPECT_EQ(dev[999], 'A');
  EXPECT_EQ(sim.pending_work(), 0u);
  EXPECT_GE(sim.now(), before + 2000 + 100);

  std::vector<char> back(1000, '-');
  ASSERT_TRUE(sim.memcpy_async(back.data(), dev, 1000, CudaCopy::kDeviceToHost, s).ok());
  EXPECT_EQ(back[0], 'A');
  EXPECT_FALSE(sim.is_pinned(host.data()));
}

TEST(SimulatedCudaTest, DeviceToDeviceCopiesAreDeferred) {
  SimulatedCuda sim;
  char* a = device_alloc(sim, 32);
  char* b = device_alloc(sim, 32);
  CudaStream s = make_stream(sim);
  std::memset(a, 'x', 32);
  std::memset(b, 0, 32);
  ASSERT_TRUE(sim.memcpy_async(b, a, 32, CudaCopy::kDeviceToDevice, s).ok());
  EXPECT_EQ(b[0], 0);
  sim.synchronize_all();
  EXPECT_EQ(b[0], 'x');
}

// --- Races ----------------------------------------------------------------------------------

TEST(SimulatedCudaTest, CrossStreamWriteAfterAPendingReadIsARace) {
  SimulatedCuda sim;
  char* buf = device_alloc(sim, 256);
  CudaStream a = make_stream(sim);
  CudaStream b = make_stream(sim);
  const DeviceRange whole[] = {{buf, 256}};
  const DeviceRange tail[] = {{buf + 128, 256 - 128}};
  ASSERT_TRUE(sim.launch(a, 10'000, whole, {}).ok());
  ASSERT_TRUE(sim.launch(b, 1'000, {}, tail).ok());
  ASSERT_EQ(sim.races().size(), 1u);
  const Race& race = sim.races()[0];
  EXPECT_EQ(race.first_stream, a);
  EXPECT_EQ(race.second_stream, b);
  EXPECT_EQ(race.p, buf + 128);
  EXPECT_EQ(race.bytes, 128u);
  EXPECT_GT(race.first_end, race.second_start);
  EXPECT_THAT(race.what, HasSubstr("has not completed"));
  sim.clear_races();
  EXPECT_TRUE(sim.races().empty());
}

TEST(SimulatedCudaTest, TwoPendingReadsOnDifferentStreamsDoNotRace) {
  SimulatedCuda sim;
  char* buf = device_alloc(sim, 256);
  CudaStream a = make_stream(sim);
  CudaStream b = make_stream(sim);
  const DeviceRange range[] = {{buf, 256}};
  ASSERT_TRUE(sim.launch(a, 10'000, range, {}).ok());
  ASSERT_TRUE(sim.launch(b, 10'000, range, {}).ok());
  EXPECT_TRUE(sim.races().empty());
}

TEST(SimulatedCudaTest, WaitingOnAnEventRecordedAfterTheReadIsNotARace) {
  SimulatedCuda sim;
  char* buf = device_alloc(sim, 256);
  CudaStream a = make_stream(sim);
  CudaStream b = make_stream(sim);
  CudaEvent read_done = make_event(sim);
  const DeviceRange range[] = {{buf, 256}};
  ASSERT_TRUE(sim.launch(a, 10'000, range, {}).ok());
  ASSERT_TRUE(sim.event_record(read_done, a).ok());
  ASSERT_TRUE(sim.stream_wait_event(b, read_done).ok());
  const double launched = sim.now();
  ASSERT_TRUE(sim.launch(b, 1'000, {}, range).ok());
  EXPECT_TRUE(sim.races().empty());
  // The write waited for the read: it completes 10 us after the read began, plus 1 us.
  ASSERT_TRUE(sim.stream_synchronize(b).ok());
  EXPECT_GE(sim.now(), launched + 1'000 + 10'000 - 1'000);
}

TEST(SimulatedCudaTest, AnEventRecordedBeforeTheReadDoesNotOrderIt) {
  SimulatedCuda sim;
  char* buf = device_alloc(sim, 256);
  CudaStream a = make_stream(sim);
  CudaStream b = make_stream(sim);
  CudaEvent too_early = make_event(sim);
  const DeviceRange range[] = {{buf, 256}};
  ASSERT_TRUE(sim.event_record(too_early, a).ok());
  ASSERT_TRUE(sim.launch(a, 10'000, range, {}).ok());
  ASSERT_TRUE(sim.stream_wait_event(b, too_early).ok());
  ASSERT_TRUE(sim.launch(b, 1'000, {}, range).ok());
  EXPECT_EQ(sim.races().size(), 1u);
}

TEST(SimulatedCudaTest, EventSynchronizeAfterTheReadIsNotARace) {
  SimulatedCuda sim;
  char* buf = device_alloc(sim, 256);
  CudaStream a = make_stream(sim);
  CudaStream b = make_stream(sim);
  CudaEvent read_done = make_event(sim);
  const DeviceRange range[] = {{buf, 256}};
  ASSERT_TRUE(sim.launch(a, 10'000, range, {}).ok());
  ASSERT_TRUE(sim.event_record(read_done, a).ok());
  ASSERT_TRUE(sim.event_synchronize(read_done).ok());
  ASSERT_TRUE(sim.launch(b, 1'000, {}, range).ok());
  EXPECT_TRUE(sim.races().empty());
}

TEST(SimulatedCudaTest, SameStreamReuseIsNeverARace) {
  SimulatedCuda sim;
  char* buf = device_alloc(sim, 256);
  CudaStream a = make_stream(sim);
  const DeviceRange range[] = {{buf, 256}};
  ASSERT_TRUE(sim.launch(a, 10'000, range, range).ok());
  ASSERT_TRUE(sim.launch(a, 1'000, {}, range).ok());
  ASSERT_TRUE(sim.launch(nullptr, 1'000, range, range).ok());
  ASSERT_TRUE(sim.launch(nullptr, 1'000, {}, range).ok());
  EXPECT_TRUE(sim.races().empty());
}

TEST(SimulatedCudaTest, TheLegacyStreamOrdersBlockingStreams) {
  SimulatedCuda sim({.host_call_ns = 0, .malloc_ns = 0, .malloc_ns_per_gib = 0});
  char* buf = device_alloc(sim, 256);
  CudaStream a = make_stream(sim);
  CudaStream b = make_stream(sim);
  std::vector<int> order;
  const DeviceRange range[] = {{buf, 256}};
  ASSERT_TRUE(sim.launch(a, 1'000, {}, range, [&order] { order.push_back(1); }).ok());
  ASSERT_TRUE(sim.launch(nullptr, 10, {}, range, [&order] { order.push_back(2); }).ok());
  ASSERT_TRUE(sim.launch(b, 5, {}, range, [&order] { order.push_back(3); }).ok());
  EXPECT_TRUE(sim.races().empty());
  ASSERT_TRUE(sim.stream_synchronize(b).ok());
  EXPECT_EQ(sim.now(), 1'015);  // [0, 1000) on a, [1000, 1010) legacy, [1010, 1015) on b
  EXPECT_EQ(order, (std::vector<int>{1, 2, 3}));
}

// Note [What memory calls cost]: reserving and releasing device memory is priced as on a
// GPU, not as a plain call.
TEST(SimulatedCudaTest, MemoryCallsCostWhatTheyCostOnAGpu) {
  SimulatedCuda sim({.capacity = std::size_t{8} << 30, .host_call_ns = 0});
  void* small = nullptr;
  void* large = nullptr;
  double before = sim.now();
  ASSERT_TRUE(sim.malloc(&small, 1 << 20).ok());
  const double small_ns = sim.now() - before;
  before = sim.now();
  ASSERT_TRUE(sim.malloc(&large, std::size_t{4} << 30).ok());
  const double large_ns = sim.now() - before;
  EXPECT_GE(small_ns, 100e3);  // 0.1 ms at least
  EXPECT_GT(large_ns, small_ns);
  EXPECT_LE(large_ns, 10e6);  // 10 ms at most
  // cudaFree waits for the device, then takes its own time.
  CudaStream s = make_stream(sim);
  ASSERT_TRUE(sim.launch(s, 1e6, {}, {}).ok());
  before = sim.now();
  ASSERT_TRUE(sim.free(small).ok());
  EXPECT_GE(sim.now() - before, 1e6 + 50e3);
  // Mapping costs per call and per granule; a call refused on its arguments costs nothing.
  void* range = nullptr;
  const std::size_t g = std::size_t{2} << 20;
  ASSERT_TRUE(sim.address_reserve(&range, 8 * g).ok());
  before = sim.now();
  ASSERT_TRUE(sim.map(range, g, 0).ok());
  const double one = sim.now() - before;
  before = sim.now();
  ASSERT_TRUE(sim.map(static_cast<char*>(range) + g, 4 * g, 0).ok());
  const double four = sim.now() - before;
  EXPECT_GT(one, 0.0);
  EXPECT_LT(four, 4 * one);  // one call for four granules is cheaper than four calls
  EXPECT_GT(four, one);
  before = sim.now();
  EXPECT_FALSE(sim.unmap(static_cast<char*>(range) + 6 * g, g).ok());  // not mapped
  EXPECT_EQ(sim.now(), before);
  EXPECT_TRUE(sim.unmap(range, g).ok());
  EXPECT_GT(sim.now(), before);
}

TEST(SimulatedCudaTest, WorkCompletesInEndTimeOrderAcrossStreams) {
  SimulatedCuda sim({.host_call_ns = 0});
  CudaStream a = make_stream(sim);
  CudaStream b = make_stream(sim);
  std::vector<int> order;
  ASSERT_TRUE(sim.launch(a, 300, {}, {}, [&order] { order.push_back(1); }).ok());
  ASSERT_TRUE(sim.launch(b, 100, {}, {}, [&order] { order.push_back(2); }).ok());
  ASSERT_TRUE(sim.launch(a, 0, {}, {}, [&order] { order.push_back(3); }).ok());
  sim.advance(150);
  EXPECT_EQ(order, std::vector<int>{2});
  sim.advance(150);
  EXPECT_EQ(order, (std::vector<int>{2, 1, 3}));
}

// --- Events ---------------------------------------------------------------------------------

TEST(SimulatedCudaTest, EventQueryTurnsReadyAfterEnoughHostTime) {
  SimulatedCuda sim({.host_call_ns = 100});
  CudaStream s = make_stream(sim);
  CudaEvent e = make_event(sim);
  EXPECT_TRUE(sim.event_query(e).ok());  // never recorded: nothing to wait for
  ASSERT_TRUE(sim.launch(s, 1'000, {}, {}).ok());
  ASSERT_TRUE(sim.event_record(e, s).ok());
  expect_error(sim.event_query(e), CudaStatus::kNotReady, 600);
  sim.advance(500);
  expect_error(sim.event_query(e), CudaStatus::kNotReady, 600);
  sim.advance(500);
  EXPECT_TRUE(sim.event_query(e).ok());
}

TEST(SimulatedCudaTest, AnEventRecordedOnAnIdleStreamIsCompleteAtOnce) {
  SimulatedCuda sim;
  CudaStream s = make_stream(sim);
  CudaEvent e = make_event(sim);
  ASSERT_TRUE(sim.event_record(e, s).ok());
  EXPECT_TRUE(sim.event_query(e).ok());
}

TEST(SimulatedCudaTest, ElapsedTimeBetweenTimingEventsIsTheSimulatedDuration) {
  SimulatedCuda sim({.host_call_ns = 100});
  CudaStream s = make_stream(sim);
  CudaEvent start = make_event(sim, /*timing=*/true);
  CudaEvent end = make_event(sim, /*timing=*/true);
  CudaEvent plain = make_event(sim, /*timing=*/false);
  float ms = 0;
  expect_error(sim.event_elapsed_ms(&ms, start, end), CudaStatus::kError, 400);  // unrecorded
  ASSERT_TRUE(sim.launch(s, 50'000, {}, {}).ok());  // keeps the stream busy
  ASSERT_TRUE(sim.event_record(start, s).ok());
  ASSERT_TRUE(sim.launch(s, 1'500, {}, {}).ok());
  ASSERT_TRUE(sim.launch(s, 2'500, {}, {}).ok());
  ASSERT_TRUE(sim.event_record(end, s).ok());
  ASSERT_TRUE(sim.event_record(plain, s).ok());
  expect_error(sim.event_elapsed_ms(&ms, start, end), CudaStatus::kNotReady, 600);
  ASSERT_TRUE(sim.event_synchronize(end).ok());
  ASSERT_TRUE(sim.event_elapsed_ms(&ms, start, end).ok());
  EXPECT_FLOAT_EQ(ms, 0.004f);
  expect_error(sim.event_elapsed_ms(&ms, start, plain), CudaStatus::kError, 400);
}

TEST(SimulatedCudaTest, EventsOnAnIdleStreamMeasureHostTime) {
  SimulatedCuda sim({.host_call_ns = 100});
  CudaStream s = make_stream(sim);
  CudaEvent start = make_event(sim, /*timing=*/true);
  CudaEvent end = make_event(sim, /*timing=*/true);
  ASSERT_TRUE(sim.event_record(start, s).ok());
  sim.advance(3'000);
  ASSERT_TRUE(sim.event_record(end, s).ok());  // the GPU sees it 3 us + one call later
  float ms = 0;
  ASSERT_TRUE(sim.event_elapsed_ms(&ms, start, end).ok());
  EXPECT_FLOAT_EQ(ms, 0.0031f);
}

TEST(SimulatedCudaTest, ADestroyedStreamsWorkStillRunsAndTheLegacyStreamWaitsForIt) {
  SimulatedCuda sim({.host_call_ns = 0});
  CudaStream s = make_stream(sim);
  bool ran = false;
  ASSERT_TRUE(sim.launch(s, 1'000, {}, {}, [&ran] { ran = true; }).ok());
  ASSERT_TRUE(sim.stream_destroy(s).ok());
  EXPECT_FALSE(ran);
  ASSERT_TRUE(sim.launch(nullptr, 10, {}, {}).ok());
  ASSERT_TRUE(sim.stream_synchronize(nullptr).ok());
  EXPECT_TRUE(ran);
  EXPECT_EQ(sim.now(), 1'010);
}

TEST(SimulatedCudaTest, DestroyedStreamsAndEventsAreInvalidHandles) {
  SimulatedCuda sim;
  CudaStream s = make_stream(sim);
  CudaEvent e = make_event(sim);
  ASSERT_TRUE(sim.stream_destroy(s).ok());
  ASSERT_TRUE(sim.event_destroy(e).ok());
  expect_error(sim.stream_synchronize(s), CudaStatus::kError, 400);
  expect_error(sim.launch(s, 1, {}, {}), CudaStatus::kError, 400);
  expect_error(sim.last_launch_error(), CudaStatus::kError, 400);
  EXPECT_TRUE(sim.last_launch_error().ok());  // cleared
  expect_error(sim.event_query(e), CudaStatus::kError, 400);
  expect_error(sim.stream_destroy(nullptr), CudaStatus::kError, 400);
  CudaEvent live = make_event(sim);
  expect_error(sim.event_record(live, s), CudaStatus::kError, 400);
}

// --- Memory ---------------------------------------------------------------------------------

TEST(SimulatedCudaTest, MallocReturnsAlignedHostMemoryAndCountsIt) {
  SimulatedCuda sim;
  char* p = device_alloc(sim, 1000);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % 256, 0u);
  std::memset(p, 1, 1000);  // really exists
  EXPECT_EQ(sim.device_bytes_in_use(), 1000u);
  EXPECT_EQ(sim.live_allocations(), 1u);
  char* h = pinned_alloc(sim, 100);
  EXPECT_TRUE(sim.is_pinned(h));
  EXPECT_TRUE(sim.is_pinned(h + 99));
  EXPECT_FALSE(sim.is_pinned(p));
  EXPECT_EQ(sim.device_bytes_in_use(), 1000u);  // pinned memory is not device memory
  ASSERT_TRUE(sim.free(p).ok());
  ASSERT_TRUE(sim.free_host(h).ok());
  EXPECT_EQ(sim.device_bytes_in_use(), 0u);
  EXPECT_EQ(sim.live_allocations(), 0u);
  EXPECT_EQ(sim.live_host_allocations(), 0u);
}

TEST(SimulatedCudaTest, CapacityExhaustionIsOutOfMemory) {
  SimulatedCuda sim({.capacity = kMiB});
  char* a = device_alloc(sim, 768 * 1024);
  void* b = nullptr;
  const CudaResult r = sim.malloc(&b, 512 * 1024);
  expect_error(r, CudaStatus::kOutOfMemory, 2);
  EXPECT_STREQ(r.message, "out of memory");
  EXPECT_EQ(b, nullptr);
  ASSERT_TRUE(sim.free(a).ok());
  EXPECT_TRUE(sim.malloc(&b, 512 * 1024).ok());
}

TEST(SimulatedCudaTest, InvalidAndDoubleFreesAreInvalidArguments) {
  SimulatedCuda sim;
  int on_stack = 0;
  expect_error(sim.free(&on_stack), CudaStatus::kError, 1);
  char* p = device_alloc(sim, 512);
  expect_error(sim.free(p + 256), CudaStatus::kError, 1);  // not the allocation's start
  expect_error(sim.free_host(p), CudaStatus::kError, 1);   // not pinned memory
  ASSERT_TRUE(sim.free(p).ok());
  const CudaResult twice = sim.free(p);
  expect_error(twice, CudaStatus::kError, 1);
  EXPECT_STREQ(twice.message, "invalid argument");
  EXPECT_TRUE(sim.free(nullptr).ok());
}

TEST(SimulatedCudaTest, FreeSynchronizesTheDeviceAndMallocDoesNot) {
  SimulatedCuda sim;
  char* p = device_alloc(sim, 64);
  CudaStream s = make_stream(sim);
  bool ran = false;
  ASSERT_TRUE(sim.launch(s, 1'000'000, {}, {}, [&ran] { ran = true; }).ok());
  device_alloc(sim, 64);
  EXPECT_EQ(sim.pending_work(), 1u);
  EXPECT_FALSE(ran);
  ASSERT_TRUE(sim.free(p).ok());
  EXPECT_TRUE(ran);
  EXPECT_EQ(sim.pending_work(), 0u);
  EXPECT_GE(sim.now(), 1'000'000);
}

TEST(SimulatedCudaTest, TouchingFreedOrUnallocatedMemoryIsAnInvalidAccess) {
  SimulatedCuda sim;
  char* p = device_alloc(sim, 64);
  ASSERT_TRUE(sim.free(p).ok());
  CudaStream s = make_stream(sim);
  bool ran = false;
  const DeviceRange freed[] = {{p, 64}};
  ASSERT_TRUE(sim.launch(s, 100, {}, freed, [&ran] { ran = true; }).ok());
  int on_stack = 0;
  const DeviceRange host[] = {{&on_stack, sizeof on_stack}};
  ASSERT_TRUE(sim.launch(s, 100, host, {}).ok());
  sim.synchronize_all();
  EXPECT_FALSE(ran);  // its memory is gone: the body does not run
  ASSERT_EQ(sim.invalid_accesses().size(), 2u);
  EXPECT_EQ(sim.invalid_accesses()[0].p, p);
  EXPECT_TRUE(sim.invalid_accesses()[0].write);
  EXPECT_THAT(sim.invalid_accesses()[0].what, HasSubstr("not allocated"));
  EXPECT_FALSE(sim.invalid_accesses()[1].write);
  sim.clear_invalid_accesses();
  EXPECT_TRUE(sim.invalid_accesses().empty());
}

// --- Fault injection ------------------------------------------------------------------------

TEST(SimulatedCudaTest, InjectedOutOfMemoryOnTheThirdMalloc) {
  SimulatedCuda sim;
  sim.inject(SimulatedCall::kMalloc, SimulatedCuda::out_of_memory(), /*skip=*/2);
  void* p = nullptr;
  EXPECT_TRUE(sim.malloc(&p, 64).ok());
  EXPECT_TRUE(sim.malloc(&p, 64).ok());
  p = nullptr;
  expect_error(sim.malloc(&p, 64), CudaStatus::kOutOfMemory, 2);
  EXPECT_EQ(p, nullptr);
  EXPECT_TRUE(sim.malloc(&p, 64).ok());
  EXPECT_EQ(sim.calls(SimulatedCall::kMalloc), 4u);
  EXPECT_EQ(sim.live_allocations(), 3u);
  EXPECT_EQ(sim.device_bytes_in_use(), 3u * 64);
}

TEST(SimulatedCudaTest, InjectedResultsReplaceTheCall) {
  SimulatedCuda sim;
  CudaStream s = make_stream(sim);
  CudaEvent e = make_event(sim);
  sim.inject(SimulatedCall::kEventQuery, SimulatedCuda::illegal_address());
  sim.inject(SimulatedCall::kLaunch, SimulatedCuda::invalid_value());
  expect_error(sim.event_query(e), CudaStatus::kError, 700);
  EXPECT_TRUE(sim.event_query(e).ok());
  bool ran = false;
  expect_error(sim.launch(s, 10, {}, {}, [&ran] { ran = true; }), CudaStatus::kError, 1);
  expect_error(sim.last_launch_error(), CudaStatus::kError, 1);
  sim.synchronize_all();
  EXPECT_FALSE(ran);
  EXPECT_EQ(sim.calls(SimulatedCall::kEventQuery), 2u);
  EXPECT_EQ(sim.calls(SimulatedCall::kLaunch), 1u);
}

TEST(SimulatedCudaTest, AStickyFaultFailsEveryLaterCall) {
  SimulatedCuda sim;
  CudaStream s = make_stream(sim);
  char* p = device_alloc(sim, 64);
  bool earlier_ran = false;
  ASSERT_TRUE(sim.launch(s, 1'000, {}, {}, [&earlier_ran] { earlier_ran = true; }).ok());
  sim.inject_sticky_fault();
  EXPECT_TRUE(sim.launch(s, 1'000, {}, {}).ok());  // accepted; it faults as it runs
  expect_error(sim.last_launch_error(), CudaStatus::kError, 700);
  expect_error(sim.last_launch_error(), CudaStatus::kError, 700);  // sticky: not cleared
  void* q = nullptr;
  const CudaResult r = sim.malloc(&q, 64);
  expect_error(r, CudaStatus::kError, 700);
  EXPECT_STREQ(r.message, "an illegal memory access was encountered");
  expect_error(sim.free(p), CudaStatus::kError, 700);
  expect_error(sim.stream_synchronize(s), CudaStatus::kError, 700);
  int device = -1;
  expect_error(sim.get_device(&device), CudaStatus::kError, 700);
  expect_error(sim.launch(s, 1, {}, {}), CudaStatus::kError, 700);
  EXPECT_FALSE(earlier_ran);  // the context is lost with its pending work
  EXPECT_EQ(sim.pending_work(), 0u);
}

// --- Devices --------------------------------------------------------------------------------

TEST(SimulatedCudaTest, DevicesHaveTheirOwnMemory) {
  SimulatedCuda sim({.devices = 2, .capacity = kMiB, .major = 8, .minor = 6});
  int count = 0;
  ASSERT_TRUE(sim.device_count(&count).ok());
  EXPECT_EQ(count, 2);
  expect_error(sim.set_device(2), CudaStatus::kError, 101);
  expect_error(sim.set_device(-1), CudaStatus::kError, 101);
  ASSERT_TRUE(sim.set_device(1).ok());
  int device = -1;
  ASSERT_TRUE(sim.get_device(&device).ok());
  EXPECT_EQ(device, 1);
  device_alloc(sim, 1000);
  EXPECT_EQ(sim.device_bytes_in_use(1), 1000u);
  EXPECT_EQ(sim.device_bytes_in_use(0), 0u);
  int major = 0, minor = 0;
  ASSERT_TRUE(sim.compute_capability(1, &major, &minor).ok());
  EXPECT_EQ(major, 8);
  EXPECT_EQ(minor, 6);
  expect_error(sim.compute_capability(2, &major, &minor), CudaStatus::kError, 101);
}

TEST(SimulatedCudaTest, MemGetInfoCountsTheContext) {
  SimulatedCuda sim({.capacity = 1024 * kMiB, .context_bytes = 300 * kMiB});
  std::size_t free_bytes = 0, total = 0;
  ASSERT_TRUE(sim.mem_get_info(&free_bytes, &total).ok());
  EXPECT_EQ(total, 1024 * kMiB);
  EXPECT_EQ(free_bytes, 724 * kMiB);
  device_alloc(sim, 100 * kMiB);
  ASSERT_TRUE(sim.mem_get_info(&free_bytes, &total).ok());
  EXPECT_EQ(free_bytes, 624 * kMiB);
  void* p = nullptr;
  expect_error(sim.malloc(&p, 700 * kMiB), CudaStatus::kOutOfMemory, 2);
}

// --- Virtual memory -------------------------------------------------------------------------

TEST(SimulatedCudaTest, VirtualMemoryMapsGranulesAgainstCapacity) {
  SimulatedCuda sim({.capacity = 8 * kMiB, .granularity = 2 * kMiB});
  std::size_t g = 0;
  ASSERT_TRUE(sim.vmm_granularity(0, &g).ok());
  EXPECT_EQ(g, 2 * kMiB);
  void* v = nullptr;
  ASSERT_TRUE(sim.address_reserve(&v, 16 * kMiB).ok());
  char* base = static_cast<char*>(v);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(base) % g, 0u);
  EXPECT_EQ(sim.device_bytes_in_use(), 0u);  // addresses only

  ASSERT_TRUE(sim.map(base, 4 * kMiB, 0).ok());
  EXPECT_EQ(sim.device_bytes_in_use(), 4 * kMiB);
  expect_error(sim.map(base + 4 * kMiB, 6 * kMiB, 0), CudaStatus::kOutOfMemory, 2);
  expect_error(sim.map(base + 1, g, 0), CudaStatus::kError, 1);         // misaligned
  expect_error(sim.map(base + 2 * kMiB, g, 0), CudaStatus::kError, 1);  // already mapped
  expect_error(sim.map(base + 4 * kMiB, g, 3), CudaStatus::kError, 101);
  expect_error(sim.unmap(base + 4 * kMiB, g), CudaStatus::kError, 1);  // not mapped

  CudaStream s = make_stream(sim);
  const DeviceRange mapped[] = {{base + 3 * kMiB, 1024}};
  ASSERT_TRUE(sim.launch(s, 100, {}, mapped, [base] { base[3 * kMiB] = 7; }).ok());
  const DeviceRange straddling[] = {{base + 4 * kMiB - 16, 32}};
  ASSERT_TRUE(sim.launch(s, 100, straddling, {}).ok());
  sim.synchronize_all();
  EXPECT_EQ(base[3 * kMiB], 7);
  ASSERT_EQ(sim.invalid_accesses().size(), 1u);
  EXPECT_THAT(sim.invalid_accesses()[0].what, HasSubstr("unmapped granule"));

  expect_error(sim.address_free(base, 16 * kMiB), CudaStatus::kError, 1);  // still mapped
  ASSERT_TRUE(sim.unmap(base, 4 * kMiB).ok());
  EXPECT_EQ(sim.device_bytes_in_use(), 0u);
  ASSERT_TRUE(sim.address_free(base, 16 * kMiB).ok());
  EXPECT_EQ(sim.live_reservations(), 0u);
}

TEST(SimulatedCudaTest, UnmappingUnderPendingWorkIsAnInvalidAccess) {
  SimulatedCuda sim({.granularity = 2 * kMiB});
  void* v = nullptr;
  ASSERT_TRUE(sim.address_reserve(&v, 4 * kMiB).ok());
  ASSERT_TRUE(sim.map(v, 4 * kMiB, 0).ok());
  CudaStream s = make_stream(sim);
  bool ran = false;
  const DeviceRange range[] = {{v, 4096}};
  ASSERT_TRUE(sim.launch(s, 1'000'000, {}, range, [&ran] { ran = true; }).ok());
  ASSERT_TRUE(sim.unmap(v, 2 * kMiB).ok());  // does not wait for the launch
  sim.synchronize_all();
  EXPECT_FALSE(ran);
  ASSERT_EQ(sim.invalid_accesses().size(), 1u);
  EXPECT_THAT(sim.invalid_accesses()[0].what, HasSubstr("unmapped"));
  ASSERT_TRUE(sim.unmap(static_cast<char*>(v) + 2 * kMiB, 2 * kMiB).ok());
}

// --- Property: races are reported exactly when timing says so ------------------------------

// A brute-force model of the same device: each work item's happens-before predecessors are
// explicit sets, its start is the latest end among them (or the host's clock), and a race is
// any conflicting pair on different streams where the earlier one ends after the later starts.
struct ModelItem {
  int stream = 0;
  double start = 0, end = 0;
  std::vector<std::pair<std::size_t, std::size_t>> reads, writes;  // [begin, end) in a buffer
  std::uint64_t id = 0;
};

bool conflict(const ModelItem& a, const ModelItem& b) {
  auto overlaps = [](const auto& xs, const auto& ys) {
    for (const auto& x : xs) {
      for (const auto& y : ys) {
        if (x.first < y.second && y.first < x.second) return true;
      }
    }
    return false;
  };
  return overlaps(a.writes, b.writes) || overlaps(a.writes, b.reads) || overlaps(a.reads, b.writes);
}

TEST(SimulatedCudaPropertyTest, RacesAreReportedExactlyWhenTheEarlierItemWasPending) {
  constexpr int kCreatedStreams = 3;
  constexpr int kLegacy = kCreatedStreams;  // index of the legacy stream
  constexpr std::size_t kBufferBytes = 64;
  constexpr double kHostCall = 100;
  std::size_t races_seen = 0;
  for (int seed = 0; seed < 200; ++seed) {
    SCOPED_TRACE(seed);
    std::mt19937 rng(seed);
    auto uniform = [&rng](int lo, int hi) { return std::uniform_int_distribution(lo, hi)(rng); };
    SimulatedCuda sim({.host_call_ns = kHostCall});
    char* buffer = device_alloc(sim, kBufferBytes);
    std::vector<CudaStream> streams;
    for (int i = 0; i < kCreatedStreams; ++i) streams.push_back(make_stream(sim));
    streams.push_back(nullptr);
    std::vector<CudaEvent> events;
    for (int i = 0; i < 3; ++i) events.push_back(make_event(sim));

    double clock = sim.now();
    std::vector<ModelItem> items;
    std::vector<std::set<std::size_t>> frontier(kCreatedStreams + 1);  // ordered before later work
    struct ModelEvent {
      bool recorded = false;
      std::set<std::size_t> preds;
      double time = 0;
    };
    std::vector<ModelEvent> model_events(events.size());
    std::set<std::pair<std::uint64_t, std::uint64_t>> expected;
    std::vector<std::uint64_t> completed;  // body log

    // What an operation on stream s is ordered after: its own stream and the legacy stream,
    // or, on the legacy stream, everything.
    auto preds_of = [&](int s) {
      std::set<std::size_t> p = frontier[kLegacy];
      for (int t = 0; t < kCreatedStreams; ++t) {
        if (t == s || s == kLegacy) p.insert(frontier[t].begin(), frontier[t].end());
      }
      return p;
    };
    auto latest_end = [&](const std::set<std::size_t>& p) {
      double t = 0;
      for (std::size_t i : p) t = std::max(t, items[i].end);
      return t;
    };

    for (int op = 0; op < 60; ++op) {
      const int kind = uniform(0, 99);
      const int s = uniform(0, 9) == 0 ? kLegacy : uniform(0, kCreatedStreams - 1);
      const int e = uniform(0, static_cast<int>(events.size()) - 1);
      if (kind < 50) {  // a launch
        ModelItem item;
        item.stream = s;
        std::vector<DeviceRange> reads, writes;
        for (int n = uniform(0, 2); n > 0; --n) {
          const std::size_t lo = uniform(0, 47), hi = lo + uniform(1, 16);
          item.reads.push_back({lo, hi});
          reads.push_back({buffer + lo, hi - lo});
        }
        for (int n = uniform(0, 2); n > 0; --n) {
          const std::size_t lo = uniform(0, 47), hi = lo + uniform(1, 16);
          item.writes.push_back({lo, hi});
          writes.push_back({buffer + lo, hi - lo});
        }
        const double duration = uniform(0, 3000);
        clock += kHostCall;
        const std::set<std::size_t> preds = preds_of(s);
        item.start = std::max(clock, latest_end(preds));
        item.end = item.start + duration;
        item.id = sim.last_work_item() + 1;
        const std::uint64_t id = item.id;
        auto body = [&completed, id] { completed.push_back(id); };
        ASSERT_TRUE(sim.launch(streams[s], duration, reads, writes, body).ok());
        ASSERT_EQ(sim.last_work_item(), item.id);
        for (std::size_t i = 0; i < items.size(); ++i) {
          if (items[i].stream != s && conflict(items[i], item) && items[i].end > item.start) {
            EXPECT_FALSE(preds.contains(i)) << "happens-before pairs cannot overlap in time";
            expected.insert({items[i].id, item.id});
          }
        }
        frontier[s] = preds;
        frontier[s].insert(items.size());
        items.push_back(std::move(item));
      } else if (kind < 65) {  // record
        clock += kHostCall;
        ModelEvent& ev = model_events[e];
        ev.recorded = true;
        ev.preds = preds_of(s);
        ev.time = std::max(clock, latest_end(ev.preds));
        if (s == kLegacy) frontier[kLegacy] = ev.preds;
        ASSERT_TRUE(sim.event_record(events[e], streams[s]).ok());
      } else if (kind < 80) {  // wait
        clock += kHostCall;
        if (s == kLegacy) frontier[kLegacy] = preds_of(kLegacy);
        if (model_events[e].recorded)
          frontier[s].insert(model_events[e].preds.begin(), model_events[e].preds.end());
        ASSERT_TRUE(sim.stream_wait_event(streams[s], events[e]).ok());
      } else if (kind < 90) {  // host time passes
        const int ns = uniform(0, 2000);
        clock += ns;
        sim.advance(ns);
      } else if (kind < 95) {
        clock += kHostCall;
        if (model_events[e].recorded) clock = std::max(clock, model_events[e].time);
        ASSERT_TRUE(sim.event_synchronize(events[e]).ok());
      } else {
        clock += kHostCall;
        clock = std::max(clock, latest_end(s == kLegacy ? preds_of(kLegacy) : frontier[s]));
        ASSERT_TRUE(sim.stream_synchronize(streams[s]).ok());
      }
      ASSERT_EQ(sim.now(), clock);
    }

    std::set<std::pair<std::uint64_t, std::uint64_t>> reported;
    for (const Race& race : sim.races()) {
      reported.insert({race.first_item, race.second_item});
      const ModelItem& first = items[race.first_item - items.front().id];
      const ModelItem& second = items[race.second_item - items.front().id];
      EXPECT_EQ(race.first_start, first.start);
      EXPECT_EQ(race.first_end, first.end);
      EXPECT_EQ(race.second_start, second.start);
      EXPECT_EQ(race.second_end, second.end);
      EXPECT_EQ(race.first_stream, streams[first.stream]);
      EXPECT_EQ(race.second_stream, streams[second.stream]);
    }
    EXPECT_EQ(reported.size(), sim.races().size()) << "one race per pair";
    EXPECT_EQ(reported, expected);
    races_seen += expected.size();
    // Bodies ran in order of end time, ties (and so each stream) in order of enqueueing.
    sim.synchronize_all();
    std::vector<const ModelItem*> by_end;
    for (const ModelItem& item : items) by_end.push_back(&item);
    std::stable_sort(by_end.begin(), by_end.end(),
                     [](const ModelItem* a, const ModelItem* b) { return a->end < b->end; });
    std::vector<std::uint64_t> order;
    for (const ModelItem* item : by_end) order.push_back(item->id);
    EXPECT_EQ(completed, order);
    EXPECT_TRUE(sim.invalid_accesses().empty());
  }
  EXPECT_GT(races_seen, 100u);  // the generator does produce races
}

}  // namespace
}  // namespace remat
