// The search for an address window to evict (Note [Contiguous eviction] in
// eviction_choice.cc):
// given every block of the caching allocator in address order and what evicting each one
// costs, the cheapest run of adjacent blocks that serves a request, or the cheapest set of
// whole segments whose return makes room for it. Internal to the runtime.
//
//   WindowSearch search;
//   search.price(need, AllocatorBlocks(allocator), serves,
//                [&](std::size_t block, std::uint32_t tag) { return cost_of(tag); });
//   if (search.choose(need, AllocatorHooks::unreserved(allocator)))
//     for (std::size_t i : search.chosen()) evict(search.tags()[i]);
#ifndef REMAT_RUNTIME_CORE_WINDOW_SEARCH_H_
#define REMAT_RUNTIME_CORE_WINDOW_SEARCH_H_

#include <cassert>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "remat/caching_allocator.h"
#include "runtime/alloc/detail/blocks.h"

namespace remat::detail {

class WindowSearch {
 public:
  // The cost of a block that cannot be evicted; other costs are >= 0 (0: a free block).
  static constexpr double kBarrier = -1;

  // Each block's tag, in the order the last `price` walked them (a block's position is its
  // index here, in `costs()` and in `chosen()`).
  const std::vector<std::uint32_t>& tags() const { return tags_; }
  // Each block's cost as `price` (or `reprice`) last set it; a segment that cannot be
  // emptied nor hold a window may be left unpriced after its first barrier.
  const std::vector<double>& costs() const { return costs_; }

  // Prices every segment of `source` for a request of `need` (rounded) bytes: what
  // emptying it costs and, where serves(segment view, segment bytes) says a window of it may
  // serve the request, the cheapest window ending at each block. The source lists segments
  // and their blocks in address order (detail::AllocatorBlocks for the allocator); their
  // tags go to `tags()` as they come. cost_of(block position, tag) weighs a block, once.
  // Walking, weighing and sweeping are one pass (Note [Window sweep]); linear in the blocks.
  template <typename Source, typename Serves, typename CostOf>
  void price(std::size_t need, const Source& source, Serves&& serves, CostOf&& cost_of);
  // Picks the cheapest window, or the cheapest segments to empty (cheapest per byte first,
  // until `unreserved` plus their bytes hold `need`), whichever costs less; their evictable
  // blocks go to `chosen()`. False when neither can make room.
  bool choose(std::size_t need, std::size_t unreserved);
  const std::vector<std::size_t>& chosen() const { return chosen_; }
  // Where the last `choose` took a window: its first and last block's positions (free
  // blocks at its ends included); {kNone, kNone} where it chose segments to empty.
  std::pair<std::size_t, std::size_t> chosen_window() const { return window_; }
  const std::vector<std::size_t>& sizes() const { return sizes_; }
  static constexpr std::size_t kNone = static_cast<std::size_t>(-1);
  // Sets block i's cost (a key refreshed after `choose`) and updates every price it enters,
  // without another pass over the blocks. Returns whether the cost grew.
  bool reprice(std::size_t i, double cost);

 private:
  struct Segment {
    std::size_t begin = 0, end = 0;  // its blocks' positions
    std::size_t bytes = 0;
    bool serves = false;
    double empty_cost = 0;  // of evicting all its blocks; infinite where one cannot go
    double empty_cost_per_byte = 0;
    std::size_t best_end = kNone;  // the last block of its cheapest window, kNone: none
    bool emptied = false;          // taken by the `choose` running now
    bool rescan = false;           // a repriced window may have taken the best's place
  };
  static void set_empty_cost(Segment& seg, double cost);
  void reserve(std::size_t blocks);
  template <typename Cursor, typename CostOf>
  double empty_cost(const Segment& seg, Cursor blocks, CostOf& cost_of);
  template <typename Cursor, typename CostOf>
  double sweep(Segment& seg, std::size_t need, Cursor blocks, CostOf& cost_of);
  void find_best_window(Segment& seg);
  Segment& segment_of(std::size_t i);

