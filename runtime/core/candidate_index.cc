#include "runtime/core/candidate_index.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace remat::detail {
namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();
}

// Note [Candidate index]
// DTR's scores divide a key (the cost of the evicted neighbourhood over size) by staleness,
// so the order of two candidates changes as time passes and no heap can hold it. But
// candidates enter the index in the order of their last access (a use moves a candidate to
// the end), so a segment tree over positions keeps, for every range of positions, the
// smallest key and the oldest access in it, and
//     score(c) = key(c) / (now - access(c) + 1)  >=  min_key / (now - oldest_access + 1)
// bounds every score in the range from below. The search descends best-bound first and
// prunes every subtree whose bound is no better than the best score found, so a decision
// looks at a few paths instead of every candidate.
// Keys go stale as neighbours are evicted (a neighbourhood only grows until something in it
// is recomputed), so a stored key is a lower bound of the true one: at a leaf the search
// recomputes the key, stores it if it grew, and goes on; the bound stays valid. When a
// storage comes back the keys it cuts may shrink; the runtime lowers them to their floors
// (EvictionPolicy::for_each_lowered).
//
// Note [Ties go to the earliest]
// Equal scores are common: outputs of one op, or inputs of one op, share their last access,
// and a layer repeated has the same sizes and costs. Among equal scores the search takes the
// candidate that entered the index first (the lowest position), whatever the tree's shape.
// The first leaf the search happened to reach would depend on where the step's candidates
// fall in the tree, which moves from step to step as positions grow: two steps of the same
// program would then evict different tensors of a tie, lay memory out differently, and one
// could run out of memory where the other fit. Positions keep the order of entry, and a step
// enters its candidates in the same order every time, so the earliest is the same tensor in
// every step. A subtree whose bound equals the best score is searched only where it holds an
// earlier position, so ties cost a path, not a scan.
CandidateIndex::CandidateIndex(std::function<double(Id)> key, double staleness_exponent,
                               std::function<double(Id)> key_floor)
    : key_(std::move(key)),
      floor_(key_floor ? std::move(key_floor) : key_),
      exponent_(staleness_exponent) {
  rebuild(256);
}

void CandidateIndex::pull(std::size_t node) {
  const Node& l = nodes_[2 * node];
  const Node& r = nodes_[2 * node + 1];
  nodes_[node] = {std::min(l.min_key, r.min_key), std::min(l.min_access, r.min_access)};
}

void CandidateIndex::set_leaf(std::size_t position, const Leaf& leaf) {
  leaves_[position] = leaf;
  std::size_t node = capacity_ + position;
  nodes_[node] = leaf.storage == kNone ? Node{kInf, kInf} : Node{leaf.key, leaf.last_access};
  // An ancestor whose bounds come out unchanged leaves every one above it unchanged too.
  for (node /= 2; node >= 1; node /= 2) {
    const Node before = nodes_[node];
    pull(node);
    if (nodes_[node].min_key == before.min_key && nodes_[node].min_access == before.min_access)
      break;
  }
}

// Packs the live leaves to the front of a tree of `capacity` leaves, keeping their order.
void CandidateIndex::rebuild(std::size_t capacity) {
  std::vector<Leaf> live;
  live.reserve(count_);
  for (std::size_t i = 0; i < next_; ++i)
    if (leaves_[i].storage != kNone) live.push_back(leaves_[i]);
  capacity_ = 1;
  while (capacity_ < capacity) capacity_ *= 2;
  leaves_.assign(capacity_, Leaf{});
  nodes_.assign(2 * capacity_, Node{kInf, kInf});
  for (std::size_t i = 0; i < live.size(); ++i) {
    leaves_[i] = live[i];
    nodes_[capacity_ + i] = {live[i].key, live[i].last_access};
    if (on_move) on_move(live[i].storage, static_cast<Id>(i));
  }
  for (std::size_t node = capacity_ - 1; node >= 1; --node) pull(node);
  next_ = live.size();
}

void CandidateIndex::shift_times(double by) {
  for (std::size_t i = 0; i < next_; ++i) {
    if (leaves_[i].storage == kNone) continue;
    leaves_[i].last_access -= by;
    nodes_[capacity_ + i].min_access = leaves_[i].last_access;
  }
  for (std::size_t node = capacity_ - 1; node >= 1; --node) pull(node);
}

