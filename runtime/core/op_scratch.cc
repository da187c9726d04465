// An op's own memory besides its outputs: the scratch it declares, and scratch that moves
// until its kernel launches (Note [Scratch moves until its kernel launches]).
#include <cstdint>
#include <vector>

#include "runtime/alloc/detail/allocator_hooks.h"
#include "runtime/alloc/detail/blocks.h"
#include "runtime/core/runtime_impl.h"

namespace remat::detail {

// OpDef::scratch_bytes: reserved before the op's outputs (it is usually the larger request),
// while no kernel runs, so that making room may move storages (Note [Compaction]).
void RuntimeImpl::reserve_declared_scratch(Id op_id, OutputMemory& m) {
  const OpDef& op = *ops[op_id].op;
  if (!runs_kernels || !op.scratch_bytes) return;
  std::vector<TensorSpec> specs;
  for (Id t : ops[op_id].inputs) specs.push_back(tensors[t].spec);
  const std::size_t b = op.scratch_bytes(specs);
  if (b == 0) return;
  m.reserved = {allocate_op_scratch(m, b, /*unplaced=*/true), b};
}

// Note [Scratch moves until its kernel launches]
// An op's scratch (what it declares, outputs whose records died, what a recomputation
// accumulates into) is taken before its outputs, and nothing is written to it before the
// kernel runs. Untagged, it would be a block no compaction or evacuation may move, and a
// scratch block that landed in a fresh segment fences that segment's rest off from the
// outputs that follow (the segment cannot empty, the rest is too small). So until the launch
// each scratch block carries a tag of its own (kFirstScratchTag + its place in m.scratch),
// and moving it moves no bytes: it takes its new block, and every pointer the op holds to it
// (m.scratch, m.reserved, m.ptrs) follows. At the launch the tags are cleared: from then on
// a kernel may hold the pointers.
void* RuntimeImpl::allocate_op_scratch(OutputMemory& m, std::size_t bytes, bool unplaced) {
  void* p = unplaced ? allocate_unplaced(bytes) : memory->allocate(bytes);
  m.scratch.emplace_back(p, bytes);
  if (caching != nullptr && m.scratch.size() <= kScratchTags)
    AllocatorHooks::set_tag(*caching, p,
                            kFirstScratchTag + static_cast<std::uint32_t>(m.scratch.size() - 1));
  return p;
}

void RuntimeImpl::move_op_scratch(std::size_t k, void* to) {
  const auto [from, bytes] = preparing_->scratch[k];
  AllocatorHooks::moved(*caching, from, to);
  memory->deallocate(from, bytes);
  place_op_scratch(k, to);
}

// Points the prepared op's k-th scratch block, and whatever of the op refers to it, at `to`.
void RuntimeImpl::place_op_scratch(std::size_t k, void* to) {
  OutputMemory& m = *preparing_;
  void*& from = m.scratch[k].first;
  if (m.reserved.first == from) m.reserved.first = to;
  for (void*& p : m.ptrs)
    if (p == from) p = to;
  from = to;
  AllocatorHooks::set_tag(*caching, to, kFirstScratchTag + static_cast<std::uint32_t>(k));
}

// Memory outside a step's placed requests (Note [Placed allocations] in
// step_placement.cc): the simulated traces a placement is made from never ask for it.
void* RuntimeImpl::allocate_unplaced(std::size_t bytes) {
  const PlacementPause pause(caching, /*short_lived=*/true);
  return memory->allocate(bytes);
}

}  // namespace remat::detail
