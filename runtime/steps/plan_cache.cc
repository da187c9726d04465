#include <cstdlib>

#include "remat/plan_cache.h"

namespace remat {

void PlanCache::insert(Key key, std::shared_ptr<const StepHints> hints) {
  std::lock_guard<std::mutex> lock(mu_);
  plans_[std::move(key)] = std::move(hints);
}

PlanCache::Found PlanCache::find(const Key& key, Reuse reuse) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = plans_.find(key); it != plans_.end()) return {it->second, true, it->first};
  Found best;
  std::int64_t best_distance = 0;
  for (const auto& [k, hints] : plans_) {
    if (k.size() != key.size()) continue;
    if (reuse == Reuse::kNoLarger) {
      bool larger = false;
      for (std::size_t i = 0; i < k.size(); ++i) larger |= k[i] > key[i];
      if (larger) continue;
    }
    std::int64_t d = 0;
    for (std::size_t i = 0; i < k.size(); ++i) d += std::llabs(k[i] - key[i]);
    if (best.hints == nullptr || d < best_distance) {
      best = {hints, false, k};
      best_distance = d;
    }
  }
  return best;
}

std::size_t PlanCache::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return plans_.size();
}

}  // namespace remat
