// Placing traced allocations (Note [Greedy placement by size] in placement.cc).
#include "remat/placement.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

namespace remat {
namespace {

// A random program of allocations and frees: about `n` allocations of random sizes (multiples
// of 512 bytes), some still live at the end.
AllocationSequence random_trace(std::mt19937& rng, int n) {
  AllocationSequence t;
  std::vector<std::size_t> live;
  std::size_t clock = 0;
  std::uniform_int_distribution<int> size(1, 64), coin(0, 99);
  for (int i = 0; i < n || !live.empty(); ++i) {
    const bool allocate = i < n && (live.empty() || coin(rng) < 55);
    if (allocate) {
      const std::size_t bytes = static_cast<std::size_t>(size(rng)) * (coin(rng) < 10 ? 8192 : 512);
      live.push_back(t.allocations.size());
      t.allocations.push_back({.bytes = bytes, .start = clock++});
      continue;
    }
    std::uniform_int_distribution<std::size_t> pick(0, live.size() - 1);
    const std::size_t k = pick(rng);
    if (i >= n && coin(rng) < 5) {  // left live at the end
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
      continue;
    }
    t.allocations[live[k]].end = clock++;
    live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
  }
  return t;
}

// Every placed allocation lies inside its region (the arena: inside arena_bytes), and two
// whose lifetimes overlap in the same region never share a byte.
void expect_valid(const AllocationSequence& t, const Placement& p) {
  const std::size_t arena = p.regions.size();
  ASSERT_EQ(p.region.size(), t.allocations.size());
  for (std::size_t i = 0; i < t.allocations.size(); ++i) {
    const auto& a = t.allocations[i];
    if (a.end == AllocationSequence::kStillLive) {
      EXPECT_EQ(p.region[i], Placement::kUnplaced) << "allocation " << i << " outlives the trace";
      continue;
    }
    ASSERT_LE(p.region[i], arena) << "allocation " << i;
    const std::size_t capacity = p.region[i] == arena ? p.arena_bytes : p.regions[p.region[i]];
    EXPECT_LE(p.offsets[i] + a.bytes, capacity) << "allocation " << i;
    for (std::size_t j = 0; j < i; ++j) {
      const auto& b = t.allocations[j];
      if (b.end == AllocationSequence::kStillLive || p.region[j] != p.region[i]) continue;
      if (!(a.start < b.end && b.start < a.end)) continue;
      const bool apart =
          p.offsets[i] + a.bytes <= p.offsets[j] || p.offsets[j] + b.bytes <= p.offsets[i];
      EXPECT_TRUE(apart) << "allocations " << j << " and " << i << " overlap";
    }
  }
}

TEST(PlacementTest, RandomTracesGetDisjointPlacesWithinTheirRegions) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 60; ++trial) {
    const AllocationSequence t = random_trace(rng, 20 + trial * 5);
    std::vector<std::size_t> regions;
    std::uniform_int_distribution<int> count(0, 3), kib(1, 512);
    for (int r = count(rng); r > 0; --r)
      regions.push_back(static_cast<std::size_t>(kib(rng)) << 10);
    const Placement p = place_allocations(t, regions);
    SCOPED_TRACE(testing::Message() << "trial " << trial);
    expect_valid(t, p);
    // At the moment of the peak, every live allocation has bytes of its own somewhere.
    std::size_t total = p.arena_bytes;
    for (std::size_t r : regions) total += r;
    EXPECT_GE(total, t.peak_live_bytes());
    if (regions.empty()) {
      EXPECT_GE(p.arena_bytes, t.peak_live_bytes());
    }
    // The same trace and regions give the same placement.
    const Placement again = place_allocations(t, regions);
    EXPECT_EQ(again.offsets, p.offsets);
    EXPECT_EQ(again.region, p.region);
  }
}

// Allocations that never live at the same time share one place: the arena is the largest.
TEST(PlacementTest, AllocationsThatNeverOverlapShareTheirBytes) {
  AllocationSequence t;
  t.allocations = {{.bytes = 4096, .start = 0, .end = 1},
                   {.bytes = 8192, .start = 2, .end = 3},
                   {.bytes = 1024, .start = 4, .end = 5}};
  const Placement p = place_allocations(t);
  EXPECT_EQ(p.arena_bytes, 8192u);
  EXPECT_EQ(p.offsets, (std::vector<std::size_t>{0, 0, 0}));
}

// A region large enough for everything leaves the arena empty; one too small for the
// largest block sends it to the arena while smaller ones use the region.
TEST(PlacementTest, RegionsAreUsedBeforeTheArena) {
  AllocationSequence t;
  t.allocations = {{.bytes = 8192, .start = 0, .end = 3}, {.bytes = 2048, .start = 1, .end = 2}};
  const Placement roomy = place_allocations(t, {16384});
  EXPECT_EQ(roomy.arena_bytes, 0u);
  EXPECT_EQ(roomy.region, (std::vector<std::size_t>{0, 0}));
  const Placement tight = place_allocations(t, {4096});
  EXPECT_EQ(tight.region, (std::vector<std::size_t>{1, 0}));
  EXPECT_EQ(tight.arena_bytes, 8192u);
}

TEST(PlacementTest, EmptyTraceNeedsNoArena) {
  const Placement p = place_allocations(AllocationSequence{});
  EXPECT_EQ(p.arena_bytes, 0u);
  EXPECT_TRUE(p.offsets.empty());
}

}  // namespace
}  // namespace remat
