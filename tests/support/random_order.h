// A random topological order of a graph, for tests that need schedules the planners would
// not make (a plan that computes late what the program calls early). Header-only: the
// runtime's tests link no planner.
#ifndef REMAT_TESTS_SUPPORT_RANDOM_ORDER_H_
#define REMAT_TESTS_SUPPORT_RANDOM_ORDER_H_

#include <cstddef>
#include <vector>

#include "remat/graph.h"

namespace remat::testing {

// Every node once, each after all of its inputs; at each step any node whose inputs are all
// placed is equally likely to come next.
template <typename Rng>
std::vector<int> random_topological_order(const Graph& g, Rng& rng) {
  const std::size_t n = g.nodes.size();
  std::vector<int> missing(n, 0);
  std::vector<std::vector<int>> users(n);
  std::vector<int> ready;
  for (const Node& node : g.nodes) {
    missing[static_cast<std::size_t>(node.id)] = static_cast<int>(node.inputs.size());
    for (int u : node.inputs) users[static_cast<std::size_t>(u)].push_back(node.id);
    if (node.inputs.empty()) ready.push_back(node.id);
  }
  std::vector<int> order;
  order.reserve(n);
  while (!ready.empty()) {
    const std::size_t i = rng() % ready.size();
    const int v = ready[i];
    ready.erase(ready.begin() + static_cast<std::ptrdiff_t>(i));
    order.push_back(v);
    for (int u : users[static_cast<std::size_t>(v)])
      if (--missing[static_cast<std::size_t>(u)] == 0) ready.push_back(u);
  }
  return order;
}

}  // namespace remat::testing

#endif  // REMAT_TESTS_SUPPORT_RANDOM_ORDER_H_
