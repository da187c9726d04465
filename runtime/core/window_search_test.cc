#include "runtime/core/window_search.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <set>

#include "runtime/alloc/detail/allocator_hooks.h"

namespace remat::detail {
namespace {

constexpr std::size_t kUnit = 512;

// A random layout: segments of up to 12 blocks, each free, evictable (a random cost, ties
// likely) or a barrier; a random half of the segments may hold windows.
struct RandomCase {
  detail::BlockLayout layout;  // what the search is to walk
  std::vector<bool> serves;    // per segment
  std::vector<double> costs;   // per block
};

// A block source (the protocol of detail::AllocatorBlocks) over a given layout.
class LayoutBlocks {
 public:
  explicit LayoutBlocks(const detail::BlockLayout& layout) : layout_(layout) {}
  using SegmentInfo = AllocatorBlocks::SegmentInfo;
  class Cursor {
   public:
    Cursor(const detail::BlockLayout& layout, std::size_t i, std::size_t end)
        : layout_(&layout), i_(i), end_(end) {}
    bool done() const { return i_ == end_; }
    std::uint32_t tag() const { return layout_->tags[i_]; }
    std::size_t size() const { return layout_->sizes[i_]; }
    void next() { ++i_; }

   private:
    const detail::BlockLayout* layout_;
    std::size_t i_, end_;
  };
  std::size_t segments() const { return layout_.segments.size(); }
  SegmentInfo segment(std::size_t k) const {
    const detail::BlockLayout::Segment& s = layout_.segments[k];
    return {s.view, s.bytes, s.end - s.begin};
  }
  Cursor blocks(std::size_t k) const {
    return Cursor(layout_, layout_.segments[k].begin, layout_.segments[k].end);
  }

