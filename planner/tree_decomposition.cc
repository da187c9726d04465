#include "tree_decomposition.h"

#include <absl/container/flat_hash_set.h>

#include <algorithm>
#include <cstdint>
#include <queue>
#include <tuple>
#include <utility>

namespace remat::detail {
namespace {

// The elimination graph of the min fill-in heuristic: the undirected graph plus the fill
// edges added so far, and the vertices whose fill-in may have changed since they were last
// taken.
class FillGraph {
 public:
  explicit FillGraph(const std::vector<std::vector<int>>& adj)
      : adj_(adj.size()), touched_(adj.size(), 0) {
    for (size_t v = 0; v < adj.size(); ++v) adj_[v].insert(adj[v].begin(), adj[v].end());
  }

  int64_t degree(int w) const { return static_cast<int64_t>(adj_[w].size()); }

  // Edges missing among the neighbours of w.
  int64_t fill(int w) const {
    const auto& nb = adj_[w];
    int64_t d = static_cast<int64_t>(nb.size());
    if (d > 40) return d * (d - 1) / 2;  // hubs: pessimistic, keeps this near-linear
    std::vector<int> v(nb.begin(), nb.end());
    int64_t f = 0;
    for (size_t i = 0; i < v.size(); ++i)
      for (size_t j = i + 1; j < v.size(); ++j)
        if (!adj_[v[i]].count(v[j])) ++f;
    return f;
  }

  // Removes v and joins its neighbours pairwise; returns them, sorted.
  std::vector<int> eliminate(int v) {
    std::vector<int> nb(adj_[v].begin(), adj_[v].end());
    std::sort(nb.begin(), nb.end());
    for (int w : nb) {
      adj_[w].erase(v);
      touch(w);
    }
    for (size_t i = 0; i < nb.size(); ++i) {
      for (size_t j = i + 1; j < nb.size(); ++j) {
        int a = nb[i], b = nb[j];
        if (adj_[a].count(b)) continue;
        // Common neighbours of a and b lose one missing edge.
        const auto& small = adj_[a].size() < adj_[b].size() ? adj_[a] : adj_[b];
        const auto& large = adj_[a].size() < adj_[b].size() ? adj_[b] : adj_[a];
        if (small.size() <= 64)
          for (int w : small)
            if (large.count(w)) touch(w);
        adj_[a].insert(b);
        adj_[b].insert(a);
      }
    }
    adj_[v].clear();
    return nb;
  }

  // The vertices touched since the last call, in the order they were first touched.
  std::vector<int> take_touched() {
    std::vector<int> out;
    out.swap(touched_list_);
    for (int w : out) touched_[w] = 0;
    return out;
  }

 private:
  void touch(int w) {
    if (!touched_[w]) {
      touched_[w] = 1;
      touched_list_.push_back(w);
    }
  }

  std::vector<absl::flat_hash_set<int>> adj_;
  std::vector<char> touched_;
  std::vector<int> touched_list_;
};

}  // namespace

TreeDecomposition::TreeDecomposition(const std::vector<std::vector<int>>& adj,
                                     const std::vector<char>& core, const Deadline* deadline)
    : n_(static_cast<int>(core.size())), deadline_(deadline) {
  eliminate_by_min_fill(adj, core);
  if (!timed_out_) index_tree(link_bags(core));
}

// Eliminates the core vertices in min fill-in order (ties: lower degree, then lower id):
// sets each vertex's elimination position and bag, and the width.
void TreeDecomposition::eliminate_by_min_fill(const std::vector<std::vector<int>>& adj,
                                              const std::vector<char>& core) {
  FillGraph fill(adj);
  using Key = std::tuple<int64_t, int64_t, int, int>;  // fill, degree, vertex, version
  std::priority_queue<Key, std::vector<Key>, std::greater<Key>> pq;
  std::vector<int> version(n_, 0);
  std::vector<char> gone(n_, 0);
  int remaining = 0;
  for (int v = 0; v < n_; ++v) {
    if (!core[v]) {
      gone[v] = 1;
      continue;
    }
    ++remaining;
    pq.push({fill.fill(v), fill.degree(v), v, 0});
  }
  pos_.assign(n_, -1);
  bag_.assign(n_ + 1, {});
  int next = 0;
  while (remaining > 0) {
    // Note [A deadline for the decomposition]
    // Long skip connections make the fill graph dense: each elimination then joins
    // hundreds of neighbours pairwise, and the decomposition alone took minutes on a
    // 200,000-node graph where a tenth of the layers read any earlier one. The time limit
    // is checked at every elimination (a clock read beside an elimination's hash work).
    if (deadline_ != nullptr && deadline_->expired()) {
      timed_out_ = true;
      return;
    }
    auto [f, d, v, ver] = pq.top();
    pq.pop();
    if (gone[v] || ver != version[v]) continue;  // stale entry
    gone[v] = 1;
    --remaining;
    pos_[v] = next++;
    std::vector<int> nb = fill.eliminate(v);
    bag_[v].push_back(v);
    bag_[v].insert(bag_[v].end(), nb.begin(), nb.end());
    width_ = std::max(width_, static_cast<int>(nb.size()));
    for (int w : fill.take_touched()) {
      if (gone[w]) continue;
      pq.push({fill.fill(w), fill.degree(w), w, ++version[w]});
    }
  }
}

// Parent of bag v: the bag of its neighbour eliminated first after it; roots hang from a
// virtual root n_ with an empty bag. Returns the children of each bag.
std::vector<std::vector<int>> TreeDecomposition::link_bags(const std::vector<char>& core) {
  parent_.assign(n_ + 1, n_);
  std::vector<std::vector<int>> children(n_ + 1);
  for (int v = 0; v < n_; ++v) {
    if (!core[v]) continue;
    int p = n_;
    for (size_t i = 1; i < bag_[v].size(); ++i) {
      int w = bag_[v][i];
      if (p == n_ || pos_[w] < pos_[p]) p = w;
    }
    parent_[v] = p;
    children[p].push_back(v);
  }
  return children;
}

// Euler tour and binary lifting for LCAs.
void TreeDecomposition::index_tree(const std::vector<std::vector<int>>& children) {
  depth_.assign(n_ + 1, 0);
  tin_.assign(n_ + 1, 0);
  tout_.assign(n_ + 1, 0);
  int timer = 0;
  std::vector<std::pair<int, size_t>> st = {{n_, 0}};
  tin_[n_] = timer++;
  while (!st.empty()) {
    auto& [x, i] = st.back();
    if (i < children[x].size()) {
      int c = children[x][i++];
      depth_[c] = depth_[x] + 1;
      tin_[c] = timer++;
      st.push_back({c, 0});
    } else {
      tout_[x] = timer++;
      st.pop_back();
    }
  }
  int levels = 1;
  while ((1 << levels) <= n_ + 1) ++levels;
  up_.assign(levels, std::vector<int>(n_ + 1, n_));
  for (int v = 0; v <= n_; ++v) up_[0][v] = (v == n_) ? n_ : parent_[v];
  for (int j = 1; j < levels; ++j)
    for (int v = 0; v <= n_; ++v) up_[j][v] = up_[j - 1][up_[j - 1][v]];
}

int TreeDecomposition::lca(int a, int b) const {
  if (is_ancestor(a, b)) return a;
  if (is_ancestor(b, a)) return b;
  for (int j = static_cast<int>(up_.size()) - 1; j >= 0; --j) {
    if (!is_ancestor(up_[j][a], b)) a = up_[j][a];
  }
  return up_[0][a];
}

}  // namespace remat::detail
