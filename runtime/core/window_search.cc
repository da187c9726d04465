#include "runtime/core/window_search.h"

#include <algorithm>
#include <cmath>

namespace remat::detail {

// Note [Window sweep]
// Costs are non-negative, so for each block `hi` the cheapest window that ends there and
// holds the request is the shortest one: a two-pointer sweep moves its start `lo` forward
// while the window still holds the request without its first block, which makes the whole
// segment linear. A barrier (a block that cannot be evicted) ends every window; the sweep
// restarts after it. The sweep keeps each block's window, so that refreshing a chosen
// block's key (the search's convergence rounds in eviction_choice.cc) updates the few windows that
// hold the block instead of sweeping the segment again: the starts depend on sizes only.
// The sweep itself (`price`, `sweep`) is in the header, a template over its block source and
// cost function: it walks the allocator's list of each segment, lays each block out, weighs
// it and moves the window on, in one loop with its state in registers. A separate layout
// pass was latency-bound: one dependent load per block, nothing else to do while it missed
// (on the tree LSTM at half its peak, as long as the sweep). Fused, the sweep's work fills
// those stalls.

// Keeps the cost per byte beside the cost: `choose` compares it across segments each round.
void WindowSearch::set_empty_cost(Segment& seg, double cost) {
  seg.empty_cost = cost;
  seg.empty_cost_per_byte = cost / static_cast<double>(std::max<std::size_t>(seg.bytes, 1));
}

// Room for `blocks` blocks in every per-block array. They grow and are cut back to size
// only when `price` ends: growing value-initializes what is new, so growing from empty on
// every search would write each array twice.
void WindowSearch::reserve(std::size_t blocks) {
  if (blocks <= costs_.size()) return;
  tags_.resize(blocks);
  sizes_.resize(blocks);
  costs_.resize(blocks);
  window_begin_.resize(blocks);
  window_cost_.resize(blocks);
}

void WindowSearch::find_best_window(Segment& seg) {
  seg.best_end = kNone;
  double best = INFINITY;
  for (std::size_t hi = seg.begin; hi < seg.end; ++hi)
    if (window_begin_[hi] != kNone && window_cost_[hi] < best) {
      best = window_cost_[hi];
      seg.best_end = hi;
    }
}

bool WindowSearch::choose(std::size_t need, std::size_t unreserved) {
  const Segment* best = nullptr;
  for (Segment& seg : segments_) {
    if (seg.rescan) {
      find_best_window(seg);
      seg.rescan = false;
    }
    if (seg.best_end != kNone &&
        (best == nullptr || window_cost_[seg.best_end] < window_cost_[best->best_end]))
      best = &seg;
  }
  const double best_cost = best == nullptr ? INFINITY : window_cost_[best->best_end];
  chosen_.clear();
  window_ = {kNone, kNone};
  auto take = [&](std::size_t begin, std::size_t end) {
    for (std::size_t i = begin; i < end; ++i)
      if (tags_[i] != BlockLayout::kFree) chosen_.push_back(i);
  };
  // Emptying segments makes room only where the budget has too little left for the segment
  // this request would reserve. One or two segments are usually enough, so each is found by
  // a pass over the segments rather than by ordering them all.
  if (unreserved < need) {
    emptied_.clear();
    std::size_t room = unreserved;
    double cost = 0;
    while (room < need) {
      Segment* next = nullptr;
      for (Segment& seg : segments_)
        if (seg.empty_cost != INFINITY && seg.bytes > 0 && !seg.emptied &&
            (next == nullptr || seg.empty_cost_per_byte < next->empty_cost_per_byte))
          next = &seg;
      if (next == nullptr) break;
      next->emptied = true;
      emptied_.push_back(next);
      room += next->bytes;
      cost += next->empty_cost;
    }
    for (Segment* seg : emptied_) seg->emptied = false;
    if (room >= need && cost < best_cost) {
      for (const Segment* seg : emptied_) take(seg->begin, seg->end);
      return true;
    }
  }
  if (best == nullptr) return false;
  take(window_begin_[best->best_end], best->best_end + 1);
  window_ = {window_begin_[best->best_end], best->best_end};
  return true;
}

WindowSearch::Segment& WindowSearch::segment_of(std::size_t i) {
  auto it = std::upper_bound(segments_.begin(), segments_.end(), i,
                             [](std::size_t p, const Segment& s) { return p < s.begin; });
  return *std::prev(it);
}

bool WindowSearch::reprice(std::size_t i, double cost) {
  const double old = costs_[i];
  if (cost == old) return false;
  const double delta = cost - old;
  costs_[i] = cost;
  Segment& seg = segment_of(i);
  if (seg.empty_cost != INFINITY) set_empty_cost(seg, seg.empty_cost + delta);
  if (seg.serves) {
    // The windows holding block i end at or after it, up to the first whose start passed it.
    // Where they got cheaper, the best is the old one or one of them; where dearer, only
    // losing the best calls for a rescan, left to `choose` (a window's blocks are repriced
    // one after another).
    for (std::size_t hi = i; hi < seg.end && costs_[hi] != kBarrier; ++hi) {
      if (window_begin_[hi] == kNone) continue;
      if (window_begin_[hi] > i) break;
      window_cost_[hi] += delta;
      if (delta < 0 && !seg.rescan &&
          (seg.best_end == kNone || window_cost_[hi] < window_cost_[seg.best_end]))
        seg.best_end = hi;
      seg.rescan |= delta > 0 && hi == seg.best_end;
    }
  }
  // A relative margin: a key recomputed to the same value may differ in its last bits.
  return cost > old * (1 + 1e-9);
}

}  // namespace remat::detail
