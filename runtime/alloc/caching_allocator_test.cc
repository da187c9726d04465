// The conformance suite (tests/support/memory_resource_conformance.h) run against the caching
// allocator's parts (the best-fit pool over host and simulated segments, the expandable
// arena) and logical accounting, then tests of what only the caching allocator does.
#include "remat/caching_allocator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include "remat/errors.h"
#include "remat/logical_memory.h"
#include "remat/placement.h"
#include "runtime/alloc/detail/allocator_hooks.h"
#include "tests/support/memory_resource_conformance.h"

namespace remat {
namespace {

constexpr std::size_t kBudget = testing::kConformanceBudget;

CachingAllocatorOptions small_segments() {
  CachingAllocatorOptions o;
  o.budget = kBudget;
  o.small_segment = 256 << 10;
  o.medium_segment = 4 << 20;
  return o;
}

struct HostCaching {
  static std::unique_ptr<MemoryResource> make() {
    return std::make_unique<CachingAllocator>(std::make_unique<HostSegmentSource>(),
                                              small_segments());
  }
  static constexpr bool kHost = true;
};
struct SimulatedCaching {
  static std::unique_ptr<MemoryResource> make() {
    return std::make_unique<CachingAllocator>(std::make_unique<SimulatedSegmentSource>(),
                                              small_segments());
  }
  static constexpr bool kHost = false;
};
CachingAllocatorOptions arena() {
  CachingAllocatorOptions o = small_segments();
  o.expandable_segments = true;
  return o;
}
struct HostArena {
  static std::unique_ptr<MemoryResource> make() {
    return std::make_unique<CachingAllocator>(std::make_unique<HostSegmentSource>(), arena());
  }
  static constexpr bool kHost = true;
};
struct SimulatedArena {
  static std::unique_ptr<MemoryResource> make() {
    return std::make_unique<CachingAllocator>(std::make_unique<SimulatedSegmentSource>(), arena());
  }
  static constexpr bool kHost = false;
};
struct HostLogical {
  static std::unique_ptr<MemoryResource> make() {
    return std::make_unique<LogicalMemory>(kBudget, true);
  }
  static constexpr bool kHost = true;
};
struct SimulatedLogical {
  static std::unique_ptr<MemoryResource> make() {
    return std::make_unique<LogicalMemory>(kBudget, false);
  }
  static constexpr bool kHost = false;
};

using Resources = ::testing::Types<HostCaching, SimulatedCaching, HostArena, SimulatedArena,
                                   HostLogical, SimulatedLogical>;
}  // namespace
namespace testing {
INSTANTIATE_TYPED_TEST_SUITE_P(Alloc, MemoryResourceConformance, Resources);
}  // namespace testing
namespace {

using testing::FreeingReclaimer;

// ---- the caching allocator alone ----

// Note [Placed allocations]: a random program traced on an allocator without a budget
// replays on another, beside the same constants, at exactly its places: every request is
// placed, live blocks never overlap, and the second replay reuses the first one's arena. A
// request of another size ends the placement, and the rest is served as usual.
TEST(CachingAllocatorTest, ATracedProgramReplaysAtItsPlaces) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 12; ++trial) {
    SCOPED_TRACE(::testing::Message() << "trial " << trial);
    std::uniform_int_distribution<int> kib(1, 3000), coin(0, 99);
    std::vector<std::size_t> constants(6);
    for (std::size_t& c : constants) c = static_cast<std::size_t>(kib(rng)) << 10;
    // The program: +bytes allocates, -k frees the k-th allocation still live.
    std::vector<std::int64_t> program;
    int live = 0;
    for (int i = 0; i < 200 || live > 0; ++i) {
      if (i < 200 && (live == 0 || coin(rng) < 55)) {
        program.push_back(static_cast<std::int64_t>(kib(rng)) << 10);
        ++live;
      } else {
        program.push_back(-std::uniform_int_distribution<std::int64_t>(0, live - 1)(rng));
        --live;
      }
    }
    // Runs the program, checking that live blocks never overlap; `change` resizes the
    // request at that index.
    auto run = [&](CachingAllocator& a, std::size_t change = SIZE_MAX) {
      std::vector<std::pair<void*, std::size_t>> held;
      std::map<std::uintptr_t, std::uintptr_t> ranges;  // begin -> end of live blocks
      std::size_t request = 0;
      for (std::int64_t step : program) {
        if (step > 0) {
          const std::size_t bytes =
              static_cast<std::size_t>(step) + (request++ == change ? 4096 : 0);
          void* p = a.allocate(bytes);
          const auto begin = reinterpret_cast<std::uintptr_t>(p);
          auto next = ranges.lower_bound(begin);
          EXPECT_TRUE(next == ranges.end() || next->first >= begin + bytes);
          EXPECT_TRUE(next == ranges.begin() || std::prev(next)->second <= begin);
          ranges[begin] = begin + bytes;
          held.emplace_back(p, bytes);
        } else {
          const auto k = static_cast<std::size_t>(-step);
          a.deallocate(held[k].first, held[k].second);
          ranges.erase(reinterpret_cast<std::uintptr_t>(held[k].first));
          held.erase(held.begin() + static_cast<std::ptrdiff_t>(k));
        }
      }
    };
    CachingAllocator traced(std::make_unique<SimulatedSegmentSource>(), {});
    for (std::size_t c : constants) traced.allocate(c);
    traced.record_allocations();
    run(traced);
    auto placement =
        std::make_shared<const Placement>(place_allocations(traced.take_allocations()));
    ASSERT_GT(placement->arena_bytes, 0u);

    CachingAllocatorOptions o = small_segments();
    o.budget = std::size_t{1} << 30;
    CachingAllocator placed(std::make_unique<SimulatedSegmentSource>(), o);
    for (std::size_t c : constants) placed.allocate(c);
    for (int replay = 0; replay < 2; ++replay) {
      const std::size_t reserves = placed.stats().segment_reserves;
      ASSERT_TRUE(placed.begin_placement(placement));
      const std::size_t before = placed.stats().placed_allocations;
      run(placed);
      EXPECT_EQ(placed.stats().placed_allocations - before, placement->sequence.allocations.size());
      EXPECT_EQ(placed.stats().placement_misses, 0u);
      if (replay == 1) {
        EXPECT_EQ(placed.stats().segment_reserves, reserves) << "arena reused";
      }
    }
    ASSERT_TRUE(placed.begin_placement(placement));
    run(placed, /*change=*/50);
    EXPECT_EQ(placed.stats().placement_misses, 1u);
    placed.end_placement();
  }
}

