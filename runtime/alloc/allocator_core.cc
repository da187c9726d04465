#include "runtime/alloc/detail/allocator_core.h"

#include <algorithm>
#include <cassert>
#include <utility>

#include "remat/errors.h"

namespace remat::detail {

AllocatorCore::AllocatorCore(std::unique_ptr<SegmentSource> source, CachingAllocatorOptions options)
    : source_(std::move(source)), options_(options), placement_(pool_) {
  if (options_.expandable_segments && source_->lazily_committed())
    arena_.emplace(pool_, *source_, options_.arena_step);
}

AllocatorCore::~AllocatorCore() {
  // Pending blocks' memory goes back with its segment; the device must be done with it.
  // Nothing may throw here: errors are dropped (a sticky error has been raised already).
  if (streams_ != nullptr && !source_->release_waits_for_device())
    streams_->api()->stream_synchronize(streams_->stream());  // unmapping does not wait
  streams_.reset();
  for (const Segment* s : pool_.segments()) {
    try {
      source_->release(reinterpret_cast<void*>(s->address), s->capacity);
    } catch (...) {
    }
  }
}

MemoryStats AllocatorCore::stats() const {
  MemoryStats s = stats_;
  s.segments = pool_.segments().size();
  s.placed_allocations = placement_.placed;
  s.placement_misses = placement_.misses;
  if (streams_ != nullptr) {
    s.deferred_frees = streams_->deferred();
    s.pending_frees = streams_->pending();
    s.stream_waits = streams_->waits();
  }
  return s;
}

void AllocatorCore::reset_peaks() {
  stats_.peak_allocated = stats_.allocated;
  stats_.peak_reserved = stats_.reserved;
  stats_.peak_active_blocks = stats_.active_blocks;
}

void AllocatorCore::set_budget(std::size_t budget) {
  options_.budget = budget;
  if (stats_.reserved <= budget) return;
  end_placement();  // its holes and arena are cached memory like any other now
  release_cached();
}

// Note [One pool under a budget]
// PyTorch keeps small requests in segments of their own so that long-lived small tensors do
// not pin large segments, and it never splits a large block into slivers under 1 MiB. Both
// rules assume memory can grow. Under a hard cap they partition the budget instead: bytes
// freed in small segments cannot serve a large request (nor the reverse) until a whole
// segment empties and is given back, which eviction in score order rarely achieves, and
// slivers left unsplit are simply lost. So with a finite budget every request goes to one
// pool, blocks split down to `round_to`, and the runtime's eviction (which can always free
// what sits between two free blocks) takes the place of segregation. The arena (Note
// [Expandable arena]) is one pool too. (AllocatorCore::one_pool.)

std::size_t AllocatorCore::segment_size_for(std::size_t rounded) const {
  if (rounded <= options_.small_max && !one_pool()) return options_.small_segment;
  if (rounded <= options_.medium_max) return options_.medium_segment;
  return round_up(rounded, options_.large_round);
}

void AllocatorCore::use_stream(CudaApi* api, CudaStream stream) {
  if (streams_ == nullptr)
    streams_ = std::make_unique<StreamOrderedFrees>(api, stream);
  else
    streams_->set_stream(api, stream);
}

void AllocatorCore::record_stream(const void* p, CudaStream stream) {
  if (pool_.live_block(p) == nullptr)
    throw std::invalid_argument("remat: record_stream of a pointer that is no live allocation");
  if (streams_ != nullptr) streams_->record(reinterpret_cast<std::uintptr_t>(p), stream);
}

void AllocatorCore::synchronize_pending() {
  if (streams_ != nullptr) streams_->poll(/*wait=*/true, [&](Block* b) { finish_free(b); });
}

// Waits for pending frees and serves the request from what they give back.
Block* AllocatorCore::reclaim_pending(std::size_t size) {
  if (streams_ == nullptr || !streams_->has_pending()) return nullptr;
  synchronize_pending();
  return try_serve(size);
}

// Note [Serving a request]
// A request is served by the first of these that works:
//   1. the best-fitting free cached block of its pool;
//   2. a new segment, if the budget has room for it;
//   3. after returning every fully free cached segment to the source, a new segment (cached
//      segments of the other pool, or of the wrong sizes, are what usually stands in the way);
//   4. after the reclaimer (the runtime) evicted tensors, steps 1-3 again, for as long as the
//      reclaimer says it freed something;
//   5. an OutOfMemoryError.
// Reserved bytes never pass the budget: step 2 checks the room before it asks the source.
// Frees waiting on other streams are waited for before step 3, and a placement that
// keeps its ranges from a request it does not place gives way before step 3 too.
//
// A source may refuse a reservation the budget has room for (cudaMalloc on a device shared
// with other processes). That is handled like a full budget, by releasing and evicting, and
// if the request still fails, the error says the device refused below the budget.
void* AllocatorCore::allocate(std::size_t bytes, MemoryReclaimer* reclaimer) {
  const std::size_t size = rounded_size(bytes);
  refused_ = 0;
  if (streams_ != nullptr) {
    streams_->raise_error();
    if (streams_->has_pending()) streams_->poll(/*wait=*/false, [&](Block* b) { finish_free(b); });
  }
  if (Block* placed = placement_.take(size)) {
    mark_allocated(placed, bytes);
    placement_.note_allocation(placed->address, size);
    return reinterpret_cast<void*>(placed->address);
  }
  Block* b = try_serve(size);
  if (b == nullptr) b = serve_with_reclaimer(size, reclaimer);
  void* p = hand_out(b, size, bytes);
  placement_.note_allocation(b->address, size);
  return p;
}

// Steps 3 to 5 of Note [Serving a request]: a block, or OutOfMemoryError.
Block* AllocatorCore::serve_with_reclaimer(std::size_t size, MemoryReclaimer* reclaimer) {
  Block* b = reclaim_pending(size);
  if (b == nullptr && placement_.lends_headroom()) b = borrow_headroom(size);
  if (b == nullptr && placement_.has_ranges()) {
    // A request the placement does not place found no room outside its regions: the
    // placement gives way (a miss) rather than make the request evict or fail.
    placement_.miss();
    b = try_serve(size);
  }
  if (b == nullptr) {
    ++stats_.retries;
    b = serve_after_release(size);
  }
  while (b == nullptr) {
    if (reclaimer == nullptr) throw_oom(size);
    ++stats_.reclaims;
    if (!reclaimer->reclaim(size)) throw_oom(size);
    b = try_serve(size);
    if (b == nullptr) b = reclaim_pending(size);
    if (b == nullptr) b = serve_after_release(size);
  }
  return b;
}

Block* AllocatorCore::try_serve(std::size_t size) {
  if (Block* b = find_free(size)) return b;
  if (Block* b = grow_arena(size)) return b;
  return reserve_segment(size);
}

Block* AllocatorCore::serve_after_release(std::size_t size) {
  release_cached();
  if (Block* grown = grow_arena(size)) return grown;
  return reserve_segment(size);
}

Block* AllocatorCore::find_free(std::size_t size, const AvoidedMemory* avoid) {
  // A whole segment too big for the request, or one the caller keeps out of.
  return pool_.take_best_fit(size, small_pool(size), [&](const Block* b) {
    if (!fits(b->segment->whole, b->size, size) || placement_.in_placed_range(b)) return false;
    return avoid == nullptr || !avoid->avoids(b->segment->serial, b->address, b->size);
  });
}

// Note [Scratch borrows the arena's headroom]
// A placement's regions and arena take the free blocks of 1 MiB and more, so a kernel's
// scratch, which no placement places, can find no room left outside them, and the placement
// would give way at the first large scratch. A free place inside the ranges will not do: an
// op's declared scratch is taken before its outputs, whose places it may cover. So an arena
// may keep headroom after its places (Placement::headroom_bytes), which no placed request
// uses, and a short-lived request that finds no room outside takes it there.
Block* AllocatorCore::borrow_headroom(std::size_t size) {
  Segment* arena = placement_.arena();
  const std::uintptr_t from = placement_.headroom_start();
  if (arena == nullptr || from == 0) return nullptr;
  for (Block* b = arena->first; b != nullptr; b = b->next) {
    const std::uintptr_t start = std::max(b->address, from);
    if (b->allocated || b->address + b->size < start + size) continue;
    pool_.erase_free(b);
    if (b->address < start) {
      Block* rest = pool_.split(b, start - b->address);
      pool_.insert_free(b);
      b = rest;
    }
    return b;
  }
  return nullptr;
}

// Marks free block `b` allocated for a request of `bytes` (`size` rounded), splitting off
// its tail when that is big enough to be useful to its pool.
void* AllocatorCore::hand_out(Block* b, std::size_t size, std::size_t bytes) {
  const bool small = small_pool(size);
  const std::size_t rest = b->size - size;
  if (!b->segment->whole &&
      rest >= (small || one_pool() ? options_.round_to : options_.large_split_min)) {
    pool_.insert_free(pool_.split(b, size));
  }
  mark_allocated(b, bytes);
  return reinterpret_cast<void*>(b->address);
}

void AllocatorCore::mark_allocated(Block* b, std::size_t bytes) {
  pool_.mark_live(b, bytes);
  stats_.allocated += b->size;
  stats_.requested += bytes;
  stats_.peak_allocated = std::max(stats_.peak_allocated, stats_.allocated);
  ++stats_.active_blocks;
  stats_.peak_active_blocks = std::max(stats_.peak_active_blocks, stats_.active_blocks);
  ++stats_.allocations;
}

void AllocatorCore::deallocate(void* p) {
  Block* b = pool_.take_live(p);
  assert(b != nullptr && "deallocate of a pointer this allocator did not give");
  if (b == nullptr) return;
  placement_.note_free(b->address);
  if (streams_ != nullptr && streams_->defer(b)) return;
  finish_free(b);
}

// The block's memory is free for any later work on the allocator's stream.
void AllocatorCore::finish_free(Block* b) {
  stats_.allocated -= b->size;
  stats_.requested -= b->requested;
  --stats_.active_blocks;
  pool_.coalesce(b);
}

// Note [Whole segments for large tensors]
// In one pool, a request may split any free block, and best fit will cut a smaller tensor
// out of a big one's freed segment. Under a budget that is what fragments memory past repair:
// the rest of the segment can serve no request bigger than itself, and the segment can no
// longer be given back to make room for one. Large tensors come and go whole (a convolutional
// net's activations are each tens to hundreds of megabytes), so with `whole_large_segments` a
// request above `medium_max` gets a segment of its own that is never split, and a cached one
// is reused only by a request within `large_round` of its size (AllocatorCore::fits); any
// other request that needs the room gets it by the segment's release (Note [Serving a
// request], step 3), which costs nothing on a simulated or virtual address space. Memory then
// behaves like the sum of the large tensors' (rounded) sizes, and fragmentation is confined
// to the shared segments of smaller tensors.

// Reserves a segment for a request of `size` (already rounded), preferring the pool's usual
// segment size and falling back to the bare request when the budget has no room for more (a
// tight budget is a hard cap, so it wins over PyTorch's segment-size heuristics).
Block* AllocatorCore::reserve_segment(std::size_t size) {
  const bool small = small_pool(size);
  // A source that backs memory in granules (CUDA's virtual memory) gets whole granules, so
  // that what is counted is what the device holds.
  const std::size_t granule = source_->commit_granularity();
  const std::size_t bare = round_up(size, granule);
  std::size_t want = round_up(std::max(segment_size_for(size), size), granule);
  const std::size_t room = unreserved();
  if (want > room) want = bare;
  if (want > room) return nullptr;
  void* p = reserve_backed(want);
  if (p == nullptr && want > bare) p = reserve_backed(want = bare);  // the bare request may fit
  if (p == nullptr) {
    ++stats_.source_refusals;
    refused_ = want;
    return nullptr;
  }
  refused_ = 0;
  const bool whole = options_.whole_large_segments && one_pool() && size > options_.medium_max;
  return add_segment(p, want, small, whole)->first;
}

// Counts the reservation of `bytes` at `p` as a new segment, one free block in no free set.
Segment* AllocatorCore::add_segment(void* p, std::size_t bytes, bool small, bool whole) {
  ++stats_.segment_reserves;
  stats_.reserved += bytes;
  stats_.peak_reserved = std::max(stats_.peak_reserved, stats_.reserved);
  return pool_.add_segment(reinterpret_cast<std::uintptr_t>(p), bytes, small, whole);
}

// A reservation with memory behind it: a lazily committed source (CUDA's virtual memory)
// backs it explicitly; null where the source refuses either step.
void* AllocatorCore::reserve_backed(std::size_t bytes) {
  void* p = source_->reserve(bytes);
  if (p == nullptr || !source_->lazily_committed() || source_->commit_prefix(p, bytes)) return p;
  source_->release(p, bytes);
  return nullptr;
}

Block* AllocatorCore::grow_arena(std::size_t size) {
  if (!arena_ || (arena_->segment() == nullptr && options_.budget == SIZE_MAX)) return nullptr;
  const ExpandableArena::Growth g = arena_->grow(size, options_.budget, unreserved());
  if (g.refused != 0) {
    ++stats_.source_refusals;
    refused_ = g.refused;
  }
  if (g.tail == nullptr) return nullptr;
  ++stats_.segment_reserves;
  stats_.reserved += g.bytes;
  stats_.peak_reserved = std::max(stats_.peak_reserved, stats_.reserved);
  return g.tail;
}

void AllocatorCore::shrink_arena() {
  if (!arena_ || arena_->shrinkable() == 0) return;
  // Unmapping does not wait for the device, as cudaFree does: kernels enqueued before the
  // tail was freed may still use it.
  if (streams_ != nullptr)
    CudaError::check(streams_->api()->stream_synchronize(streams_->stream()),
                     "cudaStreamSynchronize");
  stats_.reserved -= arena_->shrink();
  ++stats_.segment_releases;
}

// Segments release_cached keeps: those with live blocks, the arena, a placement's.
bool AllocatorCore::keeps_segment(const Segment* s) const {
  return s->live_blocks != 0 || s == arena_segment() || placement_.holds_range(s);
}

// Before segments go back to a source that does not wait for the device (CUDA's unmap):
// kernels queued before their blocks were freed may still use them, so wait for the stream,
// once, where any segment is about to go.
void AllocatorCore::wait_before_release() {
  if (streams_ == nullptr || source_->release_waits_for_device()) return;
  for (const Segment* s : pool_.segments()) {
    if (!keeps_segment(s)) {
      CudaError::check(streams_->api()->stream_synchronize(streams_->stream()),
                       "cudaStreamSynchronize");
      return;
    }
  }
}

void AllocatorCore::release_cached() {
  shrink_arena();
  wait_before_release();
  // A source that throws (a failing cudaFree) leaves its segment, and every one not yet
  // looked at, as they were.
  pool_.remove_segments([&](const Segment* s) { return !keeps_segment(s); },
                        [&](const Segment* s) {
                          source_->release(reinterpret_cast<void*>(s->address), s->size);
                          ++stats_.segment_releases;
                          stats_.reserved -= s->size;
                        });
}

void AllocatorCore::throw_oom(std::size_t size) {
  ++stats_.ooms;
  OutOfMemoryInfo info;
  info.requested = size;
  info.budget = options_.budget;
  info.reserved = stats_.reserved;
  info.allocated = stats_.allocated;
  info.largest_free = largest_free_block();
  info.segments = pool_.segments().size();
  info.granule = std::max(options_.round_to, source_->commit_granularity());
  info.source_refused = refused_;
  if (refused_ != 0) info.source = source_->name();
  throw OutOfMemoryError(std::move(info));
}

}  // namespace remat::detail

