// The caching allocator's implementation: the parts composed, and the policy that serves a
// request from them. CachingAllocator (include/remat/caching_allocator.h) forwards to this;
// the runtime's eviction reaches it through AllocatorHooks. Internal to the runtime.
//
// The policy, in the manner of PyTorch's caching allocator:
//   - Memory comes from a SegmentSource in segments, which a BestFitPool cuts into blocks;
//     a request takes the best-fitting free block and splits off the rest, and a freed block
//     merges with free neighbours (Note [Blocks and segments]). Nothing goes back to the
//     source until a request needs the room (release_cached).
//   - Without a budget, small requests (up to 1 MiB) use small segments of their own, as in
//     PyTorch. Under a budget every request uses one pool (Note [One pool under a budget]),
//     and large tensors get whole segments of their own (Note [Whole segments for large
//     tensors]); with `expandable_segments`, one ExpandableArena replaces segments.
//   - Reserved bytes never pass the budget. A request that does not fit releases cached
//     segments, then asks the reclaimer (the runtime, which evicts) for room, and only then
//     fails (Note [Serving a request]).
//   - On a CUDA stream, a block other streams used is reused only after their work
//     (StreamOrderedFrees, Note [Stream-ordered reuse]).
//   - A step that repeats its requests may follow a placement of them (StepPlacement, Note
//     [Placed allocations]).
//   - The runtime packs pinned blocks low, compacts and evacuates fragmented segments through
//     the calls of compaction_support.cc and packed_segment.cc.
#ifndef REMAT_RUNTIME_ALLOC_DETAIL_ALLOCATOR_CORE_H_
#define REMAT_RUNTIME_ALLOC_DETAIL_ALLOCATOR_CORE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "remat/caching_allocator.h"
#include "remat/memory_resource.h"
#include "runtime/alloc/detail/best_fit_pool.h"
#include "runtime/alloc/detail/expandable_arena.h"
#include "runtime/alloc/detail/step_placement.h"
#include "runtime/alloc/detail/stream_ordered_frees.h"

namespace remat::detail {

class AllocatorCore {
 public:
  AllocatorCore(std::unique_ptr<SegmentSource> source, CachingAllocatorOptions options);
  ~AllocatorCore();

  // What CachingAllocator offers (see there).
  void* allocate(std::size_t bytes, MemoryReclaimer* reclaimer);
  void deallocate(void* p);
  MemoryStats stats() const;
  void reset_peaks();
  std::size_t budget() const { return options_.budget; }
  void set_budget(std::size_t budget);
  std::size_t rounded_size(std::size_t bytes) const {
    return round_up(bytes == 0 ? 1 : bytes, options_.round_to);
  }
  void release_cached();
  void use_stream(CudaApi* api, CudaStream stream);
  void record_stream(const void* p, CudaStream stream);
  void synchronize_pending();
  std::size_t largest_free_block() const { return pool_.largest_free(); }
  std::size_t segment_size_for(std::size_t rounded) const;
  const SegmentSource& source() const { return *source_; }
  StepPlacement& placement() { return placement_; }
  const StepPlacement& placement() const { return placement_; }
  bool begin_placement(std::shared_ptr<const Placement> placement);
  void end_placement() { placement_.end(); }

  // What the runtime's eviction and compaction use (AllocatorHooks says what each does).
  bool is_small(std::size_t bytes) const { return small_pool(rounded_size(bytes)); }
  bool window_serves(const SegmentView& segment, std::size_t window_bytes, std::size_t bytes) const;
  std::size_t unreserved() const {
    return options_.budget > stats_.reserved ? options_.budget - stats_.reserved : 0;
  }
  bool release_would_serve(const void* p, std::size_t bytes) const;
  void set_tag(const void* p, std::uint32_t tag) {
    if (Block* b = pool_.live_block(p)) b->tag = tag;
  }
  void layout(BlockLayout& out) const;
  void* allocate_below(std::size_t bytes, const void* p);
  std::uint64_t segment_serial(const void* p) const;
  bool used_by_other_streams(const void* p) const;
  void* allocate_outside(std::size_t bytes, const AvoidedMemory& avoid);
  bool places_outside(std::vector<std::size_t> bytes, const AvoidedMemory& avoid) const;
  std::vector<void*> allocate_packed(const std::vector<std::size_t>& bytes);
  // The segments and the arena's room, for AllocatorBlocks.
  const std::vector<Segment*>& segments() const { return pool_.segments(); }
  const Segment* arena_segment() const { return arena_ ? arena_->segment() : nullptr; }
  std::size_t arena_room() const { return arena_ ? arena_->room(unreserved()) : 0; }

 private:
  // Note [One pool under a budget] in allocator_core.cc.
  bool one_pool() const {
    return options_.expandable_segments ||
           (options_.one_pool_under_budget && options_.budget != SIZE_MAX);
  }
  bool small_pool(std::size_t rounded) const {
    return !one_pool() && rounded <= options_.small_max;
  }
  // True when `have` free bytes (one block, or a window of a segment that is `whole` or not)
  // may serve a rounded request of `size` (Note [Whole segments for large tensors]).
  bool fits(bool whole, std::size_t have, std::size_t size) const {
    return have >= size && (!whole || have - size <= options_.large_round);
  }
  Block* find_free(std::size_t size, const AvoidedMemory* avoid = nullptr);
  // A free block in the arena's headroom, for a short-lived request (Note [Scratch borrows
  // the arena's headroom] in allocator_core.cc); null where none fits.
  Block* borrow_headroom(std::size_t size);
  Block* try_serve(std::size_t size);
  Block* serve_after_release(std::size_t size);
  Block* reclaim_pending(std::size_t size);
  Block* serve_with_reclaimer(std::size_t size, MemoryReclaimer* reclaimer);
  void* hand_out(Block* b, std::size_t size, std::size_t bytes);
  void mark_allocated(Block* b, std::size_t bytes);
  void finish_free(Block* b);
  Block* reserve_segment(std::size_t size);
  Segment* add_segment(void* p, std::size_t bytes, bool small, bool whole);
  void* reserve_backed(std::size_t bytes);
  Block* grow_arena(std::size_t size);
  void shrink_arena();
  void wait_before_release();
  bool keeps_segment(const Segment* s) const;
  Segment* placement_arena(std::size_t need);
  [[noreturn]] void throw_oom(std::size_t size);

  std::unique_ptr<SegmentSource> source_;
  CachingAllocatorOptions options_;
  MemoryStats stats_;
  std::size_t refused_ = 0;  // bytes of the last reservation the source refused in this request
  BestFitPool pool_;
  std::optional<ExpandableArena> arena_;         // with expandable_segments, where it can be
  std::unique_ptr<StreamOrderedFrees> streams_;  // after use_stream
  StepPlacement placement_;
};

}  // namespace remat::detail

#endif  // REMAT_RUNTIME_ALLOC_DETAIL_ALLOCATOR_CORE_H_
