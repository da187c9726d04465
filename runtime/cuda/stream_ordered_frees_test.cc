// StreamOrderedFrees alone, on the simulated device: a freed block that another stream used
// is held until that stream's work completes, and the errors of the event calls reach the
// next allocation. (stream_order_test.cc runs the whole runtime on top of it.)
#include "runtime/alloc/detail/stream_ordered_frees.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "remat/caching_allocator.h"
#include "remat/errors.h"
#include "runtime/cuda/cuda_segment_source.h"
#include "runtime/cuda/simulated_cuda.h"
#include "tests/support/memory_resource_conformance.h"

namespace remat::detail {
namespace {

struct Fixture {
  SimulatedCuda sim;
  CudaStream main = nullptr, side = nullptr;
  Segment segment;
  std::vector<Block> blocks = std::vector<Block>(8);

  Fixture() {
    EXPECT_TRUE(sim.stream_create(&main).ok());
    EXPECT_TRUE(sim.stream_create(&side).ok());
    void* device = nullptr;
    EXPECT_TRUE(sim.malloc(&device, 1 << 16).ok());
    for (std::size_t i = 0; i < blocks.size(); ++i) {
      blocks[i].segment = &segment;
      blocks[i].size = 4096;
      blocks[i].address = reinterpret_cast<std::uintptr_t>(device) + i * 4096;
      blocks[i].allocated = true;
    }
  }
  // A kernel on `stream` that reads block `i` for `ns`.
  void read_on(CudaStream stream, std::size_t i, double ns) {
    const DeviceRange r{reinterpret_cast<const void*>(blocks[i].address), 4096};
    ASSERT_TRUE(sim.launch(stream, ns, std::span(&r, 1), {}).ok());
  }
};

TEST(StreamOrderedFreesTest, ABlockNoOtherStreamUsedIsFreedAtOnce) {
  Fixture f;
  StreamOrderedFrees frees(&f.sim, f.main);
  frees.record(f.blocks[0].address, f.main);  // its own stream: nothing to wait for
  EXPECT_FALSE(frees.used_by_other_streams(f.blocks[0].address));
  EXPECT_FALSE(frees.defer(&f.blocks[0]));
  EXPECT_FALSE(frees.has_pending());
  EXPECT_EQ(frees.deferred(), 0u);
}

TEST(StreamOrderedFreesTest, AFreeWaitsForTheOtherStreamsWork) {
  Fixture f;
  StreamOrderedFrees frees(&f.sim, f.main);
  f.read_on(f.side, 1, 100e3);
  frees.record(f.blocks[1].address, f.side);
  f.blocks[1].tag = 7;
  ASSERT_TRUE(frees.used_by_other_streams(f.blocks[1].address));
  ASSERT_TRUE(frees.defer(&f.blocks[1]));
  EXPECT_EQ(f.blocks[1].tag, kNoTag);  // no tensor's any more
  EXPECT_FALSE(frees.used_by_other_streams(f.blocks[1].address));
  std::vector<Block*> finished;
  auto finish = [&](Block* b) { finished.push_back(b); };
  frees.poll(/*wait=*/false, finish);
  EXPECT_TRUE(finished.empty());  // the side stream's kernel still runs
  EXPECT_EQ(frees.pending(), 1u);
  f.sim.advance(200e3);
  frees.poll(/*wait=*/false, finish);
  EXPECT_EQ(finished, std::vector<Block*>{&f.blocks[1]});
  EXPECT_EQ(frees.waits(), 0u);
  EXPECT_EQ(frees.deferred(), 1u);
  EXPECT_FALSE(frees.has_pending());
}

TEST(StreamOrderedFreesTest, WaitingCountsEveryBlockStillInUse) {
  Fixture f;
  StreamOrderedFrees frees(&f.sim, f.main);
  for (std::size_t i : {2u, 3u}) {
    f.read_on(f.side, i, 100e3);
    frees.record(f.blocks[i].address, f.side);
    frees.record(f.blocks[i].address, f.side);  // recorded twice: one event
    ASSERT_TRUE(frees.defer(&f.blocks[i]));
  }
  std::vector<Block*> finished;
  frees.poll(/*wait=*/true, [&](Block* b) { finished.push_back(b); });
  EXPECT_EQ(finished.size(), 2u);
  EXPECT_GE(frees.waits(), 1u);
  EXPECT_FALSE(frees.has_pending());
  EXPECT_TRUE(f.sim.races().empty());
}

TEST(StreamOrderedFreesTest, AFailedEventRecordReachesTheNextAllocationOnce) {
  Fixture f;
  StreamOrderedFrees frees(&f.sim, f.main);
  frees.record(f.blocks[4].address, f.side);
  f.sim.inject(SimulatedCall::kEventRecord, CudaResult{CudaStatus::kError, 700, "injected"});
  EXPECT_TRUE(frees.defer(&f.blocks[4]));  // a free never throws
  EXPECT_THROW(frees.raise_error(), CudaError);
  EXPECT_NO_THROW(frees.raise_error());  // raised once
}

// The conformance suite against the caching allocator with stream-ordered frees: on the
// simulated device, every block is read by a kernel on a side stream, so every free waits
// for that kernel (deferred, then polled or waited for when memory runs short). Its stats
// are read once the pending frees are done, so that the counters the suite checks are those
// of the live blocks.
class SideStreamResource final : public MemoryResource, public MemoryReclaimer {
 public:
  SideStreamResource()
      : sim_(std::make_shared<SimulatedCuda>()),
        alloc_(std::make_unique<CudaSegmentSource>(sim_, 0), options()) {
    EXPECT_TRUE(sim_->stream_create(&main_).ok());
    EXPECT_TRUE(sim_->stream_create(&side_).ok());
    alloc_.use_stream(sim_.get(), main_);
    alloc_.set_reclaimer(this);
  }
  ~SideStreamResource() override {
    // Every free of a block the side stream read was deferred, and nothing raced.
    EXPECT_EQ(alloc_.stats().deferred_frees, frees_);
    EXPECT_TRUE(sim_->races().empty());
  }
  MemoryStats stats() const override {
    alloc_.synchronize_pending();
    return alloc_.stats();
  }
  void reset_peaks() override { alloc_.reset_peaks(); }
  std::size_t budget() const override { return alloc_.budget(); }
  void set_budget(std::size_t budget) override { alloc_.set_budget(budget); }
  std::size_t rounded_size(std::size_t bytes) const override { return alloc_.rounded_size(bytes); }
  bool reclaim(std::size_t bytes) override {
    return reclaimer() != nullptr && reclaimer()->reclaim(bytes);
  }