Id CandidateIndex::insert(Id storage, double last_access) {
  if (next_ == capacity_) rebuild(std::max<std::size_t>(256, 2 * (count_ + 1)));
  const std::size_t position = next_++;
  ++count_;
  set_leaf(position, Leaf{storage, floor_(storage), last_access});
  return static_cast<Id>(position);
}

void CandidateIndex::erase(Id position) {
  --count_;
  set_leaf(position, Leaf{});
}

void CandidateIndex::lower(Id position) {
  Leaf leaf = leaves_[position];
  leaf.key = floor_(leaf.storage);
  set_leaf(position, leaf);
}

void CandidateIndex::refresh(Id position) {
  Leaf leaf = leaves_[position];
  leaf.key = key_(leaf.storage);
  set_leaf(position, leaf);
}

// Note [Ranking without roots]
// The search compares scores far more often than it computes one exactly, and for
// staleness^0.5 each comparison would take a square root. Scores are non-negative, so the
// search ranks by key^(1/e) / staleness instead, which orders candidates (and bounds) exactly
// as key / staleness^e does: for dtr_sqrt, key * key / staleness, with no root at all.

// The search runs once per eviction and ranks two nodes at every step, so it is instantiated
// per staleness exponent rather than testing the exponent at each rank.
Id CandidateIndex::best(double now) {
  if (exponent_ == 1)
    return best_by(now, [](double key, double staleness) { return key / staleness; });
  if (exponent_ == 0) return best_by(now, [](double key, double) { return key; });
  if (exponent_ == 0.5)
    return best_by(now, [](double key, double staleness) { return key * key / staleness; });
  return best_by(now, [e = 1.0 / exponent_](double key, double staleness) {
    return std::pow(key, e) / staleness;
  });
}

template <typename Rank>
Id CandidateIndex::best_by(double now, Rank rank_of) {
  // A node's bound: the rank of its smallest key at its oldest access (infinite when empty).
  auto node_rank = [&](std::size_t node) {
    const Node& n = nodes_[node];
    return n.min_key == kInf ? kInf : rank_of(n.min_key, now - n.min_access + 1.0);
  };
  if (count_ == 0) return kNone;
  Id best = kNone;
  double best_rank = kInf;
  std::size_t best_position = next_;
  // Whether a subtree with bound `bound` may hold a better candidate: a lower score, or an
  // equal one at an earlier position (Note [Ties go to the earliest]).
  auto may_win = [&](std::size_t node, double bound) {
    return bound < best_rank ||
           (bound == best_rank && bound != kInf && first_position(node) < best_position);
  };
  // Each pending node carries its bound, computed once when its parent was expanded.
  stack_.clear();
  stack_.push_back({1, node_rank(1)});
  while (!stack_.empty()) {
    const auto [node, node_bound] = stack_.back();
    stack_.pop_back();
    if (!may_win(node, node_bound)) continue;
    if (node >= capacity_) {
      const std::size_t position = node - capacity_;
      Leaf leaf = leaves_[position];
      const double key = key_(leaf.storage);
      if (key != leaf.key) {
        leaf.key = key;
        set_leaf(position, leaf);
      }
      const double r = rank_of(key, now - leaf.last_access + 1.0);
      if (r < best_rank || (r == best_rank && position < best_position) || best == kNone) {
        best_rank = r;
        best = leaf.storage;
        best_position = position;
      }
      continue;
    }
    // Visit the child with the better bound first (the left one on a tie): push it last.
    const std::size_t l = 2 * node, r = 2 * node + 1;
    const double bl = node_rank(l), br = node_rank(r);
    if (bl <= br) {
      if (may_win(r, br)) stack_.push_back({r, br});
      if (may_win(l, bl)) stack_.push_back({l, bl});
    } else {
      if (may_win(l, bl)) stack_.push_back({l, bl});
      if (may_win(r, br)) stack_.push_back({r, br});
    }
  }
  if (best == kNone) {
    // Every key is infinite: any candidate will do; take the oldest.
    for (std::size_t i = 0; i < next_; ++i)
      if (leaves_[i].storage != kNone) return leaves_[i].storage;
  }
  return best;
}

}  // namespace remat::detail