// A placement's regions lie in segments that hold other blocks when it begins; one whose
// blocks all go mid-step is not given back while the placement may still place into it.
TEST(CachingAllocatorTest, ASegmentHoldingPlacedRangesIsNotReleased) {
  CachingAllocatorOptions o = small_segments();  // 4 MiB medium segments
  CachingAllocator traced(std::make_unique<SimulatedSegmentSource>(), {});
  traced.record_allocations();
  for (int i = 0; i < 3; ++i) traced.deallocate(traced.allocate(std::size_t{1} << 20), 1 << 20);
  auto placement = std::make_shared<const Placement>(place_allocations(traced.take_allocations()));

  CachingAllocator placed(std::make_unique<SimulatedSegmentSource>(), o);
  void* constant = placed.allocate(std::size_t{1} << 20);  // leaves a 3 MiB hole beside it
  ASSERT_TRUE(placed.begin_placement(placement));
  ASSERT_TRUE(placed.last_placement().has_value());
  EXPECT_EQ(placed.last_placement()->arena_bytes, 0u) << "the hole holds the whole trace";
  placed.deallocate(placed.allocate(std::size_t{1} << 20), 1 << 20);
  placed.deallocate(constant, 1 << 20);
  placed.release_cached();
  EXPECT_EQ(placed.stats().segments, 1u);
  for (int i = 0; i < 2; ++i) placed.deallocate(placed.allocate(std::size_t{1} << 20), 1 << 20);
  EXPECT_EQ(placed.stats().placed_allocations, 3u);
  EXPECT_EQ(placed.stats().placement_misses, 0u);
  placed.end_placement();
  placed.release_cached();
  EXPECT_EQ(placed.stats().segments, 0u);
}

// Two 4 MiB requests one after the other, placed: one 4 MiB place for both.
std::shared_ptr<const Placement> two_in_turn(std::size_t headroom) {
  CachingAllocator traced(std::make_unique<SimulatedSegmentSource>(), {});
  traced.record_allocations();
  for (int i = 0; i < 2; ++i) traced.deallocate(traced.allocate(std::size_t{4} << 20), 4 << 20);
  Placement p = place_allocations(traced.take_allocations());
  p.headroom_bytes = headroom;
  return std::make_shared<const Placement>(std::move(p));
}

