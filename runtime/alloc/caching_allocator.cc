#include "remat/caching_allocator.h"

#include <absl/container/btree_set.h>
#include <absl/container/flat_hash_map.h>

#include <algorithm>
#include <cassert>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "remat/errors.h"
#include "runtime/alloc/detail/block_pool.h"
#include "runtime/alloc/detail/blocks.h"

namespace remat {
namespace detail {

// Note [Stream-ordered reuse]
// A CUDA allocation is made on a stream, and freeing it only means the host has no more use
// for it: kernels enqueued earlier may still read or write it. Reusing the block for later
// work on the same stream is safe, since that work is ordered after them. Work on another
// stream is not ordered, so a block that other streams used (`record_stream`, as PyTorch's
// `Tensor.record_stream`) is not freed when the runtime frees it: the allocator records an
// event on each of those streams and keeps the block, still allocated, in `pending` until
// every event has completed. Pending blocks are polled (never waited for) at the start of
// each allocation; a request that nothing cached can serve waits for them before it gives
// cached segments back or asks the runtime to evict, since waiting for a side stream is
// cheaper than recomputing. Errors from the event calls are raised as CudaError.
struct PendingFree {
  Block* block;
  std::vector<CudaEvent> events;
};
struct StreamUses {
  absl::flat_hash_map<std::uintptr_t, std::vector<CudaStream>> by_block;  // live blocks
  std::vector<PendingFree> pending;
  std::vector<CudaEvent> spare_events;
  std::optional<CudaError> error;  // from a free, raised by the next allocation
};

// Note [Placed allocations]
// A training step that follows a static plan makes the same requests in the same order
// every time, and frees them at the same points. Best fit, which knows nothing of when a
// block will be freed, scatters long-lived blocks (gradients, a plan's checkpoints) among
// short-lived ones, and the holes between them can cost 10-20% of the budget: a plan that
// fits in live bytes then does not fit in reserved ones, and the runtime evicts and
// recomputes what the plan meant to keep. So such a step's requests are traced once
// (`start_trace`, on a run that has room: the simulated backend without a budget) and,
// when the step begins, laid out by `place_allocations` (Note [Greedy placement by size]
// in placement.cc) in the free holes of 1 MiB and more beside live blocks (the parameters'
// segments' tails: on a 6-layer GPT 17 MB of them) and, for what they cannot hold, one
// arena segment, reused from step to step. From then on the i-th request of the traced size
// is carved out of the free block at its place. The holes and the arena are closed to every
// other request and to packing and compaction (the arena to eviction's windows too), so
// that nothing lands where a later placed block must go. Correctness never depends on the
// placement: a request of another size, a placed range that is not free (the program or
// the runtime did something else this time), or a request the placement does not place
// that finds no room elsewhere, ends the placement for the step (a miss); its ranges open,
// and requests are served as usual from then on. Allocations still live when the trace
// ended are served as usual, outside the placed ranges, since they would hold them into the
// next step. A running kernel's scratch is not part of the sequence (`pause_placement`), so
// a trace from the simulated backend, where kernels do not run, matches a step that runs
// them.
struct Placing {
  // The trace being recorded.
  bool tracing = false;
  AllocationTrace trace;
  absl::flat_hash_map<std::uintptr_t, std::size_t> traced;  // live block -> its allocation
  std::size_t clock = 0;
  // The placement being followed: the one given, laid out for the regions found (cached).
  struct Layout {
    std::weak_ptr<const Placement> given;
    std::shared_ptr<const Placement> layout;
  };
  std::vector<Layout> layouts;  // most recent last
  std::shared_ptr<const Placement> layout;
  struct Range {
    Segment* segment;
    std::uintptr_t address;
    std::size_t bytes;
  };
  std::vector<Range> ranges;         // the fixed regions, then the arena (if it needs one)
  std::size_t next = 0;              // index of the next request in its sequence
  bool following = false;            // no miss yet
  Segment* arena_segment = nullptr;  // the arena while it is closed
  std::uint64_t last_arena = 0;      // the serial of the latest arena, for reuse
  int paused = 0;
  std::optional<CachingAllocator::PlacementOutcome> outcome;
};

}  // namespace detail

using detail::Block;
using detail::BlockLayout;
using detail::kNoTag;
using detail::Segment;
using detail::SegmentView;

using detail::round_up;

namespace {
std::size_t round_down(std::size_t n, std::size_t to) { return n / to * to; }
}  // namespace

CachingAllocator::CachingAllocator(std::unique_ptr<SegmentSource> source,
                                   CachingAllocatorOptions options)
    : source_(std::move(source)),
      options_(options),
      pools_(new detail::BlockPool()),
      placing_(new detail::Placing()) {}

CachingAllocator::~CachingAllocator() {
  // Pending blocks' memory goes back with its segment; the device must be done with it.
  // Nothing may throw here: errors are dropped (a sticky error has been raised already).
  if (cuda_ != nullptr && !source_->release_waits_for_device())
    cuda_->stream_synchronize(stream_);  // unmapping does not wait (wait_before_release)
  if (stream_uses_ != nullptr) {
    for (auto& p : stream_uses_->pending)
      for (CudaEvent e : p.events) {
        cuda_->event_synchronize(e);
        cuda_->event_destroy(e);
      }
    for (CudaEvent e : stream_uses_->spare_events) cuda_->event_destroy(e);
  }
  for (Segment* s : pools_->segments) {
    try {
      source_->release(reinterpret_cast<void*>(s->address), s->capacity);
    } catch (...) {
    }
  }
}

void CachingAllocator::use_stream(CudaApi* api, CudaStream stream) {
  cuda_ = api;
  stream_ = stream;
  if (stream_uses_ == nullptr) stream_uses_ = std::make_unique<detail::StreamUses>();
}

void CachingAllocator::record_stream(const void* p, CudaStream stream) {
  if (pools_->live_block(p) == nullptr)
    throw std::invalid_argument("remat: record_stream of a pointer that is no live allocation");
  if (cuda_ == nullptr || stream == stream_) return;  // stream order covers its own stream
  auto& streams = stream_uses_->by_block[reinterpret_cast<std::uintptr_t>(p)];
  if (std::find(streams.begin(), streams.end(), stream) == streams.end()) streams.push_back(stream);
}

CudaEvent CachingAllocator::take_event() {
  auto& spare = stream_uses_->spare_events;
  if (!spare.empty()) {
    CudaEvent e = spare.back();
    spare.pop_back();
    return e;
  }
  CudaEvent e = nullptr;
  CudaError::check(cuda_->event_create(&e, /*timing=*/false), "cudaEventCreate");
  return e;
}

void CachingAllocator::process_pending(bool wait) {
  auto& pending = stream_uses_->pending;
  std::erase_if(pending, [&](detail::PendingFree& p) {
    for (CudaEvent e : p.events) {
      CudaResult r = cuda_->event_query(e);
      if (r.status == CudaStatus::kNotReady && wait) {
        ++stats_.stream_waits;
        r = cuda_->event_synchronize(e);
      }
      if (r.status == CudaStatus::kNotReady) return false;
      CudaError::check(r, wait ? "cudaEventSynchronize" : "cudaEventQuery");
    }
    for (CudaEvent e : p.events) stream_uses_->spare_events.push_back(e);
    finish_free(p.block);
    return true;
  });
  stats_.pending_frees = pending.size();
}

// Waits for pending frees and serves the request from what they give back.
Block* CachingAllocator::reclaim_pending(std::size_t size) {
  if (stream_uses_ == nullptr || stream_uses_->pending.empty()) return nullptr;
  process_pending(/*wait=*/true);
  return try_serve(size);
}

void CachingAllocator::synchronize_pending() {
  if (stream_uses_ != nullptr) process_pending(/*wait=*/true);
}

std::size_t CachingAllocator::rounded_size(std::size_t bytes) const {
  return round_up(std::max<std::size_t>(bytes, 1), options_.round_to);
}

bool CachingAllocator::is_small(std::size_t bytes) const { return small_pool(rounded_size(bytes)); }

// Note [One pool under a budget]
// PyTorch keeps small requests in segments of their own so that long-lived small tensors do
// not pin large segments, and it never splits a large block into slivers under 1 MiB. Both
// rules assume memory can grow. Under a hard cap they partition the budget instead: bytes
// freed in small segments cannot serve a large request (nor the reverse) until a whole
// segment empties and is given back, which eviction in score order rarely achieves, and
// slivers left unsplit are simply lost. So with a finite budget every request goes to one
// pool, blocks split down to `round_to`, and the runtime's eviction (which can always free
// what sits between two free blocks) takes the place of segregation. The arena (Note
// [Expandable arena]) is one pool too.
bool CachingAllocator::one_pool() const {
  return options_.expandable_segments ||
         (options_.one_pool_under_budget && options_.budget != SIZE_MAX);
}

bool CachingAllocator::small_pool(std::size_t rounded) const {
  return !one_pool() && rounded <= options_.small_max;
}

std::size_t CachingAllocator::segment_size_for(std::size_t rounded) const {
  if (rounded <= options_.small_max && !one_pool()) return options_.small_segment;
  if (rounded <= options_.medium_max) return options_.medium_segment;
  return round_up(rounded, options_.large_round);
}

std::size_t CachingAllocator::unreserved() const {
  return options_.budget > stats_.reserved ? options_.budget - stats_.reserved : 0;
}

void CachingAllocator::reset_peaks() {
  stats_.peak_allocated = stats_.allocated;
  stats_.peak_reserved = stats_.reserved;
  stats_.peak_active_blocks = stats_.active_blocks;
}

void CachingAllocator::set_budget(std::size_t budget) {
  options_.budget = budget;
  if (stats_.reserved <= budget) return;
  end_placement();  // its holes and arena are cached memory like any other now
  release_cached();
}

// Note [Whole segments for large tensors]
// In one pool, a request may split any free block, and best fit will cut a smaller tensor
// out of a big one's freed segment. Under a budget that is what fragments memory past repair:
// the rest of the segment can serve no request bigger than itself, and the segment can no
// longer be given back to make room for one. Large tensors come and go whole (the recorded
// U-Net's are 50-780 MB), so with `whole_large_segments` a request above `medium_max` gets a
// segment of its own that is never split, and a cached one is reused only by a request within
// `large_round` of its size; any other request that needs the room gets it by the segment's
// release (Note [Serving a request], step 3), which costs nothing on a simulated or virtual
// address space. Memory then behaves like the sum of the large tensors' (rounded) sizes, and
// fragmentation is confined to the shared segments of smaller tensors.
bool CachingAllocator::fits(bool whole, std::size_t have, std::size_t size) const {
  return have >= size && (!whole || have - size <= options_.large_round);
}

bool CachingAllocator::window_serves(const SegmentView& segment, std::size_t window_bytes,
                                     std::size_t bytes) const {
  const std::size_t size = rounded_size(bytes);
  return !segment.placed && segment.small == small_pool(size) &&
         fits(segment.whole, window_bytes, size);
}

bool CachingAllocator::release_would_serve(const void* p, std::size_t bytes) const {
  const Block* b = pools_->live_block(p);
  if (b == nullptr) return false;
  const Segment* seg = b->segment;
  if (in_placed_range(b)) return false;
  const std::size_t size = rounded_size(bytes);
  std::size_t run = b->size;
  if (b->prev != nullptr && !b->prev->allocated) run += b->prev->size;
  if (b->next != nullptr && !b->next->allocated) run += b->next->size;
  if (seg == arena_ && (b->next == nullptr || (!b->next->allocated && b->next->next == nullptr)))
    run += arena_room();
  if (window_serves(SegmentView{seg->small, seg->whole}, run, bytes)) return true;
  // The last live block of a segment: the segment goes back and a bare reservation may fit.
  return seg != arena_ && seg->live_blocks == 1 && unreserved() + seg->size >= size;
}

void CachingAllocator::set_tag(const void* p, std::uint32_t tag) {
  if (Block* b = pools_->live_block(p)) b->tag = tag;
}

namespace {

// The first free block of `set` not smaller than `size`: where a best-fit scan starts.
auto FirstNotSmaller(absl::btree_set<Block*, detail::BlockOrder>& set, std::size_t size) {
  Segment before_all;  // serial 0: orders before every reserved segment
  Block probe;
  probe.size = size;
  probe.segment = &before_all;
  return set.lower_bound(&probe);
}

// Whether `a` lies below `b`: an older segment, or lower in the same one.
bool Below(const Block* a, const Block* b) {
  return a->segment->serial != b->segment->serial ? a->segment->serial < b->segment->serial
                                                  : a->address < b->address;
}

bool Avoided(const std::vector<std::uint64_t>* avoid, const Block* b) {
  return avoid != nullptr &&
         std::find(avoid->begin(), avoid->end(), b->segment->serial) != avoid->end();
}

}  // namespace

Block* CachingAllocator::find_free(std::size_t size, const std::vector<std::uint64_t>* avoid) {
  auto& set = pools_->free_set(small_pool(size));
  for (auto it = FirstNotSmaller(set, size); it != set.end(); ++it) {
    Block* b = *it;
    // A whole segment too big for the request, or one the caller keeps out of.
    if (!fits(b->segment->whole, b->size, size) || Avoided(avoid, b) || in_placed_range(b))
      continue;
    set.erase(it);
    return b;
  }
  return nullptr;
}

// Reserves a segment for a request of `size` (already rounded), preferring the pool's usual
// segment size and falling back to the bare request when the budget has no room for more (a
// tight budget is a hard cap, so it wins over PyTorch's segment-size heuristics).
Block* CachingAllocator::reserve_segment(std::size_t size) {
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

// Counts the reservation of `bytes` at `p` as a new segment, one free block not yet in any
// pool.
Segment* CachingAllocator::add_segment(void* p, std::size_t bytes, bool small, bool whole) {
  ++stats_.segment_reserves;
  auto* seg = new Segment();
  seg->serial = next_serial_++;
  seg->address = reinterpret_cast<std::uintptr_t>(p);
  seg->size = bytes;
  seg->capacity = bytes;
  seg->small = small;
  seg->whole = whole;
  Block* b = pools_->new_block(seg);
  b->address = seg->address;
  b->size = bytes;
  seg->first = b;
  seg->last = b;
  pools_->segments.push_back(seg);
  stats_.reserved += bytes;
  stats_.peak_reserved = std::max(stats_.peak_reserved, stats_.reserved);
  stats_.segments = pools_->segments.size();
  return seg;
}

// A reservation with memory behind it: a lazily committed source (CUDA's virtual memory)
// backs it explicitly; null where the source refuses either step.
void* CachingAllocator::reserve_backed(std::size_t bytes) {
  void* p = source_->reserve(bytes);
  if (p == nullptr || !source_->lazily_committed() || source_->commit_prefix(p, bytes)) return p;
  source_->release(p, bytes);
  return nullptr;
}

// Before segments go back to a source that does not wait for the device (CUDA's unmap):
// kernels queued before their blocks were freed may still use them, so wait for the stream,
// once, where any segment is about to go.
void CachingAllocator::wait_before_release() {
  if (cuda_ == nullptr || source_->release_waits_for_device()) return;
  for (const Segment* s : pools_->segments) {
    if (s->live_blocks == 0 && s != arena_ && !placed_segment(s)) {
      CudaError::check(cuda_->stream_synchronize(stream_), "cudaStreamSynchronize");
      return;
    }
  }
}

void CachingAllocator::release_cached() {
  shrink_arena();
  auto& segs = pools_->segments;
  wait_before_release();
  // Compacts in place; a source that throws (a failing cudaFree) leaves its segment, and
  // every one not yet looked at, as they were.
  std::size_t kept = 0, i = 0;
  try {
    for (; i < segs.size(); ++i) {
      Segment* s = segs[i];
      if (s->live_blocks != 0 || s == arena_ || placed_segment(s)) {
        segs[kept++] = s;
        continue;
      }
      source_->release(reinterpret_cast<void*>(s->address), s->size);
      Block* b = s->first;
      assert(b->next == nullptr && b->size == s->size);
      pools_->free_set(s->small).erase(b);
      pools_->delete_block(b);
      ++stats_.segment_releases;
      stats_.reserved -= s->size;
      delete s;
    }
  } catch (...) {
    for (; i < segs.size(); ++i) segs[kept++] = segs[i];
    segs.resize(kept);
    stats_.segments = segs.size();
    throw;
  }
  segs.resize(kept);
  stats_.segments = segs.size();
}

Block* CachingAllocator::try_serve(std::size_t size) {
  if (Block* b = find_free(size)) return b;
  if (Block* b = grow_arena(size)) return b;
  return reserve_segment(size);
}

// Note [Expandable arena]
// With `expandable_segments`, a source whose reservations cost nothing until used (host
// memory, simulated addresses) gives the allocator one range as large as the budget, once.
// Only a prefix of it counts as reserved: a request that no free block fits grows the prefix
// at its end (by `arena_step`, or just enough where the budget has less room), extending a
// free last block if there is one; `release_cached` gives the free tail back. There are no
// segment boundaries and no separate small pool, so any two adjacent freed blocks merge,
// and eviction can free a contiguous window that ends in the unreserved room. Where the
// budget later grows past the range, ordinary segments serve what the arena cannot.
std::size_t CachingAllocator::arena_room() const {
  return std::min(arena_->capacity - arena_->size, unreserved());
}

Block* CachingAllocator::grow_arena(std::size_t size) {
  if (!options_.expandable_segments || !source_->lazily_committed()) return nullptr;
  if (arena_ == nullptr) {
    if (options_.budget == SIZE_MAX) return nullptr;
    void* p = source_->reserve(options_.budget);
    if (p == nullptr) return nullptr;
    arena_ = new Segment();
    arena_->serial = next_serial_++;
    arena_->address = reinterpret_cast<std::uintptr_t>(p);
    arena_->capacity = options_.budget;
    pools_->segments.push_back(arena_);
    stats_.segments = pools_->segments.size();
  }
  Block* tail = arena_->last;
  const bool tail_free = tail != nullptr && !tail->allocated;
  // A source that backs the range in granules (CUDA's virtual memory) grows it by whole
  // granules, within the budget: the arena's reserved size stays a multiple of them.
  const std::size_t granule = source_->commit_granularity();
  const std::size_t need = round_up(tail_free ? size - std::min(size, tail->size) : size, granule);
  const std::size_t limit = round_down(arena_room(), granule);
  if (need > limit) return nullptr;
  const std::size_t step = round_up(options_.arena_step, granule);
  const std::size_t grow = std::max(need, std::min(round_up(need, step), limit));
  if (!source_->commit_prefix(reinterpret_cast<void*>(arena_->address), arena_->size + grow)) {
    ++stats_.source_refusals;
    refused_ = grow;
    return nullptr;
  }
  if (tail_free) {
    pools_->free_large.erase(tail);
    tail->size += grow;
  } else {
    Block* b = pools_->new_block(arena_);
    b->address = arena_->address + arena_->size;
    b->size = grow;
    b->prev = tail;
    if (tail != nullptr)
      tail->next = b;
    else
      arena_->first = b;
    arena_->last = b;
    tail = b;
  }
  arena_->size += grow;
  ++stats_.segment_reserves;
  stats_.reserved += grow;
  stats_.peak_reserved = std::max(stats_.peak_reserved, stats_.reserved);
  return tail;
}

void CachingAllocator::shrink_arena() {
  if (arena_ == nullptr || arena_->last == nullptr || arena_->last->allocated) return;
  Block* tail = arena_->last;
  // Only whole granules go back; a free tail shorter than one stays reserved.
  const std::size_t granule = source_->commit_granularity();
  const std::size_t keep = arena_->size - tail->size;
  const std::size_t new_size = round_up(keep, granule);
  const std::size_t give = arena_->size - new_size;
  if (give == 0) return;
  // Unmapping does not wait for the device, as cudaFree does: kernels enqueued before the
  // tail was freed may still use it.
  if (cuda_ != nullptr)
    CudaError::check(cuda_->stream_synchronize(stream_), "cudaStreamSynchronize");
  source_->commit_prefix(reinterpret_cast<void*>(arena_->address), new_size);
  pools_->free_large.erase(tail);
  arena_->size = new_size;
  ++stats_.segment_releases;
  stats_.reserved -= give;
  if (give < tail->size) {
    tail->size -= give;
    pools_->free_large.insert(tail);
    return;
  }
  arena_->last = tail->prev;
  if (tail->prev != nullptr)
    tail->prev->next = nullptr;
  else
    arena_->first = nullptr;
  pools_->delete_block(tail);
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
//
// A source may refuse a reservation the budget has room for (cudaMalloc on a device shared
// with other processes). That is handled like a full budget, by releasing and evicting, and
// if the request still fails, the error says the device refused below the budget.
void* CachingAllocator::do_allocate(std::size_t bytes) {
  const std::size_t size = rounded_size(bytes);
  refused_ = 0;
  auto after_release = [&]() -> Block* {
    release_cached();
    if (Block* grown = grow_arena(size)) return grown;
    return reserve_segment(size);
  };
  if (stream_uses_ != nullptr) {
    if (stream_uses_->error) {
      const CudaError e = *stream_uses_->error;
      stream_uses_->error.reset();
      throw e;
    }
    if (!stream_uses_->pending.empty()) process_pending(false);
  }
  if (Block* placed = take_placed(size)) {
    mark_allocated(placed, bytes);
    ++stats_.placed_allocations;
    note_allocation(reinterpret_cast<void*>(placed->address), size);
    return reinterpret_cast<void*>(placed->address);
  }
  Block* b = try_serve(size);
  if (b == nullptr) b = reclaim_pending(size);
  if (b == nullptr && !placing_->ranges.empty()) {
    // A request the placement does not place found no room outside its regions: the
    // placement gives way (a miss) rather than make the request evict or fail.
    ++stats_.placement_misses;
    end_placement();
    b = try_serve(size);
  }
  if (b == nullptr) {
    ++stats_.retries;
    b = after_release();
  }
  while (b == nullptr) {
    if (reclaimer() == nullptr) throw_oom(size);
    ++stats_.reclaims;
    if (!reclaimer()->reclaim(size)) throw_oom(size);
    b = try_serve(size);
    if (b == nullptr) b = reclaim_pending(size);
    if (b == nullptr) b = after_release();
  }
  void* p = hand_out(b, size, bytes);
  note_allocation(p, size);
  return p;
}

// Marks free block `b` allocated for a request of `bytes` (`size` rounded), splitting off
// its tail when that is big enough to be useful to its pool.
void* CachingAllocator::hand_out(Block* b, std::size_t size, std::size_t bytes) {
  const bool small = small_pool(size);
  const std::size_t rest = b->size - size;
  if (!b->segment->whole &&
      rest >= (small || one_pool() ? options_.round_to : options_.large_split_min)) {
    pools_->free_set(small).insert(split_block(b, size));
  }
  mark_allocated(b, bytes);
  return reinterpret_cast<void*>(b->address);
}

void CachingAllocator::mark_allocated(Block* b, std::size_t bytes) {
  b->allocated = true;
  b->requested = bytes;
  ++b->segment->live_blocks;
  pools_->live.emplace(b->address, b);
  stats_.allocated += b->size;
  stats_.requested += bytes;
  stats_.peak_allocated = std::max(stats_.peak_allocated, stats_.allocated);
  ++stats_.active_blocks;
  stats_.peak_active_blocks = std::max(stats_.peak_active_blocks, stats_.active_blocks);
  ++stats_.allocations;
}

// Note [Packing pinned storages]
// A storage pinned for good (a gradient frozen before the optimizer writes a parameter, a
// constant) stays wherever it was allocated, and where that is the middle of a segment of
// transient tensors it splits the free space around it for as long as it lives: a request
// can then fail with most of the budget free, in pieces. The runtime therefore moves such
// a storage to the lowest free block that holds it, below where it is (an older segment, or
// lower in its own), so that long-lived blocks gather at the bottom of the oldest segments
// and the rest coalesces. Only free cached blocks are used: nothing is reserved or evicted.
// A block that other streams use is not moved (their uses are tracked by address).
void* CachingAllocator::allocate_below(std::size_t bytes, const void* p) {
  const Block* here = pools_->live_block(p);
  if (here == nullptr || used_by_other_streams(p)) return nullptr;
  const std::size_t size = rounded_size(bytes);
  const bool small = small_pool(size);
  if (here->segment->small != small) return nullptr;
  auto& set = pools_->free_set(small);
  Block* lowest = nullptr;
  for (auto it = FirstNotSmaller(set, size); it != set.end(); ++it) {
    Block* b = *it;
    if (!fits(b->segment->whole, b->size, size) || !Below(b, here) || in_placed_range(b)) continue;
    if (lowest == nullptr || Below(b, lowest)) lowest = b;
  }
  if (lowest == nullptr) return nullptr;
  set.erase(lowest);
  return hand_out(lowest, size, bytes);
}

std::uint64_t CachingAllocator::segment_serial(const void* p) const {
  const Block* b = pools_->live_block(p);
  return b == nullptr ? 0 : b->segment->serial;
}

bool CachingAllocator::used_by_other_streams(const void* p) const {
  return stream_uses_ != nullptr &&
         stream_uses_->by_block.contains(reinterpret_cast<std::uintptr_t>(p));
}

// Best fit among the free blocks outside the segments `avoid` names, as do_allocate would
// choose among all (Note [Compaction] in runtime/core/eviction_choice.cc).
void* CachingAllocator::allocate_outside(std::size_t bytes,
                                         const std::vector<std::uint64_t>& avoid) {
  const std::size_t size = rounded_size(bytes);
  Block* b = find_free(size, &avoid);
  return b == nullptr ? nullptr : hand_out(b, size, bytes);
}

// Whether allocate_outside would place requests of `bytes`, largest first, without
// reserving: a dry run on the free blocks' sizes.
bool CachingAllocator::places_outside(std::vector<std::size_t> bytes,
                                      const std::vector<std::uint64_t>& avoid) const {
  struct Free {
    std::size_t size;
    bool whole, small;
  };
  std::vector<Free> free;
  for (bool small : {false, true})
    for (const Block* b : pools_->free_set(small))
      if (!Avoided(&avoid, b) && !in_placed_range(b))
        free.push_back({b->size, b->segment->whole, small});
  std::sort(bytes.begin(), bytes.end(), std::greater<>());
  for (std::size_t request : bytes) {
    const std::size_t size = rounded_size(request);
    const bool small = small_pool(size);
    Free* best = nullptr;
    for (Free& f : free)
      if (f.small == small && fits(f.whole, f.size, size) &&
          (best == nullptr || f.size < best->size))
        best = &f;
    if (best == nullptr) return false;
    best->size = best->whole ? 0 : best->size - size;
  }
  return true;
}

void CachingAllocator::do_deallocate(void* p, std::size_t /*bytes*/) {
  auto it = pools_->live.find(reinterpret_cast<std::uintptr_t>(p));
  assert(it != pools_->live.end() && "deallocate of a pointer this allocator did not give");
  if (it == pools_->live.end()) return;
  Block* b = it->second;
  pools_->live.erase(it);
  if (placing_->tracing) {
    if (auto t = placing_->traced.find(b->address); t != placing_->traced.end()) {
      placing_->trace.allocations[t->second].end = placing_->clock++;
      placing_->traced.erase(t);
    }
  }
  if (stream_uses_ != nullptr && !stream_uses_->by_block.empty()) {
    auto uses = stream_uses_->by_block.find(b->address);
    if (uses != stream_uses_->by_block.end()) {
      detail::PendingFree pending{b, {}};
      try {
        for (CudaStream s : uses->second) {
          pending.events.push_back(take_event());
          CudaError::check(cuda_->event_record(pending.events.back(), s), "cudaEventRecord");
        }
      } catch (const CudaError& e) {
        // A free cannot fail; the block stays pending and the next allocation reports it.
        if (!stream_uses_->error) stream_uses_->error = e;
      }
      stream_uses_->by_block.erase(uses);
      b->tag = kNoTag;  // no tensor's any more: the runtime may not evict it
      stream_uses_->pending.push_back(std::move(pending));
      ++stats_.deferred_frees;
      stats_.pending_frees = stream_uses_->pending.size();
      return;
    }
  }
  finish_free(b);
}

// The block's memory is free for any later work on the allocator's stream.
void CachingAllocator::finish_free(Block* b) {
  stats_.allocated -= b->size;
  stats_.requested -= b->requested;
  --stats_.active_blocks;
  --b->segment->live_blocks;
  free_block(b);
}

// Merges a freed block with free neighbours of its segment and puts it back in its pool.
void CachingAllocator::free_block(Block* b) {
  auto& set = pools_->free_set(b->segment->small);
  b->allocated = false;
  b->requested = 0;
  b->tag = kNoTag;
  if (Block* n = b->next; n != nullptr && !n->allocated) {
    set.erase(n);
    b->size += n->size;
    b->next = n->next;
    if (n->next != nullptr)
      n->next->prev = b;
    else
      b->segment->last = b;
    pools_->delete_block(n);
  }
  if (Block* p = b->prev; p != nullptr && !p->allocated) {
    set.erase(p);
    p->size += b->size;
    p->next = b->next;
    if (b->next != nullptr)
      b->next->prev = p;
    else
      p->segment->last = p;
    pools_->delete_block(b);
    b = p;
  }
  set.insert(b);
}

void CachingAllocator::start_trace() {
  placing_->tracing = true;
  placing_->trace = AllocationTrace();
  placing_->traced.clear();
  placing_->clock = 0;
}

AllocationTrace CachingAllocator::take_trace() {
  placing_->tracing = false;
  placing_->traced.clear();
  return std::exchange(placing_->trace, AllocationTrace());
}

void CachingAllocator::note_allocation(const void* p, std::size_t size) {
  detail::Placing& pl = *placing_;
  if (!pl.tracing || pl.paused > 0) return;
  pl.traced[reinterpret_cast<std::uintptr_t>(p)] = pl.trace.allocations.size();
  pl.trace.allocations.push_back({.bytes = size, .start = pl.clock++});
}

void CachingAllocator::moved(const void* from, const void* to) {
  detail::Placing& pl = *placing_;
  if (!pl.tracing) return;
  auto t = pl.traced.find(reinterpret_cast<std::uintptr_t>(from));
  if (t == pl.traced.end()) return;
  const std::size_t index = t->second;
  pl.traced.erase(t);
  pl.traced[reinterpret_cast<std::uintptr_t>(to)] = index;
}

bool CachingAllocator::tracing_or_placing() const {
  return placing_->tracing || placing_->arena_segment != nullptr || !placing_->ranges.empty();
}

void CachingAllocator::pause_placement(bool paused) { placing_->paused += paused ? 1 : -1; }

std::optional<CachingAllocator::PlacementOutcome> CachingAllocator::last_placement() const {
  return placing_->outcome;
}

Segment* CachingAllocator::placed_arena() const { return placing_->arena_segment; }

bool CachingAllocator::placed_segment(const Segment* s) const {
  for (const detail::Placing::Range& r : placing_->ranges)
    if (r.segment == s) return true;
  return false;
}

bool CachingAllocator::in_placed_range(const Block* b) const {
  for (const detail::Placing::Range& r : placing_->ranges)
    if (b->segment == r.segment && b->address < r.address + r.bytes &&
        r.address < b->address + b->size)
      return true;
  return false;
}

// The fixed regions of Note [Placed allocations]: the largest free blocks, of 1 MiB and more,
// of segments that hold live blocks (beside the constants), in address order.
constexpr std::size_t kMinRegion = std::size_t{1} << 20;
constexpr std::size_t kMaxRegions = 16;

bool CachingAllocator::begin_placement(std::shared_ptr<const Placement> placement) {
  end_placement();
  detail::Placing& pl = *placing_;
  pl.outcome.reset();
  if (placement == nullptr || placement->trace.allocations.empty() || options_.expandable_segments)
    return false;
  std::vector<Block*> holes;
  for (Segment* s : pools_->segments) {
    if (s->live_blocks == 0 || s == arena_ || s->whole) continue;
    for (Block* b = s->first; b != nullptr; b = b->next)
      if (!b->allocated && b->size >= kMinRegion) holes.push_back(b);
  }
  std::stable_sort(holes.begin(), holes.end(),
                   [](const Block* a, const Block* b) { return a->size > b->size; });
  if (holes.size() > kMaxRegions) holes.resize(kMaxRegions);
  std::sort(holes.begin(), holes.end(), Below);
  std::vector<std::size_t> sizes;
  for (const Block* b : holes) sizes.push_back(b->size);
  // The layout for these regions: the given one where it was made for them, else one made
  // now (once per placement and regions: the regions are the same from step to step).
  std::shared_ptr<const Placement> layout;
  if (placement->regions == sizes) layout = placement;
  for (const auto& l : pl.layouts)
    if (layout == nullptr && l.given.lock() == placement && l.layout->regions == sizes)
      layout = l.layout;
  if (layout == nullptr) {
    layout = std::make_shared<const Placement>(place_allocations(placement->trace, sizes));
    pl.layouts.push_back({placement, layout});
    if (pl.layouts.size() > 4) pl.layouts.erase(pl.layouts.begin());
  }
  const std::size_t granule = std::max(source_->commit_granularity(), options_.round_to);
  const std::size_t need = layout->arena_bytes == 0 ? 0 : round_up(layout->arena_bytes, granule);
  // The last step's arena, if it is empty and large enough; else a new one, after every
  // cached segment (the old arena among them) has gone back.
  // Not where the budget has since been lowered below what is reserved: the arena goes back.
  Segment* arena = nullptr;
  for (Segment* s : pools_->segments)
    if (need > 0 && s->serial == pl.last_arena && s->live_blocks == 0 && s->size >= need &&
        s != arena_ && stats_.reserved <= options_.budget)
      arena = s;
  if (arena == nullptr && need > 0) release_cached();
  pl.outcome =
      PlacementOutcome{.arena_bytes = need, .room = arena != nullptr ? arena->size : unreserved()};
  if (arena == nullptr && need > 0) {
    if (unreserved() < need) {
      ++stats_.placement_misses;
      return false;
    }
    void* p = reserve_backed(need);
    if (p == nullptr) {
      ++stats_.source_refusals;
      ++stats_.placement_misses;
      return false;
    }
    arena = add_segment(p, need, /*small=*/false, /*whole=*/false);
    pools_->free_set(false).insert(arena->first);
  }
  pl.layout = std::move(layout);
  pl.ranges.clear();
  for (Block* b : holes) pl.ranges.push_back({b->segment, b->address, b->size});
  if (arena != nullptr) {
    pl.ranges.push_back({arena, arena->address, arena->size});
    pl.last_arena = arena->serial;
    pl.arena_segment = arena;
  }
  pl.next = 0;
  pl.following = true;
  return true;
}

void CachingAllocator::end_placement() {
  detail::Placing& pl = *placing_;
  pl.layout.reset();
  pl.ranges.clear();
  pl.following = false;
  pl.arena_segment = nullptr;
}

// The free block at the next request's place, cut to its size; null where the request is
// not placed (Note [Placed allocations]).
Block* CachingAllocator::take_placed(std::size_t size) {
  detail::Placing& pl = *placing_;
  if (!pl.following || pl.paused > 0) return nullptr;
  const Placement& p = *pl.layout;
  if (pl.next >= p.trace.allocations.size()) return nullptr;  // past the sequence: as usual
  const std::size_t i = pl.next++;
  const bool same = p.trace.allocations[i].bytes == size;
  if (same && p.region[i] == Placement::kUnplaced) return nullptr;
  Block* b = nullptr;
  std::uintptr_t at = 0;
  if (same && p.region[i] < pl.ranges.size()) {
    const detail::Placing::Range& r = pl.ranges[p.region[i]];
    at = r.address + p.offsets[i];
    for (b = r.segment->first; b != nullptr && b->address + b->size <= at; b = b->next) {
    }
    if (b != nullptr && (b->allocated || b->address > at || b->address + b->size < at + size))
      b = nullptr;
  }
  if (b == nullptr) {  // a miss: the regions open for the rest of the step
    ++stats_.placement_misses;
    end_placement();
    return nullptr;
  }
  auto& set = pools_->free_set(b->segment->small);
  set.erase(b);
  if (b->address < at) {
    Block* rest = split_block(b, at - b->address);
    set.insert(b);
    b = rest;
  }
  if (b->size > size) set.insert(split_block(b, size));
  return b;
}

// Cuts block `b` after its first `keep` bytes; returns the new block that follows it (not yet
// in any pool).
Block* CachingAllocator::split_block(Block* b, std::size_t keep) {
  Block* tail = pools_->new_block(b->segment);
  tail->address = b->address + keep;
  tail->size = b->size - keep;
  tail->prev = b;
  tail->next = b->next;
  if (b->next != nullptr)
    b->next->prev = tail;
  else
    b->segment->last = tail;
  b->next = tail;
  b->size = keep;
  return tail;
}

std::size_t CachingAllocator::largest_free_block() const {
  std::size_t best = 0;
  if (!pools_->free_small.empty()) best = (*pools_->free_small.rbegin())->size;
  if (!pools_->free_large.empty()) best = std::max(best, (*pools_->free_large.rbegin())->size);
  return best;
}

const std::vector<detail::Segment*>& CachingAllocator::segment_list() const {
  return pools_->segments;
}

void CachingAllocator::layout(BlockLayout& out) const {
  out.tags.clear();
  out.sizes.clear();
  out.segments.clear();
  const detail::AllocatorBlocks source(*this);
  for (std::size_t k = 0; k < source.segments(); ++k) {
    const auto info = source.segment(k);
    out.segments.push_back({out.tags.size(), out.tags.size() + info.blocks, info.bytes, info.view});
    for (auto c = source.blocks(k); !c.done(); c.next()) {
      out.tags.push_back(c.tag());
      out.sizes.push_back(c.size());
    }
  }
}

void CachingAllocator::throw_oom(std::size_t size) {
  ++stats_.ooms;
  OutOfMemoryInfo info;
  info.requested = size;
  info.budget = options_.budget;
  info.reserved = stats_.reserved;
  info.allocated = stats_.allocated;
  info.largest_free = largest_free_block();
  info.source_refused = refused_;
  if (refused_ != 0) info.source = source_->name();
  throw OutOfMemoryError(std::move(info));
}

}  // namespace remat
