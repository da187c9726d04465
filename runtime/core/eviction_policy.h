// Eviction policies: each scores an evictable storage, and the runtime evicts the lowest
// score first. Internal to the runtime; users pick one by name (RuntimeOptions::policy).
#ifndef REMAT_RUNTIME_EVICTION_POLICY_H_
#define REMAT_RUNTIME_EVICTION_POLICY_H_

#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/core/lineage.h"

namespace remat::detail {

// What a policy may look at: the lineage graph and the runtime's clock.
struct LineageView {
  SlotMap<StorageRec>* storages;
  SlotMap<TensorRec>* tensors;
  SlotMap<OpRec>* ops;
  const double* clock;
  // The time of the steps before the current one (Note [Each step's own clock]): a time
  // since the run began is clock_base + a time since the step did.
  const double* clock_base = nullptr;

  double cost_of(Id storage) const;
  double staleness(Id storage) const;
  // Calls fn(parent storage) for each storage the producer of `s` reads, and
  // fn(child storage) for each storage made by an op that reads `s`.
  template <typename Fn>
  void for_each_parent(Id s, Fn&& fn) const;
  template <typename Fn>
  void for_each_child(Id s, Fn&& fn) const;
};

class EvictionPolicy {
 public:
  virtual ~EvictionPolicy() = default;
  virtual std::string_view name() const = 0;
  // A policy's score is key / staleness, or the key alone where staleness plays no part
  // (see Note [Candidate index]). Lower evicts first. Only asked of resident storages.
  virtual double key(Id storage) = 0;
  // A lower bound of key(storage) that costs O(1) (Note [Candidate index]: stored keys may
  // lag below the truth); policies whose keys walk the lineage override it.
  virtual double key_floor(Id storage) { return key(storage); }
  // The power of staleness the key is divided by: 1 for DTR's heuristics, 0 where staleness
  // plays no part.
  virtual double staleness_exponent() const { return 1.0; }
  double score(Id storage) {
    const double e = staleness_exponent();
    if (e == 0) return key(storage);
    const double s = view().staleness(storage);
    return key(storage) / (e == 1 ? s : std::pow(s, e));
  }
  virtual const LineageView& view() const = 0;
  // Calls fn(storage) for each resident storage whose key may have dropped because `s` came
  // back (the candidate index must be told: its stored keys may only lag below the truth).
  // By default `s`'s direct neighbours; policies whose keys reach further override it.
  virtual void for_each_lowered(Id s, const std::function<void(Id)>& fn) {
    view().for_each_parent(s, fn);
    view().for_each_child(s, fn);
  }
  virtual void on_evicted(Id /*storage*/) {}
  virtual void on_resident(Id /*storage*/) {}
  virtual void on_destroyed(Id /*storage*/) {}
  // Whether the policy acts on a static plan's hints: a step given hints under such a policy
  // is a hinted step (runtime/core/step.cc); under any other the hints are ignored.
  virtual bool uses_hints() const { return false; }
  // A factor on the storage's score from a static plan's hints (Note [Hinted eviction]).
  virtual void set_weight(Id /*storage*/, float /*weight*/) {}
};

// nullptr for an unknown name.
std::unique_ptr<EvictionPolicy> make_eviction_policy(std::string_view name, LineageView view,
                                                     std::uint64_t seed);
std::vector<std::string> policy_names();

// ---- implementation of the templates ----
template <typename Fn>
void LineageView::for_each_parent(Id s, Fn&& fn) const {
  const Id producer = (*storages)[s].producer;
  if (producer == kNone) return;
  // Ops keep their inputs' and outputs' storages beside the tensors, so the walks that price
  // eviction read no tensor record.
  for (Id s : (*ops)[producer].in_storages) fn(s);
}

template <typename Fn>
void LineageView::for_each_child(Id s, Fn&& fn) const {
  for (Id op : (*storages)[s].consumers) {
    for (Id child : (*ops)[op].output_storage)
      if (child != kNone && child != s) fn(child);
  }
}

}  // namespace remat::detail

#endif  // REMAT_RUNTIME_EVICTION_POLICY_H_
