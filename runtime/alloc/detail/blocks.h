// The caching allocator's blocks and segments (Note [Blocks and segments] in
// best_fit_pool.h), and the views of them the runtime's window search reads. Internal to the
// runtime.
#ifndef REMAT_RUNTIME_ALLOC_DETAIL_BLOCKS_H_
#define REMAT_RUNTIME_ALLOC_DETAIL_BLOCKS_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace remat::detail {

inline constexpr std::uint32_t kNoTag = UINT32_MAX;  // a live block its owner did not label

// Tags at and above kFirstScratchTag (and below BlockLayout::kFree) are no storage's: the
// runtime gives them to the scratch blocks of an op it is preparing to launch, the k-th
// block kFirstScratchTag + k, so that making room for the op's other memory may move them
// (Note [Scratch moves until its kernel launches] in runtime/core/op_scratch.cc).
inline constexpr std::uint32_t kScratchTags = 64;
inline constexpr std::uint32_t kFirstScratchTag = UINT32_MAX - 1 - kScratchTags;
inline bool is_storage_tag(std::uint32_t tag) { return tag < kFirstScratchTag; }

// `n` rounded up to a multiple of `to`: block sizes, granules.
inline std::size_t round_up(std::size_t n, std::size_t to) { return (n + to - 1) / to * to; }

// What a caller choosing an address window needs to know of a segment.
struct SegmentView {
  bool small;  // belongs to the small pool
  bool whole;  // holds one block that is never split (Note [Whole segments for large tensors])
  bool placed = false;  // a placement's arena, closed to other requests (Note [Placed
                        // allocations])
};

// Every segment's blocks in address order, flattened into arrays, for tests that look at the
// allocator by address (AllocatorHooks::layout). `kFree` is also the tag the runtime's window
// search gives a free block as it walks the lists itself.
struct BlockLayout {
  static constexpr std::uint32_t kFree = UINT32_MAX - 1;  // the tag of a free block
  struct Segment {
    std::size_t begin = 0, end = 0;  // its blocks' positions in `tags` and `sizes`
    std::size_t bytes = 0;
    SegmentView view;
  };
  std::vector<std::uint32_t> tags;  // the owner's tag (AllocatorHooks::set_tag), kNoTag where
                                    // unset, kFree where free
  std::vector<std::size_t> sizes;
  std::vector<Segment> segments;
};

struct Segment;
struct Block {
  std::uintptr_t address = 0;
  std::size_t size = 0;
  std::size_t requested = 0;
  Segment* segment = nullptr;
  Block* prev = nullptr;
  Block* next = nullptr;
  std::uint32_t tag = kNoTag;
  bool allocated = false;
};

struct Segment {
  std::uint64_t serial = 0;  // order of reservation (Note [Blocks and segments])
  std::uintptr_t address = 0;
  std::size_t size = 0;      // reserved (counted) bytes; for the arena, its mapped prefix
  std::size_t capacity = 0;  // the arena's whole range; equal to size otherwise
  bool small = false;
  bool whole = false;      // one block, never split (Note [Whole segments for large tensors])
  Block* first = nullptr;  // null while an arena maps nothing
  Block* last = nullptr;
  std::size_t live_blocks = 0;
  std::size_t blocks = 0;  // free ones included
};

// What a compaction keeps the blocks it moves out of (Note [Compaction] in
// runtime/core/eviction_choice.cc): the segments it empties, by serial, and the address
// window [window_begin, window_end) it clears.
struct AvoidedMemory {
  std::vector<std::uint64_t> segments;
  std::uintptr_t window_begin = 0, window_end = 0;
  bool avoids(std::uint64_t segment, std::uintptr_t address, std::size_t size) const {
    for (std::uint64_t s : segments)
      if (s == segment) return true;
    return address < window_end && address + size > window_begin;
  }
};

}  // namespace remat::detail

#endif  // REMAT_RUNTIME_ALLOC_DETAIL_BLOCKS_H_