  std::vector<std::uint32_t> tags_;
  std::vector<std::size_t> sizes_;
  std::vector<double> costs_;
  // Per block i of a serving segment: the shortest window ending at i that holds the request
  // begins at window_begin_[i] (kNone: none does) and costs window_cost_[i]. The windows'
  // extents depend on sizes only, so a repriced block changes the costs of the few windows
  // that hold it and no extent.
  std::vector<std::size_t> window_begin_;
  std::vector<double> window_cost_;
  std::vector<Segment> segments_;
  std::vector<Segment*> emptied_;  // the segments `choose` would empty, in order
  std::vector<std::size_t> chosen_;
  std::pair<std::size_t, std::size_t> window_{kNone, kNone};
};

template <typename Source, typename Serves, typename CostOf>
void WindowSearch::price(std::size_t need, const Source& source, Serves&& serves,
                         CostOf&& cost_of) {
  segments_.clear();
  std::size_t n = 0;
  for (std::size_t k = 0, m = source.segments(); k < m; ++k) {
    const auto info = source.segment(k);
    reserve(n + info.blocks);
    Segment seg;
    seg.begin = n;
    seg.end = n + info.blocks;
    seg.bytes = info.bytes;
    seg.serves = serves(info.view, info.bytes);
    set_empty_cost(seg, seg.serves ? sweep(seg, need, source.blocks(k), cost_of)
                                   : empty_cost(seg, source.blocks(k), cost_of));
    segments_.push_back(seg);
    n = seg.end;
  }
  tags_.resize(n);
  sizes_.resize(n);
  costs_.resize(n);
  window_begin_.resize(n);
  window_cost_.resize(n);
}

// Any segment can be emptied; only one that serves can hold a window. One barrier settles
// it, so the blocks after it are laid out but not weighed.
template <typename Cursor, typename CostOf>
double WindowSearch::empty_cost(const Segment& seg, Cursor blocks, CostOf& cost_of) {
  const CostOf weigh = cost_of;  // a local copy: stores to the arrays cannot alias its fields
  std::uint32_t* tags = tags_.data();
  std::size_t* sizes = sizes_.data();
  double* costs = costs_.data();
  double cost = 0;
  std::size_t i = seg.begin;
  for (; !blocks.done(); blocks.next(), ++i) {
    const std::uint32_t tag = tags[i] = blocks.tag();
    sizes[i] = blocks.size();
    if (cost == INFINITY) continue;
    const double c = costs[i] = weigh(i, tag);
    cost = c == kBarrier ? INFINITY : cost + c;
  }
  assert(i == seg.end && "the source listed another number of blocks than it said");
  return cost;
}

// Lays out and weighs each block, finds its window and the segment's cheapest; returns what
// emptying the segment costs.
template <typename Cursor, typename CostOf>
double WindowSearch::sweep(Segment& seg, std::size_t need, Cursor blocks, CostOf& cost_of) {
  // Locals, the cost function's copy included: the loop stores through pointers that the
  // compiler would otherwise have to assume alias them, and reload them every block.
  const CostOf weigh = cost_of;
  std::uint32_t* tags = tags_.data();
  std::size_t* sizes = sizes_.data();
  double* costs = costs_.data();
  std::size_t* window_begin = window_begin_.data();
  double* window_cost_at = window_cost_.data();
  double empty_cost = 0, best = INFINITY, window_cost = 0;
  std::size_t lo = seg.begin, window_bytes = 0, best_end = kNone;
  std::size_t hi = seg.begin;
  for (; !blocks.done(); blocks.next(), ++hi) {
    const std::uint32_t tag = tags[hi] = blocks.tag();
    const std::size_t size = sizes[hi] = blocks.size();
    const double cost = costs[hi] = weigh(hi, tag);
    if (cost == kBarrier) {
      empty_cost = INFINITY;
      window_begin[hi] = kNone;
      lo = hi + 1;
      window_bytes = 0;
      window_cost = 0;
      continue;
    }
    empty_cost += cost;
    window_bytes += size;
    window_cost += cost;
    if (window_bytes < need) {
      window_begin[hi] = kNone;
      continue;
    }
    while (lo < hi && window_bytes - sizes[lo] >= need) {
      window_bytes -= sizes[lo];
      window_cost -= costs[lo];
      ++lo;
    }
    window_begin[hi] = lo;
    window_cost_at[hi] = window_cost;
    if (window_cost < best) {
      best = window_cost;
      best_end = hi;
    }
  }
  assert(hi == seg.end && "the source listed another number of blocks than it said");
  seg.best_end = best_end;
  return empty_cost;
}

}  // namespace remat::detail

#endif  // REMAT_RUNTIME_CORE_WINDOW_SEARCH_H_
