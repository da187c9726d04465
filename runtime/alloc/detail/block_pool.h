// The caching allocator's free-block sets, live-block map and segment list (Note [Blocks and
// segments]), shared by the allocator's source files. Internal to the runtime.
#ifndef REMAT_RUNTIME_ALLOC_DETAIL_BLOCK_POOL_H_
#define REMAT_RUNTIME_ALLOC_DETAIL_BLOCK_POOL_H_

#include <absl/container/btree_set.h>
#include <absl/container/flat_hash_map.h>

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

class BlockPool {
 public:
  absl::btree_set<Block*, BlockOrder> free_small;
  absl::btree_set<Block*, BlockOrder> free_large;
  absl::flat_hash_map<std::uintptr_t, Block*> live;
  std::vector<Segment*> segments;

  absl::btree_set<Block*, BlockOrder>& free_set(bool small) {
    return small ? free_small : free_large;
  }

  // The live block at `p`, or null where `p` is none.
  Block* live_block(const void* p) const {
    auto it = live.find(reinterpret_cast<std::uintptr_t>(p));
    return it == live.end() ? nullptr : it->second;
  }

  // A block of `segment`, not yet linked into it.
  Block* new_block(Segment* segment) {
    ++segment->blocks;
    Block* b;
    if (spare_blocks_.empty()) {
      b = new Block();
    } else {
      b = spare_blocks_.back();
      spare_blocks_.pop_back();
      *b = Block();
    }
    b->segment = segment;
    return b;
  }
  void delete_block(Block* b) {
    --b->segment->blocks;
    spare_blocks_.push_back(b);
  }
  ~BlockPool() {
    for (Block* b : spare_blocks_) delete b;
    for (Segment* s : segments) {
      for (Block* b = s->first; b != nullptr;) {
        Block* next = b->next;
        delete b;
        b = next;
      }
      delete s;
    }
  }

 private:
  std::vector<Block*> spare_blocks_;
};

}  // namespace remat::detail

#endif  // REMAT_RUNTIME_ALLOC_DETAIL_BLOCK_POOL_H_
