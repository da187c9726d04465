// The caching allocator's expandable arena (Note [Expandable arena]): one address range as
// large as the budget, of which only a prefix is reserved; it grows and shrinks at its end.
// Internal to the runtime.
//
//   detail::ExpandableArena arena(pool, source, /*step=*/2 << 20);
//   auto growth = arena.grow(4096, /*budget=*/64 << 20, /*unreserved=*/64 << 20);
//   // growth.tail: a free block of at least 4096 bytes at the arena's end, in no free set
//   arena.shrink();  // once the tail is free again: its whole granules go back
#ifndef REMAT_RUNTIME_ALLOC_DETAIL_EXPANDABLE_ARENA_H_
#define REMAT_RUNTIME_ALLOC_DETAIL_EXPANDABLE_ARENA_H_

#include <cstddef>

#include "remat/segment_source.h"
#include "runtime/alloc/detail/best_fit_pool.h"

namespace remat::detail {

class ExpandableArena {
 public:
  // `source` must reserve address space lazily (SegmentSource::lazily_committed).
  ExpandableArena(BestFitPool& pool, SegmentSource& source, std::size_t step)
      : pool_(pool), source_(source), step_(step) {}

  // The arena's segment in the pool; null until it first grows.
  Segment* segment() const { return segment_; }
  // Bytes the arena may still grow by, where the budget leaves `unreserved` bytes.
  std::size_t room(std::size_t unreserved) const;

  struct Growth {
    Block* tail = nullptr;    // the free last block, of at least the request, in no free set
    std::size_t bytes = 0;    // bytes the reserved prefix grew by
    std::size_t refused = 0;  // bytes the source refused to back, where it did
  };
  // Grows the reserved prefix so that the free block at its end holds `size` bytes: by the
  // arena's step, or just enough where the budget has less room. The range (of `budget`
  // bytes) is reserved on first use. No tail where the budget or the source has no room.
  Growth grow(std::size_t size, std::size_t budget, std::size_t unreserved);
  // The bytes `shrink` would give back: the whole granules of a free tail.
  std::size_t shrinkable() const;
  // Gives those bytes back to the source; returns how many.
  std::size_t shrink();

 private:
  Segment* reserve_range(std::size_t budget);
  Block* extend_tail(std::size_t grow);

  BestFitPool& pool_;
  SegmentSource& source_;
  std::size_t step_;
  Segment* segment_ = nullptr;
};

}  // namespace remat::detail

#endif  // REMAT_RUNTIME_ALLOC_DETAIL_EXPANDABLE_ARENA_H_
