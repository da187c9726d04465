#include "remat/placement.h"

#include <algorithm>
#include <numeric>
#include <utility>

namespace remat {

std::size_t AllocationSequence::peak_live_bytes() const {
  // +bytes at start, -bytes at end; ends sort before starts at the same count, though a
  // sequence's counts are distinct anyway.
  std::vector<std::pair<std::size_t, std::ptrdiff_t>> events;
  for (const Allocation& a : allocations) {
    if (a.end == kStillLive) continue;
    events.emplace_back(a.start, static_cast<std::ptrdiff_t>(a.bytes));
    events.emplace_back(a.end, -static_cast<std::ptrdiff_t>(a.bytes));
  }
  std::sort(events.begin(), events.end());
  std::ptrdiff_t live = 0, peak = 0;
  for (const auto& [when, delta] : events) peak = std::max(peak, live += delta);
  return static_cast<std::size_t>(peak);
}

// Note [Greedy placement by size]
// Placing intervals (a block's lifetime) in an address range so that overlapping ones never
// share bytes, in the least range, is NP-hard (dynamic storage allocation). The greedy rules
// that do well on neural-network steps take the blocks largest first, since they are the
// hardest to fit later, and give each a gap among the blocks already placed that are live
// at the same time (the smallest that holds it, or the first), or the space above them all.
// Fixed regions (holes beside long-lived blocks) are tried before the arena, so that the
// arena holds only what they cannot.
// Which tie-break among equal sizes and which gap rule does best varies from step to step
// (none is always closest to the peak of live bytes, which no placement can beat), so a few
// are tried and the smallest arena wins; each still beats best fit at run time, which does
// not know when each block will be freed (docs/measurements.md). The first rule wins ties,
// so the result depends on the sequence alone.
namespace {

using Allocation = AllocationSequence::Allocation;

struct Rule {
  bool by_lifetime;  // among equal sizes, the longest-lived first (else the earliest)
  bool first_fit;    // the first gap that holds the block (else the smallest)
};

struct Placed {
  std::size_t offset, bytes, start, end;
};

// Where in one region (`capacity` SIZE_MAX: the open-ended arena) allocation `a` fits beside
// `placed`: the chosen gap's offset and size (the arena's space above everything counts as
// an endless gap), or nothing.
struct Gap {
  std::size_t offset = Placement::kUnplaced, size = SIZE_MAX;
};
Gap find_gap(const Allocation& a, const std::vector<Placed>& placed, std::size_t capacity,
             bool first_fit, std::vector<std::pair<std::size_t, std::size_t>>& busy) {
  busy.clear();
  for (const Placed& q : placed)
    if (q.start < a.end && a.start < q.end) busy.emplace_back(q.offset, q.offset + q.bytes);
  std::sort(busy.begin(), busy.end());
  busy.emplace_back(capacity, capacity);  // the region's end closes the last gap
  Gap best;
  std::size_t top = 0;
  for (const auto& [begin, end] : busy) {
    if (begin > top && begin - top >= a.bytes &&
        (best.offset == Placement::kUnplaced || (!first_fit && begin - top < best.size))) {
      best = {top, begin - top};
      if (first_fit) break;
    }
    top = std::max(top, end);
  }
  return best;
}

// Places the allocations `order` lists, in that order, into `p`'s regions and arena;
// returns the arena's size.
std::size_t place_in_order(const std::vector<Allocation>& all,
                           const std::vector<std::size_t>& order,
                           const std::vector<std::size_t>& regions, bool first_fit,
                           std::vector<std::size_t>& region, std::vector<std::size_t>& offsets) {
  std::vector<std::vector<Placed>> placed(regions.size() + 1);
  std::vector<std::pair<std::size_t, std::size_t>> busy;  // reused
  std::size_t arena = 0;
  for (std::size_t i : order) {
    const Allocation& a = all[i];
    std::size_t where = regions.size();
    Gap best;
    for (std::size_t r = 0; r < regions.size(); ++r) {
      const Gap g = find_gap(a, placed[r], regions[r], first_fit, busy);
      if (g.offset != Placement::kUnplaced &&
          (best.offset == Placement::kUnplaced || (!first_fit && g.size < best.size))) {
        best = g;
        where = r;
        if (first_fit) break;
      }
    }
    if (best.offset == Placement::kUnplaced)
      best = find_gap(a, placed.back(), SIZE_MAX, first_fit, busy);
    region[i] = where;
    offsets[i] = best.offset;
    if (where == regions.size()) arena = std::max(arena, best.offset + a.bytes);
    placed[where].push_back({best.offset, a.bytes, a.start, a.end});
  }
  return arena;
}

}  // namespace

Placement place_allocations(AllocationSequence sequence, const std::vector<std::size_t>& regions) {
  Placement p;
  p.sequence = std::move(sequence);
  p.regions = regions;
  const std::vector<Allocation>& all = p.sequence.allocations;
  p.region.assign(all.size(), Placement::kUnplaced);
  p.offsets.assign(all.size(), Placement::kUnplaced);
  p.peak_live_bytes = p.sequence.peak_live_bytes();

  std::vector<std::size_t> placeable;
  for (std::size_t i = 0; i < all.size(); ++i)
    if (all[i].end != AllocationSequence::kStillLive && all[i].bytes > 0) placeable.push_back(i);
  if (placeable.empty()) return p;
  p.arena_bytes = SIZE_MAX;
  std::vector<std::size_t> region, offsets;
  for (const Rule rule :
       {Rule{false, false}, Rule{false, true}, Rule{true, false}, Rule{true, true}}) {
    std::vector<std::size_t> order = placeable;
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
      if (all[a].bytes != all[b].bytes) return all[a].bytes > all[b].bytes;
      return rule.by_lifetime && all[a].end - all[a].start > all[b].end - all[b].start;
    });
    region.assign(all.size(), Placement::kUnplaced);
    offsets.assign(all.size(), Placement::kUnplaced);
    const std::size_t arena = place_in_order(all, order, regions, rule.first_fit, region, offsets);
    if (arena < p.arena_bytes) {
      p.arena_bytes = arena;
      p.region = region;
      p.offsets = offsets;
    }
  }
  return p;
}

}  // namespace remat
