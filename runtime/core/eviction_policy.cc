#include "runtime/core/eviction_policy.h"

#include <algorithm>
#include <cmath>

namespace remat::detail {

double LineageView::cost_of(Id s) const {
  const Id producer = (*storages)[s].producer;
  return producer == kNone ? 0.0 : (*ops)[producer].cost;
}

// +1 keeps a storage touched this very instant finite and comparable.
double LineageView::staleness(Id s) const { return *clock - (*storages)[s].last_access + 1.0; }

namespace {

// Note [Evicted neighbourhoods]
// Evicting a storage makes the cost of what would have to be recomputed with it relevant:
// its evicted ancestors (the chain of evicted storages reached through parents, all of which
// must be recomputed before it can be) and its evicted descendants (the chain reached through
// children, each of which needs it to come back). DTR's h_DTR charges the two chains, each
// walked in its own direction. It does not charge the whole connected evicted component: an
// evicted sibling (another evicted child of an evicted parent) is neither needed to
// recompute the storage nor needs it, and charging it overprices storages in wide evicted
// regions. That whole-component price is what the union-find of `dtr_eq` approximates, and
// walking it here would make `dtr` behave like `dtr_eq`. The walk marks ops rather than
// storages, so an op with several evicted outputs is charged once.
class NeighbourhoodWalker {
 public:
  explicit NeighbourhoodWalker(LineageView v) : v_(v) {}

  // Cost of `s` plus its evicted ancestors and, with `descendants`, its evicted descendants.
  // Each chain's walk stops after kMaxVisits storages: a neighbourhood that large already
  // prices its members out of eviction, and freed dead tensors can make one evicted chain
  // span most of a step.
  static constexpr std::size_t kMaxVisits = 256;
  double cost(Id s, bool descendants) {
    ++stamp_;
    double total = 0;
    stack_.clear();
    visit(s, total);
    walk(total, /*up=*/true);
    if (descendants) {
      stack_.assign(1, s);
      walk(total, /*up=*/false);
    }
    return total;
  }

  // Calls fn(r) for each resident storage whose chains run through `s`: the resident
  // storages at the far ends of the evicted chains above and below it. When `s` comes back
  // those chains are cut there, so the keys of those storages drop.
  void for_each_edge(Id s, const std::function<void(Id)>& fn) {
    ++stamp_;
    (*v_.storages)[s].stamp = stamp_;
    for (bool up : {true, false}) {
      stack_.assign(1, s);
      visits_ = 0;
      drain(up, [&](Id n) {
        StorageRec& r = (*v_.storages)[n];
        if (r.pinned || r.stamp == stamp_) return;
        r.stamp = stamp_;
        if (r.resident) {
          fn(n);
        } else {
          ++visits_;
          stack_.push_back(n);
        }
      });
    }
  }

 private:
  // Pops the stack until it is empty or kMaxVisits storages were visited, calling step(n)
  // for each parent (`up`) or child n of each storage popped.
  template <typename Step>
  void drain(bool up, Step&& step) {
    while (!stack_.empty() && visits_ < kMaxVisits) {
      const Id x = stack_.back();
      stack_.pop_back();
      if (up) {
        v_.for_each_parent(x, step);
      } else {
        v_.for_each_child(x, step);
      }
    }
  }

  // Adds the evicted storages reached from the stack through parents (`up`) or children.
  void walk(double& total, bool up) {
    visits_ = 0;
    drain(up, [&](Id n) {
      StorageRec& r = (*v_.storages)[n];
      if (!r.resident && !r.pinned && r.stamp != stamp_) visit(n, total);
    });
  }

  void visit(Id s, double& total) {
    ++visits_;
    StorageRec& r = (*v_.storages)[s];
    r.stamp = stamp_;
    stack_.push_back(s);
    if (r.producer == kNone) return;
    OpRec& op = (*v_.ops)[r.producer];
    if (op.stamp != stamp_) {
      op.stamp = stamp_;
      total += op.cost;
    }
  }

  LineageView v_;
  std::uint32_t stamp_ = 0;
  std::size_t visits_ = 0;
  std::vector<Id> stack_;
};

// The part every policy shares: the lineage it reads.
class PolicyBase : public EvictionPolicy {
 public:
  explicit PolicyBase(LineageView v) : v_(v) {}
  const LineageView& view() const override { return v_; }

