// A request that ran out of memory runs once more from the emptiest state the program allows.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "runtime/alloc/detail/allocator_hooks.h"
#include "runtime/core/runtime_impl.h"

namespace remat::detail {

// Note [Running a request once more]
// The walk (Note [Iterative recomputation]) locks each input it finds resident before it
// recomputes the missing ones, and the policy chose its victims without knowing what the
// walk would need next. So a request can run out of memory where another order of the same
// work fits: an evicted input whose producer declares scratch is recomputed while the op's
// other inputs are locked, and needs them, the scratch and its own output at once, where
// evicting one of those inputs first and recomputing it afterwards would fit. Whether that
// happens depends on which storages a budget's history left resident, so without a remedy
// the budgets a program fits under are not an interval, and a later step can fail where the
// first fitted (the contract of issue 53, tests/budget_contract_property_test.cc).
// The remedy: a request that runs out of memory runs again after everything evictable has
// been evicted (or offloaded, where the policy's victims would be), the pinned blocks packed
// and the empty segments returned, so that nothing is locked but what the walk locks and the
// allocator places each block anew: first as before, then with the root op locking each of
// its inputs as soon as the walk makes it (an input that another input's recomputation
// makes on the way is then not evicted again before the op runs). Where both fail (out of
// memory again, or thrashing from the emptier start), the first error is thrown, with the
// figures of the moment it was thrown. The cost falls only on requests that would have
// failed, though one that fails after all leaves the program's tensors evicted. Not retried:
// a walk in which a first run's kernel started and failed (it may have drawn random numbers,
// or added into constants: running it again would draw or add twice), one made while a
// kernel runs (nothing may move then), and one that found nothing to evict.
void RuntimeImpl::run_frames(Id root_op, bool recompute) {
  const std::size_t failed_first_runs = failed_first_runs_;
  try {
    walk_frames(root_op, recompute, /*hold_root_inputs=*/false);
    return;
  } catch (const OutOfMemoryError&) {
    if (failed_first_runs_ != failed_first_runs || kernel_running_) throw;
    const std::optional<ResidentBreakdown> breakdown = failed_breakdown_;
    const std::size_t thrashes = stats.thrashes;
    for (const bool hold : {false, true}) {
      if (evict_everything_evictable() == 0) break;
      try {
        walk_frames(root_op, recompute, hold);
        ++stats.retried_requests;
        return;
      } catch (...) {  // out of memory again, or thrashing from the emptier start
        if (failed_first_runs_ != failed_first_runs) break;
      }
    }
    failed_breakdown_ = breakdown;  // the error describes the moment it was thrown
    stats.thrashes = thrashes;
    throw;  // the first error, as it was thrown
  }
}

std::size_t RuntimeImpl::evict_everything_evictable() {
  std::size_t evicted = 0;
  std::vector<Id> pinned;
  for (Id s = 0; s < storages.slots(); ++s) {
    if (storages[s].pinned && storages[s].resident) pinned.push_back(s);
    if (!evictable(storages[s])) continue;
    evict_or_offload(s);
    ++evicted;
  }
  if (caching == nullptr || evicted == 0) return evicted;
  // What stays, packed low in address order, and the segments it leaves empty returned: the
  // layout the walk starts from is as close to a fresh one as the pinned blocks allow.
  // Oldest segment first, then up each: addresses across segments are the host's to choose,
  // and a run must not depend on them.
  auto place = [&](Id s) {
    return std::pair(AllocatorHooks::segment_serial(*caching, storages[s].ptr),
                     reinterpret_cast<std::uintptr_t>(storages[s].ptr));
  };
  std::sort(pinned.begin(), pinned.end(), [&](Id a, Id b) { return place(a) < place(b); });
  for (Id s : pinned) pack_pinned(s, /*copy_bytes=*/true);
  caching->release_cached();
  return evicted;
}

}  // namespace remat::detail
