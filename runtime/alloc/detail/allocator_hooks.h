// The caching allocator as the runtime's contiguous eviction sees it (Note [Contiguous
// eviction] in runtime/core/eviction_choice.cc), and as its tests inspect it. Not part of the
// public API: CachingAllocator keeps its core private and befriends this class.
#ifndef REMAT_RUNTIME_ALLOC_DETAIL_ALLOCATOR_HOOKS_H_
#define REMAT_RUNTIME_ALLOC_DETAIL_ALLOCATOR_HOOKS_H_

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "remat/caching_allocator.h"
#include "runtime/alloc/detail/allocator_core.h"
#include "runtime/alloc/detail/blocks.h"

namespace remat::detail {

class AllocatorHooks {
 public:
  static AllocatorCore& core(CachingAllocator& a) { return *a.core_; }
  static const AllocatorCore& core(const CachingAllocator& a) { return *a.core_; }
  // True when a free window of `window_bytes` in `segment` could serve a request of `bytes`.
  static bool window_serves(const CachingAllocator& a, const SegmentView& segment,
                            std::size_t window_bytes, std::size_t bytes) {
    return a.core_->window_serves(segment, window_bytes, bytes);
  }
  // Bytes the budget leaves unreserved.
  static std::size_t unreserved(const CachingAllocator& a) { return a.core_->unreserved(); }
  // True when freeing the live block at `p` alone would let a request of `bytes` be served:
  // by the free run the block merges into, or by the room its emptied segment gives back.
  static bool release_would_serve(const CachingAllocator& a, const void* p, std::size_t bytes) {
    return a.core_->release_would_serve(p, bytes);
  }
  // Labels the live block at `p` for its owner (the runtime: the storage it holds), so that
  // a walk over the segments needs no address lookup; the label goes when the block is freed.
  static void set_tag(CachingAllocator& a, const void* p, std::uint32_t tag) {
    a.core_->set_tag(p, tag);
  }
  // Every segment's blocks in address order (the expandable arena's room to grow is a free
  // block after its last one), reusing `out`'s buffers.
  static void layout(const CachingAllocator& a, BlockLayout& out) { a.core_->layout(out); }
  // A block for `bytes` lower than the live block at `p` (an older segment, or lower in its
  // own), from free cached blocks; null where there is none (Note [Packing pinned storages]).
  static void* allocate_below(CachingAllocator& a, std::size_t bytes, const void* p) {
    return a.core_->allocate_below(bytes, p);
  }
  // For compaction (Note [Compaction] in runtime/core/eviction_choice.cc): the serial of the
  // segment holding the live block at `p`; whether other streams use it (then it stays);
  // a best-fit block outside what `avoid` names, or null; and whether such blocks would
  // hold requests of `bytes` (a dry run).
  static std::uint64_t segment_serial(const CachingAllocator& a, const void* p) {
    return a.core_->segment_serial(p);
  }
  static bool used_by_other_streams(const CachingAllocator& a, const void* p) {
    return a.core_->used_by_other_streams(p);
  }
  static void* allocate_outside(CachingAllocator& a, std::size_t bytes,
                                const AvoidedMemory& avoid) {
    return a.core_->allocate_outside(bytes, avoid);
  }
  static bool places_outside(const CachingAllocator& a, std::vector<std::size_t> bytes,
                             const AvoidedMemory& avoid) {
    return a.core_->places_outside(std::move(bytes), avoid);
  }
  // For evacuation (Note [Evacuating segments] in runtime/alloc/packed_segment.cc): one new
  // segment holding a live block for each of `bytes`, in order and back to back; empty
  // where the budget or the source refuses it. And whether a trace is being recorded or a
  // placement followed (freeing and reallocating blocks would break either, so no
  // evacuation runs then).
  static std::vector<void*> allocate_packed(CachingAllocator& a,
                                            const std::vector<std::size_t>& bytes) {
    return a.core_->allocate_packed(bytes);
  }
  static bool tracing_or_placing(const CachingAllocator& a) {
    return a.core_->placement().active();
  }
  // The runtime moved a live block from `from` to `to` (and frees `from` next): a trace
  // follows the allocation to its new block (Note [Placed allocations]).
  static void moved(CachingAllocator& a, const void* from, const void* to) {
    a.core_->placement().moved(reinterpret_cast<std::uintptr_t>(from),
                               reinterpret_cast<std::uintptr_t>(to));
  }
  // True when `bytes` would be served from the small pool.
  static bool is_small(const CachingAllocator& a, std::size_t bytes) {
    return a.core_->is_small(bytes);
  }
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
      : AllocatorBlocks(AllocatorHooks::core(allocator)) {}
  explicit AllocatorBlocks(const AllocatorCore& core) : core_(core), segments_(core.segments()) {}

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
    return {SegmentView{s->small, s->whole, core_.placement().arena() == s}, s->size + room,
            s->blocks + (room > 0 ? 1 : 0)};
  }
  Cursor blocks(std::size_t k) const { return Cursor(segments_[k]->first, room_of(segments_[k])); }

 private:
  std::size_t room_of(const Segment* s) const {
    return s == core_.arena_segment() ? core_.arena_room() : 0;
  }
  const AllocatorCore& core_;
  const std::vector<Segment*>& segments_;
};

}  // namespace remat::detail

#endif  // REMAT_RUNTIME_ALLOC_DETAIL_ALLOCATOR_HOOKS_H_
