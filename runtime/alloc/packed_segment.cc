// One segment reserved for blocks placed back to back: what the runtime's evacuation of a
// fragmented segment moves its blocks into.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "runtime/alloc/detail/allocator_core.h"

namespace remat::detail {

// Note [Evacuating segments]
// Compaction (runtime/core/eviction_choice.cc) moves blocks into free blocks of other
// segments. Under a tight budget that is often not enough: every segment holds pinned or
// locked blocks with a crumb of free space beside them, the crumbs add up to more than the
// request, yet none is large enough and no other segment has room for what would have to
// move. The runtime then evacuates a segment: it copies the segment's blocks out (to the
// host), frees them, gives the now empty segment back, and asks for them again here, as
// one new segment of exactly their sizes. That segment fits where the old one was, since
// it is no larger, and the crumbs the old one held become unreserved budget that a
// request can reserve. The blocks come in the given order, the first at the segment's start.
std::vector<void*> AllocatorCore::allocate_packed(const std::vector<std::size_t>& bytes) {
  std::vector<std::size_t> sizes;
  std::size_t total = 0;
  bool small = !bytes.empty();
  for (std::size_t b : bytes) {
    sizes.push_back(rounded_size(b));
    total += sizes.back();
    small = small && small_pool(sizes.back());
  }
  if (total == 0) return {};
  const std::size_t granule = source_->commit_granularity();
  const std::size_t want = round_up(total, granule);
  if (want > unreserved()) return {};
  void* p = reserve_backed(want);
  if (p == nullptr) {
    ++stats_.source_refusals;
    return {};
  }
  Segment* segment = add_segment(p, want, small, /*whole=*/false);
  std::vector<void*> out;
  Block* b = segment->first;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    Block* rest = b->size > sizes[i] ? pool_.split(b, sizes[i]) : nullptr;
    mark_allocated(b, bytes[i]);
    out.push_back(reinterpret_cast<void*>(b->address));
    b = rest;
  }
  if (b != nullptr) pool_.insert_free(b);
  return out;
}

}  // namespace remat::detail
