// The caching allocator's first part: segments cut into blocks, the free blocks of each pool
// in best-fit order, and the live blocks by address. It knows nothing of budgets, sources or
// streams; the allocator core (allocator_core.h) decides what to reserve and hands out what
// this pool finds. Internal to the runtime.
//
//   detail::BestFitPool pool;
//   detail::Segment* s = pool.add_segment(address, 1 << 20, /*small=*/false, /*whole=*/false);
//   pool.insert_free(s->first);
//   detail::Block* b = pool.take_best_fit(4096, /*small=*/false, [](const detail::Block*) {
//     return true;
//   });
//   pool.insert_free(pool.split(b, 4096));  // the rest stays free
//   pool.mark_live(b, 4000);
//   pool.coalesce(pool.take_live(address));  // back to one free block of 1 MiB
#ifndef REMAT_RUNTIME_ALLOC_DETAIL_BEST_FIT_POOL_H_
#define REMAT_RUNTIME_ALLOC_DETAIL_BEST_FIT_POOL_H_

#include <absl/container/btree_set.h>
#include <absl/container/flat_hash_map.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "runtime/alloc/detail/blocks.h"

namespace remat::detail {

// Note [Blocks and segments]
// A segment is one reservation from the SegmentSource. It is cut into blocks that tile it
// exactly, linked in address order (prev/next) so that a freed block can merge with free
// neighbours in O(1). Free blocks also sit in their pool's ordered set, keyed by (size,
// segment, address): the first block not smaller than a request is the best fit, and among
// equals the oldest segment and in it the lowest address wins, which keeps allocations packed
// towards the start of segments. Segments are ordered by when they were reserved, not by
// where: the source's addresses (malloc's, on the host) differ from run to run, and a choice
// between equal blocks that followed them would make eviction, and so the whole run's cost,
// differ too.
struct BlockOrder {
  bool operator()(const Block* a, const Block* b) const {
    if (a->size != b->size) return a->size < b->size;
    if (a->segment->serial != b->segment->serial) return a->segment->serial < b->segment->serial;
    return a->address < b->address;
  }
};

// Whether `a` lies below `b`: an older segment, or lower in the same one.
inline bool lies_below(const Block* a, const Block* b) {
  return a->segment->serial != b->segment->serial ? a->segment->serial < b->segment->serial
                                                  : a->address < b->address;
}

class BestFitPool {
 public:
  using FreeSet = absl::btree_set<Block*, BlockOrder>;

  BestFitPool() = default;
  BestFitPool(const BestFitPool&) = delete;
  BestFitPool& operator=(const BestFitPool&) = delete;
  ~BestFitPool();

  // Segments, in the order they were reserved.
  const std::vector<Segment*>& segments() const { return segments_; }
  // A segment of `bytes` at `address` holding one block that spans it, free but in no free
  // set yet (the caller hands it out or inserts it).
  Segment* add_segment(std::uintptr_t address, std::size_t bytes, bool small, bool whole);
  // A range of `capacity` bytes at `address` with nothing mapped: no blocks, size 0 (the
  // expandable arena, which grows it).
  Segment* add_range(std::uintptr_t address, std::size_t capacity);
  // Removes every segment for which `drop(segment)` holds (it must hold one free block and
  // no live ones), calling `release(segment)` first. Where `release` throws, that segment and
  // every one not yet looked at stay, and the exception goes on.
  template <typename Drop, typename Release>
  void remove_segments(Drop drop, Release release);

  // Free blocks.
  FreeSet& free_set(bool small) { return small ? free_small_ : free_large_; }
  const FreeSet& free_set(bool small) const { return small ? free_small_ : free_large_; }
  void insert_free(Block* b) { free_set(b->segment->small).insert(b); }
  // Erases by position: erasing by key would search the set twice.
  void erase_free(Block* b) {
    FreeSet& set = free_set(b->segment->small);
    set.erase(set.find(b));
  }
  // The first free block of the pool not smaller than `size`: where a best-fit scan starts.
  FreeSet::iterator first_not_smaller(bool small, std::size_t size);
  // The smallest free block of the pool of at least `size` that `accept` takes, out of its
  // set; null where there is none.
  template <typename Accept>
  Block* take_best_fit(std::size_t size, bool small, Accept accept) {
    FreeSet& set = free_set(small);
    for (auto it = first_not_smaller(small, size); it != set.end(); ++it) {
      if (!accept(static_cast<const Block*>(*it))) continue;
      Block* b = *it;
      set.erase(it);
      return b;
    }
    return nullptr;
  }
  std::size_t largest_free() const;

  // Cuts block `b` after its first `keep` bytes; returns the new block that follows it, free
  // and in no set.
  Block* split(Block* b, std::size_t keep);
  // Block `b`, no longer live, merged with its free neighbours and put in its free set;
  // returns the merged block.
  Block* coalesce(Block* b);
  // A block of `segment`, not yet linked into it; and one unlinked, for reuse.
  Block* new_block(Segment* segment);
  void delete_block(Block* b);

  // Live blocks.
  Block* live_block(const void* p) const {
    auto it = live_.find(reinterpret_cast<std::uintptr_t>(p));
    return it == live_.end() ? nullptr : it->second;
  }
  void mark_live(Block* b, std::size_t requested) {
    b->allocated = true;
    b->requested = requested;
    ++b->segment->live_blocks;
    live_.emplace(b->address, b);
  }
  // The live block at `p`, no longer found by address (still counted live in its segment
  // until `coalesce`); null where `p` is none.
  Block* take_live(const void* p) {
    auto it = live_.find(reinterpret_cast<std::uintptr_t>(p));
    if (it == live_.end()) return nullptr;
    Block* b = it->second;
    live_.erase(it);
    return b;
  }

 private:
  void delete_segment(Segment* s);

  FreeSet free_small_;
  FreeSet free_large_;
  absl::flat_hash_map<std::uintptr_t, Block*> live_;
  std::vector<Segment*> segments_;
  std::vector<Block*> spare_blocks_;
  std::uint64_t next_serial_ = 1;  // of the next segment
};

template <typename Drop, typename Release>
void BestFitPool::remove_segments(Drop drop, Release release) {
  std::size_t kept = 0, i = 0;
  try {
    for (; i < segments_.size(); ++i) {
      Segment* s = segments_[i];
      if (!drop(static_cast<const Segment*>(s))) {
        segments_[kept++] = s;
        continue;
      }
      release(static_cast<const Segment*>(s));
      delete_segment(s);
    }
  } catch (...) {
    for (; i < segments_.size(); ++i) segments_[kept++] = segments_[i];
    segments_.resize(kept);
    throw;
  }
  segments_.resize(kept);
}

}  // namespace remat::detail

#endif  // REMAT_RUNTIME_ALLOC_DETAIL_BEST_FIT_POOL_H_
