// The search for an address window to evict (Note [Contiguous eviction] in runtime.cc):
// given every block of the caching allocator in address order and what evicting each one
// costs, the cheapest run of adjacent blocks that serves a request, or the cheapest set of
// whole segments whose return makes room for it. Internal to the runtime.
//
//   WindowSearch search;
//   allocator.layout(search.layout());
//   search.costs().resize(search.layout().tags.size());   // then one cost per block
//   search.price(need, serves);
//   if (search.choose(need, allocator.unreserved()))
//     for (std::size_t i : search.chosen()) evict(search.layout().tags[i]);
#ifndef REMAT_RUNTIME_WINDOW_SEARCH_H_
#define REMAT_RUNTIME_WINDOW_SEARCH_H_

#include <cstddef>
#include <functional>
#include <vector>

#include "remat/caching_allocator.h"

namespace remat::detail {

class WindowSearch {
 public:
  // The cost of a block that cannot be evicted; other costs are >= 0 (0: a free block).
  static constexpr double kBarrier = -1;

  BlockLayout& layout() { return layout_; }
  const BlockLayout& layout() const { return layout_; }
  // One cost per block of the layout, filled by the caller before `price`.
  std::vector<double>& costs() { return costs_; }
  const std::vector<double>& costs() const { return costs_; }

  // Prices every segment for a request of `need` (rounded) bytes: what emptying it costs and,
  // where serves(segment view, segment bytes) says a window of it may serve the request, the
  // cheapest window ending at each block. Linear in the blocks.
  void price(std::size_t need,
             const std::function<bool(const SegmentView&, std::size_t)>& serves);
  // Picks the cheapest window, or the cheapest segments to empty (cheapest per byte first,
  // until `unreserved` plus their bytes hold `need`), whichever costs less; their evictable
  // blocks go to `chosen()`. False when neither can make room.
  bool choose(std::size_t need, std::size_t unreserved);
  const std::vector<std::size_t>& chosen() const { return chosen_; }
  // Sets block i's cost (a key refreshed after `choose`) and updates every price it enters,
  // without another pass over the blocks. Returns whether the cost grew.
  bool reprice(std::size_t i, double cost);

 private:
  static constexpr std::size_t kNone = static_cast<std::size_t>(-1);
  struct Segment {
    std::size_t begin = 0, end = 0;  // its blocks' positions
    std::size_t bytes = 0;
    bool serves = false;
    double empty_cost = 0;  // of evicting all its blocks; infinite where one cannot go
    double empty_cost_per_byte = 0;
    std::size_t best_end = kNone;  // the last block of its cheapest window, kNone: none
    bool emptied = false;  // taken by the `choose` running now
  };
  static void set_empty_cost(Segment& seg, double cost);
  double empty_cost(const Segment& seg) const;
  double sweep(Segment& seg, std::size_t need);
  void find_best_window(Segment& seg);
  Segment& segment_of(std::size_t i);

  BlockLayout layout_;
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
};

}  // namespace remat::detail

#endif  // REMAT_RUNTIME_WINDOW_SEARCH_H_
