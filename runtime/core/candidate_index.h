// The eviction candidates, indexed so that choosing a victim does not rescore them all.
// Internal to the runtime; see Note [Candidate index].
#ifndef REMAT_RUNTIME_CANDIDATE_INDEX_H_
#define REMAT_RUNTIME_CANDIDATE_INDEX_H_

#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <utility>
#include <vector>

#include "runtime/core/lineage.h"

namespace remat::detail {

class CandidateIndex {
 public:
  // `key` gives a candidate's current key; scores are key / (now - last_access + 1)^e for
  // the staleness exponent e >= 0 (0: the key alone). Lower evicts first.
  CandidateIndex(std::function<double(Id)> key, double staleness_exponent,
                 std::function<double(Id)> key_floor = nullptr);

  // Adds a candidate last accessed at `last_access`. Candidates come in roughly in order of
  // last access (an op's inputs go back in stamped with its start, after its outputs), which
  // keeps old candidates together so that the search prunes well; the bounds hold in any
  // order. Returns its position, to be passed to erase/refresh.
  Id insert(Id storage, double last_access);
  void erase(Id position);
  // Recomputes the key of the candidate at `position`.
  void refresh(Id position);
  // Stores the floor as the key (for a key that may have shrunk): the exact key where the
  // index has no cheaper floor.
  void lower(Id position);
  // The score of the candidate at `position` from its stored key: a lower bound of its
  // true score, since the key may have grown since it was stored, or be only a floor. For
  // callers that weigh many candidates at once, which then refresh the ones they pick and
  // weigh again while those turn out dearer, as `best` does at its leaves.
  double stored_score(Id position, double now) const;
  // How scores weigh staleness: not at all, by staleness, by its square root, by a power.
  enum class Staleness { kIgnored, kLinear, kSqrt, kPow };
  template <Staleness kKind>
  class Pricing;
  // Calls fn(pricing), where pricing(position) is `stored_score(position, now)`, built for
  // many candidates in a loop (the window search weighs every block of every segment): it
  // holds the index's arrays, and the exponent is a template argument, so the loop reads
  // them once and tests no exponent. Valid until the next insert or erase.
  template <typename Fn>
  decltype(auto) with_pricing(double now, Fn&& fn) const;
  // The candidate with the lowest score at time `now`, or kNone when empty.
  Id best(double now);
  // Calls fn(storage) for up to `k` candidates drawn at random.
  template <typename Rng, typename Fn>
  void sample(Rng& rng, std::size_t k, Fn&& fn) const {
    if (count_ == 0) return;
    std::uniform_int_distribution<std::size_t> pick(0, next_ - 1);
    for (std::size_t tries = 0; k > 0 && tries < 8 * k + 64; ++tries) {
      const Id s = leaves_[pick(rng)].storage;
      if (s == kNone) continue;
      fn(s);
      --k;
    }
  }
  std::size_t size() const { return count_; }
  // Moves every candidate's last access `by` earlier (Note [Each step's own clock]), as the
  // runtime moves its storages': the same subtraction, so the two stay equal.
  void shift_times(double by);
  // Position of each storage changes on compaction; the index reports moves through this.
  std::function<void(Id storage, Id position)> on_move;

 private:
  struct Leaf {
    Id storage = kNone;
    double key = 0;
    double last_access = 0;
  };
  struct Node {
    double min_key;
    double min_access;
  };
  void pull(std::size_t node);
  // The lowest position under `node`: its leftmost leaf's.
  std::size_t first_position(std::size_t node) const {
    while (node < capacity_) node *= 2;
    return node - capacity_;
  }
  void set_leaf(std::size_t position, const Leaf& leaf);
  void rebuild(std::size_t capacity);
  template <Staleness kKind>
  static double score_as(double key, double access, double now, double exponent) {
    const double staleness = now - access + 1.0;
    if constexpr (kKind == Staleness::kIgnored) return key;
    if constexpr (kKind == Staleness::kLinear) return key / staleness;
    if constexpr (kKind == Staleness::kSqrt) return key / std::sqrt(staleness);  // not pow()
    return key / std::pow(staleness, exponent);
  }
  // The search, ranking by rank_of(key, staleness): a monotone transform of score() (Note
  // [Ranking without roots]).
  template <typename Rank>
  Id best_by(double now, Rank rank_of);

  std::function<double(Id)> key_;
  std::function<double(Id)> floor_;  // a cheap lower bound of key_; key_ where none
  double exponent_;
  std::size_t capacity_ = 0;  // leaves (a power of two)
  std::size_t next_ = 0;      // next free position
  std::size_t count_ = 0;
  std::vector<Leaf> leaves_;
  std::vector<Node> nodes_;  // 1-based heap layout; leaves at [capacity_, 2 * capacity_)
  std::vector<std::pair<std::size_t, double>> stack_;  // pending nodes and their bounds
};

template <CandidateIndex::Staleness kKind>
class CandidateIndex::Pricing {
 public:
  double operator()(Id position) const {
    const Leaf& l = leaves_[position];
    return score_as<kKind>(l.key, l.last_access, now_, exponent_);
  }

 private:
  friend class CandidateIndex;
  Pricing(const CandidateIndex* index, double now)
      : leaves_(index->leaves_.data()), now_(now), exponent_(index->exponent_) {}
  const Leaf* leaves_;
  double now_;
  double exponent_;
};

template <typename Fn>
decltype(auto) CandidateIndex::with_pricing(double now, Fn&& fn) const {
  if (exponent_ == 1) return fn(Pricing<Staleness::kLinear>(this, now));
  if (exponent_ == 0) return fn(Pricing<Staleness::kIgnored>(this, now));
  if (exponent_ == 0.5) return fn(Pricing<Staleness::kSqrt>(this, now));
  return fn(Pricing<Staleness::kPow>(this, now));
}

inline double CandidateIndex::stored_score(Id position, double now) const {
  return with_pricing(now, [position](auto price) { return price(position); });
}

}  // namespace remat::detail

#endif  // REMAT_RUNTIME_CANDIDATE_INDEX_H_
