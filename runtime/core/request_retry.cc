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
// been evicted, so that nothing is locked but what the walk locks and the allocator places
// each block anew: first as before, then with the root op locking each of its inputs as soon
// as the walk has made it (an input its other inputs' recomputation makes on the way is then
// not evicted again before the op runs). Where both fail, the error thrown is the first one:
// the moment the request ran out of memory, with what was held then. The cost falls only on
// requests that would have failed. Not retried: a walk that wrote pinned memory (a first run
// that accumulates into constants and failed inside its kernel: running it again would add
// twice), one made while a kernel runs (nothing may move then), and one that found nothing
// to evict (it would fail the same way).
void RuntimeImpl::run_frames(Id root_op, bool recompute) {
  const std::size_t updates = stats.updates;
  std::optional<OutOfMemoryError> first;
  for (int attempt = 0;; ++attempt) {
    try {
      walk_frames(root_op, recompute, /*hold_root_inputs=*/attempt == 2);
      if (attempt > 0) ++stats.retried_requests;
      return;
    } catch (const OutOfMemoryError& e) {
      if (!first) first = e;
      if (attempt == 2 || stats.updates != updates || kernel_running_ ||
          evict_everything_evictable() == 0)
        throw *first;
    }
  }
}

std::size_t RuntimeImpl::evict_everything_evictable() {
  std::size_t evicted = 0;
  std::vector<Id> pinned;
  for (Id s = 0; s < storages.slots(); ++s) {
    if (storages[s].pinned && storages[s].resident) pinned.push_back(s);
    if (!evictable(storages[s])) continue;
    evict(s);
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