// Note [Scratch borrows the arena's headroom]: with the budget all arena, a kernel's scratch
// (short-lived) made while a placed block is live takes the arena's headroom and the
// placement goes on; a constant (paused, not short-lived) ends it instead.
TEST(CachingAllocatorTest, OnlyShortLivedRequestsBorrowTheArenasHeadroom) {
  for (bool short_lived : {true, false}) {
    SCOPED_TRACE(short_lived ? "scratch" : "constant");
    CachingAllocatorOptions o = small_segments();
    o.budget = std::size_t{6} << 20;
    CachingAllocator placed(std::make_unique<SimulatedSegmentSource>(), o);
    ASSERT_TRUE(placed.begin_placement(two_in_turn(std::size_t{2} << 20)));
    EXPECT_EQ(placed.stats().reserved, o.budget);
    void* held = placed.allocate(std::size_t{4} << 20);
    placed.pause_placement(true, short_lived);
    void* scratch = placed.allocate(std::size_t{2} << 20);
    placed.deallocate(scratch, 2 << 20);
    placed.pause_placement(false, short_lived);
    placed.deallocate(held, 4 << 20);
    placed.deallocate(placed.allocate(std::size_t{4} << 20), 4 << 20);
    EXPECT_EQ(placed.stats().placement_misses, short_lived ? 0u : 1u);
    EXPECT_EQ(placed.stats().placed_allocations, short_lived ? 2u : 1u);
    EXPECT_LE(placed.stats().peak_reserved, o.budget);
    placed.end_placement();
  }
}

// Placement::headroom_bytes: without room in the budget for the arena and its headroom, the
// placement is not begun (a miss), and requests are served as usual.
TEST(CachingAllocatorTest, AnArenaIsMadeWithItsHeadroomOrNotAtAll) {
  CachingAllocatorOptions o = small_segments();
  o.budget = std::size_t{5} << 20;
  CachingAllocator placed(std::make_unique<SimulatedSegmentSource>(), o);
  EXPECT_FALSE(placed.begin_placement(two_in_turn(std::size_t{2} << 20)));
  EXPECT_EQ(placed.stats().placement_misses, 1u);
  ASSERT_TRUE(placed.last_placement().has_value());
  EXPECT_EQ(placed.last_placement()->arena_bytes, std::size_t{6} << 20);
  placed.deallocate(placed.allocate(std::size_t{4} << 20), 4 << 20);
  EXPECT_EQ(placed.stats().placed_allocations, 0u);
  EXPECT_TRUE(placed.begin_placement(two_in_turn(0)));
  placed.end_placement();
}

TEST(CachingAllocatorTest, FreedBlockIsReusedWithoutNewSegment) {
  CachingAllocator alloc(std::make_unique<SimulatedSegmentSource>(), small_segments());
  void* a = alloc.allocate(1000);
  const std::size_t segments = alloc.stats().segments;
  alloc.deallocate(a, 1000);
  void* b = alloc.allocate(900);
  EXPECT_EQ(a, b);  // best fit at the lowest address
  EXPECT_EQ(alloc.stats().segments, segments);
  alloc.deallocate(b, 900);
}

// Note [Packing pinned storages]: a block moves only down, to the lowest free block below it.
TEST(CachingAllocatorTest, AllocateBelowTakesTheLowestFreeBlockUnderTheBlock) {
  CachingAllocator alloc(std::make_unique<SimulatedSegmentSource>(), small_segments());
  void* a = alloc.allocate(4096);
  void* b = alloc.allocate(4096);
  void* c = alloc.allocate(4096);
  void* d = alloc.allocate(4096);
  alloc.deallocate(a, 4096);
  alloc.deallocate(b, 4096);
  EXPECT_EQ(detail::AllocatorHooks::allocate_below(alloc, 8192, a), nullptr);  // not live
  void* moved = detail::AllocatorHooks::allocate_below(alloc, 4096, d);
  EXPECT_EQ(moved, a);
  // Nothing free lies below `moved` now; c has b's block below it.
  EXPECT_EQ(detail::AllocatorHooks::allocate_below(alloc, 4096, moved), nullptr);
  EXPECT_EQ(detail::AllocatorHooks::allocate_below(alloc, 4096, c), b);
  EXPECT_EQ(alloc.stats().segments, 1u);
  for (void* p : {a, b, c, d}) alloc.deallocate(p, 4096);
}