 protected:
  void* do_allocate(std::size_t bytes) override {
    void* p = alloc_.allocate(bytes);
    alloc_.record_stream(p, side_);
    const DeviceRange read{p, std::max<std::size_t>(bytes, 1)};
    EXPECT_TRUE(sim_->launch(side_, 10e3, std::span(&read, 1), {}).ok());
    return p;
  }
  void do_deallocate(void* p, std::size_t bytes) override {
    alloc_.deallocate(p, bytes);
    ++frees_;
  }

 private:
  static CachingAllocatorOptions options() {
    CachingAllocatorOptions o;
    o.budget = testing::kConformanceBudget;
    o.small_segment = 256 << 10;
    o.medium_segment = 4 << 20;
    return o;
  }
  std::shared_ptr<SimulatedCuda> sim_;
  mutable CachingAllocator alloc_;
  CudaStream main_ = nullptr, side_ = nullptr;
  std::size_t frees_ = 0;
};

struct SideStreamCaching {
  static std::unique_ptr<MemoryResource> make() { return std::make_unique<SideStreamResource>(); }
  static constexpr bool kHost = false;
};

}  // namespace
}  // namespace remat::detail

namespace remat::testing {
using StreamOrderedResources = ::testing::Types<detail::SideStreamCaching>;
INSTANTIATE_TYPED_TEST_SUITE_P(StreamOrdered, MemoryResourceConformance, StreamOrderedResources);
}  // namespace remat::testing
