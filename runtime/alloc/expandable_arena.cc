#include "runtime/alloc/detail/expandable_arena.h"

#include <algorithm>
#include <cstdint>

namespace remat::detail {

namespace {
std::size_t round_down(std::size_t n, std::size_t to) { return n / to * to; }
}  // namespace

// Note [Expandable arena]
// With `expandable_segments`, a source whose reservations cost nothing until used (host
// memory, simulated addresses, CUDA's virtual memory) gives the allocator one range as large
// as the budget, once. Only a prefix of it counts as reserved: a request that no free block
// fits grows the prefix at its end (by `arena_step`, or just enough where the budget has
// less room), extending a free last block if there is one; `release_cached` gives the free
// tail back. There are no segment boundaries and no separate small pool, so any two adjacent
// freed blocks merge, and eviction can free a contiguous window that ends in the unreserved
// room. Where the budget later grows past the range, ordinary segments serve what the arena
// cannot.
std::size_t ExpandableArena::room(std::size_t unreserved) const {
  return std::min(segment_->capacity - segment_->size, unreserved);
}

Segment* ExpandableArena::reserve_range(std::size_t budget) {
  void* p = source_.reserve(budget);
  if (p != nullptr) segment_ = pool_.add_range(reinterpret_cast<std::uintptr_t>(p), budget);
  return segment_;
}

ExpandableArena::Growth ExpandableArena::grow(std::size_t size, std::size_t budget,
                                              std::size_t unreserved) {
  if (segment_ == nullptr && reserve_range(budget) == nullptr) return {};
  const Block* tail = segment_->last;
  const bool tail_free = tail != nullptr && !tail->allocated;
  // A source that backs the range in granules (CUDA's virtual memory) grows it by whole
  // granules, within the budget: the arena's reserved size stays a multiple of them.
  const std::size_t granule = source_.commit_granularity();
  const std::size_t need = round_up(tail_free ? size - std::min(size, tail->size) : size, granule);
  const std::size_t limit = round_down(room(unreserved), granule);
  if (need > limit) return {};
  const std::size_t step = round_up(step_, granule);
  const std::size_t grow = std::max(need, std::min(round_up(need, step), limit));
  if (!source_.commit_prefix(reinterpret_cast<void*>(segment_->address), segment_->size + grow))
    return {.refused = grow};
  return {.tail = extend_tail(grow), .bytes = grow};
}

// The mapped prefix is `grow` bytes longer: the free tail takes them, or a new block does.
Block* ExpandableArena::extend_tail(std::size_t grow) {
  Block* tail = segment_->last;
  if (tail != nullptr && !tail->allocated) {
    pool_.erase_free(tail);
    tail->size += grow;
  } else {
    Block* b = pool_.new_block(segment_);
    b->address = segment_->address + segment_->size;
    b->size = grow;
    b->prev = tail;
    if (tail != nullptr)
      tail->next = b;
    else
      segment_->first = b;
    segment_->last = b;
    tail = b;
  }
  segment_->size += grow;
  return tail;
}

std::size_t ExpandableArena::shrinkable() const {
  if (segment_ == nullptr || segment_->last == nullptr || segment_->last->allocated) return 0;
  // Only whole granules go back; a free tail shorter than one stays reserved.
  const std::size_t keep = segment_->size - segment_->last->size;
  return segment_->size - round_up(keep, source_.commit_granularity());
}

std::size_t ExpandableArena::shrink() {
  const std::size_t give = shrinkable();
  if (give == 0) return 0;
  Block* tail = segment_->last;
  const std::size_t new_size = segment_->size - give;
  source_.commit_prefix(reinterpret_cast<void*>(segment_->address), new_size);
  pool_.erase_free(tail);
  segment_->size = new_size;
  if (give < tail->size) {
    tail->size -= give;
    pool_.insert_free(tail);
    return give;
  }
  segment_->last = tail->prev;
  if (tail->prev != nullptr)
    tail->prev->next = nullptr;
  else
    segment_->first = nullptr;
  pool_.delete_block(tail);
  return give;
}

}  // namespace remat::detail
