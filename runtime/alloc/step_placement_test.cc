// StepPlacement alone, on a BestFitPool: what a trace records, and a placement followed
// request by request until a request leaves the traced sequence.
#include "runtime/alloc/detail/step_placement.h"

#include <gtest/gtest.h>

#include <vector>

namespace remat::detail {
namespace {

constexpr std::uintptr_t kBase = std::uintptr_t{1} << 40;
constexpr std::size_t kMiB = std::size_t{1} << 20;

TEST(StepPlacementTest, ATraceRecordsRequestsAndFreesInOrderButNotPausedOnes) {
  BestFitPool pool;
  StepPlacement placement(pool);
  placement.note_allocation(kBase, 512);  // before the trace: not recorded
  placement.record_allocations();
  EXPECT_TRUE(placement.active());
  placement.note_allocation(kBase + 4096, 1024);
  placement.pause(true);
  placement.note_allocation(kBase + 8192, 2048);  // a kernel's scratch
  placement.pause(false);
  placement.note_allocation(kBase + 16384, 4096);
  placement.moved(kBase + 4096, kBase + 65536);  // the runtime moved the first
  placement.note_free(kBase + 65536);
  placement.note_free(kBase + 8192);  // not traced: nothing
  const AllocationSequence trace = placement.take_allocations();
  EXPECT_FALSE(placement.active());
  ASSERT_EQ(trace.allocations.size(), 2u);
  EXPECT_EQ(trace.allocations[0].bytes, 1024u);
  EXPECT_EQ(trace.allocations[0].start, 0u);
  EXPECT_EQ(trace.allocations[0].end, 2u);
  EXPECT_EQ(trace.allocations[1].start, 1u);
  EXPECT_EQ(trace.allocations[1].end, AllocationSequence::kStillLive);
}

// A segment of 8 MiB whose first 1 MiB is live: one free region of 7 MiB.
struct OneRegion {
  BestFitPool pool;
  Segment* segment = pool.add_segment(kBase, 8 * kMiB, false, false);
  OneRegion() {
    pool.insert_free(pool.split(segment->first, kMiB));
    pool.mark_live(segment->first, kMiB);
  }
};

AllocationSequence two_overlapping() {
  AllocationSequence t;
  t.allocations = {{.bytes = 2 * kMiB, .start = 0, .end = 3},
                   {.bytes = kMiB, .start = 1, .end = 2}};
  return t;
}

TEST(StepPlacementTest, FollowsAPlacementInTheRegionsItFinds) {
  OneRegion r;
  StepPlacement placement(r.pool);
  const std::vector<Block*> regions = placement.find_regions(nullptr);
  ASSERT_EQ(regions.size(), 1u);
  EXPECT_EQ(regions[0]->size, 7 * kMiB);
  auto given = std::make_shared<const Placement>(place_allocations(two_overlapping()));
  auto layout = placement.layout_for(given, {7 * kMiB});
  EXPECT_EQ(layout->arena_bytes, 0u);                          // the region holds both
  EXPECT_EQ(placement.layout_for(given, {7 * kMiB}), layout);  // made once
  placement.follow(layout, regions, nullptr);
  EXPECT_TRUE(placement.has_ranges());
  Block* a = placement.take(2 * kMiB);
  Block* b = placement.take(kMiB);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(a->address, kBase + kMiB + layout->offsets[0]);
  EXPECT_EQ(b->address, kBase + kMiB + layout->offsets[1]);
  EXPECT_EQ(a->size, 2 * kMiB);
  EXPECT_TRUE(placement.in_placed_range(a));
  EXPECT_EQ(placement.placed, 2u);
  EXPECT_EQ(placement.take(kMiB), nullptr);  // past the sequence: served as usual
  EXPECT_EQ(placement.misses, 0u);
}

TEST(StepPlacementTest, ARequestOfAnotherSizeEndsThePlacement) {
  OneRegion r;
  StepPlacement placement(r.pool);
  const std::vector<Block*> regions = placement.find_regions(nullptr);
  auto given = std::make_shared<const Placement>(place_allocations(two_overlapping()));
  placement.follow(placement.layout_for(given, {7 * kMiB}), regions, nullptr);
  EXPECT_EQ(placement.take(3 * kMiB), nullptr);
  EXPECT_EQ(placement.misses, 1u);
  EXPECT_FALSE(placement.has_ranges());  // the region is open to every request again
  EXPECT_EQ(placement.take(kMiB), nullptr);
  EXPECT_EQ(r.pool.free_set(false).size(), 1u);  // nothing was cut
}

}  // namespace
}  // namespace remat::detail