// Note [Compaction]: the dry run agrees with the placements it predicts, and a placement
// never lands in an avoided segment or window. Random layouts over several segments.
TEST(CachingAllocatorTest, PlacesOutsideAgreesWithAllocateOutside) {
  std::mt19937_64 rng(7);
  int fits = 0, misses = 0;
  for (int trial = 0; trial < 200; ++trial) {
    CachingAllocatorOptions o = small_segments();
    o.medium_segment = 64 << 10;  // many segments
    CachingAllocator alloc(std::make_unique<SimulatedSegmentSource>(), o);
    std::vector<std::pair<void*, std::size_t>> live;
    for (int k = 0; k < 60; ++k) {
      const std::size_t n = 512 * (1 + rng() % 40);
      live.emplace_back(alloc.allocate(n), n);
    }
    std::shuffle(live.begin(), live.end(), rng);
    for (std::size_t k = 0; k < live.size() / 2; ++k)
      alloc.deallocate(live[k].first, live[k].second);
    live.erase(live.begin(), live.begin() + static_cast<std::ptrdiff_t>(live.size() / 2));
    detail::AvoidedMemory avoid;
    for (const auto& [p, n] : live)
      if (rng() % 3 == 0)
        avoid.segments.push_back(detail::AllocatorHooks::segment_serial(alloc, p));
    // An address window too, from one live block's start over 64 KiB.
    avoid.window_begin = reinterpret_cast<std::uintptr_t>(live[rng() % live.size()].first);
    avoid.window_end = avoid.window_begin + (64 << 10);
    std::vector<std::size_t> sizes;
    for (int k = 0, m = 1 + static_cast<int>(rng() % 12); k < m; ++k)
      sizes.push_back(512 * (1 + rng() % 80));
    const bool predicted = detail::AllocatorHooks::places_outside(alloc, sizes, avoid);
    const std::size_t reserved = alloc.stats().reserved;
    std::sort(sizes.begin(), sizes.end(), std::greater<>());
    bool placed = true;
    for (std::size_t n : sizes) {
      void* p = detail::AllocatorHooks::allocate_outside(alloc, n, avoid);
      if (p == nullptr) {
        placed = false;
        break;
      }
      const std::uint64_t serial = detail::AllocatorHooks::segment_serial(alloc, p);
      EXPECT_FALSE(avoid.avoids(serial, reinterpret_cast<std::uintptr_t>(p), n)) << trial;
      live.emplace_back(p, n);
    }
    EXPECT_EQ(predicted, placed) << trial;
    EXPECT_EQ(alloc.stats().reserved, reserved) << "placing outside never reserves";
    (predicted ? fits : misses) += 1;
    for (const auto& [p, n] : live) alloc.deallocate(p, n);
  }
  EXPECT_GT(fits, 20);  // both answers were exercised
  EXPECT_GT(misses, 20);
}

TEST(CachingAllocatorTest, SplitsAndCoalescesNeighbours) {
  CachingAllocator alloc(std::make_unique<SimulatedSegmentSource>(), small_segments());
  void* a = alloc.allocate(4096);
  void* b = alloc.allocate(4096);
  void* c = alloc.allocate(4096);
  EXPECT_EQ(alloc.stats().segments, 1u);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(b), reinterpret_cast<std::uintptr_t>(a) + 4096);
  alloc.deallocate(a, 4096);
  alloc.deallocate(b, 4096);  // merges with a's block
  void* d = alloc.allocate(8192);
  EXPECT_EQ(d, a);
  alloc.deallocate(c, 4096);
  alloc.deallocate(d, 8192);
  alloc.release_cached();
  EXPECT_EQ(alloc.stats().reserved, 0u);
  EXPECT_EQ(alloc.stats().segments, 0u);
}