 private:
  const detail::BlockLayout& layout_;
};

RandomCase fill_random(std::mt19937_64& rng) {
  RandomCase c;
  detail::BlockLayout& layout = c.layout;
  const int segments = std::uniform_int_distribution<int>(1, 6)(rng);
  std::uint32_t next_tag = 0;
  for (int s = 0; s < segments; ++s) {
    detail::BlockLayout::Segment seg;
    seg.begin = layout.tags.size();
    const int blocks = std::uniform_int_distribution<int>(1, 12)(rng);
    for (int b = 0; b < blocks; ++b) {
      const std::size_t size = kUnit * std::uniform_int_distribution<std::size_t>(1, 8)(rng);
      const int kind = std::uniform_int_distribution<int>(0, 9)(rng);
      layout.sizes.push_back(size);
      seg.bytes += size;
      if (kind < 2) {
        layout.tags.push_back(detail::BlockLayout::kFree);
        c.costs.push_back(0);
      } else if (kind < 3) {
        layout.tags.push_back(next_tag++);
        c.costs.push_back(WindowSearch::kBarrier);
      } else {
        layout.tags.push_back(next_tag++);
        c.costs.push_back(std::uniform_int_distribution<int>(0, 20)(rng) * 0.25);
      }
    }
    seg.end = layout.tags.size();
    layout.segments.push_back(seg);
    c.serves.push_back(std::uniform_int_distribution<int>(0, 1)(rng) == 1);
  }
  return c;
}

void price(WindowSearch& w, const RandomCase& c, std::size_t need) {
  std::size_t s = 0;
  std::vector<std::size_t> weighed(c.costs.size(), 0);
  w.price(
      need, LayoutBlocks(c.layout),
      [&](const detail::SegmentView&, std::size_t) { return c.serves[s++]; },
      [&](std::size_t i, std::uint32_t tag) {
        EXPECT_EQ(tag, c.layout.tags[i]);
        ++weighed[i];
        return c.costs[i];
      });
  // It kept the blocks' tags in the order they came.
  ASSERT_EQ(w.tags(), c.layout.tags);
  for (std::size_t i = 0; i < weighed.size(); ++i) {
    EXPECT_LE(weighed[i], 1u) << "block " << i << " weighed twice";
    if (weighed[i] == 1) {
      EXPECT_EQ(w.costs()[i], c.costs[i]) << "block " << i;
    }
  }
}

// The cheapest window by trying every one.
double brute_force_window(const WindowSearch& w, const RandomCase& c, std::size_t need) {
  const detail::BlockLayout& layout = c.layout;
  const std::vector<double>& costs = w.costs();
  double best = INFINITY;
  for (std::size_t s = 0; s < layout.segments.size(); ++s) {
    if (!c.serves[s]) continue;
    const detail::BlockLayout::Segment& seg = layout.segments[s];
    for (std::size_t lo = seg.begin; lo < seg.end; ++lo) {
      std::size_t bytes = 0;
      double cost = 0;
      for (std::size_t hi = lo; hi < seg.end && costs[hi] != WindowSearch::kBarrier; ++hi) {
        bytes += layout.sizes[hi];
        cost += costs[hi];
        if (bytes >= need) best = std::min(best, cost);
      }
    }
  }
  return best;
}

// Checks that the chosen blocks form one window of a serving segment, without barriers or
// free blocks listed, and returns its cost.
double chosen_window_cost(WindowSearch& w, const RandomCase& c, std::size_t need) {
  const std::vector<std::size_t>& chosen = w.chosen();
  const detail::BlockLayout& layout = c.layout;
  if (chosen.empty()) return 0;  // free blocks alone (which the allocator would have used)
  // The window runs from the first chosen block to the last, with free blocks around and
  // between them; widen it over the free neighbours to count its bytes.
  std::size_t lo = chosen.front(), hi = chosen.back();
  std::size_t s = 0;
  while (layout.segments[s].end <= lo) ++s;
  const detail::BlockLayout::Segment& seg = layout.segments[s];
  EXPECT_TRUE(c.serves[s]);
  EXPECT_LT(hi, seg.end);
  while (lo > seg.begin && layout.tags[lo - 1] == detail::BlockLayout::kFree) --lo;
  while (hi + 1 < seg.end && layout.tags[hi + 1] == detail::BlockLayout::kFree) ++hi;
  std::size_t bytes = 0;
  double cost = 0;
  std::size_t listed = 0;
  for (std::size_t i = lo; i <= hi; ++i) {
    EXPECT_NE(w.costs()[i], WindowSearch::kBarrier) << "a barrier at " << i;
    bytes += layout.sizes[i];
    cost += w.costs()[i];
    if (layout.tags[i] != detail::BlockLayout::kFree) ++listed;
  }
  EXPECT_EQ(listed, chosen.size()) << "the chosen blocks are not one window";
  EXPECT_GE(bytes, need);
  return cost;
}

TEST(WindowSearchTest, FindsTheCheapestWindowOfRandomLayouts) {
  std::mt19937_64 rng(7);
  int windows = 0;
  WindowSearch w;  // one search for every trial, as the runtime keeps one: nothing carries over
  for (int trial = 0; trial < 3000; ++trial) {
    const RandomCase c = fill_random(rng);
    const std::size_t need = kUnit * std::uniform_int_distribution<std::size_t>(1, 16)(rng);
    price(w, c, need);
    const double expected = brute_force_window(w, c, need);
    // Room under the budget is plenty: only windows count.
    const bool found = w.choose(need, need);
    ASSERT_EQ(found, expected != INFINITY) << "trial " << trial;
    if (!found) continue;
    ++windows;
    EXPECT_NEAR(chosen_window_cost(w, c, need), expected, 1e-9) << "trial " << trial;
  }
  EXPECT_GT(windows, 1000);  // the random layouts do exercise windows
}

TEST(WindowSearchTest, RepricedBlocksGiveWhatAFreshSearchGives) {
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 2000; ++trial) {
    WindowSearch w;
    const RandomCase c = fill_random(rng);
    const std::size_t need = kUnit * std::uniform_int_distribution<std::size_t>(1, 16)(rng);
    price(w, c, need);
    if (!w.choose(need, need)) continue;
    // Raise (or lower) some evictable blocks' costs, the chosen ones first, as the
    // runtime's convergence rounds do.
    std::vector<std::size_t> touched = w.chosen();
    for (std::size_t i = 0; i < w.costs().size(); ++i)
      if (w.costs()[i] > 0 && std::uniform_int_distribution<int>(0, 3)(rng) == 0)
        touched.push_back(i);
    for (std::size_t i : touched) {
      const double before = w.costs()[i];
      const double after = std::uniform_int_distribution<int>(0, 40)(rng) * 0.25;
      if (before == after) continue;  // already repriced to this value
      EXPECT_EQ(w.reprice(i, after), after > before) << "trial " << trial;
    }
    const double expected = brute_force_window(w, c, need);
    ASSERT_TRUE(w.choose(need, need));  // repricing changes no extent
    EXPECT_NEAR(chosen_window_cost(w, c, need), expected, 1e-9) << "trial " << trial;
  }
}

TEST(WindowSearchTest, EmptiesTheCheapestSegmentsPerByteWhenTheBudgetIsShort) {
  std::mt19937_64 rng(13);
  int emptied = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    WindowSearch w;
    RandomCase c = fill_random(rng);
    std::fill(c.serves.begin(), c.serves.end(), false);  // no window: only emptying
    detail::BlockLayout& layout = c.layout;
    // Every segment holds something to evict, so the emptied ones show in `chosen`.
    for (const auto& seg : layout.segments)
      if (layout.tags[seg.begin] == detail::BlockLayout::kFree) {
        layout.tags[seg.begin] = 1000;
        c.costs[seg.begin] = 1;
      }
    const std::size_t unreserved = kUnit * std::uniform_int_distribution<std::size_t>(0, 8)(rng);
    const std::size_t need =
        unreserved + kUnit * std::uniform_int_distribution<std::size_t>(1, 40)(rng);
    price(w, c, need);
    const bool found = w.choose(need, unreserved);

    std::set<std::size_t> chosen(w.chosen().begin(), w.chosen().end());
    std::size_t room = unreserved, possible = unreserved;
    double dearest_taken = -1, cheapest_left = INFINITY;
    std::vector<std::pair<double, std::size_t>> taken;  // (cost per byte, bytes)
    for (const auto& seg : layout.segments) {
      double cost = 0;
      std::size_t listed = 0, evictable = 0;
      for (std::size_t i = seg.begin; i < seg.end; ++i) {
        if (c.costs[i] == WindowSearch::kBarrier)
          cost = INFINITY;
        else
          cost += c.costs[i];
        evictable += layout.tags[i] != detail::BlockLayout::kFree;
        listed += chosen.count(i);
      }
      if (cost == INFINITY) {
        EXPECT_EQ(listed, 0u) << "a segment with a barrier emptied, trial " << trial;
        continue;
      }
      possible += seg.bytes;
      const double per_byte = cost / static_cast<double>(seg.bytes);
      if (listed == 0) {
        cheapest_left = std::min(cheapest_left, per_byte);
        continue;
      }
      EXPECT_EQ(listed, evictable) << "a segment half emptied, trial " << trial;
      room += seg.bytes;
      dearest_taken = std::max(dearest_taken, per_byte);
      taken.push_back({per_byte, seg.bytes});
    }
    ASSERT_EQ(found, possible >= need) << "trial " << trial;
    if (!found) continue;
    ++emptied;
    EXPECT_GE(room, need) << "trial " << trial;
    EXPECT_LE(dearest_taken, cheapest_left) << "a dearer segment went first, trial " << trial;
    // No more than needed: without one of its dearest segments the room falls short.
    bool minimal = false;
    for (const auto& [per_byte, bytes] : taken)
      minimal |= per_byte == dearest_taken && room - bytes < need;
    EXPECT_TRUE(minimal) << "trial " << trial;
  }
  EXPECT_GT(emptied, 500);
}

}  // namespace
}  // namespace remat::detail
