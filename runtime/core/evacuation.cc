// Evacuating fragmented segments through the host, when nothing is left to evict and
// compaction has nowhere to move blocks (Note [Evacuating segments] in
// runtime/alloc/packed_segment.cc).
#include <algorithm>
#include <cstddef>
#include <stdexcept>
#include <vector>

#include "runtime/alloc/detail/allocator_hooks.h"
#include "runtime/alloc/detail/blocks.h"
#include "runtime/core/runtime_impl.h"

namespace remat::detail {
namespace {

// A segment an evacuation may empty: the storages in it, and the free bytes it would turn
// into unreserved budget.
struct EvacuableSegment {
  std::vector<Id> storages;
  std::size_t free_bytes = 0;
};

// Segments whose every live block is one the runtime may move, with free bytes beside them
// and not placed; the ones with the most free bytes first.
template <typename Movable>
std::vector<EvacuableSegment> evacuable_segments(CachingAllocator& caching, Movable movable_block) {
  std::vector<EvacuableSegment> found;
  AllocatorBlocks blocks(caching);
  for (std::size_t k = 0; k < blocks.segments(); ++k) {
    if (blocks.segment(k).view.placed) continue;
    EvacuableSegment e;
    bool movable = true;
    for (auto c = blocks.blocks(k); movable && !c.done(); c.next()) {
      const std::uint32_t tag = c.tag();
      if (tag == BlockLayout::kFree)
        e.free_bytes += c.size();
      else if (movable_block(tag))
        e.storages.push_back(tag);
      else
        movable = false;  // scratch, a workspace, or a block another stream still reads
    }
    if (movable && e.free_bytes > 0 && !e.storages.empty()) found.push_back(std::move(e));
  }
  std::stable_sort(found.begin(), found.end(),
                   [](const auto& a, const auto& b) { return a.free_bytes > b.free_bytes; });
  return found;
}

}  // namespace

// Note [A placed step starts packed]
// A placement lays a step's requests out in the holes beside live blocks and in one arena
// of what the budget has left (Note [Placed allocations]). What the step starts with (a
// program's parameters and optimizer state, made one by one, and the gradients the last step
// pinned) lies in segments with holes beside it, and holes under 1 MiB, or ones the layout
// cannot fill, are lost to it: on the small GPT of bench/peer at 32 MiB the arena lacked 0.1
// MiB. So a step that begins with a placement first evacuates every segment whose live blocks
// can all move (Note [Evacuating segments]): each becomes one segment of exactly its blocks,
// and the holes become budget the arena can have. Segments already packed have no holes and
// are left alone, so a steady loop moves only what changed since its last step.
void RuntimeImpl::pack_for_placement() {
  if (caching == nullptr || move_refusal() != nullptr || options.allocator.expandable_segments)
    return;
  for (const EvacuableSegment& e :
       evacuable_segments(*caching, [this](std::uint32_t tag) { return movable_block(tag); }))
    evacuate_segment(e.storages);
}

// Segments whose every live block is a resident storage that nothing but the runtime's
// stream uses, with free bytes beside them; the ones with the most free bytes first. Not
// while a kernel runs (it may hold pointers), a trace is recorded or a placement followed,
// and not where the budget would not hold the request even unfragmented: then the bytes do
// not exist, and the error should say so.
bool RuntimeImpl::evacuate(std::size_t bytes) {
  if (caching == nullptr || move_refusal() != nullptr || options.allocator.expandable_segments ||
      AllocatorHooks::tracing_or_placing(*caching))
    return false;
  int& evacuations = evacuations_.in(request_);
  if (evacuations >= kMaxCompactionsPerRequest) return false;
  const std::size_t need = caching->rounded_size(bytes);
  if (caching->stats().allocated + need > caching->budget()) return false;
  const std::vector<EvacuableSegment> found =
      evacuable_segments(*caching, [this](std::uint32_t tag) { return movable_block(tag); });
  bool moved = false;
  ++evacuations;
  for (const EvacuableSegment& e : found) {
    evacuate_segment(e.storages);
    moved = true;
    if (AllocatorHooks::unreserved(*caching) >= need || caching->largest_free_block() >= need)
      break;
  }
  return moved;
}

// Copies the storages' bytes to the host, frees their blocks, gives the emptied segment back
// and reserves one segment holding them back to back, then copies the bytes in.
void RuntimeImpl::evacuate_segment(const std::vector<Id>& moving) {
  std::vector<std::vector<unsigned char>> staged(moving.size());
  std::vector<std::size_t> sizes;
  for (std::size_t i = 0; i < moving.size(); ++i) {
    host_.order_compute_after(moving[i]);  // a copy in flight touches the old block
    StorageRec& r = storages[moving[i]];
    sizes.push_back(r.bytes);
    if (runs_kernels) {
      staged[i].resize(r.bytes);
      copy_from_storage(staged[i].data(), r.ptr, r.bytes);
    }
    memory->deallocate(r.ptr, r.bytes);
    r.ptr = nullptr;
  }
  caching->release_cached();
  const std::vector<void*> to = AllocatorHooks::allocate_packed(*caching, sizes);
  if (to.size() != moving.size()) {
    // The source refused memory the segment it just took back had held (a device shared
    // with another process that took it in between). The bytes are on the host only.
    throw std::runtime_error(
        "remat: the memory source refused to give back a segment the runtime had just "
        "released while evacuating it; the tensors it held are lost");
  }
  for (std::size_t i = 0; i < moving.size(); ++i) {
    StorageRec& r = storages[moving[i]];
    r.ptr = to[i];
    AllocatorHooks::set_tag(*caching, to[i], moving[i]);
    if (runs_kernels) copy_to_storage(r.ptr, staged[i].data(), r.bytes);
    stats.evacuation_bytes += r.bytes;
  }
  ++stats.evacuations;
}

}  // namespace remat::detail