TEST(CachingAllocatorTest, RoundsSizesAndSeparatesPools) {
  CachingAllocatorOptions o = small_segments();
  o.one_pool_under_budget = false;  // PyTorch's two pools
  CachingAllocator alloc(std::make_unique<SimulatedSegmentSource>(), o);
  EXPECT_EQ(alloc.rounded_size(1), 512u);
  EXPECT_EQ(alloc.rounded_size(513), 1024u);
  EXPECT_TRUE(detail::AllocatorHooks::is_small(alloc, 1 << 20));
  EXPECT_FALSE(detail::AllocatorHooks::is_small(alloc, (1 << 20) + 1));
  void* s = alloc.allocate(100);
  void* l = alloc.allocate(2 << 20);
  EXPECT_EQ(alloc.stats().segments, 2u);  // a small and a large segment
  alloc.deallocate(s, 100);
  alloc.deallocate(l, 2 << 20);
}

// Note [One pool under a budget]: with a budget, a small request and a large one share a
// segment, and a large block is split down to the rounding, so the bytes a small tensor
// frees serve a large request and the reverse.
TEST(CachingAllocatorTest, OnePoolUnderABudgetSharesSegmentsAcrossSizes) {
  CachingAllocatorOptions o = small_segments();  // 4 MiB medium segments, 8 MiB budget
  o.budget = 4 << 20;
  CachingAllocator alloc(std::make_unique<SimulatedSegmentSource>(), o);
  EXPECT_FALSE(detail::AllocatorHooks::is_small(alloc, 100));
  void* s = alloc.allocate(100);
  void* l = alloc.allocate(2 << 20);
  EXPECT_EQ(alloc.stats().segments, 1u);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(l), reinterpret_cast<std::uintptr_t>(s) + 512);
  // The rest of the segment (2 MiB - 512) is a block of its own, not part of l's.
  void* rest = alloc.allocate((2 << 20) - 512);
  EXPECT_EQ(alloc.stats().segments, 1u);
  EXPECT_EQ(alloc.stats().reserved, std::size_t{4} << 20);
  alloc.deallocate(s, 100);
  alloc.deallocate(rest, (2 << 20) - 512);
  void* again = alloc.allocate(100);  // freed small bytes are reused by address order
  EXPECT_EQ(again, s);
  alloc.deallocate(again, 100);
  alloc.deallocate(l, 2 << 20);
  // Without a budget the two pools come back.
  CachingAllocatorOptions unbounded = small_segments();
  unbounded.budget = SIZE_MAX;
  CachingAllocator two(std::make_unique<SimulatedSegmentSource>(), unbounded);
  EXPECT_TRUE(detail::AllocatorHooks::is_small(two, 100));
}

// Note [Whole segments for large tensors]: a large tensor's freed segment is not cut up for a
// smaller request; it serves a request of about its size, or goes back to make room.
TEST(CachingAllocatorTest, LargeSegmentsStayWholeUnderABudget) {
  CachingAllocatorOptions o = small_segments();
  o.budget = 10 << 20;
  o.medium_max = 1 << 20;
  o.large_round = 1 << 20;
  CachingAllocator alloc(std::make_unique<SimulatedSegmentSource>(), o);
  void* a = alloc.allocate(6 << 20);
  alloc.deallocate(a, 6 << 20);
  void* s = alloc.allocate(2 << 20);  // does not split a's cached 6 MiB
  EXPECT_NE(s, a);
  EXPECT_EQ(alloc.stats().reserved, std::size_t{8} << 20);
  void* b = alloc.allocate((6 << 20) - (100 << 10));  // within large_round: reuses it whole
  EXPECT_EQ(b, a);
  EXPECT_EQ(alloc.stats().allocated, std::size_t{8} << 20);
  alloc.deallocate(b, (6 << 20) - (100 << 10));
  void* c = alloc.allocate(4 << 20);  // no room for a new 4 MiB: a's segment goes back first
  EXPECT_NE(c, a);
  EXPECT_LE(alloc.stats().peak_reserved, o.budget);
  EXPECT_EQ(alloc.stats().reserved, std::size_t{6} << 20);
  alloc.deallocate(c, 4 << 20);
  alloc.deallocate(s, 2 << 20);
  // What the window search asks: a whole segment serves only a request of about its size.
  const detail::SegmentView whole{false, true}, shared{false, false};
  EXPECT_FALSE(detail::AllocatorHooks::window_serves(alloc, whole, 6 << 20, 2 << 20));
  EXPECT_TRUE(
      detail::AllocatorHooks::window_serves(alloc, whole, 6 << 20, (6 << 20) - (100 << 10)));
  EXPECT_TRUE(detail::AllocatorHooks::window_serves(alloc, shared, 6 << 20, 2 << 20));
  // Without the option, best fit splits the cached segment.
  o.whole_large_segments = false;
  CachingAllocator split(std::make_unique<SimulatedSegmentSource>(), o);
  void* x = split.allocate(6 << 20);
  split.deallocate(x, 6 << 20);
  void* y = split.allocate(2 << 20);
  EXPECT_EQ(y, x);
  split.deallocate(y, 2 << 20);
}

