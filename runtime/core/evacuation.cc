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
  std::vector<std::uint32_t> blocks;  // their tags
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
        e.blocks.push_back(tag);
      else
        movable = false;  // scratch, a workspace, or a block another stream still reads
    }
    if (movable && e.free_bytes > 0 && !e.blocks.empty()) found.push_back(std::move(e));
  }
  std::stable_sort(found.begin(), found.end(),
                   [](const auto& a, const auto& b) { return a.free_bytes > b.free_bytes; });
  return found;
}

// The movable blocks of segment k after its last block that cannot move, and the free bytes
// between them (holes a slide would join; the free tail after the last is not counted).
template <typename Movable>
EvacuableSegment movable_suffix(const AllocatorBlocks& blocks, std::size_t k,
                                Movable movable_block) {
  EvacuableSegment suffix;
  std::size_t free_run = 0;
  for (auto c = blocks.blocks(k); !c.done(); c.next()) {
    const std::uint32_t tag = c.tag();
    if (tag == BlockLayout::kFree) {
      free_run += c.size();
    } else if (movable_block(tag)) {
      if (!suffix.blocks.empty() || free_run > 0) {
        suffix.free_bytes += free_run;
        suffix.blocks.push_back(tag);
      }
      free_run = 0;
    } else {
      suffix = {};  // a barrier: what is before it stays
      free_run = 0;
    }
  }
  return suffix;
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
    evacuate_segment(e.blocks);
}

// Segments whose every live block is a resident storage that nothing but the runtime's
// stream uses, with free bytes beside them; the ones with the most free bytes first. Not
// while a kernel runs (it may hold pointers), a trace is recorded or a placement followed,
// and not where the budget would not hold the request even unfragmented: then the bytes do
// not exist, and the error should say so.
bool RuntimeImpl::evacuate(std::size_t bytes) {
  if (caching == nullptr || move_refusal() != nullptr ||
      AllocatorHooks::tracing_or_placing(*caching))
    return false;
  int& evacuations = evacuations_.in(request_);
  if (evacuations >= kMaxCompactionsPerRequest) return false;
  const std::size_t need = caching->rounded_size(bytes);
  if (caching->stats().allocated + need > caching->budget()) return false;
  if (options.allocator.expandable_segments) {
    ++evacuations;
    return slide_down();
  }
  const std::vector<EvacuableSegment> found =
      evacuable_segments(*caching, [this](std::uint32_t tag) { return movable_block(tag); });
  bool moved = false;
  ++evacuations;
  for (const EvacuableSegment& e : found) {
    evacuate_segment(e.blocks);
    moved = true;
    if (AllocatorHooks::unreserved(*caching) >= need || caching->largest_free_block() >= need)
      break;
  }
  return moved;
}

// Note [Sliding the arena down]
// The expandable arena is one segment that never empties, so evacuation's way (give a
// fragmented segment back, reserve its blocks again back to back) has nothing to give back.
// Its holes are joined by a slide instead: the movable blocks after the segment's last block
// that cannot move go to the host and their blocks are freed, which joins every hole among
// them with the free tail and the room the arena may still grow into; then they are taken
// again in address order, from the best-fitting free blocks, which packs them from the
// lowest hole up and leaves the free bytes in one piece at the end. The segment whose slide
// joins the most free bytes is slid.
bool RuntimeImpl::slide_down() {
  AllocatorBlocks blocks(*caching);
  EvacuableSegment best;
  for (std::size_t k = 0; k < blocks.segments(); ++k) {
    if (blocks.segment(k).view.placed) continue;
    EvacuableSegment suffix =
        movable_suffix(blocks, k, [this](std::uint32_t tag) { return movable_block(tag); });
    if (suffix.free_bytes > best.free_bytes) best = std::move(suffix);
  }
  if (best.blocks.empty()) return false;
  std::vector<std::vector<unsigned char>> staged = free_to_host(best.blocks);
  for (std::size_t i = 0; i < best.blocks.size(); ++i) {
    const std::uint32_t tag = best.blocks[i];
    void* to = AllocatorHooks::allocate_outside(*caching, movable_bytes(tag), AvoidedMemory{});
    if (to == nullptr)  // the freed blocks held them: an allocator that cannot is broken
      throw std::logic_error("remat: sliding the arena down lost the room it had freed");
    place_evacuated(tag, to, staged[i]);
  }
  ++stats.evacuations;
  return true;
}

// Copies the storages' bytes to the host, frees their blocks (and those of the prepared op's
// scratch, which holds no bytes yet), gives the emptied segment back and reserves one segment
// holding them back to back, then copies the bytes in.
void RuntimeImpl::evacuate_segment(const std::vector<std::uint32_t>& moving) {
  std::vector<std::vector<unsigned char>> staged = free_to_host(moving);
  std::vector<std::size_t> sizes;
  for (std::uint32_t tag : moving) sizes.push_back(movable_bytes(tag));
  caching->release_cached();
  const std::vector<void*> to = AllocatorHooks::allocate_packed(*caching, sizes);
  if (to.size() != moving.size()) {
    // The source refused memory the segment it just took back had held (a device shared
    // with another process that took it in between). The bytes are on the host only.
    throw std::runtime_error(
        "remat: the memory source refused to give back a segment the runtime had just "
        "released while evacuating it; the tensors it held are lost");
  }
  for (std::size_t i = 0; i < moving.size(); ++i) place_evacuated(moving[i], to[i], staged[i]);
  ++stats.evacuations;
}

// The bytes of the storages among `moving` on the host (the scratch among them holds none
// yet), and every block of them freed.
std::vector<std::vector<unsigned char>> RuntimeImpl::free_to_host(
    const std::vector<std::uint32_t>& moving) {
  std::vector<std::vector<unsigned char>> staged(moving.size());
  for (std::size_t i = 0; i < moving.size(); ++i) {
    if (!is_storage_tag(moving[i])) {
      memory->deallocate(movable_ptr(moving[i]), movable_bytes(moving[i]));
      continue;
    }
    host_.order_compute_after(moving[i]);  // a copy in flight touches the old block
    StorageRec& r = storages[moving[i]];
    if (runs_kernels) {
      staged[i].resize(r.bytes);
      copy_from_storage(staged[i].data(), r.ptr, r.bytes);
    }
    memory->deallocate(r.ptr, r.bytes);
    r.ptr = nullptr;
  }
  return staged;
}

// Block `tag`, freed by free_to_host, is at `to` now, with its staged bytes.
void RuntimeImpl::place_evacuated(std::uint32_t tag, void* to,
                                  const std::vector<unsigned char>& staged) {
  if (!is_storage_tag(tag)) {
    place_op_scratch(tag - kFirstScratchTag, to);
    return;
  }
  StorageRec& r = storages[tag];
  r.ptr = to;
  AllocatorHooks::set_tag(*caching, to, tag);
  if (runs_kernels) copy_to_storage(r.ptr, staged.data(), r.bytes);
  stats.evacuation_bytes += r.bytes;
}

}  // namespace remat::detail
