// The caching allocator as the runtime's contiguous eviction sees it (Note [Contiguous
// eviction] in runtime/core/eviction_choice.cc), and as its tests inspect it. Not part of the
// public API: CachingAllocator keeps these private and befriends this class.
#ifndef REMAT_RUNTIME_ALLOC_DETAIL_ALLOCATOR_HOOKS_H_
#define REMAT_RUNTIME_ALLOC_DETAIL_ALLOCATOR_HOOKS_H_

#include <cstddef>
#include <cstdint>

#include "remat/caching_allocator.h"
#include "runtime/alloc/detail/blocks.h"

namespace remat::detail {

class AllocatorHooks {
 public:
  // True when a free window of `window_bytes` in `segment` could serve a request of `bytes`.
  static bool window_serves(const CachingAllocator& a, const SegmentView& segment,
                            std::size_t window_bytes, std::size_t bytes) {
    return a.window_serves(segment, window_bytes, bytes);
  }
  // Bytes the budget leaves unreserved.
  static std::size_t unreserved(const CachingAllocator& a) { return a.unreserved(); }
  // True when freeing the live block at `p` alone would let a request of `bytes` be served:
  // by the free run the block merges into, or by the room its emptied segment gives back.
  static bool release_would_serve(const CachingAllocator& a, const void* p, std::size_t bytes) {
    return a.release_would_serve(p, bytes);
  }
  // Labels the live block at `p` for its owner (the runtime: the storage it holds), so that
  // a walk over the segments needs no address lookup; the label goes when the block is freed.
  static void set_tag(CachingAllocator& a, const void* p, std::uint32_t tag) { a.set_tag(p, tag); }
  // Every segment's blocks in address order (the expandable arena's room to grow is a free
  // block after its last one), reusing `out`'s buffers.
  static void layout(const CachingAllocator& a, BlockLayout& out) { a.layout(out); }
  // True when `bytes` would be served from the small pool.
  static bool is_small(const CachingAllocator& a, std::size_t bytes) { return a.is_small(bytes); }
};

}  // namespace remat::detail

#endif  // REMAT_RUNTIME_ALLOC_DETAIL_ALLOCATOR_HOOKS_H_