// What the runtime asks before it evicts its best victim (Note [Contiguous eviction]): would
// freeing this one block serve the request? Property: in random states of segments and of
// the arena where a request fails, it succeeds after freeing a random live block exactly
// when release_would_serve said so.
TEST(CachingAllocatorTest, ReleaseWouldServeIsExact) {
  using Live = std::vector<std::pair<void*, std::size_t>>;
  // The same seed gives the same state, so each live block can be tried on its own copy.
  auto build = [](int trial, CachingAllocator& alloc, Live& live) {
    std::mt19937_64 rng(static_cast<std::uint64_t>(trial));
    std::uniform_int_distribution<std::size_t> size_of(1, 3 << 20);
    for (int step = 0; step < 200; ++step) {
      if (!live.empty() && rng() % 3 == 0) {
        const std::size_t i = rng() % live.size();
        alloc.deallocate(live[i].first, live[i].second);
        live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
        continue;
      }
      const std::size_t n = size_of(rng) >> (rng() % 6);
      try {
        live.emplace_back(alloc.allocate(n), n);
      } catch (const OutOfMemoryError&) {
      }
    }
    return size_of(rng) >> (rng() % 3);  // the request to predict for
  };
  auto options = [](int trial) {
    CachingAllocatorOptions o = (trial % 2 == 0) ? small_segments() : arena();
    o.budget = static_cast<std::size_t>(8 + trial % 24) << 20;
    o.medium_max = 2 << 20;
    o.large_round = 1 << 20;
    return o;
  };
  int predicted_true = 0, predicted_false = 0;
  for (int trial = 0; trial < 120; ++trial) {
    CachingAllocator probe(std::make_unique<SimulatedSegmentSource>(), options(trial));
    Live live;
    const std::size_t n = build(trial, probe, live);
    try {
      probe.deallocate(probe.allocate(n), n);
      continue;  // served already: nothing to predict
    } catch (const OutOfMemoryError&) {
    }
    for (std::size_t v = 0; v < live.size(); ++v) {
      CachingAllocator alloc(std::make_unique<SimulatedSegmentSource>(), options(trial));
      Live same;
      build(trial, alloc, same);
      EXPECT_THROW(alloc.allocate(n), OutOfMemoryError);
      const bool predicted = detail::AllocatorHooks::release_would_serve(alloc, same[v].first, n);
      (predicted ? predicted_true : predicted_false)++;
      alloc.deallocate(same[v].first, same[v].second);
      bool served = true;
      try {
        alloc.deallocate(alloc.allocate(n), n);
      } catch (const OutOfMemoryError&) {
        served = false;
      }
      EXPECT_EQ(served, predicted)
          << "trial " << trial << ", block " << v << ": request of " << n << " bytes";
      EXPECT_LE(alloc.stats().peak_reserved, options(trial).budget);
    }
  }
  // Both answers must have come up often, or the property says little.
  EXPECT_GT(predicted_true, 50);
  EXPECT_GT(predicted_false, 50);
}

// A source that refuses below the budget (cudaMalloc on a device with less free memory than
// the budget) is handled like a full budget: cached segments go back and the reclaimer evicts;
// when that cannot help, the error says the source refused, below the budget.
TEST(CachingAllocatorTest, SourceRefusalBelowTheBudgetIsReportedAsSuch) {
  CachingAllocatorOptions o = small_segments();
  o.budget = 64 << 20;
  CachingAllocator alloc(std::make_unique<SimulatedSegmentSource>(std::size_t{12} << 20), o);
  void* a = alloc.allocate(6 << 20);
  try {
    alloc.allocate(8 << 20);  // the budget has room; the source (12 MiB) does not
    FAIL();
  } catch (const OutOfMemoryError& e) {
    EXPECT_EQ(e.info().source_refused, std::size_t{8} << 20);
    EXPECT_EQ(e.info().source, "simulated");
    EXPECT_LT(e.info().reserved + e.info().requested, e.budget());
    EXPECT_NE(std::string(e.what()).find("refused a reservation"), std::string::npos) << e.what();
  }
  EXPECT_GT(alloc.stats().source_refusals, 0u);
  // With something to free, the refusal sends the allocator to the reclaimer, and it serves.
  FreeingReclaimer reclaimer(&alloc);
  alloc.set_reclaimer(&reclaimer);
  reclaimer.held.emplace_back(a, 6 << 20);
  void* b = alloc.allocate(8 << 20);
  EXPECT_EQ(reclaimer.calls, 1);
  alloc.deallocate(b, 8 << 20);
  // A budget failure names no source.
  alloc.set_reclaimer(nullptr);
  try {
    alloc.allocate(65 << 20);
    FAIL();
  } catch (const OutOfMemoryError& e) {
    EXPECT_EQ(e.info().source_refused, 0u);
    EXPECT_EQ(std::string(e.what()).find("refused"), std::string::npos) << e.what();
  }
}

