// A best-fit caching allocator with block splitting and coalescing, in the manner of
// PyTorch's CUDA caching allocator, over any SegmentSource, under a hard budget.
//
//   remat::CachingAllocator alloc(std::make_unique<remat::HostSegmentSource>(),
//                                 {.budget = size_t{256} << 20});
//   void* p = alloc.allocate(4096);   // under a budget, one pool: a 20 MiB segment
//   alloc.deallocate(p, 4096);        // cached, not returned to the source
//   alloc.stats().peak_reserved;      // never above the budget
//
// Without a budget the pools are PyTorch's: the same request would take a 2 MiB small-pool
// segment (Note [One pool under a budget]).
//
// See Note [Serving a request] in caching_allocator.cc for the order in which a request that
// does not fit is served.
#ifndef REMAT_CACHING_ALLOCATOR_H_
#define REMAT_CACHING_ALLOCATOR_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "remat/cuda_api.h"
#include "remat/memory_resource.h"
#include "remat/placement.h"
#include "remat/segment_source.h"

namespace remat {

struct CachingAllocatorOptions {
  std::size_t budget = SIZE_MAX;                       // hard cap on reserved bytes
  std::size_t round_to = 512;                          // every block is a multiple of this
  std::size_t small_max = std::size_t{1} << 20;        // requests up to this use the small pool
  std::size_t small_segment = std::size_t{2} << 20;    // small-pool segment size
  std::size_t medium_segment = std::size_t{20} << 20;  // large-pool segment for medium requests
  std::size_t medium_max = std::size_t{10} << 20;      // requests above this get their own segment
  std::size_t large_round = std::size_t{2} << 20;      // own segments round up to this
  // A large-pool block is split only when the rest is at least this big (PyTorch: 1 MiB), so
  // that big segments are not nibbled into slivers no large request can use.
  std::size_t large_split_min = std::size_t{1} << 20;
  // With a finite budget, serve every request from one pool and split blocks down to
  // `round_to` (Note [One pool under a budget]); PyTorch's two pools are kept without one.
  bool one_pool_under_budget = true;
  // With a finite budget, a request above `medium_max` gets a segment of its own that is
  // never split, and a cached one is reused only by a request within `large_round` of its
  // size (Note [Whole segments for large tensors]).
  bool whole_large_segments = true;
  // With a finite budget and a source that can grow a reservation in place (host, simulated),
  // serve every request from one arena whose reserved size grows and shrinks at its end, as
  // PyTorch's expandable segments do: no segment boundaries, one pool, so freed neighbours
  // always merge. See Note [Expandable arena].
  bool expandable_segments = false;
  std::size_t arena_step = std::size_t{2} << 20;  // growth granularity
};

namespace detail {
struct Block;
struct Segment;
struct SegmentView;
struct BlockLayout;
class BlockPool;
class AllocatorBlocks;
class AllocatorHooks;
struct StreamUses;
struct Placing;
}  // namespace detail

class CachingAllocator final : public MemoryResource {
 public:
  explicit CachingAllocator(std::unique_ptr<SegmentSource> source,
                            CachingAllocatorOptions options = {});
  ~CachingAllocator() override;

  MemoryStats stats() const override { return stats_; }
  void reset_peaks() override;
  std::size_t budget() const override { return options_.budget; }
  void set_budget(std::size_t budget) override;
  std::size_t rounded_size(std::size_t bytes) const override;

  // Returns every cached segment that holds no allocation to the source.
  void release_cached();

  // Stream-ordered reuse on a CUDA device (Note [Stream-ordered reuse]): every block is
  // allocated on `stream`, and one that `record_stream` marked as used by other streams is
  // reused only once the work those streams had enqueued when it was freed has completed
  // (the allocator records an event on each). Without it (host memory, simulated addresses)
  // a freed block is reused at once. `api` must outlive the allocator.
  void use_stream(CudaApi* api, CudaStream stream);
  // Marks the live allocation at `p` as used by work on `stream` too. Throws
  // std::invalid_argument where `p` is no live allocation of this allocator.
  void record_stream(const void* p, CudaStream stream);
  // Waits for every block whose reuse waits on other streams, and frees them.
  void synchronize_pending();
  // Largest free block, in either pool.
  std::size_t largest_free_block() const;
  // The size of segment a request of `bytes` (rounded) would reserve.
  std::size_t segment_size_for(std::size_t rounded) const;
  const SegmentSource& source() const { return *source_; }

