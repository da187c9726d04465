// The caching allocator's placed allocations (Note [Placed allocations]): recording a step's
// requests as an AllocationSequence, and following a Placement of them, request by request, in
// the free regions and arena it was laid out for. Internal to the runtime.
//
//   detail::StepPlacement placement(pool);
//   placement.record_allocations();
//   ...                                   // the allocator notes each request and free
//   AllocationSequence requests = placement.take_allocations();
//   auto regions = placement.find_regions(nullptr);
//   placement.follow(placement.layout_for(p, sizes_of(regions)), regions, arena);
//   Block* b = placement.take(size);      // the free block at the next request's place
#ifndef REMAT_RUNTIME_ALLOC_DETAIL_STEP_PLACEMENT_H_
#define REMAT_RUNTIME_ALLOC_DETAIL_STEP_PLACEMENT_H_

#include <absl/container/flat_hash_map.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "remat/caching_allocator.h"
#include "remat/placement.h"
#include "runtime/alloc/detail/best_fit_pool.h"

namespace remat::detail {

class StepPlacement {
 public:
  explicit StepPlacement(BestFitPool& pool) : pool_(pool) {}

  // Recording. Requests made while paused (a running kernel's scratch) are not recorded
  // and not placed; pauses nest.
  void record_allocations();
  AllocationSequence take_allocations();
  void pause(bool paused, bool short_lived = false) {
    paused_ += paused ? 1 : -1;
    if (short_lived) short_lived_ += paused ? 1 : -1;
  }
  // Whether a request now may take the arena's headroom: every pause is short-lived (Note
  // [Scratch borrows the arena's headroom] in allocator_core.cc).
  bool lends_headroom() const { return paused_ > 0 && paused_ == short_lived_; }
  void note_allocation(std::uintptr_t address, std::size_t size) {
    if (recording_ && paused_ == 0) record(address, size);
  }
  void note_free(std::uintptr_t address) {
    if (recording_) record_end(address);
  }
  // The live block at `from` moved to `to`: the recording follows it.
  void moved(std::uintptr_t from, std::uintptr_t to);
  // Whether requests are recorded or a placement's ranges are held.
  bool active() const { return recording_ || arena_ != nullptr || !ranges_.empty(); }

  // Following. The fixed regions of a step: the largest free blocks, of 1 MiB and more, of
  // segments (other than `skip`) that hold live blocks, in address order.
  std::vector<Block*> find_regions(const Segment* skip) const;
  // `given`, laid out for regions of `sizes` (made once per placement and regions).
  std::shared_ptr<const Placement> layout_for(const std::shared_ptr<const Placement>& given,
                                              const std::vector<std::size_t>& sizes);
  // The last placement's arena, where it is free and holds `need` bytes; else null.
  Segment* reusable_arena(std::size_t need) const;
  // From now on, the i-th request of the recorded size takes its block at its place in
  // `regions` (then `arena`, which may be null where the layout needs none).
  void follow(std::shared_ptr<const Placement> layout, const std::vector<Block*>& regions,
              Segment* arena);
  bool has_ranges() const { return !ranges_.empty(); }
  // The free block at the next request's place, cut to `size`, out of its free set; null
  // where the request is not placed, or missed its place (which ends the placement).
  Block* take(std::size_t size) {
    return following_ && paused_ == 0 ? take_at_place(size) : nullptr;
  }
  // Abandons the placement (a miss), or ends it: its ranges open to other requests.
  void miss();
  void end();
  bool in_placed_range(const Block* b) const {
    for (const Range& r : ranges_)
      if (b->segment == r.segment && b->address < r.address + r.bytes &&
          r.address < b->address + b->size)
        return true;
    return false;
  }
  bool holds_range(const Segment* s) const;
  Segment* arena() const { return arena_; }
  // Where the arena's headroom begins (Placement::headroom_bytes); 0 where it has none.
  std::uintptr_t headroom_start() const {
    if (arena_ == nullptr || layout_ == nullptr || layout_->headroom_bytes == 0) return 0;
    return arena_->address + layout_->arena_bytes;
  }

  std::optional<CachingAllocator::PlacementOutcome>
      outcome;             // what the last placement found, where it sized an arena
  std::size_t placed = 0;  // requests served at their place
  std::size_t misses = 0;  // placements abandoned

 private:
  struct Layout {
    std::weak_ptr<const Placement> given;
    std::shared_ptr<const Placement> layout;
  };
  struct Range {
    Segment* segment;
    std::uintptr_t address;
    std::size_t bytes;
  };
  void record(std::uintptr_t address, std::size_t size);
  void record_end(std::uintptr_t address);
  Block* take_at_place(std::size_t size);
  Block* block_at(std::size_t request, std::size_t size, std::uintptr_t* at) const;

  BestFitPool& pool_;
  // The sequence being recorded.
  bool recording_ = false;
  AllocationSequence sequence_;
  absl::flat_hash_map<std::uintptr_t, std::size_t> recorded_;  // live block -> its allocation
  std::size_t clock_ = 0;
  int paused_ = 0;
  int short_lived_ = 0;  // of those pauses, the short-lived ones
  // The placement being followed.
  std::vector<Layout> layouts_;  // most recent last
  std::shared_ptr<const Placement> layout_;
  std::vector<Range> ranges_;     // the fixed regions, then the arena (if it needs one)
  std::size_t next_ = 0;          // index of the next request in its sequence
  bool following_ = false;        // no miss yet
  Segment* arena_ = nullptr;      // the arena while it is closed
  std::uint64_t last_arena_ = 0;  // the serial of the latest arena, for reuse
};

}  // namespace remat::detail

#endif  // REMAT_RUNTIME_ALLOC_DETAIL_STEP_PLACEMENT_H_
