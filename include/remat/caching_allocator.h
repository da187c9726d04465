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
// The policy is summarized atop runtime/alloc/detail/allocator_core.h; Note [Serving a
// request] in allocator_core.cc gives the order in which a request that does not fit is served.
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
class AllocatorCore;
class AllocatorHooks;
}  // namespace detail

class CachingAllocator final : public MemoryResource {
 public:
  explicit CachingAllocator(std::unique_ptr<SegmentSource> source,
                            CachingAllocatorOptions options = {});
  ~CachingAllocator() override;

  MemoryStats stats() const override;
  void reset_peaks() override;
  std::size_t budget() const override;
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
  const SegmentSource& source() const;

  // Placed allocations (Note [Placed allocations]). `record_allocations` records every request
  // from now on and when it is given back; `take_allocations` ends the recording and returns it.
  void record_allocations();
  AllocationSequence take_allocations();
  // From now on, the i-th request of the recorded size gets its block at its place: in one
  // of the free ranges beside live blocks (the regions), or in an arena segment reserved (or
  // reused) now, as `placement`'s sequence laid out for those regions gives it; a request of
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
  // Requests made while paused (a running kernel's scratch, a constant) are served as usual
  // and are not part of a recorded or a placed sequence. Pauses nest. Where every pause is
  // `short_lived` (a kernel's scratch, given back when the kernel ends), a request that finds
  // no room outside the placed ranges may take the arena's headroom
  // (Placement::headroom_bytes).
  void pause_placement(bool paused, bool short_lived = false);

 protected:
  void* do_allocate(std::size_t bytes) override;
  void do_deallocate(void* p, std::size_t bytes) override;

 private:
  // The runtime's eviction hooks and the tests' view of the blocks reach the core through
  // runtime/alloc/detail/allocator_hooks.h.
  friend class detail::AllocatorHooks;
  std::unique_ptr<detail::AllocatorCore> core_;
};

}  // namespace remat

#endif  // REMAT_CACHING_ALLOCATOR_H_
