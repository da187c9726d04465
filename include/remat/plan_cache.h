// remat/plan_cache.h: static plans' hints kept by the shape of the step they were made for,
// so that a training loop whose shapes change (sequence length, batch) plans once per shape
// and reuses a plan at shapes it was not made for (Note [Hints by position] in remat/hints.h).
//
//   remat::PlanCache cache;
//   remat::PlanCache::Found f = cache.find({batch, seq_len}, remat::PlanCache::Reuse::kNoLarger);
//   if (f.hints == nullptr) { ... record this step, plan it, cache.insert({batch, seq_len}, h) }
#ifndef REMAT_PLAN_CACHE_H_
#define REMAT_PLAN_CACHE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "remat/hints.h"

namespace remat {

// Plans by shape signature (whatever the loop knows before a step: batch size, sequence
// length). Thread-safe. find() returns the plan made for that exact signature, else the
// nearest one of the same length (smallest sum of absolute differences), which applies
// through Note [Hints by position]; `exact` says which.
//
// Note [Reusing plans across shapes]
// A followed plan recomputes what it recomputes whatever the shapes (Note [Following a
// schedule]). Made for a smaller step it recomputes no more than this step needs, and where
// this step's larger tensors pass the budget DTR's search finds the rest; made for a larger
// step it recomputes what would now fit. Reuse::kNoLarger therefore only takes plans made
// at keys no larger in any entry (and none where there is none: plan that step instead),
// which is the choice that beat DTR alone where the nearest plan did not
// (docs/measurements.md).
class PlanCache {
 public:
  using Key = std::vector<std::int64_t>;
  enum class Reuse { kNearest, kNoLarger };
  struct Found {
    std::shared_ptr<const StepHints> hints;  // null: nothing usable
    bool exact = false;
    Key key;  // the key it was stored under
  };
  void insert(Key key, std::shared_ptr<const StepHints> hints);
  Found find(const Key& key, Reuse reuse = Reuse::kNearest) const;
  std::size_t size() const;

 private:
  mutable std::mutex mu_;
  std::map<Key, std::shared_ptr<const StepHints>> plans_;
};

}  // namespace remat

#endif  // REMAT_PLAN_CACHE_H_
