// The lineage graph: ops, the tensors they made, and the storages that hold tensor bytes.
// Internal to the runtime; see Note [Lineage lifetime] in lineage_lifetime.cc.
#ifndef REMAT_RUNTIME_CORE_LINEAGE_H_
#define REMAT_RUNTIME_CORE_LINEAGE_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "remat/op.h"
#include "remat/tensor.h"

namespace remat::detail {

using Id = std::uint32_t;
inline constexpr Id kNone = ~Id{0};

// One memory region. Views share their base's storage; evicting it evicts them all.
struct StorageRec {
  std::size_t bytes = 0;
  void* ptr = nullptr;  // null while evicted
  bool resident = false;
  bool pinned = false;            // constants: never evicted
  bool offloaded = false;         // its bytes are in the host tier (Note [The host tier])
  bool lingering = false;         // dead, kept after a recomputation until memory is needed
  Id producer = kNone;            // the op whose run makes this storage (kNone for constants)
  std::uint32_t handles = 0;      // user handles on tensors of this storage
  std::uint32_t tensor_refs = 0;  // tensor records that point here (keeps the record alive)
  std::uint32_t locks = 0;        // > 0 while an op running now reads or writes it
  double last_access = 0;
  double ready_at = 0;  // when a copy back from the host ends (Note [Copies beside the kernels])
  Id candidate_slot = kNone;  // position in the eviction candidate list
  std::vector<Id> consumers;  // live ops that read a tensor of this storage
  std::uint32_t stamp = 0;    // traversal mark (the eviction policies' lineage walks)
  // Request in which it was last recomputed, and the request in which it was recomputed a
  // second time (then it stays until that request ends): see Note [Iterative recomputation].
  std::uint32_t recomputed_in = 0;
  std::uint32_t keep_in = 0;
  // Holds a step places on a storage nothing else may need yet (a deferred op's pending read,
  // a followed plan's instance: runtime/core/plan_follower.h); a dead storage stays while
  // any is held.
  std::uint32_t holds = 0;
};

struct TensorRec {
  TensorSpec spec;
  Id storage = kNone;
  std::size_t offset = 0;     // byte offset into the storage (views)
  Id producer = kNone;        // the op that made it (kNone for constants)
  std::uint32_t handles = 0;  // user handles
  std::uint32_t refs = 0;     // handles + live consumer ops
  // Where the current step made it (see Note [Hints by position]); valid while `step`
  // equals the runtime's step stamp.
  std::uint32_t step = 0;
  std::int32_t position = -1;  // -1: made before the step (or outside any step)
  std::int32_t output = 0;
  std::int32_t node = -1;  // node id in the step being recorded, -1: none yet
};

struct OpRec {
  OpPtr op;
  std::vector<Id> inputs;          // tensors
  std::vector<Id> in_storages;     // their storages (fixed: a tensor never changes storage)
  std::vector<Id> outputs;         // tensors, kNone once an output record has died
  std::vector<Id> output_storage;  // each output's storage (a view's: its base's), or kNone
  std::vector<Id> out_storages;    // storages it makes (kNone: a view, or the record died)
  std::vector<int> alias_of;       // per output
  std::vector<int> copy_of;        // per output (OutputSpec::copy_of)
  // Inputs (constants) the kernel also accumulates into in place, after its outputs
  // (Runtime::call_accumulate); on a recomputation it writes scratch instead.
  std::vector<int> accumulates;
  std::vector<TensorSpec> output_specs;  // kept so dead outputs can still be written
  double cost = 0;
  RngState rng;
  std::uint32_t refs = 0;  // live output tensor records + live storages it makes
  std::uint32_t stamp = 0;
  std::int32_t position = -1;  // in the step stamped `step` (see Note [Hints by position])
  std::uint32_t step = 0;
  // Called by the program but not run yet, as the plan it follows orders (Note [Following a
  // schedule]); holds one extra reference until it has run.
  bool deferred = false;
};

// A vector of records with recycled slots, so long training loops do not grow it forever.
template <typename T>
class SlotMap {
 public:
  Id add(T value) {
    if (!free_.empty()) {
      Id id = free_.back();
      free_.pop_back();
      items_[id] = std::move(value);
      return id;
    }
    items_.push_back(std::move(value));
    return static_cast<Id>(items_.size() - 1);
  }
  void remove(Id id) {
    items_[id] = T();
    free_.push_back(id);
  }
  T& operator[](Id id) { return items_[id]; }
  const T& operator[](Id id) const { return items_[id]; }
  const T* data() const { return items_.data(); }  // valid until the next insert
  std::size_t live() const { return items_.size() - free_.size(); }
  std::size_t slots() const { return items_.size(); }  // ids below this, removed ones included
  // Visits every slot, removed ones included (they hold a default-constructed T).
  template <class F>
  void for_each_slot(F&& f) const {
    for (const T& item : items_) f(item);
  }

 private:
  std::vector<T> items_;
  std::vector<Id> free_;
};

}  // namespace remat::detail

#endif  // REMAT_RUNTIME_CORE_LINEAGE_H_