// Under a budget, cached segments of the wrong pool are returned before the request fails.
TEST(CachingAllocatorTest, ReleasesCachedSegmentsToStayUnderBudget) {
  CachingAllocatorOptions o = small_segments();
  o.budget = 8 << 20;
  CachingAllocator alloc(std::make_unique<SimulatedSegmentSource>(), o);
  std::vector<void*> small;
  for (int i = 0; i < 16; ++i) small.push_back(alloc.allocate(200 << 10));
  for (void* p : small) alloc.deallocate(p, 200 << 10);
  EXPECT_GT(alloc.stats().reserved, 2u << 20);
  void* big = alloc.allocate(7 << 20);
  EXPECT_LE(alloc.stats().peak_reserved, o.budget);
  EXPECT_GT(alloc.stats().retries, 0u);
  alloc.deallocate(big, 7 << 20);
}

TEST(CachingAllocatorTest, OutOfMemoryNamesLargestFreeBlock) {
  CachingAllocatorOptions o = small_segments();
  o.budget = 6 << 20;
  CachingAllocator alloc(std::make_unique<SimulatedSegmentSource>(), o);
  void* a = alloc.allocate(3 << 20);
  void* b = alloc.allocate(2 << 20);
  alloc.deallocate(a, 3 << 20);
  void* c = alloc.allocate((1 << 20) + 512);  // large pool: keeps a's segment alive
  try {
    alloc.allocate(5 << 20);
    FAIL();
  } catch (const OutOfMemoryError& e) {
    EXPECT_EQ(e.info().largest_free, (std::size_t{3} << 20) - 512);  // rest of a's segment
    EXPECT_NE(std::string(e.what()).find("largest free block"), std::string::npos);
  }
  alloc.deallocate(b, 2 << 20);
  alloc.deallocate(c, (1 << 20) + 512);
}

TEST(CachingAllocatorTest, ArenaGrowsAtItsEndAndGivesTheTailBack) {
  CachingAllocatorOptions o = arena();
  o.budget = 16 << 20;
  CachingAllocator alloc(std::make_unique<SimulatedSegmentSource>(), o);
  void* a = alloc.allocate(100);  // small and large requests share the arena
  void* b = alloc.allocate(3 << 20);
  EXPECT_EQ(alloc.stats().segments, 1u);
  EXPECT_EQ(alloc.stats().reserved, std::size_t{4} << 20);  // grown in 2 MiB steps
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(b), reinterpret_cast<std::uintptr_t>(a) + 512);
  void* c = alloc.allocate(11 << 20);  // grows by what is missing, within the budget
  EXPECT_LE(alloc.stats().reserved, o.budget);
  alloc.deallocate(c, 11 << 20);
  alloc.release_cached();  // the free tail goes back, down to b's end
  EXPECT_EQ(alloc.stats().reserved, (std::size_t{3} << 20) + 512);
  alloc.deallocate(a, 100);
  alloc.deallocate(b, 3 << 20);
  alloc.release_cached();
  EXPECT_EQ(alloc.stats().reserved, 0u);
  // The room left under the budget is reported after the arena's last block.
  detail::BlockLayout layout;
  detail::AllocatorHooks::layout(alloc, layout);
  std::size_t room = 0;
  for (std::size_t i = 0; i < layout.tags.size(); ++i)
    room += layout.tags[i] == detail::BlockLayout::kFree ? layout.sizes[i] : 0;
  EXPECT_EQ(room, o.budget);
  ASSERT_EQ(layout.segments.size(), 1u);
  EXPECT_EQ(layout.segments[0].bytes, o.budget);
}