 protected:
  double bytes(Id s) const { return static_cast<double>((*v_.storages)[s].bytes) + 1.0; }
  LineageView v_;
};

class LruPolicy final : public PolicyBase {
 public:
  using PolicyBase::PolicyBase;
  std::string_view name() const override { return "lru"; }
  double key(Id) override { return 1.0; }
};

class LargestPolicy final : public PolicyBase {
 public:
  using PolicyBase::PolicyBase;
  std::string_view name() const override { return "largest"; }
  double key(Id s) override { return 1.0 / bytes(s); }
  double staleness_exponent() const override { return 0.0; }
};

// A fixed pseudo-random key per (storage, residency): the same storage keeps its key until
// it is touched again, which the candidate index needs. The draws follow storage ids and
// the clock, which differ from step to step, so two steps of one program evict differently
// and a later step can run out of memory at a budget an earlier one fit: the one policy
// without that guarantee (tests/repeated_steps_property_test.cc). It is a baseline to
// compare against, not one to train with.
class RandomPolicy final : public PolicyBase {
 public:
  RandomPolicy(LineageView v, std::uint64_t seed) : PolicyBase(v), seed_(seed) {}
  std::string_view name() const override { return "random"; }
  double key(Id s) override {
    // The last access since the run began: a step's clock moving back changes no key.
    const double base = v_.clock_base != nullptr ? *v_.clock_base : 0.0;
    const auto since_run = static_cast<std::int64_t>(base + (*v_.storages)[s].last_access);
    std::uint64_t x =
        seed_ ^ (std::uint64_t{s} * 0x9e3779b97f4a7c15ULL) ^ static_cast<std::uint64_t>(since_run);
    x ^= x >> 31;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 29;
    return static_cast<double>(x >> 11) * 0x1.0p-53;
  }
  double staleness_exponent() const override { return 0.0; }

 private:
  std::uint64_t seed_;
};

// h_DTR-local: the storage's own cost, over size times staleness.
class DtrLocalPolicy final : public PolicyBase {
 public:
  using PolicyBase::PolicyBase;
  std::string_view name() const override { return "dtr_local"; }
  double key(Id s) override { return v_.cost_of(s) / bytes(s); }
};

// The policies that price a storage by the cost of its evicted neighbourhood over its size,
// divided by a power of staleness:
//   dtr       h_DTR: evicted ancestors and descendants, staleness^1;
//   dtr_sqrt  the same neighbourhood, staleness^0.5: recency counts, but less, so a cheap
//             tensor used a moment ago can still go before a costly stale one;
//   msps      memory saving per second (after Capuchin): evicted ancestors only, staleness^0;
//   msps_sqrt the same ancestors, staleness^0.5: MSPS with a little of DTR's recency, which
//             keeps it from evicting a cheap tensor the running block is about to read;
//   hinted    h_DTR times the storage's hint weight (Note [Hinted eviction] in
//             runtime/core/step.cc), set by a step that follows a plan.
class NeighbourhoodPolicy final : public PolicyBase {
 public:
  NeighbourhoodPolicy(LineageView v, std::string_view name, bool descendants, double exponent,
                      bool weighted = false)
      : PolicyBase(v),
        walker_(v),
        name_(name),
        descendants_(descendants),
        exponent_(exponent),
        weighted_(weighted) {}
  std::string_view name() const override { return name_; }
  double key(Id s) override {
    const double k = walker_.cost(s, descendants_) / bytes(s);
    return weighted_ ? k * weight(s) : k;
  }
  // The neighbourhood includes the storage's own op.
  double key_floor(Id s) override {
    const double k = v_.cost_of(s) / bytes(s);
    return weighted_ ? k * weight(s) : k;
  }
  bool uses_hints() const override { return weighted_; }
  void set_weight(Id s, float w) override {
    if (!weighted_) return;
    if (s >= weights_.size()) weights_.resize(s + 1, 1.0f);
    weights_[s] = w;
  }
  void on_destroyed(Id s) override {
    if (s < weights_.size()) weights_[s] = 1.0f;
  }
  double staleness_exponent() const override { return exponent_; }
  void for_each_lowered(Id s, const std::function<void(Id)>& fn) override {
    walker_.for_each_edge(s, fn);
  }

 private:
  float weight(Id s) const { return s < weights_.size() ? weights_[s] : 1.0f; }

  NeighbourhoodWalker walker_;
  std::string_view name_;
  bool descendants_;
  double exponent_;
  bool weighted_;
  std::vector<float> weights_;  // by storage; 1 where never set (`hinted` only)
};

// Note [Equivalence classes]
// h_DTR-eq replaces the neighbourhood walk with union-find: every evicted storage belongs to a
// class (its connected evicted component, as it was when it formed), and a class keeps the
// sum of its members' costs. A storage's score charges its own cost plus the classes of its
// evicted neighbours, found in near-constant time. Classes never split: a rematerialized
// storage only takes its cost out of its class, so a class may overstate the real
// neighbourhood, which is the approximation DTR accepts for the speed.
// Nodes live in their own arena, reference-counted, because storages come and go while the
// classes they joined must outlive them.
class DtrEqPolicy final : public PolicyBase {
 public:
  using PolicyBase::PolicyBase;
  std::string_view name() const override { return "dtr_eq"; }

