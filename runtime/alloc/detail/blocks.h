// The caching allocator's blocks and segments (Note [Blocks and segments] in
// caching_allocator.cc), and the walk over them that the window search reads. Internal to
// the runtime.
#ifndef REMAT_RUNTIME_ALLOC_DETAIL_BLOCKS_H_
#define REMAT_RUNTIME_ALLOC_DETAIL_BLOCKS_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "remat/caching_allocator.h"

namespace remat::detail {

inline constexpr std::uint32_t kNoTag = UINT32_MAX;  // a live block its owner did not label

// `n` rounded up to a multiple of `to`: block sizes, granules.
inline std::size_t round_up(std::size_t n, std::size_t to) { return (n + to - 1) / to * to; }

// What a caller choosing an address window needs to know of a segment.
struct SegmentView {
  bool small;  // belongs to the small pool
  bool whole;  // holds one block that is never split (Note [Whole segments for large tensors])
  bool placed = false;  // a placement's arena, closed to other requests (Note [Placed
                        // allocations])
};

// Every segment's blocks in address order, flattened into arrays, for tests that look at the
// allocator by address (AllocatorHooks::layout). `kFree` is also the tag the runtime's window
// search gives a free block as it walks the lists itself.
struct BlockLayout {
  static constexpr std::uint32_t kFree = UINT32_MAX - 1;  // the tag of a free block
  struct Segment {
    std::size_t begin = 0, end = 0;  // its blocks' positions in `tags` and `sizes`
    std::size_t bytes = 0;
    SegmentView view;
  };
  std::vector<std::uint32_t> tags;  // the owner's tag (AllocatorHooks::set_tag), kNoTag where
                                    // unset, kFree where free
  std::vector<std::size_t> sizes;
  std::vector<Segment> segments;
};

struct Segment;
struct Block {
  std::uintptr_t address = 0;
  std::size_t size = 0;
  std::size_t requested = 0;
  Segment* segment = nullptr;
  Block* prev = nullptr;
  Block* next = nullptr;
  std::uint32_t tag = kNoTag;
  bool allocated = false;
};

struct Segment {
  std::uint64_t serial = 0;  // order of reservation (Note [Blocks and segments])
  std::uintptr_t address = 0;
  std::size_t size = 0;      // reserved (counted) bytes; for the arena, its mapped prefix
  std::size_t capacity = 0;  // the arena's whole range; equal to size otherwise
  bool small = false;
  bool whole = false;      // one block, never split (Note [Whole segments for large tensors])
  Block* first = nullptr;  // null while an arena maps nothing
  Block* last = nullptr;
  std::size_t live_blocks = 0;
  std::size_t blocks = 0;  // free ones included
};

// The allocator's segments, and each one's blocks in address order, for the window
// search (WindowSearch::price's block source). The room the expandable arena may still grow
// into is a free block after its last one. Inline, so that what the caller does with each
// block is compiled into the walk: the walk chases one pointer per block, and a caller that
// does its own work in between (the window search weighs and sweeps) overlaps that work
// with the chase's cache misses.
class AllocatorBlocks {
 public:
  explicit AllocatorBlocks(const CachingAllocator& allocator)
      : allocator_(allocator), segments_(allocator.segment_list()) {}

  struct SegmentInfo {
    SegmentView view;
    std::size_t bytes;
    std::size_t blocks;
  };
  class Cursor {
   public:
    bool done() const { return block_ == nullptr && room_ == 0; }
    std::uint32_t tag() const {
      return block_ == nullptr || !block_->allocated ? BlockLayout::kFree : block_->tag;
    }
    std::size_t size() const { return block_ == nullptr ? room_ : block_->size; }
    void next() {
      if (block_ != nullptr)
        block_ = block_->next;
      else
        room_ = 0;
    }

   private:
    friend class AllocatorBlocks;
    Cursor(const Block* first, std::size_t room) : block_(first), room_(room) {}
    const Block* block_;
    std::size_t room_;  // the arena's room, listed after its blocks
  };

  std::size_t segments() const { return segments_.size(); }
  SegmentInfo segment(std::size_t k) const {
    const Segment* s = segments_[k];
    const std::size_t room = room_of(s);
    return {SegmentView{s->small, s->whole, allocator_.placed_arena() == s}, s->size + room,
            s->blocks + (room > 0 ? 1 : 0)};
  }
  Cursor blocks(std::size_t k) const { return Cursor(segments_[k]->first, room_of(segments_[k])); }

 private:
  std::size_t room_of(const Segment* s) const {
    return s == allocator_.arena_ ? allocator_.arena_room() : 0;
  }
  const CachingAllocator& allocator_;
  const std::vector<Segment*>& segments_;
};

}  // namespace remat::detail

#endif  // REMAT_RUNTIME_ALLOC_DETAIL_BLOCKS_H_
