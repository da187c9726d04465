// What the runtime's eviction and compaction ask of the allocator (AllocatorHooks): whether
// a window or a release would serve a request, the blocks by address, and allocations at
// chosen places: below a pinned block, outside given segments.
#include <algorithm>
#include <functional>
#include <vector>

#include "runtime/alloc/detail/allocator_core.h"
#include "runtime/alloc/detail/allocator_hooks.h"

namespace remat::detail {

bool AllocatorCore::window_serves(const SegmentView& segment, std::size_t window_bytes,
                                  std::size_t bytes) const {
  const std::size_t size = rounded_size(bytes);
  return !segment.placed && segment.small == small_pool(size) &&
         fits(segment.whole, window_bytes, size);
}

bool AllocatorCore::release_would_serve(const void* p, std::size_t bytes) const {
  const Block* b = pool_.live_block(p);
  if (b == nullptr) return false;
  const Segment* seg = b->segment;
  if (placement_.in_placed_range(b)) return false;
  const std::size_t size = rounded_size(bytes);
  std::size_t run = b->size;
  if (b->prev != nullptr && !b->prev->allocated) run += b->prev->size;
  if (b->next != nullptr && !b->next->allocated) run += b->next->size;
  const bool arena = seg == arena_segment();
  if (arena && (b->next == nullptr || (!b->next->allocated && b->next->next == nullptr)))
    run += arena_room();
  if (window_serves(SegmentView{seg->small, seg->whole}, run, bytes)) return true;
  // The last live block of a segment: the segment goes back and a bare reservation may fit.
  return !arena && seg->live_blocks == 1 && unreserved() + seg->size >= size;
}

void AllocatorCore::layout(BlockLayout& out) const {
  out.tags.clear();
  out.sizes.clear();
  out.segments.clear();
  const AllocatorBlocks source(*this);
  for (std::size_t k = 0; k < source.segments(); ++k) {
    const auto info = source.segment(k);
    out.segments.push_back({out.tags.size(), out.tags.size() + info.blocks, info.bytes, info.view});
    for (auto c = source.blocks(k); !c.done(); c.next()) {
      out.tags.push_back(c.tag());
      out.sizes.push_back(c.size());
    }
  }
}

// Note [Packing pinned storages]
// A storage pinned for good (a gradient frozen before the optimizer writes a parameter, a
// constant) stays wherever it was allocated, and where that is the middle of a segment of
// transient tensors it splits the free space around it for as long as it lives: a request
// can then fail with most of the budget free, in pieces. The runtime therefore moves such
// a storage to the lowest free block that holds it, below where it is (an older segment, or
// lower in its own), so that long-lived blocks gather at the bottom of the oldest segments
// and the rest coalesces. Only free cached blocks are used: nothing is reserved or evicted.
// A block that other streams use is not moved (their uses are tracked by address).
void* AllocatorCore::allocate_below(std::size_t bytes, const void* p) {
  const Block* here = pool_.live_block(p);
  if (here == nullptr || used_by_other_streams(p)) return nullptr;
  const std::size_t size = rounded_size(bytes);
  const bool small = small_pool(size);
  if (here->segment->small != small) return nullptr;
  auto& set = pool_.free_set(small);
  Block* lowest = nullptr;
  for (auto it = pool_.first_not_smaller(small, size); it != set.end(); ++it) {
    Block* b = *it;
    if (!fits(b->segment->whole, b->size, size) || !lies_below(b, here) ||
        placement_.in_placed_range(b))
      continue;
    if (lowest == nullptr || lies_below(b, lowest)) lowest = b;
  }
  if (lowest == nullptr) return nullptr;
  pool_.erase_free(lowest);
  return hand_out(lowest, size, bytes);
}

std::uint64_t AllocatorCore::segment_serial(const void* p) const {
  const Block* b = pool_.live_block(p);
  return b == nullptr ? 0 : b->segment->serial;
}

bool AllocatorCore::used_by_other_streams(const void* p) const {
  return streams_ != nullptr &&
         streams_->used_by_other_streams(reinterpret_cast<std::uintptr_t>(p));
}

// Best fit among the free blocks outside what `avoid` names, as allocate would choose among
// all (Note [Compaction] in runtime/core/eviction_choice.cc).
void* AllocatorCore::allocate_outside(std::size_t bytes, const AvoidedMemory& avoid) {
  const std::size_t size = rounded_size(bytes);
  Block* b = find_free(size, &avoid);
  return b == nullptr ? nullptr : hand_out(b, size, bytes);
}

// Whether allocate_outside would place requests of `bytes`, largest first, without
// reserving: a dry run on the free blocks' sizes.
bool AllocatorCore::places_outside(std::vector<std::size_t> bytes,
                                   const AvoidedMemory& avoid) const {
  struct Free {
    std::size_t size;
    bool whole, small;
  };
  std::vector<Free> free;
  for (bool small : {false, true})
    for (const Block* b : pool_.free_set(small))
      if (!avoid.avoids(b->segment->serial, b->address, b->size) && !placement_.in_placed_range(b))
        free.push_back({b->size, b->segment->whole, small});
  std::sort(bytes.begin(), bytes.end(), std::greater<>());
  for (std::size_t request : bytes) {
    const std::size_t size = rounded_size(request);
    const bool small = small_pool(size);
    Free* best = nullptr;
    for (Free& f : free)
      if (f.small == small && fits(f.whole, f.size, size) &&
          (best == nullptr || f.size < best->size))
        best = &f;
    if (best == nullptr) return false;
    best->size = best->whole ? 0 : best->size - size;
  }
  return true;
}

}  // namespace remat::detail
