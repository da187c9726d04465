#include "runtime/core/eviction_policy.h"

#include <algorithm>
#include <vector>

#include <gtest/gtest.h>

namespace remat::detail {
namespace {

// A hand-built lineage: storages and the ops that make them, as the runtime records them.
class Lineage {
 public:
  LineageView view() { return {&storages_, &tensors_, &ops_, &clock_}; }

  Id constant() {
    StorageRec r;
    r.bytes = 99;  // bytes() adds 1: keys divide by 100
    r.resident = true;
    r.pinned = true;
    return storages_.add(std::move(r));
  }

  // A resident storage made by an op of `cost` reading `inputs`.
  Id make(double cost, const std::vector<Id>& inputs) {
    OpRec op;
    op.cost = cost;
    op.in_storages = inputs;
    const Id o = ops_.add(std::move(op));
    StorageRec r;
    r.bytes = 99;
    r.resident = true;
    r.producer = o;
    const Id s = storages_.add(std::move(r));
    ops_[o].output_storage = {s};
    for (Id in : inputs) storages_[in].consumers.push_back(o);
    return s;
  }

  void evict(Id s, EvictionPolicy* policy) {
    storages_[s].resident = false;
    policy->on_evicted(s);
  }
  void restore(Id s, EvictionPolicy* policy) {
    storages_[s].resident = true;
    policy->on_resident(s);
  }

 private:
  SlotMap<StorageRec> storages_;
  SlotMap<TensorRec> tensors_;
  SlotMap<OpRec> ops_;
  double clock_ = 10;
};

// x (pinned) -> a -> b1 -> c -> d -> e, and a -> b2. Evicted: a, b2, c, d.
// For b1, the evicted ancestors are {a} (cost 10) and the evicted descendants {c, d}
// (5 + 7); b2 is an evicted sibling (cost 100): it neither has to be recomputed to bring b1
// back nor needs b1, so h_DTR does not charge it, while the connected evicted component
// (what dtr_eq's classes approximate) does.
struct Diamond {
  explicit Diamond(std::string_view policy_name) {
    policy = make_eviction_policy(policy_name, lineage.view(), 1);
    const Id x = lineage.constant();
    a = lineage.make(10, {x});
    b1 = lineage.make(1, {a});
    b2 = lineage.make(100, {a});
    c = lineage.make(5, {b1});
    d = lineage.make(7, {c});
    e = lineage.make(3, {d});
    for (Id s : {a, b2, c, d}) lineage.evict(s, policy.get());
  }
  Lineage lineage;
  std::unique_ptr<EvictionPolicy> policy;
  Id a, b1, b2, c, d, e;
};

TEST(EvictionPolicyTest, DtrChargesEvictedAncestorsAndDescendantsNotSiblings) {
  for (const char* name : {"dtr", "dtr_sqrt", "hinted"}) {
    Diamond g(name);
    EXPECT_DOUBLE_EQ(g.policy->key(g.b1), (1 + 10 + 5 + 7) / 100.0) << name;
    // e: its evicted ancestors d, c (b1 is resident: the chain stops there); no descendants.
    EXPECT_DOUBLE_EQ(g.policy->key(g.e), (3 + 7 + 5) / 100.0) << name;
    // The floor is the storage's own op: a lower bound of the key.
    EXPECT_DOUBLE_EQ(g.policy->key_floor(g.b1), 1 / 100.0) << name;
  }
}

// When c comes back it cuts b1's descendant chain and e's ancestor chain: both keys drop,
// and e lies two steps away, beyond c's direct neighbours.
TEST(EvictionPolicyTest, RestoringAStorageLowersTheKeysAtTheEndsOfItsChains) {
  Diamond g("dtr");
  const double b1_before = g.policy->key(g.b1), e_before = g.policy->key(g.e);
  g.lineage.restore(g.c, g.policy.get());
  std::vector<Id> lowered;
  g.policy->for_each_lowered(g.c, [&](Id s) { lowered.push_back(s); });
  std::sort(lowered.begin(), lowered.end());
  EXPECT_EQ(lowered, (std::vector<Id>{g.b1, g.e}));
  EXPECT_LT(g.policy->key(g.b1), b1_before);
  EXPECT_LT(g.policy->key(g.e), e_before);
}

TEST(EvictionPolicyTest, MspsChargesEvictedAncestorsOnly) {
  for (const char* name : {"msps", "msps_sqrt"}) {
    Diamond g(name);
    EXPECT_DOUBLE_EQ(g.policy->key(g.b1), (1 + 10) / 100.0) << name;
    EXPECT_DOUBLE_EQ(g.policy->key(g.e), (3 + 7 + 5) / 100.0) << name;
  }
}

TEST(EvictionPolicyTest, DtrEqChargesWholeEvictedClasses) {
  Diamond g("dtr_eq");
  // b1's neighbours a and c lie in two classes: {a, b2} (10 + 100) and {c, d} (5 + 7).
  EXPECT_DOUBLE_EQ(g.policy->key(g.b1), (1 + 110 + 12) / 100.0);
}

}  // namespace
}  // namespace remat::detail
