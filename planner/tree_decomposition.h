// The tree decomposition twremat recurses on (planner/twremat.cc): min fill-in elimination
// of the undirected graph under a DAG, the bags linked into a tree, and the ancestor and
// lowest-common-ancestor queries its separator search asks. Internal to the planner.
#ifndef REMAT_PLANNER_TREE_DECOMPOSITION_H_
#define REMAT_PLANNER_TREE_DECOMPOSITION_H_

#include <vector>

#include "internal.h"

namespace remat::detail {

class TreeDecomposition {
 public:
  // Of the undirected graph `adj` (sorted, duplicate-free neighbour lists) over the vertices
  // v with core[v]; the others are left out. `deadline`, where given, bounds the
  // elimination: past it the decomposition stops and timed_out() says so.
  TreeDecomposition(const std::vector<std::vector<int>>& adj, const std::vector<char>& core,
                    const Deadline* deadline);

  int width() const { return width_; }
  bool timed_out() const { return timed_out_; }
  // The bag of vertex v (v first, then its neighbours when it was eliminated); vertex n is
  // the virtual root, with an empty bag.
  const std::vector<int>& bag(int v) const { return bag_[v]; }
  int depth(int v) const { return depth_[v]; }
  int tin(int v) const { return tin_[v]; }
  bool is_ancestor(int a, int b) const { return tin_[a] <= tin_[b] && tout_[b] <= tout_[a]; }
  int lca(int a, int b) const;

 private:
  void eliminate_by_min_fill(const std::vector<std::vector<int>>& adj,
                             const std::vector<char>& core);
  std::vector<std::vector<int>> link_bags(const std::vector<char>& core);
  void index_tree(const std::vector<std::vector<int>>& children);

  const int n_;
  const Deadline* deadline_;
  bool timed_out_ = false;
  int width_ = 0;
  std::vector<int> pos_, parent_, depth_, tin_, tout_;
  std::vector<std::vector<int>> bag_, up_;
};

}  // namespace remat::detail

#endif  // REMAT_PLANNER_TREE_DECOMPOSITION_H_