  double key(Id s) override {
    double total = v_.cost_of(s);
    roots_.clear();
    auto add = [&](Id n) {
      const StorageRec& r = (*v_.storages)[n];
      if (r.resident || r.pinned || class_of(n) == kNone) return;
      const Id root = find(class_of(n));
      if (std::find(roots_.begin(), roots_.end(), root) != roots_.end()) return;
      roots_.push_back(root);
      total += std::max(0.0, nodes_[root].cost);
    };
    v_.for_each_parent(s, add);
    v_.for_each_child(s, add);
    return total / bytes(s);
  }

  void on_evicted(Id s) override {
    if (s >= class_.size()) class_.resize(s + 1, kNone);
    if (class_[s] == kNone) {
      class_[s] = nodes_.add({kNone, 0.0, 1, 1});
      nodes_[class_[s]].parent = class_[s];
    }
    Id root = find(class_[s]);
    nodes_[root].cost += v_.cost_of(s);
    auto join = [&](Id n) {
      const StorageRec& nr = (*v_.storages)[n];
      if (nr.resident || nr.pinned || class_of(n) == kNone) return;
      root = unite(root, find(class_of(n)));
    };
    v_.for_each_parent(s, join);
    v_.for_each_child(s, join);
  }

  void on_resident(Id s) override {
    if (class_of(s) != kNone) nodes_[find(class_of(s))].cost -= v_.cost_of(s);
  }

  void on_destroyed(Id s) override {
    if (class_of(s) == kNone) return;
    if (!(*v_.storages)[s].resident) nodes_[find(class_[s])].cost -= v_.cost_of(s);
    drop(class_[s]);
    class_[s] = kNone;
  }

 private:
  struct Node {
    Id parent;
    double cost;
    std::uint32_t size;  // members below a root (union by size keeps trees shallow)
    std::uint32_t refs;  // storages naming it + nodes whose parent it is
  };

  // The node of the class a storage joined when it was evicted; kNone: none.
  Id class_of(Id s) const { return s < class_.size() ? class_[s] : kNone; }
  Id find(Id x) const {
    while (nodes_[x].parent != x) x = nodes_[x].parent;
    return x;
  }
  Id unite(Id a, Id b) {
    if (a == b) return a;
    if (nodes_[a].size < nodes_[b].size) std::swap(a, b);
    nodes_[b].parent = a;
    nodes_[a].size += nodes_[b].size;
    nodes_[a].cost += nodes_[b].cost;
    ++nodes_[a].refs;
    return a;
  }
  void drop(Id x) {
    while (x != kNone && --nodes_[x].refs == 0) {
      const Id parent = nodes_[x].parent;
      nodes_.remove(x);
      x = parent == x ? kNone : parent;
    }
  }

  SlotMap<Node> nodes_;
  std::vector<Id> class_;  // by storage
  std::vector<Id> roots_;
};

}  // namespace

std::vector<std::string> policy_names() {
  return {"dtr",  "dtr_eq", "dtr_local", "lru",       "largest",
          "msps", "random", "dtr_sqrt",  "msps_sqrt", "hinted"};
}

std::unique_ptr<EvictionPolicy> make_eviction_policy(std::string_view name, LineageView view,
                                                     std::uint64_t seed) {
  if (name == "dtr") return std::make_unique<NeighbourhoodPolicy>(view, "dtr", true, 1.0);
  if (name == "dtr_eq") return std::make_unique<DtrEqPolicy>(view);
  if (name == "dtr_local") return std::make_unique<DtrLocalPolicy>(view);
  if (name == "lru") return std::make_unique<LruPolicy>(view);
  if (name == "largest") return std::make_unique<LargestPolicy>(view);
  if (name == "msps") return std::make_unique<NeighbourhoodPolicy>(view, "msps", false, 0.0);
  if (name == "msps_sqrt")
    return std::make_unique<NeighbourhoodPolicy>(view, "msps_sqrt", false, 0.5);
  if (name == "dtr_sqrt") return std::make_unique<NeighbourhoodPolicy>(view, "dtr_sqrt", true, 0.5);
  if (name == "hinted")
    return std::make_unique<NeighbourhoodPolicy>(view, "hinted", true, 1.0, true);
  if (name == "random") return std::make_unique<RandomPolicy>(view, seed);
  return nullptr;
}

}  // namespace remat::detail
