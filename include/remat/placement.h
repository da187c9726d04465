// Fixed offsets for a step's allocations: a step that repeats the same requests in the same
// order (a training step following a static plan) gets every block at an offset planned
// from the recorded requests of an earlier run, instead of wherever best fit finds room.
//
//   remat::AllocationSequence requests = allocator.take_allocations();
//   // Two holes beside long-lived blocks, of 16 and 3 MiB, used before a new arena:
//   remat::Placement p = remat::place_allocations(requests, {16 << 20, 3 << 20});
//   p.arena_bytes;    // the new arena's size; with the holes, at least
//                     // requests.peak_live_bytes() minus what they hold
//   p.region[i], p.offsets[i];  // where the i-th request goes (region 2: the arena)
//
// See Note [Placed allocations] in step_placement.cc for how the allocator follows one.
#ifndef REMAT_PLACEMENT_H_
#define REMAT_PLACEMENT_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace remat {

// The requests a caching allocator served while recording, in order, and when each was given
// back: `start` and `end` count the allocator's allocate and deallocate calls.
struct AllocationSequence {
  static constexpr std::size_t kStillLive = SIZE_MAX;  // not given back when the recording ended
  struct Allocation {
    std::size_t bytes = 0;  // rounded, as the allocator sized the block
    std::size_t start = 0;
    std::size_t end = kStillLive;
  };
  std::vector<Allocation> allocations;
  // The most bytes live at once among the allocations given back: no placement of them
  // needs less.
  std::size_t peak_live_bytes() const;
};

struct Placement {
  static constexpr std::size_t kUnplaced = SIZE_MAX;
  AllocationSequence sequence;       // what it places
  std::vector<std::size_t> regions;  // the sizes of the fixed regions it was made for
  std::size_t arena_bytes = 0;       // the size the arena (region regions.size()) needs
  // Bytes the arena keeps free after arena_bytes, for short-lived requests no placement
  // places that find no room outside it (a kernel's scratch: Note [Scratch borrows the
  // arena's headroom] in allocator_core.cc); the arena is made with them or not at all. Set by the
  // caller; place_allocations leaves it 0.
  std::size_t headroom_bytes = 0;
  std::size_t peak_live_bytes = 0;  // the sequence's: regions plus arena hold at least this
  // Per request: its region (regions.size() for the arena) and offset there, or kUnplaced.
  std::vector<std::size_t> region;
  std::vector<std::size_t> offsets;
};

// Places every allocation of `sequence` that was given back, such that two whose lifetimes
// overlap never share a byte: in the fixed `regions` (free ranges of the given sizes, used
// first) and in an arena after them, as small as the rules of Note [Greedy placement by
// size] make it. Allocations still live at the sequence's end stay unplaced (they would hold
// their range into the next step). Deterministic.
Placement place_allocations(AllocationSequence sequence,
                            const std::vector<std::size_t>& regions = {});

}  // namespace remat

#endif  // REMAT_PLACEMENT_H_