namespace remat::detail {

// Follows `placement` from the next request on (Note [Placed allocations]): in the free
// regions beside live blocks, and in an arena reserved (or the last one reused) now.
bool AllocatorCore::begin_placement(std::shared_ptr<const Placement> placement) {
  end_placement();
  placement_.outcome.reset();
  if (placement == nullptr || placement->sequence.allocations.empty() ||
      options_.expandable_segments)
    return false;
  const std::vector<Block*> regions = placement_.find_regions(arena_segment());
  std::vector<std::size_t> sizes;
  for (const Block* b : regions) sizes.push_back(b->size);
  std::shared_ptr<const Placement> layout = placement_.layout_for(placement, sizes);
  const std::size_t granule = std::max(source_->commit_granularity(), options_.round_to);
  const std::size_t arena_bytes = layout->arena_bytes + layout->headroom_bytes;
  const std::size_t need = arena_bytes == 0 ? 0 : round_up(arena_bytes, granule);
  // The last step's arena, if it is empty and large enough; else a new one, after every
  // cached segment (the old arena among them) has gone back. Not where the budget has since
  // been lowered below what is reserved: the arena goes back.
  Segment* arena =
      need > 0 && stats_.reserved <= options_.budget ? placement_.reusable_arena(need) : nullptr;
  if (arena == nullptr && need > 0) release_cached();
  placement_.outcome = CachingAllocator::PlacementOutcome{
      .arena_bytes = need, .room = arena != nullptr ? arena->size : unreserved()};
  if (arena == nullptr && need > 0 && (arena = placement_arena(need)) == nullptr) {
    ++placement_.misses;
    return false;
  }
  placement_.follow(std::move(layout), regions, arena);
  return true;
}

// A new segment of `need` bytes for a placement's arena, free; null where the budget or the
// source has no room.
Segment* AllocatorCore::placement_arena(std::size_t need) {
  if (unreserved() < need) return nullptr;
  void* p = reserve_backed(need);
  if (p == nullptr) {
    ++stats_.source_refusals;
    return nullptr;
  }
  Segment* arena = add_segment(p, need, /*small=*/false, /*whole=*/false);
  pool_.insert_free(arena->first);
  return arena;
}

}  // namespace remat::detail
