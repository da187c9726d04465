#include "runtime/alloc/detail/best_fit_pool.h"

#include <algorithm>
#include <cassert>

namespace remat::detail {

BestFitPool::~BestFitPool() {
  for (Block* b : spare_blocks_) delete b;
  for (Segment* s : segments_) {
    for (Block* b = s->first; b != nullptr;) {
      Block* next = b->next;
      delete b;
      b = next;
    }
    delete s;
  }
}

Segment* BestFitPool::add_segment(std::uintptr_t address, std::size_t bytes, bool small,
                                  bool whole) {
  Segment* seg = add_range(address, bytes);
  seg->size = bytes;
  seg->small = small;
  seg->whole = whole;
  Block* b = new_block(seg);
  b->address = address;
  b->size = bytes;
  seg->first = b;
  seg->last = b;
  return seg;
}

Segment* BestFitPool::add_range(std::uintptr_t address, std::size_t capacity) {
  auto* seg = new Segment();
  seg->serial = next_serial_++;
  seg->address = address;
  seg->capacity = capacity;
  segments_.push_back(seg);
  return seg;
}

void BestFitPool::delete_segment(Segment* s) {
  Block* b = s->first;
  assert(s->live_blocks == 0 && b != nullptr && b->next == nullptr && b->size == s->size);
  erase_free(b);
  delete_block(b);
  delete s;
}

BestFitPool::FreeSet::iterator BestFitPool::first_not_smaller(bool small, std::size_t size) {
  Segment before_all;  // serial 0: orders before every reserved segment
  Block probe;
  probe.size = size;
  probe.segment = &before_all;
  return free_set(small).lower_bound(&probe);
}

std::size_t BestFitPool::largest_free() const {
  std::size_t best = 0;
  if (!free_small_.empty()) best = (*free_small_.rbegin())->size;
  if (!free_large_.empty()) best = std::max(best, (*free_large_.rbegin())->size);
  return best;
}

Block* BestFitPool::split(Block* b, std::size_t keep) {
  Block* tail = new_block(b->segment);
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

Block* BestFitPool::coalesce(Block* b) {
  --b->segment->live_blocks;
  b->allocated = false;
  b->requested = 0;
  b->tag = kNoTag;
  if (Block* n = b->next; n != nullptr && !n->allocated) {
    erase_free(n);
    b->size += n->size;
    b->next = n->next;
    if (n->next != nullptr)
      n->next->prev = b;
    else
      b->segment->last = b;
    delete_block(n);
  }
  if (Block* p = b->prev; p != nullptr && !p->allocated) {
    erase_free(p);
    p->size += b->size;
    p->next = b->next;
    if (b->next != nullptr)
      b->next->prev = p;
    else
      p->segment->last = p;
    delete_block(b);
    b = p;
  }
  insert_free(b);
  return b;
}

Block* BestFitPool::new_block(Segment* segment) {
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

void BestFitPool::delete_block(Block* b) {
  --b->segment->blocks;
  spare_blocks_.push_back(b);
}

}  // namespace remat::detail
