#include "runtime/alloc/detail/step_placement.h"

#include <algorithm>
#include <utility>

namespace remat::detail {

// Note [Placed allocations]
// A training step that follows a static plan makes the same requests in the same order
// every time, and frees them at the same points. Best fit, which knows nothing of when a
// block will be freed, scatters long-lived blocks (gradients, a plan's checkpoints) among
// short-lived ones, and the holes between them can cost a tenth of the budget or more: a
// plan that fits in live bytes then does not fit in reserved ones, and the runtime evicts
// and recomputes what the plan meant to keep. So such a step's requests are recorded once
// (`record_allocations`, on a run that has room: the simulated backend without a budget) and,
// when the step begins, laid out by `place_allocations` (Note [Greedy placement by size]
// in placement.cc) in the free holes of 1 MiB and more beside live blocks (the parameters'
// segments' tails) and, for what they cannot hold, one arena segment, reused from step to
// step. From then on the i-th request of the recorded size is carved out of the free block at
// its place. The holes and the arena are closed to every other request and to packing and
// compaction (the arena to eviction's windows too), so that nothing lands where a later
// placed block must go. Correctness never depends on the placement: a request of another
// size, a placed range that is not free (the program or the runtime did something else
// this time), or a request the placement does not place that finds no room elsewhere, ends
// the placement for the step (a miss); its ranges open, and requests are served as usual
// from then on. Allocations still live when the recording ended are served as usual, outside
// the placed ranges, since they would hold them into the next step. A running kernel's
// scratch is not part of the sequence (`pause_placement`), so a sequence from the simulated
// backend, where kernels do not run, matches a step that runs them; where nothing outside has
// room for it, it takes the arena's headroom (Placement::headroom_bytes; Note [Scratch
// borrows the arena's headroom] in allocator_core.cc). Nor are
// constants part of it: a program makes them where no trace of its step can tell (before
// the step, or during it: an input copied in), and they live on.

void StepPlacement::record_allocations() {
  recording_ = true;
  sequence_ = AllocationSequence();
  recorded_.clear();
  clock_ = 0;
}

AllocationSequence StepPlacement::take_allocations() {
  recording_ = false;
  recorded_.clear();
  return std::exchange(sequence_, AllocationSequence());
}

void StepPlacement::record(std::uintptr_t address, std::size_t size) {
  recorded_[address] = sequence_.allocations.size();
  sequence_.allocations.push_back({.bytes = size, .start = clock_++});
}

void StepPlacement::record_end(std::uintptr_t address) {
  if (auto t = recorded_.find(address); t != recorded_.end()) {
    sequence_.allocations[t->second].end = clock_++;
    recorded_.erase(t);
  }
}

void StepPlacement::moved(std::uintptr_t from, std::uintptr_t to) {
  if (!recording_) return;
  auto t = recorded_.find(from);
  if (t == recorded_.end()) return;
  const std::size_t index = t->second;
  recorded_.erase(t);
  recorded_[to] = index;
}

constexpr std::size_t kMinRegion = std::size_t{1} << 20;
constexpr std::size_t kMaxRegions = 16;

std::vector<Block*> StepPlacement::find_regions(const Segment* skip) const {
  std::vector<Block*> holes;
  for (Segment* s : pool_.segments()) {
    if (s->live_blocks == 0 || s == skip || s->whole) continue;
    for (Block* b = s->first; b != nullptr; b = b->next)
      if (!b->allocated && b->size >= kMinRegion) holes.push_back(b);
  }
  std::stable_sort(holes.begin(), holes.end(),
                   [](const Block* a, const Block* b) { return a->size > b->size; });
  if (holes.size() > kMaxRegions) holes.resize(kMaxRegions);
  std::sort(holes.begin(), holes.end(), lies_below);
  return holes;
}

std::shared_ptr<const Placement> StepPlacement::layout_for(
    const std::shared_ptr<const Placement>& given, const std::vector<std::size_t>& sizes) {
  if (given->regions == sizes) return given;
  for (const Layout& l : layouts_)
    if (l.given.lock() == given && l.layout->regions == sizes) return l.layout;
  Placement laid_out = place_allocations(given->sequence, sizes);
  laid_out.headroom_bytes = given->headroom_bytes;
  auto layout = std::make_shared<const Placement>(std::move(laid_out));
  layouts_.push_back({given, layout});
  if (layouts_.size() > 4) layouts_.erase(layouts_.begin());
  return layout;
}

Segment* StepPlacement::reusable_arena(std::size_t need) const {
  for (Segment* s : pool_.segments())
    if (s->serial == last_arena_ && s->live_blocks == 0 && s->size >= need) return s;
  return nullptr;
}

void StepPlacement::follow(std::shared_ptr<const Placement> layout,
                           const std::vector<Block*>& regions, Segment* arena) {
  layout_ = std::move(layout);
  ranges_.clear();
  for (Block* b : regions) ranges_.push_back({b->segment, b->address, b->size});
  if (arena != nullptr) {
    ranges_.push_back({arena, arena->address, arena->size});
    last_arena_ = arena->serial;
    arena_ = arena;
  }
  next_ = 0;
  following_ = true;
}

void StepPlacement::miss() {
  ++misses;
  end();
}

void StepPlacement::end() {
  layout_.reset();
  ranges_.clear();
  following_ = false;
  arena_ = nullptr;
}

bool StepPlacement::holds_range(const Segment* s) const {
  for (const Range& r : ranges_)
    if (r.segment == s) return true;
  return false;
}

// The free block that holds the place of request `request` (of `size` bytes), and that
// place; null where it has none or the block there is not free.
Block* StepPlacement::block_at(std::size_t request, std::size_t size, std::uintptr_t* at) const {
  const Placement& p = *layout_;
  if (p.region[request] >= ranges_.size()) return nullptr;
  const Range& r = ranges_[p.region[request]];
  *at = r.address + p.offsets[request];
  Block* b = r.segment->first;
  while (b != nullptr && b->address + b->size <= *at) b = b->next;
  if (b != nullptr && (b->allocated || b->address > *at || b->address + b->size < *at + size))
    return nullptr;
  return b;
}

Block* StepPlacement::take_at_place(std::size_t size) {
  const Placement& p = *layout_;
  if (next_ >= p.sequence.allocations.size()) return nullptr;  // past the sequence: as usual
  const std::size_t i = next_++;
  const bool same = p.sequence.allocations[i].bytes == size;
  if (same && p.region[i] == Placement::kUnplaced) return nullptr;
  std::uintptr_t at = 0;
  Block* b = same ? block_at(i, size, &at) : nullptr;
  if (b == nullptr) {  // a miss: the regions open for the rest of the step
    miss();
    return nullptr;
  }
  pool_.erase_free(b);
  if (b->address < at) {
    Block* rest = pool_.split(b, at - b->address);
    pool_.insert_free(b);
    b = rest;
  }
  if (b->size > size) pool_.insert_free(pool_.split(b, size));
  ++placed;
  return b;
}

}  // namespace remat::detail