  // Placed allocations (Note [Placed allocations]). `start_trace` records every request from
  // now on and when it is given back; `take_trace` ends the recording and returns it.
  void start_trace();
  AllocationTrace take_trace();
  // From now on, the i-th request of the traced size gets its block at its place: in one
  // of the free ranges beside live blocks (the regions), or in an arena segment reserved (or
  // reused) now, as `placement`'s trace laid out for those regions gives it; a request of
  // another size ends the placement, and later requests are served as usual. Returns false,
  // placing nothing, where the arena cannot be had within the budget. The regions and the
  // arena stay out of other requests' way until `end_placement` or the next
  // `begin_placement`.
  bool begin_placement(std::shared_ptr<const Placement> placement);
  void end_placement();
  // What the last begin_placement found: the arena it needed and the room it had for one;
  // nothing where it returned before sizing an arena.
  struct PlacementOutcome {
    std::size_t arena_bytes = 0;
    std::size_t room = 0;
  };
  std::optional<PlacementOutcome> last_placement() const;
  // Requests made while paused (a running kernel's scratch) are served as usual and are not
  // part of a trace's or a placement's sequence. Pauses nest.
  void pause_placement(bool paused);

 protected:
  void* do_allocate(std::size_t bytes) override;
  void do_deallocate(void* p, std::size_t bytes) override;

 private:
  // The runtime's eviction hooks and the tests' view of the blocks, through
  // runtime/alloc/detail (AllocatorHooks, AllocatorBlocks).
  friend class detail::AllocatorBlocks;
  friend class detail::AllocatorHooks;
  bool is_small(std::size_t bytes) const;
  void layout(detail::BlockLayout& out) const;
  bool window_serves(const detail::SegmentView& segment, std::size_t window_bytes,
                     std::size_t bytes) const;
  std::size_t unreserved() const;
  bool release_would_serve(const void* p, std::size_t bytes) const;
  void set_tag(const void* p, std::uint32_t tag);
  const std::vector<detail::Segment*>& segment_list() const;
  // The best-fitting free block for a rounded request, outside the segments `avoid` names.
  detail::Block* find_free(std::size_t size, const std::vector<std::uint64_t>* avoid = nullptr);
  void* hand_out(detail::Block* b, std::size_t size, std::size_t bytes);
  // A new block for `bytes` below the live block at `p`, from free cached blocks only; null
  // where none is lower (Note [Packing pinned storages]).
  void* allocate_below(std::size_t bytes, const void* p);
  std::uint64_t segment_serial(const void* p) const;
  bool used_by_other_streams(const void* p) const;
  void* allocate_outside(std::size_t bytes, const std::vector<std::uint64_t>& avoid);
  // Note [Evacuating segments] (packed_segment.cc).
  std::vector<void*> allocate_packed(const std::vector<std::size_t>& bytes);
  bool tracing_or_placing() const;
  bool places_outside(std::vector<std::size_t> bytes,
                      const std::vector<std::uint64_t>& avoid) const;
  // True when `have` free bytes (one block, or a window of a segment that is `whole` or not)
  // may serve a rounded request of `size` (Note [Whole segments for large tensors]).
  bool fits(bool whole, std::size_t have, std::size_t size) const;
  detail::Block* reserve_segment(std::size_t size);
  detail::Segment* add_segment(void* p, std::size_t bytes, bool small, bool whole);
  void* reserve_backed(std::size_t bytes);
  detail::Block* grow_arena(std::size_t size);
  std::size_t arena_room() const;  // bytes the arena may still grow by, within the budget
  void shrink_arena();
  void wait_before_release();
  bool small_pool(std::size_t rounded) const;
  bool one_pool() const;
  detail::Block* try_serve(std::size_t size);
  bool in_placed_range(const detail::Block* b) const;   // in a placement's region or arena
  bool placed_segment(const detail::Segment* s) const;  // holds a placement's range
  detail::Segment* placed_arena() const;
  detail::Block* take_placed(std::size_t size);
  void note_allocation(const void* p, std::size_t size);
  void moved(const void* from, const void* to);
  void mark_allocated(detail::Block* b, std::size_t bytes);
  detail::Block* split_block(detail::Block* b, std::size_t keep);
  void free_block(detail::Block* block);
  void finish_free(detail::Block* block);
  // Frees the blocks whose events have completed; with `wait`, waits for all of them first.
  void process_pending(bool wait);
  CudaEvent take_event();
  detail::Block* reclaim_pending(std::size_t size);
  [[noreturn]] void throw_oom(std::size_t size);

  std::unique_ptr<SegmentSource> source_;
  CachingAllocatorOptions options_;
  std::unique_ptr<detail::BlockPool> pools_;
  detail::Segment* arena_ = nullptr;
  MemoryStats stats_;
  std::size_t refused_ = 0;  // bytes of the last reservation the source refused in this request
  std::uint64_t next_serial_ = 1;  // of the next segment reserved
  // Note [Stream-ordered reuse].
  CudaApi* cuda_ = nullptr;
  CudaStream stream_ = nullptr;
  std::unique_ptr<detail::StreamUses> stream_uses_;
  std::unique_ptr<detail::Placing> placing_;  // Note [Placed allocations]
};

}  // namespace remat

#endif  // REMAT_CACHING_ALLOCATOR_H_