// Random sequences over many segments, and the arena: the layout lists every block of every
// segment once, in address order, with its tag, and the segments' blocks tile them without a
// gap (the block counts that place each segment are kept right through splits and merges).
TEST(CachingAllocatorTest, LayoutListsEveryBlockInAddressOrder) {
  for (const bool expandable : {false, true}) {
    CachingAllocatorOptions o = expandable ? arena() : small_segments();
    CachingAllocator alloc(std::make_unique<SimulatedSegmentSource>(), o);
    std::mt19937_64 rng(expandable ? 11 : 12);
    std::map<std::uint32_t, std::pair<std::uintptr_t, std::size_t>> live;  // tag: where, bytes
    std::uint32_t next_tag = 0;
    for (int step = 0; step < 3000; ++step) {
      if (live.empty() || rng() % 100 < 60) {
        const std::size_t n = rng() % 3 == 0 ? 1 + rng() % (3 << 20) : 1 + rng() % 9000;
        if (alloc.stats().allocated + n > kBudget / 2) continue;
        void* p = alloc.allocate(n);
        detail::AllocatorHooks::set_tag(alloc, p, next_tag);
        live[next_tag++] = {reinterpret_cast<std::uintptr_t>(p), n};
      } else {
        auto it = std::next(live.begin(), static_cast<long>(rng() % live.size()));
        alloc.deallocate(reinterpret_cast<void*>(it->second.first), it->second.second);
        live.erase(it);
      }
      if (step % 50 != 0) continue;
      detail::BlockLayout layout;
      detail::AllocatorHooks::layout(alloc, layout);
      ASSERT_EQ(layout.segments.size(), alloc.stats().segments);
      ASSERT_EQ(layout.tags.size(), layout.sizes.size());
      std::size_t seen = 0, expected_begin = 0;
      for (const detail::BlockLayout::Segment& seg : layout.segments) {
        ASSERT_EQ(seg.begin, expected_begin);
        ASSERT_LT(seg.begin, seg.end);
        expected_begin = seg.end;
        std::size_t bytes = 0, offset_of_last = 0;
        std::uintptr_t last = 0;  // the address of the last tagged block seen, 0: none
        for (std::size_t i = seg.begin; i < seg.end; ++i) {
          const std::uint32_t tag = layout.tags[i];
          ASSERT_GT(layout.sizes[i], 0u);
          // (The arena's unreserved room follows its last block, free or not.)
          const bool room = expandable && i + 1 == seg.end;
          if (i > seg.begin && tag == detail::BlockLayout::kFree && !room) {
            ASSERT_NE(layout.tags[i - 1], detail::BlockLayout::kFree)
                << "free neighbours not merged";
          }
          if (tag != detail::BlockLayout::kFree) {
            ASSERT_TRUE(live.count(tag)) << "block " << i << " has tag " << tag;
            const auto [where, n] = live.at(tag);
            ASSERT_GE(layout.sizes[i], alloc.rounded_size(n));
            // Address order: the bytes listed since the last tagged block are the gap.
            if (last != 0) {
              ASSERT_EQ(where - last, bytes - offset_of_last);
            }
            last = where;
            offset_of_last = bytes;
            ++seen;
          }
          bytes += layout.sizes[i];
        }
        ASSERT_EQ(bytes, seg.bytes);
      }
      ASSERT_EQ(expected_begin, layout.tags.size());
      ASSERT_EQ(seen, live.size());
    }
    if (!expandable) {
      EXPECT_GT(alloc.stats().segments, 8u);  // many segments, not one
    }
    for (const auto& [tag, at] : live)
      alloc.deallocate(reinterpret_cast<void*>(at.first), at.second);
  }
}

TEST(CachingAllocatorTest, LoweringTheBudgetReleasesCache) {
  CachingAllocator alloc(std::make_unique<SimulatedSegmentSource>(), small_segments());
  void* a = alloc.allocate(5 << 20);
  alloc.deallocate(a, 5 << 20);
  EXPECT_GT(alloc.stats().reserved, 0u);
  alloc.set_budget(1 << 20);
  EXPECT_EQ(alloc.stats().reserved, 0u);
}

}  // namespace
}  // namespace remat
